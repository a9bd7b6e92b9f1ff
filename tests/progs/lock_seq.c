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
#include "proc_status.h"

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
    long kb = status_kb("VmLck:");
    return kb < 0 ? -1 : kb * 1024;
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
/* A mapped slot never grows past this many pages: one bit each in `owned`. */
#define MAX_PAGES 64
enum kind { EMPTY, MAPPED, MALLOCED };
static struct slot {
    enum kind kind;
    char *addr;
    size_t len;     /* bytes */
    uint64_t owned; /* MAPPED: the pages of [addr, addr + len) still mapped by this slot */
} slots[SLOTS];

static uint64_t bits(size_t first, size_t n) {
    uint64_t upto = n + first >= 64 ? ~0ull : (1ull << (first + n)) - 1;
    return upto & ~((1ull << first) - 1);
}

static struct slot *pick(enum kind k) {
    int start = (int)below(SLOTS);
    for (int i = 0; i < SLOTS; i++) {
        struct slot *s = &slots[(start + i) % SLOTS];
        if (s->kind == k) return s;
    }
    return NULL;
}

/* A mapped slot all of whose pages are still its own: the only kind mremap may move or resize
 * (mremap of a range with a hole fails, and may unmap the range's tail first). */
static struct slot *pick_whole(void) {
    struct slot *s = pick(MAPPED);
    return s && s->owned == bits(0, s->len / page) ? s : NULL;
}

/* A page-aligned part of a slot, as pages [*first, *first + *n). With `overrun`, sometimes one
 * page past its end, into whatever lies there (often a hole: the kernel applies the call up to it
 * and fails); only for calls that leave a foreign page usable (lock, unlock). */
static void part(struct slot *s, size_t *first, size_t *n, int overrun) {
    size_t pages = s->len / page;
    *first = below(pages);
    *n = 1 + below(pages - *first);
    if (overrun && below(8) == 0) ++*n;
}

/* A call that may destroy or change what a page holds (munmap, mprotect, madvise) is made only on
 * the pages of [first, first + n) the slot still owns, one run at a time: a page it unmapped
 * earlier may since belong to another mapping (glibc's mmap of a large malloc block), and the
 * program's next realloc or free would fault on what this took away. The first error, as -errno. */
static long on_owned(struct slot *s, size_t first, size_t n, int (*call)(void *, size_t, int), int arg) {
    long rc = 0;
    for (size_t i = first; i < first + n;) {
        if (!(s->owned >> i & 1)) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < first + n && s->owned >> j & 1) j++;
        if (call(s->addr + i * page, (j - i) * page, arg) && !rc) rc = -errno;
        i = j;
    }
    return rc;
}

static int unmap(void *a, size_t len, int unused) {
    (void)unused;
    return munmap(a, len);
}

/* After pages [first, first + n) were unmapped: the slot is empty once it owns no page. */
static void lost(struct slot *s, size_t first, size_t n) {
    s->owned &= ~bits(first, n);
    if (!s->owned) s->kind = EMPTY;
}

static const char *op_names[] = {
    "map", "map_locked", "mlock", "mlock2_onfault", "munlock", "munmap", "mremap_grow",
    "mremap_shrink", "mremap_move", "madvise", "mprotect", "fork", "malloc_lock", "free",
    "realloc", "mlockall", "munlockall",
};
#define HOOK_OPS 12
#define ALL_OPS 17

/* The slots' bookkeeping against the kernel's: every page a slot calls its own is mapped (mincore
 * fails with ENOMEM on an unmapped one). A slot that believed an unmapped page still its own would
 * one day unmap or move a page of another mapping that took its place. */
static void check_owned(int step) {
    static unsigned char vec[MAX_PAGES + 1];
    /* qemu-user keeps the guest's mappings itself and answers mincore from its own map, which
     * after its emulated mremap disagrees with the guest's view: the check is native only. */
    if (getenv("LOCK_SEQ_NO_CHECK")) return;
    for (int k = 0; k < SLOTS; k++) {
        struct slot *s = &slots[k];
        for (size_t i = 0; s->kind == MAPPED && i < s->len / page; i++) {
            if (s->owned >> i & 1 && mincore(s->addr + i * page, page, vec)) {
                fprintf(stderr, "step %d: slot %d's page %zu of %zu is not mapped: %s\n", step, k, i, s->len / page, strerror(errno));
                exit(3);
            }
        }
    }
}

