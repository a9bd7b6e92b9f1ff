/* Runs a list of pinning operations given as arguments and prints what each returned, then the
 * emulated runtimes' own counters and pinguard's live bytes, for the integration tests.
 *
 *   op:arg[:arg]   one operation; results go to numbered slots (printed as "slot=N")
 *   cuda_alloc:SIZE[:FLAGS]  cuda_malloc:SIZE  cuda_register:SIZE[:FLAGS]
 *   cuda_free:SLOT  cuda_unregister:SLOT  cuda_free_raw:ADDR(hex, never allocated)
 *   acl_malloc:SIZE  acl_malloc_cfg:SIZE  acl_register:SIZE  acl_register2:SIZE:FLAG
 *   acl_free:SLOT  acl_unregister:SLOT  acl_register2_slot:SLOT:FLAG  acl_register_slot:SLOT
 *   (cuda_register_slot, acl_register*_slot: register a slot's memory again, pinned or not)
 *   mlock:OFF:LEN  mlock2:OFF:LEN  munlock:OFF:LEN  munmap:OFF:LEN   (pages of a 256-page arena)
 *   mmap_locked:SIZE  munmap_slot:SLOT  mlockall:FLAGS  munlockall
 *   vmlck  (prints VmLck bytes)   report:PATH   errno_check
 *   sleep_ms:N   clobber:VAR  (overwrites the file named by environment variable VAR with garbage)
 *   wait_stdin:0  (prints "waiting", then waits for a line on stdin, or its end)
 *   reexec:0  (execs this program again with the operations after this one: a new image, same pid)
 *   dlopen:PATH  (loads PATH with RTLD_LOCAL, as ctypes.CDLL does, and prints the threads and the
 *                 SIGUSR2 handler before and after, and pinguard_live_bytes through its handle)
 */
#define _GNU_SOURCE
#include "../emul/emul.h"
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaMallocHost(void **, size_t);
int cudaHostRegister(void *, size_t, unsigned);
int cudaFreeHost(void *);
int cudaHostUnregister(void *);
int aclrtMallocHost(void **, size_t);
int aclrtMallocHostWithCfg(void **, uint64_t, void *);
int aclrtHostRegister(void *, uint64_t, int, void **);
int aclrtHostRegisterV2(void *, uint64_t, uint32_t);
int aclrtFreeHost(void *);
int aclrtHostUnregister(void *);
void emu_cuda_stats(struct emu_stats *);
void emu_acl_stats(struct emu_stats *);

#define ARENA_PAGES 256
static char *arena;
static void *slots[1024];
static size_t slot_size[1024];
static int nslots;

