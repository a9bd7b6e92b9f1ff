/* Compiled into each emulated runtime (static symbols: each runtime counts on its own). The
 * runtime defines EMU_NAME first: the name in its emu_<name>_stats, and its EMU_STATS_FILE suffix. */
#define _GNU_SOURCE
#include "emul.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

struct entry {
    uintptr_t addr;
    size_t size;
    size_t counted; /* bytes it adds to what is pinned (a registration of pinned memory: fewer) */
    int owned; /* 1: we mmapped it (allocation), 0: registration, DEVICE_ENTRY, IO_ENTRY */
    int prelocked; /* a registration of pages the program had locked: its release leaves them locked */
    struct entry *next;
};

#define BUCKETS 4096
static struct entry *table[BUCKETS];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
#ifndef EMU_NAME
#define EMU_NAME "emu"
#endif
static long fail_every = -1;
static long call_no;
static double fail_rate = -1;
static uint64_t rate_no;

/* Defined by a test program that wants one figure for every runtime (and its own mlock calls):
 * the most ever pinned at once across all of them. */
extern void emu_combined_add(int64_t bytes) __attribute__((weak));

/* Fork-safe like a careful runtime: a child must not inherit the table lock held by a thread it
 * does not have (a fork test hung here once in a few thousand forks). */
static void fork_prepare(void) { pthread_mutex_lock(&table_lock); }
static void fork_release(void) { pthread_mutex_unlock(&table_lock); }
__attribute__((constructor)) static void emu_register_atfork(void) {
    pthread_atfork(fork_prepare, fork_release, fork_release);
}

/* EMU_STATS_FILE=PATH: the counters live in a MAP_SHARED mapping of PATH.<EMU_NAME> (PATH.cuda,
 * PATH.driver, PATH.acl), so that a test can still read the runtime's own count after the process
 * was killed with SIGKILL: the kernel keeps a shared file mapping's writes when the process dies.
 * The file is created (or truncated) at the first use of the counters. A fork child keeps its
 * parent's mapping, so the file then counts both; a program exec'd with the variable set starts
 * the file again. Without the variable, or if the file cannot be set up (said on stderr), the
 * counters are in process memory as before. */
static struct emu_stats private_stats;
static struct emu_stats *stats_at;
static int stats_claimed;

static struct emu_stats *map_stats_file(void) {
    const char *base = getenv("EMU_STATS_FILE");
    if (!base || !*base) return &private_stats;
    char path[4096];
    int n = snprintf(path, sizeof path, "%s.%s", base, EMU_NAME);
    struct emu_stats *m = MAP_FAILED;
    if (n > 0 && (size_t)n < sizeof path) {
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            if (ftruncate(fd, sizeof *m) == 0)
                m = mmap(NULL, sizeof *m, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
        }
    }
    if (m == MAP_FAILED) {
        fprintf(stderr, "emul(%s): EMU_STATS_FILE %s: cannot map %s; counting in memory\n", EMU_NAME, base, path);
        return &private_stats;
    }
    return m;
}

/* One thread sets the counters up; any other that comes first waits for it, so that no count
 * lands in memory the file will never see. */
static struct emu_stats *st(void) {
    struct emu_stats *s = __atomic_load_n(&stats_at, __ATOMIC_ACQUIRE);
    if (s) return s;
    if (!__atomic_exchange_n(&stats_claimed, 1, __ATOMIC_ACQ_REL)) {
        s = map_stats_file();
        __atomic_store_n(&stats_at, s, __ATOMIC_RELEASE);
        return s;
    }
    while (!(s = __atomic_load_n(&stats_at, __ATOMIC_ACQUIRE))) sched_yield();
    return s;
}

static size_t bucket(uintptr_t a) { return (a >> 12) * 2654435761u % BUCKETS; }

/* EMU_MEMINFO=PATH: a stand-in for /proc/meminfo (the host reserve's tests bind-mount PATH over
 * it in a private mount namespace), whose MemAvailable falls as the runtime pins and rises as it
 * releases: EMU_MEMINFO_BASE_KB less what is pinned, counted by the runtimes themselves in
 * PATH.count ([pinned bytes now, the most ever], shared by every runtime and process that names
 * the same PATH; made zeroed if missing, never truncated). MemTotal is EMU_MEMINFO_TOTAL_KB
 * (default: the base). After every change the file is rewritten in place, whole, at offset 0,
 * with lines of fixed width, so it keeps its size and a reader never sees it cut short; a
 * writer that finds the count moved meanwhile writes again, so the last write is the latest
 * count. Pinned bytes are counted before the pages are locked and uncounted after they are
 * unlocked, as outstanding_bytes are: the file never shows more available than is. */
