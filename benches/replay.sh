#!/usr/bin/env bash
# benches/replay.sh: the `## Replay` tables of benches/RESULTS.md.
#
# For each shared trace (../shared/traces/{postgres,sqlite}) and each target
# (a file on the disk-backed file system holding $WORK, and a zram device
# when one can be made as root), alternating in each round:
#   plugio replay q.csv.zst --timing none --iodepth QD                (flushes as barriers)
#   plugio replay q.csv.zst --timing none --iodepth QD --flush-barrier 0 (flushes queued)
#   plugio replay q.csv.zst --timing none --iodepth QD --flush-barrier 0 --overlap-order 0
#                                                         (no ordering at all, as fio)
#   fio --read_iolog=<trace>.bin --replay_redirect=TARGET --replay_no_stall=1
#       --ioengine=io_uring --iodepth=QD --direct=1 --refill_buffers=1
# (refill_buffers: fio writes fresh random bytes with each write, as plugio
# writes a fresh pattern; fio's default buffers compress about 11:1 on zram
# and plugio's do not compress, which made zram's work per write unequal)
# then prints a markdown table (median of the rounds, with plugio's run time
# over fio's), the queue depth plugio kept (IOs in flight in the replay and
# engine tags held, from builds that report them), and the request counts
# plugio's merging makes of the Q stream next to the kernel's D counts.
#
# Usage: benches/replay.sh [--quick] [--rounds N] [--iodepth N]
#   --quick   one round, file target only, plugio replays the first 20000
#             IOs (fio the whole trace): a smoke test
# Environment: WORK (scratch dir, default target/replay-bench; must not be
# tmpfs, O_DIRECT), TRACES (default ../shared/traces), PLUGIO (a plugio
# binary to measure instead of building this tree's, e.g. an older build).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TRACES=${TRACES:-$ROOT/../shared/traces}
WORK=${WORK:-$ROOT/target/replay-bench}
QD=32
ROUNDS=3
QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; ROUNDS=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --iodepth) QD=$2; shift ;;
    *) echo "usage: $0 [--quick] [--rounds N] [--iodepth N]" >&2; exit 2 ;;
  esac
  shift
done

log() { echo "replay.sh: $*" >&2; }
command -v fio >/dev/null || { log "fio is missing (apt-get install -y fio)"; exit 2; }
command -v zstd >/dev/null || { log "zstd is missing (apt-get install -y zstd)"; exit 2; }
mkdir -p "$WORK"
if [ -z "${PLUGIO:-}" ]; then
  (cd "$ROOT" && cargo build --release -q -p plugio-cli)
  # The build's target directory (CARGO_TARGET_DIR or a cargo config may
  # move it from ./target).
  TARGET_DIR=$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps 2>/dev/null | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  TARGET_DIR=${TARGET_DIR:-$ROOT/target}
  PLUGIO=$TARGET_DIR/release/plugio
fi
RESULTS=$WORK/results.jsonl
: > "$RESULTS"

