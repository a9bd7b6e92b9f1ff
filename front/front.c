/* libpinguard-lazy.so: the first stage of pinguard for a node-wide or container-wide preload.
 *
 * Most processes of a node never pin a byte, and loading libpinguard.so itself costs each of them
 * its relocated pages (docs/field-notes.md, "What a process that never pins pays"). This object is
 * small: it exports every name libpinguard.so exports (the hooks' tables in src/hooks/ and the C
 * API, generated into front_exports.h by build.rs), each a trampoline that jumps through a slot,
 * and loads libpinguard.so from its own folder at the first call that can pin, then sends every
 * call there. Until then:
 *   - a call that cannot pin (munmap, mremap, munlock, munlockall, dlclose, _exit, _Exit, the
 *     signal dispositions) goes to the next definition, found at its first call by this object's
 *     own look-up in the symbol tables of the objects loaded at start after it (no dlsym, no
 *     lock: it may run in a signal handler);
 *   - mmap and mmap64 load the core only for MAP_LOCKED;
 *   - dlsym and dlvsym load it only for a name this object exports (the program is looking up a
 *     runtime's entry point), and otherwise jump to the real one with the caller's return address
 *     intact (RTLD_NEXT stays the caller's);
 *   - every other export (the runtimes' entry points, mlock, mlock2, mlockall, the C API) loads it.
 * Set-up that must come before the first pin loads it from the constructor: a setuid process
 * (its environment is scrubbed before main), and a report signal, an interval or a group set in
 * the environment or the node file. The exit report is registered here, at load, so that it runs
 * after every exit handler the program registers (the core calls it through `pinguard_front`).
 *
 * A trampoline saves no register on its steady path: one load, a test, an indirect jump. The
 * first call of an entry saves the argument registers, decides, restores them and jumps: the
 * callee sees exactly the caller's arguments and return address. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "front_exports.h"

#define HIDDEN __attribute__((visibility("hidden")))

/* Nothing here calls the C library's string functions, sigaltstack, read or write: a sanitizer
 * preloaded before this object intercepts them, and its interceptors, reached before it has
 * started, start it, and it then looks functions up through this object's dlsym. Built with
 * -fno-builtin and -fno-tree-loop-distribute-patterns, so these loops stay loops. */
static int str_eq(const char *a, const char *b) {
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}
static size_t str_len(const char *a) {
    size_t n = 0;
    while (a[n])
        n++;
    return n;
}
static int has(const char *hay, const char *needle) {
    size_t n = str_len(needle);
    for (; *hay; hay++) {
        size_t k = 0;
        while (k < n && hay[k] == needle[k])
            k++;
        if (k == n)
            return 1;
    }
    return 0;
}

/* What the constructor writes, in `.data` beside the record: the page the loader already copied
 * to relocate (a page of `.bss` written at start would be one page fault more per process). */
#define AT_START __attribute__((section(".data.pg_start")))

/* What the core reads and fills when this object loaded it (src/runtime/front.rs). */
struct pinguard_front {
    uint32_t version;
    uint32_t stderr_known;
    uint64_t stderr_dev;
    uint64_t stderr_ino;
    void (*at_exit)(void);
};
__attribute__((visibility("default"))) struct pinguard_front pinguard_front AT_START = {1, 0, 0, 0, 0};

/* Where each trampoline jumps: 0 until an entry's target is known. In .bss: no relocation, and
 * no page of it is written before the first call that decides. */
HIDDEN void *pg_front_slots[PG_COUNT];
static void *next_fn[PG_COUNT] AT_START;
static void *core_fn[PG_COUNT];

enum { NONE, LOADED, FAILED };
static int core_state;
/* The constructor has found what the stage needs: before that, nothing loads the library (a
 * sanitizer starting inside the constructor looks functions up through this object). */
static int started AT_START;
/* This thread is inside load_core (the library's constructor or a sanitizer's start calling
 * back): such a call passes through. Initial-exec: no __tls_get_addr, which sanitizers hook. */
static __thread int loading __attribute__((tls_model("initial-exec")));
static int foreign_libc AT_START;
typedef void *(*dlsym_fn)(void *, const char *);

enum kind { LOAD, PASS, MMAP, DLSYM };

static const char *name_of(unsigned i) { return pg_name_text + pg_name_at[i]; }

/* What a call does before the library is loaded, and whether it is the C library's
 * (front/build.rs decides both: `pg_kind`). */
static enum kind kind_of(unsigned i) { return (enum kind)(pg_kind[i] & 3); }
static int of_libc(unsigned i) { return pg_kind[i] & 4; }

