#!/usr/bin/env bash
# Deterministic per-IO cost figures (issue #12): user-space instructions and
# locked atomic instructions per IO, counted by callgrind, so they do not
# depend on the machine's load.
#
# For each workload and engine, `plugio bench` runs twice under callgrind
# with a fixed IO count (`--number_ios N1`, then N2), pinned to one core
# (`taskset -c 0`), `--numjobs 1 --clat-sample 0` and `--iodepth 128` (32
# and 1 for seq-4k); no latency sampling: it is the bench's
# instrumentation, not the IO path, and would add two clock reads and a
# histogram record per read. The figures are
#     per IO = (count(N2) - count(N1)) / (N2 - N1)
# so setup and teardown cancel out. Counts are of the IO thread (callgrind
# --separate-threads=yes; the thread with the most instructions, the core
# or raw worker that issues and reaps every IO); the whole process's figure
# is printed next to it. Locked instructions are `lock`-prefixed ones and
# `xchg` with a memory operand, found by matching callgrind's per-address
# counts (--dump-instr=yes) with `objdump -d` (benches/tools/cglock.py).
# Only user space is counted: callgrind does not see the kernel.
# The runs also simulate the caches (--cache-sim=yes, which does not change
# the instruction counts): the IO thread's L1 data cache misses per IO
# (D1mr + D1mw, differenced the same way) count the cache lines its per-IO
# state makes it fetch again: with IOs in flight, each IO's bio, request,
# task and ring entries are touched again only after the other IOs', so
# state that does not fit the L1 is missed at every touch. The simulated
# geometry is valgrind's reading of this CPU (its cachegrind defaults),
# printed in table.md; the kernel's share (the page copy) is not seen.
# Where the IO thread's instructions go is differenced the same way per
# function (self instructions: a function's own code and what was inlined
# into it), written to DIR/WORKLOAD.ENGINE.functions.txt, the 12 largest
# of each plugio workload in table.md: run it before and after a hot-path
# change to see which step moved. The same instructions are summed by
# layer, the workspace crate whose source ran (engine, executor, device,
# the io-uring crate, the bench loop of cli; inlined std code counts for
# the workspace code it sits in), into DIR/WORKLOAD.ENGINE.layers.json and
# a table in table.md: what each layer of the path costs per IO, against
# the raw loop's whole; and by source file, the steps of the path
# (DIR/WORKLOAD.ENGINE.files.txt, the 15 largest in table.md). The L1D misses are split the same way by
# function and source line (DIR/WORKLOAD.ENGINE.misses.txt, the 10 largest
# in table.md): which line fetches which piece of per-IO state again.
#
# Workloads:
#   nop        --engine nop  vs  --engine raw --nop
#   cached-4k  4 KiB buffered random reads (--direct 0) of a 64 MiB file
#              read once beforehand (page-cached): --engine plugio vs raw
#   randrw-4k  4 KiB buffered random reads (70 %) and writes (30 %) of
#              that file, QD128: --engine plugio vs raw. With writes live,
#              plugio keeps its program order of overlapping IO (the
#              interval index over live requests) and the fast lane is
#              off. The only row that moves between runs (by about 2 %):
#              which IOs are live together depends on when the kernel
#              completes the writes.
#   seq-4k     sequential 4 KiB buffered reads of that file from 32 tasks
#              (--rw read --iodepth 32), which the plug merges into 128 KiB
#              requests: --engine plugio, against the raw loop issuing
#              those requests itself (--bs 128k --iodepth 1). Both rows
#              are per 4 KiB of data (the raw loop's count per IO / 32),
#              the unit of the merged-sequential goal of #12.
#
# Valgrind configuration: plugio engines run with `--idle-wait futex`.
# Valgrind runs one thread at a time under a lock that it releases only
# around syscalls it knows may block, and valgrind 3.19 does not mark
# io_uring_enter so: a plugio core idling in io_uring_enter(min_complete=1)
# keeps the lock, and the thread that would wake it (to spawn the job's
# tasks, or to shut down) never runs, so the run hangs after the header
# line. With `--idle-wait futex` a core with nothing in flight waits in a
# futex instead (valgrind releases the lock there); waits with IO in flight
# still enter the ring, so the measured per-IO path is the normal one. (The
# default, `--idle-wait auto`, picks futex under valgrind too; the script
# says it explicitly.) The raw loop never waits idle and runs as is.
#
# Uses the binary of `cargo build --release` (debug = 1 in the profile, so
# callgrind names functions). Prints every command it runs. Exits non-zero
# only when a run or the analysis fails, never because of a figure.
#
# Usage: benches/instructions.sh [--quick] [--out DIR] [--features LIST]
#   --quick   smaller IO counts (CI); default N1=20000, N2=60000
#   --features LIST  cargo features of the build (for example
#             plugio/trace-io: the cost of the per-IO tracing events
#             compiled in, with no subscriber)
#   --out DIR where the callgrind files and table.md go
#             (default target/instructions, or target/instructions-quick)
set -euo pipefail
cd "$(dirname "$0")/.."
N1=20000; N2=60000; OUT=""; QUICK=0; FEATURES=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; N1=4000; N2=12000 ;;
    --out) OUT=$2; shift ;;
    --features) FEATURES=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (use --quick, --out DIR, --features LIST)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$OUT" ] || OUT=target/instructions$([ "$QUICK" = 1 ] && echo -quick || true)
