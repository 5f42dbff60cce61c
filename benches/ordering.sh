#!/usr/bin/env bash
# benches/ordering.sh: what exact write ordering costs (issue #13), the
# `### Write ordering` table of benches/RESULTS.md.
#
# Runs engine/examples/ordering.rs (release) on a 64 MiB file on the
# disk-backed file system holding target/ (O_DIRECT): 4,000 one-block
# writes issued at once to ~333 offsets (about 12 writers each, scattered)
# against 4,000 writes to distinct offsets and 4,000 reads of the ~333
# offsets, all at queue depth 128; and 20,000 IOs, half writes, at random
# offsets with queue depth 256 and 65,536. Each round runs every case
# once, in turn; the table has medians. With BEFORE=binary (the same
# example built from an older tree) that binary runs right after, on the
# same file, and its table is printed below.
#
# Usage: benches/ordering.sh [--quick] [--rounds N] [--buffered]
#   --quick     one round (CI: checks that it runs; no thresholds)
#   --buffered  page-cached writes instead of O_DIRECT (CPU cost only)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=5
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) ROUNDS=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --buffered) EXTRA+=(--buffered) ;;
    *) echo "usage: $0 [--quick] [--rounds N] [--buffered]" >&2; exit 2 ;;
  esac
  shift
done
echo "+ cargo build --release --example ordering -p plugio-engine" >&2
cargo build --release --quiet --example ordering -p plugio-engine
WORK=target/ordering
mkdir -p "$WORK"
FILE=$WORK/target.bin
[ "$(stat -c %s "$FILE" 2>/dev/null || echo 0)" = $((64 << 20)) ] || head -c $((64 << 20)) /dev/zero > "$FILE"
# The build's target directory (CARGO_TARGET_DIR or a cargo config may
# move it from ./target).
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps 2>/dev/null | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
TARGET_DIR=${TARGET_DIR:-target}
NOW=$TARGET_DIR/release/examples/ordering
echo "+ $NOW $FILE --rounds $ROUNDS ${EXTRA[*]}" >&2
"$NOW" "$FILE" --rounds "$ROUNDS" "${EXTRA[@]}"
if [ -n "${BEFORE:-}" ]; then
  echo
  echo "before ($BEFORE):"
  "$BEFORE" "$FILE" --rounds "$ROUNDS" "${EXTRA[@]}"
fi
