#!/usr/bin/env bash
# Builds the C fixtures the scripts use (the emulated runtimes of tests/emul and programs of
# tests/progs) into a directory (default target/fixtures-scripts), from the table the integration
# tests build theirs from (tests/fixtures.txt): the fixtures of SET (default `scripts`).
#   scripts/build-fixtures.sh [DIR [SET]]      prints DIR
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:-target/fixtures-scripts}
set_name=${2:-scripts}
mkdir -p "$out"
built=0
while read -r sets name rest; do
    [[ -z $sets || $sets == \#* ]] && continue
    [[ ,$sets, == *,"$set_name",* ]] || continue
    read -ra args <<<"$rest"
    args=("${args[@]//@/$root/}")
    mkdir -p "$out/$(dirname "$name")"
    (cd "$out" && cc -o "$name" "${args[@]}")
    built=$((built + 1))
done <tests/fixtures.txt
((built)) || { echo "build-fixtures.sh: no set $set_name in tests/fixtures.txt" >&2; exit 2; }
echo "$out"
