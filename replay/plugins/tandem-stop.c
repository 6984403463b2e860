/*
 * tandem-stop: a QEMU 10 TCG plugin that stops an exact replay at a kernel function's
 * entry and serves the stopped vCPU's registers and memory to `tandem explain`
 * (replay/tandem/explain/; docs/explain.md).
 *
 *   -plugin tandem-stop.so,entry=ADDR,size=N,after=NS,sock=PATH
 *
 * entry: the function's first instruction; size: its length in bytes. Every instruction
 *   in [entry, entry+size) gets a callback; nothing else does, so the rest of the guest
 *   runs as it would without the plugin.
 * after: the first execution of entry at VM time NS or later stops the vCPU.
 * sock: a unix socket the plugin listens on; the client connects after starting QEMU and
 *   reads "stop PC ICOUNT VM_NS\n" once the vCPU has stopped.
 *
 * While stopped the vCPU thread stays inside the instruction callback (the guest's time
 * does not move) and answers one command per line:
 *   regs               "ok N\n", then N lines "NAME HEX" (the register's bytes, little
 *                      endian, as the gdbstub describes them)
 *   mem ADDR LEN       "ok LEN\n" and LEN bytes of guest virtual memory, or "fault\n"
 *   go PC SP [PC SP]   run on until an instruction of the window at PC executes with rsp
 *                      SP (SP 0: any rsp); then "stop PC ICOUNT VM_NS\n" again. PC must be
 *                      in a window. Up to MAX_TARGETS pairs.
 *   arm ENTRY SIZE NS  watch [ENTRY, ENTRY+SIZE) too and run on until ENTRY's first
 *                      execution at VM time NS or later; then "stop ..." again. For code
 *                      not yet run when the replay started (a module's, its address read
 *                      while stopped in the kernel's module loader): instructions already
 *                      translated get no callback. Up to MAX_WINDOWS windows.
 *   detach             "ok\n"; the plugin stops watching and the replay runs to its end
 * A closed connection detaches too.
 *
 * ICOUNT is the number of instructions executed before the stopped one: under -icount a
 * TB takes all of its instructions from the budget before its first one runs, so the
 * clock read mid-TB is corrected by the instruction's distance to the TB's end.
 */
#include <errno.h>
#include <glib.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define MAX_TARGETS 64
#define MAX_MEM (1u << 20)

struct insn_ud {
    uint64_t pc;
    uint16_t back;          /* instructions from this one to its TB's end */
};

struct target {
    uint64_t pc, sp;
};

#define MAX_WINDOWS 8

struct range {
    uint64_t lo, size;
};

static struct range windows[MAX_WINDOWS];
static unsigned n_windows;
static uint64_t entry, after_ns;        /* the armed stop */
static char *sock_path;
static int listen_fd = -1, conn = -1;
static FILE *cin;
static bool armed = true, detached;
static struct target targets[MAX_TARGETS];
static unsigned n_targets;
static unsigned icount_shift;

static GArray *reg_descs;               /* qemu_plugin_reg_descriptor */
static struct qemu_plugin_register *rsp_reg;
static GByteArray *regbuf, *membuf;

static void detach(void)
{
    detached = true;
    if (cin) {
        fclose(cin);            /* closes conn */
        cin = NULL;
        conn = -1;
    }
}

static bool send_all(const void *p, size_t n)
{
    const char *c = p;

    while (n) {
        ssize_t w = write(conn, c, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return false;
        }
        c += w;
        n -= (size_t)w;
    }
    return true;
}

static bool sendf(const char *fmt, ...) G_GNUC_PRINTF(1, 2);
static bool sendf(const char *fmt, ...)
{
    va_list ap;
    char *s;
    bool ok;

    va_start(ap, fmt);
    s = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    ok = send_all(s, strlen(s));
    g_free(s);
    return ok;
}

static uint64_t read_rsp(void)
{
    uint64_t v = 0;

    g_byte_array_set_size(regbuf, 0);
    if (qemu_plugin_read_register(rsp_reg, regbuf) > 0) {
        memcpy(&v, regbuf->data, regbuf->len < 8 ? regbuf->len : 8);
    }
    return v;
}

