#!/usr/bin/env python3
"""Assembles pinguard's wheel for one architecture from release artifacts (scripts/release.sh):
the Python package of python/pinguard, with the preload library and the command under
pinguard/_bin/. Standard library only; the tag is manylinux2014 (glibc 2.17), which is what the
artifacts were built and checked against.

    scripts/wheel.py ARCH ARTIFACTS_DIR OUT_DIR      (ARCH: x86_64 or aarch64)
"""

import base64
import hashlib
import os
import re
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def version():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        return re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("x86_64", "aarch64"):
        sys.stderr.write(__doc__)
        return 2
    arch, artifacts, out = sys.argv[1:]
    ver = version()
    tags = ["py3-none-manylinux_2_17_%s" % arch, "py3-none-manylinux2014_%s" % arch]
    name = "pinguard-%s-py3-none-manylinux_2_17_%s.manylinux2014_%s.whl" % (ver, arch, arch)
    dist = "pinguard-%s.dist-info" % ver
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    files = []  # (path in wheel, bytes, mode)
    pkg = os.path.join(ROOT, "python", "pinguard")
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py"):
            with open(os.path.join(pkg, fn), "rb") as f:
                files.append(("pinguard/" + fn, f.read(), 0o644))
    for fn in ("libpinguard.so", "pinguard"):
        p = os.path.join(artifacts, fn)
        if not os.path.isfile(p):
            sys.stderr.write("wheel.py: %s is missing (run scripts/release.sh first)\n" % p)
            return 1
        with open(p, "rb") as f:
            files.append(("pinguard/_bin/" + fn, f.read(), 0o755))
    with open(os.path.join(ROOT, "include", "pinguard.h"), "rb") as f:
        files.append(("pinguard/include/pinguard.h", f.read(), 0o644))
    # The licence texts, where PEP 639 puts them (dist-info/licenses/).
    for fn in ("LICENSE-MIT", "LICENSE-APACHE"):
        with open(os.path.join(ROOT, fn), "rb") as f:
            files.append((dist + "/licenses/" + fn, f.read(), 0o644))
    metadata = "\n".join([
        "Metadata-Version: 2.1",
        "Name: pinguard",
        "Version: " + ver,
        "Summary: Tracks, budgets and reports host-pinned memory (CUDA, Ascend ACL, mlock) in GPU and NPU processes",
        "License: MIT OR Apache-2.0",
        "License-File: LICENSE-MIT",
        "License-File: LICENSE-APACHE",
        "Requires-Python: >=3.7",
        "Description-Content-Type: text/markdown",
        "",
        readme,
    ])
    wheel = "\n".join(["Wheel-Version: 1.0", "Generator: pinguard scripts/wheel.py", "Root-Is-Purelib: false"] + ["Tag: " + t for t in tags]) + "\n"
    # pytest11: pytest loads the plugin in any environment the wheel is installed in; it acts only
    # when asked (`--pinguard`, or its markers in a process under pinguard).
    entry = "[console_scripts]\npinguard = pinguard.__main__:main\n\n[pytest11]\npinguard = pinguard.pytest_plugin\n"
    files += [(dist + "/METADATA", metadata.encode(), 0o644), (dist + "/WHEEL", wheel.encode(), 0o644), (dist + "/entry_points.txt", entry.encode(), 0o644)]
    record = []
    for path, data, _ in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    record.append(dist + "/RECORD,,")
    files.append((dist + "/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    os.makedirs(out, exist_ok=True)
    target = os.path.join(out, name)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data, mode in files:
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16  # a regular file with these permissions
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
