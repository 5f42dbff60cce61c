#!/usr/bin/env bash
# A new crate that depends on `plugio` only (a path dependency), as a
# database would: it builds, runs the front page's write/sync/read-back,
# and its normal dependency tree names none of the CLI's or peers' crates.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/target/library-consumer"
rm -rf "$dir" && mkdir -p "$dir/src"
cat >"$dir/Cargo.toml" <<TOML
[package]
name = "consumer"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
plugio = { path = "$root" }

[workspace]
TOML
cat >"$dir/src/main.rs" <<'RS'
use plugio::{OpenOptions, RingConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).expect("path");
    let ex = plugio::runtime::local(RingConfig::default())?;
    ex.run(async {
        let dev = OpenOptions::new().create(true).truncate(true).open(&path).await?;
        let mut page = dev.alloc_buf(4096);
        page.as_mut_slice().fill(7);
        let (written, page) = dev.write_all_at(page, 0).await;
        written?;
        dev.sync_all().await?;
        let (read, back) = dev.read_exact_at(vec![0u8; 4096], 0).await;
        read?;
        assert_eq!(back, page.as_slice());
        Ok::<_, plugio::Error>(())
    })?;
    println!("consumer: wrote, synced and read back 4096 bytes");
    Ok(())
}
RS
cp "$root/Cargo.lock" "$dir/Cargo.lock"
# Its own target dir: the workspace's would rebuild with other features.
# Warnings denied: the runtime crates build clean without `test-util`.
(cd "$dir" && CARGO_TARGET_DIR="$dir/target" RUSTFLAGS="-D warnings" cargo build --release --quiet)
data="$(mktemp -p "$root/target" consumer.XXXXXX)"
"$dir/target/release/consumer" "$data"
rm -f "$data"
tree="$(cd "$dir" && cargo tree -e normal --prefix none | awk '{print $1}' | sort -u)"
echo "consumer's normal dependency tree: $(echo "$tree" | wc -l) crates"
bad="$(echo "$tree" | grep -xE 'glommio|tokio|tokio-uring|monoio|compio|plotters|clap|indicatif|zstd|hdrhistogram' || true)"
if [ -n "$bad" ]; then
  echo "plugio pulls CLI/peer crates into a library user's build: $bad" >&2
  exit 1
fi
