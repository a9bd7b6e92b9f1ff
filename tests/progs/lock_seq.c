/* Locked pages changed in every way the kernel allows, with pinguard's view checked after each step.
 *
 *   lock_seq seq SEED STEPS MODE   a seeded random sequence; MODE "hooks" uses only calls pinguard
 *                                  intercepts, "all" adds what it cannot see (free() and realloc()
 *                                  of large malloc blocks, mlockall and munlockall)
 *   lock_seq freeloop N MIN MAX    N times: mlock a fresh malloc block of MIN..MAX bytes, free it
 *
 * After every step it prints "step=I op=NAME rc=R vmlck=BYTES live=BYTES": VmLck from
 * /proc/self/status and pinguard_live_bytes() (-1 without pinguard). A fork child prints its own
 * line ("op=child") before it exits. */
#define _GNU_SOURCE
#define PINGUARD_WEAK
#include "pinguard.h"
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif
#ifndef MCL_ONFAULT
#define MCL_ONFAULT 4
#endif

static uint64_t rng;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

/* VmLck without stdio: a read into a static buffer (no allocation between the call and the read). */
static long vmlck(void) {
    static char buf[8192];
    int fd = open("/proc/self/status", O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = strstr(buf, "VmLck:");
    return p ? strtol(p + 6, NULL, 10) * 1024 : -1;
}

static long live(void) { return pinguard_live_bytes ? (long)pinguard_live_bytes() : -1; }

static long page;

static void report(int step, const char *op, long rc) {
    long l = live();
    long v = vmlck();
    printf("step=%d op=%s rc=%ld vmlck=%ld live=%ld\n", step, op, rc, v, l);
    fflush(stdout);
}

#define SLOTS 8
enum kind { EMPTY, MAPPED, MALLOCED };
static struct slot {
    enum kind kind;
    char *addr;
    size_t len; /* bytes */
} slots[SLOTS];

static struct slot *pick(enum kind k) {
    int start = (int)below(SLOTS);
    for (int i = 0; i < SLOTS; i++) {
        struct slot *s = &slots[(start + i) % SLOTS];
        if (s->kind == k) return s;
    }
    return NULL;
}

/* A page-aligned part of a slot. With `overrun`, sometimes one page past its end, into whatever
 * lies there (often a hole: the kernel applies the call up to it and fails); only for calls that
 * leave a foreign page usable (lock, unlock). */
static void part(struct slot *s, char **a, size_t *len, int overrun) {
    size_t pages = s->len / page;
    size_t first = below(pages);
    size_t n = 1 + below(pages - first);
    if (overrun && below(8) == 0) n++;
    *a = s->addr + first * page;
    *len = n * page;
}

static const char *op_names[] = {
    "map", "map_locked", "mlock", "mlock2_onfault", "munlock", "munmap", "mremap_grow",
    "mremap_shrink", "mremap_move", "madvise", "mprotect", "fork", "malloc_lock", "free",
    "realloc", "mlockall", "munlockall",
};
#define HOOK_OPS 12
#define ALL_OPS 17

static long do_op(int step, int op) {
    struct slot *s;
    char *a;
    size_t len;
    long rc = 0;
    switch (op) {
    case 0: /* map */
    case 1: /* map_locked */
        if (!(s = pick(EMPTY))) return 0;
        s->len = (1 + below(16)) * page;
        s->addr = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (op == 1 ? MAP_LOCKED : 0), -1, 0);
        if (s->addr == MAP_FAILED) return -errno;
        s->kind = MAPPED;
        s->addr[0] = 1;
        return 0;
    case 2: /* mlock */
    case 3: /* mlock2_onfault */
        if (!(s = pick(MAPPED)) && !(s = pick(MALLOCED))) return 0;
        part(s, &a, &len, 1);
        rc = op == 2 ? mlock(a, len) : mlock2(a, len, MLOCK_ONFAULT);
        return rc ? -errno : 0;
    case 4: /* munlock */
        if (!(s = pick(MAPPED)) && !(s = pick(MALLOCED))) return 0;
        part(s, &a, &len, 1);
        return munlock(a, len) ? -errno : 0;
    case 5: /* munmap: a part (leaving holes) or the whole slot */
        if (!(s = pick(MAPPED))) return 0;
        if (below(2)) {
            rc = munmap(s->addr, s->len);
            s->kind = EMPTY;
        } else {
            part(s, &a, &len, 0);
            rc = munmap(a, len);
        }
        return rc ? -errno : 0;
    case 6: /* mremap_grow: in place when the next pages are free, else moved */
    case 7: /* mremap_shrink */
    {
        if (!(s = pick(MAPPED))) return 0;
        size_t n = op == 6 ? s->len + (1 + below(8)) * page : (s->len > (size_t)page ? s->len - (1 + below(s->len / page - 1)) * page : s->len);
        void *p = mremap(s->addr, s->len, n, MREMAP_MAYMOVE);
        if (p == MAP_FAILED) return -errno;
        s->addr = p;
        s->len = n;
        return 0;
    }
    case 8: /* mremap_move: MREMAP_FIXED onto a reservation of our own, sometimes resized */
    {
        if (!(s = pick(MAPPED))) return 0;
        size_t n = s->len + ((long)below(3) - 1) * page;
        if (n == 0) n = page;
        void *to = mmap(NULL, n + 4 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (to == MAP_FAILED) return -errno;
        void *dst = (char *)to + below(4) * page;
        void *p = mremap(s->addr, s->len, n, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
        munmap(to, (char *)dst - (char *)to); /* the reservation's unused ends */
        munmap((char *)dst + n, (char *)to + n + 4 * page - ((char *)dst + n));
        if (p == MAP_FAILED) {
            munmap(dst, n);
            return -errno;
        }
        s->addr = p;
        s->len = n;
        return 0;
    }
    case 9: /* madvise: never changes what is locked (the kernel refuses DONTNEED on locked pages) */
    {
        static const int advice[] = {MADV_DONTFORK, MADV_DOFORK, MADV_WILLNEED, MADV_RANDOM, MADV_NORMAL, MADV_DONTNEED};
        if (!(s = pick(MAPPED))) return 0;
        part(s, &a, &len, 0);
        return madvise(a, len, advice[below(6)]) ? -errno : 0;
    }
    case 10: /* mprotect */
    {
        static const int prot[] = {PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE};
        if (!(s = pick(MAPPED))) return 0;
        part(s, &a, &len, 0);
        return mprotect(a, len, prot[below(3)]) ? -errno : 0;
    }
    case 11: /* fork, part of a slot not inherited: the child has no locked pages at all */
    {
        if ((s = pick(MAPPED))) {
            part(s, &a, &len, 0);
            madvise(a, len, MADV_DONTFORK);
        }
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) return -errno;
        if (pid == 0) {
            report(step, "child", 0);
            _exit(0);
        }
        int st;
        waitpid(pid, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    case 12: /* malloc_lock: a block large enough for glibc to mmap it */
        if (!(s = pick(EMPTY))) return 0;
        s->len = (size_t)(256 + below(1792)) * 1024;
        s->addr = malloc(s->len);
        if (!s->addr) return -ENOMEM;
        s->kind = MALLOCED;
        memset(s->addr, 1, 64);
        return mlock(s->addr, s->len) ? -errno : 0;
    case 13: /* free: glibc unmaps the block itself */
        if (!(s = pick(MALLOCED))) return 0;
        free(s->addr);
        s->kind = EMPTY;
        return 0;
    case 14: /* realloc: glibc moves or resizes the block with its own mremap */
    {
        if (!(s = pick(MALLOCED))) return 0;
        size_t n = (size_t)(256 + below(2048)) * 1024;
        char *p = realloc(s->addr, n);
        if (!p) return -ENOMEM;
        s->addr = p;
        s->len = n;
        return 0;
    }
    case 15: /* mlockall, without MCL_FUTURE (the documented exception) */
        return mlockall(below(2) ? MCL_CURRENT | MCL_ONFAULT : MCL_CURRENT) ? -errno : 0;
    case 16:
        return munlockall() ? -errno : 0;
    }
    return 0;
}

int main(int argc, char **argv) {
    page = sysconf(_SC_PAGESIZE);
    /* glibc's dynamic threshold would move later blocks onto the heap after the first free(). */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    if (argc >= 5 && !strcmp(argv[1], "seq")) {
        rng = strtoull(argv[2], NULL, 0) * 0x9E3779B97F4A7C15ull + 1;
        int steps = atoi(argv[3]);
        int ops = strcmp(argv[4], "all") ? HOOK_OPS : ALL_OPS;
        report(0, "start", 0);
        for (int i = 1; i <= steps; i++) {
            int op = (int)below(ops);
            /* mlockall locks every mapping: keep it rare. */
            if (op >= 15 && below(4)) op = 2;
            long rc = do_op(i, op);
            report(i, op_names[op], rc);
        }
        return 0;
    }
    if (argc >= 5 && !strcmp(argv[1], "freeloop")) {
        int n = atoi(argv[2]);
        size_t lo = strtoul(argv[3], NULL, 0), hi = strtoul(argv[4], NULL, 0);
        rng = 0x1234567;
        for (int i = 1; i <= n; i++) {
            size_t len = lo + below(hi - lo + 1);
            char *p = malloc(len);
            memset(p, 1, len);
            long before = vmlck();
            int rc = mlock(p, len);
            int err = rc ? errno : 0;
            printf("iter=%d len=%zu off=%lu rc=%d errno=%d vmlck_before=%ld vmlck_after=%ld\n", i, len,
                   (unsigned long)((uintptr_t)p & (page - 1)), rc, err, before, vmlck());
            free(p);
            /* A block of the same size, kept, takes the freed block's place: the next iteration's
             * block lies at a new address, as in a program that goes on allocating. */
            memset(malloc(len), 0, 1);
        }
        /* Only now: pinguard_live_bytes() compares with the kernel, which the loop must not need. */
        report(n, "end", 0);
        return 0;
    }
    fprintf(stderr, "usage: lock_seq seq SEED STEPS hooks|all | freeloop N MIN MAX\n");
    return 2;
}
