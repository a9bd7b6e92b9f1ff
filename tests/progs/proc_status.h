/* A field of /proc/self/status ("VmLck:", "VmSize:") in KiB, or -1; read with plain system calls
 * into a static buffer, so it allocates nothing (fopen would) and may be called between steps
 * that the caller wants undisturbed. Not thread-safe. */
#ifndef PROC_STATUS_H
#define PROC_STATUS_H
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long status_kb(const char *field) {
    static char buf[8192];
    int fd = open("/proc/self/status", O_RDONLY);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = strstr(buf, field);
    return p ? strtol(p + strlen(field), NULL, 10) : -1;
}
#endif
