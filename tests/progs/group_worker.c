/* One member of a group test: THREADS threads pin and release through the CUDA runtime and ACL
 * for OPS operations each. Every emulated runtime's pinned bytes feed a counter shared by all
 * the processes of the test (a file named by EMU_SHARED_COUNTER holding [current, max]), so the
 * test sees the group's combined maximum. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int cudaHostAlloc(void **, size_t, unsigned);
int cudaFreeHost(void *);
int aclrtMallocHost(void **, size_t);
int aclrtFreeHost(void *);

static int64_t *shared;
void emu_combined_add(int64_t bytes) {
    int64_t now = __atomic_add_fetch(&shared[0], bytes, __ATOMIC_SEQ_CST);
    int64_t max = __atomic_load_n(&shared[1], __ATOMIC_SEQ_CST);
    while (now > max && !__atomic_compare_exchange_n(&shared[1], &max, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
}

static int ops;
static long refused[64], done[64];

static void *worker(void *arg) {
    long id = (long)arg;
    unsigned seed = (unsigned)(id + 1) * 2654435761u ^ (unsigned)getpid();
    void *held[4] = {0};
    int npu[4] = {0};
    for (int i = 0; i < ops; i++) {
        int k = rand_r(&seed) % 4;
        if (held[k]) {
            if (npu[k] ? aclrtFreeHost(held[k]) : cudaFreeHost(held[k])) { fprintf(stderr, "free failed\n"); exit(3); }
            held[k] = NULL;
        }
        size_t size = 4096 * (1 + rand_r(&seed) % 8);
        npu[k] = rand_r(&seed) % 2;
        void *p = NULL;
        int rc = npu[k] ? aclrtMallocHost(&p, size) : cudaHostAlloc(&p, size, 0);
        if (rc == 0) { held[k] = p; done[id]++; } else refused[id]++;
    }
    for (int k = 0; k < 4; k++)
        if (held[k]) (npu[k] ? aclrtFreeHost(held[k]) : cudaFreeHost(held[k]));
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    ops = argc > 2 ? atoi(argv[2]) : 2000;
    int fd = open(getenv("EMU_SHARED_COUNTER"), O_RDWR);
    if (fd < 0) { perror("EMU_SHARED_COUNTER"); return 2; }
    shared = mmap(NULL, 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    pthread_t t[64];
    for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    long r = 0, d = 0;
    for (int i = 0; i < threads; i++) { r += refused[i]; d += done[i]; }
    printf("STATS {\"refused\":%ld,\"succeeded\":%ld}\n", r, d);
    return 0;
}
