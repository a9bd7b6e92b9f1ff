/* An emulated rdma-core libibverbs.so.1: the memory-registration calls with their real names,
 * signatures, symbol versions (ibverbs.map, after libibverbs.map.in), struct ibv_mr layout and
 * errno behaviour (libibverbs/verbs.h, verbs.c), pinning real pages as the card does (each
 * registration an io_uring ring's fixed buffer: the kernel pins the pages long-term and counts them
 * in VmPin, never VmLck, as ib_umem_get does; mlock where io_uring is not available), with its own counters
 * (emu_ibverbs_stats). No device: ibv_alloc_pd hands out a protection domain of its own. As in
 * verbs.c, ibv_reg_mr and ibv_reg_mr_iova are ibv_reg_mr_iova2 underneath, called by name. */
#define EMU_NAME "ibverbs"
#pragma GCC diagnostic ignored "-Wunused-function" /* emul_core.c's allocation helpers */
#include "emul_core.c"
#include <sys/syscall.h>
#include <sys/uio.h>

struct ibv_context;
struct ibv_pd {
    struct ibv_context *context;
    uint32_t handle;
};
struct ibv_mr {
    struct ibv_context *context;
    struct ibv_pd *pd;
    void *addr;
    size_t length;
    uint32_t handle;
    uint32_t lkey;
    uint32_t rkey;
};

#define IBV_ACCESS_ON_DEMAND (1u << 6)
#define IBV_ACCESS_OPTIONAL_RANGE 0x3ff00000u
#define ACCESS_KNOWN (0x3ffu | IBV_ACCESS_OPTIONAL_RANGE)
#define IBV_REREG_MR_CHANGE_TRANSLATION 1
#define IBV_REREG_MR_CHANGE_PD 2
#define IBV_REREG_MR_CHANGE_ACCESS 4
#define IBV_REREG_MR_ERR_INPUT (-1)
#define IBV_REREG_MR_ERR_CMD (-4)

struct emu_mr {
    struct ibv_mr mr; /* first: the handle the caller holds */
    unsigned access;
    int dmabuf;
    size_t pinned; /* host bytes this registration holds pinned */
    int ring;      /* the io_uring ring holding them as a fixed buffer; -1: mlocked instead */
    struct emu_mr *next;
};
static struct emu_mr *mrs;
static uint32_t next_key = 1;

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context) {
    struct ibv_pd *pd = calloc(1, sizeof *pd);
    if (!pd) { errno = ENOMEM; return NULL; }
    pd->context = context;
    return pd;
}
int ibv_dealloc_pd(struct ibv_pd *pd) { free(pd); return 0; }

static uintptr_t page_down(uintptr_t a) { return a & ~(uintptr_t)4095; }
static uintptr_t page_up(uintptr_t a) { return (a + 4095) & ~(uintptr_t)4095; }

#ifndef SYS_io_uring_setup
#define SYS_io_uring_setup 425
#endif
#ifndef SYS_io_uring_register
#define SYS_io_uring_register 427
#endif

/* Pins [addr, addr + length) as ib_umem_get does: the pages it spans, long-term, in VmPin (a new
 * io_uring ring with the range as its one fixed buffer, raw system calls). Returns the ring, or -2
 * where io_uring is not available (disabled, qemu-user) and the range was mlocked instead, or -1
 * with errno ENOMEM. */
static int pin_range(void *addr, size_t length) {
    if (inject_failure()) { errno = ENOMEM; return -1; }
    uint32_t params[30] = {0}; /* struct io_uring_params, all defaults */
    long ring = syscall(SYS_io_uring_setup, 1, params);
    if (ring >= 0) {
        struct iovec iov = { addr, length };
        if (syscall(SYS_io_uring_register, (int)ring, 0 /* IORING_REGISTER_BUFFERS */, &iov, 1) != 0) {
            close((int)ring);
            errno = ENOMEM;
            return -1;
        }
    } else {
        uintptr_t s = page_down((uintptr_t)addr), e = page_up((uintptr_t)addr + length);
        if (mlock((void *)s, e - s) != 0) { errno = ENOMEM; return -1; }
        ring = -2;
    }
    bump_outstanding((int64_t)length, 1);
    return (int)ring;
}
static void unpin_range(int ring, void *addr, size_t length) {
    if (ring >= 0) {
        syscall(SYS_io_uring_register, ring, 1 /* IORING_UNREGISTER_BUFFERS */, NULL, 0);
        close(ring);
    } else {
        uintptr_t s = page_down((uintptr_t)addr), e = page_up((uintptr_t)addr + length);
        munlock((void *)s, e - s);
    }
    bump_outstanding(-(int64_t)length, -1);
}

static struct ibv_mr *fail_null(int e) { count_failed(); errno = e; return NULL; }

