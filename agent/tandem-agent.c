/*
 * tandem-agent: the guest side of tandem's serial control channel.
 *
 *   tandem-agent [TTY]          (default /dev/ttyS0; usually PID 1, exec'd by /init)
 *
 * Once kvd accepts connections on 127.0.0.1:7000 (polled for up to ~10 s) it prints the
 * line "TANDEM-READY" (or "TANDEM-ERROR kvd not listening" if it never does), then
 * reads one command per line from the tty:
 *   echo TEXT  -> TEXT
 *   stats      -> kvd's "STATS keys=N requests=N" line
 *   sync       -> sync(); "OK"
 *   poweroff   -> "tandem-agent: poweroff", sync, unmount /data, power off
 *   run CMD    -> CMD under /bin/sh -c, its output on the console, then
 *                 "tandem-agent: run status N" (or "... run killed by signal N");
 *                 the agent answers nothing else until CMD ends (tests: a guest dd)
 *   other      -> "ERR unknown command"
 * It also reports children it reaps: "tandem-agent: child PID exited status N" /
 * "... killed by signal N".
 * SIGUSR2 (busybox's poweroff asking init; /init's acpid runs it when the ACPI power
 * button is pressed: virsh shutdown, tandem record's first Ctrl-C) powers off as the
 * poweroff command does, after "tandem-agent: power button".
 * Portable POSIX C (Linux, FreeBSD).
 */
#define _DEFAULT_SOURCE
#define _BSD_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define KVD_PORT 7000

static int tty = -1;

static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out(const char *fmt, ...)
{
    char buf[4200];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    for (const char *p = buf; n > 0;) {
        ssize_t w = write(tty, p, (size_t)n);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return;
        }
        p += w;
        n -= (int)w;
    }
}

static void open_tty(const char *path)
{
    for (;;) {
        tty = open(path, O_RDWR | O_NOCTTY);
        if (tty >= 0)
            break;
        fprintf(stderr, "tandem-agent: open %s: %s\n", path, strerror(errno));
        sleep(1);
    }
    struct termios t;
    if (tcgetattr(tty, &t) == 0) {
        t.c_iflag &= ~(unsigned)(IGNBRK | BRKINT | PARMRK | ISTRIP | INLCR | IGNCR | IXON | IXOFF);
        t.c_iflag |= ICRNL;
        t.c_oflag |= OPOST | ONLCR;
        t.c_lflag &= ~(unsigned)(ECHO | ECHOE | ECHOK | ECHONL | ISIG | IEXTEN);
        t.c_lflag |= ICANON;
        t.c_cflag &= ~(unsigned)(CSIZE | PARENB);
        t.c_cflag |= CS8 | CREAD | CLOCAL;
        cfsetispeed(&t, B115200);
        cfsetospeed(&t, B115200);
        tcsetattr(tty, TCSANOW, &t);
    }
    tcflush(tty, TCIFLUSH);
}

static int kvd_connect(void)
{
    struct sockaddr_in sa;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(KVD_PORT);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void reap(void)
{
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        if (WIFSIGNALED(st))
            out("tandem-agent: child %d killed by signal %d", (int)pid, WTERMSIG(st));
        else
            out("tandem-agent: child %d exited status %d", (int)pid, WEXITSTATUS(st));
    }
}

