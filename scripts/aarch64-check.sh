#!/usr/bin/env bash
# Cross-builds the library for aarch64 and runs, under qemu-aarch64, the checks that exercise
# its architecture-specific code: the dlsym/dlvsym trampolines (with another interposer preloaded
# before and after pinguard, and alone) and the example workload (hooks, stacks, budget, report).
# Needs: rustup target aarch64-unknown-linux-gnu, and Debian's qemu-user, gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross (installed here if missing and running as root).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross
fi
rustup target list --installed | grep -q aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    cargo build --release --quiet --target aarch64-unknown-linux-gnu -p pinguard
out=target/aarch64-check
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
cc=aarch64-linux-gnu-gcc
cf=(-O1 -g -fPIC -pthread)
$cc "${cf[@]}" -shared -o "$out/libcudart.so" tests/emul/cudart.c -Wl,-soname,libcudart.so
$cc "${cf[@]}" -shared -o "$out/libascendcl.so" tests/emul/ascendcl.c -Wl,-soname,libascendcl.so
$cc "${cf[@]}" -shared -o "$out/libframework.so" tests/progs/framework.c -L"$out" -Wl,-rpath,'$ORIGIN' -lcudart -lascendcl -ldl
$cc "${cf[@]}" -shared -o "$out/libwrap.so" tests/progs/getpid_wrap.c -ldl
$cc "${cf[@]}" -o "$out/dlsym_check" tests/progs/dlsym_check.c -Wl,-rpath,'$ORIGIN' -ldl
$cc "${cf[@]}" -o "$out/workload" tests/progs/workload.c -L"$out" -Wl,-rpath,'$ORIGIN' -lcudart -lascendcl
cp target/aarch64-unknown-linux-gnu/release/libpinguard.so "$out/"
qemu() { timeout 120 qemu-aarch64 -L /usr/aarch64-linux-gnu "$@"; }
fail=0
lib="$out/libpinguard.so" wrap="$out/libwrap.so"
for preload in "$lib" "$lib:$wrap" "$wrap:$lib"; do
    want=11
    [[ $preload == *libwrap* ]] && want=14
    got=$(cd "$out" && QEMU_SET_ENV=LD_PRELOAD=$preload qemu ./dlsym_check | grep -c ' ok$' || true)
    if [ "$got" = "$want" ]; then echo "PASS dlsym/dlvsym checks, LD_PRELOAD=${preload//$out\//}: $got of $want"; else echo "FAIL dlsym/dlvsym checks, LD_PRELOAD=${preload//$out\//}: $got of $want"; fail=1; fi
done
rm -f "$out"/r.*.json
(cd "$out" && QEMU_SET_ENV=LD_PRELOAD=$lib,PINGUARD_BUDGET=3M,PINGUARD_REPORT=$out/r.%p.json qemu ./workload > /dev/null 2>&1) || true
if python3 - "$out" <<'PY'
import glob, json, sys
r = json.load(open(glob.glob(sys.argv[1] + "/r.*.json")[0]))
t = r["totals"]
ok = t["live_bytes"] == 2949120 and t["denied_count"] == 1 and r["callsites"][0]["frames"][0]["symbol"] == "load_model_weights"
print(("PASS" if ok else "FAIL") + " workload under qemu-aarch64: %d bytes live, %d denied, top callsite %s" % (
    t["live_bytes"], t["denied_count"], r["callsites"][0]["frames"][0]["symbol"]))
sys.exit(0 if ok else 1)
PY
then :; else fail=1; fi
exit $fail
