/*
 * kvd: tandem's demo guest service. A small line-protocol TCP key-value server.
 *
 *   kvd [--port N] [--data DIR] [PORT]
 *
 * Protocol (one request per line, '\n' terminated, optional '\r' stripped):
 *   SET key value  -> OK            GET key -> VALUE value | NOTFOUND
 *   DEL key        -> OK | NOTFOUND SYNC    -> OK (fdatasync of the data log)
 *   STATS          -> STATS keys=N requests=N
 *   QUIT           -> connection closed; anything else -> ERR
 * With --data DIR, DIR/kv.log is replayed at start and every SET/DEL is appended to it.
 *
 * Planted bugs for tandem's analyses (docs/planted-bugs.md); every one answers as a
 * healthy server would, so a native guest serves them without noticing:
 *   BUG OP [ARG]   -> OK | ERR   forwards "OP [ARG]" to the tandem_bugs kernel module
 *                                (/proc/tandem_bugs): oob TEXT, uaf, lock-ab, lock-ba,
 *                                shift N, index N
 *   LKDTM TYPE     -> OK | ERR   writes TYPE to LKDTM's provoke-crash/DIRECT
 *   GET of a missing key of 40-43 bytes overflows kvd's own heap (see miss_cache_put).
 * SIGTERM (the agent's poweroff, an init's stop) ends kvd in order: each open connection
 * is closed as if its client had quit ("kvd: close conn N"), then kvd exits 0. Dying at
 * once instead left "close conn N" to a race between the client's FIN and the signal:
 * a replay into a slower kernel lost the line that the native printed.
 * Portable POSIX C (Linux, FreeBSD): poll(), no threads.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_LINE 4096      /* longest accepted request line, including '\n' */
#define MAX_CLIENTS 256
#define OUT_MAX (64 * 1024) /* pending output per client before we stop reading */

struct entry {
    char *key, *val;
    struct entry *next;
};

struct client {
    int fd;
    unsigned id;
    char in[MAX_LINE];
    size_t inlen;
    int discarding; /* inside an over-long line: drop until '\n' */
    char *out;
    size_t outlen, outcap;
    int closing;
};

#define NBUCKETS 4096
static struct entry *table[NBUCKETS];
static unsigned long nkeys, nrequests;
static int logfd = -1;

/* The last key a GET did not find: a client polling for a key that does not exist
 * yet is answered without walking its hash chain. Allocated once at start. */
#define MISS_KEY_MAX 40
struct miss_cache {
    unsigned hits;
    char key[MISS_KEY_MAX];
};
static struct miss_cache *last_miss;
static struct client *clients[MAX_CLIENTS];
static unsigned next_id = 1;

/* SIGTERM's self-pipe: the handler writes a byte that wakes poll(), so a signal that
 * comes just before poll() is not slept through (a flag alone would be). */
static int stop_pipe[2] = {-1, -1};

static void on_sigterm(int sig)
{
    int saved = errno;
    char b = (char)sig;
    (void)!write(stop_pipe[1], &b, 1);
    errno = saved;
}

