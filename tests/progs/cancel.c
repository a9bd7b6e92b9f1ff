/* pthread_cancel against pinguard's hooks: a thread with a cancellation pending calls hooked
 * functions. Deferred cancellation acts only at a cancellation point, so with or without pinguard
 * the same calls must return, and the thread must end at the same place.
 *   cancel locking   mlockall, munlockall and a partly failing mlock (none is a cancellation
 *                    point), then pthread_testcancel: cancelled there, after all three returned.
 *   cancel runtime   cudaHostAlloc with EMU_DRIVER_IO=1: the runtime reads a file (a cancellation
 *                    point) inside the call, so the thread is cancelled inside cudaHostAlloc; then
 *                    the main thread pins the whole budget (nothing of the cancelled call is left).
 *   cancel free      the main thread pins the whole budget; a thread cancelled inside its
 *                    cudaFreeHost (the runtime still holds the memory), then the main thread frees
 *                    it and pins the whole budget again. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int cudaHostAlloc(void **p, size_t size, unsigned flags);
int cudaFreeHost(void *p);

static volatile int steps;

static void *locking(void *arg) {
    (void)arg;
    long page = sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(m + page, page); /* a hole: mlock of all three pages fails after locking the first */
    pthread_cancel(pthread_self());
    if (mlockall(MCL_CURRENT) == 0) steps |= 1;
    if (munlockall() == 0) steps |= 2;
    if (mlock(m, 3 * page) != 0) steps |= 4;
    munlock(m, page);
    steps |= 8;
    pthread_testcancel();
    steps |= 16; /* never reached */
    return NULL;
}

static void *runtime(void *arg) {
    (void)arg;
    void *p = NULL;
    pthread_cancel(pthread_self());
    steps |= 1;
    cudaHostAlloc(&p, 1 << 20, 0);
    steps |= 2; /* never reached: cancelled inside the runtime */
    return NULL;
}

static void *held;

static void *free_it(void *arg) {
    (void)arg;
    pthread_cancel(pthread_self());
    steps |= 1;
    cudaFreeHost(held);
    steps |= 2; /* never reached: cancelled inside the runtime, before it freed anything */
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "free")) {
        pthread_t t;
        void *res = NULL;
        int rc = cudaHostAlloc(&held, 1 << 20, 0);
        pthread_create(&t, NULL, free_it, NULL);
        pthread_join(t, &res);
        int rc_free = cudaFreeHost(held);
        void *p = NULL;
        int rc_again = cudaHostAlloc(&p, 1 << 20, 0);
        printf("alloc rc=%d cancelled=%d steps=%d free rc=%d again rc=%d\n", rc, res == PTHREAD_CANCELED, steps, rc_free, rc_again);
        return 0;
    }
    int run_time = argc > 1 && !strcmp(argv[1], "runtime");
    pthread_t t;
    void *res = NULL;
    pthread_create(&t, NULL, run_time ? runtime : locking, NULL);
    pthread_join(t, &res);
    printf("cancelled=%d steps=%d\n", res == PTHREAD_CANCELED, steps);
    if (run_time) {
        void *p = NULL;
        int rc = cudaHostAlloc(&p, 1 << 20, 0);
        printf("after rc=%d\n", rc);
        if (!rc) cudaFreeHost(p);
    }
    return 0;
}
