#!/usr/bin/env python3
"""Prints the symbols libpinguard.so exports, one a line: every row of the entry-point tables
(the `hooks!` and `hand_hooks!` invocations in src/hooks/, one row per hook: `fn name(...`) and
every function the C header include/pinguard.h declares. tests/load.rs and scripts/release.sh
compare the built library's dynamic symbols with this list, both ways.

    scripts/exports.py [--families]   (--families: "file name" per table row, then the C API)
"""
import glob
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TABLE = re.compile(r"^(hooks|hand_hooks)! \{$")
ROW = re.compile(r"^\s*fn\s+([A-Za-z_][A-Za-z0-9_]*)\(")
C_API = re.compile(r"\b(pinguard_[a-z_]+)\(")

rows = []
for path in sorted(glob.glob(os.path.join(root, "src", "hooks", "*.rs"))):
    inside = False
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if TABLE.match(line):
            inside = True
        elif inside and line == "}":
            inside = False
        elif inside and ROW.match(line):
            rows.append((os.path.basename(path)[:-3], ROW.match(line).group(1)))
header = open(os.path.join(root, "include", "pinguard.h"), encoding="utf-8").read()
header = re.sub(r"/\*.*?\*/|//[^\n]*", "", header, flags=re.S)  # declarations, not comments
c_api = sorted(set(C_API.findall(header)))

names = [n for _, n in rows] + c_api
if len(set(names)) != len(names):
    sys.exit("exports.py: a name is declared twice: %s" % sorted({n for n in names if names.count(n) > 1}))
if not rows or not c_api:
    sys.exit("exports.py: no table rows or no C API found (has the tables' layout changed?)")
for family, name in rows:
    print("%s %s" % (family, name) if "--families" in sys.argv else name)
for name in c_api:
    print("capi %s" % name if "--families" in sys.argv else name)