static void watch_sigterm(void)
{
    struct sigaction sa;
    if (pipe(stop_pipe) < 0) {
        perror("kvd: pipe");
        exit(1);
    }
    for (int i = 0; i < 2; i++) {
        fcntl(stop_pipe[i], F_SETFL, fcntl(stop_pipe[i], F_GETFL) | O_NONBLOCK);
        fcntl(stop_pipe[i], F_SETFD, FD_CLOEXEC);
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvd: ", stdout);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    fflush(stdout);
    va_end(ap);
}

static unsigned hash(const char *s)
{
    unsigned h = 2166136261u;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 16777619u;
    return h % NBUCKETS;
}

static struct entry **lookup(const char *key)
{
    struct entry **pp = &table[hash(key)];
    while (*pp && strcmp((*pp)->key, key) != 0)
        pp = &(*pp)->next;
    return pp;
}

static int miss_cache_hit(const char *key)
{
    if (!last_miss || strcmp(last_miss->key, key) != 0)
        return 0;
    last_miss->hits++;
    return 1;
}

static void miss_cache_put(const char *key)
{
    size_t n = strlen(key);
    if (!last_miss)
        return;
    /* BUG: bounded by the size of the struct, not of key[]: a 40-43 byte key writes
     * 1-4 bytes past the 44-byte allocation. glibc rounds that allocation up to 56
     * usable bytes, so the native build never notices; ASan does. */
    if (n >= sizeof *last_miss)
        return;
    memcpy(last_miss->key, key, n + 1);
    last_miss->hits = 0;
}

static void miss_cache_forget(const char *key)
{
    if (last_miss && strcmp(last_miss->key, key) == 0)
        last_miss->key[0] = '\0';
}

/* Write one command to a control file (the planted-bug module, LKDTM). */
static int write_ctl(const char *path, const char *cmd)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0)
        return -1;
    ssize_t w = write(fd, cmd, strlen(cmd));
    close(fd);
    return w == (ssize_t)strlen(cmd) ? 0 : -1;
}

static int kv_set(const char *key, const char *val)
{
    struct entry **pp = lookup(key);
    miss_cache_forget(key);
    char *v = strdup(val);
    if (!v)
        return -1;
    if (*pp) {
        free((*pp)->val);
        (*pp)->val = v;
        return 0;
    }
    struct entry *e = malloc(sizeof(*e));
    if (!e || !(e->key = strdup(key))) {
        free(e);
        free(v);
        return -1;
    }
    e->val = v;
    e->next = NULL;
    *pp = e;
    nkeys++;
    return 0;
}

static int kv_del(const char *key)
{
    struct entry **pp = lookup(key), *e = *pp;
    if (!e)
        return 0;
    *pp = e->next;
    free(e->key);
    free(e->val);
    free(e);
    nkeys--;
    return 1;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Append one record to the data log: "S key value\n" or "D key\n". */
static int log_append(char op, const char *key, const char *val)
{
    char buf[MAX_LINE + 8];
    int n;
    if (logfd < 0)
        return 0;
    if (val)
        n = snprintf(buf, sizeof buf, "%c %s %s\n", op, key, val);
    else
        n = snprintf(buf, sizeof buf, "%c %s\n", op, key);
    if (n < 0 || (size_t)n >= sizeof buf)
        return -1;
    return write_all(logfd, buf, (size_t)n);
}

static void log_replay(const char *path)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    unsigned long recs = 0, bad = 0;
    if (!f)
        return;
    while ((n = getline(&line, &cap, f)) > 0) {
        if (line[n - 1] != '\n') { /* torn last record */
            bad++;
            break;
        }
        line[n - 1] = '\0';
        char *key = line + 2, *sp;
        if (n < 4 || line[1] != ' ') {
            bad++;
            continue;
        }
        if (line[0] == 'S' && (sp = strchr(key, ' '))) {
            *sp = '\0';
            kv_set(key, sp + 1);
            recs++;
        } else if (line[0] == 'D') {
            kv_del(key);
            recs++;
        } else {
            bad++;
        }
    }
    free(line);
    fclose(f);
    say("replayed %lu records from %s (%lu bad), %lu keys", recs, path, bad, nkeys);
}

static void out_add(struct client *c, const char *s, size_t n)
{
    if (c->outlen + n > c->outcap) {
        size_t cap = c->outcap ? c->outcap : 256;
        while (cap < c->outlen + n)
            cap *= 2;
        char *p = realloc(c->out, cap);
        if (!p) {
            c->closing = 1;
            return;
        }
        c->out = p;
        c->outcap = cap;
    }
    memcpy(c->out + c->outlen, s, n);
    c->outlen += n;
}

static void out_str(struct client *c, const char *s) { out_add(c, s, strlen(s)); }

