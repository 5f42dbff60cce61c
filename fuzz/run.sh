#!/usr/bin/env bash
# fuzz/run.sh: builds the cargo-fuzz targets and runs each for a while on
# its committed corpus (fuzz/corpus/TARGET, read only: new inputs go to a
# scratch directory). Fails on the first crash, leak or assertion, with
# the input in fuzz/artifacts/TARGET/ and the command that replays it.
#
# cargo-fuzz needs -Zsanitizer (nightly flags): with the stable toolchain
# they are let through by RUSTC_BOOTSTRAP=1, which this script sets.
#
# Usage: fuzz/run.sh [--seconds N] [TARGET...]
#   --seconds N   time per target (default 60)
#   TARGET        trace_csv trace_iolog trace_blkparse merge_model tag_set
#                 (default: all)
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_EACH=60
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift ;;
    -*) echo "usage: $0 [--seconds N] [TARGET...]" >&2; exit 2 ;;
    *) TARGETS+=("$1") ;;
  esac
  shift
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(trace_csv trace_iolog trace_blkparse merge_model tag_set)
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz is not installed: cargo install cargo-fuzz --version 0.13.2 --locked" >&2
  exit 1
fi
echo "+ cargo fuzz build -O" >&2
cargo fuzz build -O
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for t in "${TARGETS[@]}"; do
  mkdir -p "$scratch/$t"
  echo "+ cargo fuzz run -O $t <scratch> corpus/$t -- -max_total_time=$SECONDS_EACH" >&2
  log="$scratch/$t.log"
  if ! cargo fuzz run -O "$t" "$scratch/$t" "corpus/$t" -- \
      -max_total_time="$SECONDS_EACH" -print_final_stats=1 >"$log" 2>&1; then
    tail -60 "$log"
    echo "fuzz target $t failed: the input is in fuzz/artifacts/$t/ (replay: cargo fuzz run -O $t <file>)" >&2
    exit 1
  fi
  runs=$(grep -oE '^Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' || echo '?')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 || true)
  echo "fuzz $t: $runs runs in ${SECONDS_EACH} s, $cov, no failure"
done
