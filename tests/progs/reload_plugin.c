/* A plugin linked against the CUDA runtime (issue 44 item 2): loading it loads the runtime, and
 * unloading it, the last user, unloads the runtime too. */
int cudaHostAlloc(void **, unsigned long, unsigned);
int cudaFreeHost(void *);

int plugin_pin(void) {
    void *p;
    if (cudaHostAlloc(&p, 4096, 0) != 0) return 1;
    return cudaFreeHost(p) != 0 ? 2 : 0;
}