ZRAM_ID=""
cleanup() {
  if [ -n "$ZRAM_ID" ]; then
    echo 1 > "/sys/block/zram$ZRAM_ID/reset" 2>/dev/null || true
    echo "$ZRAM_ID" > /sys/class/zram-control/hot_remove 2>/dev/null || true
  fi
  rm -f "$WORK"/*.img "$WORK"/*.bin
}
trap cleanup EXIT

# make_zram BYTES: a fresh zram device of BYTES, zero-filled, at /dev/zram$ZRAM_ID.
# Called in this shell, not in $(...): ZRAM_ID must reach cleanup (in a
# subshell every call added a device that was never removed).
make_zram() {
  [ "$(id -u)" = 0 ] && [ -e /sys/class/zram-control/hot_add ] || return 1
  if [ -z "$ZRAM_ID" ]; then ZRAM_ID=$(cat /sys/class/zram-control/hot_add) || return 1; fi
  echo 1 > "/sys/block/zram$ZRAM_ID/reset"
  echo "$1" > "/sys/block/zram$ZRAM_ID/disksize" || return 1
}

# now_s: wall clock in seconds with ns.
now_s() { date +%s.%N; }

# run_plugio TRACE TARGET_KIND TARGET BARRIER ORDER
run_plugio() {
  local trace=$1 kind=$2 target=$3 barrier=$4 order=$5 limit=() t0 t1 out
  [ "$QUICK" = 1 ] && limit=(--limit 20000)
  out=$WORK/plugio.json
  t0=$(now_s)
  "$PLUGIO" replay "$TRACES/$trace/q.csv.zst" --filename "$target" --timing none \
    --iodepth "$QD" --flush-barrier "$barrier" --overlap-order "$order" --json --quiet \
    "${limit[@]}" > "$out"
  t1=$(now_s)
  python3 - "$out" "$trace" "$kind" "$barrier" "$order" "$t0" "$t1" >> "$RESULTS" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
_, _, trace, kind, barrier, order, t0, t1 = sys.argv
e = r["engine"]
tool = ("plugio, ordered, flush barriers" if barrier == "1" else
        "plugio, ordered, flushes queued" if order == "1" else "plugio, no ordering (as fio)")
print(json.dumps({"trace": trace, "target": kind, "tool": tool,
  "ios": r["ios"], "run_s": r["elapsed_s"], "wall_s": float(t1) - float(t0),
  "data_bios": r["trace_ios"][0] + r["trace_ios"][1] + r["trace_ios"][3],
  "data_requests": e["read_requests"] + e["write_requests"] + e["discard_requests"],
  "merges": e["merges"], "ios_per_call": e["ios_per_call"], "depth": r.get("depth")}))
EOF
}

# run_fio TRACE TARGET_KIND TARGET
run_fio() {
  local trace=$1 kind=$2 target=$3 extra=() t0 t1 out
  out=$WORK/fio.json
  t0=$(now_s)
  fio --name=replay --read_iolog="$WORK/$trace.bin" --replay_redirect="$target" \
    --replay_no_stall=1 --ioengine=io_uring --iodepth="$QD" --direct=1 \
    --refill_buffers=1 --output-format=json "${extra[@]}" > "$out"
  t1=$(now_s)
  python3 - "$out" "$trace" "$kind" "$t0" "$t1" >> "$RESULTS" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
_, _, trace, kind, t0, t1 = sys.argv
ios = sum(j[k]["total_ios"] for k in ("read", "write", "trim", "sync") if k in j)
print(json.dumps({"trace": trace, "target": kind, "tool": "fio read_iolog",
  "ios": ios, "run_s": j["job_runtime"] / 1000.0, "wall_s": float(t1) - float(t0)}))
EOF
}

for trace in postgres sqlite; do
  size=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['device_size_bytes'])" \
    "$TRACES/$trace/stats.json")
  zstd -dqf "$TRACES/$trace/$trace.bin.zst" -o "$WORK/$trace.bin"
  targets="file"
  [ "$QUICK" = 0 ] && targets="file zram"
  for kind in $targets; do
    if [ "$kind" = file ]; then
      target=$WORK/$trace.img
      log "$trace: zero-filling a $((size >> 20)) MiB file target"
      dd if=/dev/zero of="$target" bs=1M count=$((size >> 20)) oflag=direct status=none
    elif make_zram "$size"; then
      target=/dev/zram$ZRAM_ID
    else
      log "$trace: skipping zram (needs root and /sys/class/zram-control)"
      echo "{\"trace\": \"$trace\", \"target\": \"zram\", \"skipped\": true}" >> "$RESULTS"
      continue
    fi
    for round in $(seq "$ROUNDS"); do
      log "$trace on $kind, round $round/$ROUNDS"
      run_plugio "$trace" "$kind" "$target" 1 1
      run_plugio "$trace" "$kind" "$target" 0 1
      run_plugio "$trace" "$kind" "$target" 0 0
      run_fio "$trace" "$kind" "$target"
    done
  done
  rm -f "$WORK/$trace.img" "$WORK/$trace.bin"
done

python3 - "$RESULTS" "$TRACES" "$QD" "$ROUNDS" "$QUICK" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
traces, qd, rounds = sys.argv[2], sys.argv[3], sys.argv[4]
# --quick: plugio replays the first 20,000 IOs, fio the whole trace, so
# only the time per IO compares (the run times read as plugio 3-11x
# faster: found by a helper trying the suite).
quick = sys.argv[5] == "1"
print(f"Queue depth {qd}, median of {rounds} round(s); run s = the tool's own run time "
      "(plugio: first issue to last completion; fio: job_runtime), wall s = the whole process.\n")
if quick:
    print("--quick: plugio replayed the first 20,000 IOs of each trace and fio the whole "
          "trace, so the last column compares run time per IO, and the request counts "
          "below set plugio's 20,000 IOs beside the kernel's whole trace.\n")
last = "run s per IO / fio's" if quick else "run s / fio's"
print(f"| trace | target | tool | IOs issued | run s | wall s | IOPS (IOs / run s) | {last} |")
print("|---|---|---|---|---|---|---|---|")
def median_run(k):
    rs = [r for r in rows if (r["trace"], r["target"], r.get("tool")) == k and "run_s" in r]
    return statistics.median(r["run_s"] for r in rs) if rs else None
keys = []
for r in rows:
    k = (r["trace"], r["target"], r.get("tool"))
    if k not in keys:
        keys.append(k)
for k in keys:
    rs = [r for r in rows if (r["trace"], r["target"], r.get("tool")) == k]
    if rs[0].get("skipped"):
        print(f"| {k[0]} | {k[1]} | skipped: no zram device could be made | | | | | |")
        continue
    run = statistics.median(r["run_s"] for r in rs)
    wall = statistics.median(r["wall_s"] for r in rs)
    ios = rs[0]["ios"]
    fio = median_run((k[0], k[1], "fio read_iolog"))
    fio_ios = next((r["ios"] for r in rows if (r["trace"], r["target"], r.get("tool"))
                    == (k[0], k[1], "fio read_iolog")), None)
    if fio and quick and fio_ios:
        ratio = f"{(run / ios) / (fio / fio_ios):.2f}"
    else:
        ratio = f"{run / fio:.2f}" if fio else "n/a"
    print(f"| {k[0]} | {k[1]} | {k[2]} | {ios:,} | {run:.2f} | {wall:.2f} | {ios / run:,.0f} | {ratio} |")
drows = [k for k in keys if k[2] and k[2].startswith("plugio")]
if any(r.get("depth") for r in rows):
    print("\nQueue depth kept by plugio (medians; sampled each time the replay loop waits for a "
          "completion: IOs the replay has in flight, and engine tags held, i.e. requests the engine "
          "has sent to the device):\n")
    print("| trace | target | tool | IOs in flight | engine tags held | IOS/call |")
    print("|---|---|---|---|---|---|")
    for k in drows:
        rs = [r for r in rows if (r["trace"], r["target"], r.get("tool")) == k and r.get("depth")]
        if not rs:
            continue
        m = lambda f: statistics.median(f(r) for r in rs)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {m(lambda r: r['depth']['mean_in_flight']):.1f} | "
              f"{m(lambda r: r['depth']['mean_tags_in_use']):.1f} | {m(lambda r: r['ios_per_call'] or 0):.2f} |")
print("\nRequests from the Q stream (data IOs: reads, writes, discards):\n")
print("| trace | Q data bios | plugio data requests | plugio merges | kernel D data requests | kernel merges (M + F) | kernel splits (X) |")
print("|---|---|---|---|---|---|---|")
for t in dict.fromkeys(r["trace"] for r in rows):
    p = next((r for r in rows if r["trace"] == t and r.get("tool") == "plugio, ordered, flush barriers"), None)
    if p is None:
        continue
    s = json.load(open(f"{traces}/{t}/stats.json"))
    d = s["d"]["ios_by_op"]
    km = s["kernel_merges"]
    print(f"| {t} | {p['data_bios']:,} | {p['data_requests']:,} | {p['merges']:,} | "
          f"{d['R'] + d['W'] + d['D']:,} | {km['back_merge_M'] + km['front_merge_F']:,} | {km['splits_X']:,} |")
EOF