static bool send_regs(void)
{
    GString *s = g_string_new(NULL);
    bool ok;

    g_string_append_printf(s, "ok %u\n", reg_descs->len);
    for (guint i = 0; i < reg_descs->len; i++) {
        qemu_plugin_reg_descriptor *d = &g_array_index(reg_descs, qemu_plugin_reg_descriptor, i);
        g_byte_array_set_size(regbuf, 0);
        int n = qemu_plugin_read_register(d->handle, regbuf);
        g_string_append_printf(s, "%s ", d->name);
        for (int j = 0; j < n; j++) {
            g_string_append_printf(s, "%02x", regbuf->data[j]);
        }
        g_string_append_c(s, '\n');
    }
    ok = send_all(s->str, s->len);
    g_string_free(s, TRUE);
    return ok;
}

static bool send_mem(uint64_t addr, uint64_t len)
{
    if (len == 0 || len > MAX_MEM || !qemu_plugin_read_memory_vaddr(addr, membuf, len)) {
        return sendf("fault\n");
    }
    return sendf("ok %" PRIu64 "\n", len) && send_all(membuf->data, len);
}

static bool add_window(uint64_t lo, uint64_t n)
{
    if (n_windows == MAX_WINDOWS) {
        return false;
    }
    windows[n_windows++] = (struct range){ lo, n };
    return true;
}

static bool in_window(uint64_t pc)
{
    for (unsigned i = 0; i < n_windows; i++) {
        if (pc - windows[i].lo < windows[i].size) {
            return true;
        }
    }
    return false;
}

/* Answer commands until one lets the vCPU run on (go, arm, detach) or the client is gone. */
static void serve(uint64_t pc, uint64_t icount, uint64_t vm_ns)
{
    char line[64 + MAX_TARGETS * 40];

    if (!sendf("stop %" PRIx64 " %" PRIu64 " %" PRIu64 "\n", pc, icount, vm_ns)) {
        detach();
        return;
    }
    while (fgets(line, sizeof(line), cin)) {
        uint64_t a, b;
        if (!strcmp(line, "regs\n")) {
            if (!send_regs()) {
                break;
            }
        } else if (sscanf(line, "mem %" SCNx64 " %" SCNu64, &a, &b) == 2) {
            if (!send_mem(a, b)) {
                break;
            }
        } else if (!strncmp(line, "go ", 3)) {
            char *p = line + 3, *end;
            n_targets = 0;
            while (n_targets < MAX_TARGETS) {
                a = strtoull(p, &end, 16);
                if (end == p) {
                    break;
                }
                p = end;
                b = strtoull(p, &end, 16);
                if (end == p) {
                    break;
                }
                p = end;
                targets[n_targets++] = (struct target){ a, b };
            }
            if (n_targets) {
                return;         /* the vCPU runs on to a target */
            }
            sendf("error go: expected PC SP pairs in hex\n");
        } else if (!strncmp(line, "arm ", 4)) {
            uint64_t e, n, ns;
            if (sscanf(line + 4, "%" SCNx64 " %" SCNu64 " %" SCNu64, &e, &n, &ns) != 3 || !n) {
                sendf("error arm: expected ENTRY SIZE NS\n");
            } else if (!add_window(e, n)) {
                sendf("error arm: more than %d windows\n", MAX_WINDOWS);
            } else {
                entry = e;
                after_ns = ns;
                armed = true;
                return;         /* the vCPU runs on to the armed entry */
            }
        } else if (!strcmp(line, "detach\n")) {
            sendf("ok\n");
            break;
        } else {
            sendf("error unknown command\n");
        }
    }
    detach();
}

static bool connected(void)
{
    if (cin) {
        return true;
    }
    conn = accept(listen_fd, NULL, NULL);
    close(listen_fd);
    listen_fd = -1;
    unlink(sock_path);
    if (conn < 0) {
        fprintf(stderr, "tandem-stop: %s: accept: %s\n", sock_path, strerror(errno));
        detached = true;
        return false;
    }
    cin = fdopen(conn, "r");
    return cin != NULL;
}

