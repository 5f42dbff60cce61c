//! Tutorial 4: a sorted table (an LSM tree's SSTable) written, made
//! durable under its final name, scanned and deleted.
//!
//! The table is written as a bulk sequential stream of 4 KiB blocks with
//! many writes in flight, on a device whose plug limits are raised so
//! that the writes merge into 1 MiB requests with several of them in
//! flight; it is made durable (`fdatasync`), renamed from its temporary
//! name and its directory synced; then it is scanned with a readahead
//! window of reads in flight, every byte checked, and deleted durably.
//!
//! Run: `cargo run --release --example sstable [DIR]` (default: a
//! temporary directory under the current directory; DIR is created if
//! needed, and the table is deleted at the end).

use std::path::{Path, PathBuf};

use futures::stream::{FuturesOrdered, FuturesUnordered, StreamExt};
use plugio::{fs, Device, DeviceOptions, OpenOptions, RingConfig};

/// Every block, and so every write and read, is 4 KiB: aligned for
/// `O_DIRECT` on every common file system and disk.
const BLOCK_BYTES: usize = 4096;
/// The table: 4,096 blocks, 16 MiB.
const TABLE_BLOCKS: u64 = 4096;

// ANCHOR: options
/// Bios per request when the writes merge: the plug flushes at 256 bios
/// or 1 MiB of them, so 4 KiB writes become 1 MiB requests.
const PLUG_BIOS: usize = 256;
/// Writes kept in flight: four plugs' worth, so that four 1 MiB requests
/// are at the device while the writer fills the next.
const WRITES_IN_FLIGHT: usize = 4 * PLUG_BIOS;
/// Reads kept in flight while scanning (the readahead window).
const READAHEAD: usize = 64;

/// Options for a device written as one bulk sequential stream. With the
/// defaults (`plug_max_count` 32, `plug_flush_bytes` 128 KiB) 4 KiB writes
/// merge into 128 KiB requests, and 32 writes in flight are one request
/// in flight: raise the plug limits for bigger requests, and keep several
/// plugs' worth of writes in flight for several requests.
fn bulk_write_options() -> DeviceOptions {
    DeviceOptions {
        plug_max_count: PLUG_BIOS,
        plug_flush_bytes: (PLUG_BIOS * BLOCK_BYTES) as u64,
        ..DeviceOptions::default()
    }
}
// ANCHOR_END: options

/// The contents of block `b`: its number, then a pattern of it, so that a
/// block read from the wrong place is caught.
fn block_bytes(b: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&b.to_le_bytes());
    for (i, byte) in out[8..].iter_mut().enumerate() {
        *byte = (b as usize * 31 + i * 7) as u8;
    }
}

// ANCHOR: write
/// Writes the table as `dir/name`: under a temporary name first, with
/// [`WRITES_IN_FLIGHT`] writes in flight, then `fdatasync` (the blocks
/// and the file size needed to read them back), then the rename to the
/// final name and an `fsync` of the directory, which makes the new name
/// durable. A crash at any point leaves either no table or all of it.
async fn write_table(dir: &Path, name: &str) -> Result<PathBuf, plugio::Error> {
    let tmp = dir.join(format!("{name}.tmp"));
    let dev = OpenOptions::new()
        .create(true)
        .truncate(true)
        .device_options(bulk_write_options())
        .open(&tmp)
        .await?;
    let mut in_flight = FuturesUnordered::new();
    for b in 0..TABLE_BLOCKS {
        if in_flight.len() == WRITES_IN_FLIGHT {
            in_flight.next().await.expect("a write in flight")?;
        }
        let mut buf = dev.alloc_buf(BLOCK_BYTES);
        block_bytes(b, buf.as_mut_slice());
        let dev = dev.clone();
        let at = b * BLOCK_BYTES as u64;
        in_flight.push(async move { dev.write_all_at(buf, at).await.0 });
    }
    while let Some(written) = in_flight.next().await {
        written?;
    }
    dev.sync_data().await?;
    let s = dev.iostats();
    println!(
        "wrote {} blocks as {} write requests ({} bios merged), then fdatasync",
        TABLE_BLOCKS, s.write.ios, s.write.merges
    );
    // The writer's handle goes before readers open the file with other
    // options (one file has one set of options while it is open).
    drop(dev);
    let path = dir.join(name);
    fs::rename(&tmp, &path).await?;
    fs::sync_dir(dir).await?;
    Ok(path)
}
// ANCHOR_END: write

// ANCHOR: scan
/// Reads the whole table in order with [`READAHEAD`] reads in flight and
/// hands each block to `visit` in order; returns the blocks read.
async fn scan(dev: &Device, mut visit: impl FnMut(u64, &[u8])) -> Result<u64, plugio::Error> {
    let blocks = dev.metadata().await?.len_bytes / BLOCK_BYTES as u64;
    let mut window = FuturesOrdered::new();
    let mut next = 0;
    for b in 0..blocks {
        while next < blocks && window.len() < READAHEAD {
            window.push_back(dev.read_alloc_at(next * BLOCK_BYTES as u64, BLOCK_BYTES));
            next += 1;
        }
        let block = window.next().await.expect("a read in flight")?;
        visit(b, block.as_slice());
    }
    Ok(blocks)
}
// ANCHOR_END: scan

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir_in(std::env::current_dir()?)?;
    let dir = std::env::args()
        .nth(1)
        .map_or_else(|| tmp.path().to_path_buf(), PathBuf::from);
    std::fs::create_dir_all(&dir)?;
    let ex = plugio::runtime::local(RingConfig::default())?;
    ex.run(async {
        let path = write_table(&dir, "000001.sst").await?;
        // ANCHOR: check
        let dev = OpenOptions::new().read_only(true).open(&path).await?;
        let mut want = vec![0u8; BLOCK_BYTES];
        let mut bad = 0;
        let blocks = scan(&dev, |b, got| {
            block_bytes(b, &mut want);
            bad += usize::from(got != want.as_slice());
        })
        .await?;
        assert_eq!(
            (blocks, bad),
            (TABLE_BLOCKS, 0),
            "blocks read, blocks wrong"
        );
        let s = dev.iostats();
        println!(
            "scanned {blocks} blocks, every byte as written: {} read requests ({} bios merged)",
            s.read.ios, s.read.merges
        );
        // ANCHOR_END: check
        // ANCHOR: delete
        drop(dev);
        fs::remove_file(&path).await?;
        fs::sync_dir(&dir).await?;
        // ANCHOR_END: delete
        println!("deleted {}", path.display());
        Ok::<_, plugio::Error>(())
    })?;
    Ok(())
}
