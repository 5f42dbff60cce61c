#!/usr/bin/env python3
"""Counts the locked atomic instructions a callgrind run executed.

Usage: cglock.py [--json] [--top N] [--functions] [--check] CALLGRIND_OUT...

Each CALLGRIND_OUT must come from `valgrind --tool=callgrind
--dump-instr=yes` (one file per thread with --separate-threads=yes). For
every file it prints the total Ir (instructions executed) and the Ir of
locked instructions: those with a `lock` prefix, and `xchg` with a memory
operand (implicitly locked). Locked instructions are found with
`objdump -d` of each object (`ob=`) the file names; callgrind's
instruction addresses are the objects' link-time addresses, the same
addresses objdump prints. Only user space is counted (callgrind does not
see the kernel); objects that are not files (the vDSO) are skipped. The
JSON form also carries every event's total from the file's header
(`events`), such as the simulated L1 data cache misses `D1mr` and `D1mw`
of a run with `--cache-sim=yes`.

--json   one JSON object per file instead of a text line.
--top N  also list the N most executed locked instructions.
--functions  also give each function's self Ir (instructions executed in
         the function's own code, inlined callees included, calls to
         functions that were not inlined excluded), the unit of the
         per-function tables of benches/instructions.sh, and each
         layer's (`layers`): the Ir of the workspace crate whose source
         ran (executor, engine, device, the bench in cli, the io-uring
         crate). Code of std, core, alloc or another crate inlined into a
         function counts for the workspace source line just before it in
         that function's code (an inlined helper sits among its caller's
         instructions), else for the function's crate; glibc's functions
         are `libc`. The same by workspace source file (`source_files`,
         `engine/src/flush.rs`): the steps of one IO's path.
         With --cache-sim=yes it also gives the simulated L1 data cache
         misses (D1mr + D1mw) by function and source line (`misses`,
         "FUNCTION @ FILE:LINE", the file being the inlined callee's where
         code was inlined): which line of the path fetches each cache line
         again.
--check  also check that the executed addresses of each object are
         instruction starts in objdump's listing (validates the matching;
         slower).

The callgrind out format, as far as it matters here: `ob=`, `fl=`, `fi=`,
`fe=`, `fn=` (and their `c` forms) compress names as `(id) name` the first
time and `(id)` later; cost lines start with one sub-position per entry of
`positions:` (`0x…`, `+N`/`-N` relative to the previous cost line's
position, `*` the same), then one count per entry of `events:` (missing
trailing counts are 0); the line after `calls=`/`jump=`/`jcnd=` carries the
cost of the call (inclusive, at the call site), not self cost, but still
moves the position. Standard library only.
"""

import json
import os
import re
import subprocess
import sys
from collections import defaultdict

# Which name table each key compresses into (files share one table).
TABLE_OF = {
    "ob": "ob", "cob": "ob",
    "fn": "fn", "cfn": "fn",
    "fl": "fl", "fi": "fl", "fe": "fl", "cfi": "fl", "cfl": "fl",
}
NAME_KEYS = set(TABLE_OF)
# objdump -d --no-show-raw-insn: "  4a3b2c:\tlock cmpxchg %rdx,(%rdi)"
INSN = re.compile(r"^\s*([0-9a-f]+):\s+(.*)$")

_listing_cache = {}


def objdump_listing(path, want_all):
    """(locked: {addr: text}, starts: set of instruction addresses or None)."""
    key = (path, want_all)
    if key in _listing_cache:
        return _listing_cache[key]
    locked = {}
    starts = set() if want_all else None
    try:
        proc = subprocess.Popen(
            ["objdump", "-d", "--no-show-raw-insn", "-w", path],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            errors="replace",
        )
    except OSError as e:
        sys.exit(f"cglock: cannot run objdump: {e}")
    for line in proc.stdout:
        if want_all:
            m = INSN.match(line)
            if not m:
                continue
            addr, text = int(m.group(1), 16), m.group(2).strip()
            starts.add(addr)
        else:
            # Fast path: only lines that can be locked instructions.
            if "lock" not in line and "xchg" not in line:
                continue
            m = INSN.match(line)
            if not m:
                continue
            addr, text = int(m.group(1), 16), m.group(2).strip()
        if is_locked(text):
            locked[addr] = text
    proc.wait()
    _listing_cache[key] = (locked, starts)
    return locked, starts


def is_locked(text):
    """True for a lock-prefixed instruction or xchg with a memory operand."""
    mnemonic, _, operands = text.partition(" ")
    if mnemonic == "lock" or mnemonic.startswith("lock"):
        return True
    if mnemonic.startswith("xchg") and "(" in operands:
        return True
    return False


def parse_number(tok):
    return int(tok, 16) if tok.startswith(("0x", "0X")) else int(tok)


