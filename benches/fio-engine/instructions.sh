#!/usr/bin/env bash
# User-space instructions per IO of fio with the plugio engine and with its
# io_uring engine (callgrind), on a page-cached file: a count that load on
# the machine does not move, to say where a CPU-bound run spends its
# cycles outside the kernel.
#
#   benches/fio-engine/instructions.sh [--ios N]
#
# Each engine runs twice under callgrind (`--thread`, one job): N and 3N
# IOs; the difference divided by 2N is the cost of one IO, without fio's
# start-up. The table splits it by object (fio itself, the plugio engine
# library, libc), gives the locked instructions per IO (`lock`-prefixed and
# xchg with memory, counted by benches/tools/cglock.py from the
# --dump-instr=yes runs), and lists the engine library's top functions.
#
# callgrind cannot decode the AVX-512 instructions of a fio built with
# -march=native (fio's default), so this script builds a second fio with
# `./configure --disable-native` from the same source tree into
# target/fio-cg/ (its config-host.h differs only in that switch, so the
# engine built by build.sh loads into it unchanged).
set -euo pipefail
cd "$(dirname "$0")/../.."
n=20000
while [ $# -gt 0 ]; do
  case "$1" in
    --ios) n="$2"; shift 2 ;;
    *) echo "usage: $0 [--ios N]" >&2; exit 2 ;;
  esac
done
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
benches/fio-engine/build.sh >/dev/null
# shellcheck disable=SC1091
. target/fio-engine.env
src="$(dirname "$FIO")"
out=target/fio-cg
fio_cg=$out/fio/fio
if [ ! -x "$fio_cg" ]; then
  echo "building fio without -march=native in $out/fio"
  rm -rf "$out/fio"; mkdir -p "$out"
  cp -r "$src" "$out/fio"
  (cd "$out/fio" && make clean >/dev/null 2>&1; ./configure --disable-native >/dev/null && make -j"$(nproc)" fio >/dev/null)
fi
data=$out/cache.dat
[ -f "$data" ] || head -c $((64 << 20)) /dev/urandom > "$data"
cat "$data" > /dev/null

# run ENGINE WORKLOAD IOS
run() {
  local engine=$1 workload=$2 ios=$3 eng rw=randread qd=128
  [ "$workload" = seqread ] && { rw=read; qd=32; }
  case "$engine" in
    io_uring) eng=(--ioengine=io_uring --fixedbufs=1 --registerfiles=1) ;;
    plugio) eng=(--ioengine="external:$PLUGIO_FIO_ENGINE") ;;
  esac
  valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$out/$engine-$workload-$ios.out" \
    "$fio_cg" --name=cg --thread --filename="$data" "${eng[@]}" --rw="$rw" --bs=4k \
    --iodepth="$qd" --iodepth_batch_submit=32 --iodepth_batch_complete_min=32 --direct=0 \
    --number_ios="$ios" --io_size=100g --invalidate=0 --randrepeat=0 --norandommap \
    --output-format=json --output="$out/$engine-$workload-$ios.json" >/dev/null 2>&1
}

for workload in randread seqread; do
  for engine in io_uring plugio; do
    run "$engine" "$workload" "$n"
    run "$engine" "$workload" $((3 * n))
  done
done
python3 benches/fio-engine/callgrind_per_io.py "$out" "$n"
