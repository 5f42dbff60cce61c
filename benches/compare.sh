#!/usr/bin/env bash
# Peer comparison suite: plugio against a raw io_uring loop (our t/io_uring),
# the io_uring runtimes glommio, monoio, tokio-uring and compio, tokio
# (spawn_blocking), psync and (when installed) Debian's fio, side by side in
# one run (each repeat runs every engine in turn, so repeats interleave), on
# three targets: a file in the page cache (--direct 0), a zram device and a
# loop device over /dev/shm (both O_DIRECT). Writes the
# "## Peer comparison" section of benches/RESULTS.md and SVG plots in
# benches/plots/ (with --quick: into target/compare-quick/ instead, so CI does
# not touch the committed results).
#
#   benches/compare.sh            full run: 3 repeats x 2 s, QD 1..256 (~8 min)
#   benches/compare.sh --quick    1 repeat x 1 s, QD 1 and 128 (~1-2 min; CI)
#
# zram and loop targets need root (modprobe/hot_add, losetup); without them
# the script prints why and skips that target. Everything it creates is
# removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (use --quick)" >&2; exit 2 ;;
  esac
done

if [ "$QUICK" = 1 ]; then
  RUNTIME=1; REPS=1; QDS="1 128"; SIZE_MB=256
  OUT=${OUT:-target/compare-quick}
  MARKDOWN=$OUT/RESULTS.md; PLOTS=$OUT/plots
else
  RUNTIME=2; REPS=3; QDS="1 4 16 64 128 256"; SIZE_MB=1024
  OUT=${OUT:-target/compare}
  MARKDOWN=benches/RESULTS.md; PLOTS=benches/plots
fi
RESULTS=$OUT/results
rm -rf "$RESULTS"; mkdir -p "$RESULTS" "$PLOTS"
if [ "$QUICK" = 1 ] && [ -f benches/RESULTS.md ]; then cp benches/RESULTS.md "$MARKDOWN"; fi

log() { printf '[compare %s] %s\n' "$(date +%T)" "$*"; }
IS_ROOT=0; [ "$(id -u)" = 0 ] && IS_ROOT=1

log "building (release)"
cargo build --release --quiet --bin plugio
# The build's target directory (CARGO_TARGET_DIR or a cargo config may
# move it from ./target).
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps 2>/dev/null | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
TARGET_DIR=${TARGET_DIR:-target}
BIN=$TARGET_DIR/release/plugio

# ---- targets ---------------------------------------------------------------
DATA=target/compare-data.bin
ZRAM_ID=""; ZRAM_ADDED=0; LOOP_DEV=""; SHM_IMG=/dev/shm/plugio-compare.img
cleanup() {
  set +e
  [ -n "$LOOP_DEV" ] && losetup -d "$LOOP_DEV"
  rm -f "$SHM_IMG" "$DATA"
  if [ -n "$ZRAM_ID" ]; then
    echo 1 > "/sys/block/zram$ZRAM_ID/reset"
    [ "$ZRAM_ADDED" = 1 ] && echo "$ZRAM_ID" > /sys/class/zram-control/hot_remove
  fi
}
trap cleanup EXIT

log "creating a ${SIZE_MB} MiB data file (random bytes) at $DATA"
head -c "$((SIZE_MB << 20))" /dev/urandom > "$DATA"
sync "$DATA"
TARGETS="cache:$DATA:0"

if [ "$IS_ROOT" = 1 ]; then
  modprobe zram 2>/dev/null || true
  if [ -e /sys/class/zram-control/hot_add ]; then
    ZRAM_ID=$(cat /sys/class/zram-control/hot_add); ZRAM_ADDED=1
  elif [ -e /sys/block/zram0/disksize ] && [ "$(cat /sys/block/zram0/disksize)" = 0 ]; then
    ZRAM_ID=0
  fi
  if [ -n "$ZRAM_ID" ] && echo "$((SIZE_MB << 20))" > "/sys/block/zram$ZRAM_ID/disksize" 2>/dev/null; then
    dd if="$DATA" of="/dev/zram$ZRAM_ID" bs=1M oflag=direct status=none
    TARGETS="$TARGETS zram:/dev/zram$ZRAM_ID:1"
    log "zram target: /dev/zram$ZRAM_ID"
  else
    log "skipping zram: no zram module or free zram device in this container"
    ZRAM_ID=""
  fi
  if command -v losetup >/dev/null && cp "$DATA" "$SHM_IMG" 2>/dev/null \
      && LOOP_DEV=$(losetup --find --show "$SHM_IMG" 2>/dev/null); then
    TARGETS="$TARGETS loop:$LOOP_DEV:1"
    log "loop target: $LOOP_DEV over $SHM_IMG"
  else
    log "skipping loop: losetup failed (no loop devices?)"; LOOP_DEV=""; rm -f "$SHM_IMG"
  fi
else
  log "skipping zram and loop targets: they need root"
fi

