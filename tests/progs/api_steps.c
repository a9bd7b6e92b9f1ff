/* Pinned bytes moved by two entry points in turn, 20 ms apart (longer than a coarse clock's
 * tick), so that each call makes a timeline point of its own:
 *   cudaHostAlloc 8 KiB, cudaMallocHost 16 KiB, cudaHostAlloc 8 KiB, cudaFreeHost (the first),
 *   cudaFreeHost (the cudaMallocHost one). Prints each call's answer. */
#include <stdio.h>
#include <time.h>

int cudaHostAlloc(void **p, size_t size, unsigned int flags);
int cudaMallocHost(void **p, size_t size);
int cudaFreeHost(void *p);

static void pause20(void) {
    struct timespec t = {0, 20 * 1000 * 1000};
    nanosleep(&t, 0);
}

int main(void) {
    void *a = 0, *b = 0, *c = 0;
    int rc[5];
    rc[0] = cudaHostAlloc(&a, 8192, 0);
    pause20();
    rc[1] = cudaMallocHost(&b, 16384);
    pause20();
    rc[2] = cudaHostAlloc(&c, 8192, 0);
    pause20();
    rc[3] = cudaFreeHost(a);
    pause20();
    rc[4] = cudaFreeHost(b);
    pause20(); /* the report's own point at exit is a millisecond of its own too */
    printf("rc=%d,%d,%d,%d,%d\n", rc[0], rc[1], rc[2], rc[3], rc[4]);
    return 0;
}