def parse(path):
    """Self Ir per (object, address) and per (object, address) -> function."""
    positions = ["line"]
    events = None
    names = {"ob": {}, "fn": {}, "fl": {}}
    cur = {"ob": "", "fn": ""}
    last = None  # previous position tuple
    skip_next_cost = False
    cost = defaultdict(int)  # (ob, addr) -> Ir
    # (fn, file, line) -> simulated L1D misses, where the events have them
    misses = defaultdict(int)
    # (fn, address) -> [file, Ir]: which source file's code ran where
    ir_by_source = {}
    miss_idx = None
    cur_fl, cur_file = "", ""
    fn_of = {}
    thread = None
    total_header = None
    summary = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            c = line[0]
            if c.isdigit() or c in "+-*" or line.startswith("0x"):
                parts = line.split()
                npos = len(positions)
                pos = []
                for i, tok in enumerate(parts[:npos]):
                    prev = last[i] if last else 0
                    if tok == "*":
                        pos.append(prev)
                    elif tok[0] == "+":
                        pos.append(prev + parse_number(tok[1:]))
                    elif tok[0] == "-":
                        pos.append(prev - parse_number(tok[1:]))
                    else:
                        pos.append(parse_number(tok))
                last = pos
                if skip_next_cost:
                    skip_next_cost = False
                    continue
                vals = parts[npos:]
                ir = parse_number(vals[0]) if vals else 0
                if miss_idx and len(pos) > 1:
                    d1 = sum(parse_number(vals[i]) for i in miss_idx if i < len(vals))
                    if d1:
                        misses[(cur["fn"], cur_file, pos[1])] += d1
                if ir:
                    src = ir_by_source.setdefault((cur["fn"], pos[0]), [cur_file, 0])
                    src[1] += ir
                    addr = pos[0]
                    k = (cur["ob"], addr)
                    cost[k] += ir
                    fn_of.setdefault(k, cur["fn"])
                continue
            key, sep, value = line.partition("=")
            if sep and key in NAME_KEYS:
                value = value.strip()
                table = names[TABLE_OF[key]]
                m = re.match(r"^\((\d+)\)\s*(.*)$", value)
                if m:
                    ident, name = m.group(1), m.group(2)
                    if name:
                        table[ident] = name
                    else:
                        name = table.get(ident, f"({ident})")
                else:
                    name = value
                if key in ("ob", "fn"):
                    cur[key] = name
                if key == "fn":
                    cur_file = cur_fl
                elif key == "fl":
                    cur_fl = cur_file = name
                elif key in ("fi", "fe"):
                    cur_file = name
                continue
            if sep and key in ("calls", "jump", "jcnd"):
                skip_next_cost = True
                continue
            if line.startswith("positions:"):
                positions = line.split(":", 1)[1].split()
            elif line.startswith("events:"):
                events = line.split(":", 1)[1].split()
                miss_idx = [i for i, e in enumerate(events) if e in ("D1mr", "D1mw")]
            elif line.startswith("thread:"):
                thread = line.split(":", 1)[1].strip()
            elif line.startswith(("summary:", "totals:")):
                summary = [int(v) for v in line.split(":", 1)[1].split()]
                total_header = summary[0]
    if "instr" not in positions[:1]:
        sys.exit(f"cglock: {path} has no instruction positions: run callgrind with --dump-instr=yes")
    if events and events[0] != "Ir":
        sys.exit(f"cglock: {path}: first event is {events[0]}, expected Ir")
    # Every event's total (Ir, and with --cache-sim=yes the simulated cache
    # events such as D1mr and D1mw), from the header.
    totals = dict(zip(events or ["Ir"], summary or []))
    return cost, fn_of, thread, total_header, totals, misses, ir_by_source


# The layer of a source file of this workspace (by its crate's directory),
# checked in order; None for code of other crates and the standard library.
LAYER_OF_PATH = [
    ("/executor/src/", "executor"),
    ("/engine/src/", "engine"),
    ("/device/src/", "device"),
    ("/cli/src/", "bench (cli)"),
    ("/io-uring-", "io-uring crate"),
]
# The layer of a function, by the first workspace crate its name mentions
# (`<plugio_engine::device::BioFuture as core::future::Future>::poll` is
# the engine's), for code that came from elsewhere (std, core, alloc and
# other crates inlined into it).
LAYER_OF_CRATE = {
    "plugio_executor": "executor",
    "plugio_engine": "engine",
    "plugio_device": "device",
    "plugio": "bench (cli)",
    "plugio_cli": "bench (cli)",
    "io_uring": "io-uring crate",
}


def path_layer(path):
    """The layer of a workspace source file, else None."""
    for part, layer in LAYER_OF_PATH:
        if part in path:
            return layer
    return None