log() { printf '[instructions %s] %s\n' "$(date +%T)" "$*" >&2; }
show() { printf '+ %s\n' "$*" >&2; }
fail() { echo "instructions.sh: $*" >&2; exit 1; }

for tool in valgrind objdump python3 taskset; do
  command -v "$tool" >/dev/null || fail "$tool not found (apt-get install -y valgrind binutils util-linux python3)"
done
log "$(valgrind --version), $(objdump --version | head -1)"

FEATURE_ARGS=()
[ -z "$FEATURES" ] || FEATURE_ARGS=(--features "$FEATURES")
show cargo build --release --bin plugio "${FEATURE_ARGS[@]}"
cargo build --release --quiet --bin plugio "${FEATURE_ARGS[@]}"
# The build's target directory (CARGO_TARGET_DIR or a cargo config may
# move it from ./target).
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps 2>/dev/null | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
TARGET_DIR=${TARGET_DIR:-$PWD/target}
BIN=$TARGET_DIR/release/plugio

rm -rf "$OUT"
mkdir -p "$OUT"
DATA=$OUT/cached-64m.bin
show "head -c 64M /dev/urandom > $DATA && cat $DATA > /dev/null"
head -c $((64 << 20)) /dev/urandom > "$DATA"
cat "$DATA" > /dev/null # read once: the reads below hit the page cache

COMMON=(--numjobs 1 --clat-sample 0 --runtime 3600 --json --quiet)
ROWS=$OUT/rows.tsv
# The L1 data cache valgrind simulates here (from CPUID), for table.md.
D1_GEOMETRY=unknown
: > "$ROWS"

# run LABEL N bench-args...: one callgrind run; its per-thread files are
# $OUT/LABEL.N.out-NN.
run() {
  local label=$1 n=$2; shift 2
  local cmd=(taskset -c 0 valgrind --tool=callgrind --cache-sim=yes --separate-threads=yes --dump-instr=yes
    "--callgrind-out-file=$OUT/$label.$n.out" "$BIN" bench "$@" "${COMMON[@]}" --number_ios "$n")
  show "${cmd[*]}"
  local start=$SECONDS
  # SIGKILL: a valgrind stuck in a syscall it holds its lock over ignores
  # SIGTERM.
  if ! timeout -s KILL 900 "${cmd[@]}" > "$OUT/$label.$n.json" 2> "$OUT/$label.$n.log"; then
    tail -20 "$OUT/$label.$n.log" >&2
    fail "$label: the run with --number_ios $n failed or timed out (log: $OUT/$label.$n.log)"
  fi
  local ios
  ios=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ios"])' "$OUT/$label.$n.json") \
    || fail "$label: no JSON result in $OUT/$label.$n.json"
  [ "$ios" = "$n" ] || fail "$label: asked for $n IOs, the bench reports $ios"
  log "$label N=$n: $ios IOs in $((SECONDS - start)) s"
  local geometry
  geometry=$(sed -n 's/^desc: D1 cache: *//p' "$OUT/$label.$n.out"-* 2>/dev/null | head -1)
  [ -z "$geometry" ] || D1_GEOMETRY=$geometry
}

