/*
 * The FreeBSD demo guest's /sbin/init, with no libc (FreeBSD amd64 system calls made
 * directly): the Linux demo guest's kvd line protocol, on the same port, as PID 1.
 *
 *   - configures vtnet0 as 10.0.2.15/24 (QEMU's user network gives a guest that address;
 *     no DHCP client: nothing in the base system is built here, see docs/freebsd-boot-notes.md)
 *   - listens on TCP port 7000 and answers, per connection, line by line:
 *       SET key value -> OK     GET key -> VALUE value | NOTFOUND
 *       DEL key -> OK | NOTFOUND     SYNC -> OK     QUIT -> (closes)     else ERR
 *       BUG kind -> OK | ERR: the kernel's planted bug `kind` (sysctl debug.tandem_bug)
 *   - first loads the planted bugs, the KLD tandem_bugs.ko built for the running kernel
 *   - prints "kvd-init: listening on port 7000" on the console when it is ready, then
 *     TANDEM-READY, the line tandem waits for on every demo guest (Linux's agent prints it too)
 *   - powers off when "poweroff" is typed on the console
 *
 * FreeBSD's system call ABI: number in rax, arguments in rdi rsi rdx r10 r8 r9; on error
 * the carry flag is set and rax holds the errno. Structure layouts and ioctl numbers are
 * FreeBSD's (sys/sockio.h, netinet/in_var.h, net/if.h), stable across 14.x and 15.x.
 */
#define SYS_exit	1
#define SYS_read	3
#define SYS_write	4
#define SYS_open	5
#define SYS_close	6
#define SYS_accept	30
#define SYS_ioctl	54
#define SYS_reboot	55
#define SYS_socket	97
#define SYS_bind	104
#define SYS_setsockopt	105
#define SYS_listen	106
#define SYS_poll	209
#define SYS_kldload	304
#define SYS_kldstat	308
#define SYS___sysctlbyname	570

#define O_RDWR		0x0002
#define RB_HALT		0x008
#define RB_POWEROFF	0x4000
#define AF_INET		2
#define SOCK_STREAM	1
#define SOL_SOCKET	0xffff
#define SO_REUSEADDR	0x0004
#define ENOENT		2
#define POLLIN		0x0001
#define POLLHUP		0x0010
#define IFF_UP		0x1
/* _IOW('i', 43, struct in_aliasreq) and _IOW('i', 16, struct ifreq) */
#define SIOCAIFADDR	0x8044692bUL
#define SIOCSIFFLAGS	0x80206910UL
#define SIOCGIFFLAGS	0xc0206911UL

#define PORT		7000
#define MAXCONN		32
#define LINE_MAX	512
#define NKEYS		1024
#define KEY_MAX		64
#define VAL_MAX		256

typedef unsigned long size_t;

struct sockaddr_in {
	unsigned char sin_len, sin_family;
	unsigned short sin_port;
	unsigned int sin_addr;
	char sin_zero[8];
};

struct in_aliasreq {
	char ifra_name[16];
	struct sockaddr_in ifra_addr, ifra_broadaddr, ifra_mask;
	int ifra_vhid;
};

struct ifreq {
	char ifr_name[16];
	short ifr_flags, ifr_flagshigh;
	char pad[12];
};

/* sys/linker.h: what kldstat(2) says of a loaded file; version is its size */
struct kld_file_stat {
	int version;
	char name[1024];
	int refs, id;
	unsigned long address;
	size_t size;
	char pathname[1024];
};

struct pollfd {
	int fd;
	short events, revents;
};

/* The ABI note FreeBSD's crt1 would carry: the kernel brands the binary by it. */
__attribute__((section(".note.tag"), aligned(4), used))
static const struct {
	unsigned namesz, descsz, type;
	char name[8];
	unsigned desc;
} abi_tag = { 8, 4, 1, "FreeBSD", 1400000 };

static long
sc(long n, long a, long b, long c)
{
	long ret;
	unsigned char cf;

	__asm__ volatile("syscall" : "=a"(ret), "=@ccc"(cf), "+D"(a), "+S"(b), "+d"(c)
	    : "a"(n) : "rcx", "r8", "r9", "r10", "r11", "memory");
	return cf ? -ret : ret;
}

/* Five arguments: the fourth and fifth in r10 and r8. */
static long
sc5(long n, long a, long b, long c, long d, long e)
{
	long ret;
	unsigned char cf;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;

	__asm__ volatile("syscall" : "=a"(ret), "=@ccc"(cf), "+D"(a), "+S"(b), "+d"(c), "+r"(r10), "+r"(r8)
	    : "a"(n) : "rcx", "r9", "r11", "memory");
	return cf ? -ret : ret;
}

