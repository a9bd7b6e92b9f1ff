/* Takes a group ledger's lock the way a member does, then stops itself while holding it: a member
 * stopped inside the ledger's critical section (SIGSTOP, a debugger at a breakpoint, `docker
 * pause`), made deterministic (tests/safety_group.rs). Runs without pinguard.
 *
 *   ledger_lock PATH OFFSET   maps the ledger file PATH, locks the process-shared mutex at byte
 *                             OFFSET (the layout's `Header::mutex`), prints "locked", raises
 *                             SIGSTOP; once continued, unlocks, prints "unlocked" and exits
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: ledger_lock PATH OFFSET\n");
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(argv[1]);
        return 2;
    }
    char *map = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    pthread_mutex_t *m = (pthread_mutex_t *)(map + strtoul(argv[2], NULL, 0));
    int rc = pthread_mutex_lock(m);
    if (rc != 0) {
        fprintf(stderr, "pthread_mutex_lock: %d\n", rc);
        return 3;
    }
    printf("locked\n");
    fflush(stdout);
    raise(SIGSTOP);
    pthread_mutex_unlock(m);
    printf("unlocked\n");
    fflush(stdout);
    return 0;
}
