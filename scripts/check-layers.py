#!/usr/bin/env python3
"""The library's layout rules (CONTRIBUTING.md, "Where things are"), checked on the source:

- at most eight `.rs` files directly in `src/`;
- a stage imports only from the stages before it in STAGES (and from `api`, the vocabulary of
  entry points that every stage shares); only the composition layer imports from everywhere;
- no import circle between two modules of the library, the composition layer's early hooks
  (exit, signals, dlclose) and lifecycle excepted (the start-up code finds their real functions,
  and they ask it whether pinguard is on), nor between two modules of the CLI (`cli/src`).

Prints one line per broken rule and exits 1, or prints a summary and exits 0.
"""
import collections
import glob
import os
import re
import sys

STAGES = ["runtime", "capture", "accounting", "budget", "output"]
SHARED = {"api"}
# Circles allowed inside the composition layer (see the docstring): the constructor finds the real
# functions of the hooks that run before any pin (exit, signals, dlclose), which ask it whether
# pinguard is set up.
ALLOWED_CYCLES = [{"hooks::dlclose", "hooks::exit", "hooks::signal", "lifecycle"}]

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
files = sorted(glob.glob(os.path.join(root, "**", "*.rs"), recursive=True))


def module(path, root=root):
    """`a::b` for `root/a/b.rs` and `root/a/b/mod.rs`."""
    rel = os.path.relpath(path, root)[:-3]
    if rel.endswith("/mod"):
        rel = rel[: -len("/mod")]
    return rel.replace("/", "::")


mods = {module(f) for f in files}
problems = []

top = [f for f in os.listdir(root) if f.endswith(".rs")]
if len(top) > 8:
    problems.append(f"src/ holds {len(top)} .rs files directly (at most 8): {', '.join(sorted(top))}")

def graph(files, mods, module):
    """Which module imports which (`crate::a::b` paths), unit tests left out."""
    edges = collections.defaultdict(set)
    for f in files:
        m = module(f)
        text = open(f, encoding="utf-8").read()
        # Unit tests may reach anywhere.
        text = re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0]
        targets = set()
        for a, b in re.findall(r"crate::([a-z_]+)(?:::([a-z_]+))?", text):
            targets.add(f"{a}::{b}" if b and f"{a}::{b}" in mods else a)
        for a, inner in re.findall(r"crate::([a-z_]+)::\{([^}]*)\}", text):
            for item in inner.split(","):
                name = item.strip().split("::")[0]
                if f"{a}::{name}" in mods:
                    targets.add(f"{a}::{name}")
        for t in targets:
            if t in mods and t != m:
                edges[m].add(t)
    return edges


edges = graph(files, mods, module)

for m, ts in sorted(edges.items()):
    stage = m.split("::")[0]
    if stage not in STAGES:
        continue  # the composition layer
    for t in sorted(ts):
        other = t.split("::")[0]
        if other == stage or other in SHARED:
            continue
        if other not in STAGES or STAGES.index(other) > STAGES.index(stage):
            problems.append(f"{m} imports {t}: {stage} may import only from {', '.join(STAGES[: STAGES.index(stage)]) or 'no other stage'}")

def circles(mods, edges):
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(mods):
        if v not in index:
            visit(v)
    return comps


for c in circles(mods, edges):
    if c not in ALLOWED_CYCLES:
        problems.append(f"import circle: {' -> '.join(sorted(c))}")

# The CLI: no import circle between its modules either.
cli_root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli", "src")
cli_files = sorted(glob.glob(os.path.join(cli_root, "**", "*.rs"), recursive=True))


def cli_module(path):
    return module(path, cli_root)


cli_mods = {cli_module(f) for f in cli_files}
cli_edges = graph(cli_files, cli_mods, cli_module)
for c in circles(cli_mods, cli_edges):
    problems.append(f"import circle in the CLI: {' -> '.join(sorted(c))}")

for p in problems:
    print(f"check-layers: {p}")
if problems:
    sys.exit(1)
print(f"check-layers: {len(mods)} modules, {sum(len(v) for v in edges.values())} imports, {len(top)} files directly in src/: every stage imports only from the ones before it, no circle; the CLI's {len(cli_mods)} modules, no circle")