static long
sc6(long n, long a, long b, long c, long d, long e, long f)
{
	long ret;
	unsigned char cf;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;

	__asm__ volatile("syscall" : "=a"(ret), "=@ccc"(cf), "+D"(a), "+S"(b), "+d"(c), "+r"(r10), "+r"(r8),
	    "+r"(r9) : "a"(n) : "rcx", "r11", "memory");
	return cf ? -ret : ret;
}

static size_t
slen(const char *s)
{
	size_t n = 0;

	while (s[n])
		n++;
	return n;
}

static int
seq(const char *a, const char *b)
{
	while (*a && *a == *b)
		a++, b++;
	return *a == *b;
}

static void
scpy(char *d, const char *s, size_t max)
{
	size_t i = 0;

	for (; s[i] && i + 1 < max; i++)
		d[i] = s[i];
	d[i] = 0;
}

/* memset and memcpy: clang may call them for structure copies even freestanding. */
void *
memset(void *d, int c, size_t n)
{
	unsigned char *p = d;

	while (n--)
		*p++ = (unsigned char)c;
	return d;
}

void *
memcpy(void *d, const void *s, size_t n)
{
	unsigned char *p = d;
	const unsigned char *q = s;

	while (n--)
		*p++ = *q++;
	return d;
}

static long console = -1;

static void
say(const char *s)
{
	sc(SYS_write, console, (long)s, (long)slen(s));
}

static unsigned short
be16(unsigned short x)
{
	return (unsigned short)(x << 8 | x >> 8);
}

static struct sockaddr_in
inet(unsigned char a, unsigned char b, unsigned char c, unsigned char d, unsigned short port)
{
	struct sockaddr_in s;

	memset(&s, 0, sizeof(s));
	s.sin_len = sizeof(s);
	s.sin_family = AF_INET;
	s.sin_port = be16(port);
	s.sin_addr = (unsigned)a | (unsigned)b << 8 | (unsigned)c << 16 | (unsigned)d << 24;
	return s;
}

static int
net_up(void)
{
	struct in_aliasreq ifra;
	struct ifreq ifr;
	long s = sc(SYS_socket, AF_INET, 2 /* SOCK_DGRAM */, 0);

	if (s < 0)
		return -1;
	memset(&ifr, 0, sizeof(ifr));
	scpy(ifr.ifr_name, "vtnet0", sizeof(ifr.ifr_name));
	if (sc(SYS_ioctl, s, (long)SIOCGIFFLAGS, (long)&ifr) < 0)
		return -1;
	ifr.ifr_flags |= IFF_UP;
	if (sc(SYS_ioctl, s, (long)SIOCSIFFLAGS, (long)&ifr) < 0)
		return -1;
	memset(&ifra, 0, sizeof(ifra));
	scpy(ifra.ifra_name, "vtnet0", sizeof(ifra.ifra_name));
	ifra.ifra_addr = inet(10, 0, 2, 15, 0);
	ifra.ifra_broadaddr = inet(10, 0, 2, 255, 0);
	ifra.ifra_mask = inet(255, 255, 255, 0, 0);
	if (sc(SYS_ioctl, s, (long)SIOCAIFADDR, (long)&ifra) < 0)
		return -1;
	sc(SYS_close, s, 0, 0);
	return 0;
}

/*
 * The planted bugs, a KLD built against each kernel, from /boot/kernel.IDENT/ (IDENT: the
 * running kernel's, kern.ident), where `make installkernel INSTKERNNAME=kernel.IDENT` puts
 * a kernel's modules: no loader sets the module path of a kernel booted directly. One line
 * either way: where it was loaded (tandem assert places its sections from that address as
 * the kernel linker did), or why not; kvd-init.equiv.toml masks what follows the name.
 * A kernel with none (a user's own) runs without them: BUG requests answer ERR.
 */
