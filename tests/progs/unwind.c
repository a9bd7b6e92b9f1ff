/* Stack walks pinguard must get right, in a program built without frame pointers:
 *   unwind chain             main -> level_a -> level_b -> level_c -> cudaHostAlloc
 *   unwind plugins DIR SNAP  a plugin opened, used and closed, then another (likely at the same
 *                            address); pinguard_write_report(SNAP) while the first is loaded
 *   unwind corrupt           calls through a stub that plants a garbage return address and a
 *                            hostile frame pointer (unmapped, off-stack loop, on-stack loop),
 *                            then walks a healthy stack again
 *   unwind turns N           one leaf pins and frees from two callers in turn, N times each
 *   unwind thread_turns N    the same from threads started one after another (each on the
 *                            stack the one before it ended on), 50 pairs a thread, N threads a
 *                            caller
 *   unwind stackret          calls through a stub whose unwind information finds a stack address
 *                            where its return address belongs, then walks a healthy stack again
 *   unwind poison            (x86-64) walks through a libffi-like frame (found from rbp + 32) with
 *                            a garbage rbp, then through the same frame healthy
 *   unwind jit               (x86-64) pins from two callers through a stub in an anonymous
 *                            executable page, as JIT-compiled code (Julia, LuaJIT) calls a runtime
 * Prints "STATS {...}" with what it allocated. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

extern int cudaHostAlloc(void **p, size_t n, unsigned int flags);
extern int cudaFreeHost(void *p);

static volatile int sink;
static unsigned long allocated, calls;

/* noinline and work after each call: no inlining, no tail calls, so every level is a frame. */
__attribute__((noinline)) int level_c(size_t n) {
    void *p = 0;
    int rc = cudaHostAlloc(&p, n, 0);
    if (rc == 0) { allocated += n; calls++; }
    sink += rc;
    return rc;
}
__attribute__((noinline)) int level_b(size_t n) { int rc = level_c(n); sink++; return rc; }
__attribute__((noinline)) int level_a(size_t n) { int rc = level_b(n); sink++; return rc; }

/* Two callers of one leaf at the same depth: the leaf's walks start from the same registers and
 * read the same stack words but one, the return address into its caller. */
__attribute__((noinline)) void turn_leaf(void) {
    void *p = 0;
    if (cudaHostAlloc(&p, 4096, 0) == 0) { allocated += 4096; calls++; cudaFreeHost(p); }
    sink++;
}
__attribute__((noinline)) void turn_x(void) { turn_leaf(); sink++; }
__attribute__((noinline)) void turn_y(void) { turn_leaf(); sink += 2; }

static void *turn_thread(void *caller) {
    for (int i = 0; i < 50; i++) ((void (*)(void))caller)();
    return NULL;
}

__attribute__((noinline)) void corrupt_target(void) {
    void *p = 0;
    if (cudaHostAlloc(&p, 16384, 0) == 0) { allocated += 16384; calls++; }
    sink++;
}

/* corrupt_call(fn, fp): calls fn with the stub's saved return address replaced by garbage and
 * the frame pointer set to fp; restores both before returning. No unwind info on purpose. */
void corrupt_call(void (*fn)(void), void *fp);
#if defined(__x86_64__)
__asm__(".text\n.globl corrupt_call\n.type corrupt_call,@function\ncorrupt_call:\n"
        "  push %rbx\n  push %rbp\n  sub $8, %rsp\n"
        "  mov 24(%rsp), %rbx\n"
        "  movq $0x1234560, 24(%rsp)\n"
        "  mov %rsi, %rbp\n"
        "  call *%rdi\n"
        "  mov %rbx, 24(%rsp)\n"
        "  add $8, %rsp\n  pop %rbp\n  pop %rbx\n  ret\n"
        ".size corrupt_call, .-corrupt_call\n");
#elif defined(__aarch64__)
__asm__(".text\n.globl corrupt_call\n.type corrupt_call,%function\ncorrupt_call:\n"
        "  sub sp, sp, #48\n"
        "  stp x29, x30, [sp, #16]\n"
        "  str x19, [sp, #32]\n"
        "  mov x19, #0x4560\n"
        "  stp x1, x19, [sp]\n"
        "  mov x29, x1\n"
        "  blr x0\n"
        "  ldr x19, [sp, #32]\n"
        "  ldp x29, x30, [sp, #16]\n"
        "  add sp, sp, #48\n"
        "  ret\n"
        ".size corrupt_call, .-corrupt_call\n");