HAVE_FIO=0
if ! command -v fio >/dev/null && [ "$IS_ROOT" = 1 ] && command -v apt-get >/dev/null && [ "${NO_APT:-0}" != 1 ]; then
  log "installing fio (apt-get); set NO_APT=1 to skip"
  (apt-get install -y -qq fio >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq fio >/dev/null 2>&1)) || true
fi
if command -v fio >/dev/null && fio --enghelp 2>/dev/null | grep -q io_uring; then
  HAVE_FIO=1; log "fio: $(fio --version)"
else
  log "fio with io_uring not available: no fio column"
fi
cat /proc/loadavg | sed 's/^/[compare] load before the run: /'

# ---- runs ------------------------------------------------------------------
# run TARGET_NAME PATH DIRECT ENGINE WORKLOAD QD REP
run() {
  local tname=$1 path=$2 direct=$3 engine=$4 workload=$5 qd=$6 rep=$7
  local file="$RESULTS/${tname}__${engine}__${workload}__qd${qd}__r${rep}.json"
  local rw=randread
  [ "$workload" = seqread4k ] && rw=read
  case "$engine" in
    fio)
      local batch=$(( qd < 32 ? qd : 32 ))
      fio --name=compare --filename="$path" --ioengine=io_uring --rw="$rw" --bs=4k \
        --iodepth="$qd" --iodepth_batch_submit="$batch" --iodepth_batch_complete_min="$batch" \
        --direct="$direct" --fixedbufs=1 --registerfiles=1 --runtime="$RUNTIME" --time_based \
        --numjobs=1 --cpus_allowed=0 --invalidate=0 --randrepeat=0 --norandommap --output-format=json \
        > "$file" 2>/dev/null || { log "fio failed on $tname qd$qd"; rm -f "$file"; }
      ;;
    rawnop)
      "$BIN" bench --engine raw --nop --iodepth "$qd" --runtime "$RUNTIME" --json --quiet \
        > "$file" || { log "raw nop failed"; rm -f "$file"; }
      ;;
    nop)
      # plugio's NOP path opens a small temporary file it never reads.
      "$BIN" bench --engine nop --iodepth "$qd" --runtime "$RUNTIME" --json --quiet \
        > "$file" || { log "plugio nop failed"; rm -f "$file"; }
      ;;
    *)
      # plugio-nomerges: plugio with merging off (sysfs nomerges=2).
      local engine_arg=$engine extra=()
      [ "$engine" = plugio-nomerges ] && { engine_arg=plugio; extra=(--nomerges 2); }
      "$BIN" bench --engine "$engine_arg" "${extra[@]}" --filename "$path" --rw "$rw" --bs 4k \
        --iodepth "$qd" --runtime "$RUNTIME" --direct "$direct" --json --quiet --tag "$tname" \
        > "$file" || { log "$engine failed on $tname qd$qd"; rm -f "$file"; }
      ;;
  esac
}

ENGINES="plugio raw glommio monoio tokio-uring compio tokio psync"
[ "$HAVE_FIO" = 1 ] && ENGINES="$ENGINES fio"
# The QD sweep runs on the first O_DIRECT device target (zram, else loop,
# else the cached file).
SWEEP=""
for t in $TARGETS; do case "$t" in zram:*) SWEEP=$t ;; esac; done
[ -z "$SWEEP" ] && for t in $TARGETS; do case "$t" in loop:*) SWEEP=$t ;; esac; done
[ -z "$SWEEP" ] && SWEEP=${TARGETS%% *}

for rep in $(seq 1 "$REPS"); do
  log "repeat $rep/$REPS"
  IFS=: read -r tn tp td <<< "$SWEEP"
  for qd in $QDS; do
    for e in $ENGINES; do run "$tn" "$tp" "$td" "$e" randread4k "$qd" "$rep"; done
  done
  for t in $TARGETS; do
    [ "$t" = "$SWEEP" ] && continue
    IFS=: read -r tn tp td <<< "$t"
    for e in $ENGINES; do run "$tn" "$tp" "$td" "$e" randread4k 128 "$rep"; done
  done
  IFS=: read -r tn tp td <<< "$SWEEP"
  for e in plugio plugio-nomerges raw glommio monoio tokio-uring compio; do run "$tn" "$tp" "$td" "$e" seqread4k 32 "$rep"; done
  [ "$HAVE_FIO" = 1 ] && run "$tn" "$tp" "$td" fio seqread4k 32 "$rep"
  run none none 0 nop nop 128 "$rep"
  run none none 0 rawnop nop 128 "$rep"
done

log "writing the report"
"$BIN" compare-report --results "$RESULTS" --markdown "$MARKDOWN" --plots "$PLOTS" \
  --command "benches/compare.sh$([ "$QUICK" = 1 ] && echo ' --quick')" \
  --context "Machine: $(nproc) CPUs, Linux $(uname -r), ${RUNTIME} s per run, ${REPS} repeat(s), $(date -u +%F)." \
  $([ -f benches/compare-notes.md ] && echo "--notes benches/compare-notes.md")
log "done: $MARKDOWN, $PLOTS/"
