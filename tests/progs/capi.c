/* Calls the C API of include/pinguard.h, declared weak so the program also runs without pinguard. */
#define PINGUARD_WEAK
#include "../../include/pinguard.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    if (!pinguard_version) { printf("no pinguard\n"); return 0; }
    char *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mlock(p, 8192) != 0) { perror("mlock"); return 1; }
    printf("version=%s\n", pinguard_version());
    printf("live=%llu\n", (unsigned long long)pinguard_live_bytes());
    errno = 77;
    int rc = pinguard_write_report(argc > 1 ? argv[1] : NULL);
    printf("write=%d errno=%d\n", rc, errno);
    printf("write_bad=%d\n", pinguard_write_report("/proc/nonexistent/dir/x.json"));
    char path[4096], shortbuf[4];
    long n = pinguard_common_path(path, sizeof path);
    printf("path=%s\n", n > 0 ? path : "");
    printf("path_len=%ld short=\"%s\"\n", pinguard_common_path(shortbuf, sizeof shortbuf), shortbuf);
    munlock(p, 8192);
    printf("live_after=%llu\n", (unsigned long long)pinguard_live_bytes());
    return 0;
}
