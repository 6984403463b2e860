/*
 * tandem-calls: a QEMU 10 TCG plugin that turns guest kernel execution into
 * function call / return / site events for tandem's temporal assertions
 * (docs/assertions-running.md).
 *
 *   -plugin tandem-calls.so,watch=FILE,out=FILE,task=ADDR|gs:OFF[,comm=OFF][,scan=N]
 *
 * watch: one line per watched instruction, "ADDR FLAGS ID" (hex address, flags a
 *   subset of "crsxa", decimal id):
 *     c  function entry: emit a call event for function ID
 *     r  function entry: push a shadow frame so its return is reported
 *     s  assertion site: emit a site event for site ID
 *     x  an exit instruction (ret, or a ret reached through a tail call): pop the
 *        shadow frames whose entry stack pointer equals the current rsp and emit
 *        their return events (rax, and the arguments saved at the call)
 *     a  a return address (the instruction after a direct call of a watched function
 *        that can leave through an indirect jump): the same for the frames whose entry
 *        stack pointer is rsp - 8 (the ret has popped the return address)
 *   An address may appear on several lines (a function entry that is also a site).
 * out: the binary event stream (format below); written through a large buffer,
 *   flushed at exit with an END record. A stream without END was cut short.
 * task: where the current thread's pointer is: a guest address (Linux UP kernel:
 *   pcpu_hot), or gs:OFF, OFF bytes into the CPU's per-CPU area (FreeBSD: gs:0, struct
 *   pcpu's pc_curthread; the kernel's GS base is that CPU's struct pcpu).
 * comm: offset of the thread's name in it (Linux task_struct.comm, FreeBSD
 *   thread.td_name; 0: not read).
 * scan: stack words read from rsp at each event (at most MAX_SCAN; fewer where the
 *   stack's page ends), for the decoder's ORC unwinder (assertions/kernel.py).
 *
 * Only instructions at watched addresses get a callback: at translation time each
 * instruction's address is looked up in a hash set, so unrelated code runs exactly
 * as it would without the plugin.
 *
 * Instruction count and VM time come from qemu_plugin_vm_clock() (qemu-patches/0004).
 * Under -icount a TB subtracts all of its instructions from the budget before its
 * first one runs, so mid-TB the count is that of the end of the TB. Each callback
 * knows its instruction's distance to the end of its TB ("back", fixed at
 * translation time) and records it; the decoder subtracts it (and back << shift ns)
 * to get the count of instructions executed before the event's instruction.
 *
 * Stream format (little endian):
 *   header: "TDMCALL1" u32 version(1) u32 record_size(RECORD_SIZE)
 *   record: u8 type (1 call, 2 return, 3 site, 0xEE end) u8 nstack u16 back u32 id
 *           u64 icount u64 vm_ns u64 pc u64 task u64 args[6] u64 ret u64 sp u64 bp
 *           char comm[16]  then nstack u64 stack words from sp up
 *   END:    type 0xEE, args = {events, abandoned frames, open frames at exit,
 *           memory read failures, frames not pushed (depth limit), instruction
 *           callbacks}, ret = ns spent in instruction callbacks, sp = ns spent in
 *           translation callbacks (the plugin's own cost, CLOCK_MONOTONIC)
 */
#include <glib.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define MAX_SCAN 255          /* nstack is a u8 */
#define MAX_DEPTH 512

enum { EV_CALL = 1, EV_RETURN = 2, EV_SITE = 3, EV_END = 0xEE };
enum { W_CALL = 1, W_RET = 2, W_SITE = 4, W_EXIT = 8, W_AFTER = 16 };

struct watch {
    uint64_t addr;
    uint32_t id;
    uint32_t flags;
    struct watch *next;     /* another role of the same address */
};

struct insn_ud {            /* one per instrumented instruction translation */
    struct watch *w;
    uint16_t back;
};

struct __attribute__((packed)) record {
    uint8_t type;
    uint8_t nstack;
    uint16_t back;
    uint32_t id;
    uint64_t icount, vm_ns, pc, task;
    uint64_t args[6];
    uint64_t ret, sp, bp;
    char comm[16];
};
#define RECORD_SIZE ((uint32_t)sizeof(struct record))

struct frame {
    uint64_t sp;
    uint64_t args[6];
    uint32_t id;
};

struct task_stack {
    struct frame *frames;
    unsigned n, cap;
};

