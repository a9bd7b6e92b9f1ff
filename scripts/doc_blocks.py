#!/usr/bin/env python3
"""The fenced code blocks of a Markdown page, in order, for scripts/walkthrough.sh.

    doc_blocks.py PAGE OUTDIR

Writes each block's text to OUTDIR/NN.LANG and one line per block to OUTDIR/blocks.tsv:
NN, the line its fence opens on, its language, what the walk-through does with it, the heading it
is under, and (for a block it does not run) why. What it does:

- run:   a ```sh block: run, in order, by scripts/walkthrough.sh
- skip:  a ```sh block whose first line is a comment "# needs ..." (a cluster, a registry): not
         run; the comment is the reason
- file:  a ```yaml block whose first line is a comment naming an absolute path ("# /etc/x.yml
         (excerpt)"): written to that path before the blocks after it run
- other: any other block (an excerpt of a manifest): not run

Exit status 2, with one line, on a fence left open or a page without a single ```sh block.
"""
import os
import re
import sys

FENCE = re.compile(r"^(`{3,})\s*([A-Za-z0-9_+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*\S)\s*$")
NEEDS = re.compile(r"^#\s*(needs\b.*\S)\s*$")
FILE = re.compile(r"^#\s*(/\S+)(\s.*)?$")


def blocks(lines):
    """(line number, language, heading, text) for every fenced block."""
    heading, i = "", 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        h = HEADING.match(lines[i])
        if h:
            heading = h.group(2)
        if not m:
            i += 1
            continue
        start, fence, lang, body = i + 1, m.group(1), m.group(2), []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"line {start}: a fence that is never closed")
        i += 1
        yield start, lang, heading, "".join(body)


def kind(lang, text):
    """What the walk-through does with a block, and why it does not run it."""
    first = text.split("\n", 1)[0].strip()
    if lang == "sh":
        m = NEEDS.match(first)
        return ("skip", m.group(1)) if m else ("run", "")
    if lang == "yaml" and FILE.match(first):
        return "file", FILE.match(first).group(1)
    return "other", f"a {lang or 'plain'} excerpt, not a command"


def main():
    if len(sys.argv) != 3:
        print("usage: doc_blocks.py PAGE OUTDIR", file=sys.stderr)
        return 2
    page, out = sys.argv[1:]
    with open(page, encoding="utf-8") as f:
        lines = f.readlines()
    os.makedirs(out, exist_ok=True)
    rows = []
    try:
        found = list(blocks(lines))
    except ValueError as e:
        print(f"doc_blocks.py: {page}: {e}", file=sys.stderr)
        return 2
    for n, (line, lang, heading, text) in enumerate(found, 1):
        what, why = kind(lang, text)
        with open(os.path.join(out, f"{n:02d}.{lang or 'txt'}"), "w", encoding="utf-8") as f:
            f.write(text)
        rows.append(f"{n:02d}\t{line}\t{lang or 'txt'}\t{what}\t{heading}\t{why}\n")
    if not any("\trun\t" in r for r in rows):
        print(f"doc_blocks.py: {page}: not one ```sh block to run", file=sys.stderr)
        return 2
    with open(os.path.join(out, "blocks.tsv"), "w", encoding="utf-8") as f:
        f.writelines(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
