/* Shared parts of the emulated runtimes: real pinning (mmap + mlock), a pointer table, and the
 * runtime's own counters, so tests check pinguard against an independent count. */
#ifndef EMUL_H
#define EMUL_H

#include <stddef.h>
#include <stdint.h>

struct emu_stats {
    int64_t outstanding_bytes;     /* pinned right now, as the runtime sees it */
    int64_t max_outstanding_bytes; /* the most ever pinned at once */
    int64_t outstanding_count;
    int64_t alloc_calls;           /* successful allocations and registrations */
    int64_t release_calls;         /* successful frees and unregistrations */
    int64_t failed_calls;          /* calls that returned an error, for whatever reason */
    int64_t injected_failures;     /* failures forced by EMU_FAIL_EVERY */
};

/* Device memory (cudaMalloc, cuMemAlloc_v2, hipMalloc and the managed kinds) and I/O-memory
 * registrations, counted apart from pinned memory (emu_<name>_device_stats). */
struct emu_device_stats {
    int64_t outstanding_bytes; /* device memory allocated right now */
    int64_t allocs;            /* successful device allocations */
    int64_t frees;             /* successful device frees */
    int64_t integrated_queries; /* times the runtime was asked whether a device is integrated */
    int64_t io_registrations;  /* I/O-memory registrations live right now */
};

#endif