static GHashTable *watches;         /* uint64 addr -> struct watch * */
static GHashTable *stacks;          /* uint64 task -> struct task_stack * */
static uint64_t task_addr, comm_off;
static bool task_set, task_in_gs;        /* task= given; its address is GS-relative */
static unsigned scan_words = 128;
static FILE *out;
static uint64_t n_events, n_abandoned, n_readfail, n_overflow;
static uint64_t n_callbacks, callback_ns, translate_ns;     /* the plugin's own cost */

/* A counting filter of the entry stack pointers of all open frames (all tasks): an
 * exit instruction whose rsp is not in it returns at once, without reading the
 * current task. Most exit callbacks are rets of functions reached without a watched
 * caller (a tail-call target such as mutex_unlock runs for everyone). */
#define SP_FILTER 4096
static uint32_t sp_filter[SP_FILTER];
static uint64_t open_frames;

static inline uint32_t *sp_slot(uint64_t sp)
{
    return &sp_filter[((sp >> 3) ^ (sp >> 15)) & (SP_FILTER - 1)];
}

/* Registers: rdi rsi rdx rcx r8 r9 (arguments), rax, rsp, rbp, the GS base. */
static const char *reg_names[] = { "rdi", "rsi", "rdx", "rcx", "r8", "r9", "rax", "rsp", "rbp", "gs_base" };
#define N_REGS 10
#define R_RAX 6
#define R_RSP 7
#define R_RBP 8
#define R_GS_BASE 9
static struct qemu_plugin_register *regs[N_REGS];
static GByteArray *regbuf, *membuf;

static uint64_t read_reg(int i)
{
    uint64_t v = 0;
    int n;

    g_byte_array_set_size(regbuf, 0);
    n = qemu_plugin_read_register(regs[i], regbuf);
    if (n > 0) {
        memcpy(&v, regbuf->data, n < 8 ? n : 8);
    }
    return v;
}

static bool read_mem(uint64_t addr, void *dst, size_t len)
{
    if (!qemu_plugin_read_memory_vaddr(addr, membuf, len)) {
        n_readfail++;
        memset(dst, 0, len);
        return false;
    }
    memcpy(dst, membuf->data, len);
    return true;
}

static uint64_t current_task(void)
{
    uint64_t t = 0;

    read_mem(task_in_gs ? read_reg(R_GS_BASE) + task_addr : task_addr, &t, sizeof(t));
    return t;
}

static void emit(struct record *r)
{
    size_t len = 0;
    int64_t icount = 0, vm_ns = 0;

    qemu_plugin_vm_clock(&icount, &vm_ns);
    r->icount = icount;
    r->vm_ns = vm_ns;
    r->bp = read_reg(R_RBP);
    if (comm_off && r->task) {
        read_mem(r->task + comm_off, r->comm, sizeof(r->comm));
    }
    /* The stack from rsp up, for the decoder's unwinder. A failed read (the stack's
     * page ends within the scan) is retried up to the page end. */
    if (scan_words) {
        len = scan_words * 8;
        if (!qemu_plugin_read_memory_vaddr(r->sp, membuf, len)) {
            len = 4096 - (r->sp & 4095);
            len = len > scan_words * 8 ? scan_words * 8 : len;
            if (!qemu_plugin_read_memory_vaddr(r->sp, membuf, len)) {
                n_readfail++;
                len = 0;
            }
        }
    }
    r->nstack = len / 8;
    fwrite(r, RECORD_SIZE, 1, out);
    if (r->nstack) {
        fwrite(membuf->data, 8, r->nstack, out);
    }
    n_events++;
}

static struct task_stack *task_stack(uint64_t task)
{
    static uint64_t last_task = 1;
    static struct task_stack *last;
    struct task_stack *s;

    if (task == last_task) {
        return last;
    }
    s = g_hash_table_lookup(stacks, &task);
    if (!s) {
        uint64_t *key = g_new(uint64_t, 1);
        *key = task;
        s = g_new0(struct task_stack, 1);
        g_hash_table_insert(stacks, key, s);
    }
    last_task = task;
    last = s;
    return s;
}

