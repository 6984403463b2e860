// SPDX-License-Identifier: GPL-2.0
/*
 * tandem_bugs: planted kernel bugs for tandem's tests and demo (docs/planted-bugs.md).
 *
 * The demo service kvd forwards network requests here, one command per write() to
 * /proc/tandem_bugs:
 *
 *   oob TEXT   store TEXT as a note       slab-out-of-bounds write of 1 byte if
 *                                         len(TEXT) == 52  (KASAN; UBSAN: index 52)
 *   uaf        open + close a session     use-after-free read of the session (KASAN)
 *   lock-ab    table lock, then stats lock
 *   lock-ba    stats lock, then table lock  circular lock dependency      (lockdep)
 *   shift N    bucket mask 1 << N         shift-out-of-bounds if N >= 32  (UBSAN)
 *   index N    read histogram slot N      array-index-out-of-bounds if N == 8 (UBSAN)
 *   update K   audit hook, then table update of key K (keys >= 1000 are refused)
 *   update-nocheck K
 *              table update without the audit hook   (tandem's temporal assertions)
 *   dbg-note   a debugging copy of the last note, made slab-out-of-bounds write of
 *              only by a kernel with CONFIG_KASAN       1 byte (KASAN; the native
 *                                                       never runs it)
 *   race       sample the byte counter a timer bumps   data race: plain read in a
 *              for 100 timer ticks                     task, plain write in a softirq
 *                                                      (KCSAN)
 *
 * Every bug is chosen to be invisible on a kernel without sanitizers: the overflow
 * stays inside the slack of its kmalloc slot, freed memory and the word after the
 * array are only read, the shift wraps silently on x86, the two lock orders are
 * never taken at the same time, a key the hook would allow is updated the same
 * with or without it, and x86 reads and writes an aligned word whole. A write
 * returns its length, so kvd answers OK whichever kernel runs.
 *
 * With udp_port=N (module parameter; 0, the default, is off) each UDP datagram to port N
 * is one such command too, run by a kernel thread; the reply is "OK\n" or "ERR\n".
 *
 * tb_proc_write, tb_audit_check, tb_table_update and tb_table_lock_acquire/release
 * are noinline and keep these names: the Linux assertion pack
 * (guest-kernel/assertions/linux-6.12.tesla) watches them from the hypervisor.
 */
#include <linux/in.h>
#include <linux/kernel.h>
#include <linux/kthread.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/net.h>
#include <linux/proc_fs.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/timer.h>
#include <linux/uaccess.h>
#include <net/net_namespace.h>

#define TB_CMD_MAX 256

/* --- oob: a note whose length check is off by one --------------------------- */

#define TB_NOTE_TEXT 52
struct tb_note {
	u16 len;
	u16 flags;
	char text[TB_NOTE_TEXT];	/* NUL-terminated; sizeof(struct tb_note) == 56 */
};

static struct tb_note *tb_last_note;

static noinline int tb_note_store(const char *text, size_t len)
{
	struct tb_note *note;

	/*
	 * BUG: off by one, the terminating NUL needs len < TB_NOTE_TEXT. A 52-byte text
	 * puts the NUL one byte past the 56-byte object, inside the 64-byte kmalloc
	 * slot that nothing else uses: only KASAN, which poisons the slot past the
	 * requested size, sees the write.
	 */
	if (len > TB_NOTE_TEXT)
		return -EMSGSIZE;
	note = kmalloc(sizeof(*note), GFP_KERNEL);
	if (!note)
		return -ENOMEM;
	note->len = len;
	note->flags = 0;
	memcpy(note->text, text, len);
	note->text[len] = '\0';
	kfree(tb_last_note);
	tb_last_note = note;
	return 0;
}

/*
 * --- dbg-note: checking code that only a sanitizer build runs ---------------------
 *
 * A debugging copy of the last note, made only when the kernel has CONFIG_KASAN: the
 * kind of extra checking a debug build carries, with a bug of its own. The function is
 * in every build (it is global), but only a KASAN kernel calls it: a finding the native
 * cannot have made (`tandem explain` says so, tests/test_explain.py).
 */
int tb_note_debug_copy(void);

noinline int tb_note_debug_copy(void)
{
	char *copy;
	size_t len;

	if (!tb_last_note)
		return 0;
	len = tb_last_note->len;
	/* BUG: no room for the terminating NUL */
	copy = kmalloc(len, GFP_KERNEL);
	if (!copy)
		return -ENOMEM;
	memcpy(copy, tb_last_note->text, len);
	copy[len] = '\0';
	pr_debug("tandem_bugs: last note %s\n", copy);
	kfree(copy);
	return 0;
}

/* --- uaf: a cached session pointer that outlives the session ----------------- */

