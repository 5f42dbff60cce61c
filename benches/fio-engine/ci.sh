#!/usr/bin/env bash
# Runs fio's own job files on plugio (benches/fio-engine/jobs/*.fio) and
# checks fio's JSON: every job ends with zero errors and zero verify
# failures, and the fail-*.fio jobs fail cleanly with EINVAL.
#
#   benches/fio-engine/ci.sh [--size 64M]
#
# Targets: a file on disk (target/fio-ci, refused if that is tmpfs) and, as
# root, a loop device with 4 KiB sectors over a file on disk. As root also:
# a job on ramfs (which refuses O_DIRECT) must fail with fio's usual
# message, and a verify pass over a corrupted block must report the
# corruption. Builds fio and the engine first (build.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
here=benches/fio-engine
size=64M
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size="$2"; shift 2 ;;
    *) echo "usage: $0 [--size 64M]" >&2; exit 2 ;;
  esac
done

build_start=$(date +%s)
"$here/build.sh"
echo "fio and the engine built in $(( $(date +%s) - build_start )) s"
# shellcheck disable=SC1091
. target/fio-engine.env
export PLUGIO_FIO_ENGINE

out=target/fio-ci
rm -rf "$out"
mkdir -p "$out"
failures=0
loopdev=""
mnt=""
cleanup() {
  if [ -n "$loopdev" ]; then losetup -d "$loopdev" 2>/dev/null || true; fi
  if [ -n "$mnt" ]; then umount "$mnt" 2>/dev/null || true; fi
}
trap cleanup EXIT

bytes() { numfmt --from=iec "$1"; }
export PLUGIO_FIO_SIZE="$size"
export PLUGIO_FIO_HALF="$(( $(bytes "$size") / 2 ))"
export PLUGIO_FIO_QUARTER="$(( $(bytes "$size") / 4 ))"

# run LABEL JOBFILE [check.py options]: one fio run, checked.
run() {
  local label="$1" job="$2"
  shift 2
  local name
  name="$(basename "$job" .fio)"
  local res="$out/$label-$name.json" err="$out/$label-$name.stderr"
  local rc=0
  timeout 600 "$FIO" --aux-path="$out" --output-format=json --output="$res" "$job" 2>"$err" || rc=$?
  if [ "$rc" -ge 124 ]; then
    echo "FAIL $label/$name: fio exit status $rc (timeout or crash)"; cat "$err"
    failures=$((failures + 1)); return
  fi
  if ! python3 "$here/check.py" "$@" "$res" "$err"; then
    failures=$((failures + 1))
    sed 's/^/    /' "$err" | head -20
  fi
}

# run_all LABEL TARGET SUBBLOCK: every job file on TARGET.
run_all() {
  export PLUGIO_FIO_TARGET="$2" PLUGIO_FIO_SUBBLOCK="$3"
  for job in "$here"/jobs/*.fio; do
    case "$(basename "$job")" in
      fail-*) run "$1" "$job" --expect-error 22 ;;
      # plugio's iostats (plugio_stats=1 in these jobs) show what happened:
      rand-write-verify.fio) # io_u memory used in place, as fixed buffers
        run "$1" "$job" --expect-regex 'fixed-buffer requests [1-9]' --expect-regex 'bounced IOs 0,' ;;
      seq-write-verify.fio) # adjacent writes of a batch merged
        run "$1" "$job" --expect-regex 'merges read [0-9]+ write [1-9]' ;;
      unaligned-memory.fio) # misaligned io_u memory bounced, data verified
        run "$1" "$job" --expect-regex 'bounced IOs [1-9]' ;;
      *) run "$1" "$job" ;;
    esac
  done
}

start=$(date +%s)
if [ "$(stat -f -c %T "$out")" = tmpfs ]; then
  echo "$out is on tmpfs: the file target must be on disk" >&2
  exit 1
fi
file="$out/target.dat"
truncate -s "$size" "$file"
echo "== a file on disk ($(stat -f -c %T "$out")): $file"
run_all file "$file" 256

echo "== 70 files in one job, picked at random (a core with more than 64 devices)"
# Random file service opens and closes files as it goes: devices past index
# 63 are dispatched, and the slots of closed ones are skipped (a panic
# once).
many="$out/many-files"
mkdir -p "$many"
rc=0
timeout 300 "$FIO" --aux-path="$out" --output-format=json --output="$out/many-files.json" \
  --name=many --ioengine="external:$PLUGIO_FIO_ENGINE" --directory="$many" \
  --nrfiles=70 --size=4480k --direct=1 --rw=randrw --bs=4k --iodepth=16 \
  --file_service_type=random --verify=crc32c --do_verify=1 \
  2>"$out/many-files.stderr" || rc=$?
if [ "$rc" -ge 124 ] || ! python3 "$here/check.py" "$out/many-files.json" "$out/many-files.stderr"; then
  echo "FAIL many-files (fio exit status $rc)"; sed 's/^/    /' "$out/many-files.stderr" | head -20
  failures=$((failures + 1))
fi

if [ "$(id -u)" -eq 0 ]; then
  img="$out/loop.img"
  truncate -s "$size" "$img"
  loopdev="$(losetup --find --show --sector-size 4096 "$img")"
  echo "== a loop device with 4 KiB sectors: $loopdev"
  run_all loop "$loopdev" 2048

  echo "== O_DIRECT refused (ramfs)"
  mnt="$(mktemp -d -p "$out" ramfs.XXXXXX)"
  mount -t ramfs ramfs "$mnt"
  truncate -s 4M "$mnt/file"
  PLUGIO_FIO_TARGET="$mnt/file" run ramfs "$here/jobs/fail-unaligned.fio" \
    --expect-error 22 \
    --expect-text "fio: looks like your file system does not support direct=1/buffered=0" \
    --expect-text "fio: destination does not support O_DIRECT"

  echo "== a verify pass finds a corrupted block"
  # Write with verify headers, overwrite one block behind fio's back, then
  # the verify-only job must report it (EILSEQ, 84).
  PLUGIO_FIO_TARGET="$file" PLUGIO_FIO_SIZE=4M \
    "$FIO" --aux-path="$out" --output-format=json --output="$out/corrupt-write.json" \
    --name=corrupt --ioengine="external:$PLUGIO_FIO_ENGINE" --filename="$file" \
    --size=4M --direct=1 --rw=write --bs=4k --verify=crc32c --do_verify=0 2>"$out/corrupt-write.stderr"
  dd if=/dev/urandom of="$file" bs=4096 seek=100 count=1 conv=notrunc status=none
  sync
  echo 1 > /proc/sys/vm/drop_caches
  rc=0
  "$FIO" --aux-path="$out" --output-format=json --output="$out/corrupt-verify.json" \
    --name=corrupt --ioengine="external:$PLUGIO_FIO_ENGINE" --filename="$file" \
    --size=4M --direct=1 --rw=write --bs=4k --verify=crc32c --verify_only=1 \
    2>"$out/corrupt-verify.stderr" || rc=$?
  if ! python3 "$here/check.py" --expect-error 84 --expect-text "verify: bad" \
      "$out/corrupt-verify.json" "$out/corrupt-verify.stderr"; then
    failures=$((failures + 1))
  fi
else
  echo "not root: the loop device, ramfs and corruption checks are skipped"
fi

echo "fio on plugio: $(( $(date +%s) - start )) s of fio runs, $failures failure(s)"
[ "$failures" -eq 0 ]