static void on_entry(struct watch *w, uint16_t back, uint64_t pc)
{
    struct record r = { 0 };

    for (int i = 0; i < 6; i++) {
        r.args[i] = read_reg(i);
    }
    r.sp = read_reg(R_RSP);
    r.task = current_task();
    r.pc = pc;
    r.back = back;
    for (; w; w = w->next) {
        if (w->flags & W_RET) {
            struct task_stack *s = task_stack(r.task);
            if (s->n >= MAX_DEPTH) {
                n_overflow++;
            } else {
                if (s->n == s->cap) {
                    s->cap = s->cap ? s->cap * 2 : 16;
                    s->frames = g_renew(struct frame, s->frames, s->cap);
                }
                struct frame *f = &s->frames[s->n++];
                (*sp_slot(r.sp))++;
                open_frames++;
                f->sp = r.sp;
                f->id = w->id;
                memcpy(f->args, r.args, sizeof(f->args));
            }
        }
        if (w->flags & (W_CALL | W_SITE)) {
            r.type = (w->flags & W_CALL) ? EV_CALL : EV_SITE;
            r.id = w->id;
            emit(&r);
        }
    }
}

static void pop_frame(struct task_stack *s)
{
    (*sp_slot(s->frames[--s->n].sp))--;
    open_frames--;
}

/* A return: sp is the entry rsp of the frames it ends (the rsp at a ret; rsp - 8 at a
 * return address). */
static void on_return(uint16_t back, uint64_t pc, int64_t sp_adjust)
{
    uint64_t sp, task;
    struct task_stack *s;
    int i;

    if (!open_frames) {
        return;
    }
    uint64_t rsp = read_reg(R_RSP);
    sp = rsp + sp_adjust;
    if (!*sp_slot(sp)) {
        return;
    }
    task = current_task();
    s = task_stack(task);

    /* The frame this ret pops is the topmost with entry rsp == rsp (a tail-called
     * watched function has the same entry rsp as its caller: both return here). */
    for (i = (int)s->n - 1; i >= 0 && s->frames[i].sp != sp; i--) {
    }
    if (i < 0) {
        return;     /* a ret of an unwatched call (tail-call target reached directly) */
    }
    while (s->n > (unsigned)i + 1) {    /* never returned through a watched exit */
        pop_frame(s);
        n_abandoned++;
    }
    uint64_t rax = read_reg(R_RAX);
    while (s->n && s->frames[s->n - 1].sp == sp) {
        struct frame *f = &s->frames[s->n - 1];
        struct record r = { .type = EV_RETURN, .back = back, .id = f->id, .pc = pc,
                            .task = task, .ret = rax, .sp = rsp };
        memcpy(r.args, f->args, sizeof(r.args));
        pop_frame(s);
        emit(&r);
    }
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

static void on_insn(unsigned int vcpu, void *udata)
{
    struct insn_ud *ud = udata;
    struct watch *w = ud->w;
    uint32_t flags = 0;
    uint64_t t0 = now_ns();

    for (struct watch *x = w; x; x = x->next) {
        flags |= x->flags;
    }
    if (flags & W_AFTER) {      /* a return address: the callee's return comes first */
        on_return(ud->back, w->addr, -8);
    }
    if (flags & (W_CALL | W_RET | W_SITE)) {
        on_entry(w, ud->back, w->addr);
    }
    if (flags & W_EXIT) {
        on_return(ud->back, w->addr, 0);
    }
    n_callbacks++;
    callback_ns += now_ns() - t0;
}

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    size_t n = qemu_plugin_tb_n_insns(tb);
    uint64_t t0 = now_ns();

    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint64_t pc = qemu_plugin_insn_vaddr(insn);
        struct watch *w = g_hash_table_lookup(watches, &pc);
        if (w) {
            struct insn_ud *ud = g_new(struct insn_ud, 1);
            ud->w = w;
            ud->back = (uint16_t)(n - i);
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_insn, QEMU_PLUGIN_CB_R_REGS, ud);
        }
    }
    translate_ns += now_ns() - t0;
}

static void on_vcpu_init(qemu_plugin_id_t id, unsigned int vcpu)
{
    GArray *all = qemu_plugin_get_registers();

    for (guint i = 0; i < all->len; i++) {
        qemu_plugin_reg_descriptor *d = &g_array_index(all, qemu_plugin_reg_descriptor, i);
        for (int r = 0; r < N_REGS; r++) {
            if (!regs[r] && !strcmp(d->name, reg_names[r])) {
                regs[r] = d->handle;
            }
        }
    }
    g_array_free(all, true);
    for (int r = 0; r < N_REGS; r++) {
        if (!regs[r]) {
            fprintf(stderr, "tandem-calls: vCPU %u has no register %s\n", vcpu, reg_names[r]);
            exit(1);
        }
    }
}

