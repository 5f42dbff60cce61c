#!/usr/bin/env bash
# The ablation table: each engine mechanism switched off in turn, measured
# side by side in one run with `plugio bench --ablate MECHANISM --json`, on
#   - 4 KiB random reads of a page-cached file (--direct 0), QD 128;
#   - 4 KiB random reads of zram with O_DIRECT, QD 128 (root only);
#   - sequential 4 KiB reads from 32 tasks (merging), zram or the file.
# Every run uses --buf-per-io (a fresh buffer per IO, as `read_at` takes),
# so the buffer cache is exercised. Writes the "## Ablation" section of
# benches/RESULTS.md (or of --out FILE; --quick writes
# target/ablation-quick.md unless --out is given).
#
# Each cell is the median of --repeat runs (default 3), the mechanisms
# interleaved round by round, in a new random order each round, so that
# drift in the machine's load spreads over all rows alike.
#
# Usage: benches/ablation.sh [--quick] [--runtime S] [--repeat N] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=2; REPEAT=3; OUT=""; SIZE_MB=512; QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) RUNTIME=1; REPEAT=1; SIZE_MB=128; QUICK=1 ;;
    --repeat) REPEAT=$2; shift ;;
    --runtime) RUNTIME=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# A quick run checks that the script works: its table does not replace
# the committed one (it did: found by a helper trying the suite).
[ -n "$OUT" ] || OUT=$([ "$QUICK" = 1 ] && echo target/ablation-quick.md || echo benches/RESULTS.md)
log() { printf '[ablation %s] %s\n' "$(date +%T)" "$*"; }
cargo build --release --quiet --bin plugio
# The build's target directory (CARGO_TARGET_DIR or a cargo config may
# move it from ./target).
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps 2>/dev/null | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
TARGET_DIR=${TARGET_DIR:-target}
BIN=$TARGET_DIR/release/plugio
# Scratch and the --quick table go under ./target, which a build with
# CARGO_TARGET_DIR set elsewhere does not make.
mkdir -p target
WORK=$(mktemp -d target/ablation.XXXXXX)
DATA=$WORK/data.bin
ZRAM_ID=""
cleanup() {
  set +e
  [ -n "$ZRAM_ID" ] && echo 1 > "/sys/block/zram$ZRAM_ID/reset"
  rm -rf "$WORK"
}
trap cleanup EXIT
head -c "$((SIZE_MB << 20))" /dev/urandom > "$DATA"
ZRAM=""
if [ "$(id -u)" = 0 ] && [ -e /sys/block/zram0/disksize ] && [ "$(cat /sys/block/zram0/disksize)" = 0 ] \
    && echo "$((SIZE_MB << 20))" > /sys/block/zram0/disksize 2>/dev/null; then
  ZRAM_ID=0; ZRAM=/dev/zram0
  dd if="$DATA" of="$ZRAM" bs=1M oflag=direct status=none
  log "zram target: $ZRAM"
else
  log "no free zram device (needs root and an unused /dev/zram0): zram rows skipped"
fi

MECHS="none tag-batch tag-batch-retry plug merge bio-cache buf-cache cached-clock iostats fast-lane untimed-wait"
RESULTS=$WORK/results.jsonl
run() { # workload target direct extra...
  local workload=$1 target=$2 direct=$3; shift 3
  for round in $(seq "$REPEAT"); do
  # A new random order each round: no mechanism always runs first or last.
  for m in $(printf '%s\n' $MECHS | shuf); do
    local ab=(); [ "$m" = none ] || ab=(--ablate "$m")
    "$BIN" bench --engine plugio --filename "$target" --direct "$direct" --bs 4k \
      --runtime "$RUNTIME" --buf-per-io --json --quiet "${ab[@]}" "$@" 2>/dev/null \
      | python3 -c 'import json,sys; r=json.load(sys.stdin); r["workload"]=sys.argv[1]; r["mechanism"]=sys.argv[2]; print(json.dumps(r))' "$workload" "$m" \
      >> "$RESULTS" || log "run failed: $workload $m"
  done
  done
  log "done: $workload"
}
run "cached file, 4 KiB random reads, QD128" "$DATA" 0 --rw randread --iodepth 128
if [ -n "$ZRAM" ]; then
  run "zram O_DIRECT, 4 KiB random reads, QD128" "$ZRAM" 1 --rw randread --iodepth 128
  run "zram O_DIRECT, sequential 4 KiB reads, 32 tasks" "$ZRAM" 1 --rw read --iodepth 32
