/* Pinning on small stacks, and the stack a pinning call needs. Run with and without pinguard.
 *
 *   small_stack thread    threads with PTHREAD_STACK_MIN of stack, one after another, each lock
 *                         and unlock a page and cudaHostAlloc/cudaFreeHost 4 KiB (the process's
 *                         first pinning call is in the first of them)
 *   small_stack altstack  a SIGUSR1 handler on an 8 KiB sigaltstack locks and unlocks a page, in
 *                         the main thread and in a second thread
 *   small_stack coro      16 KiB makecontext/swapcontext coroutines (folly fibers' default) that
 *                         lock, unlock and cudaHostAlloc/cudaFreeHost, switching back in between
 *   small_stack measure WHERE KIND
 *                         the stack KIND (none, mlock, cuda: three pairs) uses on a painted
 *                         256 KiB stack: a thread's (WHERE thread: from the top, so with the
 *                         thread's static TLS), an alternate signal stack's (alt: from the top,
 *                         with the kernel's signal frame), a coroutine's (coro). The call's own
 *                         need is the difference to KIND none in the same place.
 *
 * Prints one line per step and exits 0; a crash is the failure. `measure` prints "used=N". */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);

static char page[4096] __attribute__((aligned(4096)));
static const char *kind = "both";

/* One lock/unlock pair and one CUDA pair (as `kind` says); returns how many calls failed. */
__attribute__((noinline)) static int pin(void) {
    int bad = 0;
    if (strcmp(kind, "cuda") && strcmp(kind, "none")) {
        bad += mlock(page, sizeof page) != 0;
        bad += munlock(page, sizeof page) != 0;
    }
    if (strcmp(kind, "mlock") && strcmp(kind, "none")) {
        void *p = NULL;
        bad += cudaHostAlloc(&p, 4096, 0) != 0;
        bad += cudaFreeHost(p) != 0;
    }
    __asm__ volatile("" ::: "memory");
    return bad;
}

static volatile int failed;

static void *thread_body(void *arg) {
    (void)arg;
    for (int i = 0; i < 3; i++) failed += pin();
    return NULL;
}

static void run_thread(void) {
    for (int t = 0; t < 3; t++) {
        pthread_attr_t a;
        pthread_t th;
        pthread_attr_init(&a);
        pthread_attr_setstacksize(&a, PTHREAD_STACK_MIN);
        if (pthread_create(&th, &a, thread_body, NULL) != 0) {
            printf("pthread_create failed\n");
            exit(3);
        }
        pthread_join(th, NULL);
        printf("thread %d: %d failed\n", t, failed);
    }
}

static volatile sig_atomic_t handled;
static void on_usr1(int sig) {
    (void)sig;
    failed += pin();
    handled++;
}

static void on_altstack(size_t size) {
    stack_t ss = {.ss_sp = malloc(size), .ss_size = size, .ss_flags = 0};
    sigaltstack(&ss, NULL);
}

static void *alt_thread(void *arg) {
    on_altstack(8192);
    for (int i = 0; i < 3; i++) raise(SIGUSR1);
    return arg;
}

static void run_altstack(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    kind = "mlock";
    on_altstack(8192);
    for (int i = 0; i < 3; i++) raise(SIGUSR1);
    printf("main thread: handled %d, %d failed\n", (int)handled, failed);
    pthread_t th;
    pthread_create(&th, NULL, alt_thread, NULL);
    pthread_join(th, NULL);
    printf("second thread: handled %d, %d failed\n", (int)handled, failed);
}

static ucontext_t back, coro;
static void coro_body(void) {
    for (int i = 0; i < 3; i++) {
        failed += pin();
        swapcontext(&coro, &back);
    }
}

static void run_coros(size_t size, int count, char *stack) {
    for (int c = 0; c < count; c++) {
        char *s = stack ? stack : malloc(size);
        getcontext(&coro);
        coro.uc_stack.ss_sp = s;
        coro.uc_stack.ss_size = size;
        coro.uc_link = &back;
        makecontext(&coro, coro_body, 0);
        for (int i = 0; i < 4; i++) swapcontext(&back, &coro);
        if (!stack) {
            free(s);
            printf("coroutine %d: %d failed\n", c, failed);
        }
    }
}

/* --- measure --- */
#define AREA (256 * 1024)
#define PAINT 0xa5

static size_t untouched(const unsigned char *area) {
    size_t n = 0;
    while (n < AREA && area[n] == PAINT) n++;
    return n;
}

static unsigned char *painted(void) {
    unsigned char *a = mmap(NULL, AREA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) exit(3);
    memset(a, PAINT, AREA);
    return a;
}

static void measure(const char *where) {
    unsigned char *area = painted();
    if (!strcmp(where, "thread")) {
        pthread_attr_t a;
        pthread_t th;
        pthread_attr_init(&a);
        pthread_attr_setstack(&a, area, AREA);
        pthread_create(&th, &a, thread_body, NULL);
        pthread_join(th, NULL);
    } else if (!strcmp(where, "alt")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr1;
        sa.sa_flags = SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGUSR1, &sa, NULL);
        stack_t ss = {.ss_sp = area, .ss_size = AREA, .ss_flags = 0};
        sigaltstack(&ss, NULL);
        for (int i = 0; i < 3; i++) raise(SIGUSR1);
        ss.ss_flags = SS_DISABLE;
        sigaltstack(&ss, NULL);
    } else {
        run_coros(AREA, 1, (char *)area);
    }
    printf("used=%zu failed=%d\n", AREA - untouched(area), failed);
}

int main(int argc, char **argv) {
    memset(page, 1, sizeof page);
    if (argc < 2) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(argv[1], "thread")) {
        run_thread();
    } else if (!strcmp(argv[1], "altstack")) {
        run_altstack();
    } else if (!strcmp(argv[1], "coro")) {
        run_coros(16 * 1024, 3, NULL);
    } else if (!strcmp(argv[1], "measure") && argc >= 4) {
        kind = argv[3];
        measure(argv[2]);
    } else {
        return 2;
    }
    printf("done\n");
    return failed ? 1 : 0;
}
