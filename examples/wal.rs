//! Tutorial 1: a write-ahead log with group commit.
//!
//! Many tasks append records; one committer task takes every record that
//! queued up while the previous commit was in flight, writes them as one
//! block-aligned batch, makes the batch durable once (a FUA write, or a
//! write followed by `fdatasync`), and acknowledges all of them. The log is
//! then read back and checked record by record.
//!
//! Run: `cargo run --release --example wal [PATH]` (default: a file in a
//! temporary directory under the current directory; PATH is overwritten).

use std::error::Error as StdError;
use std::fmt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use futures::channel::oneshot;
use plugio::executor::channel::{bounded, Receiver, Sender};
use plugio::{Device, DmaBuf, IoFlags, OpenOptions, RingConfig};

/// Every batch starts and ends on a block boundary: 4096 satisfies the
/// O_DIRECT alignment of every common file system and disk.
const BLOCK_BYTES: u64 = 4096;
/// Batch header: magic, payload length, record count, checksum, first LSN.
const HEADER_BYTES: usize = 24;
const MAGIC: u32 = u32::from_le_bytes(*b"PLWG");
const WRITERS: usize = 64;
const RECORDS_PER_WRITER: usize = 200;

// ANCHOR: types
/// A log sequence number: the 1-based position of a record in the log.
type Lsn = u64;

/// How the committer makes a batch durable.
#[derive(Clone, Copy, Debug)]
enum Durability {
    /// One write with `IoFlags::FUA` (`RWF_DSYNC`): durable when it
    /// completes.
    Fua,
    /// A plain write, then `Device::sync_data` (`fdatasync`).
    Fdatasync,
}

/// What can go wrong in the log.
#[derive(Debug)]
enum WalError {
    /// The device refused or failed an IO.
    Io(plugio::Error),
    /// The commit of this record's batch failed (the committer's error,
    /// as text: every writer of the batch gets it); the record is not
    /// known to be durable.
    CommitFailed(String),
    /// The committer is gone (it failed earlier, or the log was closed).
    Closed,
    /// A batch on disk does not match its checksum or header.
    Corrupt { offset_bytes: u64, why: String },
}
// ANCHOR_END: types

impl fmt::Display for WalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WalError::Io(e) => write!(f, "log IO failed: {e}"),
            WalError::CommitFailed(why) => write!(f, "the batch's commit failed: {why}"),
            WalError::Closed => write!(f, "the log committer has stopped"),
            WalError::Corrupt { offset_bytes, why } => {
                write!(f, "corrupt batch at byte {offset_bytes}: {why}")
            }
        }
    }
}

impl StdError for WalError {}

impl From<plugio::Error> for WalError {
    fn from(e: plugio::Error) -> Self {
        WalError::Io(e)
    }
}

// ANCHOR: append
/// One record waiting to be committed, and where to send its LSN.
struct Append {
    payload: Vec<u8>,
    done: oneshot::Sender<Result<Lsn, String>>,
}

/// The appenders' handle: cheap to clone, one per task.
#[derive(Clone)]
struct Wal {
    queue: Sender<Append>,
}

impl Wal {
    /// Appends `payload` and returns its LSN once the record is durable.
    async fn append(&self, payload: Vec<u8>) -> Result<Lsn, WalError> {
        let (done, acked) = oneshot::channel();
        self.queue
            .send(Append { payload, done })
            .await
            .map_err(|_| WalError::Closed)?;
        match acked.await {
            Ok(Ok(lsn)) => Ok(lsn),
            Ok(Err(why)) => Err(WalError::CommitFailed(why)),
            Err(_) => Err(WalError::Closed),
        }
    }
}
// ANCHOR_END: append

/// What the committer did.
#[derive(Clone, Copy, Debug, Default)]
struct CommitStats {
    commits: u64,
    records: u64,
    bytes: u64,
    largest_batch: usize,
}

// ANCHOR: commit
/// The group commit loop: waits for one record, takes every other record
/// already queued, writes them as one batch, makes it durable once and
/// acknowledges them all. Records that arrive while this batch is being
/// written form the next batch.
async fn commit_loop(
    dev: Device,
    mut queue: Receiver<Append>,
    durability: Durability,
) -> Result<CommitStats, WalError> {
    let mut stats = CommitStats::default();
    let mut tail_bytes = 0u64;
    let mut next_lsn: Lsn = 1;
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = queue.try_recv() {
            batch.push(more);
        }
        let buf = encode_batch(&dev, &batch, next_lsn);
        let len_bytes = buf.len() as u64;
        let result = match durability {
            Durability::Fua => dev.write_at_with(buf, tail_bytes, IoFlags::FUA).await.0,
            Durability::Fdatasync => match dev.write_at(buf, tail_bytes).await.0 {
                Ok(n) => dev.sync_data().await.map(|()| n),
                Err(e) => Err(e),
            },
        };
        if let Err(e) = result {
            // Nothing of this batch is known durable: fail every record in
            // it, and stop (a real log would retry or go read-only).
            for a in batch {
                let _ = a.done.send(Err(e.to_string()));
            }
            return Err(e.into());
        }
        stats.commits += 1;
        stats.records += batch.len() as u64;
        stats.bytes += len_bytes;
        stats.largest_batch = stats.largest_batch.max(batch.len());
        for a in batch {
            // A dropped receiver means the appender stopped waiting; its
            // record is durable anyway.
            let _ = a.done.send(Ok(next_lsn));
            next_lsn += 1;
        }
        tail_bytes += len_bytes;
    }
    Ok(stats)
}
// ANCHOR_END: commit