/* ---- Symbol look-up in the loaded objects' tables (no dlsym, no allocation) -------------- */

static uint32_t gnu_hash(const char *s) {
    uint32_t h = 5381;
    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

static uint32_t sysv_hash(const char *s) {
    uint32_t h = 0, g;
    for (; *s; s++) {
        h = (h << 4) + (unsigned char)*s;
        g = h & 0xf0000000;
        if (g)
            h ^= g >> 24;
        h &= ~g;
    }
    return h;
}

struct tables {
    uintptr_t base;
    const ElfW(Sym) * sym;
    const char *str;
    const uint32_t *gnu;
    const uint32_t *sysv;
    const uint16_t *versym;
};

static uintptr_t at(uintptr_t base, uintptr_t p) { return p < base ? base + p : p; }

static int tables_at(uintptr_t base, const ElfW(Dyn) * d, struct tables *t) {
    t->base = base;
    t->sym = 0;
    t->str = 0;
    t->gnu = 0;
    t->sysv = 0;
    t->versym = 0;
    if (!d)
        return 0;
    for (; d->d_tag != DT_NULL; d++) {
        uintptr_t v = at(t->base, d->d_un.d_ptr);
        switch (d->d_tag) {
        case DT_SYMTAB: t->sym = (const ElfW(Sym) *)v; break;
        case DT_STRTAB: t->str = (const char *)v; break;
        case DT_GNU_HASH: t->gnu = (const uint32_t *)v; break;
        case DT_HASH: t->sysv = (const uint32_t *)v; break;
        case DT_VERSYM: t->versym = (const uint16_t *)v; break;
        }
    }
    return t->sym && t->str && (t->gnu || t->sysv);
}

/* A function or data definition of `n` at its default version (never a hidden, older one). */
static int usable(const struct tables *t, uint32_t i, const char *n) {
    const ElfW(Sym) *s = &t->sym[i];
    unsigned type = ELF64_ST_TYPE(s->st_info);
    if (s->st_shndx == SHN_UNDEF || !s->st_value)
        return 0;
    if (type != STT_FUNC && type != STT_GNU_IFUNC && type != STT_OBJECT)
        return 0;
    if (ELF64_ST_BIND(s->st_info) == STB_LOCAL)
        return 0;
    if (t->versym && (t->versym[i] & 0x8000))
        return 0;
    return str_eq(t->str + s->st_name, n);
}

static uintptr_t value(const struct tables *t, uint32_t i) {
    const ElfW(Sym) *s = &t->sym[i];
    uintptr_t a = t->base + s->st_value;
    if (ELF64_ST_TYPE(s->st_info) == STT_GNU_IFUNC)
        a = ((uintptr_t(*)(void))a)();
    return a;
}

static uintptr_t lookup_hashed(const struct tables *t, const char *n, uint32_t h) {
    if (t->gnu) {
        const uint32_t nbuckets = t->gnu[0], symoffset = t->gnu[1], bloom_size = t->gnu[2],
                       shift = t->gnu[3];
        const uintptr_t *bloom = (const uintptr_t *)&t->gnu[4];
        const uint32_t *buckets = (const uint32_t *)&bloom[bloom_size];
        const uint32_t *chain = &buckets[nbuckets];
        const unsigned bits = sizeof(uintptr_t) * 8;
        uintptr_t word = bloom[(h / bits) % bloom_size];
        uintptr_t mask = ((uintptr_t)1 << (h % bits)) | ((uintptr_t)1 << ((h >> shift) % bits));
        if ((word & mask) != mask || !nbuckets)
            return 0;
        uint32_t i = buckets[h % nbuckets];
        if (i < symoffset)
            return 0;
        for (;; i++) {
            uint32_t h2 = chain[i - symoffset];
            if ((h | 1) == (h2 | 1) && usable(t, i, n))
                return value(t, i);
            if (h2 & 1)
                return 0;
        }
    }
    const uint32_t nbucket = t->sysv[0];
    const uint32_t *bucket = &t->sysv[2], *chain = &bucket[nbucket];
    for (uint32_t i = bucket[sysv_hash(n) % nbucket]; i; i = chain[i])
        if (usable(t, i, n))
            return value(t, i);
    return 0;
}

static uintptr_t lookup_in(const struct tables *t, const char *n) {
    return lookup_hashed(t, n, gnu_hash(n));
}

/* The walk: `names` looked up in the objects after this one (the preload), other copies of
 * pinguard (which define pinguard_version) passed over, as RTLD_NEXT would find them. */
struct walk {
    const char *const *names;
    const uint32_t *hashes;
    void **out;
    unsigned n;
    int past;
    int glibc;
};

extern ElfW(Dyn) _DYNAMIC[] HIDDEN;

static void visit(struct walk *w, uintptr_t base, const char *name, const ElfW(Dyn) * d) {
    struct tables t;
    if (name && has(name, "libc.so.6"))
        w->glibc = 1;
    if (d == _DYNAMIC) {
        w->past = 1;
        return;
    }
    if (!w->past || !tables_at(base, d, &t) || lookup_in(&t, "pinguard_version"))
        return;
    for (unsigned k = 0; k < w->n; k++)
        if (!w->out[k])
            w->out[k] = (void *)lookup_hashed(&t, w->names[k], w->hashes[k]);
}

static int walk_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    const ElfW(Dyn) *d = 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            d = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    visit(data, info->dlpi_addr, info->dlpi_name, d);
    return 0;
}

