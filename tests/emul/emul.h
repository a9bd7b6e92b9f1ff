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

#endif