struct tb_session {
	u32 id;
	u32 requests;
	u64 bytes;
	char peer[48];
};

static struct tb_session *tb_cached_session;	/* fast path for the "current" session */
static u32 tb_next_session_id = 1;
static u64 tb_session_bytes;

static noinline struct tb_session *tb_session_open(void)
{
	struct tb_session *s = kzalloc(sizeof(*s), GFP_KERNEL);

	if (!s)
		return NULL;
	s->id = tb_next_session_id++;
	s->bytes = 64;
	tb_cached_session = s;
	return s;
}

static noinline void tb_session_close(struct tb_session *s)
{
	/* BUG: frees the session but leaves tb_cached_session pointing at it. */
	kfree(s);
}

static noinline void tb_session_account(void)
{
	/*
	 * Reads the freed session through the stale cache. Without KASAN the memory
	 * is still mapped and SLUB keeps its free pointer in the middle of the object,
	 * so this reads an unchanged counter: nothing visible happens.
	 */
	if (tb_cached_session)
		tb_session_bytes += READ_ONCE(tb_cached_session->bytes);
}

static int tb_uaf(void)
{
	struct tb_session *s = tb_session_open();

	if (!s)
		return -ENOMEM;
	tb_session_close(s);
	tb_session_account();
	return 0;
}

/* --- lock-ab / lock-ba: two paths taking the same two mutexes in opposite order -- */

static DEFINE_MUTEX(tb_table_lock);
static DEFINE_MUTEX(tb_stats_lock);
static unsigned long tb_table_updates, tb_stats_writes;
static u32 tb_table[16];		/* the last keys updated, by key % 16 */

static noinline void tb_table_lock_acquire(void)
{
	mutex_lock(&tb_table_lock);
}

static noinline void tb_table_lock_release(void)
{
	mutex_unlock(&tb_table_lock);
}

static noinline void tb_table_update(u32 key)	/* table -> stats */
{
	tb_table_lock_acquire();
	WRITE_ONCE(tb_table[key % ARRAY_SIZE(tb_table)], key);
	tb_table_updates++;
	mutex_lock(&tb_stats_lock);
	tb_stats_writes++;
	mutex_unlock(&tb_stats_lock);
	tb_table_lock_release();
}

static noinline void tb_stats_reset(void)	/* stats -> table */
{
	/*
	 * BUG: takes the stats lock before the table lock, the reverse of
	 * tb_table_update(). Two tasks running both paths at once can deadlock; kvd is
	 * a single-threaded process, so they never overlap and only lockdep notices.
	 */
	mutex_lock(&tb_stats_lock);
	tb_stats_writes = 0;
	mutex_lock(&tb_table_lock);
	tb_table_updates = 0;
	mutex_unlock(&tb_table_lock);
	mutex_unlock(&tb_stats_lock);
}

/* --- update / update-nocheck: a table update and the audit hook that must precede it */

#define TB_KEY_RESERVED 1000
static unsigned long tb_audits;

/* The hook every table update must pass first: 0 allows, -EACCES refuses. */
static noinline int tb_audit_check(u32 key)
{
	tb_audits++;
	return key < TB_KEY_RESERVED ? 0 : -EACCES;
}

static int tb_checked_update(u32 key)
{
	int ret = tb_audit_check(key);

	if (ret)
		return ret;
	tb_table_update(key);
	return 0;
}

/*
 * BUG: the update goes through without tb_audit_check(). For a key the hook allows
 * the result is the same, so nothing shows; only an assertion that the hook returned
 * 0 before each tb_table_update() in the same write notices.
 */
static int tb_unchecked_update(u32 key)
{
	tb_table_update(key);
	return 0;
}

/* --- shift / index: request-derived shift count and array index ------------------ */

static u32 tb_bucket_mask;
static u32 tb_hist[8];
static u32 tb_hist_last;

static noinline void tb_set_buckets(unsigned int order)
{
	/* BUG: order is not checked; 1U << 32 and up is undefined (x86 wraps the count). */
	tb_bucket_mask = (1U << order) - 1;
}

static noinline int tb_hist_read(unsigned int slot)
{
	/* BUG: off by one: slot 8 reads the word after tb_hist[] (only read). */
	if (slot > ARRAY_SIZE(tb_hist))
		return -EINVAL;
	tb_hist_last = tb_hist[slot];
	return 0;
}

/* --- race: a byte counter a timer bumps while a task samples it --------------------- */

/*
 * 100 ticks: 1 s of guest time at HZ=100. The guest has one CPU, so KCSAN sees the race
 * only when a tick's softirq writes the counter while KCSAN holds the task on a
 * watchpoint over its read (CONFIG_KCSAN_INTERRUPT_WATCHER, kcsan.config): one read in
 * 1 to 4000 is watched, for 1 to 80 us. How often a tick lands in a watch, and so how
 * many ticks make the report all but certain, is measured in docs/planted-bugs.md.
 */
