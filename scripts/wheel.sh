#!/usr/bin/env bash
# Builds pinguard's wheels into target/wheels/ (manylinux2014: glibc 2.17, x86_64 and aarch64)
# from the artifacts scripts/release.sh builds and checks first.
#   scripts/wheel.sh [ARCH...]      (default: x86_64 aarch64)
set -euo pipefail
cd "$(dirname "$0")/.."
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(x86_64 aarch64)
scripts/release.sh "${archs[@]}"
for a in "${archs[@]}"; do
    python3 scripts/wheel.py "$a" "target/release-artifacts/$a" target/wheels
done
