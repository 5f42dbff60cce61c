#!/usr/bin/env python3
"""Instructions and locked instructions per cycle from two callgrind runs.

Usage (see wake_cycles.rs):
  valgrind --tool=callgrind --dump-instr=yes --compress-pos=no \
      --compress-strings=no --callgrind-out-file=cg.N1 BINARY N1 MODE T
  (same for N2)
  python3 cglock.py BINARY cg.N1 cg.N2 CYCLES2_MINUS_CYCLES1

Per-address self counts of the two runs are differenced (setup cancels
out) and matched against `objdump -d BINARY` for `lock`-prefixed
instructions and `xchg` with a memory operand (implicitly locked).
Addresses are compared as offsets in BINARY (valgrind loads this PIE at
its link address, checked against the symbol table).
"""
import collections
import re
import subprocess
import sys


def load(path, binary):
    cost, fn_of = collections.Counter(), {}
    ob = fn = None
    skip = False
    with open(path) as f:
        for line in f:
            if line.startswith("ob="):
                ob = line[3:].strip()
            elif line.startswith("fn="):
                fn = line[3:].strip()
            elif line.startswith("calls="):
                skip = True  # the next cost line is the call's inclusive cost
            elif line.startswith("0x"):
                if skip:
                    skip = False
                    continue
                parts = line.split()
                if ob and ob.endswith(binary.split("/")[-1]):
                    addr = int(parts[0], 16)
                    cost[addr] += int(parts[2])
                    fn_of[addr] = fn
    return cost, fn_of


def total(path):
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def locked(binary):
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", binary],
                         capture_output=True, text=True, check=True).stdout
    res = {}
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(.*)", line)
        if m:
            ins = m.group(2)
            if ins.startswith("lock ") or (ins.startswith("xchg") and "(" in ins):
                res[int(m.group(1), 16)] = ins
    return res


def main():
    binary, f1, f2, cycles = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    c1, n1 = load(f1, binary)
    c2, n2 = load(f2, binary)
    locks = locked(binary)
    by_fn = collections.Counter()
    lock_total = 0
    for addr in set(c1) | set(c2):
        d = c2[addr] - c1[addr]
        by_fn[n2.get(addr) or n1.get(addr)] += d
        if addr in locks and d:
            lock_total += d
            print(f"  {d / cycles:6.3f}/cycle  {locks[addr]:36s} {n2.get(addr) or n1.get(addr)}")
    print(f"Ir/cycle (whole process): {(total(f2) - total(f1)) / cycles:.1f}")
    print(f"Ir/cycle (binary only):   {sum(by_fn.values()) / cycles:.1f}")
    print(f"locked instructions/cycle: {lock_total / cycles:.3f}")
    print("self Ir/cycle by function (>= 0.5):")
    for name, d in by_fn.most_common():
        if d / cycles >= 0.5:
            print(f"  {d / cycles:7.2f}  {name[:100]}")


main()
