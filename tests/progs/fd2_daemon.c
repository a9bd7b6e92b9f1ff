/* A daemon that detaches the way daemons do: it closes descriptors 0-2, opens /dev/null on 0 and
 * 1 and its data file on 2 (the lowest free descriptor), then writes records to it around a
 * locked page, as a log-structured store would.
 *   fd2_daemon DATAFILE [keep]
 * The data file must end up holding the program's records and nothing else, whatever is
 * preloaded into it. With `keep` it leaves 0-2 alone and writes its records to the data file on
 * a descriptor of its own (fd 2 is still the stream it started with). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static char page[8192] __attribute__((aligned(4096)));

static int data = 2;

static void record(const char *s) {
    if (write(data, s, strlen(s)) != (ssize_t)strlen(s)) exit(4);
}

static int daemonize(const char *path) {
    close(0);
    close(1);
    close(2);
    if (open("/dev/null", O_RDONLY) != 0 || open("/dev/null", O_WRONLY) != 1) return 1;
    return open(path, O_WRONLY | O_CREAT | O_APPEND, 0600) != 2;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (argc > 2 && !strcmp(argv[2], "keep")) {
        data = open(argv[1], O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (data < 3) return 3;
    } else if (daemonize(argv[1])) {
        return 3;
    }
    record("record 1\n");
    if (mlock(page, sizeof page)) return 5;
    record("record 2\n");
    if (munlock(page, sizeof page)) return 5;
    record("record 3\n");
    return 0;
}