static long vmlck(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

static void *page_buffer(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static long threads(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long n = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %ld", &n) == 1) break;
    if (f) fclose(f);
    return n;
}

static void *usr2_handler(void) {
    struct sigaction sa;
    return sigaction(SIGUSR2, NULL, &sa) ? NULL : (void *)sa.sa_handler;
}

static int put(void *p, size_t size) {
    /* Whatever came back must be usable memory, pinned or downgraded. */
    if (p && size) { ((volatile char *)p)[0] = 1; ((volatile char *)p)[size - 1] = 1; }
    slots[nslots] = p;
    slot_size[nslots] = size;
    return nslots++;
}

static void print_stats(const char *name, void (*fn)(struct emu_stats *)) {
    struct emu_stats s;
    fn(&s);
    printf("\"%s\":{\"outstanding_bytes\":%ld,\"max_outstanding_bytes\":%ld,\"outstanding_count\":%ld,"
           "\"alloc_calls\":%ld,\"release_calls\":%ld,\"failed_calls\":%ld,\"injected_failures\":%ld}",
           name, (long)s.outstanding_bytes, (long)s.max_outstanding_bytes, (long)s.outstanding_count,
           (long)s.alloc_calls, (long)s.release_calls, (long)s.failed_calls, (long)s.injected_failures);
}

int main(int argc, char **argv) {
    long page = sysconf(_SC_PAGESIZE);
    arena = mmap(NULL, ARENA_PAGES * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    long vmlck0 = vmlck();
    long times = 1;
    for (int i = 1; i < argc; i++) {
        char op[64] = {0};
        char a[1024] = {0}, b[64] = {0};
        sscanf(argv[i], "%63[^:]:%1023[^:]:%63s", op, a, b);
        unsigned long x = strtoul(a, NULL, 0), y = strtoul(b, NULL, 0);
        void *p = NULL;
        int rc = 0, slot = -1;
        errno = 0;
        if (!strcmp(op, "cuda_alloc")) {
            rc = cudaHostAlloc(&p, x, (unsigned)y);
            if (!rc) slot = put(p, x);
        } else if (!strcmp(op, "cuda_malloc")) {
            rc = cudaMallocHost(&p, x);
            if (!rc) slot = put(p, x);
        } else if (!strcmp(op, "cuda_register")) {
            p = page_buffer(x);
            rc = cudaHostRegister(p, x, (unsigned)y);
            slot = put(p, x);
        } else if (!strcmp(op, "cuda_register_slot")) {
            rc = cudaHostRegister(slots[x], slot_size[x], (unsigned)y);
        } else if (!strcmp(op, "cuda_alloc_null")) {
            rc = cudaHostAlloc(NULL, x, (unsigned)y);
        } else if (!strcmp(op, "acl_malloc_null")) {
            rc = aclrtMallocHost(NULL, x);
        } else if (!strcmp(op, "acl_register_badtype")) {
            void *dev = NULL;
            p = page_buffer(x);
            rc = aclrtHostRegister(p, x, 7, &dev);
            slot = put(p, x);
        } else if (!strcmp(op, "cuda_free")) {
            rc = cudaFreeHost(slots[x]);
        } else if (!strcmp(op, "cuda_unregister")) {
            rc = cudaHostUnregister(slots[x]);
        } else if (!strcmp(op, "cuda_free_raw")) {
            rc = cudaFreeHost((void *)x);
        } else if (!strcmp(op, "acl_malloc")) {
            rc = aclrtMallocHost(&p, x);
            if (!rc) slot = put(p, x);
        } else if (!strcmp(op, "acl_malloc_cfg")) {
            rc = aclrtMallocHostWithCfg(&p, x, NULL);
            if (!rc) slot = put(p, x);
        } else if (!strcmp(op, "acl_register")) {
            void *dev = NULL;
            p = page_buffer(x);
            rc = aclrtHostRegister(p, x, 0, &dev);
            slot = put(p, x);
        } else if (!strcmp(op, "acl_register2")) {
            p = page_buffer(x);
            rc = aclrtHostRegisterV2(p, x, (uint32_t)y);
            slot = put(p, x);
        } else if (!strcmp(op, "acl_register2_slot")) {
            /* torch_npu's pinned_mem_register: the block it allocated, registered to be mapped. */
            rc = aclrtHostRegisterV2(slots[x], slot_size[x], (uint32_t)y);
        } else if (!strcmp(op, "acl_register_slot")) {
            void *dev = NULL;
            rc = aclrtHostRegister(slots[x], slot_size[x], 0, &dev);
        } else if (!strcmp(op, "acl_free")) {
            rc = aclrtFreeHost(slots[x]);
        } else if (!strcmp(op, "acl_unregister")) {
            rc = aclrtHostUnregister(slots[x]);
        } else if (!strcmp(op, "times")) {
            times = (long)x; /* the next mlock is called this many times: the last one's answer */
            continue;
        } else if (!strcmp(op, "mlock")) {
            for (long k = 0; k < times; k++) rc = mlock(arena + x * page, y * page);
            times = 1;
        } else if (!strcmp(op, "mlock2")) {
            rc = mlock2(arena + x * page, y * page, 0);
        } else if (!strcmp(op, "munlock")) {
            rc = munlock(arena + x * page, y * page);
        } else if (!strcmp(op, "munmap")) {
            rc = munmap(arena + x * page, y * page);
        } else if (!strcmp(op, "map_raw")) {
            /* pages mapped where no hook sees it, as glibc's own mmap does */
            p = (void *)syscall(SYS_mmap, arena + x * page, y * page, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            rc = p == (void *)(arena + x * page) ? 0 : -1;
            p = NULL;
        } else if (!strcmp(op, "mmap_locked")) {
            p = mmap(NULL, x, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
            rc = p == MAP_FAILED ? -1 : 0;
            if (!rc) slot = put(p, x);
        } else if (!strcmp(op, "munmap_slot")) {
            rc = munmap(slots[x], slot_size[x]);
        } else if (!strcmp(op, "mlockall")) {
            rc = mlockall((int)x);
        } else if (!strcmp(op, "munlockall")) {
            rc = munlockall();
        } else if (!strcmp(op, "vmlck")) {
            uint64_t (*live)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
            printf("vmlck=%ld live=%ld\n", vmlck() - vmlck0, live ? (long)live() : -1L);
            continue;
        } else if (!strcmp(op, "report")) {
            int (*w)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "pinguard_write_report");
            rc = w ? w(a[0] ? a : NULL) : -99;
        } else if (!strcmp(op, "sleep_ms")) {
            struct timespec ts = {(time_t)(x / 1000), (long)(x % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        } else if (!strcmp(op, "wait_stdin")) {
            char line[64];
            printf("waiting\n");
            fflush(stdout);
            rc = fgets(line, sizeof line, stdin) ? 0 : 1;
        } else if (!strcmp(op, "reexec")) {
            fflush(stdout);
            argv[i] = argv[0];
            execv(argv[0], argv + i);
            rc = -1;
        } else if (!strcmp(op, "clobber")) {
            const char *path = getenv(a);
            FILE *f = path ? fopen(path, "w") : NULL;
            rc = f ? (fputs("garbage \x01\x02 not meminfo\n", f) < 0) : -1;
            if (f) fclose(f);
        } else if (!strcmp(op, "dlopen")) {
            long before = threads();
            void *handler = usr2_handler();
            void *h = dlopen(a, RTLD_NOW | RTLD_LOCAL);
            uint64_t (*live)(void) = h ? (uint64_t(*)(void))dlsym(h, "pinguard_live_bytes") : NULL;
            printf("dlopen threads_before=%ld threads_after=%ld handler_changed=%d live=%ld\n", before,
                   threads(), usr2_handler() != handler, live ? (long)live() : -1L);
            rc = h ? 0 : -1;
        } else if (!strcmp(op, "errno_check")) {
            /* errno set before a hooked call that succeeds must survive it */
            errno = 4242;
            rc = cudaHostAlloc(&p, 4096, 0);
            printf("errno_after=%d\n", errno);
            if (!rc) slot = put(p, 4096);
        } else {
            fprintf(stderr, "scenario: unknown op %s\n", op);
            return 2;
        }
        printf("%s rc=%d errno=%d", argv[i], rc, rc ? errno : 0);
        if (slot >= 0) printf(" slot=%d addr=%p", slot, slots[slot]);
        printf("\n");
    }
    uint64_t (*live)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    printf("STATS {");
    print_stats("cuda", emu_cuda_stats);
    printf(",");
    print_stats("acl", emu_acl_stats);
    printf(",\"vmlck\":%ld,\"pinguard_live_bytes\":%ld}\n", vmlck() - vmlck0, live ? (long)live() : -1L);
    fflush(stdout);
    return 0;
}