# measure WORKLOAD ENGINE bench-args...: per IO, or with PER_IO_DIV=K set,
# per K-th of an IO (the raw loop's 128 KiB reads counted per 4 KiB).
measure() {
  local workload=$1 engine=$2; shift 2
  local label="$workload.$engine"
  run "$label" "$N1" "$@"
  run "$label" "$N2" "$@"
  show "benches/tools/cglock.py --json $OUT/$label.{$N1,$N2}.out-*"
  benches/tools/cglock.py --json --top 40 --functions "$OUT/$label.$N1".out-* "$OUT/$label.$N2".out-* \
    > "$OUT/$label.cglock.jsonl" || fail "$label: cglock.py failed"
  python3 - "$OUT/$label.cglock.jsonl" "$N1" "$N2" "$workload" "$engine" "${PER_IO_DIV:-1}" >> "$ROWS" <<'PY' \
    || fail "$label: could not difference the runs"
import json, re, sys
path, n1, n2, workload, engine = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
div = int(sys.argv[6])
runs = {n1: {}, n2: {}}
for line in open(path):
    r = json.loads(line)
    m = re.search(r"\.(\d+)\.out-(\d+)$", r["file"])
    runs[int(m.group(1))][int(m.group(2))] = r
    # A check of the parsing: the self costs must add up to callgrind's total.
    if r["ir_header"] is not None and r["ir"] != r["ir_header"]:
        print(f"warning: {r['file']}: parsed Ir {r['ir']} != callgrind total {r['ir_header']}", file=sys.stderr)
if not runs[n1] or not runs[n2]:
    sys.exit("missing thread files")
# The IO thread: the one that executed the most instructions.
io = max(runs[n2], key=lambda t: runs[n2][t]["ir"])
if io not in runs[n1]:
    sys.exit(f"thread {io} missing in the N={n1} run")
def per_io(key, threads):
    a = sum(runs[n1][t][key] for t in threads if t in runs[n1])
    b = sum(runs[n2][t][key] for t in threads if t in runs[n2])
    return (b - a) / (n2 - n1) / div
def d1_per_io(t):
    ev = lambda n: runs[n][t]["events"]
    miss = lambda n: ev(n).get("D1mr", 0) + ev(n).get("D1mw", 0)
    return (miss(n2) - miss(n1)) / (n2 - n1) / div
# Which locked instructions the IO thread runs per IO (from the top lists).
before = {t["addr"]: t["ir"] for t in runs[n1][io]["top_locked"]}
with open(path.replace(".cglock.jsonl", ".locked.txt"), "w") as f:
    for t in runs[n2][io]["top_locked"]:
        d = (t["ir"] - before.get(t["addr"], 0)) / (n2 - n1) / div
        if d >= 0.005:
            f.write(f"{d:6.3f}  {t['insn'].split('#')[0].strip():32} {t['fn']}\n")
def write_differenced(key, suffix, least, fmt, width):
    """The IO thread's per-IO figures of `key` (a dict per run), the two
    runs differenced, those >= `least`, largest first, into the file named
    by `suffix`."""
    a, b = runs[n1][io].get(key, {}), runs[n2][io].get(key, {})
    rows = sorted(((b.get(k, 0) - a.get(k, 0)) / (n2 - n1) / div, k) for k in set(a) | set(b))
    with open(path.replace(".cglock.jsonl", suffix), "w") as f:
        for d, name in reversed(rows):
            if d >= least:
                f.write(f"{d:{fmt}}  {name[:width]}\n")
# Where the IO thread's instructions go: self instructions per IO by
# function (inlined callees included).
write_differenced("functions", ".functions.txt", 1, "8.1f", 140)
# Where its simulated L1D misses go, by function and source line.
write_differenced("misses", ".misses.txt", 0.05, "6.2f", 160)
# And by workspace source file (the steps of the path).
write_differenced("source_files", ".files.txt", 1, "8.1f", 100)
# Its instructions per IO by layer (the crate whose code ran), for the
# layers table.
la, lb = runs[n1][io].get("layers", {}), runs[n2][io].get("layers", {})
layers = {k: (lb.get(k, 0) - la.get(k, 0)) / (n2 - n1) / div for k in set(la) | set(lb)}
with open(path.replace(".cglock.jsonl", ".layers.json"), "w") as f:
    json.dump(layers, f)
allt = set(runs[n1]) | set(runs[n2])
proc = lambda n: sum(r["ir"] for r in runs[n].values())
print("\t".join([workload, engine, str(io),
    f"{per_io('ir', [io]):.0f}", f"{round(per_io('locked', [io]), 2) + 0.0:.2f}",
    f"{per_io('ir', allt):.0f}", f"{round(per_io('locked', allt), 2) + 0.0:.2f}",
    str(proc(n1)), str(proc(n2)), f"{round(d1_per_io(io), 1) + 0.0:.1f}"]))
PY
  tail -1 "$ROWS" | awk -F'\t' -v n1="$N1" -v n2="$N2" '{printf "[instructions] %s %s: IO thread %s: %s instr/IO, %s locked/IO, %s L1D misses/IO; process Ir %s (N=%s), %s (N=%s)\n", $1, $2, $3, $4, $5, $10, $8, n1, $9, n2}' >&2
}