static int advise(void *a, size_t len, int advice) { return madvise(a, len, advice); }
static int protect(void *a, size_t len, int prot) { return mprotect(a, len, prot); }

static long do_op(int step, int op) {
    struct slot *s;
    size_t first, n;
    long rc = 0;
    switch (op) {
    case 0: /* map */
    case 1: /* map_locked */
        if (!(s = pick(EMPTY))) return 0;
        s->len = (1 + below(16)) * page;
        s->addr = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (op == 1 ? MAP_LOCKED : 0), -1, 0);
        if (s->addr == MAP_FAILED) return -errno;
        s->kind = MAPPED;
        s->owned = bits(0, s->len / page);
        s->addr[0] = 1;
        return 0;
    case 2: /* mlock */
    case 3: /* mlock2_onfault */
        if (!(s = pick(MAPPED)) && !(s = pick(MALLOCED))) return 0;
        part(s, &first, &n, 1);
        rc = op == 2 ? mlock(s->addr + first * page, n * page) : mlock2(s->addr + first * page, n * page, MLOCK_ONFAULT);
        return rc ? -errno : 0;
    case 4: /* munlock */
        if (!(s = pick(MAPPED)) && !(s = pick(MALLOCED))) return 0;
        part(s, &first, &n, 1);
        return munlock(s->addr + first * page, n * page) ? -errno : 0;
    case 5: /* munmap: a part (leaving holes) or the whole slot */
        if (!(s = pick(MAPPED))) return 0;
        if (below(2)) {
            first = 0;
            n = s->len / page;
        } else {
            part(s, &first, &n, 0);
        }
        rc = on_owned(s, first, n, unmap, 0);
        lost(s, first, n);
        return rc;
    case 6: /* mremap_grow: in place when the next pages are free, else moved */
    case 7: /* mremap_shrink */
    {
        if (!(s = pick_whole())) return 0;
        size_t to = op == 6 ? s->len + (1 + below(8)) * page : (s->len > (size_t)page ? s->len - (1 + below(s->len / page - 1)) * page : s->len);
        if (to > MAX_PAGES * (size_t)page) to = MAX_PAGES * page;
        void *p = mremap(s->addr, s->len, to, MREMAP_MAYMOVE);
        if (p == MAP_FAILED) return -errno;
        s->addr = p;
        s->len = to;
        s->owned = bits(0, to / page);
        return 0;
    }
    case 8: /* mremap_move: MREMAP_FIXED onto a reservation of our own, sometimes resized */
    {
        if (!(s = pick_whole())) return 0;
        size_t to = s->len + ((long)below(3) - 1) * page;
        if (to == 0) to = page;
        if (to > MAX_PAGES * (size_t)page) to = MAX_PAGES * page;
        void *res = mmap(NULL, to + 4 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (res == MAP_FAILED) return -errno;
        void *dst = (char *)res + below(4) * page;
        void *p = mremap(s->addr, s->len, to, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
        munmap(res, (char *)dst - (char *)res); /* the reservation's unused ends */
        munmap((char *)dst + to, (char *)res + to + 4 * page - ((char *)dst + to));
        if (p == MAP_FAILED) {
            rc = -errno;
            munmap(dst, to);
            /* A shrinking move may unmap the old range's tail before it fails: those pages are
             * no longer this slot's, whether or not they went (a leak, never a page torn out of
             * another mapping). */
            if (to < s->len) lost(s, to / page, (s->len - to) / page);
            return rc;
        }
        s->addr = p;
        s->len = to;
        s->owned = bits(0, to / page);
        return 0;
    }
    case 9: /* madvise: never changes what is locked (the kernel refuses DONTNEED on locked pages) */
    {
        static const int advice[] = {MADV_DONTFORK, MADV_DOFORK, MADV_WILLNEED, MADV_RANDOM, MADV_NORMAL, MADV_DONTNEED};
        if (!(s = pick(MAPPED))) return 0;
        part(s, &first, &n, 0);
        return on_owned(s, first, n, advise, advice[below(6)]);
    }
    case 10: /* mprotect */
    {
        static const int prot[] = {PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE};
        if (!(s = pick(MAPPED))) return 0;
        part(s, &first, &n, 0);
        return on_owned(s, first, n, protect, prot[below(3)]);
    }
    case 11: /* fork, part of a slot not inherited: the child has no locked pages at all */
    {
        if ((s = pick(MAPPED))) {
            part(s, &first, &n, 0);
            on_owned(s, first, n, advise, MADV_DONTFORK);
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
            check_owned(i);
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
