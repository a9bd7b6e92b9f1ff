/* One range pinned by two routes (issue 45 item 2): the emulated CUDA runtime, the emulated
 * libibverbs and the program's own mlock, on buffers it names by slot. After each operation it
 * prints what the call returned and pinguard's live bytes (pinguard_live_bytes, which brings the
 * locked pages in line with the kernel first), then both emulated runtimes' own counters.
 *
 *   alloc:B:SIZE (cudaHostAlloc into buffer B)   pages:B:SIZE (plain pages into buffer B)
 *   free:B (cudaFreeHost)   register:B:OFF:LEN (cudaHostRegister)   unregister:B:OFF
 *   mlock:B:OFF:LEN   munlock:B:OFF:LEN   reg:B:OFF:LEN (ibv_reg_mr, printed with its slot)
 *   dereg:SLOT (ibv_dereg_mr)
 * OVERLAP_NO_LIVE=1: no live bytes after each operation (live=-1), for counting a call's cost.
 */
#define _GNU_SOURCE
#include "../emul/emul.h"
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef int cudaError_t;
cudaError_t cudaHostAlloc(void **, size_t, unsigned);
cudaError_t cudaFreeHost(void *);
cudaError_t cudaHostRegister(void *, size_t, unsigned);
cudaError_t cudaHostUnregister(void *);
void emu_cuda_stats(struct emu_stats *);
struct ibv_pd;
struct ibv_mr;
struct ibv_pd *ibv_alloc_pd(void *);
struct ibv_mr *ibv_reg_mr(struct ibv_pd *, void *, size_t, int);
int ibv_dereg_mr(struct ibv_mr *);
void emu_ibverbs_stats(struct emu_stats *);

static char *bufs[16];
static struct ibv_mr *mrs[64];
static int nmrs;

static int run_op(struct ibv_pd *pd, const char *op, long a, long b, long c, int *slot) {
    if (a < 0 || a >= 16) return -100;
    if (strcmp(op, "alloc") == 0) return cudaHostAlloc((void **)&bufs[a], b, 0);
    if (strcmp(op, "pages") == 0) {
        void *p = mmap(NULL, b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return -1;
        bufs[a] = p;
        return 0;
    }
    if (strcmp(op, "free") == 0) return cudaFreeHost(bufs[a]);
    if (strcmp(op, "register") == 0) return cudaHostRegister(bufs[a] + b, c, 0);
    if (strcmp(op, "unregister") == 0) return cudaHostUnregister(bufs[a] + b);
    if (strcmp(op, "mlock") == 0) return mlock(bufs[a] + b, c);
    if (strcmp(op, "munlock") == 0) return munlock(bufs[a] + b, c);
    if (strcmp(op, "reg") == 0) {
        struct ibv_mr *mr = ibv_reg_mr(pd, bufs[a] + b, c, 1);
        if (!mr) return -1;
        mrs[nmrs] = mr;
        *slot = nmrs++;
        return 0;
    }
    if (strcmp(op, "dereg") == 0) return a < nmrs ? ibv_dereg_mr(mrs[a]) : -100;
    return -100;
}

int main(int argc, char **argv) {
    uint64_t (*live)(void) = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "pinguard_live_bytes");
    struct ibv_pd *pd = ibv_alloc_pd(NULL);
    int each = getenv("OVERLAP_NO_LIVE") == NULL;
    for (int i = 1; i < argc; i++) {
        char op[32] = {0};
        long a = 0, b = 0, c = 0;
        if (sscanf(argv[i], "%31[a-z]:%li:%li:%li", op, &a, &b, &c) < 2) return 2;
        int slot = -1;
        errno = 0;
        int rc = run_op(pd, op, a, b, c, &slot);
        int err = errno;
        printf("%s rc=%d errno=%d live=%ld", argv[i], rc, rc == 0 ? 0 : err, live && each ? (long)live() : -1L);
        if (slot >= 0) printf(" slot=%d", slot);
        printf("\n");
    }
    struct emu_stats cu = {0}, ib = {0};
    emu_cuda_stats(&cu);
    emu_ibverbs_stats(&ib);
    printf("STATS {\"cuda\":{\"outstanding_bytes\":%ld},\"ibverbs\":{\"outstanding_bytes\":%ld},"
           "\"pinguard_live_bytes\":%ld}\n",
           (long)cu.outstanding_bytes, (long)ib.outstanding_bytes, live ? (long)live() : -1L);
    fflush(stdout);
    return 0;
}
