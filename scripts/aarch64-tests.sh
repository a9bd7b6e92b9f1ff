#!/usr/bin/env bash
# Runs the integration tests against the aarch64 library under qemu-aarch64: the library is
# cross-built, the C fixtures (emulated runtimes, test programs) are built with the aarch64 cross
# compiler, and every test program runs under `qemu-aarch64 -L /usr/aarch64-linux-gnu` with the
# aarch64 library preloaded (tests/common: PGTEST_TARGET=aarch64, PGTEST_LIB). The test harness
# itself runs natively. This exercises the aarch64 paths: the dlsym/dlvsym trampolines, the
# framehop stack walk (registers taken with aarch64 assembly), real mlock through qemu.
#
# Left out, each for a reason that is about the harness or the emulator, not the library:
#   load, file_safety, third_party, python_ctypes, and one test each in forks_exits and
#   snapshots: they run host (x86-64) programs (true, python3, gpg, stress-ng, an exec'd child)
#   with the preload, which an aarch64 library cannot load into;
#   five tests in group: the harness (or the host's `pinguard group rm`) reads and writes the
#   shared ledger with the host's layout (pthread_mutex_t is 40 bytes on x86-64, 48 on aarch64);
#   an_mlock_over_rlimit_memlock_says_why_… in locking, which runs host /bin/sh with the preload; safety_group, which does the same and
#   execs guest programs; python_subprocess_of_a_missing_command_… in safety_signals (host
#   python3);
#   two that fail only under qemu-user, which emulates the guest's memory maps and signal
#   dispositions itself: hooked_calls_alone_never_drift_from_the_kernel in locked_pages (qemu's
#   own mremap and VmLck) and a_one_shot_handler_of_the_report_signal_runs_once in
#   safety_signals (qemu drops glibc's SA_INTERRUPT from the flags it reports back without
#   pinguard, while pinguard reports what the application asked for). Both pass natively.
#   mem_limits (an address-space limit limits qemu itself) and exit_memory (it builds a host
#   library with a large debug section); inside tests, under qemu: lock_seq's self-check (mincore,
#   answered from qemu's own map) and the empty handler on a write-protected alternate stack (qemu
#   writes the signal frame itself and faults there, pinguard or not).
#   vm_pin and ibverbs: qemu-user has no io_uring (io_uring_setup answers ENOSYS), which the
#   VmPin tests and the emulated libibverbs pin with.
# host_reserve binds a stand-in over /proc/meminfo in a private mount namespace: it needs root and
# unshare -m here as natively (without them its tests say NOT RUN).
# Needs: rustup target aarch64-unknown-linux-gnu; Debian's qemu-user, gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross (installed here when missing and running as root).
#   scripts/aarch64-tests.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -e /usr/aarch64-linux-gnu/lib/libc.so.6 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross
fi
rustup target list --installed | grep -q aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    cargo build --release --quiet --target aarch64-unknown-linux-gnu -p pinguard
lib="$PWD/target/aarch64-unknown-linux-gnu/release/libpinguard.so"
file -L "$lib" 2>/dev/null | grep -q aarch64 || readelf -h "$lib" | grep -q AArch64
export PGTEST_TARGET=aarch64 PGTEST_LIB="$lib"
tests=(front hooks locking policies stress races threads config_env driver_paths dlsym report hostile unwind forks_exits snapshots group safety_budget safety_cancel locked_pages safety_signals state_file vmm pools register_pinned host_reserve small_stack callsites asan device_memory overlap)
# One test binary: a module's tests are those whose path starts with `MODULE::`. libtest's filters
# match anywhere in the path, so every module left out is skipped by name (`group::` also matches
# `pod_group::`).
args=()
for t in "${tests[@]}"; do args+=("$t::"); done
for f in tests/*.rs; do
    m=$(basename "$f" .rs)
    [[ $m == suite || " ${tests[*]} " == *" $m "* ]] || args+=(--skip "$m::")
done
for t in "${tests[@]}"; do
    for f in tests/*.rs; do
        m=$(basename "$f" .rs)
        if [[ " ${tests[*]} " != *" $m "* && "$t::" == *"$m::" ]]; then
            echo "aarch64-tests.sh: skipping $m:: would skip $t::" >&2
            exit 1
        fi
    done
done
cargo test -p pinguard --no-fail-fast --test suite -- "${args[@]}" \
    --skip python_normal_exit_and_os_exit_each_write_one_report \
    --skip forked_and_execd_children_write_their_own_reports \
    --skip a_bad_ledger_is_refused_and_the_process_runs_on_its_own_budget \
    --skip a_member_killed_with_sigkill_has_its_bytes_reclaimed \
    --skip a_reused_pid_is_not_mistaken_for_the_member \
    --skip python_subprocess_of_a_missing_command_leaves_the_report_to_python \
    --skip hooked_calls_alone_never_drift_from_the_kernel \
    --skip a_one_shot_handler_of_the_report_signal_runs_once \
    --skip a_process_that_opened_a_removed_ledger_joins_the_one_at_the_name \
    --skip group_rm_closes_the_ledger_for_a_process_that_mapped_it \
    --skip an_mlock_over_rlimit_memlock_says_why_in_its_event_and_the_exit_line
echo "aarch64 under qemu: the tests of ${#tests[@]} modules passed"