#else
#error "corrupt_call: x86-64 or aarch64 only"
#endif

/* stack_ra_call(fn): calls fn with the stub's return address, which its call-frame information
 * describes correctly, replaced by an address on the stack (the stub's own frame); restores it
 * before returning. An unwinder that trusts the slot gets a "return address" that is no code. */
void stack_ra_call(void (*fn)(void));
#if defined(__x86_64__)
__asm__(".text\n.globl stack_ra_call\n.type stack_ra_call,@function\nstack_ra_call:\n"
        "  .cfi_startproc\n"
        "  push %rbx\n  .cfi_adjust_cfa_offset 8\n  .cfi_offset %rbx, -16\n"
        "  mov 8(%rsp), %rbx\n"
        "  mov %rsp, 8(%rsp)\n"
        "  call *%rdi\n"
        "  mov %rbx, 8(%rsp)\n"
        "  pop %rbx\n  .cfi_adjust_cfa_offset -8\n  .cfi_restore %rbx\n"
        "  ret\n"
        "  .cfi_endproc\n"
        ".size stack_ra_call, .-stack_ra_call\n");
#elif defined(__aarch64__)
__asm__(".text\n.globl stack_ra_call\n.type stack_ra_call,%function\nstack_ra_call:\n"
        "  .cfi_startproc\n"
        "  stp x29, x30, [sp, #-32]!\n  .cfi_def_cfa_offset 32\n  .cfi_offset x29, -32\n  .cfi_offset x30, -24\n"
        "  str x19, [sp, #16]\n  .cfi_offset x19, -16\n"
        "  mov x29, sp\n"
        "  mov x19, x30\n"
        "  mov x9, sp\n  str x9, [sp, #8]\n"
        "  blr x0\n"
        "  str x19, [sp, #8]\n"
        "  ldr x19, [sp, #16]\n  .cfi_restore x19\n"
        "  ldp x29, x30, [sp], #32\n  .cfi_restore x29\n  .cfi_restore x30\n  .cfi_def_cfa_offset 0\n"
        "  ret\n"
        "  .cfi_endproc\n"
        ".size stack_ra_call, .-stack_ra_call\n");
#endif

/* rbp_frame_call(fn, arg): calls fn(arg) from a frame laid out as libffi's ffi_call_unix64's, whose
 * call-frame information finds it from the frame pointer (CFA = rbp + 32, rbp saved at CFA - 16,
 * which unwinders cannot cache as a plain frame-pointer rule); the two words a plain
 * frame-pointer walk would read there, [rbp] and [rbp + 8], hold stack addresses.
 * garbage_fp_call(fn): calls fn from a frame with no unwind information whose frame record says
 * the caller's rbp was 0x10: a walk through it reaches rbp_frame_call with a garbage rbp. */
void rbp_frame_call(void (*fn)(void *), void *arg);
void garbage_fp_call(void (*fn)(void));
#if defined(__x86_64__)
__asm__(".text\n.globl rbp_frame_call\n.type rbp_frame_call,@function\nrbp_frame_call:\n"
        "  .cfi_startproc\n"
        "  sub $40, %rsp\n  .cfi_adjust_cfa_offset 40\n"
        "  mov %rbp, 32(%rsp)\n"
        "  lea 16(%rsp), %rbp\n  .cfi_def_cfa %rbp, 32\n  .cfi_offset %rbp, -16\n"
        "  mov %rsp, 0(%rbp)\n  mov %rsp, 8(%rbp)\n"
        "  mov %rdi, %rax\n  mov %rsi, %rdi\n"
        "  call *%rax\n"
        "  lea 16(%rbp), %rsp\n  .cfi_def_cfa %rsp, 16\n"
        "  pop %rbp\n  .cfi_def_cfa_offset 8\n  .cfi_restore %rbp\n"
        "  ret\n"
        "  .cfi_endproc\n"
        ".size rbp_frame_call, .-rbp_frame_call\n");
__asm__(".text\n.globl garbage_fp_call\n.type garbage_fp_call,@function\ngarbage_fp_call:\n"
        "  mov %rbp, %rax\n"
        "  push $0x10\n  mov %rsp, %rbp\n"
        "  push %rax\n  sub $8, %rsp\n"
        "  call *%rdi\n"
        "  add $8, %rsp\n  pop %rbp\n  add $8, %rsp\n"
        "  ret\n"
        ".size garbage_fp_call, .-garbage_fp_call\n");