/* The loader's list, read without a call: at start, before main, when no other thread can
 * unload anything, and when a sanitizer's dl_iterate_phdr may not be ready. glibc's loader
 * defines it; musl's does not (weak: 0 there). */
extern struct r_debug _r_debug __attribute__((weak));

/* The objects loaded at start after this one: the first and how many. They are never unloaded,
 * and the list between them never changes (a later dlopen appends after them), so a walk over
 * them takes neither the loader's lock nor a call: a signal handler may make it. The C library's
 * names are looked up there at their first call, not at start, which cost every process about
 * 9,000 instructions (callgrind, /bin/true). */
static const struct link_map *start_next AT_START;
static unsigned start_count AT_START;
/* This object's path as the loader holds it (what dladdr would answer). */
static const char *self_path AT_START;

static void note_objects_at_start(void) {
    int glibc = 0, past = 0;
    for (const struct link_map *l = _r_debug.r_map; l; l = l->l_next) {
        if (l->l_name && has(l->l_name, "libc.so.6"))
            glibc = 1;
        if (past)
            start_count++;
        else if (l->l_ld == _DYNAMIC)
            past = 1, start_next = l->l_next, self_path = l->l_name;
    }
    if (!glibc)
        foreign_libc = 1;
}

static void *find_after_at_start(const char *n, uint32_t h) {
    const struct link_map *l = start_next;
    for (unsigned k = 0; l && k < start_count; k++, l = l->l_next) {
        struct tables t;
        uintptr_t p;
        if (tables_at(l->l_addr, l->l_ld, &t) && !lookup_in(&t, "pinguard_version") &&
            (p = lookup_hashed(&t, n, h)))
            return (void *)p;
    }
    return 0;
}

/* Without the loader's list (musl), the C library's names are all found at start. */
static void find_libc_names_by_walk(void) {
    const char *names[PG_COUNT];
    uint32_t hashes[PG_COUNT];
    void *found[PG_COUNT];
    unsigned idx[PG_COUNT], n = 0;
    for (unsigned i = 0; i < PG_COUNT; i++)
        if (of_libc(i)) {
            idx[n] = i;
            names[n] = name_of(i);
            hashes[n] = pg_hash[i];
            found[n++] = 0;
        }
    struct walk w = {names, hashes, found, n, 0, 0};
    dl_iterate_phdr(walk_cb, &w);
    if (w.glibc == 0)
        foreign_libc = 1;
    for (unsigned k = 0; k < n; k++)
        next_fn[idx[k]] = found[k];
}

static void find_next(const char *const *names, const uint32_t *hashes, void **out, unsigned n) {
    struct walk w = {names, hashes, out, n, 0, 0};
    dl_iterate_phdr(walk_cb, &w);
}

static void *next_of(unsigned i) {
    void *kept = __atomic_load_n(&next_fn[i], __ATOMIC_ACQUIRE);
    if (kept)
        return kept;
    const char *n = name_of(i);
    const uint32_t h = pg_hash[i];
    void *p = 0;
    if (of_libc(i) && start_next)
        p = find_after_at_start(n, h);
    else
        find_next(&n, &h, &p, 1);
    /* The C library's functions are never unloaded: kept. A runtime's entry point is found again
     * each time (its object may be unloaded and loaded elsewhere). */
    if (of_libc(i))
        __atomic_store_n(&next_fn[i], p, __ATOMIC_RELEASE);
    return p;
}

/* The C library's dlsym, found at its first use. */
static dlsym_fn next_dlsym(void) { return (dlsym_fn)next_of(PG_DLSYM); }