static void on_insn(unsigned int vcpu, void *udata)
{
    struct insn_ud *ud = udata;
    int64_t icount = 0, vm_ns = 0;
    bool hit = false;

    if (detached) {
        return;
    }
    if (armed) {
        if (ud->pc != entry) {
            return;
        }
        qemu_plugin_vm_clock(&icount, &vm_ns);
        if ((uint64_t)vm_ns < after_ns) {
            return;
        }
        armed = false;
        hit = true;
    } else {
        uint64_t sp = 0;
        bool sp_read = false;
        for (unsigned i = 0; i < n_targets && !hit; i++) {
            if (targets[i].pc != ud->pc) {
                continue;
            }
            if (targets[i].sp && !sp_read) {
                sp = read_rsp();
                sp_read = true;
            }
            hit = !targets[i].sp || targets[i].sp == sp;
        }
        if (!hit) {
            return;
        }
        qemu_plugin_vm_clock(&icount, &vm_ns);
    }
    if (!connected()) {
        return;
    }
    serve(ud->pc, (uint64_t)icount - ud->back, (uint64_t)vm_ns - ((uint64_t)ud->back << icount_shift));
}

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    size_t n = qemu_plugin_tb_n_insns(tb);

    if (detached) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint64_t pc = qemu_plugin_insn_vaddr(insn);
        if (in_window(pc)) {
            struct insn_ud *ud = g_new(struct insn_ud, 1);
            ud->pc = pc;
            ud->back = (uint16_t)(n - i);
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_insn, QEMU_PLUGIN_CB_R_REGS, ud);
        }
    }
}

static void on_vcpu_init(qemu_plugin_id_t id, unsigned int vcpu)
{
    if (reg_descs) {
        return;
    }
    reg_descs = qemu_plugin_get_registers();
    for (guint i = 0; i < reg_descs->len; i++) {
        qemu_plugin_reg_descriptor *d = &g_array_index(reg_descs, qemu_plugin_reg_descriptor, i);
        if (!strcmp(d->name, "rsp")) {
            rsp_reg = d->handle;
        }
    }
    if (!rsp_reg) {
        fprintf(stderr, "tandem-stop: the vCPU has no rsp register (an x86-64 guest is needed)\n");
        exit(1);
    }
}

static void on_atexit(qemu_plugin_id_t id, void *p)
{
    if (listen_fd >= 0) {
        close(listen_fd);
        unlink(sock_path);
    }
    detach();
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    bool have_entry = false;
    uint64_t size = 0;

    for (int i = 0; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            fprintf(stderr, "tandem-stop: argument %s: expected KEY=VALUE\n", argv[i]);
            return -1;
        }
        *eq = '\0';
        const char *k = argv[i], *v = eq + 1;
        if (!strcmp(k, "entry")) {
            entry = strtoull(v, NULL, 0);
            have_entry = true;
        } else if (!strcmp(k, "size")) {
            size = strtoull(v, NULL, 0);
        } else if (!strcmp(k, "after")) {
            after_ns = strtoull(v, NULL, 0);
        } else if (!strcmp(k, "shift")) {
            icount_shift = strtoul(v, NULL, 0);
        } else if (!strcmp(k, "sock")) {
            sock_path = g_strdup(v);
        } else {
            fprintf(stderr, "tandem-stop: unknown argument %s\n", k);
            return -1;
        }
    }
    if (!have_entry || !size || !sock_path) {
        fprintf(stderr, "tandem-stop: entry=, size= and sock= are required\n");
        return -1;
    }
    add_window(entry, size);
    if (strlen(sock_path) >= sizeof(sa.sun_path)) {
        fprintf(stderr, "tandem-stop: %s: socket path too long\n", sock_path);
        return -1;
    }
    strcpy(sa.sun_path, sock_path);
    listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(listen_fd, 1)) {
        fprintf(stderr, "tandem-stop: %s: %s\n", sock_path, strerror(errno));
        return -1;
    }
    regbuf = g_byte_array_new();
    membuf = g_byte_array_new();
    qemu_plugin_register_vcpu_init_cb(id, on_vcpu_init);
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_atexit_cb(id, on_atexit, NULL);
    return 0;
}
