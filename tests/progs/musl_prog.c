/* A program built with musl-gcc (tests/musl.rs): prints on both streams, writes a file, locks and
 * unlocks a mapping, sets a handler with signal() and reads it back with sigaction() (musl's
 * signal() and glibc's differ in the mask: what it prints shows whose ran). Exits 7. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void on_usr1(int sig) { (void)sig; }

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "out.txt";
    printf("hello from musl\n");
    fprintf(stderr, "a line on stderr\n");
    size_t n = 64 * 1024;
    char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 3;
    memset(p, 1, n);
    int locked = mlock(p, n);
    int unlocked = munlock(p, n);
    printf("mlock %d munlock %d\n", locked, unlocked);
    void (*old)(int) = signal(SIGUSR1, on_usr1);
    struct sigaction sa;
    sigaction(SIGUSR1, 0, &sa);
    printf("previous default %d, restart %d, usr1 in mask %d\n", old == SIG_DFL,
           !!(sa.sa_flags & SA_RESTART), sigismember(&sa.sa_mask, SIGUSR1));
    FILE *f = fopen(path, "w");
    if (!f)
        return 4;
    fprintf(f, "written %d %d\n", locked, unlocked);
    fclose(f);
    munmap(p, n);
    return 7;
}
