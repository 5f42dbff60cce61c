#!/usr/bin/env bash
# Builds fio from Debian's source package and the plugio engine against that
# same tree, so that the fio binary and the headers the engine is compiled
# with always match.
#
#   benches/fio-engine/build.sh        # prints the fio binary and the engine path
#
# - fio: `apt-get source fio` into target/fio-src (a deb-src entry for the
#   running release is added when apt has none), then `./configure && make
#   fio`. Skipped when target/fio-src/fio-*/fio exists. FIO_SRC=DIR uses a
#   configured and built fio tree instead.
# - the engine: `cargo build --release -p plugio-fio` with FIO_SRC set, so
#   build.rs compiles the C shim against it; the result,
#   target/release/libplugio_fio.so, must export `get_ioengine`.
# Writes target/fio-engine.env (export FIO=..., PLUGIO_FIO_ENGINE=...) for the
# scripts that run fio.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$(pwd)"

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

fetch_fio_source() {
  if ! command -v dpkg-source >/dev/null || ! command -v make >/dev/null || ! command -v cc >/dev/null; then
    as_root apt-get update -qq
    as_root apt-get install -y -qq dpkg-dev make gcc >/dev/null
  fi
  if ! apt-get source --print-uris fio >/dev/null 2>&1; then
    . /etc/os-release
    echo "adding a deb-src entry for Debian $VERSION_CODENAME (apt-get source needs one)"
    as_root tee /etc/apt/sources.list.d/plugio-fio-src.sources >/dev/null <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $VERSION_CODENAME
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    as_root apt-get update -qq
  fi
  mkdir -p target/fio-src
  (cd target/fio-src && apt-get source -qq fio 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
}

# The newest fio source tree under target/fio-src (empty when none).
newest_tree() {
  local d best=""
  for d in "$root"/target/fio-src/fio-*/; do
    [ -d "$d" ] || continue
    best="$(printf '%s\n%s\n' "$best" "${d%/}" | sed '/^$/d' | sort -V | tail -n 1)"
  done
  printf '%s' "$best"
}

if [ -z "${FIO_SRC:-}" ]; then
  FIO_SRC="$(newest_tree)"
  if [ -z "$FIO_SRC" ] || [ ! -x "$FIO_SRC/fio" ]; then
    if [ -z "$FIO_SRC" ]; then
      echo "fetching fio's Debian source into target/fio-src"
      fetch_fio_source
      FIO_SRC="$(newest_tree)"
      [ -n "$FIO_SRC" ] || { echo "apt-get source fio left no target/fio-src/fio-*" >&2; exit 1; }
    fi
    echo "building fio in $FIO_SRC"
    (cd "$FIO_SRC" && ./configure >configure.log 2>&1 && make -j"$(nproc)" fio >make.log 2>&1) || {
      echo "fio build failed: see $FIO_SRC/configure.log and $FIO_SRC/make.log" >&2
      exit 1
    }
  fi
fi
test -f "$FIO_SRC/config-host.h" || { echo "FIO_SRC=$FIO_SRC is not a configured fio tree" >&2; exit 1; }
export FIO_SRC
cargo build --release --quiet -p plugio-fio
engine="$root/target/release/libplugio_fio.so"
if ! nm -D --defined-only "$engine" | grep -q ' get_ioengine$'; then
  echo "$engine exports no get_ioengine: the C shim was not built" >&2
  exit 1
fi
# Exported: fio expands ${PLUGIO_FIO_ENGINE} in job files from its own
# environment, so a shell that sources this file passes it on.
cat >target/fio-engine.env <<ENV
export FIO=$FIO_SRC/fio
export PLUGIO_FIO_ENGINE=$engine
ENV
echo "fio:    $FIO_SRC/fio ($("$FIO_SRC/fio" --version))"
echo "engine: $engine"
