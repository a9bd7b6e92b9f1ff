#!/usr/bin/env bash
# Builds pinguard, runs the bundled example workload under it with a 3 MiB budget, and shows the
# report. The workload pins through the emulated CUDA and Ascend runtimes of tests/emul (real
# mmap + mlock underneath) and through mlock directly.
set -euo pipefail
cd "$(dirname "$0")/.."

# cargo's own progress (its bar on a terminal, a line per crate otherwise): a first build takes
# minutes, and a silent one looks hung.
echo "== cargo build --release --workspace (the first build downloads and compiles about 70 crates)"
cargo build --release --workspace
echo
out=target/demo
mkdir -p "$out"
rm -rf "$out/reports"
for rt in cudart:libcudart.so ascendcl:libascendcl.so; do
    cc -O1 -g -fPIC -shared -pthread -o "$out/${rt#*:}" "tests/emul/${rt%%:*}.c" -Wl,-soname,"${rt#*:}"
done
cc -O1 -g -o "$out/workload" tests/progs/workload.c -L"$out" -Wl,-rpath,'$ORIGIN' -lcudart -lascendcl

pinguard=target/release/pinguard
echo "== pinguard run --budget 3M -- $out/workload"
"$pinguard" run --budget 3M --report "$out/reports/%e.%p.json" -- "$out/workload"

echo
echo "== pinguard report $out/reports"
"$pinguard" report "$out/reports"
