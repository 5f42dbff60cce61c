#!/usr/bin/env bash
# benches/sim.sh: the seeded crash and fault simulator (issue #13,
# engine/tests/sim) over many seeds, in release mode; prints the figures
# of benches/RESULTS.md's `## Reliability` simulator table (seeds, IOs,
# faults injected, IOs failed by them, bytes checked, failures, seeds per
# second).
#
# Each seed is one random database-like run through Device on the mem
# device from 1 or 2 cores with faults and a power cut at a random point;
# see the doc of engine/tests/sim/main.rs. A failing seed prints the one
# command that replays it, and the script exits non-zero.
#
# Usage: benches/sim.sh [--seeds N] [--first S]
#   --seeds N   seeds to run (default 10000)
#   --first S   first seed (default 1000000: beyond the 0..500 CI runs)
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=10000
FIRST=1000000
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) SEEDS=$2; shift ;;
    --first) FIRST=$2; shift ;;
    *) echo "usage: $0 [--seeds N] [--first S]" >&2; exit 2 ;;
  esac
  shift
done
echo "+ cargo test --release -p plugio-engine --test sim --no-run" >&2
cargo test --release --quiet -p plugio-engine --test sim --no-run
echo "+ PLUGIO_SIM_FIRST=$FIRST PLUGIO_SIM_SEEDS=$SEEDS cargo test --release -p plugio-engine --test sim -- --exact seeds --nocapture" >&2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
PLUGIO_SIM_FIRST=$FIRST PLUGIO_SIM_SEEDS=$SEEDS \
  cargo test --release --quiet -p plugio-engine --test sim -- --exact seeds --nocapture \
  2>&1 | tee "$out" | grep -E '^(seed |  |sim:)' || true
grep -q '^sim: .* 0 failures' "$out" || status=1
line=$(grep '^sim:' "$out" || true)
if [ -z "$line" ]; then
  echo "sim.sh: the simulator printed no summary (see above)" >&2
  exit 1
fi
echo
echo "| seeds | IOs | faults injected | IOs failed by faults | bytes checked | failures | seeds/s |"
echo "|---|---|---|---|---|---|---|"
echo "$line" | sed -E 's/^sim: seeds [0-9]+\.\.[0-9]+: ([0-9]+) seeds, ([0-9]+) IOs, ([0-9]+) faults injected, ([0-9]+) IOs failed by faults, ([0-9]+) bytes checked, ([0-9]+) failures, [0-9.]+ s, ([0-9.]+) seeds\/s$/| \1 | \2 | \3 | \4 | \5 | \6 | \7 |/'
exit $status