/* `name`'s first definition in the program's scope, in its order. */
static void *find_anywhere(const char *name) {
    const uint32_t h = gnu_hash(name);
    void *p = 0;
    /* `past` from the first object: the program's scope in its order, as a linked reference
     * would find it (the stage itself and other copies of pinguard passed over). Never in a
     * signal handler: it takes the loader's lock. */
    struct walk w = {&name, &h, &p, 1, 1, 0};
    dl_iterate_phdr(walk_cb, &w);
    return p;
}

/* dlopen and dlerror are looked up when the library is loaded, not linked: before glibc 2.34
 * they live in libdl.so.2, and a NEEDED libdl.so.2 (the glibc 2.17 release build had one) cost
 * every process its load, pin or not (about 45 us per exec here). A process of such a glibc that
 * has not loaded libdl gets it through its C library's own entry, `__libc_dlopen_mode`
 * (GLIBC_PRIVATE up to 2.33; libdl's dlopen calls it too). */
static void *loader_fn(const char *name) {
    void *p = find_anywhere(name);
    if (p)
        return p;
    typedef const struct link_map *(*own_open_fn)(const char *, int);
    own_open_fn own = (own_open_fn)find_anywhere("__libc_dlopen_mode");
    const struct link_map *m = own ? own("libdl.so.2", RTLD_NOW) : 0;
    struct tables t;
    return m && tables_at(m->l_addr, m->l_ld, &t) ? (void *)lookup_in(&t, name) : 0;
}

/* dlsym for the stage's own use: the program's (next_of), else libdl's as above. */
static dlsym_fn loader_dlsym(void) {
    dlsym_fn f = next_dlsym();
    return f ? f : (dlsym_fn)loader_fn("dlsym");
}

/* ---- Loading the core -------------------------------------------------------------------- */

/* Whether a signal handler may be running on this thread: on the alternate stack, or a blocked
 * signal that has a handler (raw system calls). A wrong yes only leaves the load to a later call,
 * the call before it passing through untracked, as the core does before its set-up. */
static int maybe_in_handler(void) {
    stack_t ss;
    if (syscall(SYS_sigaltstack, 0, &ss) == 0 && (ss.ss_flags & SS_ONSTACK))
        return 1;
    uint64_t set = 0;
    if (syscall(SYS_rt_sigprocmask, SIG_BLOCK, 0, &set, 8) != 0)
        return 0;
    for (int sig = 1; sig <= 64; sig++) {
        uintptr_t act[4];
        act[0] = 0;
        if ((set >> (sig - 1) & 1) && syscall(SYS_rt_sigaction, sig, 0, act, 8) == 0 &&
            act[0] != (uintptr_t)SIG_DFL && act[0] != (uintptr_t)SIG_IGN)
            return 1;
    }
    return 0;
}

/* fstat as the system call (a glibc 2.17 build would name __fxstat64, which musl lacks); the
 * kernel's struct stat is glibc's on x86-64 and aarch64. */
static int stat_fd(int fd, struct stat *st) { return (int)syscall(SYS_fstat, fd, st); }

/* Whether descriptor 2 is still the stream it was at start (the core's rule for its lines). */
static void say(const char *a, const char *b) {
    struct stat st;
    if (!pinguard_front.stderr_known || stat_fd(2, &st) != 0 ||
        (uint64_t)st.st_dev != pinguard_front.stderr_dev ||
        (uint64_t)st.st_ino != pinguard_front.stderr_ino)
        return;
    char line[512];
    size_t n = 0;
    const char *parts[] = {"pinguard: cannot load ", a, " (", b, "); running WITHOUT pinguard\n"};
    for (unsigned k = 0; k < 5; k++)
        for (const char *p = parts[k]; p && *p && n < sizeof line - 1; p++)
            line[n++] = *p;
    (void)syscall(SYS_write, 2, line, n);
}

static int load_core_now(void);

/* Calls fn on the stack whose top is `top` (front/front.c's assembly below). */
HIDDEN int pg_front_on_stack(int (*fn)(void), void *top);

/* Loading (dlopen, the library's constructor) takes tens of KiB of stack; the first pinning call
 * may come from a thread with little (the library's rule: a hooked call takes at most 4 KiB of
 * the caller's). It runs on a stack of its own, unmapped again once the library is loaded. */
static int load_on_own_stack(void) {
    enum { SIZE = 256 << 10 };
    long m = syscall(SYS_mmap, 0, SIZE, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m < 0 && m > -4096)
        return load_core_now();
    int ok = pg_front_on_stack(load_core_now, (char *)m + SIZE);
    syscall(SYS_munmap, m, SIZE);
    return ok;
}