#else
void rbp_frame_call(void (*fn)(void *), void *arg) { fn(arg); sink++; }
void garbage_fp_call(void (*fn)(void)) { fn(); sink++; }
#endif

__attribute__((noinline)) void poison_target(void) {
    void *p = 0;
    if (cudaHostAlloc(&p, 8192, 0) == 0) { allocated += 8192; calls++; }
    sink++;
}

#if defined(__x86_64__)
typedef int (*host_alloc_fn)(void **, size_t, unsigned int);
static host_alloc_fn jit_stub;
/* push rbp; mov rbp, rsp; movabs rax, cudaHostAlloc; call rax; pop rbp; ret */
static host_alloc_fn make_jit_stub(void) {
    unsigned char code[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xd0, 0x5d, 0xc3};
    uint64_t target = (uint64_t)(uintptr_t)&cudaHostAlloc;
    memcpy(code + 6, &target, 8);
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("mmap"); exit(3); }
    memcpy(m, code, sizeof code);
    return (host_alloc_fn)m;
}
__attribute__((noinline)) void jit_a(void) {
    void *p = 0;
    if (jit_stub(&p, 4096, 0) == 0) { allocated += 4096; calls++; }
    sink++;
}
__attribute__((noinline)) void jit_b(void) {
    void *p = 0;
    if (jit_stub(&p, 8192, 0) == 0) { allocated += 8192; calls++; }
    sink++;
}
#endif

typedef int (*entry_fn)(size_t);

static int run_plugin(const char *dir, const char *name, size_t n, const char *snapshot) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen %s: %s\n", path, dlerror()); exit(3); }
    entry_fn entry = (entry_fn)dlsym(h, "plug_entry");
    if (!entry) { fprintf(stderr, "no plug_entry in %s\n", path); exit(3); }
    int rc = entry(n);
    if (rc == 0) { allocated += n; calls++; }
    printf("plugin %s at %p rc=%d\n", name, (void *)entry, rc);
    if (snapshot) {
        int (*write_report)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "pinguard_write_report");
        if (!write_report || write_report(snapshot) != 0) { fprintf(stderr, "snapshot failed\n"); exit(3); }
    }
    sink++;
    return dlclose(h);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "chain";
    if (!strcmp(mode, "chain")) {
        level_a(4096);
    } else if (!strcmp(mode, "plugins") && argc > 3) {
        run_plugin(argv[2], "libplug_a.so", 8192, argv[3]);
        run_plugin(argv[2], "libplug_b.so", 12288, NULL);
    } else if (!strcmp(mode, "turns") && argc > 2) {
        for (int i = 0; i < atoi(argv[2]); i++) { turn_x(); turn_y(); }
    } else if (!strcmp(mode, "thread_turns") && argc > 2) {
        /* Joined before the next starts: glibc gives the next thread the same stack. */
        for (int i = 0; i < 2 * atoi(argv[2]); i++) {
            pthread_t t;
            if (pthread_create(&t, NULL, turn_thread, (void *)(i % 2 ? turn_y : turn_x)) || pthread_join(t, NULL)) return 3;
        }
    } else if (!strcmp(mode, "corrupt")) {
        static uintptr_t heap_loop[4];
        uintptr_t stack_loop[4];
        heap_loop[0] = (uintptr_t)heap_loop; heap_loop[1] = 0x1234560;
        stack_loop[0] = (uintptr_t)stack_loop; stack_loop[1] = 0x1234560;
        corrupt_call(corrupt_target, (void *)0x1234);
        corrupt_call(corrupt_target, heap_loop);
        corrupt_call(corrupt_target, stack_loop);
        sink += (int)stack_loop[2];
        level_a(4096); /* a healthy walk afterwards */
    } else if (!strcmp(mode, "poison")) {
        rbp_frame_call((void (*)(void *))garbage_fp_call, (void *)corrupt_target);
        rbp_frame_call((void (*)(void *))poison_target, 0);
#if defined(__x86_64__)
    } else if (!strcmp(mode, "jit")) {
        jit_stub = make_jit_stub();
        jit_a();
        jit_b();
#endif
    } else if (!strcmp(mode, "stackret")) {
        stack_ra_call(corrupt_target);
        level_a(4096);
    } else {
        fprintf(stderr, "usage: unwind chain | plugins DIR SNAPSHOT | corrupt | stackret | poison | jit | turns N | thread_turns N\n");
        return 2;
    }
    printf("STATS {\"allocated\": %lu, \"calls\": %lu}\n", allocated, calls);
    return 0;
}
