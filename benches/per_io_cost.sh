#!/usr/bin/env bash
# benches/per_io_cost.sh: the ratio tables of benches/RESULTS.md
# `## Per-IO cost` (issue #12): plugio against the raw io_uring loop
# (`--engine raw`, like fio's t/io_uring) side by side, one pinned CPU, in
# interleaved rounds (each round runs every pair back to back, in an order
# that turns from round to round), medians.
#
# Workloads (QD128 unless said):
#   nop     plugio bench --engine nop            vs  --engine raw --nop
#   cache   4 KiB buffered random reads of a page-cached file (--direct 0)
#   zram    4 KiB O_DIRECT random reads of a zram device (root, zram-control)
#   randrw  4 KiB buffered random reads (70 %) and writes (30 %) of that
#           file, QD128: with writes live, plugio keeps the program order
#           of overlapping IO (its interval index); the raw loop orders
#           nothing. Not a goal of issue #12; it shows what the ordering
#           costs. The file's writeback moves the kernel's time per IO
#           between rounds: compare sides within a round.
#   seq     sequential 4 KiB reads from 32 tasks on zram, merging on
#           (plugio --rw read --bs 4k --iodepth 32) against the raw loop
#           issuing the requests merging builds: 128 KiB reads at QD 1
#           (--rw read --bs 128k --iodepth 1); compared by bandwidth.
#
# Usage: benches/per_io_cost.sh [--quick] [--rounds N] [--runtime S]
#   --quick  1 round of 1 s (a smoke run for CI; prints, and writes only $WORK/results.jsonl)
# Prints a markdown table: median IOPS (min-max) of each side, CPU ns/IO
# and its split into user and system time (getrusage; the user part is
# the engine's own code, the system part the kernel's work for the same
# IO), IOS/call and the ratio of the medians. Environment: WORK (scratch dir on
# a disk-backed file system, default target/per-io-cost); BEFORE (a
# `plugio` binary of an earlier commit: its plugio side runs in the same
# rounds, and the table gains its column and ratio).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$ROOT/target/per-io-cost}
ROUNDS=3
RUNTIME=3
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) ROUNDS=1; RUNTIME=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --runtime) RUNTIME=$2; shift ;;
    *) echo "usage: $0 [--quick] [--rounds N] [--runtime S]" >&2; exit 2 ;;
  esac
  shift
done

log() { echo "per_io_cost.sh: $*" >&2; }
mkdir -p "$WORK"
(cd "$ROOT" && cargo build --release -q -p plugio-cli)
# The build's target directory (CARGO_TARGET_DIR or a cargo config may
# move it from ./target).
TARGET_DIR=$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps 2>/dev/null | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
TARGET_DIR=${TARGET_DIR:-$ROOT/target}
PLUGIO=$TARGET_DIR/release/plugio
OUT=$WORK/results.jsonl
: > "$OUT"

ZRAM_ID=""
cleanup() {
  if [ -n "$ZRAM_ID" ]; then
    echo 1 > "/sys/block/zram$ZRAM_ID/reset" 2>/dev/null || true
    echo "$ZRAM_ID" > /sys/class/zram-control/hot_remove 2>/dev/null || true
  fi
  rm -f "$WORK/cached.img"
}
trap cleanup EXIT

# The page-cached file: 256 MiB of random data, read once so it is cached.
CACHED=$WORK/cached.img
head -c $((256 << 20)) /dev/urandom > "$CACHED"
cat "$CACHED" > /dev/null

ZRAM=""
if [ "$(id -u)" = 0 ] && [ -e /sys/class/zram-control/hot_add ]; then
  ZRAM_ID=$(cat /sys/class/zram-control/hot_add)
  if echo $((1 << 30)) > "/sys/block/zram$ZRAM_ID/disksize" 2>/dev/null; then
    head -c $((1 << 30)) /dev/urandom | dd of="/dev/zram$ZRAM_ID" bs=1M oflag=direct status=none
    ZRAM=/dev/zram$ZRAM_ID
    log "zram target: $ZRAM"
  fi
fi
[ -n "$ZRAM" ] || log "skipping zram and seq: no zram device can be made here (needs root and zram-control)"

# run WORKLOAD SIDE ARGS...: one pinned run, its JSON tagged and appended.
run() {
  local workload=$1 side=$2 bin=$PLUGIO
  shift 2
  [ "$side" = before ] && bin=$BEFORE
  local json
  json=$(taskset -c 0 "$bin" bench --runtime "$RUNTIME" --json --quiet "$@") || {
    log "failed: $workload $side: $*"
    return 0
  }
  printf '{"workload":"%s","side":"%s","run":%s}\n' "$workload" "$side" "$json" >> "$OUT"
}