static void handle_line(struct client *c, char *line)
{
    size_t n = strlen(line);
    if (n && line[n - 1] == '\r')
        line[--n] = '\0';
    nrequests++;
    char *cmd = line, *arg = strchr(line, ' ');
    if (arg)
        *arg++ = '\0';

    if (strcmp(cmd, "SET") == 0 && arg) {
        char *val = strchr(arg, ' ');
        if (!val || arg == val) {
            out_str(c, "ERR\n");
            return;
        }
        *val++ = '\0';
        if (kv_set(arg, val) < 0 || log_append('S', arg, val) < 0)
            out_str(c, "ERR\n");
        else
            out_str(c, "OK\n");
    } else if (strcmp(cmd, "GET") == 0 && arg && *arg && !strchr(arg, ' ')) {
        struct entry *e = miss_cache_hit(arg) ? NULL : *lookup(arg);
        if (e) {
            out_str(c, "VALUE ");
            out_str(c, e->val);
            out_str(c, "\n");
        } else {
            miss_cache_put(arg);
            out_str(c, "NOTFOUND\n");
        }
    } else if (strcmp(cmd, "DEL") == 0 && arg && *arg && !strchr(arg, ' ')) {
        if (kv_del(arg)) {
            out_str(c, log_append('D', arg, NULL) < 0 ? "ERR\n" : "OK\n");
        } else {
            out_str(c, "NOTFOUND\n");
        }
    } else if (strcmp(cmd, "SYNC") == 0 && !arg) {
        int r = logfd >= 0 ? fdatasync(logfd) : 0;
        say("sync (conn %u)%s", c->id, r < 0 ? " FAILED" : "");
        out_str(c, r < 0 ? "ERR\n" : "OK\n");
    } else if (strcmp(cmd, "STATS") == 0 && !arg) {
        char buf[96];
        snprintf(buf, sizeof buf, "STATS keys=%lu requests=%lu\n", nkeys, nrequests);
        out_str(c, buf);
    } else if (strcmp(cmd, "BUG") == 0 && arg && *arg) {
        out_str(c, write_ctl("/proc/tandem_bugs", arg) < 0 ? "ERR\n" : "OK\n");
    } else if (strcmp(cmd, "LKDTM") == 0 && arg && *arg && !strchr(arg, ' ')) {
        out_str(c, write_ctl("/sys/kernel/debug/provoke-crash/DIRECT", arg) < 0 ? "ERR\n" : "OK\n");
    } else if (strcmp(cmd, "QUIT") == 0 && !arg) {
        c->closing = 1;
    } else {
        out_str(c, "ERR\n");
    }
}

/* Consume c->in: handle each complete line; keep a partial tail. */
static void process_input(struct client *c)
{
    size_t start = 0;
    for (size_t i = 0; i < c->inlen && !c->closing; i++) {
        if (c->in[i] != '\n')
            continue;
        c->in[i] = '\0';
        if (c->discarding)
            c->discarding = 0; /* end of an over-long line; ERR already sent */
        else
            handle_line(c, c->in + start);
        start = i + 1;
    }
    if (c->closing)
        return;
    memmove(c->in, c->in + start, c->inlen - start);
    c->inlen -= start;
    if (c->inlen == sizeof c->in) { /* full buffer without newline: over-long line */
        if (!c->discarding) {
            nrequests++;
            out_str(c, "ERR\n");
        }
        c->discarding = 1;
        c->inlen = 0;
    }
}

static void client_close(int slot)
{
    struct client *c = clients[slot];
    say("close conn %u", c->id);
    close(c->fd);
    free(c->out);
    free(c);
    clients[slot] = NULL;
}

/* SIGTERM: what each client is owed goes out if the socket takes it now (no waiting),
 * then every connection is closed in slot order and kvd exits 0. */
static void stop_all(void)
{
    for (int s = 0; s < MAX_CLIENTS; s++) {
        struct client *c = clients[s];
        if (!c)
            continue;
        if (c->outlen)
            (void)!write(c->fd, c->out, c->outlen);
        client_close(s);
    }
    if (logfd >= 0)
        fsync(logfd);
    exit(0);
}

