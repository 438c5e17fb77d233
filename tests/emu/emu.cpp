// emu.cpp - CPU emulator of CUDA launches for testing generated kernels.
// See emu.h for the model and guarantees.
#include "emu.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <string>
#include <vector>

#include "include/cuda_emu.h"
// The device-side macros are for kernels, not for the emulator itself.
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#undef __shared__

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CPC_EMU_ASAN 1
#else
#define CPC_EMU_ASAN 0
#endif

extern char **environ;

#ifndef CPC_EMU_CXX
#define CPC_EMU_CXX "c++"
#endif
#ifndef CPC_EMU_INCLUDE
#error "CPC_EMU_INCLUDE (tests/emu/include) must be defined by CMake"
#endif
#ifndef CPC_EMU_FLAGS
#define CPC_EMU_FLAGS ""
#endif

static void set_err(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t n, const char *fmt, ...)
{
    if (!err || !n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

// =====================================================================================
// Building modules
// =====================================================================================

static bool write_file(const std::string &path, const std::string &text)
{
    FILE *f = fopen(path.c_str(), "wb");
    if (!f)
        return false;
    bool ok = fwrite(text.data(), 1, text.size(), f) == text.size();
    ok = (fclose(f) == 0) && ok;
    return ok;
}

static bool read_file(const std::string &path, std::string *out)
{
    FILE *f = fopen(path.c_str(), "rb");
    if (!f)
        return false;
    char buf[65536];
    size_t n;
    out->clear();
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        out->append(buf, n);
    fclose(f);
    return true;
}

static std::vector<std::string> split_flags(const char *s)
{
    std::vector<std::string> v;
    std::string cur;
    for (const char *p = s; *p; p++) {
        if (*p == ' ') {
            if (!cur.empty())
                v.push_back(cur);
            cur.clear();
        } else {
            cur += *p;
        }
    }
    if (!cur.empty())
        v.push_back(cur);
    return v;
}

// Runs argv with stdout to out_path and stderr to err_path; returns the exit
// status (or -1 when it could not start).
static int run_tool(const std::vector<std::string> &argv, const std::string &out_path,
                    const std::string &err_path)
{
    std::vector<char *> a;
    for (const std::string &s : argv)
        a.push_back(const_cast<char *>(s.c_str()));
    a.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int rc = posix_spawnp(&pid, a[0], &fa, nullptr, a.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static bool is_ident(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Names of the __global__ functions in preprocessed text: after each marker,
// the identifier right before the first '('.
static std::vector<std::string> scan_kernels(const std::string &pp)
{
    static const char mark[] = "CPC_EMU_GLOBAL_MARK";
    std::vector<std::string> names;
    size_t pos = 0;
    while ((pos = pp.find(mark, pos)) != std::string::npos) {
        pos += sizeof mark - 1;
        size_t paren = pp.find('(', pos);
        if (paren == std::string::npos)
            break;
        size_t e = paren;
        while (e > pos && (pp[e - 1] == ' ' || pp[e - 1] == '\n' || pp[e - 1] == '\t'))
            e--;
        size_t b = e;
        while (b > pos && is_ident(pp[b - 1]))
            b--;
        if (e > b)
            names.push_back(pp.substr(b, e - b));
        pos = paren;
    }
    return names;
}

static std::string tail(const std::string &s, size_t n)
{
    return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

extern "C" int cpc_emu_build_module(const char *source, const char *so_path, char *err,
                                    size_t err_len)
{
    char dir_tmpl[] = "/tmp/cpc-emu-XXXXXX";
    if (!mkdtemp(dir_tmpl)) {
        set_err(err, err_len, "emu: mkdtemp: %s", strerror(errno));
        return -1;
    }
    std::string dir = dir_tmpl;
    std::string src = dir + "/module.cu.cpp", gen = dir + "/gen.cpp", pp = dir + "/pp.txt",
                log = dir + "/log.txt";
    int rc = -1;
    std::string text, pptext;
    std::vector<std::string> names;
    std::vector<std::string> flags = split_flags(CPC_EMU_FLAGS);
    if (!write_file(src, source)) {
        set_err(err, err_len, "emu: cannot write %s", src.c_str());
        goto out;
    }
    {
        std::vector<std::string> a = {CPC_EMU_CXX, "-std=gnu++17", "-E", "-P", "-DCPC_EMU_SCAN",
                                      "-I" CPC_EMU_INCLUDE, "-include", "cuda_emu.h", "-x", "c++",
                                      src};
        int st = run_tool(a, pp, log);
        if (st != 0 || !read_file(pp, &pptext)) {
            read_file(log, &text);
            set_err(err, err_len, "emu: preprocessing failed (%d): %s", st, tail(text, 1500).c_str());
            goto out;
        }
    }
    names = scan_kernels(pptext);
    if (names.empty()) {
        set_err(err, err_len, "emu: the module has no __global__ function");
        goto out;
    }
    text = source;
    text += "\n// ---- registration (cpc emulator) ----\n";
    for (const std::string &n : names)
        text += "static void cpc_emu_inv_" + n + "(void **a) { cpc_emu_call(&" + n + ", a); }\n";
    text += "extern \"C\" __attribute__((visibility(\"default\"))) const cpc_emu_kernel_entry "
            "cpc_emu_kernels[] = {\n";
    for (const std::string &n : names)
        text += "    {\"" + n + "\", cpc_emu_inv_" + n + "},\n";
    text += "    {nullptr, nullptr}};\n";
    if (!write_file(gen, text)) {
        set_err(err, err_len, "emu: cannot write %s", gen.c_str());
        goto out;
    }
    {
        // unique per process AND thread: rank threads of one process may build at once
        static std::atomic<unsigned> seq{0};
        std::string tmp_so = std::string(so_path) + ".tmp" + std::to_string(getpid()) + "-" +
                             std::to_string(gettid()) + "-" + std::to_string(seq++);
        std::vector<std::string> a = {CPC_EMU_CXX, "-std=gnu++17", "-O2", "-g", "-fPIC", "-shared",
                                      "-fno-strict-aliasing", "-Wno-unused-parameter",
                                      "-I" CPC_EMU_INCLUDE, "-include", "cuda_emu.h"};
        a.insert(a.end(), flags.begin(), flags.end());
        a.insert(a.end(), {"-x", "c++", gen, "-o", tmp_so});
        int st = run_tool(a, dir + "/cc.out", log);
        if (st != 0) {
            read_file(log, &text);
            set_err(err, err_len, "emu: compiling the module failed (%d): %s", st,
                    tail(text, 3000).c_str());
            unlink(tmp_so.c_str());
            goto out;
        }
        if (rename(tmp_so.c_str(), so_path) != 0) {
            set_err(err, err_len, "emu: rename to %s: %s", so_path, strerror(errno));
            unlink(tmp_so.c_str());
            goto out;
        }
    }
    rc = 0;
out:
    for (const char *f : {"/module.cu.cpp", "/gen.cpp", "/pp.txt", "/log.txt", "/cc.out"})
        unlink((dir + f).c_str());
    rmdir(dir.c_str());
    return rc;
}

extern "C" int cpc_emu_build_cached(const char *source, const char *cache_dir, char **so_out,
                                    char *err, size_t err_len)
{
    *so_out = nullptr;
    std::string shim;
    if (!read_file(CPC_EMU_INCLUDE "/cuda_emu.h", &shim)) {
        set_err(err, err_len, "emu: cannot read %s", CPC_EMU_INCLUDE "/cuda_emu.h");
        return -1;
    }
    std::string key = std::string(CPC_EMU_CXX) + '\0' + CPC_EMU_FLAGS + '\0' + shim + '\0' + source;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdlen = 0;
    if (!EVP_Digest(key.data(), key.size(), md, &mdlen, EVP_sha256(), nullptr)) {
        set_err(err, err_len, "emu: sha256 failed");
        return -1;
    }
    std::string hex;
    for (unsigned i = 0; i < mdlen; i++) {
        char b[3];
        snprintf(b, sizeof b, "%02x", md[i]);
        hex += b;
    }
    mkdir(cache_dir, 0755);
    std::string path = std::string(cache_dir) + "/" + hex + ".so";
    struct stat st;
    if (stat(path.c_str(), &st) != 0 && cpc_emu_build_module(source, path.c_str(), err, err_len) != 0)
        return -1;
    *so_out = strdup(path.c_str());
    if (!*so_out) {
        set_err(err, err_len, "emu: out of memory");
        return -1;
    }
    return 0;
}

// =====================================================================================
// Modules
// =====================================================================================

struct cpc_emu_kernel {
    cpc_emu_kernel_entry e;
};

struct cpc_emu_module {
    void *dl;
    const cpc_emu_kernel_entry *table;
    int n;
};

extern "C" int cpc_emu_module_load(const char *so_path, cpc_emu_module **out, char *err,
                                   size_t err_len)
{
    *out = nullptr;
    void *dl = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        set_err(err, err_len, "emu: dlopen %s: %s", so_path, dlerror());
        return -1;
    }
    auto *t = static_cast<const cpc_emu_kernel_entry *>(dlsym(dl, "cpc_emu_kernels"));
    if (!t) {
        set_err(err, err_len, "emu: %s is not an emulator module (no cpc_emu_kernels)", so_path);
        dlclose(dl);
        return -1;
    }
    auto *m = static_cast<cpc_emu_module *>(calloc(1, sizeof(cpc_emu_module)));
    if (!m) {
        dlclose(dl);
        set_err(err, err_len, "emu: out of memory");
        return -1;
    }
    m->dl = dl;
    m->table = t;
    while (t[m->n].name)
        m->n++;
    *out = m;
    return 0;
}

extern "C" void cpc_emu_module_unload(cpc_emu_module *m)
{
    if (!m)
        return;
    dlclose(m->dl);
    free(m);
}

extern "C" const cpc_emu_kernel *cpc_emu_module_kernel(const cpc_emu_module *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->table[i].name, name) == 0)
            return reinterpret_cast<const cpc_emu_kernel *>(&m->table[i]);
    return nullptr;
}

extern "C" int cpc_emu_module_kernel_count(const cpc_emu_module *m) { return m->n; }

extern "C" const char *cpc_emu_module_kernel_name(const cpc_emu_module *m, int i)
{
    return i >= 0 && i < m->n ? m->table[i].name : nullptr;
}

// =====================================================================================
// Launches: fibers
// =====================================================================================

// ---- context switching ------------------------------------------------------------
// On x86-64 a fiber switch saves the callee-saved registers, MXCSR and the x87
// control word on the current stack and swaps stack pointers (no system
// call: glibc's swapcontext makes two signal-mask system calls per switch,
// which dominated the emulator's time).  Elsewhere, ucontext.
#if defined(__x86_64__)
#define CPC_EMU_FAST_SWITCH 1
extern "C" void cpc_emu_switch(void **save_sp, void *new_sp);
__asm__(".text\n"
        ".globl cpc_emu_switch\n"
        ".hidden cpc_emu_switch\n"
        ".type cpc_emu_switch,@function\n"
        "cpc_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size cpc_emu_switch, .-cpc_emu_switch\n");
#else
#define CPC_EMU_FAST_SWITCH 0
#endif

enum fiber_state { F_READY, F_WAIT_BLOCK, F_WAIT_WARP, F_DONE };

static const size_t STACK_BYTES = (size_t)256 << 10;

struct Fiber {
#if CPC_EMU_FAST_SWITCH
    void *sp;          // saved stack pointer while switched out
#else
    ucontext_t ctx;
#endif
    char *stack;
    cpc_emu_thread_view view;
    int state;
    int kind;         // collective kind while F_WAIT_WARP
    void *asan_fake;
};

struct Warp {
    unsigned exists;   // lanes that exist (last warp of a block may be partial)
    unsigned done;     // lanes that exited
    unsigned arrived;  // lanes waiting at the current collective
    unsigned mask;     // its mask
    int kind;
    uint64_t slots[32];
    unsigned char xbuf[32][64];
};

struct Launch {
    const cpc_emu_kernel_entry *k;
    void **args;
    dim3 grid, block;
    unsigned n;
    Fiber *f;
    std::vector<Warp> warps;
#if CPC_EMU_FAST_SWITCH
    void *sched_sp;
#else
    ucontext_t sched;
#endif
    const void *sched_bottom;
    size_t sched_size;
    void *smem;
    size_t smem_bytes;
    unsigned live, block_arrived;
    unsigned cur;
    bool failed;
    char err[1024];
};

static thread_local Launch *tl_launch;
static thread_local int tl_order = -1;    // -1: from CPC_EMU_ORDER

// Pool of fiber stacks per OS thread, grown on demand.
static thread_local char *tl_stacks;
static thread_local size_t tl_stacks_n;
// Under ASan: the lowest frame address each stack had when its fiber last
// switched out.  A fiber that dies (or is abandoned by a failed launch)
// never returns from its frames, so their redzones stay poisoned; they are
// unpoisoned before the stack is reused.
static thread_local void **tl_stack_low;

// Releases the calling thread's stacks when it exits (rank threads of a fake
// cudart come and go).
struct StackPoolOwner {
    ~StackPoolOwner()
    {
        if (tl_stacks) {
#if CPC_EMU_ASAN
            __asan_unpoison_memory_region(tl_stacks, tl_stacks_n * STACK_BYTES);
#endif
            munmap(tl_stacks, tl_stacks_n * STACK_BYTES);
        }
        tl_stacks = nullptr;
        tl_stacks_n = 0;
        free(tl_stack_low);
        tl_stack_low = nullptr;
    }
};
static thread_local StackPoolOwner tl_pool_owner;

static void note_stack_low(unsigned i, void *sp)
{
    if (CPC_EMU_ASAN && tl_stack_low && i < tl_stacks_n &&
        (!tl_stack_low[i] || (char *)sp < (char *)tl_stack_low[i]))
        tl_stack_low[i] = sp;
}

static void clean_stack(unsigned i)
{
#if CPC_EMU_ASAN
    char *base = tl_stacks + (size_t)i * STACK_BYTES, *top = base + STACK_BYTES;
    char *low = tl_stack_low && tl_stack_low[i] ? (char *)tl_stack_low[i] - 1024 : top - 256;
    if (low < base)
        low = base;
    __asan_unpoison_memory_region(low, (size_t)(top - low));
    if (tl_stack_low)
        tl_stack_low[i] = nullptr;
#else
    (void)i;
#endif
}

static const char *kind_name(int kind)
{
    switch (kind) {
    case CPC_EMU_K_SYNCWARP: return "__syncwarp";
    case CPC_EMU_K_SHFL: return "__shfl_*_sync";
    case CPC_EMU_K_SHFL_OUT: return "__shfl_*_sync (read)";
    case CPC_EMU_K_WMMA_LOAD: return "wmma::load_matrix_sync";
    case CPC_EMU_K_WMMA_MMA: return "wmma::mma_sync";
    case CPC_EMU_K_WMMA_STORE: return "wmma::store_matrix_sync";
    case CPC_EMU_K_MMA_SYNC: return "mma.sync";
    case CPC_EMU_K_MMA_SYNC_OUT: return "mma.sync (read)";
    }
    return "?";
}

static void note_stack_low(unsigned i, void *sp);

static inline void switch_to_sched(Launch *L, Fiber *f, bool dying)
{
    note_stack_low(L->cur, __builtin_frame_address(0));
#if CPC_EMU_ASAN
    __sanitizer_start_switch_fiber(dying ? nullptr : &f->asan_fake, L->sched_bottom, L->sched_size);
#endif
    if (dying) {
#if CPC_EMU_FAST_SWITCH
        void *dead;
        cpc_emu_switch(&dead, L->sched_sp);
#else
        setcontext(&L->sched);
#endif
    } else {
#if CPC_EMU_FAST_SWITCH
        cpc_emu_switch(&f->sp, L->sched_sp);
#else
        swapcontext(&f->ctx, &L->sched);
#endif
#if CPC_EMU_ASAN
        __sanitizer_finish_switch_fiber(f->asan_fake, &L->sched_bottom, &L->sched_size);
#endif
    }
    (void)f;
}

extern "C" void cpc_emu_fail(const char *fmt, ...)
{
    Launch *L = tl_launch;
    if (!L) {
        va_list ap;
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        abort();
    }
    Fiber *f = &L->f[L->cur];
    if (!L->failed) {
        L->failed = true;
        int n = snprintf(L->err, sizeof L->err, "block (%u,%u,%u) thread (%u,%u,%u): ",
                         f->view.blockIdx.x, f->view.blockIdx.y, f->view.blockIdx.z,
                         f->view.threadIdx.x, f->view.threadIdx.y, f->view.threadIdx.z);
        va_list ap;
        va_start(ap, fmt);
        if (n > 0 && (size_t)n < sizeof L->err)
            vsnprintf(L->err + n, sizeof L->err - (size_t)n, fmt, ap);
        va_end(ap);
    }
    switch_to_sched(L, f, true);
    abort();  // not reached
}

extern "C" const cpc_emu_thread_view *cpc_emu_self(void)
{
    Launch *L = tl_launch;
    if (!L)
        cpc_emu_fail("CUDA device function called outside a launch");
    return &L->f[L->cur].view;
}

extern "C" void *cpc_emu_dynamic_smem(void) { return tl_launch ? tl_launch->smem : nullptr; }

extern "C" uint64_t *cpc_emu_warp_slots(void)
{
    Launch *L = tl_launch;
    return L->warps[L->f[L->cur].view.warp].slots;
}

static void release_block_if_complete(Launch *L)
{
    if (L->block_arrived == 0 || L->block_arrived < L->live)
        return;
    for (unsigned i = 0; i < L->n; i++)
        if (L->f[i].state == F_WAIT_BLOCK)
            L->f[i].state = F_READY;
    L->block_arrived = 0;
}

extern "C" void cpc_emu_syncthreads(void)
{
    Launch *L = tl_launch;
    Fiber *f = &L->f[L->cur];
    Warp &w = L->warps[f->view.warp];
    if (w.arrived)
        cpc_emu_fail("__syncthreads while lanes of warp %u wait at %s (divergent code)",
                     f->view.warp, kind_name(w.kind));
    f->state = F_WAIT_BLOCK;
    L->block_arrived++;
    release_block_if_complete(L);
    if (f->state != F_READY)
        switch_to_sched(L, f, false);
}

extern "C" void cpc_emu_warp_barrier(int kind, unsigned mask)
{
    Launch *L = tl_launch;
    Fiber *f = &L->f[L->cur];
    Warp &w = L->warps[f->view.warp];
    unsigned lane = f->view.lane, bit = 1u << lane;
    if (!(mask & bit))
        cpc_emu_fail("%s with a mask (0x%08x) that does not name the calling lane %u",
                     kind_name(kind), mask, lane);
    unsigned need = mask & w.exists;
    if (need & w.done)
        cpc_emu_fail("%s waits for lanes that have exited (mask 0x%08x, exited 0x%08x)",
                     kind_name(kind), mask, w.done);
    if (w.arrived) {
        if (w.kind != kind || w.mask != mask)
            cpc_emu_fail("divergent warp collective: lane %u at %s (mask 0x%08x) while other lanes "
                         "wait at %s (mask 0x%08x)",
                         lane, kind_name(kind), mask, kind_name(w.kind), w.mask);
    } else {
        w.kind = kind;
        w.mask = mask;
    }
    w.arrived |= bit;
    f->state = F_WAIT_WARP;
    f->kind = kind;
    if ((w.arrived & need) == need) {
        unsigned base = f->view.warp * 32;
        for (unsigned l = 0; l < 32; l++)
            if ((w.arrived >> l & 1u) && base + l < L->n)
                L->f[base + l].state = F_READY;
        w.arrived = 0;
    }
    if (f->state != F_READY)
        switch_to_sched(L, f, false);
}

extern "C" void cpc_emu_warp_exchange(const void *mine, unsigned bytes, void *all)
{
    Launch *L = tl_launch;
    if (bytes > 64)
        cpc_emu_fail("warp exchange of %u bytes (at most 64)", bytes);
    Warp &w = L->warps[L->f[L->cur].view.warp];
    memcpy(w.xbuf[L->f[L->cur].view.lane], mine, bytes);
    cpc_emu_warp_barrier(CPC_EMU_K_MMA_SYNC, 0xffffffffu);
    for (unsigned l = 0; l < 32; l++)
        memcpy(static_cast<unsigned char *>(all) + (size_t)l * bytes, w.xbuf[l], bytes);
    cpc_emu_warp_barrier(CPC_EMU_K_MMA_SYNC_OUT, 0xffffffffu);
}

static void fiber_entry(void)
{
    Launch *L = tl_launch;
#if CPC_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &L->sched_bottom, &L->sched_size);
#endif
    L->k->invoke(L->args);
    Fiber *f = &L->f[L->cur];
    f->state = F_DONE;
    L->live--;
    Warp &w = L->warps[f->view.warp];
    w.done |= 1u << f->view.lane;
    if (w.arrived & w.mask & (1u << f->view.lane))
        w.arrived &= ~(1u << f->view.lane);  // cannot happen: it was not waiting
    release_block_if_complete(L);
    switch_to_sched(L, f, true);
}

static int get_order(void)
{
    if (tl_order < 0) {
        const char *e = getenv("CPC_EMU_ORDER");
        tl_order = e && strcmp(e, "reverse") == 0 ? 1 : 0;
    }
    return tl_order;
}

extern "C" void cpc_emu_set_order(int reverse) { tl_order = reverse ? 1 : 0; }

static std::string describe_deadlock(Launch *L)
{
    std::string s = "deadlock: no thread can proceed (";
    unsigned nb = 0;
    for (unsigned i = 0; i < L->n; i++)
        nb += L->f[i].state == F_WAIT_BLOCK;
    s += std::to_string(nb) + " of " + std::to_string(L->live) +
         " live threads wait at __syncthreads";
    for (size_t wi = 0; wi < L->warps.size(); wi++) {
        const Warp &w = L->warps[wi];
        if (w.arrived) {
            char b[160];
            snprintf(b, sizeof b, "; warp %zu: lanes 0x%08x at %s, mask 0x%08x, exited 0x%08x", wi,
                     w.arrived, kind_name(w.kind), w.mask, w.done);
            s += b;
        }
    }
    return s + ")";
}

#if CPC_EMU_FAST_SWITCH
// A fresh fiber's stack, as cpc_emu_switch leaves a switched-out one: MXCSR and
// x87 control word, six zeroed callee-saved registers, the entry point as the
// return address, and a dummy return address above it so that the entry
// runs with the stack aligned as after a call (rsp = 8 mod 16).
static void make_fiber(Fiber *f, unsigned i)
{
    clean_stack(i);
    uintptr_t top = ((uintptr_t)f->stack + STACK_BYTES) & ~(uintptr_t)15;
    uint64_t *sp = reinterpret_cast<uint64_t *>(top - 72);
    uint32_t ctl[2] = {0x1f80u, 0x037fu};   // MXCSR default, x87 control word default
    memcpy(&sp[0], ctl, 8);
    for (int i = 1; i <= 6; i++)
        sp[i] = 0;
    sp[7] = (uint64_t)(uintptr_t)&fiber_entry;
    sp[8] = 0;
    f->sp = sp;
}
#else
// getcontext returns twice: kept out of run_block's frame.
static __attribute__((noinline)) void make_fiber(Fiber *f, unsigned i)
{
    clean_stack(i);
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack;
    f->ctx.uc_stack.ss_size = STACK_BYTES;
    f->ctx.uc_link = nullptr;
    makecontext(&f->ctx, fiber_entry, 0);
}
#endif

static int run_block(Launch *L, uint3 bidx, bool reverse)
{
    L->live = L->n;
    L->block_arrived = 0;
    for (Warp &w : L->warps) {
        w.done = w.arrived = 0;
        w.kind = 0;
        w.mask = 0;
    }
    if (L->smem)
        memset(L->smem, 0xff, L->smem_bytes);  // NaN garbage: reads before writes show
    for (unsigned i = 0; i < L->n; i++) {
        Fiber &f = L->f[i];
        unsigned x = i % L->block.x, y = (i / L->block.x) % L->block.y,
                 z = i / (L->block.x * L->block.y);
        f.view.threadIdx = {x, y, z};
        f.view.blockIdx = bidx;
        f.view.blockDim = L->block;
        f.view.gridDim = L->grid;
        f.view.lane = i % 32;
        f.view.warp = i / 32;
        f.state = F_READY;
        make_fiber(&f, i);
    }
    unsigned done = 0;
    for (;;) {
        bool progressed = false;
        for (unsigned j = 0; j < L->n; j++) {
            unsigned i = reverse ? L->n - 1 - j : j;
            Fiber &f = L->f[i];
            if (f.state != F_READY)
                continue;
            L->cur = i;
            progressed = true;
#if CPC_EMU_ASAN
            void *fake = nullptr;
            __sanitizer_start_switch_fiber(&fake, f.stack, STACK_BYTES);
#endif
#if CPC_EMU_FAST_SWITCH
            cpc_emu_switch(&L->sched_sp, f.sp);
#else
            swapcontext(&L->sched, &f.ctx);
#endif
#if CPC_EMU_ASAN
            __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
            if (L->failed)
                return -1;
        }
        done = 0;
        for (unsigned i = 0; i < L->n; i++)
            done += L->f[i].state == F_DONE;
        if (done == L->n)
            return 0;
        if (!progressed) {
            std::string d = describe_deadlock(L);
            snprintf(L->err, sizeof L->err, "block (%u,%u,%u): %s", bidx.x, bidx.y, bidx.z, d.c_str());
            L->failed = true;
            return -1;
        }
    }
}

extern "C" int cpc_emu_launch(const cpc_emu_kernel *k, cpc_emu_dim3 grid, cpc_emu_dim3 block,
                              size_t dyn_smem, void **args, char *err, size_t err_len)
{
    if (!k) {
        set_err(err, err_len, "emu: launch of a NULL kernel");
        return -1;
    }
    unsigned long long nthreads = (unsigned long long)block.x * block.y * block.z;
    if (nthreads == 0 || nthreads > 1024 || block.z > 64) {
        set_err(err, err_len, "emu: %s: invalid block (%u,%u,%u): 1..1024 threads, z <= 64",
                k->e.name, block.x, block.y, block.z);
        return -1;
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
        grid.z > 65535) {
        set_err(err, err_len, "emu: %s: invalid grid (%u,%u,%u)", k->e.name, grid.x, grid.y, grid.z);
        return -1;
    }
    if (dyn_smem > 232448) {
        set_err(err, err_len, "emu: %s: %zu bytes of dynamic shared memory (sm_90 allows 232448)",
                k->e.name, dyn_smem);
        return -1;
    }
    if (tl_launch) {
        set_err(err, err_len, "emu: launch from inside a kernel");
        return -1;
    }
    Launch *L = new (std::nothrow) Launch();
    if (!L) {
        set_err(err, err_len, "emu: out of memory");
        return -1;
    }
    L->k = &k->e;
    L->args = args;
    L->grid = {grid.x, grid.y, grid.z};
    L->block = {block.x, block.y, block.z};
    L->n = (unsigned)nthreads;
    L->warps.resize((L->n + 31) / 32);
    for (size_t w = 0; w < L->warps.size(); w++) {
        unsigned lanes = L->n - (unsigned)w * 32 >= 32 ? 32 : L->n - (unsigned)w * 32;
        L->warps[w].exists = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1);
    }
    int rc = -1;
    L->f = static_cast<Fiber *>(calloc(L->n, sizeof(Fiber)));
    if (dyn_smem && posix_memalign(&L->smem, 128, dyn_smem) != 0)
        L->smem = nullptr;
    L->smem_bytes = dyn_smem;
    (void)&tl_pool_owner;   // odr-use: constructs it, so its destructor runs at thread exit
    if (tl_stacks_n < L->n) {
        if (tl_stacks)
        {
#if CPC_EMU_ASAN
            __asan_unpoison_memory_region(tl_stacks, tl_stacks_n * STACK_BYTES);
#endif
            munmap(tl_stacks, tl_stacks_n * STACK_BYTES);
        }
        tl_stacks_n = 0;
        void *p = mmap(nullptr, (size_t)L->n * STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        tl_stacks = p == MAP_FAILED ? nullptr : static_cast<char *>(p);
        free(tl_stack_low);
        tl_stack_low = nullptr;
        if (tl_stacks) {
            tl_stacks_n = L->n;
            if (CPC_EMU_ASAN)
                tl_stack_low = static_cast<void **>(calloc(L->n, sizeof(void *)));
        }
    }
    if (!L->f || (dyn_smem && !L->smem) || !tl_stacks) {
        set_err(err, err_len, "emu: out of memory for %u fibers", L->n);
        goto out;
    }
    for (unsigned i = 0; i < L->n; i++)
        L->f[i].stack = tl_stacks + (size_t)i * STACK_BYTES;
    tl_launch = L;
    {
        bool reverse = get_order() == 1;
        rc = 0;
        for (unsigned z = 0; z < grid.z && rc == 0; z++)
            for (unsigned y = 0; y < grid.y && rc == 0; y++)
                for (unsigned x = 0; x < grid.x && rc == 0; x++)
                    rc = run_block(L, {x, y, z}, reverse);
    }
    tl_launch = nullptr;
    if (rc != 0)
        set_err(err, err_len, "emu: %s: %s", k->e.name, L->err);
out:
    free(L->smem);
    free(L->f);
    delete L;
    return rc;
}