static int load_core(void) {
    int s = __atomic_load_n(&core_state, __ATOMIC_ACQUIRE);
    if (s != NONE)
        return s == LOADED;
    if (!__atomic_load_n(&started, __ATOMIC_ACQUIRE) || foreign_libc || loading ||
        maybe_in_handler())
        return 0;
    loading = 1;
    int ok = load_on_own_stack();
    loading = 0;
    return ok;
}

static void failed(const char *path, const char *why) {
    int none = NONE;
    if (__atomic_compare_exchange_n(&core_state, &none, FAILED, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        say(path, why);
}

/* A library (not a stage) already loaded, by a preload after this one or a `dlopen`: the copy
 * in charge, which every call must reach, rather than a second one that would stand down. */
static int full_copy_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    const ElfW(Dyn) *d = 0;
    struct tables t;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            d = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (d != _DYNAMIC && info->dlpi_name && *info->dlpi_name && tables_at(info->dlpi_addr, d, &t) &&
        lookup_in(&t, "pinguard_version") && !lookup_in(&t, "pinguard_front")) {
        *(const char **)data = info->dlpi_name;
        return 1;
    }
    return 0;
}

/* The path of the library to load: a full copy already loaded, else libpinguard.so in this
 * object's folder. 0 if it does not fit. */
static int core_path(char *path, size_t size) {
    const char *loaded = 0;
    dl_iterate_phdr(full_copy_cb, &loaded);
    if (loaded) {
        size_t n = str_len(loaded);
        if (n >= size)
            return 0;
        for (size_t k = 0; k <= n; k++)
            path[k] = loaded[k];
        return 1;
    }
    if (!self_path)
        return 0;
    size_t n = str_len(self_path), dir = 0;
    for (size_t k = 0; k < n; k++)
        if (self_path[k] == '/')
            dir = k + 1;
    static const char core[] = "libpinguard.so";
    if (dir + sizeof core > size)
        return 0;
    for (size_t k = 0; k < dir; k++)
        path[k] = self_path[k];
    for (size_t k = 0; k < sizeof core; k++)
        path[dir + k] = core[k];
    return 1;
}

typedef void *(*dlopen_fn)(const char *, int);
typedef char *(*dlerror_fn)(void);

static int load_core_now(void) {
    char path[4096];
    dlopen_fn open = (dlopen_fn)loader_fn("dlopen");
    dlerror_fn error = (dlerror_fn)loader_fn("dlerror");
    dlsym_fn sym = loader_dlsym();
    if (!core_path(path, sizeof path))
        return 0;
    if (!open || !sym) {
        failed(path, "this process has no dlopen");
        return 0;
    }
    void *h = open(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const char *why = error ? error() : 0;
        failed(path, why ? why : "not found");
        return 0;
    }
    /* A stage under the library's name (a copy of this file): it would send calls to itself. */
    if (sym(h, "pinguard_front") || !sym(h, "pinguard_version")) {
        failed(path, "it is not the library but a first stage");
        return 0;
    }
    for (unsigned i = 0; i < PG_COUNT; i++)
        __atomic_store_n(&core_fn[i], sym(h, name_of(i)), __ATOMIC_RELEASE);
    if (error)
        error(); /* the look-ups' misses are not the program's next dlerror() */
    __atomic_store_n(&core_state, LOADED, __ATOMIC_SEQ_CST);
    for (unsigned i = 0; i < PG_COUNT; i++)
        if (core_fn[i])
            __atomic_store_n(&pg_front_slots[i], core_fn[i], __ATOMIC_SEQ_CST);
    return 1;
}

/* A target for a slot until the core is loaded: set only if the slot is still empty, then set
 * to the core's if it was loaded meanwhile (the loader sets every slot after it says loaded). */
static void keep(unsigned i, void *t) {
    void *none = 0;
    __atomic_compare_exchange_n(&pg_front_slots[i], &none, t, 0, __ATOMIC_SEQ_CST,
                                __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&core_state, __ATOMIC_SEQ_CST) == LOADED && core_fn[i])
        __atomic_store_n(&pg_front_slots[i], core_fn[i], __ATOMIC_SEQ_CST);
}

static unsigned index_of_name(const char *n) {
    for (unsigned i = 0; i < PG_COUNT; i++)
        if (str_eq(n, name_of(i)))
            return i;
    return PG_COUNT;
}

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