static pthread_once_t meminfo_once = PTHREAD_ONCE_INIT;
static int meminfo_fd = -1;
static int64_t *meminfo_count;
static long long meminfo_base_kb, meminfo_total_kb;

static void meminfo_setup(void) {
    const char *path = getenv("EMU_MEMINFO");
    if (!path || !*path) return;
    const char *b = getenv("EMU_MEMINFO_BASE_KB"), *t = getenv("EMU_MEMINFO_TOTAL_KB");
    meminfo_base_kb = b ? atoll(b) : 0;
    meminfo_total_kb = t ? atoll(t) : meminfo_base_kb;
    char count[4096];
    int n = snprintf(count, sizeof count, "%s.count", path);
    int cfd = n > 0 && (size_t)n < sizeof count ? open(count, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
    int64_t *m = MAP_FAILED;
    /* Growing a file to its own size changes nothing: a second process cannot zero the first's count. */
    if (cfd >= 0 && ftruncate(cfd, 2 * sizeof(int64_t)) == 0)
        m = mmap(NULL, 2 * sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0);
    if (cfd >= 0) close(cfd);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (m == MAP_FAILED || fd < 0) {
        fprintf(stderr, "emul(%s): EMU_MEMINFO %s: cannot set up the stand-in meminfo\n", EMU_NAME, path);
        if (fd >= 0) close(fd);
        return;
    }
    meminfo_count = m;
    meminfo_fd = fd;
}

static void meminfo_write(int64_t pinned) {
    long long used_kb = (pinned + 1023) / 1024;
    long long avail = meminfo_base_kb - used_kb;
    if (avail < 0) avail = 0;
    char text[128];
    int n = snprintf(text, sizeof text, "MemTotal:       %12lld kB\nMemFree:        %12lld kB\nMemAvailable:   %12lld kB\n",
                     meminfo_total_kb, avail, avail);
    if (n > 0 && pwrite(meminfo_fd, text, (size_t)n, 0) != n)
        fprintf(stderr, "emul(%s): EMU_MEMINFO: short write\n", EMU_NAME);
}

/* EMU_MEMINFO_STICKY=1: releases give the host nothing back (pages unlocked but still resident,
 * as after munlock), so MemAvailable only falls and PATH.count holds what was ever taken. */
static int meminfo_sticky = -1;

static void meminfo_moved(int64_t bytes) {
    pthread_once(&meminfo_once, meminfo_setup);
    if (!meminfo_count) return;
    if (meminfo_sticky < 0) meminfo_sticky = getenv("EMU_MEMINFO_STICKY") != NULL;
    if (bytes < 0 && meminfo_sticky) return;
    int64_t now = __atomic_add_fetch(&meminfo_count[0], bytes, __ATOMIC_SEQ_CST);
    int64_t max = __atomic_load_n(&meminfo_count[1], __ATOMIC_SEQ_CST);
    while (now > max && !__atomic_compare_exchange_n(&meminfo_count[1], &max, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    for (;;) {
        int64_t v = __atomic_load_n(&meminfo_count[0], __ATOMIC_SEQ_CST);
        meminfo_write(v);
        if (__atomic_load_n(&meminfo_count[0], __ATOMIC_SEQ_CST) == v) break;
    }
}

static void bump_outstanding(int64_t bytes, int64_t count) {
    if (emu_combined_add) emu_combined_add(bytes);
    meminfo_moved(bytes);
    int64_t now = __atomic_add_fetch(&st()->outstanding_bytes, bytes, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&st()->outstanding_count, count, __ATOMIC_SEQ_CST);
    int64_t max = __atomic_load_n(&st()->max_outstanding_bytes, __ATOMIC_SEQ_CST);
    while (now > max && !__atomic_compare_exchange_n(&st()->max_outstanding_bytes, &max, now, 0,
                                                      __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
}

static void count_failed(void) { __atomic_add_fetch(&st()->failed_calls, 1, __ATOMIC_SEQ_CST); }

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* EMU_FAIL_EVERY=N makes every Nth pinning call fail as if the driver were out of memory;
 * EMU_FAIL_RATE=F (0 to 1) fails that fraction of them, pseudo-randomly. */
static int inject_failure(void) {
    if (fail_rate < 0) {
        const char *r = getenv("EMU_FAIL_RATE");
        double v = r ? atof(r) : 0;
        fail_rate = v > 0 ? v : 0;
    }
    if (fail_rate > 0) {
        uint64_t n = __atomic_add_fetch(&rate_no, 1, __ATOMIC_SEQ_CST);
        if ((double)(splitmix(n) >> 11) / (double)(1ull << 53) < fail_rate) {
            __atomic_add_fetch(&st()->injected_failures, 1, __ATOMIC_SEQ_CST);
            return 1;
        }
    }
    if (fail_every < 0) {
        const char *e = getenv("EMU_FAIL_EVERY");
        long v = e ? atol(e) : 0;
        __atomic_store_n(&fail_every, v > 0 ? v : 0, __ATOMIC_SEQ_CST);
    }
    if (fail_every == 0) return 0;
    long n = __atomic_add_fetch(&call_no, 1, __ATOMIC_SEQ_CST);
    if (n % fail_every == 0) {
        __atomic_add_fetch(&st()->injected_failures, 1, __ATOMIC_SEQ_CST);
        return 1;
    }
    return 0;
}

/* Registered ranges may overlap anything; a linear check keeps the emulation obviously right. */
static int table_overlaps(uintptr_t a, size_t size) {
    int hit = 0;
    pthread_mutex_lock(&table_lock);
    for (size_t b = 0; b < BUCKETS && !hit; b++)
        for (struct entry *e = table[b]; e; e = e->next)
            if (!e->owned && a < e->addr + e->size && e->addr < a + size) { hit = 1; break; }
    pthread_mutex_unlock(&table_lock);
    return hit;
}

/* Whether a lies in memory this runtime pinned (allocated or registered). */
static int table_contains(uintptr_t a) {
    int hit = 0;
    pthread_mutex_lock(&table_lock);
    for (size_t b = 0; b < BUCKETS && !hit; b++)
        for (struct entry *e = table[b]; e; e = e->next)
            if (e->addr <= a && a < e->addr + e->size) { hit = 1; break; }
    pthread_mutex_unlock(&table_lock);
    return hit;
}

/* The size of the allocation this runtime made at exactly a (0: none). */
static size_t owned_at(uintptr_t a) {
    size_t size = 0;
    pthread_mutex_lock(&table_lock);
    for (struct entry *e = table[bucket(a)]; e; e = e->next)
        if (e->addr == a && e->owned) { size = e->size; break; }
    pthread_mutex_unlock(&table_lock);
    return size;
}

static void table_insert(uintptr_t a, size_t size, size_t counted, int owned) {
    struct entry *e = malloc(sizeof *e);
    e->addr = a; e->size = size; e->counted = counted; e->owned = owned; e->prelocked = 0;
    pthread_mutex_lock(&table_lock);
    e->next = table[bucket(a)];
    table[bucket(a)] = e;
    pthread_mutex_unlock(&table_lock);
}

/* Marks the registration at a as one over pages the program had locked itself. */
static void table_mark_prelocked(uintptr_t a) {
    pthread_mutex_lock(&table_lock);
    for (struct entry *e = table[bucket(a)]; e; e = e->next)
        if (e->addr == a && !e->owned) { e->prelocked = 1; break; }
    pthread_mutex_unlock(&table_lock);
}

static __thread int last_prelocked;

/* Removes the entry for a if its kind matches; returns 1, its size and what it counted. */
static int table_remove(uintptr_t a, int owned, size_t *size, size_t *counted) {
    int found = 0;
    pthread_mutex_lock(&table_lock);
    for (struct entry **pp = &table[bucket(a)]; *pp; pp = &(*pp)->next) {
        struct entry *e = *pp;
        if (e->addr == a && e->owned == owned) {
            *size = e->size; *counted = e->counted; last_prelocked = e->prelocked;
            *pp = e->next; free(e); found = 1; break;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return found;
}

/* Pins size bytes for real. 0 on success. */
/* Counted before the pages are locked and uncounted after they are unlocked, so the runtime's
 * figures never under-state what it holds, even for an instant. */
static int no_pin = -1;

/* EMU_DRIVER_IO=1: every pinning call and every free first reads a driver file, as the real runtime does on its
 * lazy first use (device nodes, /proc/driver files): that read is a cancellation point, so a
 * thread with a pending pthread_cancel is cancelled inside the runtime's call. */
static int driver_io = -1;
static void maybe_driver_io(void) {
    if (driver_io < 0) driver_io = getenv("EMU_DRIVER_IO") != NULL;
    if (!driver_io) return;
    char buf[64];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, buf, sizeof buf) < 0) buf[0] = 0;
        close(fd);
    }
}

/* EMU_SLOW_MS=N: an allocation that pinned its memory holds it N ms before it returns (a runtime
 * busy with the device), first creating the file EMU_SLOW_MARK names if set, so that a test knows
 * the call is inside the runtime with its pages charged (and can kill the process there). */
static void maybe_slow(void) {
    const char *ms = getenv("EMU_SLOW_MS");
    long n = ms ? atol(ms) : 0;
    if (n <= 0) return;
    const char *mark = getenv("EMU_SLOW_MARK");
    if (mark && *mark) {
        int fd = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) close(fd);
    }
    struct timespec ts = {n / 1000, (n % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int emu_pin_alloc(size_t size, void **out) {
    maybe_driver_io();
    if (inject_failure()) return -1;
    if (no_pin < 0) no_pin = getenv("EMU_NO_PIN") != NULL;
    if (no_pin) {
        /* For benchmarks of pinguard's own cost: plain malloc, no table, no locking, no shared
         * counter (so that the runtime itself scales across threads). */
        *out = malloc(size);
        return *out ? 0 : -1;
    }
    size_t len = (size + 4095) & ~(size_t)4095;
    if (len < size) return -1;
    bump_outstanding((int64_t)size, 1);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { bump_outstanding(-(int64_t)size, -1); return -1; }
    if (mlock(p, len) != 0) { munmap(p, len); bump_outstanding(-(int64_t)size, -1); return -1; }
    table_insert((uintptr_t)p, size, size, 1);
    __atomic_add_fetch(&st()->alloc_calls, 1, __ATOMIC_SEQ_CST);
    maybe_slow();
    *out = p;
    return 0;
}

/* 0 freed, 1 unknown pointer. */
static int emu_pin_free(void *p) {
    size_t size, counted;
    maybe_driver_io();
    if (no_pin == 1) {
        free(p);
        return 0;
    }
    if (!table_remove((uintptr_t)p, 1, &size, &counted)) return 1;
    size_t len = (size + 4095) & ~(size_t)4095;
    munlock(p, len);
    munmap(p, len);
    bump_outstanding(-(int64_t)size, -1);
    __atomic_add_fetch(&st()->release_calls, 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* 0 registered, 1 already registered, -1 could not pin. A runtime that maps its own pinned
 * memory for the device (over_pinned: ACL, for torch_npu's pinned_mem_register) accepts a
 * registration starting at one of its allocations and pins only the bytes past it; CUDA answers
 * "already registered" for any memory it pinned. */
static int emu_register(void *p, size_t size, int over_pinned) {
    if (table_overlaps((uintptr_t)p, size)) return 1;
    size_t covered = owned_at((uintptr_t)p);
    if (covered && !over_pinned) return 1;
    if (!over_pinned && table_contains((uintptr_t)p)) return 1;
    if (covered > size) covered = size;
    if (inject_failure()) return -1;
    size_t counted = size - covered;
    uintptr_t start = ((uintptr_t)p + covered) & ~(uintptr_t)4095;
    uintptr_t end = ((uintptr_t)p + size + 4095) & ~(uintptr_t)4095;
    bump_outstanding((int64_t)counted, 1);
    /* A driver pins pages apart from the program's own mlock (pin_user_pages), so that its
     * release never unlocks them: pages the program locked already stay locked (msync says
     * EBUSY over a locked mapping and does nothing else). */
    int prelocked = end > start && msync((void *)start, end - start, MS_INVALIDATE) != 0 && errno == EBUSY;
    if (end < start || (counted && mlock((void *)start, end - start) != 0)) { bump_outstanding(-(int64_t)counted, -1); return -1; }
    table_insert((uintptr_t)p, size, counted, 0);
    if (prelocked) table_mark_prelocked((uintptr_t)p);
    __atomic_add_fetch(&st()->alloc_calls, 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* 0 unregistered, 1 not registered. The pages stay locked if another registration shares them,
 * which the emulation does not model: tests register page-aligned, disjoint buffers. */
static int emu_unregister(void *p) {
    size_t size, counted;
    if (!table_remove((uintptr_t)p, 0, &size, &counted)) return 1;
    /* Only what it pinned itself: the allocation it was registered over keeps its lock. */
    uintptr_t start = ((uintptr_t)p + (size - counted)) & ~(uintptr_t)4095;
    uintptr_t end = ((uintptr_t)p + size + 4095) & ~(uintptr_t)4095;
    if (counted && !last_prelocked) munlock((void *)start, end - start);
    bump_outstanding(-(int64_t)counted, -1);
    __atomic_add_fetch(&st()->release_calls, 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* Device memory and I/O-memory registrations: entries of their own kinds, never pinned. */
#define DEVICE_ENTRY 2
#define IO_ENTRY 3
static struct emu_device_stats device_stats;

/* EMU_INTEGRATED=1: every device is integrated (DGX Spark, Jetson, an APU): its memory is the
 * host's, so a device allocation takes host pages and EMU_MEMINFO's MemAvailable falls with it.
 * Else the device is discrete and its memory no host figure sees. EMU_DEVICES=N devices (1);
 * EMU_INTEGRATED=MASK (a number above 1) makes device d integrated when bit d is set. */
__attribute__((unused)) static int emu_device_count(void) {
    const char *n = getenv("EMU_DEVICES");
    return n ? atoi(n) : 1;
}
static int integrated_at(int device) {
    const char *v = getenv("EMU_INTEGRATED");
    long m = v ? atol(v) : 0;
    return m == 1 ? 1 : (m > 1 && device >= 0 && device < 62 && (m >> device) & 1);
}
/* The runtime's answer to a program's question (counted). */
__attribute__((unused)) static int emu_integrated(int device) {
    __atomic_add_fetch(&device_stats.integrated_queries, 1, __ATOMIC_SEQ_CST);
    return integrated_at(device);
}
/* The calling thread's current device (cudaSetDevice). */
static __thread int current_device;
__attribute__((unused)) static int emu_current_device(void) { return current_device; }
__attribute__((unused)) static int emu_set_device(int d) {
    if (d < 0 || d >= emu_device_count()) return 1;
    current_device = d;
    return 0;
}

/* 0 allocated, -1 out of memory. Integrated: host pages, touched (the memory is used). */
__attribute__((unused)) static int emu_device_alloc(size_t size, void **out) {
    if (inject_failure()) return -1;
    size_t len = (size + 4095) & ~(size_t)4095;
    if (len < size) return -1;
    int host = integrated_at(current_device);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (host ? MAP_POPULATE : MAP_NORESERVE), -1, 0);
    if (p == MAP_FAILED) return -1;
    if (host) meminfo_moved((int64_t)size);
    table_insert((uintptr_t)p, size, host ? size : 0, DEVICE_ENTRY);
    __atomic_add_fetch(&device_stats.outstanding_bytes, (int64_t)size, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&device_stats.allocs, 1, __ATOMIC_SEQ_CST);
    *out = p;
    return 0;
}

/* 0 freed, 1 not device memory of this runtime. */
__attribute__((unused)) static int emu_device_free(void *p) {
    size_t size, counted;
    if (!table_remove((uintptr_t)p, DEVICE_ENTRY, &size, &counted)) return 1;
    munmap(p, (size + 4095) & ~(size_t)4095);
    if (counted) meminfo_moved(-(int64_t)counted);
    __atomic_sub_fetch(&device_stats.outstanding_bytes, (int64_t)size, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&device_stats.frees, 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* A registration of I/O memory (cudaHostRegisterIoMemory): the runtime maps the range for the
 * device and pins nothing. 0 registered, 1 already registered. */
__attribute__((unused)) static int emu_register_io(void *p, size_t size) {
    if (table_overlaps((uintptr_t)p, size) || table_contains((uintptr_t)p)) return 1;
    table_insert((uintptr_t)p, size, 0, IO_ENTRY);
    __atomic_add_fetch(&device_stats.io_registrations, 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* emu_unregister for either kind of registration. */
__attribute__((unused)) static int emu_unregister_any(void *p) {
    size_t size, counted;
    if (table_remove((uintptr_t)p, IO_ENTRY, &size, &counted)) {
        __atomic_sub_fetch(&device_stats.io_registrations, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    return emu_unregister(p);
}

__attribute__((unused)) static void emu_read_device_stats(struct emu_device_stats *out) {
    out->outstanding_bytes = __atomic_load_n(&device_stats.outstanding_bytes, __ATOMIC_SEQ_CST);
    out->allocs = __atomic_load_n(&device_stats.allocs, __ATOMIC_SEQ_CST);
    out->frees = __atomic_load_n(&device_stats.frees, __ATOMIC_SEQ_CST);
    out->integrated_queries = __atomic_load_n(&device_stats.integrated_queries, __ATOMIC_SEQ_CST);
    out->io_registrations = __atomic_load_n(&device_stats.io_registrations, __ATOMIC_SEQ_CST);
}

static void emu_read_stats(struct emu_stats *out) {
    out->outstanding_bytes = __atomic_load_n(&st()->outstanding_bytes, __ATOMIC_SEQ_CST);
    out->max_outstanding_bytes = __atomic_load_n(&st()->max_outstanding_bytes, __ATOMIC_SEQ_CST);
    out->outstanding_count = __atomic_load_n(&st()->outstanding_count, __ATOMIC_SEQ_CST);
    out->alloc_calls = __atomic_load_n(&st()->alloc_calls, __ATOMIC_SEQ_CST);
    out->release_calls = __atomic_load_n(&st()->release_calls, __ATOMIC_SEQ_CST);
    out->failed_calls = __atomic_load_n(&st()->failed_calls, __ATOMIC_SEQ_CST);
    out->injected_failures = __atomic_load_n(&st()->injected_failures, __ATOMIC_SEQ_CST);
}

/* Physical allocations of the virtual-memory APIs (cuMemCreate, aclrtMallocPhysical): real memory
 * (a memfd), locked through a mapping of its own when it is host memory, mapped where the program
 * reserved address space, and freed only when the last reference is released and the last
 * mapping unmapped, in either order, as the real runtimes do. Only host memory is counted: device
 * memory is not pinned host memory. A handle is the address of its record. */
struct phys {
    size_t size, len;
    int host, refs, maps, fd;
    void *pin;
    struct phys *next;
};
struct vmap {
    uintptr_t addr;
    size_t len;
    struct phys *ph;
    struct vmap *next;
};
static struct phys *physs;
static struct vmap *vmaps;

static struct phys *phys_find(uint64_t h) {
    for (struct phys *p = physs; p; p = p->next)
        if ((uint64_t)(uintptr_t)p == h) return p;
    return NULL;
}

/* Frees ph if nothing holds it any more. Under table_lock. */
static void phys_maybe_free(struct phys *ph) {
    if (ph->refs > 0 || ph->maps > 0) return;
    for (struct phys **pp = &physs; *pp; pp = &(*pp)->next)
        if (*pp == ph) { *pp = ph->next; break; }
    if (ph->host) {
        munlock(ph->pin, ph->len);
        munmap(ph->pin, ph->len);
        bump_outstanding(-(int64_t)ph->size, -1);
        __atomic_add_fetch(&st()->release_calls, 1, __ATOMIC_SEQ_CST);
    }
    close(ph->fd);
    free(ph);
}

/* 0 made, -1 out of memory. */
__attribute__((unused)) static int phys_create(size_t size, int host, uint64_t *handle) {
    maybe_driver_io();
    if (inject_failure()) return -1;
    size_t len = (size + 4095) & ~(size_t)4095;
    if (len < size) return -1;
    struct phys *ph = calloc(1, sizeof *ph);
    if (!ph) return -1;
    ph->size = size; ph->len = len; ph->host = host; ph->refs = 1; ph->pin = MAP_FAILED;
    ph->fd = memfd_create("emu-physical", MFD_CLOEXEC);
    if (ph->fd < 0 || ftruncate(ph->fd, (off_t)len) != 0) goto fail;
    if (host) {
        bump_outstanding((int64_t)size, 1);
        ph->pin = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, ph->fd, 0);
        if (ph->pin == MAP_FAILED || mlock(ph->pin, len) != 0) {
            if (ph->pin != MAP_FAILED) munmap(ph->pin, len);
            bump_outstanding(-(int64_t)size, -1);
            goto fail;
        }
        __atomic_add_fetch(&st()->alloc_calls, 1, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_lock(&table_lock);
    ph->next = physs;
    physs = ph;
    pthread_mutex_unlock(&table_lock);
    *handle = (uint64_t)(uintptr_t)ph;
    return 0;
fail:
    if (ph->fd >= 0) close(ph->fd);
    free(ph);
    return -1;
}

/* 0 released, 1 unknown handle. */
__attribute__((unused)) static int phys_release(uint64_t h) {
    pthread_mutex_lock(&table_lock);
    struct phys *ph = phys_find(h);
    if (ph) { ph->refs--; phys_maybe_free(ph); }
    pthread_mutex_unlock(&table_lock);
    return ph ? 0 : 1;
}

/* 0 mapped, 1 unknown handle or bad range, -1 the mapping failed. */
__attribute__((unused)) static int phys_map(uintptr_t va, size_t len, size_t offset, uint64_t h) {
    pthread_mutex_lock(&table_lock);
    struct phys *ph = phys_find(h);
    int rc = 1;
    if (ph && va && len && !(va & 4095) && !(len & 4095) && offset <= ph->len && len <= ph->len - offset) {
        rc = -1;
        struct vmap *m = malloc(sizeof *m);
        if (m && mmap((void *)va, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, ph->fd, (off_t)offset) != MAP_FAILED) {
            m->addr = va; m->len = len; m->ph = ph; m->next = vmaps; vmaps = m;
            ph->maps++;
            rc = 0;
        } else {
            free(m);
        }
    }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

/* Unmaps every mapping that starts in [va, va + len) (len 0: the one at va), leaving the address
 * space reserved. 0 unmapped, 1 nothing mapped there. */
__attribute__((unused)) static int phys_unmap(uintptr_t va, size_t len) {
    int found = 0;
    uintptr_t end = va + (len ? len : 1);
    pthread_mutex_lock(&table_lock);
    for (struct vmap **pp = &vmaps; *pp;) {
        struct vmap *m = *pp;
        if (m->addr >= va && m->addr < end) {
            mmap((void *)m->addr, m->len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
            *pp = m->next;
            m->ph->maps--;
            phys_maybe_free(m->ph);
            free(m);
            found = 1;
        } else {
            pp = &m->next;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return found ? 0 : 1;
}

/* One more reference to the allocation mapped at va. 0 retained, 1 nothing mapped there. */
__attribute__((unused)) static int phys_retain(uintptr_t va, uint64_t *h) {
    int rc = 1;
    pthread_mutex_lock(&table_lock);
    for (struct vmap *m = vmaps; m; m = m->next)
        if (m->addr <= va && va < m->addr + m->len) {
            m->ph->refs++;
            *h = (uint64_t)(uintptr_t)m->ph;
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

/* Address space for mappings: reserved, nothing behind it. */
__attribute__((unused)) static void *vm_reserve(size_t len) {
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Stream-ordered memory pools (cuMemPoolCreate, cudaMemPoolCreate): a pool reserves memory in
 * chunks of POOL_GRAIN (one chunk per larger allocation), hands allocations out of them, and
 * keeps freed memory reserved until trimmed or destroyed (the emulation has no streams: frees
 * take effect at once and nothing is released at a synchronization). A host pool's chunks are
 * pinned, and its reserved memory is what the runtime counts as pinned. A destroyed pool takes no
 * more allocations and goes once its last allocation is freed. */
#define POOL_GRAIN ((size_t)2 << 20)
struct chunk {
    char *base;
    size_t len, bump;
    int live;
    struct chunk *next;
};
struct pool {
    int host, destroyed;
    size_t reserved, used;
    struct chunk *chunks;
    struct pool *next;
};
struct palloc {
    uintptr_t addr;
    size_t size;
    struct pool *pool;
    struct chunk *chunk;
    struct palloc *next;
};
static struct pool *pools;
static struct palloc *pallocs;

static struct pool *pool_find(uint64_t h) {
    for (struct pool *p = pools; p; p = p->next)
        if ((uint64_t)(uintptr_t)p == h) return p;
    return NULL;
}

__attribute__((unused)) static int pool_create(int host, uint64_t *out) {
    struct pool *p = calloc(1, sizeof *p);
    if (!p) return -1;
    p->host = host;
    pthread_mutex_lock(&table_lock);
    p->next = pools;
    pools = p;
    pthread_mutex_unlock(&table_lock);
    *out = (uint64_t)(uintptr_t)p;
    return 0;
}

/* Releases the pool's empty chunks while it reserves more than keep; frees a destroyed pool
 * that holds nothing. Under table_lock. */
static void pool_shrink(struct pool *p, size_t keep) {
    for (struct chunk **cc = &p->chunks; *cc;) {
        struct chunk *c = *cc;
        if (c->live == 0 && p->reserved > keep) {
            *cc = c->next;
            if (p->host) {
                munlock(c->base, c->len);
                bump_outstanding(-(int64_t)c->len, -1);
            }
            munmap(c->base, c->len);
            p->reserved -= c->len;
            free(c);
        } else {
            cc = &c->next;
        }
    }
    if (p->destroyed && !p->chunks) {
        for (struct pool **pp = &pools; *pp; pp = &(*pp)->next)
            if (*pp == p) { *pp = p->next; break; }
        free(p);
    }
}

/* 0 allocated, 1 no such pool, -1 out of memory. */
__attribute__((unused)) static int pool_alloc(uint64_t h, size_t size, void **out) {
    maybe_driver_io();
    size_t need = (size + 255) & ~(size_t)255;
    if (need < size) return -1;
    pthread_mutex_lock(&table_lock);
    struct pool *p = pool_find(h);
    int rc = 1;
    if (!p || p->destroyed || size == 0) goto out;
    rc = -1;
    if (inject_failure()) goto out;
    struct chunk *c = p->chunks;
    while (c && c->len - c->bump < need) c = c->next;
    if (!c) {
        size_t len = need <= POOL_GRAIN ? POOL_GRAIN : (need + POOL_GRAIN - 1) & ~(POOL_GRAIN - 1);
        c = calloc(1, sizeof *c);
        if (!c) goto out;
        c->len = len;
        c->base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (c->base == MAP_FAILED) { free(c); goto out; }
        if (p->host) {
            bump_outstanding((int64_t)len, 1);
            if (mlock(c->base, len) != 0) { munmap(c->base, len); bump_outstanding(-(int64_t)len, -1); free(c); goto out; }
        }
        c->next = p->chunks;
        p->chunks = c;
        p->reserved += len;
    }
    struct palloc *a = malloc(sizeof *a);
    if (!a) goto out;
    a->addr = (uintptr_t)c->base + c->bump; a->size = need; a->pool = p; a->chunk = c;
    a->next = pallocs; pallocs = a;
    c->bump += need; c->live++; p->used += need;
    if (p->host) __atomic_add_fetch(&st()->alloc_calls, 1, __ATOMIC_SEQ_CST);
    *out = (void *)a->addr;
    rc = 0;
out:
    pthread_mutex_unlock(&table_lock);
    return rc;
}

/* 0 freed, 1 not an allocation from a pool. */
__attribute__((unused)) static int pool_free(uintptr_t addr) {
    int rc = 1;
    pthread_mutex_lock(&table_lock);
    for (struct palloc **pp = &pallocs; *pp; pp = &(*pp)->next) {
        struct palloc *a = *pp;
        if (a->addr != addr) continue;
        *pp = a->next;
        struct pool *p = a->pool;
        p->used -= a->size;
        if (--a->chunk->live == 0) a->chunk->bump = 0;
        if (p->host) __atomic_add_fetch(&st()->release_calls, 1, __ATOMIC_SEQ_CST);
        free(a);
        if (p->destroyed) pool_shrink(p, 0);
        rc = 0;
        break;
    }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

/* 0 trimmed (or destroyed), 1 no such pool. */
__attribute__((unused)) static int pool_trim(uint64_t h, size_t keep, int destroy) {
    pthread_mutex_lock(&table_lock);
    struct pool *p = pool_find(h);
    if (p && !p->destroyed) {
        if (destroy) p->destroyed = 1;
        pool_shrink(p, destroy ? 0 : keep);
    }
    pthread_mutex_unlock(&table_lock);
    return p ? 0 : 1;
}

/* CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT (5) and USED_MEM_CURRENT (7); 0 read, 1 not readable. */
__attribute__((unused)) static int pool_attr(uint64_t h, int attr, uint64_t *v) {
    int rc = 1;
    pthread_mutex_lock(&table_lock);
    struct pool *p = pool_find(h);
    if (p && !p->destroyed && (attr == 5 || attr == 7)) {
        *v = attr == 5 ? p->reserved : p->used;
        rc = 0;
    }
    pthread_mutex_unlock(&table_lock);
    return rc;
}

/* CUDA 13's per-location pools: each location type (1 device, 2 host, 3 host NUMA, 4 host NUMA
 * current) has a default pool, made at its first use, and a current pool, the default until one
 * is set. 0 answered, 1 a bad location or type. */
static uint64_t default_pools[5], current_pools[5];
__attribute__((unused)) static int pool_of_location(const int *location, int type, int current, uint64_t *out) {
    if (!location || type != 1 || location[0] < 1 || location[0] > 4) return 1;
    int t = location[0];
    if (!default_pools[t] && pool_create(t != 1, &default_pools[t]) != 0) return 1;
    *out = current && current_pools[t] ? current_pools[t] : default_pools[t];
    return 0;
}
__attribute__((unused)) static int set_pool_of_location(const int *location, int type, uint64_t pool) {
    if (!location || type != 1 || location[0] < 1 || location[0] > 4) return 1;
    current_pools[location[0]] = pool;
    return 0;
}
