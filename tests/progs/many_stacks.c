/* Many distinct native stacks, nothing of theirs live at the end.
 *
 *   many_stacks N KEEP [PASSES]
 *                        PASSES times (default 1), for i < N: a recursion 16 levels deep that takes left() or right() at
 *                        each level by a bit of i (so up to 65,536 distinct stacks), then locks
 *                        and unlocks one page; then KEEP pages locked from KEEP distinct
 *                        callsites (keep0..keep3), held to the end. Prints "ready" and waits for
 *                        a line on stdin before it exits (the test reads the state file then). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define LEVELS 16

static char *page;
static long failures;

static void lock_one(void) {
    if (mlock(page, 4096) != 0 || munlock(page, 4096) != 0)
        failures++;
}

static void left(int level, unsigned i);
static void right(int level, unsigned i);

/* One frame per level, chosen by the level's bit of i: 16 levels below the first, 65,536
 * distinct stacks within the default 32 frames. Not tail calls: each return address stays. */
__attribute__((noinline)) static void left(int level, unsigned i) {
    if (level == LEVELS)
        lock_one();
    else if (i >> level & 1)
        right(level + 1, i);
    else
        left(level + 1, i);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void right(int level, unsigned i) {
    if (level == LEVELS)
        lock_one();
    else if (i >> level & 1)
        right(level + 1, i);
    else
        left(level + 1, i);
    __asm__ volatile("" ::: "memory");
}

static char *kept[4];
__attribute__((noinline)) static int keep0(char *p) { int r = mlock(p, 4096); __asm__ volatile("" ::: "memory"); return r; }
__attribute__((noinline)) static int keep1(char *p) { int r = mlock(p, 4096); __asm__ volatile("" ::: "memory"); return r; }
__attribute__((noinline)) static int keep2(char *p) { int r = mlock(p, 4096); __asm__ volatile("" ::: "memory"); return r; }
__attribute__((noinline)) static int keep3(char *p) { int r = mlock(p, 4096); __asm__ volatile("" ::: "memory"); return r; }

int main(int argc, char **argv) {
    unsigned n = argc > 1 ? (unsigned)strtoul(argv[1], 0, 0) : 65536;
    int keep = argc > 2 ? atoi(argv[2]) : 3;
    int passes = argc > 3 ? atoi(argv[3]) : 1;
    page = mmap(0, 4096 * 5, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 2;
    for (int p = 0; p < passes; p++)
        for (unsigned i = 0; i < n; i++)
            left(0, i);
    int (*keeps[4])(char *) = {keep0, keep1, keep2, keep3};
    for (int k = 0; k < keep && k < 4; k++) {
        kept[k] = page + 4096 * (k + 1);
        if (keeps[k](kept[k]) != 0)
            failures++;
    }
    printf("ready n=%u keep=%d failures=%ld\n", n, keep, failures);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 3;
    return failures ? 1 : 0;
}