/* mmap's slot until the core is loaded: a typed gate, cheaper than the cold path. */
static void *gate_mmap(unsigned i, void *a, size_t l, int p, int f, int fd, off_t o) {
    void *t = (f & MAP_LOCKED) && load_core() ? core_fn[i] : next_of(i);
    if (!t) {
        errno = ENOSYS;
        return MAP_FAILED;
    }
    return ((mmap_fn)t)(a, l, p, f, fd, o);
}
static void *gate_mmap0(void *a, size_t l, int p, int f, int fd, off_t o) {
    return gate_mmap(PG_MMAP, a, l, p, f, fd, o);
}
static void *gate_mmap64(void *a, size_t l, int p, int f, int fd, off_t o) {
    return gate_mmap(PG_MMAP64, a, l, p, f, fd, o);
}

static void *decide(unsigned i, const uintptr_t *regs) {
    if (__atomic_load_n(&core_state, __ATOMIC_ACQUIRE) == LOADED && core_fn[i]) {
        __atomic_store_n(&pg_front_slots[i], core_fn[i], __ATOMIC_SEQ_CST);
        return core_fn[i];
    }
    switch (kind_of(i)) {
    case PASS: {
        void *t = next_of(i);
        if (t)
            keep(i, t);
        return t;
    }
    case MMAP:
        keep(i, i == PG_MMAP ? (void *)gate_mmap0 : (void *)gate_mmap64);
        return pg_front_slots[i];
    case DLSYM: {
        /* A runtime's entry point, or any hooked name in a given object (the library answers
         * with a wrapper bound to that object's function). A hooked libc name searched in the
         * scopes (RTLD_NEXT, RTLD_DEFAULT: a sanitizer starting) finds this object's export,
         * which reaches the library once it is loaded. */
        const char *asked = (const char *)regs[1];
        void *handle = (void *)regs[0];
        int scope = handle == RTLD_NEXT || handle == RTLD_DEFAULT;
        unsigned k = asked ? index_of_name(asked) : PG_COUNT;
        if (k < PG_COUNT && (!scope || kind_of(k) == LOAD) &&
            load_core())
            return core_fn[i];
        return next_of(i);
    }
    case LOAD:
        break;
    }
    return load_core() && core_fn[i] ? core_fn[i] : next_of(i);
}

/* Called by every trampoline's first path with the index and the saved argument registers. */
HIDDEN void *pg_front_target(uintptr_t i, const uintptr_t *regs) {
    int e = errno;
    void *t = decide((unsigned)i, regs);
    errno = e;
    /* No definition anywhere (a runtime's entry point with no runtime): a call through a null
     * pointer is what the program would have met without the preload, had it linked one. */
    return t;
}

/* ---- Start and exit ---------------------------------------------------------------------- */

static void front_at_exit(void) {
    void (*f)(void) = __atomic_load_n(&pinguard_front.at_exit, __ATOMIC_ACQUIRE);
    if (f)
        f();
}

/* The early settings: a report signal, an interval or a group act before any pin (the core's
 * `starts_at_once`). */
static const char *const early[] = {"PINGUARD_SIGNAL", "PINGUARD_INTERVAL", "PINGUARD_GROUP"};
enum { EARLY = 3 };

/* Which early settings the node file gives a value that is not blank (NAME=value lines, the
 * last line naming one wins, a line starting with '#' a comment: as the core reads the file,
 * which then judges the value), read byte by byte from pieces of a small
 * buffer: the scan keeps its place across pieces, so a line of any length is judged whole, and
 * no page of .bss is written at start. */
struct scan {
    enum { LEAD, NAME, AFTER_NAME, VALUE, SKIP } at;
    unsigned pos;      /* bytes of the name matched so far */
    unsigned maybe;    /* early names still matching (bit k: early[k]) */
    unsigned name;     /* the name matched, in AFTER_NAME and VALUE */
    unsigned set;      /* early names set (bit k) */
};

/* What the core trims around a name and a value (Rust's ASCII whitespace, '\n' ending the line). */
static int blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f'; }

/* The name the line's first word is, once `c` ends it (-1: none). */
static int ended(const struct scan *s, char c) {
    if (!blank(c) && c != '=')
        return -1;
    for (unsigned k = 0; k < EARLY; k++)
        if ((s->maybe >> k & 1) && str_len(early[k]) == s->pos)
            return (int)k;
    return -1;
}

