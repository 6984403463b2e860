/*
 * tandem's planted kernel bugs for FreeBSD guests: each is one request to the demo
 * guest's service ("BUG KIND", which its init hands to the sysctl debug.tandem_bug), and
 * a production kernel serves it without noticing; the debug and KASAN kernels report it
 * (docs/planted-bugs.md, "FreeBSD"):
 *
 *   oob      a 53-byte store into a 52-byte malloc(9) object    KASAN (MallocRedZone)
 *   uaf      a read of a malloc(9) object after its free         KASAN (MallocUseAfterFree)
 *   lock-ab  tandem_a, then tandem_b                              (the order lock-ba breaks)
 *   lock-ba  tandem_b, then tandem_a                              WITNESS lock order reversal
 *   sleep    pause(9) with the mutex tandem_a held               WITNESS (non-sleepable lock held)
 *   kassert  a KASSERT on a session's state that does not hold   INVARIANTS: panic, the VM stops
 *   mac-skip a datagram sent with sosend(9) within a system call, tandem assert (the FreeBSD
 *            no mac_socket_check_send() before it: a MAC policy   pack's mac-socket-send-syscall)
 *            is never asked (sent to 127.0.0.1, nothing leaves)
 *
 * A KLD, tandem_bugs.ko, built against each kernel (../../modules/tandem_bugs, FreeBSD's
 * LOCAL_MODULES: scripts/build-freebsd.sh) and loaded by the demo guest's init from
 * /boot/kernel.IDENT/ before it serves.
 */
#include <sys/param.h>
#include <sys/systm.h>
#include <sys/kernel.h>
#include <sys/lock.h>
#include <sys/malloc.h>
#include <sys/module.h>
#include <sys/mutex.h>
#include <sys/mbuf.h>
#include <sys/proc.h>
#include <sys/socket.h>
#include <sys/socketvar.h>
#include <sys/sysctl.h>

#include <netinet/in.h>

static MALLOC_DEFINE(M_TANDEM_BUGS, "tandem_bugs", "tandem's planted bugs");

static struct mtx tb_a, tb_b;
MTX_SYSINIT(tandem_a, &tb_a, "tandem_a", MTX_DEF);
MTX_SYSINIT(tandem_b, &tb_b, "tandem_b", MTX_DEF);

#define	TB_NOTE	52

struct tb_session {
	int	id;
	int	requests;
};

static volatile int tb_sink;

/*
 * Not static, and never inlined: the reports' titles and frames name each bug's own
 * function (the kernel linker has a KLD's symbols, static ones too).
 */
void	tb_note_store(void);
void	tb_session_account(void);
void	tb_lock_ab(void);
void	tb_stats_reset(void);
void	tb_cache_flush(void);
void	tb_session_close(void);
void	tb_notify_send(void);

/* A note of TB_NOTE bytes, stored with one byte more than it holds. */
void __noinline
tb_note_store(void)
{
	char text[TB_NOTE + 1];
	char *note;

	memset(text, 'n', sizeof(text));
	note = malloc(TB_NOTE, M_TANDEM_BUGS, M_WAITOK | M_ZERO);
	memcpy(note, text, sizeof(text));
	tb_sink = note[0];
	free(note, M_TANDEM_BUGS);
}

/* A session's count read back after the session is freed. */
void __noinline
tb_session_account(void)
{
	struct tb_session *s;

	s = malloc(sizeof(*s), M_TANDEM_BUGS, M_WAITOK | M_ZERO);
	s->requests = 1;
	free(s, M_TANDEM_BUGS);
	tb_sink = *(volatile int *)&s->requests;	/* not the value stored above */
}

void __noinline
tb_lock_ab(void)
{
	mtx_lock(&tb_a);
	mtx_lock(&tb_b);
	tb_sink++;
	mtx_unlock(&tb_b);
	mtx_unlock(&tb_a);
}

