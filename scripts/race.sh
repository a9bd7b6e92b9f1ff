#!/usr/bin/env bash
# The long race: THREADS threads (default 16) doing 1,000,000 operations in all over every family
# (CUDA runtime, CUDA driver through cuGetProcAddress, ACL, mlock) against one budget, optionally
# with the emulated runtimes failing a fraction of calls. Checks that the runtimes never held more
# than the budget together and that every counter ends exact; prints the figures.
#   scripts/race.sh [THREADS] [TOTAL_OPS] [FAIL_RATE]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-16}
total=${2:-1000000}
rate=${3:-0}
cargo build --release --quiet
fx=$(scripts/build-fixtures.sh)
dir=$(mktemp -d)
budget=$((1 << 20))
start=$(date +%s.%N)
EMU_FAIL_RATE=$rate PINGUARD_BUDGET=$budget PINGUARD_REPORT="$dir/r.%p.json" \
    LD_PRELOAD="$PWD/target/release/libpinguard.so" "$fx/race" "$threads" $((total / threads)) > "$dir/out" 2> "$dir/err"
end=$(date +%s.%N)
python3 - "$dir" "$threads" "$total" "$budget" "$start" "$end" <<'PY'
import glob, json, sys
d, threads, total, budget, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
s = json.loads([l for l in open(d + "/out") if l.startswith("STATS ")][0][6:])
t = json.load(open(glob.glob(d + "/r.*.json")[0]))["totals"]
ops = (total // threads) * threads
ok, refused = sum(s["ok"]), sum(s["refused"])
checks = [
    ("operations", ok + refused == ops),
    ("combined max within budget", s["combined_max"] <= budget),
    ("budget approached", s["combined_max"] > budget // 2),
    ("no reservation leaked", s["probe"] == 0),
    ("alloc_count exact", t["alloc_count"] == ok + 1 == sum(s["runtime_alloc"]) + s["ok"][3]),
    ("release_count exact", t["release_count"] == sum(s["released"]) + 1),
    ("denied + runtime failures = refused", t["denied_count"] + sum(s["runtime_failed"]) - s["probe_failures"] == refused),
    ("failed_count exact", t["failed_count"] == sum(s["runtime_failed"])),
    ("live ends at zero", t["live_bytes"] == 0 and t["live_count"] == 0 and s["combined"] == 0),
    ("peak within budget", t["peak_live_bytes"] <= budget),
]
print("%d threads, %d operations in %.2f s (%.0f ops/s), budget %d bytes" % (threads, ops, end - start, ops / (end - start), budget))
print("combined max %d bytes; %d succeeded, %d refused (%d by pinguard, %d by the runtimes); peak %d" % (
    s["combined_max"], ok, refused, t["denied_count"], sum(s["runtime_failed"]), t["peak_live_bytes"]))
bad = [name for name, good in checks if not good]
for name, good in checks:
    print(("PASS " if good else "FAIL ") + name)
sys.exit(1 if bad else 0)
PY
