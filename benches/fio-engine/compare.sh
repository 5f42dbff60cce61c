#!/usr/bin/env bash
# fio on plugio against fio's own io_uring engine, side by side in one run:
# the same fio binary (built from Debian's source by build.sh), the same job
# options, each repeat running every engine in turn (so repeats interleave),
# medians of the repeats.
#
#   benches/fio-engine/compare.sh            3 repeats x 5 s (~4 min)
#   benches/fio-engine/compare.sh --quick    1 repeat x 1 s (checks that it runs)
#   options: --reps N --runtime S --cpu N (the CPU every job is pinned to, default 0)
#
# Targets: `cache`, a 1 GiB file on disk read through the page cache
# (direct=0, read once before the runs); `zram`, a zram device (O_DIRECT);
# `loop`, a loop device over a file in /dev/shm (O_DIRECT). zram and loop
# need root; without it they are skipped.
#
# Workloads (numjobs=1, bs=4k, every job pinned to one CPU):
#   randread QD128: rw=randread iodepth=128
#   seqread QD32:   rw=read iodepth=32 (where plugio's merging applies)
# Engines: `io_uring` with fio's tuned settings (fixedbufs=1,
# registerfiles=1, hipri off, iodepth_batch_submit and
# iodepth_batch_complete_min = min(QD, 32)); `plugio` (external engine,
# defaults: registered io_u memory, registered files, merging on) with the
# same batch settings; on seqread also `plugio-nomerges` (plugio_nomerges=2).
#
# Writes target/fio-compare/fio-on-plugio.md (the tables of the
# "## fio on plugio" section of benches/RESULTS.md) and prints it; the JSON
# of every run is kept in target/fio-compare/results/.
set -euo pipefail
cd "$(dirname "$0")/../.."

reps=3; runtime=5; cpu=0; size_mb=1024
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) reps=1; runtime=1; size_mb=256; shift ;;
    --reps) reps="$2"; shift 2 ;;
    --runtime) runtime="$2"; shift 2 ;;
    --cpu) cpu="$2"; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

log() { printf '[fio-compare %s] %s\n' "$(date +%T)" "$*"; }
benches/fio-engine/build.sh >/dev/null
# shellcheck disable=SC1091
. target/fio-engine.env
out=target/fio-compare
results=$out/results
rm -rf "$results"; mkdir -p "$results"

# ---- targets ------------------------------------------------------------
data=$out/cache.dat
zram_id=""; zram_added=0; loop_dev=""; shm_img=/dev/shm/plugio-fio-compare.img
cleanup() {
  set +e
  [ -n "$loop_dev" ] && losetup -d "$loop_dev"
  rm -f "$shm_img"
  if [ -n "$zram_id" ]; then
    echo 1 > "/sys/block/zram$zram_id/reset"
    [ "$zram_added" = 1 ] && echo "$zram_id" > /sys/class/zram-control/hot_remove
  fi
}
trap cleanup EXIT

log "a ${size_mb} MiB file of random bytes on disk: $data"
head -c "$((size_mb << 20))" /dev/urandom > "$data"
targets="cache:$data:0"
if [ "$(id -u)" -eq 0 ]; then
  modprobe zram 2>/dev/null || true
  if [ -e /sys/class/zram-control/hot_add ]; then
    zram_id=$(cat /sys/class/zram-control/hot_add); zram_added=1
  fi
  if [ -n "$zram_id" ] && echo "$((size_mb << 20))" > "/sys/block/zram$zram_id/disksize" 2>/dev/null; then
    dd if="$data" of="/dev/zram$zram_id" bs=1M oflag=direct status=none
    targets="$targets zram:/dev/zram$zram_id:1"
    log "zram: /dev/zram$zram_id"
  else
    log "skipping zram: no zram module or device"; zram_id=""
  fi
  if cp "$data" "$shm_img" 2>/dev/null && loop_dev=$(losetup --find --show "$shm_img" 2>/dev/null); then
    targets="$targets loop:$loop_dev:1"
    log "loop: $loop_dev over $shm_img"
  else
    log "skipping loop: losetup failed"; loop_dev=""; rm -f "$shm_img"
  fi
else
  log "not root: zram and loop skipped"
fi
cat "$data" > /dev/null # into the page cache

# ---- runs ---------------------------------------------------------------
# run TARGET PATH DIRECT ENGINE WORKLOAD QD REP
run() {
  local tname=$1 path=$2 direct=$3 engine=$4 workload=$5 qd=$6 rep=$7
  local rw=randread batch=$(( $6 < 32 ? $6 : 32 ))
  [ "$workload" = seqread ] && rw=read
  local eng=()
  case "$engine" in
    io_uring) eng=(--ioengine=io_uring --fixedbufs=1 --registerfiles=1) ;;
    plugio) eng=(--ioengine="external:$PLUGIO_FIO_ENGINE" --plugio_stats=1) ;;
    plugio-nomerges) eng=(--ioengine="external:$PLUGIO_FIO_ENGINE" --plugio_stats=1 --plugio_nomerges=2) ;;
  esac
  local base="$results/${tname}__${workload}__${engine}__r${rep}"
  "$FIO" --name="$workload" --filename="$path" "${eng[@]}" --rw="$rw" --bs=4k \
    --iodepth="$qd" --iodepth_batch_submit="$batch" --iodepth_batch_complete_min="$batch" \
    --direct="$direct" --runtime="$runtime" --time_based --numjobs=1 --cpus_allowed="$cpu" \
    --invalidate=0 --randrepeat=0 --norandommap --output-format=json --output="$base.json" \
    >"$base.stdout" 2>"$base.stderr" || log "fio failed: $base (see $base.stderr)"
}

log "load before the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$reps"); do
  log "repeat $rep/$reps"
  for t in $targets; do
    IFS=: read -r tn tp td <<< "$t"
    for e in io_uring plugio; do run "$tn" "$tp" "$td" "$e" randread 128 "$rep"; done
    for e in io_uring plugio plugio-nomerges; do run "$tn" "$tp" "$td" "$e" seqread 32 "$rep"; done
  done
done
log "load after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 benches/fio-engine/report.py "$results" \
  --command "benches/fio-engine/compare.sh$([ "$reps" = 1 ] && [ "$runtime" = 1 ] && echo ' --quick')" \
  --context "fio $("$FIO" --version | sed 's/^fio-//') built from Debian's source; $(nproc) CPUs, Linux $(uname -r); ${runtime} s per run, ${reps} repeat(s), jobs pinned to CPU $cpu; load average $(cut -d' ' -f1 /proc/loadavg) at the end; $(date -u '+%F %H:%M') UTC." \
  > "$out/fio-on-plugio.md"
cat "$out/fio-on-plugio.md"