// ANCHOR: encode
/// Lays a batch out as `[header][len u32, payload]...` padded with zeroes to
/// a whole number of blocks, in a buffer aligned for the device.
fn encode_batch(dev: &Device, batch: &[Append], first_lsn: Lsn) -> DmaBuf {
    let payload_bytes: usize = batch.iter().map(|a| 4 + a.payload.len()).sum();
    let total = (HEADER_BYTES + payload_bytes).next_multiple_of(BLOCK_BYTES as usize);
    let mut buf = dev.alloc_buf(total);
    let bytes = buf.as_mut_slice();
    bytes.fill(0); // a cached buffer holds its last user's bytes
    let mut at = HEADER_BYTES;
    for a in batch {
        bytes[at..at + 4].copy_from_slice(&(a.payload.len() as u32).to_le_bytes());
        bytes[at + 4..at + 4 + a.payload.len()].copy_from_slice(&a.payload);
        at += 4 + a.payload.len();
    }
    let checksum = fnv1a(&bytes[HEADER_BYTES..at]);
    bytes[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    bytes[4..8].copy_from_slice(&(payload_bytes as u32).to_le_bytes());
    bytes[8..12].copy_from_slice(&(batch.len() as u32).to_le_bytes());
    bytes[12..16].copy_from_slice(&checksum.to_le_bytes());
    bytes[16..24].copy_from_slice(&first_lsn.to_le_bytes());
    buf
}
// ANCHOR_END: encode

/// FNV-1a, 32 bits: enough to catch a torn or stale batch in a tutorial
/// (a real log would use CRC32C).
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

// ANCHOR: recover
/// Reads the log from the start and returns its records in LSN order:
/// batch by batch, until a block that does not start a batch (zeroes or
/// the end of the file).
async fn read_log(dev: &Device) -> Result<Vec<Vec<u8>>, WalError> {
    let mut records = Vec::new();
    let mut at_bytes = 0u64;
    loop {
        let head = dev.read_alloc_at(at_bytes, BLOCK_BYTES as usize).await?;
        let h = head.as_slice();
        if h.len() < HEADER_BYTES || le_u32(h, 0) != MAGIC {
            return Ok(records);
        }
        let payload_bytes = le_u32(h, 4) as usize;
        let count = le_u32(h, 8) as usize;
        let first_lsn = u64::from_le_bytes(h[16..24].try_into().unwrap_or_default());
        let corrupt = |why: String| WalError::Corrupt {
            offset_bytes: at_bytes,
            why,
        };
        if first_lsn != records.len() as u64 + 1 {
            return Err(corrupt(format!(
                "first LSN {first_lsn}, expected {}",
                records.len() + 1
            )));
        }
        let total = (HEADER_BYTES + payload_bytes).next_multiple_of(BLOCK_BYTES as usize);
        let batch = if total > h.len() {
            dev.read_alloc_at(at_bytes, total).await?
        } else {
            head
        };
        let b = batch.as_slice();
        if b.len() < total {
            return Err(corrupt(format!("{} of {total} bytes on disk", b.len())));
        }
        let payload = &b[HEADER_BYTES..HEADER_BYTES + payload_bytes];
        if fnv1a(payload) != le_u32(b, 12) {
            return Err(corrupt("checksum mismatch".into()));
        }
        let mut p = 0;
        for _ in 0..count {
            let len = le_u32(payload, p) as usize;
            records.push(payload[p + 4..p + 4 + len].to_vec());
            p += 4 + len;
        }
        at_bytes += total as u64;
    }
}
// ANCHOR_END: recover

/// The record writer `w` appends as its `seq`th: varying lengths, so that
/// batches do not line up with blocks.
fn record(w: usize, seq: usize) -> Vec<u8> {
    let mut r = format!("writer {w:02} record {seq:04} ").into_bytes();
    r.resize(r.len() + (w * 7 + seq * 13) % 180, b'a' + (seq % 26) as u8);
    r
}

// ANCHOR: run
/// Runs `WRITERS` tasks appending `RECORDS_PER_WRITER` records each through
/// one committer, then checks every acknowledged LSN against the log on
/// disk.
async fn run(path: &Path, durability: Durability) -> Result<(), Box<dyn StdError>> {
    // Start from an empty log (an async open: no blocking call on the core).
    let dev = OpenOptions::new()
        .create(true)
        .truncate(true)
        .open(path)
        .await?;
    let (queue, incoming) = bounded::<Append>(4 * WRITERS);
    let committer = plugio::spawn_local(commit_loop(dev.clone(), incoming, durability));
    let wal = Rc::new(Wal { queue });

    let started = Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let wal = wal.clone();
            plugio::spawn_local(async move {
                let mut acked = Vec::with_capacity(RECORDS_PER_WRITER);
                for seq in 0..RECORDS_PER_WRITER {
                    // Each writer waits for its record to be durable before
                    // the next, like a transaction commit.
                    acked.push((wal.append(record(w, seq)).await?, seq));
                }
                Ok::<_, WalError>(acked)
            })
        })
        .collect();
    let mut acked = Vec::new();
    for (w, handle) in writers.into_iter().enumerate() {
        for (lsn, seq) in handle.await?? {
            acked.push((lsn, w, seq));
        }
    }
    drop(wal); // the last sender: the committer's queue closes
    let stats = committer.await??;
    let elapsed = started.elapsed();
    // ANCHOR_END: run

    // ANCHOR: check
    let log = read_log(&dev).await?;
    let total = WRITERS * RECORDS_PER_WRITER;
    assert_eq!(log.len(), total, "records in the log");
    assert_eq!(acked.len(), total, "records acknowledged");
    acked.sort_unstable();
    for (i, &(lsn, w, seq)) in acked.iter().enumerate() {
        assert_eq!(lsn, i as u64 + 1, "LSNs are dense and unique");
        assert_eq!(log[i], record(w, seq), "record at LSN {lsn}");
    }
    // One writer waits for each commit before its next record, so only
    // several writers give the committer records to group.
    if WRITERS > 1 {
        assert!(
            stats.commits < total as u64,
            "group commit grouped nothing: {} commits for {total} records",
            stats.commits
        );
    }
    let io = dev.iostats();
    println!(
        "{durability:?}: {total} records from {WRITERS} writer{} in {} commits \
         ({:.1} records/commit, largest {}), {} KiB in {:.0} ms; \
         device: {} write requests ({} FUA), {} flushes",
        if WRITERS == 1 { "" } else { "s" },
        stats.commits,
        stats.records as f64 / stats.commits as f64,
        stats.largest_batch,
        stats.bytes / 1024,
        elapsed.as_secs_f64() * 1e3,
        io.write.ios,
        io.fua_writes,
        io.flush.ios,
    );
    Ok(())
}
// ANCHOR_END: check