else
  run "cached file, sequential 4 KiB reads, 32 tasks" "$DATA" 0 --rw read --iodepth 32
fi

python3 - "$RESULTS" "$OUT" "$RUNTIME" "$REPEAT" "$MECHS" "$QUICK" <<'PY'
import json, sys, re, datetime, platform, os
import statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
out, runtime, repeat = sys.argv[2], sys.argv[3], sys.argv[4]
# Rows in the list's order (the runs' order is shuffled each round).
order = {m: i for i, m in enumerate(sys.argv[5].split())}
quick = " --quick" if sys.argv[6] == "1" else ""
runs = {}
for r in rows:
    runs.setdefault(r["workload"], {}).setdefault(r["mechanism"], []).append(r)
def med(rs, get):
    v = [x for x in (get(r) for r in rs) if x is not None]
    return statistics.median(v) if v else None
by = {}
for w, ms in runs.items():
    for m, rs in ms.items():
        by.setdefault(w, {})[m] = {
            "iops": med(rs, lambda r: r["iops"]),
            "bw_mib_s": med(rs, lambda r: r["bw_mib_s"]),
            "cpu_ns_per_io": med(rs, lambda r: r.get("cpu_ns_per_io")),
            "allocs_per_io": med(rs, lambda r: r.get("allocs_per_io")),
            "plug": {
                "submit_per_call": med(rs, lambda r: r.get("plug", {}).get("submit_per_call")),
                "bios_per_request": med(rs, lambda r: r.get("plug", {}).get("bios_per_request")),
            },
            "min": min(r["iops"] for r in rs), "max": max(r["iops"] for r in rs),
        }
def f(v, d=0):
    return "–" if v is None else f"{v:,.{d}f}"
lines = ["## Ablation", "",
  f"Reproduce with `benches/ablation.sh{quick}` ({runtime} s per run, median of {repeat} interleaved runs per cell, "
  f"{datetime.date.today()}, {os.cpu_count()} CPUs, Linux {platform.release()}). "
  "Each row switches one mechanism off (`plugio bench --ablate MECHANISM --buf-per-io`), "
  "in the same run as the baseline row `none`; `Δ IOPS` is against `none`. "
  "CPU ns/IO is process CPU time (all threads, including io-wq workers) per IO; "
  "allocations/IO counts every heap allocation of the process during the run; "
  "IOS/call is requests per `io_uring_enter`.", ""]
for w, ms in by.items():
    base = ms.get("none", {}).get("iops")
    lines += [f"### {w}", "",
      "| mechanism off | IOPS (min–max) | Δ IOPS | MiB/s | CPU ns/IO | allocations/IO | IOS/call | bios/request |",
      "|---|---|---|---|---|---|---|---|"]
    for m, r in sorted(ms.items(), key=lambda mr: order.get(mr[0], len(order))):
        p = r.get("plug", {})
        d = "" if not base or m == "none" else f"{(r['iops']/base-1)*100:+.1f} %"
        lines.append(f"| {m} | {f(r['iops'])} ({f(r['min'])}–{f(r['max'])}) | {d} | {f(r['bw_mib_s'],1)} | {f(r.get('cpu_ns_per_io'))} | "
                     f"{f(r.get('allocs_per_io'),3)} | {f(p.get('submit_per_call'),1)} | {f(p.get('bios_per_request'),2)} |")
    lines.append("")
section = "\n".join(lines) + "\n"
text = open(out).read() if os.path.exists(out) else "# Benchmark results\n\n"
m = re.search(r"^## Ablation\n.*?(?=^## |\Z)", text, re.S | re.M)
text = text[:m.start()] + section + text[m.end():] if m else text.rstrip("\n") + "\n\n" + section
open(out, "w").write(text)
print(section)
PY
