/* Locking calls whose arguments the kernel rejects, one line each: "NAME rc=R errno=E".
 * Run with and without pinguard: every line must read the same, whatever the budget and policy.
 * Needs a writable current directory (it maps a file of its own there). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MCL_ONFAULT
#define MCL_ONFAULT 4
#endif

static void line(const char *name, long rc) {
    printf("%s rc=%ld errno=%d\n", name, rc, rc == -1 ? errno : 0);
    fflush(stdout);
}

static long mm(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    errno = 0;
    void *p = mmap(addr, len, prot, flags, fd, off);
    if (p == MAP_FAILED) return -1;
    munmap(p, len);
    return 0;
}

#define CALL(name, expr) do { errno = 0; long rc_ = (expr); line(name, rc_); } while (0)

int main(void) {
    long page = sysconf(_SC_PAGESIZE);
    char *buf = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    /* Two pages then a hole: the kernel locks up to the hole, then fails. */
    char *holed = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(holed + 2 * page, page);
    /* Nothing mapped at all. */
    char *gone = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(gone, 4 * page);
    int file = open("lock_args.data", O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (file < 0 || ftruncate(file, 4 * page) != 0) {
        perror("lock_args.data");
        return 1;
    }
    int rdonly = open("lock_args.data", O_RDONLY);
    int wronly = open("lock_args.data", O_WRONLY);
    int pipefd[2];
    if (pipe(pipefd) != 0) return 1;

    CALL("mlock2_unknown_flag", mlock2(buf, page, 2));
    CALL("mlock2_all_flags", mlock2(buf, page, ~0));
    CALL("mlock2_null_unknown_flag", mlock2(NULL, page, 8));
    CALL("mlock2_null", mlock2(NULL, page, 0));
    CALL("mlock_null", mlock(NULL, page));
    CALL("mlock_unmapped", mlock(gone, 2 * page));
    CALL("mlock_unmapped_tail", mlock(gone + page + 1, page));
    CALL("mlock_holed", mlock(holed, 3 * page));
    CALL("munlock_holed", munlock(holed, 2 * page));
    CALL("mlockall_zero", mlockall(0));
    CALL("mlockall_onfault_alone", mlockall(MCL_ONFAULT));
    CALL("mlockall_unknown_bit", mlockall(MCL_CURRENT | 0x40));
    CALL("mlockall_only_unknown", mlockall(0x100));
    CALL("mmap_bad_fd", mm(NULL, page, PROT_READ, MAP_PRIVATE | MAP_LOCKED, 987, 0));
    CALL("mmap_minus_one_fd", mm(NULL, page, PROT_READ, MAP_SHARED | MAP_LOCKED, -1, 0));
    CALL("mmap_len_zero", mm(NULL, 0, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0));
    CALL("mmap_no_type", mm(NULL, page, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_LOCKED, -1, 0));
    CALL("mmap_both_types", mm(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0));
    CALL("mmap_misaligned_offset", mm(NULL, page, PROT_READ, MAP_PRIVATE | MAP_LOCKED, file, 100));
    CALL("mmap_misaligned_fixed", mm(buf + 1, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_LOCKED, -1, 0));
    CALL("mmap_huge_len", mm(NULL, SIZE_MAX - 100, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0));
    CALL("mmap_shared_write_rdonly", mm(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_LOCKED, rdonly, 0));
    CALL("mmap_wronly", mm(NULL, page, PROT_READ, MAP_PRIVATE | MAP_LOCKED, wronly, 0));
    CALL("mmap_pipe", mm(NULL, page, PROT_READ, MAP_PRIVATE | MAP_LOCKED, pipefd[0], 0));
    CALL("munlockall", munlockall());
    unlink("lock_args.data");
    return 0;
}
