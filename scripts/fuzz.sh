#!/usr/bin/env bash
# Fuzzes pinguard's parsers for a bounded time each: the PINGUARD_* variables (env_config), the
# size and duration units (units) and the report reader (report_reader), starting from the
# committed corpus in fuzz/corpus/. Needs cargo-fuzz (installed here if missing); the stable
# toolchain runs it with RUSTC_BOOTSTRAP=1. Crashes land in fuzz/artifacts/ and fail the script.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
for target in env_config units report_reader; do
    echo "== $target for ${secs}s"
    # A scratch copy of the corpus: new inputs found in a run are not committed by accident.
    work=$(mktemp -d)
    cp -r "fuzz/corpus/$target/." "$work/"
    set +e
    cargo fuzz run -O "$target" "$work" -- -max_total_time="$secs" -max_len=65536 > "$work.log" 2>&1
    status=$?
    set -e
    grep -E "^Done|SUMMARY|panicked" "$work.log" || true
    [ "$status" -eq 0 ] || tail -30 "$work.log" >&2
    rm -f "$work.log"
    rm -rf "$work"
    if [ "$status" -ne 0 ]; then
        echo "fuzz target $target failed (status $status); see fuzz/artifacts/$target/" >&2
        exit 1
    fi
done
echo "all fuzz targets ran ${secs}s each without a failure"
