#!/usr/bin/env python3
"""Checks the {{#include}} links of an mdBook's sources without building it:
every included file must exist and every named anchor must be present with
both `ANCHOR: name` and `ANCHOR_END: name` and must not be empty (mdbook
itself only logs a missing file and silently includes nothing for a
missing anchor). Escaped links (\\{{#include ...}}) are skipped.

Usage: book/tools/check-includes.py BOOK_SRC_DIR   (exit 1 on a problem)
"""
import os
import re
import sys

LINK = re.compile(r"(?<!\\)\{\{#(?:include|rustdoc_include)\s+([^}\s]+)\s*\}\}")


def check_anchor(path, anchor):
    lines = open(path, encoding="utf-8").read().splitlines()
    start = [i for i, l in enumerate(lines) if re.search(rf"ANCHOR:\s*{re.escape(anchor)}\s*$", l)]
    end = [i for i, l in enumerate(lines) if re.search(rf"ANCHOR_END:\s*{re.escape(anchor)}\s*$", l)]
    if len(start) != 1 or len(end) != 1:
        return f"anchor '{anchor}': {len(start)} ANCHOR and {len(end)} ANCHOR_END lines (need 1 each)"
    body = [l for l in lines[start[0] + 1:end[0]] if "ANCHOR" not in l]
    if not any(l.strip() for l in body):
        return f"anchor '{anchor}' is empty"
    return None


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    problems, count = [], 0
    for dirpath, _, files in os.walk(sys.argv[1]):
        for name in sorted(files):
            if not name.endswith(".md"):
                continue
            md = os.path.join(dirpath, name)
            for link in LINK.findall(open(md, encoding="utf-8").read()):
                count += 1
                file, _, anchor = link.partition(":")
                target = os.path.normpath(os.path.join(dirpath, file))
                if not os.path.isfile(target):
                    problems.append(f"{md}: {link}: no file {target}")
                elif anchor and not re.fullmatch(r"[0-9:]*", anchor):
                    why = check_anchor(target, anchor)
                    if why:
                        problems.append(f"{md}: {link}: {why}")
    for p in problems:
        print(f"BROKEN INCLUDE: {p}")
    print(f"{count} includes checked, {len(problems)} broken")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