#define TB_RATE_TICKS 100
static unsigned long tb_rate_bytes;	/* bumped by the timer, sampled by the task */
static atomic_t tb_rate_ticks;
static struct timer_list tb_rate_timer;

static noinline void tb_rate_tick(struct timer_list *t)
{
	/*
	 * BUG: a plain write (part of +=) of a word tb_rate_sample() reads without
	 * READ_ONCE() or a lock. On x86 the aligned word is written and read whole, so
	 * the native kernel shows nothing; KCSAN reports the data race.
	 */
	tb_rate_bytes += 64;
	if (atomic_inc_return(&tb_rate_ticks) < TB_RATE_TICKS)
		mod_timer(t, jiffies + 1);
}

static noinline int tb_rate_sample(void)
{
	unsigned long peak = 0, now;

	atomic_set(&tb_rate_ticks, 0);
	mod_timer(&tb_rate_timer, jiffies + 1);
	while (atomic_read(&tb_rate_ticks) < TB_RATE_TICKS) {
		now = tb_rate_bytes;	/* BUG: the racing plain read */
		if (now > peak)
			peak = now;
		cpu_relax();		/* a compiler barrier too: the word is read anew */
	}
	timer_delete_sync(&tb_rate_timer);
	/* The counter only grows: a peak above its final value would be a torn read. */
	return peak > tb_rate_bytes ? -EIO : 0;
}

/* --- /proc/tandem_bugs ------------------------------------------------------------- */

/*
 * Inlined into each caller, so a report's frames and titles name the path the command
 * came by (tb_proc_write, as tandem's tests and the assertion pack expect; tb_udp_serve)
 * and not this shared parser: the compiler put tb_set_buckets' shift here otherwise.
 */
static __always_inline int tb_dispatch(char *cmd)
{
	char *arg = strchr(cmd, ' ');
	unsigned int n;

	if (arg)
		*arg++ = '\0';
	if (!strcmp(cmd, "oob") && arg)
		return tb_note_store(arg, strlen(arg));
	if (!strcmp(cmd, "uaf") && !arg)
		return tb_uaf();
	if (!strcmp(cmd, "lock-ab") && !arg)
		return tb_checked_update(0);
	if (!strcmp(cmd, "update") && arg && !kstrtouint(arg, 0, &n))
		return tb_checked_update(n);
	if (!strcmp(cmd, "update-nocheck") && arg && !kstrtouint(arg, 0, &n))
		return tb_unchecked_update(n);
	if (!strcmp(cmd, "lock-ba") && !arg) {
		tb_stats_reset();
		return 0;
	}
	if (!strcmp(cmd, "shift") && arg && !kstrtouint(arg, 0, &n)) {
		tb_set_buckets(n);
		return 0;
	}
	if (!strcmp(cmd, "index") && arg && !kstrtouint(arg, 0, &n))
		return tb_hist_read(n);
	if (!strcmp(cmd, "race") && !arg)
		return tb_rate_sample();
	if (!strcmp(cmd, "dbg-note") && !arg)
		return IS_ENABLED(CONFIG_KASAN) ? tb_note_debug_copy() : 0;
	return -EINVAL;
}

static noinline ssize_t tb_proc_write(struct file *file, const char __user *ubuf,
				      size_t count, loff_t *ppos)
{
	char *cmd;
	int ret;

	if (count == 0 || count >= TB_CMD_MAX)
		return -EINVAL;
	cmd = memdup_user_nul(ubuf, count);
	if (IS_ERR(cmd))
		return PTR_ERR(cmd);
	ret = tb_dispatch(strim(cmd));
	kfree(cmd);
	return ret < 0 ? ret : count;
}

static const struct proc_ops tb_proc_ops = {
	.proc_write = tb_proc_write,
	.proc_lseek = noop_llseek,
};

/* --- udp_port: the same commands from the network ------------------------------------- */

/*
 * A guest whose kernel carries these bugs is reached by an ordinary client this way, with
 * nothing of tandem in its userland (docs/planted-bugs.md, "From the network"): the
 * reference VM built with tandem's kernel loads the module with udp_port=4444. The
 * datagram's payload is the command, as a /proc/tandem_bugs write would be.
 *
 * A kernel thread receives and dispatches, one datagram at a time: the commands sleep
 * (GFP_KERNEL, mutexes) and "race" busy-waits for timer ticks, so they need process
 * context, which a socket's receive callback (softirq) is not. Like kvd, the thread is a
 * single writer: a guest should use one of the two entry points, since lock-ab from one
 * and lock-ba from the other at the same moment could deadlock for real (the planted bug).
 *
 * The payload is hostile: it is received into a bounded buffer (recvmsg copies at most
 * that much, from linear or paged skbs alike), a datagram that did not fit (MSG_TRUNC) or
 * is empty is refused as a too long or empty write is, and the buffer is NUL-terminated
 * before it is parsed. The reply ("OK\n", or "ERR\n" where a write would fail) goes to
 * the datagram's source, without waiting: a reply that cannot be sent is dropped.
 */
