/* Pins from deep inside libbulk_debug.so, a library with tens of MiB of debug information that
 * tests/exit_memory.rs generates: the exit report has to name these frames without taking memory
 * in proportion to that debug information. The allocation stays live, so that `pinguard report`
 * prints its whole stack. */
#include <stdio.h>

int bulk_chain_0(int n);

int main(void) {
    int rc = bulk_chain_0(0);
    printf("pinned rc=%d\n", rc);
    return rc != 0;
}
