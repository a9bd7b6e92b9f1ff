#!/usr/bin/env bash
# Builds pinguard, runs the bundled example workload under it with a 3 MiB budget, and shows the
# report. The workload pins through the emulated CUDA and Ascend runtimes of tests/emul (real
# mmap + mlock underneath) and through mlock directly.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --quiet
out=target/demo
mkdir -p "$out"
rm -f "$out"/report.*.json
for rt in cudart:libcudart.so ascendcl:libascendcl.so; do
    cc -O1 -g -fPIC -shared -pthread -o "$out/${rt#*:}" "tests/emul/${rt%%:*}.c" -Wl,-soname,"${rt#*:}"
done
cc -O1 -g -o "$out/workload" tests/progs/workload.c -L"$out" -Wl,-rpath,'$ORIGIN' -lcudart -lascendcl

echo "== running the workload under pinguard (PINGUARD_BUDGET=3M)"
PINGUARD_BUDGET=3M PINGUARD_REPORT="$PWD/$out/report.%p.json" LD_PRELOAD="$PWD/target/release/libpinguard.so" \
    "$out/workload"

report=$(ls "$out"/report.*.json)
echo
echo "== $report"
cargo run --release --quiet -p pinguard-report --example show -- "$report"
