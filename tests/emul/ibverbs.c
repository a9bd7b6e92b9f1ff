/* An emulated rdma-core libibverbs.so.1: the memory-registration calls with their real names,
 * signatures, symbol versions (ibverbs.map, after libibverbs.map.in), struct ibv_mr layout and
 * errno behaviour (libibverbs/verbs.h, verbs.c), pinning real pages (mlock), with its own counters
 * (emu_ibverbs_stats). No device: ibv_alloc_pd hands out a protection domain of its own. As in
 * verbs.c, ibv_reg_mr and ibv_reg_mr_iova are ibv_reg_mr_iova2 underneath, called by name. */
#define EMU_NAME "ibverbs"
#pragma GCC diagnostic ignored "-Wunused-function" /* emul_core.c's allocation helpers */
#include "emul_core.c"

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
    size_t pinned; /* host bytes this registration holds locked */
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

/* Locks [addr, addr + length) as ib_umem_get pins it: 0, or -1 with errno ENOMEM. */
static int pin_range(void *addr, size_t length) {
    if (inject_failure()) { errno = ENOMEM; return -1; }
    uintptr_t s = page_down((uintptr_t)addr), e = page_up((uintptr_t)addr + length);
    if (mlock((void *)s, e - s) != 0) { errno = ENOMEM; return -1; }
    bump_outstanding((int64_t)length, 1);
    return 0;
}
static void unpin_range(void *addr, size_t length) {
    uintptr_t s = page_down((uintptr_t)addr), e = page_up((uintptr_t)addr + length);
    munlock((void *)s, e - s);
    bump_outstanding(-(int64_t)length, -1);
}

static struct ibv_mr *fail_null(int e) { count_failed(); errno = e; return NULL; }

static struct ibv_mr *new_mr(struct ibv_pd *pd, void *addr, size_t length, unsigned access, int dmabuf, size_t pinned) {
    struct emu_mr *m = calloc(1, sizeof *m);
    if (!m) {
        if (pinned) unpin_range(addr, pinned);
        return fail_null(ENOMEM);
    }
    m->mr.context = pd->context; m->mr.pd = pd; m->mr.addr = addr; m->mr.length = length;
    m->access = access; m->dmabuf = dmabuf; m->pinned = pinned;
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
    if (!odp && pin_range(addr, length) != 0) return fail_null(errno);
    return new_mr(pd, addr, length, access, 0, odp ? 0 : length);
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
    return new_mr(pd, (void *)(uintptr_t)offset, length, (unsigned)access, 1, 0);
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
        if (pinned && pin_range(addr, length) != 0) { count_failed(); return IBV_REREG_MR_ERR_CMD; }
        if (m->pinned) unpin_range(m->mr.addr, m->pinned);
        m->mr.addr = addr; m->mr.length = length; m->pinned = pinned;
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
    if (m->pinned) unpin_range(m->mr.addr, m->pinned);
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
