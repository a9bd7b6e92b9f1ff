/* deny_syscall NAME PROGRAM [ARGS...]: runs PROGRAM under a seccomp filter that answers the
 * system call NAME (mremap) with EPERM, as a sandbox that denies it would; every other
 * call is allowed. The filter is installed here and kept across exec. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#endif

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: deny_syscall mremap PROGRAM [ARGS...]\n");
        return 2;
    }
    long nr;
    if (strcmp(argv[1], "mremap") == 0) {
        nr = SYS_mremap;
    } else {
        fprintf(stderr, "deny_syscall: unknown call %s\n", argv[1]);
        return 2;
    }
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("deny_syscall: seccomp");
        return 2;
    }
    execv(argv[2], argv + 2);
    perror("deny_syscall: exec");
    return 127;
}