def fn_layer(fn):
    """The layer of a function by the crate its name mentions first, else
    libc (glibc's own functions: memcpy, malloc) or other."""
    m = re.search(r"\b(plugio(?:_[a-z]+)?|io_uring)::", fn)
    if m and m.group(1) in LAYER_OF_CRATE:
        return LAYER_OF_CRATE[m.group(1)]
    if fn.startswith(("__", "_int_", "malloc", "free", "cfree")):
        return "libc"
    return "other"


def workspace_file(path):
    """`crate/src/file.rs` for a workspace source file (the io-uring
    crate's as `io-uring/src/file.rs`), else None."""
    for part, _ in LAYER_OF_PATH:
        i = path.find(part)
        if i >= 0:
            rest = path[i + 1:]
            if part == "/io-uring-":
                rest = "io-uring/" + rest.split("/", 1)[1]
            return rest
    return None


def by_source(ir_by_source, key):
    """Ir per `key(path)` of workspace source files (see `layers`); code
    of std, core, alloc or another crate (inlined helpers) counts for the
    workspace line just before it in the same function's code (by address:
    an inlined helper sits in the code of its caller), else for the
    function's crate."""
    per_fn = defaultdict(list)
    for (fn, addr), (path, ir) in ir_by_source.items():
        per_fn[fn].append((addr, path, ir))
    out = defaultdict(int)
    for fn, rows in per_fn.items():
        rows.sort()
        last = None
        for _, path, ir in rows:
            last = key(path) or last
            out[last or fn_layer(fn)] += ir
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def layers(ir_by_source):
    """Ir per layer (workspace crate) of the code that ran."""
    return by_source(ir_by_source, path_layer)


def source_files(ir_by_source):
    """Ir per workspace source file of the code that ran."""
    return by_source(ir_by_source, workspace_file)


def analyse(path, top, check, functions=False):
    cost, fn_of, thread, total_header, totals, misses, ir_by_source = parse(path)
    per_ob = defaultdict(lambda: [0, 0])  # ob -> [Ir, locked Ir]
    locked_rows = []
    unmatched = 0
    for (ob, addr), ir in cost.items():
        per_ob[ob][0] += ir
    for ob in per_ob:
        if not ob or not os.path.isfile(ob):
            continue
        locked, starts = objdump_listing(ob, check)
        for (o, addr), ir in cost.items():
            if o != ob:
                continue
            if starts is not None and addr not in starts:
                unmatched += ir
            text = locked.get(addr)
            if text is not None:
                per_ob[ob][1] += ir
                locked_rows.append((ir, ob, addr, fn_of[(o, addr)], text))
    total = sum(v[0] for v in per_ob.values())
    locked_total = sum(v[1] for v in per_ob.values())
    locked_rows.sort(reverse=True)
    result = {
        "file": path,
        "thread": thread,
        "ir": total,
        "ir_header": total_header,
        "events": totals,
        "locked": locked_total,
        "objects": {ob: {"ir": v[0], "locked": v[1]} for ob, v in sorted(per_ob.items())},
        "top_locked": [
            {"ir": ir, "object": os.path.basename(ob), "addr": hex(addr), "fn": fn, "insn": text}
            for ir, ob, addr, fn, text in locked_rows[:top]
        ],
    }
    if check:
        result["ir_not_at_instruction_start"] = unmatched
    if functions:
        per_fn = defaultdict(int)
        for k, ir in cost.items():
            per_fn[fn_of[k]] += ir
        result["functions"] = dict(sorted(per_fn.items(), key=lambda kv: -kv[1]))
        result["layers"] = layers(ir_by_source)
        result["source_files"] = source_files(ir_by_source)
        if misses:
            result["misses"] = {
                f"{fn} @ {'/'.join(fl.split('/')[-3:])}:{line}": n
                for (fn, fl, line), n in sorted(misses.items(), key=lambda kv: -kv[1])
            }
    return result


def main(argv):
    as_json, top, check, functions, files = False, 0, False, False, []
    it = iter(argv)
    for a in it:
        if a == "--json":
            as_json = True
        elif a == "--top":
            top = int(next(it))
        elif a == "--check":
            check = True
        elif a == "--functions":
            functions = True
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            files.append(a)
    if not files:
        print(__doc__, file=sys.stderr)
        return 2
    for path in files:
        r = analyse(path, top, check, functions)
        if as_json:
            print(json.dumps(r))
            continue
        line = f"{path}: thread {r['thread']} Ir {r['ir']} locked {r['locked']}"
        if check:
            line += f" (Ir at non-instruction addresses: {r['ir_not_at_instruction_start']})"
        print(line)
        for row in r["top_locked"]:
            print(f"  {row['ir']:>12} {row['object']} {row['addr']} {row['insn']}  [{row['fn']}]")
        for name, ir in list(r.get("functions", {}).items())[:top or 20]:
            print(f"  {ir:>12} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
