#!/usr/bin/env bash
# Builds the emulated runtimes of tests/emul and the C programs of tests/progs into a directory
# (default target/fixtures-scripts), the way the integration tests do, for the scripts.
#   scripts/build-fixtures.sh [DIR]      prints DIR
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/fixtures-scripts}
mkdir -p "$out/layered"
cflags=(-O1 -g -fPIC -Wall -pthread)
cc "${cflags[@]}" -shared -o "$out/libcudart.so" tests/emul/cudart.c -Wl,-soname,libcudart.so
cc "${cflags[@]}" -shared -o "$out/libascendcl.so" tests/emul/ascendcl.c -Wl,-soname,libascendcl.so
cc "${cflags[@]}" -shared -o "$out/libcuda.so.1" tests/emul/cuda_driver.c -Wl,-soname,libcuda.so.1
cc "${cflags[@]}" -shared -o "$out/libamdhip64.so.5" tests/emul/hip.c -Wl,-soname,libamdhip64.so.5
cc "${cflags[@]}" -shared -o "$out/libibverbs.so.1" tests/emul/ibverbs.c -Wl,-soname,libibverbs.so.1 -Wl,--version-script=tests/emul/ibverbs.map
cc "${cflags[@]}" -shared -o "$out/layered/libcudart.so" tests/emul/cudart_layered.c -Wl,-soname,libcudart.so -Wl,-rpath,'$ORIGIN/..' -ldl
link=(-L"$out" -Wl,-rpath,'$ORIGIN' -lcudart -lascendcl -ldl)
cc "${cflags[@]}" -shared -o "$out/libframework.so" tests/progs/framework.c "${link[@]}"
for prog in workload scenario stress race fork_storm exit_paths bench small_stack; do
    cc "${cflags[@]}" -rdynamic -o "$out/$prog" "tests/progs/$prog.c" "${link[@]}"
done
echo "$out"
