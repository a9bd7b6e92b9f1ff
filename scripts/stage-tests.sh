#!/usr/bin/env bash
# The library's integration tests again, every program run under the first stage
# (libpinguard-lazy.so, front/front.c) as a node-wide preload runs it: the stage and the library
# in one folder, as a release unpacks them, and PGTEST_LIB naming the stage.
#
# Left out, each for a reason:
#   load, run_endings, secure_mode and file_safety's setuid test: their fixtures copy or install
#   the preloaded file alone (a second copy, `pinguard run`'s folder, a setuid program's trusted
#   folder), without the library beside the stage;
#   mem_limits: an address-space limit the program sets before its first pinning call leaves no
#   room to load the library, which then runs untracked with one line (docs/internals.md, "The
#   first stage");
#   bystander's mlockall test and state_file's exec test: the two differences that document lists
#   (the first pinning thread's malloc arena; the exit work of an image that never pins).
#   scripts/stage-tests.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet -p pinguard
# cargo test leaves the newest library in deps/ and does not always copy it up.
lib=$(ls -t target/debug/deps/libpinguard.so target/debug/libpinguard.so 2>/dev/null | head -1)
stage=target/debug/stage
rm -rf "$stage"
mkdir -p "$stage"
cp "$lib" target/debug/libpinguard-lazy.so "$stage/"
PGTEST_LIB="$PWD/$stage/libpinguard-lazy.so" cargo test --test suite --no-fail-fast -- \
    --skip load:: --skip run_endings:: --skip secure_mode:: --skip mem_limits:: \
    --skip file_safety::a_setuid_process_writes_no_report_where_the_environment_says \
    --skip bystander::mlockall_fits_as_many_blocks_with_pinguard_as_without \
    --skip state_file::an_image_replaced_by_exec_leaves_no_state_for_a_death