# workload WORKLOAD SIDE: one run of that side of that workload.
workload() {
  local w=$1 side=$2
  local raw=()
  [ "$side" = raw ] && raw=(--engine raw)
  case "$w" in
    nop)
      if [ "$side" = raw ]; then run nop raw --engine raw --nop --iodepth 128
      else run nop "$side" --engine nop --iodepth 128; fi ;;
    cache) run cache "$side" "${raw[@]}" --filename "$CACHED" --direct 0 --rw randread --bs 4k --iodepth 128 ;;
    randrw) run randrw "$side" "${raw[@]}" --filename "$CACHED" --direct 0 --rw randrw --rwmixread 70 --bs 4k --iodepth 128 ;;
    zram) run zram "$side" "${raw[@]}" --filename "$ZRAM" --rw randread --bs 4k --iodepth 128 ;;
    seq)
      if [ "$side" = raw ]; then run seq raw --engine raw --filename "$ZRAM" --rw read --bs 128k --iodepth 1
      else run seq "$side" --filename "$ZRAM" --rw read --bs 4k --iodepth 32; fi ;;
  esac
}

# The sides run back to back for each workload, in an order that turns
# from round to round (plugio, before, raw; then before, raw, plugio; ...),
# so that no side always runs first: running first was worth 0-5 % to a
# side on this machine.
SIDES=(plugio ${BEFORE:+before} raw)
order() {
  local r=$1 n=${#SIDES[@]} i
  for ((i = 0; i < n; i++)); do echo "${SIDES[(i + r) % n]}"; done
}
WORKLOADS=(nop cache randrw ${ZRAM:+zram seq})

for round in $(seq 1 "$ROUNDS"); do
  log "round $round of $ROUNDS"
  for w in "${WORKLOADS[@]}"; do
    for side in $(order $((round - 1))); do
      workload "$w" "$side"
    done
  done
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = {
    "nop": "NOP, QD128 (IOPS)",
    "cache": "4 KiB buffered randread, page-cached file, QD128 (IOPS)",
    "randrw": "4 KiB buffered randrw 70/30, page-cached file, QD128 (IOPS)",
    "zram": "4 KiB O_DIRECT randread, zram, QD128 (IOPS)",
    "seq": "seq 4 KiB reads, 32 tasks, zram, merging (MiB/s; raw: 128 KiB at QD1; "
           "CPU ns/IO: plugio's per 4 KiB IO, raw's per 128 KiB IO)",
}
before = any(r["side"] == "before" for r in rows)
head = ("| workload | plugio | raw | ratio | plugio CPU ns/IO | raw CPU ns/IO "
        "| plugio user / system ns/IO | raw user / system ns/IO | plugio IOS/call |")
rule = "|---|---|---|---|---|---|---|---|---|"
if before:
    head += " plugio before | ratio before | CPU ns/IO before | IOS/call before |"
    rule += "---|---|---|---|"
print(head)
print(rule)
for w, title in names.items():
    sides = {}
    for s in ("plugio", "raw", "before"):
        runs = [r["run"] for r in rows if r["workload"] == w and r["side"] == s]
        if runs:
            key = "bw_mib_s" if w == "seq" else "iops"
            vals = [r[key] for r in runs]
            sides[s] = (statistics.median(vals), min(vals), max(vals),
                        statistics.median(r["cpu_ns_per_io"] for r in runs),
                        statistics.median((r.get("plug") or {}).get("submit_per_call") or 0 for r in runs),
                        statistics.median(r.get("cpu_user_ns_per_io") or 0 for r in runs),
                        statistics.median(r.get("cpu_system_ns_per_io") or 0 for r in runs))
    if "plugio" not in sides or "raw" not in sides:
        continue
    p, r = sides["plugio"], sides["raw"]
    fmt = lambda v: f"{v[0]:,.0f} ({v[1]:,.0f}–{v[2]:,.0f})"
    split = lambda v: f"{v[5]:,.0f} / {v[6]:,.0f}"
    line = (f"| {title} | {fmt(p)} | {fmt(r)} | {p[0] / r[0]:.2f}× | {p[3]:,.0f} | {r[3]:,.0f} "
            f"| {split(p)} | {split(r)} | {p[4]:.1f} |")
    if before and "before" in sides:
        b = sides["before"]
        line += f" {fmt(b)} | {b[0] / r[0]:.2f}× | {b[3]:,.0f} | {b[4]:.1f} |"
    print(line)
EOF