START=$SECONDS
measure nop nop --engine nop --idle-wait futex --iodepth 128
measure nop raw --engine raw --nop --iodepth 128
measure cached-4k plugio --engine plugio --idle-wait futex --filename "$DATA" --direct 0 --rw randread --bs 4k --iodepth 128
measure cached-4k raw --engine raw --filename "$DATA" --direct 0 --rw randread --bs 4k --iodepth 128
measure seq-4k plugio --engine plugio --idle-wait futex --filename "$DATA" --direct 0 --rw read --bs 4k --iodepth 32
# The raw loop's 128 KiB reads: 1,000 and 3,000 of them in both modes
# (fewer, and its main thread outran the IO thread), each counted as 32
# units of 4 KiB.
N1_4K=$N1; N2_4K=$N2; N1=1000; N2=3000
PER_IO_DIV=32 measure seq-4k raw --engine raw --filename "$DATA" --direct 0 --rw read --bs 128k --iodepth 1
N1=$N1_4K; N2=$N2_4K
measure randrw-4k plugio --engine plugio --idle-wait futex --filename "$DATA" --direct 0 --rw randrw --rwmixread 70 --bs 4k --iodepth 128
measure randrw-4k raw --engine raw --filename "$DATA" --direct 0 --rw randrw --rwmixread 70 --bs 4k --iodepth 128

