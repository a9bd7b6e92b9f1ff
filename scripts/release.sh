#!/usr/bin/env bash
# Builds the library and the CLI for x86-64 and aarch64 against glibc 2.17 (cargo-zigbuild), so
# that they run in old CUDA and CANN images, and checks each artifact: the newest GLIBC_ version
# its dynamic symbols need is at most 2.17, the library exports only the hooks and the C API, and
# the file is for the right architecture. Artifacts land in target/release-artifacts/ARCH/.
# Needs cargo-zigbuild and ziglang (installed here when missing) and the two rustup targets.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-zigbuild >/dev/null || cargo install cargo-zigbuild --locked
python3 -c "import ziglang" 2>/dev/null || python3 -m pip install -q ziglang
for t in x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu; do
    rustup target list --installed | grep -q "^$t$" || rustup target add "$t"
done

allowed='^(cuda|cu|aclrt)[A-Za-z0-9_]+$|^(mlock|mlock2|munlock|mlockall|munlockall|mmap|mmap64|munmap|dlsym|dlvsym|dlclose|_exit|_Exit)$|^pinguard_(write_report|live_bytes|version)$'
fail=0
check() { # name, ok?, detail
    if [ "$2" = 1 ]; then echo "PASS $1: $3"; else echo "FAIL $1: $3"; fail=1; fi
}
for arch in x86_64 aarch64; do
    target=$arch-unknown-linux-gnu
    cargo zigbuild --release --quiet --target "$target.2.17" -p pinguard -p pinguard-cli
    out=target/release-artifacts/$arch
    mkdir -p "$out"
    cp "target/$target/release/libpinguard.so" "target/$target/release/pinguard" "$out/"
    machine=$([ $arch = x86_64 ] && echo "X86-64" || echo "AArch64")
    for f in "$out/libpinguard.so" "$out/pinguard"; do
        newest=$(objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -1)
        ok=$(printf '%s\n2.17\n' "$newest" | sort -t. -k1,1n -k2,2n -c 2>/dev/null && echo 1 || echo 0)
        check "$f glibc" "$ok" "needs GLIBC_$newest (at most 2.17)"
        m=$(readelf -h "$f" | sed -n 's/ *Machine: *//p')
        check "$f architecture" "$([[ $m == *"$machine"* ]] && echo 1 || echo 0)" "$m"
    done
    extra=$(nm -D --defined-only "$out/libpinguard.so" | awk '{print $3}' | sed 's/@.*//' | grep -Ev "$allowed" | tr '\n' ' ' || true)
    check "$out/libpinguard.so exports" "$([ -z "$extra" ] && echo 1 || echo 0)" "${extra:-hooks and the C API only ($(nm -D --defined-only "$out/libpinguard.so" | wc -l) symbols)}"
done
exit $fail