static int listen_on(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa;
    if (fd < 0) {
        perror("kvd: socket");
        exit(1);
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((unsigned short)port);
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 64) < 0) {
        perror("kvd: bind/listen");
        exit(1);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

static void usage(void)
{
    fprintf(stderr, "usage: kvd [--port N] [--data DIR] [PORT]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int port = 7000;
    const char *datadir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc)
            port = atoi(argv[++i]);
        else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc)
            datadir = argv[++i];
        else if (argv[i][0] != '-' && atoi(argv[i]) > 0)
            port = atoi(argv[i]);
        else
            usage();
    }
    if (port <= 0 || port > 65535)
        usage();
    signal(SIGPIPE, SIG_IGN);
    watch_sigterm();
    last_miss = calloc(1, sizeof *last_miss);

    if (datadir) {
        char path[1024];
        snprintf(path, sizeof path, "%s/kv.log", datadir);
        log_replay(path);
        logfd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (logfd < 0) {
            perror("kvd: open data log");
            return 1;
        }
    }
    int lfd = listen_on(port);
    say("listening on port %d (%s)", port, datadir ? datadir : "in-memory");

    struct pollfd pfd[MAX_CLIENTS + 2];
    int slot_of[MAX_CLIENTS + 1];
    for (;;) {
        int n = 0, nclients = 0;
        for (int s = 0; s < MAX_CLIENTS; s++) {
            struct client *c = clients[s];
            if (!c)
                continue;
            nclients++;
            pfd[n].fd = c->fd;
            pfd[n].events = (c->outlen < OUT_MAX ? POLLIN : 0) | (c->outlen ? POLLOUT : 0);
            pfd[n].revents = 0;
            slot_of[n++] = s;
        }
        pfd[n].fd = lfd;
        pfd[n].events = nclients < MAX_CLIENTS ? POLLIN : 0;
        pfd[n].revents = 0;
        pfd[n + 1].fd = stop_pipe[0];
        pfd[n + 1].events = POLLIN;
        pfd[n + 1].revents = 0;
        if (poll(pfd, (nfds_t)n + 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            perror("kvd: poll");
            return 1;
        }
        if (pfd[n + 1].revents & POLLIN)
            stop_all();
        for (int i = 0; i < n; i++) {
            int s = slot_of[i];
            struct client *c = clients[s];
            short re = pfd[i].revents;
            if (re & (POLLIN | POLLHUP | POLLERR)) {
                ssize_t r = read(c->fd, c->in + c->inlen, sizeof c->in - c->inlen);
                if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
                    client_close(s);
                    continue;
                }
                if (r > 0) {
                    c->inlen += (size_t)r;
                    process_input(c);
                }
            }
            if (c->outlen) {
                ssize_t w = write(c->fd, c->out, c->outlen);
                if (w < 0 && errno != EINTR && errno != EAGAIN) {
                    client_close(s);
                    continue;
                }
                if (w > 0) {
                    memmove(c->out, c->out + w, c->outlen - (size_t)w);
                    c->outlen -= (size_t)w;
                }
            }
            if (c->closing && (c->outlen == 0 || !c->out))
                client_close(s);
        }
        if (pfd[n].revents & POLLIN) {
            int fd = accept(lfd, NULL, NULL);
            if (fd >= 0) {
                int slot = -1;
                for (int s = 0; s < MAX_CLIENTS; s++)
                    if (!clients[s]) {
                        slot = s;
                        break;
                    }
                struct client *c = slot >= 0 ? calloc(1, sizeof *c) : NULL;
                if (!c) {
                    close(fd);
                } else {
                    int one = 1;
                    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    c->fd = fd;
                    c->id = next_id++;
                    clients[slot] = c;
                    say("open conn %u", c->id);
                }
            }
        }
    }
}