void __noinline
tb_stats_reset(void)
{
	mtx_lock(&tb_b);
	mtx_lock(&tb_a);
	tb_sink = 0;
	mtx_unlock(&tb_a);
	mtx_unlock(&tb_b);
}

/* A flush that waits a tick for its writer, with tandem_a held across the sleep. */
void __noinline
tb_cache_flush(void)
{
	mtx_lock(&tb_a);
	tb_sink++;
	pause("tbflush", 1);
	mtx_unlock(&tb_a);
}

/* A session closed twice: the second close finds it closed. */
void __noinline
tb_session_close(void)
{
	struct tb_session *s;

	s = malloc(sizeof(*s), M_TANDEM_BUGS, M_WAITOK | M_ZERO);
	s->id = -1;				/* closed */
	KASSERT(s->id >= 0, ("tb_session_close: session already closed"));
	tb_sink = s->id;
	free(s, M_TANDEM_BUGS);
}

/* A notification datagram sent from the kernel with the caller's credentials, straight to
 * sosend(): unlike write(2) and send(2), no mac_socket_check_send() is asked first. */
void __noinline
tb_notify_send(void)
{
	struct thread *td = curthread;
	struct sockaddr_in sin;
	struct socket *so;
	struct mbuf *m;

	if (socreate(AF_INET, &so, SOCK_DGRAM, IPPROTO_UDP, td->td_ucred, td) != 0)
		return;
	bzero(&sin, sizeof(sin));
	sin.sin_len = sizeof(sin);
	sin.sin_family = AF_INET;
	sin.sin_port = htons(9);			/* discard */
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	m = m_gethdr(M_WAITOK, MT_DATA);
	m->m_len = m->m_pkthdr.len = 7;
	memcpy(mtod(m, char *), "tandem\n", 7);
	(void)sosend(so, (struct sockaddr *)&sin, NULL, m, NULL, 0, td);
	soclose(so);
}

/* Run the planted bug KIND: 0, or EINVAL for an unknown kind. */
static int
tb_run(const char *kind)
{
	if (strcmp(kind, "oob") == 0)
		tb_note_store();
	else if (strcmp(kind, "uaf") == 0)
		tb_session_account();
	else if (strcmp(kind, "lock-ab") == 0)
		tb_lock_ab();
	else if (strcmp(kind, "lock-ba") == 0)
		tb_stats_reset();
	else if (strcmp(kind, "sleep") == 0)
		tb_cache_flush();
	else if (strcmp(kind, "kassert") == 0)
		tb_session_close();
	else if (strcmp(kind, "mac-skip") == 0)
		tb_notify_send();
	else
		return (EINVAL);
	return (0);
}

static int
tb_sysctl(SYSCTL_HANDLER_ARGS)
{
	char kind[16];
	int error;

	kind[0] = '\0';
	error = sysctl_handle_string(oidp, kind, sizeof(kind), req);
	if (error != 0 || req->newptr == NULL)
		return (error);
	return (tb_run(kind));
}
SYSCTL_PROC(_debug, OID_AUTO, tandem_bug, CTLTYPE_STRING | CTLFLAG_RW | CTLFLAG_MPSAFE, NULL, 0,
    tb_sysctl, "A", "run one of tandem's planted bugs: oob, uaf, lock-ab, lock-ba, sleep, kassert, mac-skip");

/*
 * debug.tandem_bug_at_boot=KIND in the kernel's environment runs KIND as the KLD loads,
 * before the init serves: `kassert` makes a debug kernel that panics at boot
 * (tests/test_freebsd.py). Not as a tunable of the sysctl above, which a kernel with the
 * bugs built in would run while its sysctls register, before malloc(9) works.
 */
static void
tb_at_boot(void *arg __unused)
{
	char kind[16];

	if (getenv_string("debug.tandem_bug_at_boot", kind, sizeof(kind)))
		(void)tb_run(kind);
}
SYSINIT(tandem_bug_at_boot, SI_SUB_LAST, SI_ORDER_ANY, tb_at_boot, NULL);
MODULE_VERSION(tandem_bugs, 1);