static void scan_byte(struct scan *s, char c) {
    if (c == '\n') {
        if (s->at == VALUE)
            s->set &= ~(1u << s->name);
        s->at = LEAD;
        return;
    }
    switch (s->at) {
    case LEAD:
        if (blank(c))
            return;
        s->at = NAME, s->pos = 0, s->maybe = (1u << EARLY) - 1;
        /* fall through */
    case NAME: {
        int k = ended(s, c);
        if (k >= 0) {
            s->name = (unsigned)k;
            s->at = c == '=' ? VALUE : AFTER_NAME;
            return;
        }
        for (unsigned j = 0; j < EARLY; j++)
            if (s->pos >= str_len(early[j]) || early[j][s->pos] != c)
                s->maybe &= ~(1u << j);
        s->pos++;
        if (!s->maybe)
            s->at = SKIP;
        return;
    }
    case AFTER_NAME:
        if (!blank(c))
            s->at = c == '=' ? VALUE : SKIP;
        return;
    case VALUE:
        if (blank(c))
            return;
        s->set |= 1u << s->name;
        s->at = SKIP;
        return;
    case SKIP:
        return;
    }
}

/* Whether an early setting is set, in the environment or the node file (at most the core's
 * 64 KiB of it, read as it would: a larger file is ignored whole). */