{
  echo "Per-IO cost, callgrind, N1=$N1 and N2=$N2 IOs (1,000 and 3,000 of the raw loop's 128 KiB reads), \`taskset -c 0\`, \`${COMMON[*]:0:4}\`, \`--iodepth 128\` (seq-4k: 32, raw 1)${FEATURES:+, features \`$FEATURES\`}"
  echo "($(valgrind --version); plugio engines with \`--idle-wait futex\`; IO thread = the thread that runs the IO loop; simulated L1D: $D1_GEOMETRY)"
  echo
  echo "(seq-4k rows: per 4 KiB of data, so the raw loop's figures are its count per 128 KiB read / 32)"
  echo
  echo "| workload | engine | user instr/IO (IO thread) | locked instr/IO (IO thread) | L1D misses/IO (IO thread, simulated) | user instr/IO (process) | locked instr/IO (process) | Ir total N1 / N2 (process) |"
  echo "|---|---|---|---|---|---|---|---|"
  awk -F'\t' '{printf "| %s | %s | %s | %s | %s | %s | %s | %s / %s |\n", $1, $2, $4, $5, $10, $6, $7, $8, $9}' "$ROWS"
  echo
  echo "Where the IO thread's instructions go: self instructions per IO by function (code inlined into a function counts as that function's), the 12 largest for each plugio workload (every function at >= 1 per IO is in \`$OUT/WORKLOAD.ENGINE.functions.txt\`):"
  for f in "$OUT"/nop.nop.functions.txt "$OUT"/cached-4k.plugio.functions.txt "$OUT"/seq-4k.plugio.functions.txt "$OUT"/randrw-4k.plugio.functions.txt; do
    echo
    echo "$(basename "$f" .functions.txt):"
    echo
    echo '```'
    head -12 "$f"
    echo '```'
  done
  echo
  echo 'The IO thread'"'"'s instructions per IO by layer: the crate whose source ran (the bench is the `plugio bench` loop of `cli`; for the raw rows it is the whole loop). Code of std, core, alloc or another crate inlined into a function counts for the workspace line just before it in that function'"'"'s code (`cglock.py --functions`); glibc'"'"'s functions are libc. Each row adds up to the table'"'"'s per-IO figure to within rounding:'
  echo
  python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
order = ["engine", "executor", "device", "io-uring crate", "bench (cli)", "libc", "other"]
rows = []
for label in ["nop.nop", "nop.raw", "cached-4k.plugio", "cached-4k.raw", "seq-4k.plugio", "seq-4k.raw", "randrw-4k.plugio", "randrw-4k.raw"]:
    p = os.path.join(out, label + ".layers.json")
    if os.path.exists(p):
        rows.append((label, json.load(open(p))))
print("| workload.engine | " + " | ".join(order) + " | total |")
print("|---" * (len(order) + 2) + "|")
for label, l in rows:
    cells = [f"{l.get(k, 0):.0f}" for k in order]
    print(f"| {label} | " + " | ".join(cells) + f" | {sum(l.values()):.0f} |")
PY
  echo
  echo "The same by source file, the steps of one IO's path (inlined std code counted as above), the 15 largest for each plugio workload (every file at >= 1 per IO in \`$OUT/WORKLOAD.ENGINE.files.txt\`):"
  for f in "$OUT"/nop.nop.files.txt "$OUT"/cached-4k.plugio.files.txt "$OUT"/seq-4k.plugio.files.txt "$OUT"/randrw-4k.plugio.files.txt; do
    echo
    echo "$(basename "$f" .files.txt):"
    echo
    echo '```'
    head -15 "$f"
    echo '```'
  done
  echo
  echo "Where the IO thread's simulated L1D misses go: misses per IO by function and source line (the file of the code inlined there), the 10 largest for each plugio workload (all at >= 0.05 per IO in \`$OUT/WORKLOAD.ENGINE.misses.txt\`). A line here is where a cache line of per-IO state (a task, a future, a bio, an SQE) is fetched again:"
  for f in "$OUT"/nop.nop.misses.txt "$OUT"/cached-4k.plugio.misses.txt "$OUT"/seq-4k.plugio.misses.txt "$OUT"/randrw-4k.plugio.misses.txt; do
    echo
    echo "$(basename "$f" .misses.txt):"
    echo
    echo '```'
    head -10 "$f"
    echo '```'
  done
  echo
  echo "Locked instructions per IO of the IO thread (of the 40 most executed in the N2 run, those >= 0.005 per IO):"
  for f in "$OUT"/*.locked.txt; do
    echo
    echo "$(basename "$f" .locked.txt):"
    echo
    echo '```'
    if [ -s "$f" ]; then cat "$f"; else echo "(none)"; fi
    echo '```'
  done
} > "$OUT/table.md"
echo
cat "$OUT/table.md"
log "done in $((SECONDS - START)) s; callgrind files and table.md in $OUT"
