#!/usr/bin/env bash
# Builds the library and the CLI for x86-64 and aarch64 against glibc 2.17 (cargo-zigbuild), so
# that they run in old CUDA and CANN images, and checks each artifact: the newest GLIBC_ version
# its dynamic symbols need is at most 2.17, the library exports exactly the hooks its tables in
# src/hooks/ declare and the C API (scripts/exports.py), the file is for the right
# architecture, and a musl loader can load the library (no file but libc, no import musl lacks:
# scripts/drop_loader_needed.py first takes out a DT_NEEDED of glibc's loader). Artifacts
# land in target/release-artifacts/ARCH/, and a tarball per architecture (bin/pinguard,
# lib/libpinguard.so, lib/libpinguard-lazy.so (the first stage), include/pinguard.h) beside them.
# Needs cargo-zigbuild and ziglang (installed here when missing) and the rustup targets.
#   scripts/release.sh [ARCH...]      (default: x86_64 aarch64)
set -euo pipefail
cd "$(dirname "$0")/.."
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(x86_64 aarch64)
for a in "${archs[@]}"; do
    [[ $a == x86_64 || $a == aarch64 ]] || { echo "release.sh: unknown architecture '$a' (x86_64 or aarch64)" >&2; exit 2; }
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
command -v cargo-zigbuild >/dev/null || cargo install cargo-zigbuild --locked
# cargo-zigbuild runs `zig`, else `python3 -m ziglang`: a private venv keeps the system Python as it
# is (Debian's refuses pip installs).
if ! command -v zig >/dev/null && ! python3 -c "import ziglang" 2>/dev/null; then
    [ -x target/zig-venv/bin/python3 ] && target/zig-venv/bin/python3 -c "import ziglang" 2>/dev/null ||
        { python3 -m venv target/zig-venv && target/zig-venv/bin/python3 -m pip install -q ziglang; }
    export PATH="$PWD/target/zig-venv/bin:$PATH"
fi
for a in "${archs[@]}"; do
    rustup target list --installed | grep -q "^$a-unknown-linux-gnu$" || rustup target add "$a-unknown-linux-gnu"
done

# The exports the tables in src/hooks/ and include/pinguard.h declare (see scripts/exports.py).
declared=$(python3 scripts/exports.py | sort)
fail=0
check() { # name, ok?, detail
    if [ "$2" = 1 ]; then echo "PASS $1: $3"; else echo "FAIL $1: $3"; fail=1; fi
}
for arch in "${archs[@]}"; do
    target=$arch-unknown-linux-gnu
    cargo zigbuild --release --quiet --target "$target.2.17" -p pinguard -p pinguard-cli
    out=target/release-artifacts/$arch
    mkdir -p "$out"
    cp "target/$target/release/libpinguard.so" "target/$target/release/pinguard" "$out/"
    # A DT_NEEDED of glibc's loader (for __tls_get_addr) would make a musl loader fail every program.
    python3 scripts/drop_loader_needed.py "$out/libpinguard.so"
    machine=$([ $arch = x86_64 ] && echo "X86-64" || echo "AArch64")
    # The first stage (front/front.c), which build.rs built beside the library.
    cp "target/$target/release/libpinguard-lazy.so" "$out/"
    for f in "$out/libpinguard.so" "$out/libpinguard-lazy.so" "$out/pinguard"; do
        newest=$(objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -1)
        ok=$(printf '%s\n2.17\n' "$newest" | sort -t. -k1,1n -k2,2n -c 2>/dev/null && echo 1 || echo 0)
        check "$f glibc" "$ok" "needs GLIBC_$newest (at most 2.17)"
        m=$(readelf -h "$f" | sed -n 's/ *Machine: *//p')
        check "$f architecture" "$([[ $m == *"$machine"* ]] && echo 1 || echo 0)" "$m"
    done
    for so in libpinguard.so libpinguard-lazy.so; do
        # What a musl loader needs to load it (docs/internals.md, "musl processes"): no file but libc,
        # and only strong imports musl's libc defines (checked against it where it is installed,
        # else against the glibc-only names the library is known to have imported). musl's loader
        # answers the names glibc 2.17 split libc into (libpthread, libdl, librt, libm) with its
        # own libc, as it does libc.so.6.
        needed=$(readelf -d "$out/$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -Ev '^lib(c|pthread|dl|rt|m)\.so' | tr '\n' ' ' || true)
        if [ -z "$needed" ]; then
            check "$out/$so needed" 1 "only libc (and the parts glibc 2.17 split from it)"
        else
            check "$out/$so needed" 0 "names besides libc: $needed"
        fi
        # Every process of a node loads what the stage needs, pin or not: libc alone (a libdl.so.2
        # for dlopen cost about 45 us per exec; the stage looks dlopen up when it loads).
        if [ $so = libpinguard-lazy.so ]; then
            all=$(readelf -d "$out/$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
            check "$out/$so needs libc alone" "$([ "$all" = "libc.so.6 " ] && echo 1 || echo 0)" "${all:-nothing}"
        fi
        strong=$(nm -D --undefined-only "$out/$so" | awk '$1 == "U" { sub(/@.*/, "", $2); print $2 }' | sort -u)
        musl=/lib/ld-musl-$arch.so.1
        if [ -e "$musl" ]; then
            lacking=$(comm -23 <(echo "$strong") <(nm -D --defined-only "$musl" | awk '{print $3}' | sort -u) | tr '\n' ' ')
            what="strong imports musl's libc ($musl) lacks"
        else
            lacking=$(echo "$strong" | grep -E '^(_Unwind_.*|__register_atfork|_dl_find_object)$' | tr '\n' ' ' || true)
            what="strong imports known to be glibc-only (musl is not installed here)"
        fi
        check "$out/$so musl imports" "$([ -z "$lacking" ] && echo 1 || echo 0)" "$what: ${lacking:-none}"
        # The library exports the declared hooks and C API; the stage the same names and its record.
        want=$declared
        [ $so = libpinguard.so ] || want=$(printf '%s\npinguard_front\n' "$declared" | sort -u)
        exported=$(nm -D --defined-only "$out/$so" | awk '{print $3}' | sed 's/@.*//' | sort -u)
        extra=$(comm -23 <(echo "$exported") <(echo "$want") | tr '\n' ' ')
        missing=$(comm -13 <(echo "$exported") <(echo "$want") | tr '\n' ' ')
        detail="the declared hooks and C API ($(echo "$exported" | wc -l) symbols)"
        [ -z "$extra$missing" ] || detail="${extra:+not declared: $extra}${missing:+declared, not exported: $missing}"
        check "$out/$so exports" "$([ -z "$extra$missing" ] && echo 1 || echo 0)" "$detail"
    done
    name=pinguard-$version-$arch-linux-gnu
    stage=$(mktemp -d)
    mkdir -p "$stage/$name/bin" "$stage/$name/lib" "$stage/$name/include"
    cp "$out/pinguard" "$stage/$name/bin/"
    cp "$out/libpinguard.so" "$out/libpinguard-lazy.so" "$stage/$name/lib/"
    cp include/pinguard.h "$stage/$name/include/"
    cp README.md LICENSE-MIT LICENSE-APACHE "$stage/$name/"
    tar -C "$stage" -czf "target/release-artifacts/$name.tar.gz" "$name"
    rm -rf "$stage"
    echo "built target/release-artifacts/$name.tar.gz"
done
exit $fail
