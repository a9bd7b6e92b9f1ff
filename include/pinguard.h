/* pinguard's C API: call it from a process that runs with libpinguard.so preloaded.
 *
 * Link nothing: look the functions up at run time so the program also runs without pinguard,
 *   int (*write_report)(const char *) = dlsym(RTLD_DEFAULT, "pinguard_write_report");
 * or declare them weak, as below with PINGUARD_WEAK defined, and test for NULL. */
#ifndef PINGUARD_H
#define PINGUARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef PINGUARD_WEAK
#define PINGUARD_API __attribute__((weak))
#else
#define PINGUARD_API
#endif

/* Writes a report now, with reason "request". path: the file to write, or NULL for the
 * PINGUARD_REPORT template. Atomic (temporary file, then rename). Returns 0 on success, -1 when
 * pinguard is disabled or the file cannot be written. errno is left unchanged. */
PINGUARD_API int pinguard_write_report(const char *path);

/* The path of this process's report, where the exit report (and pinguard_write_report(NULL))
 * writes it, into buf as a NUL-terminated string of at most size bytes. Returns the path's full
 * length (as snprintf does: call with size 0 to learn it), or -1 when pinguard is disabled or the
 * process is setuid. */
PINGUARD_API long pinguard_common_path(char *buf, size_t size);

/* Pinned bytes live in this process right now (downgraded, pageable memory is not counted). Locked
 * pages are first compared with the kernel's VmLck (and matched with it when they differ), and
 * pages the kernel pins that pinguard saw no call for (VmPin: io_uring fixed buffers) are counted
 * against the budget (the report's totals.kernel_pinned_bytes; not in this figure). */
PINGUARD_API uint64_t pinguard_live_bytes(void);

/* The most pinned bytes live at any moment so far (the report's totals.peak_live_bytes). */
PINGUARD_API uint64_t pinguard_peak_bytes(void);

/* A peak window: after pinguard_peak_window_start(), pinguard_peak_window_bytes() is the most
 * pinned bytes live since that call (the live bytes then, at first); pinguard_peak_bytes() and
 * the report keep the whole process's peak. For a test's own peak (pytest's limit_pinned). */
PINGUARD_API void pinguard_peak_window_start(void);
PINGUARD_API uint64_t pinguard_peak_window_bytes(void);

/* The library's version, e.g. "0.1.0"; a static string. */
PINGUARD_API const char *pinguard_version(void);

#ifdef __cplusplus
}
#endif

#endif /* PINGUARD_H */
