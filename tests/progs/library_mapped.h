/* Whether libpinguard.so (the library, not the first stage) is mapped in this process. */
#include <stdio.h>
#include <string.h>

static int library_mapped(void) {
    char line[512];
    int found = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "/libpinguard.so")) found = 1;
    if (f) fclose(f);
    return found;
}
