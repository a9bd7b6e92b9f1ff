#!/usr/bin/env bash
# Scale check for `pinguard report`: merges REPORTS reports of CALLSITES callsites each (8 frames per
# callsite, the same code in every process, as in a fleet) and prints the wall time and the peak
# memory of the merge. Defaults: 1000 reports x 1000 callsites.
#   scripts/bench-merge.sh [REPORTS] [CALLSITES]
set -euo pipefail
cd "$(dirname "$0")/.."
reports=${1:-1000}
callsites=${2:-1000}
cargo build --release --quiet -p pinguard-cli
dir=target/bench-merge/${reports}x${callsites}
if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    python3 - "$dir" "$reports" "$callsites" <<'PY'
import json, sys
out, n, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def frame(i, j):
    return {"addr": "0x%x" % (0x7f0000000000 + i * 64 + j), "module": "/opt/app/lib/libserve.so",
            "offset": "0x%x" % (i * 64 + j), "symbol": "serve::layer%d::stage%d" % (i, j),
            "file": "/src/serve/layer%d.rs" % i, "line": 10 + j}
sites = [{"id": i, "frames": [frame(i, j) for j in range(8)], "apis": ["cudaHostAlloc"],
          "live_bytes": 4096 * (i + 1), "live_count": 1, "peak_live_bytes": 8192 * (i + 1),
          "alloc_count": 3, "alloc_bytes": 12288 * (i + 1), "denied_count": 0, "downgraded_count": 0}
         for i in range(m)]
live = sum(s["live_bytes"] for s in sites)
base = {"schema": "pinguard.report.v1", "reason": "exit",
        "process": {"pid": 0, "ppid": 1, "exe": "/opt/app/bin/serve", "cmdline": ["serve"], "hostname": "node",
                    "start_unix_ms": 1, "write_unix_ms": 2},
        "config": {"budget_bytes": None, "policy": "error", "depth": 32, "hooks": ["cuda"], "errors": []},
        "totals": {"live_bytes": live, "live_count": m, "peak_live_bytes": live, "alloc_count": 3 * m,
                   "alloc_bytes": 3 * live, "release_count": 2 * m, "failed_count": 0, "denied_count": 0,
                   "denied_bytes": 0, "downgraded_count": 0, "downgraded_bytes": 0, "downgraded_live_bytes": 0,
                   "over_budget_count": 0, "unknown_release_count": 0},
        "apis": {}, "kernel": {"vm_lck_bytes": 0, "vm_pin_bytes": 0, "rlimit_memlock_bytes": None},
        "modules": [], "callsites": sites, "live": [], "events": [], "timeline": []}
text = json.dumps(base, separators=(",", ":"))
head, tail = text.split('"pid":0', 1)
for k in range(n):
    with open("%s/serve.%d.json" % (out, 1000 + k), "w") as f:
        f.write(head + '"pid":%d' % (1000 + k) + tail)
PY
    touch "$dir/.complete"
fi
size=$(du -sh "$dir" | cut -f1)
python3 - "$dir" <<'PY'
import resource, subprocess, sys, time
t = time.time()
r = subprocess.run(["target/release/pinguard", "report", "--top", "5", sys.argv[1]], stdout=subprocess.PIPE, text=True)
wall = time.time() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
summary = [l for l in r.stdout.splitlines() if l.startswith("SUMMARY")]
print(summary[0] if summary else r.stdout[-500:])
print("merge: %.2f s wall, %.0f MiB peak RSS (exit %d)" % (wall, rss, r.returncode))
PY
echo "input: $(ls "$dir" | wc -l) files, $size"