static void on_atexit(qemu_plugin_id_t id, void *p)
{
    struct record r = { .type = EV_END };
    r.args[0] = n_events;
    r.args[1] = n_abandoned;
    r.args[2] = open_frames;
    r.args[3] = n_readfail;
    r.args[4] = n_overflow;
    r.args[5] = n_callbacks;
    r.ret = callback_ns;
    r.sp = translate_ns;
    fwrite(&r, RECORD_SIZE, 1, out);
    fclose(out);
    out = NULL;
}

static int load_watches(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[256];
    int lineno = 0;

    if (!f) {
        fprintf(stderr, "tandem-calls: %s: cannot open\n", path);
        return -1;
    }
    while (fgets(line, sizeof(line), f)) {
        uint64_t addr;
        char flags[8];
        unsigned id;
        lineno++;
        if (line[0] == '#' || line[0] == '\n') {
            continue;
        }
        if (sscanf(line, "%" SCNx64 " %7s %u", &addr, flags, &id) != 3) {
            fprintf(stderr, "tandem-calls: %s:%d: expected 'ADDR FLAGS ID'\n", path, lineno);
            fclose(f);
            return -1;
        }
        struct watch *w = g_new0(struct watch, 1);
        w->addr = addr;
        w->id = id;
        for (char *c = flags; *c; c++) {
            w->flags |= *c == 'c' ? W_CALL : *c == 'r' ? W_RET : *c == 's' ? W_SITE
                      : *c == 'x' ? W_EXIT : *c == 'a' ? W_AFTER : 0;
        }
        struct watch *prev = g_hash_table_lookup(watches, &addr);
        if (prev) {         /* keep the table's key: append to the existing chain */
            while (prev->next) {
                prev = prev->next;
            }
            prev->next = w;
        } else {
            g_hash_table_insert(watches, &w->addr, w);
        }
    }
    fclose(f);
    return 0;
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv)
{
    const char *watch_path = NULL, *out_path = NULL;
    static char obuf[1 << 20];

    watches = g_hash_table_new(g_int64_hash, g_int64_equal);
    stacks = g_hash_table_new(g_int64_hash, g_int64_equal);
    for (int i = 0; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            fprintf(stderr, "tandem-calls: argument %s: expected KEY=VALUE\n", argv[i]);
            return -1;
        }
        *eq = '\0';
        const char *k = argv[i], *v = eq + 1;
        if (!strcmp(k, "watch")) {
            watch_path = v;
        } else if (!strcmp(k, "out")) {
            out_path = v;
        } else if (!strcmp(k, "task")) {
            task_in_gs = !strncmp(v, "gs:", 3);
            task_addr = strtoull(task_in_gs ? v + 3 : v, NULL, 0);
            task_set = task_in_gs || task_addr;
        } else if (!strcmp(k, "comm")) {
            comm_off = strtoull(v, NULL, 0);
        } else if (!strcmp(k, "scan")) {
            scan_words = strtoul(v, NULL, 0);
            if (scan_words > MAX_SCAN) {
                scan_words = MAX_SCAN;
            }
        } else {
            fprintf(stderr, "tandem-calls: unknown argument %s\n", k);
            return -1;
        }
    }
    if (!watch_path || !out_path || !task_set) {
        fprintf(stderr, "tandem-calls: watch=, out= and task= are required\n");
        return -1;
    }
    if (load_watches(watch_path)) {
        return -1;
    }
    out = fopen(out_path, "wb");
    if (!out) {
        fprintf(stderr, "tandem-calls: %s: cannot create\n", out_path);
        return -1;
    }
    setvbuf(out, obuf, _IOFBF, sizeof(obuf));
    uint32_t hdr[2] = { 1, RECORD_SIZE };
    fwrite("TDMCALL1", 8, 1, out);
    fwrite(hdr, 4, 2, out);
    regbuf = g_byte_array_new();
    membuf = g_byte_array_new();
    qemu_plugin_register_vcpu_init_cb(id, on_vcpu_init);
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_atexit_cb(id, on_atexit, NULL);
    return 0;
}