static ushort udp_port;
module_param(udp_port, ushort, 0444);
MODULE_PARM_DESC(udp_port, "UDP port whose datagrams are tandem_bugs commands (0: none)");

static struct socket *tb_udp_sock;
static struct task_struct *tb_udp_thread;

static void tb_udp_reply(struct sockaddr_in *peer, int ret)
{
	static const char ok[] = "OK\n", err[] = "ERR\n";
	struct kvec iov = ret < 0 ? (struct kvec){ (void *)err, sizeof(err) - 1 }
				  : (struct kvec){ (void *)ok, sizeof(ok) - 1 };
	struct msghdr msg = {
		.msg_name = peer,
		.msg_namelen = sizeof(*peer),
		.msg_flags = MSG_DONTWAIT,
	};

	kernel_sendmsg(tb_udp_sock, &msg, &iov, 1, iov.iov_len);
}

static int tb_udp_serve(void *unused)
{
	char cmd[TB_CMD_MAX];

	while (!kthread_should_stop()) {
		struct sockaddr_in peer = {};
		struct kvec iov = { cmd, sizeof(cmd) - 1 };
		struct msghdr msg = { .msg_name = &peer, .msg_namelen = sizeof(peer) };
		int n = kernel_recvmsg(tb_udp_sock, &msg, &iov, 1, iov.iov_len, 0);
		int ret;

		/* After tb_exit's shutdown, recvmsg returns at once: the loop ends above. */
		if (n < 0 || kthread_should_stop())
			continue;
		if (n == 0 || (msg.msg_flags & MSG_TRUNC)) {
			ret = -EINVAL;
		} else {
			cmd[n] = '\0';
			ret = tb_dispatch(strim(cmd));
		}
		if (peer.sin_family == AF_INET)
			tb_udp_reply(&peer, ret);
	}
	return 0;
}

static int tb_udp_start(void)
{
	struct sockaddr_in addr = {
		.sin_family = AF_INET,
		.sin_addr.s_addr = htonl(INADDR_ANY),
		.sin_port = htons(udp_port),
	};
	int err;

	err = sock_create_kern(&init_net, AF_INET, SOCK_DGRAM, IPPROTO_UDP, &tb_udp_sock);
	if (err)
		return err;
	err = kernel_bind(tb_udp_sock, (struct sockaddr *)&addr, sizeof(addr));
	if (err)
		goto out_release;
	tb_udp_thread = kthread_run(tb_udp_serve, NULL, "tandem_bugs_udp");
	if (IS_ERR(tb_udp_thread)) {
		err = PTR_ERR(tb_udp_thread);
		tb_udp_thread = NULL;
		goto out_release;
	}
	pr_info("tandem_bugs: listening on UDP port %u\n", udp_port);
	return 0;

out_release:
	sock_release(tb_udp_sock);
	tb_udp_sock = NULL;
	return err;
}

static void tb_udp_stop(void)
{
	if (!tb_udp_thread)
		return;
	/* Wakes the thread out of recvmsg for good (RCV_SHUTDOWN), then waits for it. */
	kernel_sock_shutdown(tb_udp_sock, SHUT_RDWR);
	kthread_stop(tb_udp_thread);
	sock_release(tb_udp_sock);
}

static int __init tb_init(void)
{
	int err;

	timer_setup(&tb_rate_timer, tb_rate_tick, 0);
	if (!proc_create("tandem_bugs", 0200, NULL, &tb_proc_ops))
		return -ENOMEM;
	if (udp_port) {
		err = tb_udp_start();
		if (err) {
			pr_err("tandem_bugs: cannot listen on UDP port %u: error %d\n", udp_port, err);
			remove_proc_entry("tandem_bugs", NULL);
			return err;
		}
	}
	return 0;
}

static void __exit tb_exit(void)
{
	tb_udp_stop();
	remove_proc_entry("tandem_bugs", NULL);
	timer_delete_sync(&tb_rate_timer);
	kfree(tb_last_note);
}

module_init(tb_init);
module_exit(tb_exit);
MODULE_DESCRIPTION("tandem: planted bugs reachable from the demo service or a UDP port");
MODULE_LICENSE("GPL");
