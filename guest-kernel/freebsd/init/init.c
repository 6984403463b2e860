/*
 * A FreeBSD /sbin/init of ours, with no libc: FreeBSD amd64 system calls made directly.
 * It opens /dev/console (the kernel mounts devfs on /dev), prints one line and powers
 * the machine off. Built by scripts/build-freebsd.sh:
 *   clang --target=x86_64-unknown-freebsd15.1 -nostdlib -static -ffreestanding -fuse-ld=lld
 */
#define SYS_exit	1
#define SYS_write	4
#define SYS_open	5
#define SYS_reboot	55
#define O_RDWR		0x0002
#define RB_HALT		0x008
#define RB_POWEROFF	0x4000

static long
sys3(long n, long a, long b, long c)
{
	long ret;
	/* FreeBSD: number in rax, arguments in rdi rsi rdx; carry set on error. */
	__asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c)
	    : "rcx", "r11", "memory", "cc");
	return ret;
}

/* The ABI note FreeBSD's crt1 would carry: the kernel brands the binary by it. */
__attribute__((section(".note.tag"), aligned(4), used))
static const struct {
	unsigned namesz, descsz, type;
	char name[8];
	unsigned desc;
} abi_tag = { 8, 4, 1, "FreeBSD", 1501000 };

static const char msg[] = "hello from init\n";

void
_start(void)
{
	long fd = sys3(SYS_open, (long)"/dev/console", O_RDWR, 0);
	sys3(SYS_write, fd, (long)msg, sizeof(msg) - 1);
	sys3(SYS_reboot, RB_HALT | RB_POWEROFF, 0, 0);
	for (;;)
		sys3(SYS_exit, 0, 0, 0);
}
