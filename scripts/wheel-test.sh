#!/usr/bin/env bash
# Builds the x86-64 wheel (scripts/wheel.sh), installs it into a fresh virtual environment and
# uses it the way a Python user would, with no Rust toolchain on PATH: `pinguard run`, `report`
# and `check` on the example workload, `python -m pinguard run -- python train.py`, and a training
# script that reads its own figures with pinguard.load_report(). One PASS/FAIL line per check;
# exits non-zero if any fails.
#   scripts/wheel-test.sh [WHEEL]     (default: build it)
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=${1:-}
if [ -z "$wheel" ]; then
    scripts/wheel.sh x86_64 >/dev/null
    wheel=$(ls -t target/wheels/pinguard-*-manylinux_2_17_x86_64*.whl | head -1)
fi
fx=$(scripts/build-fixtures.sh 2>/dev/null) # the example workload and the emulated runtimes (C)
fx=$(cd "$fx" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # name, ok (1/0), detail
    if [ "$2" = 1 ]; then echo "PASS $1: $3"; else echo "FAIL $1: $3"; fail=1; fi
}

python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --no-index "$wheel"
check "pip install into a fresh venv" 1 "$(basename "$wheel")"

# From here on: the venv and the system's directories only (no cargo, no rustc).
clean() { env -i HOME="$tmp" PATH="$tmp/venv/bin:/usr/bin:/bin" "$@"; }
check "no Rust toolchain on PATH" "$(clean sh -c 'command -v cargo rustc >/dev/null' && echo 0 || echo 1)" "cargo and rustc not found"
lib=$(clean python -c 'import pinguard; print(pinguard.library_path())')
check "the library is inside the package" "$([[ $lib == "$tmp/venv/"*/pinguard/_bin/libpinguard.so && -f $lib ]] && echo 1 || echo 0)" "$lib"

set +e
clean pinguard run --budget 3M --report "$tmp/run/%e.%p.json" -- "$fx/workload" >"$tmp/run.out" 2>&1
rc=$?
set -e
check "pinguard run (example workload)" "$([ $rc = 0 ] && ls "$tmp"/run/*.json >/dev/null 2>&1 && echo 1 || echo 0)" "exit $rc, $(ls "$tmp"/run 2>/dev/null | wc -l) report(s)"
out=$(clean pinguard report "$tmp/run" 2>&1 || true)
check "pinguard report" "$(grep -q load_model_weights <<<"$out" && echo 1 || echo 0)" "$(grep -m1 -o 'load_model_weights[^ ]*' <<<"$out" || echo "no load_model_weights in the output")"
set +e
clean pinguard check --max-live 4M "$tmp/run" >/dev/null 2>&1; under=$?
clean pinguard check --max-live 1M "$tmp/run" >/dev/null 2>&1; over=$?
set -e
check "pinguard check" "$([ $under = 0 ] && [ $over = 1 ] && echo 1 || echo 0)" "exit $under under a 4M limit, $over over a 1M limit"

cat >"$tmp/train.py" <<'PY'
import ctypes, sys
import pinguard

cudart = ctypes.CDLL(sys.argv[1])  # looked up with dlsym(handle): pinguard's dlsym sees it
kept = []

def pin_batch(n):
    p = ctypes.c_void_p()
    rc = cudart.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), ctypes.c_uint(0))
    if rc == 0:
        kept.append(p)
    return rc

for _ in range(3):
    assert pin_batch(1 << 20) == 0
report = pinguard.load_report()  # a snapshot of this very process
print("LIVE", report["totals"]["live_bytes"], pinguard.live_bytes())
print("PATH", pinguard.report_path())
print("DENIED_RC", pin_batch(1 << 20))
PY
set +e
clean python -m pinguard run --budget 3M --report "$tmp/py/train.%p.json" -- python "$tmp/train.py" "$fx/libcudart.so" >"$tmp/py.out" 2>"$tmp/py.err"
rc=$?
set -e
live=$(sed -n 's/^LIVE //p' "$tmp/py.out")
path=$(sed -n 's/^PATH //p' "$tmp/py.out")
denied=$(sed -n 's/^DENIED_RC //p' "$tmp/py.out")
check "python -m pinguard run -- python train.py" "$([ $rc = 0 ] && echo 1 || echo 0)" "exit $rc$([ $rc = 0 ] || echo ": $(tail -3 "$tmp/py.err")")"
check "pinguard.load_report() in the script" "$([ "$live" = "3145728 3145728" ] && echo 1 || echo 0)" "live bytes (report, live_bytes()) = ${live:-none}"
check "the budget holds in the script" "$([ "$denied" = 2 ] && echo 1 || echo 0)" "4th MiB: cudaHostAlloc returned ${denied:-nothing} (2 = cudaErrorMemoryAllocation)"
ok=0
if [ -n "$path" ] && [ -f "$path" ]; then
    ok=$(clean python -c 'import pinguard, sys; r = pinguard.load_report(sys.argv[1]); print(int(r["reason"] == "exit" and r["totals"]["denied_count"] == 1))' "$path")
fi
check "pinguard.report_path() names the exit report" "$ok" "${path:-none}"
outside=$(clean python -c 'import pinguard; print(pinguard.report_path(), pinguard.active(), pinguard.live_bytes())')
check "outside pinguard" "$([ "$outside" = "None False None" ] && echo 1 || echo 0)" "report_path, active, live_bytes = $outside"
# The pytest plugin through the wheel's pytest11 entry point (no -p): Debian's pytest, seen from a
# venv over the system's site-packages, the wheel installed there.
if /usr/bin/python3 -c "import pytest" 2>/dev/null; then
    /usr/bin/python3 -m venv --system-site-packages "$tmp/pyt"
    "$tmp/pyt/bin/python" -m pip install -q --no-index "$wheel"
    cat >"$tmp/test_pins.py" <<'PY'
import ctypes, os, pytest
cudart = ctypes.CDLL(os.environ["PGTEST_CUDART"])

@pytest.mark.limit_pinned("1 MiB")
def test_over():
    p = ctypes.c_void_p()
    assert cudart.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(2 << 20), 0) == 0
    cudart.cudaFreeHost(p)
PY
    set +e
    (cd "$tmp" && env -i HOME="$tmp" PATH="$tmp/pyt/bin:/usr/bin:/bin" PGTEST_CUDART="$fx/libcudart.so" PINGUARD_REPORT="$tmp/pyt-reports/%e.%p.json" \
        python -m pytest -q -p no:cacheprovider --pinguard test_pins.py >"$tmp/pyt.out" 2>&1)
    rc=$?
    set -e
    check "pytest --pinguard (the wheel's plugin)" "$([ $rc = 1 ] && grep -q 'pinned a peak of 2.00 MiB, over the limit of 1.00 MiB' "$tmp/pyt.out" && echo 1 || echo 0)" "exit $rc: $(grep -m1 'pinguard: test' "$tmp/pyt.out" || tail -2 "$tmp/pyt.out")"
else
    check "pytest --pinguard (the wheel's plugin)" 0 "no pytest for /usr/bin/python3 (Debian's python3-pytest)"
fi
exit $fail
