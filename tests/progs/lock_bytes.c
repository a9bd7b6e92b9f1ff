/* mlock of byte ranges in one 16 MiB arena, in order, one line each: "OFF:LEN rc=R errno=E".
 *
 *   lock_bytes OFF:LEN...
 *
 * OFF and LEN are bytes, so a range can start inside a page: the kernel then locks (and pinguard
 * counts) every page the range touches, more than LEN. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    size_t size = 16 << 20;
    char *arena = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED) return 2;
    for (int i = 1; i < argc; i++) {
        char *end;
        size_t off = strtoul(argv[i], &end, 0);
        size_t len = *end == ':' ? strtoul(end + 1, NULL, 0) : 0;
        if (off + len > size) return 2;
        errno = 0;
        int rc = mlock(arena + off, len);
        printf("%s rc=%d errno=%d\n", argv[i], rc, rc ? errno : 0);
    }
    return 0;
}