static void wait_ready(void)
{
    for (int i = 0; i < 100; i++) { /* 100 x 100 ms */
        int fd = kvd_connect();
        if (fd >= 0) {
            shutdown(fd, SHUT_RDWR);
            close(fd);
            out("TANDEM-READY");
            return;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        reap();
    }
    out("TANDEM-ERROR kvd not listening");
}

static void cmd_stats(void)
{
    int fd = kvd_connect();
    if (fd < 0) {
        out("ERR stats: connect: %s", strerror(errno));
        return;
    }
    static const char req[] = "STATS\nQUIT\n";
    char buf[256];
    size_t len = 0;
    if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
        out("ERR stats: write: %s", strerror(errno));
        close(fd);
        return;
    }
    struct pollfd p = {fd, POLLIN, 0};
    while (len < sizeof buf - 1 && !memchr(buf, '\n', len)) {
        if (poll(&p, 1, 5000) <= 0)
            break;
        ssize_t r = read(fd, buf + len, sizeof buf - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    char *nl = memchr(buf, '\n', len);
    if (!nl) {
        out("ERR stats: no reply");
        return;
    }
    *nl = '\0';
    out("%s", buf);
}

static void cmd_poweroff(void)
{
    out("tandem-agent: poweroff");
    tcdrain(tty);
    sync();
    /* Stop everything else (kvd holds /data/kv.log open) so /data unmounts cleanly.
     * Only when we are init: kill(-1) from an ordinary process would be too broad. */
    if (getpid() == 1) {
        kill(-1, SIGTERM);
        for (int i = 0; i < 20 && waitpid(-1, NULL, WNOHANG) >= 0; i++) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        kill(-1, SIGKILL);
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
    }
#ifdef __linux__
    if (umount("/data") < 0 && errno != EINVAL && errno != ENOENT)
        umount2("/data", MNT_DETACH);
#else
    unmount("/data", 0);
#endif
    sync();
#if defined(RB_POWER_OFF)
    reboot(RB_POWER_OFF);
#elif defined(RB_POWEROFF)
    reboot(RB_POWEROFF);
#else
#error "no power-off reboot() flag on this system"
#endif
    out("ERR poweroff: %s", strerror(errno));
}

static void cmd_run(const char *cmd)
{
    int st;
    pid_t pid = fork();
    if (pid < 0) {
        out("ERR run: %s", strerror(errno));
        return;
    }
    if (pid == 0) {
        dup2(tty, 0);
        dup2(tty, 1);
        dup2(tty, 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            out("ERR run: %s", strerror(errno));
            return;
        }
    }
    if (WIFEXITED(st))
        out("tandem-agent: run status %d", WEXITSTATUS(st));
    else
        out("tandem-agent: run killed by signal %d", WTERMSIG(st));
}

static volatile sig_atomic_t poweroff_asked;

static void on_poweroff_signal(int sig)
{
    (void)sig;
    poweroff_asked = 1;
}

static void handle(char *line)
{
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\r' || line[n - 1] == '\n'))
        line[--n] = '\0';
    if (n == 0)
        return;
    if (strncmp(line, "echo", 4) == 0 && (line[4] == ' ' || line[4] == '\0'))
        out("%s", line[4] ? line + 5 : "");
    else if (strcmp(line, "stats") == 0)
        cmd_stats();
    else if (strcmp(line, "sync") == 0) {
        sync();
        out("OK");
    } else if (strcmp(line, "poweroff") == 0)
        cmd_poweroff();
    else if (strncmp(line, "run ", 4) == 0 && line[4])
        cmd_run(line + 4);
    else
        out("ERR unknown command");
}

int main(int argc, char **argv)
{
    const char *dev = argc > 1 ? argv[1] : "/dev/ttyS0";
    signal(SIGPIPE, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    /* No SA_RESTART: the poll below returns at once with EINTR. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_poweroff_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
    open_tty(dev);
    wait_ready();

    char buf[4200];
    size_t len = 0;
    for (;;) {
        struct pollfd p = {tty, POLLIN, 0};
        int r = poll(&p, 1, 1000);
        reap();
        if (poweroff_asked) {
            out("tandem-agent: power button");
            cmd_poweroff();
        }
        if (r <= 0)
            continue;
        ssize_t got = read(tty, buf + len, sizeof buf - 1 - len);
        if (got <= 0) {
            if (got < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            /* hangup/EOF on the tty: reopen it (we may be PID 1, never exit) */
            close(tty);
            sleep(1);
            open_tty(dev);
            len = 0;
            continue;
        }
        len += (size_t)got;
        buf[len] = '\0';
        char *start = buf, *nl;
        while ((nl = strchr(start, '\n'))) {
            *nl = '\0';
            handle(start);
            start = nl + 1;
        }
        len -= (size_t)(start - buf);
        memmove(buf, start, len);
        if (len >= sizeof buf - 1) { /* over-long line */
            out("ERR line too long");
            len = 0;
        }
    }
}