static struct ibv_mr *new_mr(struct ibv_pd *pd, void *addr, size_t length, unsigned access, int dmabuf, size_t pinned, int ring) {
    struct emu_mr *m = calloc(1, sizeof *m);
    if (!m) {
        if (pinned) unpin_range(ring, addr, pinned);
        return fail_null(ENOMEM);
    }
    m->mr.context = pd->context; m->mr.pd = pd; m->mr.addr = addr; m->mr.length = length;
    m->access = access; m->dmabuf = dmabuf; m->pinned = pinned; m->ring = ring;
    pthread_mutex_lock(&table_lock);
    m->mr.handle = next_key; m->mr.lkey = m->mr.rkey = next_key++;
    m->next = mrs; mrs = m;
    pthread_mutex_unlock(&table_lock);
    __atomic_add_fetch(&st()->alloc_calls, 1, __ATOMIC_SEQ_CST);
    return &m->mr;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access) {
    (void)iova;
    if (!pd || !addr || !length || (access & ~ACCESS_KNOWN)) return fail_null(EINVAL);
    int odp = (access & IBV_ACCESS_ON_DEMAND) != 0;
    int ring = odp ? -1 : pin_range(addr, length);
    if (!odp && ring == -1) return fail_null(errno);
    return new_mr(pd, addr, length, access, 0, odp ? 0 : length, ring);
}

struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access) {
    return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

struct ibv_mr *ibv_reg_mr_1_1(struct ibv_pd *pd, void *addr, size_t length, int access) {
    return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}
__asm__(".symver ibv_reg_mr_1_1, ibv_reg_mr@@IBVERBS_1.1");

/* The IBVERBS_1.0 compatibility versions (rdma-core's wrap another struct layout; here the same),
 * counted apart: a caller that asked for the default version must never land here. */
static int compat_calls;
struct ibv_mr *ibv_reg_mr_1_0(struct ibv_pd *pd, void *addr, size_t length, int access) {
    __atomic_add_fetch(&compat_calls, 1, __ATOMIC_SEQ_CST);
    return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}
__asm__(".symver ibv_reg_mr_1_0, ibv_reg_mr@IBVERBS_1.0");

/* A dma-buf of device memory: nothing of the host's is pinned. */
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) {
    (void)iova;
    if (!pd || fd < 0 || !length || ((unsigned)access & ~ACCESS_KNOWN)) return fail_null(EINVAL);
    return new_mr(pd, (void *)(uintptr_t)offset, length, (unsigned)access, 1, 0, -1);
}

static struct emu_mr *find(struct ibv_mr *mr, int unlink) {
    for (struct emu_mr **pp = &mrs; *pp; pp = &(*pp)->next)
        if (&(*pp)->mr == mr) {
            struct emu_mr *m = *pp;
            if (unlink) *pp = m->next;
            return m;
        }
    return NULL;
}

int ibv_rereg_mr_1_1(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access) {
    pthread_mutex_lock(&table_lock);
    struct emu_mr *m = find(mr, 0);
    pthread_mutex_unlock(&table_lock);
    if (!m || m->dmabuf || (flags & ~7) || ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!length || !addr)) ||
        (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS))) {
        count_failed();
        errno = EINVAL;
        return IBV_REREG_MR_ERR_INPUT;
    }
    unsigned now = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? (unsigned)access : m->access;
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
        size_t pinned = (now & IBV_ACCESS_ON_DEMAND) ? 0 : length;
        int ring = pinned ? pin_range(addr, length) : -1;
        if (pinned && ring == -1) { count_failed(); return IBV_REREG_MR_ERR_CMD; }
        if (m->pinned) unpin_range(m->ring, m->mr.addr, m->pinned);
        m->mr.addr = addr; m->mr.length = length; m->pinned = pinned; m->ring = ring;
    }
    if (flags & IBV_REREG_MR_CHANGE_PD) m->mr.pd = pd;
    m->access = now;
    return 0;
}
__asm__(".symver ibv_rereg_mr_1_1, ibv_rereg_mr@@IBVERBS_1.1");

static int dereg(struct ibv_mr *mr) {
    pthread_mutex_lock(&table_lock);
    struct emu_mr *m = find(mr, 1);
    pthread_mutex_unlock(&table_lock);
    if (!m) { count_failed(); return EINVAL; }
    if (m->pinned) unpin_range(m->ring, m->mr.addr, m->pinned);
    __atomic_add_fetch(&st()->release_calls, 1, __ATOMIC_SEQ_CST);
    free(m);
    return 0;
}
int ibv_dereg_mr_1_1(struct ibv_mr *mr) { return dereg(mr); }
__asm__(".symver ibv_dereg_mr_1_1, ibv_dereg_mr@@IBVERBS_1.1");
int ibv_dereg_mr_1_0(struct ibv_mr *mr) {
    __atomic_add_fetch(&compat_calls, 1, __ATOMIC_SEQ_CST);
    return dereg(mr);
}
__asm__(".symver ibv_dereg_mr_1_0, ibv_dereg_mr@IBVERBS_1.0");

void emu_ibverbs_stats(struct emu_stats *out) { emu_read_stats(out); }
int emu_ibverbs_compat_calls(void) { return __atomic_load_n(&compat_calls, __ATOMIC_SEQ_CST); }
