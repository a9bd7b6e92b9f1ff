/* Under the first stage (tests/front.rs): the program's first calls of munmap and _exit are made
 * in a SIGALRM handler, which the stage must pass on to the C library (found without a lock or a
 * call of the loader's). Prints "munmap 0" from the handler and exits 7 there. */
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static void *page;

static void on_alarm(int sig) {
    (void)sig;
    int rc = munmap(page, 4096);
    const char *line = rc == 0 ? "munmap 0\n" : "munmap failed\n";
    syscall(SYS_write, 1, line, strlen(line));
    _exit(7);
}

int main(void) {
    page = (void *)syscall(SYS_mmap, 0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, 0);
    alarm(1);
    for (;;)
        pause();
}