// ANCHOR: refused
/// O_DIRECT needs aligned offsets, lengths and buffers: a misaligned write
/// is refused with a typed error before anything is submitted, and the log
/// is not touched.
async fn misaligned_write_is_refused(dev: &Device) -> Result<(), Box<dyn StdError>> {
    let before = dev.iostats().bios;
    let buf = dev.alloc_buf(BLOCK_BYTES as usize);
    let (result, _buf) = dev.write_at(buf, 100).await;
    let Err(e) = result else {
        return Err("a write at byte 100 was accepted by an O_DIRECT log".into());
    };
    assert!(
        matches!(e.kind(), plugio::ErrorKind::InvalidInput(_)),
        "{e}"
    );
    assert_eq!(
        dev.iostats().bios,
        before,
        "a refused IO never becomes a bio"
    );
    println!("refused as expected: {e}");
    Ok(())
}
// ANCHOR_END: refused

fn main() -> std::process::ExitCode {
    match try_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wal: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn try_main() -> Result<(), Box<dyn StdError>> {
    let dir = tempfile::tempdir_in(std::env::current_dir()?)?;
    let given = std::env::args().nth(1).map(PathBuf::from);
    // Without an argument the file lives in a temporary directory that is
    // deleted on exit: say so rather than print a path that will not exist.
    let shown = given.as_ref().map_or_else(
        || "a temporary file, deleted on exit".to_owned(),
        |p| p.display().to_string(),
    );
    let path = given.unwrap_or_else(|| dir.path().join("wal.log"));
    let ex = plugio::runtime::local(RingConfig::default())?;
    for durability in [Durability::Fua, Durability::Fdatasync] {
        ex.run(run(&path, durability))?;
    }
    ex.run(async {
        let dev = OpenOptions::new().open(&path).await?;
        misaligned_write_is_refused(&dev).await
    })?;
    println!("wal: all records read back in LSN order ({})", shown);
    Ok(())
}
