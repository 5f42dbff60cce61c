#!/usr/bin/env python3
"""Instructions per IO from pairs of callgrind runs (benches/fio-engine/instructions.sh).

    callgrind_per_io.py DIR N

DIR holds ENGINE-WORKLOAD-IOS.out (callgrind, with or without
--dump-instr=yes) and .json (fio) for IOS = N and 3N. Per IO = (cost at 3N
- cost at N) / 2N, so fio's start-up cancels out. Prints a markdown table
by object, with the locked instructions per IO of the whole process when
the runs were made with --dump-instr=yes (counted by
benches/tools/cglock.py), then the plugio engine library's functions with
the most instructions per IO.
"""

import collections
import json
import os
import re
import sys

COST = re.compile(r"^[0-9+\-*]")


def self_costs(path):
    """Self instruction counts by (object, function)."""
    names = {}
    costs = collections.Counter()
    ob = fn = "?"
    after_calls = False
    # Sub-positions before the counts: `line`, or `instr line` with
    # --dump-instr=yes.
    nr_positions = 1

    def name(kind, rest):
        m = re.match(r"\((\d+)\)(?: (.*))?", rest)
        if not m:
            return rest
        key = (kind, m.group(1))
        if m.group(2) is not None:
            names[key] = m.group(2)
        return names.get(key, rest)

    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("positions:"):
                nr_positions = len(line.split()) - 1
            elif line.startswith("ob="):
                ob = name("ob", line[3:])
            elif line.startswith("fn="):
                fn = name("fn", line[3:])
            elif line.startswith(("cob=", "cfi=", "cfl=")):
                kind = "ob" if line.startswith("cob=") else "fl"
                name(kind, line.split("=", 1)[1])
            elif line.startswith("cfn="):
                name("fn", line[4:])
            elif line.startswith("calls="):
                after_calls = True
            elif COST.match(line):
                if after_calls:
                    after_calls = False  # inclusive cost of the call
                    continue
                parts = line.split()
                if len(parts) > nr_positions:
                    costs[(ob, fn)] += int(parts[nr_positions])
    return costs


def crate_of(fn):
    """Which part of the engine library a function belongs to."""
    for prefix, part in [
        ("plugio_engine", "plugio-engine (bio, plug, merge, tags, dispatch, completion)"),
        ("plugio_device", "plugio-device (ring, backend)"),
        ("plugio_executor", "plugio-executor (ticks, parks, wakers)"),
        ("plugio_fio", "the fio glue (C ABI, FioCore, IoSlots)"),
        ("<plugio_fio", "the fio glue (C ABI, FioCore, IoSlots)"),
        ("<plugio_engine", "plugio-engine (bio, plug, merge, tags, dispatch, completion)"),
        ("<plugio_device", "plugio-device (ring, backend)"),
        ("<plugio_executor", "plugio-executor (ticks, parks, wakers)"),
    ]:
        if fn.startswith(prefix):
            return part
    if fn.startswith("plugio_") and "::" not in fn:
        return "the fio glue (C ABI, FioCore, IoSlots)"
    if "poll_fn" in fn or "futures" in fn or "raw_waker" in fn or "Wake" in fn:
        return "wakers and poll_fn (std, futures; the glue's slot wakers)"
    return "other (std, alloc, io-uring crate)"


def short_ob(ob):
    base = os.path.basename(ob)
    if base.startswith("libplugio_fio"):
        return "plugio engine (libplugio_fio.so)"
    if base == "fio":
        return "fio"
    if base.startswith("libc"):
        return "libc"
    return base


def locked_ir(path):
    """Locked instructions the run executed (cglock.py), or None without
    --dump-instr=yes."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("positions:"):
                if "instr" not in line.split():
                    return None
                break
    tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools")
    sys.path.insert(0, tools)
    import cglock  # noqa: E402 (the project's tool, found next to this one)

    return cglock.analyse(path, 0, False)["locked"]


def main():
    d, n = sys.argv[1], int(sys.argv[2])
    rows = collections.OrderedDict()
    locked = {}
    plugio_fns = {}
    for workload in ["randread", "seqread"]:
        for engine in ["io_uring", "plugio"]:
            runs = []
            locks = []
            for ios in (n, 3 * n):
                base = os.path.join(d, f"{engine}-{workload}-{ios}")
                job = json.load(open(base + ".json"))["jobs"][0]
                if job["error"] or job["read"]["total_ios"] != ios:
                    sys.exit(f"{base}: error {job['error']}, {job['read']['total_ios']} IOs")
                runs.append(self_costs(base + ".out"))
                locks.append(locked_ir(base + ".out"))
            if None not in locks:
                locked[(workload, engine)] = (locks[1] - locks[0]) / (2 * n)
            diff = collections.Counter()
            for k in set(runs[0]) | set(runs[1]):
                diff[k] = runs[1][k] - runs[0][k]
            by_ob = collections.Counter()
            for (ob, _fn), c in diff.items():
                by_ob[short_ob(ob)] += c
            rows[(workload, engine)] = {k: v / (2 * n) for k, v in by_ob.items()}
            if engine == "plugio":
                plugio_fns[workload] = {
                    fn: c / (2 * n)
                    for (ob, fn), c in diff.items()
                    if short_ob(ob).startswith("plugio")
                }
    cols = ["fio", "plugio engine (libplugio_fio.so)", "libc"]
    lock_col = " locked instructions/IO (process) |" if locked else ""
    print("| workload | engine | total | " + " | ".join(cols) + " | other |" + lock_col)
    print("|---|---|---|" + "---|" * (len(cols) + 1) + ("---|" if locked else ""))
    for (workload, engine), obs in rows.items():
        total = sum(obs.values())
        other = total - sum(obs.get(c, 0) for c in cols)
        cells = [f"{round(obs.get(c, 0)):,}" for c in cols]
        lock_cell = f" {locked[(workload, engine)]:.2f} |" if locked else ""
        print(
            f"| {workload} | {engine} | {round(total):,} | "
            + " | ".join(cells)
            + f" | {round(other):,} |"
            + lock_cell
        )
    for workload, fns in plugio_fns.items():
        groups = collections.Counter()
        for fn, c in fns.items():
            groups[crate_of(fn)] += c
        print()
        print(f"plugio engine library, {workload}, instructions per IO by crate:")
        print()
        print("| part | instructions/IO |")
        print("|---|---|")
        for g, c in groups.most_common():
            print(f"| {g} | {c:,.0f} |")
    for workload, fns in plugio_fns.items():
        print()
        print(f"plugio engine library, {workload}, instructions per IO by function (self):")
        print()
        print("| function | instructions/IO |")
        print("|---|---|")
        for fn, c in sorted(fns.items(), key=lambda x: -x[1])[:15]:
            fn = fn.replace("|", "\\|")
            print(f"| `{fn[:110]}` | {c:,.0f} |")


if __name__ == "__main__":
    main()