static void
load_klds(void)
{
	static const char ident_name[] = "kern.ident", kld[] = "tandem_bugs.ko";
	static const char hexd[] = "0123456789abcdef";
	char ident[64], path[128], line[160];
	size_t len = sizeof(ident) - 1, n;
	struct kld_file_stat st;
	long id;

	if (sc6(SYS___sysctlbyname, (long)ident_name, sizeof(ident_name) - 1, (long)ident, (long)&len, 0, 0) < 0)
		len = 0;
	ident[len < sizeof(ident) ? len : sizeof(ident) - 1] = 0;
	scpy(path, "/boot/kernel.", sizeof(path));
	n = slen(path);
	scpy(path + n, ident, sizeof(path) - n);
	n = slen(path);
	scpy(path + n, "/", sizeof(path) - n);
	n = slen(path);
	scpy(path + n, kld, sizeof(path) - n);
	scpy(line, "kvd-init: kld tandem_bugs.ko", sizeof(line));
	n = slen(line);
	id = sc(SYS_kldload, (long)path, 0, 0);
	memset(&st, 0, sizeof(st));
	st.version = sizeof(st);
	if (id == -ENOENT) {
		scpy(line + n, ": none for this kernel\n", sizeof(line) - n);
	} else if (id < 0 || sc(SYS_kldstat, id, (long)&st, 0) < 0) {
		long e = id < 0 ? -id : 0;

		scpy(line + n, ": kldload failed, error ", sizeof(line) - n);
		n = slen(line);
		line[n++] = (char)('0' + e / 10 % 10);
		line[n++] = (char)('0' + e % 10);
		line[n++] = '\n';
		line[n] = 0;
	} else {
		scpy(line + n, " at 0x", sizeof(line) - n);
		n = slen(line);
		for (int sh = 60; sh >= 0; sh -= 4)
			line[n++] = hexd[st.address >> sh & 0xf];
		line[n++] = '\n';
		line[n] = 0;
	}
	say(line);
}

static long
listen_on(unsigned short port)
{
	struct sockaddr_in sa = inet(0, 0, 0, 0, port);
	int one = 1;
	long fd = sc(SYS_socket, AF_INET, SOCK_STREAM, 0);

	if (fd < 0)
		return fd;
	sc5(SYS_setsockopt, fd, SOL_SOCKET, SO_REUSEADDR, (long)&one, sizeof(one));
	if (sc(SYS_bind, fd, (long)&sa, sizeof(sa)) < 0 || sc(SYS_listen, fd, 16, 0) < 0)
		return -1;
	return fd;
}

/* --- the store: a fixed table, linear probing on a string hash --- */

static struct entry {
	char key[KEY_MAX];
	char val[VAL_MAX];
	int used;
} table[NKEYS];

static unsigned
hash(const char *s)
{
	unsigned h = 2166136261u;

	while (*s)
		h = (h ^ (unsigned char)*s++) * 16777619u;
	return h;
}

static struct entry *
find(const char *key, int make)
{
	unsigned i = hash(key) % NKEYS;
	struct entry *tomb = 0;

	for (unsigned n = 0; n < NKEYS; n++, i = (i + 1) % NKEYS) {
		struct entry *e = &table[i];
		if (e->used == 1 && seq(e->key, key))
			return e;
		if (e->used == 2 && !tomb)
			tomb = e;
		if (e->used == 0) {
			if (!make)
				return 0;
			e = tomb ? tomb : e;
			scpy(e->key, key, KEY_MAX);
			return e;
		}
	}
	return make ? tomb : 0;
}

/* --- connections --- */

static struct conn {
	long fd;
	char in[LINE_MAX];
	size_t len;
	int discarding;
} conns[MAXCONN];

static void
reply(struct conn *c, const char *a, const char *b)
{
	char out[VAL_MAX + 16];
	size_t n = 0;

	for (; *a && n < sizeof(out) - 1; a++)
		out[n++] = *a;
	for (; b && *b && n < sizeof(out) - 2; b++)
		out[n++] = *b;
	out[n++] = '\n';
	sc(SYS_write, c->fd, (long)out, (long)n);
}

static int
handle(struct conn *c, char *line)
{
	size_t n = slen(line);
	char *cmd = line, *arg = 0, *val = 0;

	if (n && line[n - 1] == '\r')
		line[--n] = 0;
	for (char *p = line; *p; p++)
		if (*p == ' ') {
			*p = 0;
			arg = p + 1;
			break;
		}
	if (arg)
		for (char *p = arg; *p; p++)
			if (*p == ' ') {
				*p = 0;
				val = p + 1;
				break;
			}
	if (seq(cmd, "SET") && arg && *arg && val && slen(arg) < KEY_MAX && slen(val) < VAL_MAX) {
		struct entry *e = find(arg, 1);
		if (!e) {
			reply(c, "ERR", 0);
			return 0;
		}
		e->used = 1;
		scpy(e->val, val, VAL_MAX);
		reply(c, "OK", 0);
	} else if (seq(cmd, "GET") && arg && *arg && !val) {
		struct entry *e = find(arg, 0);
		if (e)
			reply(c, "VALUE ", e->val);
		else
			reply(c, "NOTFOUND", 0);
	} else if (seq(cmd, "DEL") && arg && *arg && !val) {
		struct entry *e = find(arg, 0);
		if (e)
			e->used = 2;
		reply(c, e ? "OK" : "NOTFOUND", 0);
	} else if (seq(cmd, "SYNC") && !arg) {
		reply(c, "OK", 0);
	} else if (seq(cmd, "BUG") && arg && *arg && !val) {
		/* one of the kernel's planted bugs (sys/dev/tandem/tandem_bugs.c) */
		static const char name[] = "debug.tandem_bug";
		long r = sc6(SYS___sysctlbyname, (long)name, sizeof(name) - 1, 0, 0, (long)arg, (long)slen(arg));
		reply(c, r < 0 ? "ERR" : "OK", 0);
	} else if (seq(cmd, "QUIT") && !arg) {
		return 1;
	} else {
		reply(c, "ERR", 0);
	}
	return 0;
}

