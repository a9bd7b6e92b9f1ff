#!/usr/bin/env python3
"""Removes the DT_NEEDED entries naming glibc's loader (ld-linux-*.so.*) from a shared library,
in place, and prints what it removed.

The library needs the loader only for `__tls_get_addr`. glibc's loader is in every glibc process
anyway, and glibc checks a version requirement against every loaded object, so the entry changes
nothing there; a musl loader, which defines `__tls_get_addr` itself, fails the whole program over
a file it cannot find (docs/internals.md, "musl processes"). build.rs keeps the entry out of
gcc-linked builds; scripts/release.sh runs this on the zig-linked ones.
    scripts/drop_loader_needed.py LIB
"""
import struct
import sys

DT_NULL, DT_NEEDED, DT_STRTAB = 0, 1, 5
PT_LOAD, PT_DYNAMIC = 1, 2


def main(path):
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            sys.exit(f"{path}: not a little-endian 64-bit ELF file")
        phoff, = struct.unpack_from("<Q", data, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        loads, dyn = [], None
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
                "<IIQQQQQQ", data, phoff + i * phentsize)
            if p_type == PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == PT_DYNAMIC:
                dyn = (p_offset, p_filesz)
        if dyn is None:
            sys.exit(f"{path}: no dynamic section")

        def offset(vaddr):
            for v, o, n in loads:
                if v <= vaddr < v + n:
                    return vaddr - v + o
            sys.exit(f"{path}: address {vaddr:#x} in no loaded segment")

        entries = []
        for at in range(dyn[0], dyn[0] + dyn[1], 16):
            tag, val = struct.unpack_from("<qQ", data, at)
            entries.append((tag, val))
            if tag == DT_NULL:
                break
        strtab = offset(next(v for t, v in entries if t == DT_STRTAB))

        def name(off):
            end = data.index(b"\0", strtab + off)
            return data[strtab + off:end].decode()

        kept = [(t, v) for t, v in entries
                if not (t == DT_NEEDED and name(v).startswith("ld-linux"))]
        for t, v in entries:
            if (t, v) not in kept:
                print(f"{path}: dropped DT_NEEDED {name(v)}")
        # The array keeps its size: the entries removed become DT_NULL at its end.
        kept += [(DT_NULL, 0)] * (len(entries) - len(kept))
        for i, (t, v) in enumerate(kept):
            struct.pack_into("<qQ", data, dyn[0] + 16 * i, t, v)
        f.seek(0)
        f.write(data)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    main(sys.argv[1])