static int starts_at_once(void) {
    for (unsigned k = 0; k < EARLY; k++) {
        const char *v = getenv(early[k]);
        if (v && *v)
            return 1;
    }
    const char *path = getenv("PINGUARD_CONFIG");
    if (path && !*path)
        return 0;
    if (!path || *path != '/')
        path = "/etc/pinguard/pinguard.conf";
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path,
                          O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return 0;
    struct stat st;
    struct scan s = {LEAD, 0, 0, 0, 0};
    if (stat_fd(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= 64 * 1024) {
        char piece[512];
        long n, total = 0;
        while (total < 64 * 1024 && (n = syscall(SYS_read, fd, piece, sizeof piece)) > 0) {
            for (long k = 0; k < n; k++)
                scan_byte(&s, piece[k]);
            total += n;
        }
        scan_byte(&s, '\n');
    }
    syscall(SYS_close, fd);
    return s.set != 0;
}

__attribute__((constructor)) static void front_start(void) {
    int e = errno;
    struct stat st;
    if (stat_fd(2, &st) == 0) {
        pinguard_front.stderr_dev = (uint64_t)st.st_dev;
        pinguard_front.stderr_ino = (uint64_t)st.st_ino;
        pinguard_front.stderr_known = 1;
    }
    if (&_r_debug)
        note_objects_at_start();
    else
        find_libc_names_by_walk();
    __atomic_store_n(&started, 1, __ATOMIC_RELEASE);
    atexit(front_at_exit);
    /* Only the stage the loader's scope finds first receives calls: another (a node's beside a
     * run's) stays passive. */
    dlsym_fn sym;
    if (!foreign_libc && (getauxval(AT_SECURE) || starts_at_once()) && (sym = loader_dlsym()) &&
        sym(RTLD_DEFAULT, "pinguard_front") == (void *)&pinguard_front)
        load_core();
    errno = e;
}

/* ---- The trampolines --------------------------------------------------------------------- */

#if defined(__x86_64__)
__asm__(".text\n"
        ".p2align 4\n"
        ".type pg_front_cold,@function\n"
        "pg_front_cold:\n"
        "  pushq %rbp\n"
        "  movq %rsp, %rbp\n"
        "  subq $208, %rsp\n"
        "  movq %rdi, 0(%rsp)\n"
        "  movq %rsi, 8(%rsp)\n"
        "  movq %rdx, 16(%rsp)\n"
        "  movq %rcx, 24(%rsp)\n"
        "  movq %r8, 32(%rsp)\n"
        "  movq %r9, 40(%rsp)\n"
        "  movq %rax, 48(%rsp)\n"
        "  movdqu %xmm0, 64(%rsp)\n"
        "  movdqu %xmm1, 80(%rsp)\n"
        "  movdqu %xmm2, 96(%rsp)\n"
        "  movdqu %xmm3, 112(%rsp)\n"
        "  movdqu %xmm4, 128(%rsp)\n"
        "  movdqu %xmm5, 144(%rsp)\n"
        "  movdqu %xmm6, 160(%rsp)\n"
        "  movdqu %xmm7, 176(%rsp)\n"
        "  movq %r11, %rdi\n"
        "  movq %rsp, %rsi\n"
        "  call pg_front_target\n"
        "  movq %rax, %r11\n"
        "  movq 0(%rsp), %rdi\n"
        "  movq 8(%rsp), %rsi\n"
        "  movq 16(%rsp), %rdx\n"
        "  movq 24(%rsp), %rcx\n"
        "  movq 32(%rsp), %r8\n"
        "  movq 40(%rsp), %r9\n"
        "  movq 48(%rsp), %rax\n"
        "  movdqu 64(%rsp), %xmm0\n"
        "  movdqu 80(%rsp), %xmm1\n"
        "  movdqu 96(%rsp), %xmm2\n"
        "  movdqu 112(%rsp), %xmm3\n"
        "  movdqu 128(%rsp), %xmm4\n"
        "  movdqu 144(%rsp), %xmm5\n"
        "  movdqu 160(%rsp), %xmm6\n"
        "  movdqu 176(%rsp), %xmm7\n"
        "  leave\n"
        "  jmp *%r11\n"
        ".size pg_front_cold, .-pg_front_cold\n"
        ".p2align 4\n"
        ".globl pg_front_on_stack\n"
        ".hidden pg_front_on_stack\n"
        ".type pg_front_on_stack,@function\n"
        "pg_front_on_stack:\n"
        "  pushq %rbp\n"
        "  movq %rsp, %rbp\n"
        "  movq %rsi, %rsp\n"
        "  call *%rdi\n"
        "  movq %rbp, %rsp\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size pg_front_on_stack, .-pg_front_on_stack\n");
#define PG_EXPORT(i, name)                                                                     \
    __asm__(".text\n.globl " #name "\n.type " #name ",@function\n.p2align 4\n" #name ":\n"     \
            "  movq pg_front_slots+8*" #i "(%rip), %r11\n"                                     \
            "  testq %r11, %r11\n"                                                             \
            "  jz 1f\n"                                                                        \
            "  jmp *%r11\n"                                                                    \
            "1: movl $" #i ", %r11d\n"                                                         \
            "  jmp pg_front_cold\n"                                                            \
            ".size " #name ", .-" #name "\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".p2align 4\n"
        ".type pg_front_cold,%function\n"
        "pg_front_cold:\n"
        "  stp x29, x30, [sp, #-224]!\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n"
        "  stp x2, x3, [sp, #32]\n"
        "  stp x4, x5, [sp, #48]\n"
        "  stp x6, x7, [sp, #64]\n"
        "  str x8, [sp, #80]\n"
        "  stp q0, q1, [sp, #96]\n"
        "  stp q2, q3, [sp, #128]\n"
        "  stp q4, q5, [sp, #160]\n"
        "  stp q6, q7, [sp, #192]\n"
        "  mov x0, x17\n"
        "  add x1, sp, #16\n"
        "  bl pg_front_target\n"
        "  mov x16, x0\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x2, x3, [sp, #32]\n"
        "  ldp x4, x5, [sp, #48]\n"
        "  ldp x6, x7, [sp, #64]\n"
        "  ldr x8, [sp, #80]\n"
        "  ldp q0, q1, [sp, #96]\n"
        "  ldp q2, q3, [sp, #128]\n"
        "  ldp q4, q5, [sp, #160]\n"
        "  ldp q6, q7, [sp, #192]\n"
        "  ldp x29, x30, [sp], #224\n"
        "  br x16\n"
        ".size pg_front_cold, .-pg_front_cold\n"
        ".p2align 4\n"
        ".globl pg_front_on_stack\n"
        ".hidden pg_front_on_stack\n"
        ".type pg_front_on_stack,%function\n"
        "pg_front_on_stack:\n"
        "  stp x29, x30, [sp, #-16]!\n"
        "  mov x29, sp\n"
        "  mov sp, x1\n"
        "  blr x0\n"
        "  mov sp, x29\n"
        "  ldp x29, x30, [sp], #16\n"
        "  ret\n"
        ".size pg_front_on_stack, .-pg_front_on_stack\n");
#define PG_EXPORT(i, name)                                                                     \
    __asm__(".text\n.globl " #name "\n.type " #name ",%function\n.p2align 4\n" #name ":\n"     \
            "  adrp x16, pg_front_slots+8*" #i "\n"                                            \
            "  ldr x16, [x16, #:lo12:pg_front_slots+8*" #i "]\n"                               \
            "  cbz x16, 1f\n"                                                                  \
            "  br x16\n"                                                                       \
            "1: mov x17, #" #i "\n"                                                            \
            "  b pg_front_cold\n"                                                              \
            ".size " #name ", .-" #name "\n");
#else
#error "libpinguard-lazy.so: x86-64 and aarch64 only"
#endif

PG_EXPORTS(PG_EXPORT)