/* Read what came; handle each complete line. Returns nonzero when the connection ends. */
static int
serve(struct conn *c)
{
	long n = sc(SYS_read, c->fd, (long)(c->in + c->len), (long)(sizeof(c->in) - c->len));
	size_t start = 0;

	if (n <= 0)
		return 1;
	c->len += (size_t)n;
	for (size_t i = 0; i < c->len; i++) {
		if (c->in[i] != '\n')
			continue;
		c->in[i] = 0;
		if (c->discarding)
			c->discarding = 0;
		else if (handle(c, c->in + start))
			return 1;
		start = i + 1;
	}
	for (size_t i = start; i < c->len; i++)
		c->in[i - start] = c->in[i];
	c->len -= start;
	if (c->len == sizeof(c->in)) {		/* a line longer than the buffer */
		if (!c->discarding)
			reply(c, "ERR", 0);
		c->discarding = 1;
		c->len = 0;
	}
	return 0;
}

static void
poweroff(void)
{
	say("kvd-init: powering off\n");
	sc(SYS_reboot, RB_HALT | RB_POWEROFF, 0, 0);
}

void
_start(void)
{
	static char cin[128];
	static size_t clen;
	struct pollfd pfd[MAXCONN + 2];
	long lfd;

	console = sc(SYS_open, (long)"/dev/console", O_RDWR, 0);
	load_klds();
	if (net_up() < 0)
		say("kvd-init: vtnet0 could not be configured\n");
	lfd = listen_on(PORT);
	if (lfd < 0) {
		say("kvd-init: cannot listen on port 7000\n");
		poweroff();
	}
	for (int i = 0; i < MAXCONN; i++)
		conns[i].fd = -1;
	say("kvd-init: listening on port 7000\nTANDEM-READY\n");
	for (;;) {
		int n = 0;

		pfd[n].fd = (int)console, pfd[n].events = POLLIN, pfd[n++].revents = 0;
		pfd[n].fd = (int)lfd, pfd[n].events = POLLIN, pfd[n++].revents = 0;
		for (int i = 0; i < MAXCONN; i++)
			pfd[n].fd = (int)conns[i].fd, pfd[n].events = POLLIN, pfd[n++].revents = 0;
		if (sc(SYS_poll, (long)pfd, n, -1) < 0)
			continue;
		if (pfd[0].revents & POLLIN) {
			long got = sc(SYS_read, console, (long)(cin + clen), (long)(sizeof(cin) - 1 - clen));
			if (got > 0) {
				clen += (size_t)got;
				cin[clen] = 0;
				for (size_t i = 0; i < clen; i++)
					if (cin[i] == '\n' || cin[i] == '\r') {
						cin[i] = 0;
						if (seq(cin, "poweroff"))
							poweroff();
						clen = 0;
						break;
					}
				if (clen == sizeof(cin) - 1)
					clen = 0;
			}
		}
		if (pfd[1].revents & POLLIN) {
			long fd = sc(SYS_accept, lfd, 0, 0);
			int placed = 0;
			for (int i = 0; fd >= 0 && i < MAXCONN && !placed; i++)
				if (conns[i].fd < 0) {
					conns[i].fd = fd, conns[i].len = 0, conns[i].discarding = 0;
					placed = 1;
				}
			if (fd >= 0 && !placed)
				sc(SYS_close, fd, 0, 0);	/* too many at once */
		}
		for (int i = 0; i < MAXCONN; i++) {
			struct pollfd *p = &pfd[2 + i];
			if (conns[i].fd >= 0 && p->revents & (POLLIN | POLLHUP) && serve(&conns[i])) {
				sc(SYS_close, conns[i].fd, 0, 0);
				conns[i].fd = -1;
			}
		}
	}
}
