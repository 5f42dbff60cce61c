//! Tutorial 3: a sharded key-value store, one shard per core.
//!
//! A `Runtime` with two cores runs one shard on each. A shard owns its log
//! file and its data file (a hash table of 4 KiB bucket pages) and is the
//! only task that touches them, so it needs no locks. Clients on both
//! cores send requests to the key's shard over a cross-core channel and
//! get the reply over a oneshot channel. A shard serves requests in
//! batches: every put of a batch goes into one FUA log write (group
//! commit), the touched buckets are read in one plug and written back in
//! one plug. At the end each shard's log is replayed and compared with its
//! data file and with what the clients wrote.
//!
//! Run: `cargo run --release --example kv [DIR]` (default: a temporary
//! directory under the current directory; files `shard-N.log` and
//! `shard-N.data` in DIR are overwritten).

use std::collections::{BTreeSet, HashMap};
use std::error::Error as StdError;
use std::fmt;
use std::path::{Path, PathBuf};

use futures::channel::oneshot;
use futures::future::join_all;
use plugio::executor::channel::{bounded, Receiver, Sender};
use plugio::{Device, DmaBuf, Error, IoFlags, OpenOptions, RingConfig, ShutdownMode};

const SHARDS: usize = 2;
const BUCKETS: u64 = 256;
const PAGE_BYTES: usize = 4096;
const CLIENTS_PER_CORE: usize = 16;
const KEYS_PER_CLIENT: usize = 64;
const LOG_MAGIC: u32 = u32::from_le_bytes(*b"PLKV");

// ANCHOR: request
/// What can go wrong in the store. `Clone + Send`: it travels back to the
/// client's core in the reply.
#[derive(Clone, Debug)]
enum KvError {
    /// The shard's device refused or failed an IO.
    Io(Error),
    /// The key's bucket page has no room left for the entry.
    BucketFull { shard: usize, bucket: u64 },
    /// The shard stopped (an earlier error) before answering.
    ShardGone(usize),
    /// A log batch on disk does not match its header or checksum.
    CorruptLog { shard: usize, offset_bytes: u64 },
}

/// One request to a shard; the reply goes back over `done`.
enum Request {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        done: oneshot::Sender<Result<(), KvError>>,
    },
    Get {
        key: Vec<u8>,
        done: oneshot::Sender<Result<Option<Vec<u8>>, KvError>>,
    },
}
// ANCHOR_END: request

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::Io(e) => write!(f, "shard IO failed: {e}"),
            KvError::BucketFull { shard, bucket } => {
                write!(f, "bucket {bucket} of shard {shard} is full")
            }
            KvError::ShardGone(s) => write!(f, "shard {s} stopped before answering"),
            KvError::CorruptLog {
                shard,
                offset_bytes,
            } => write!(f, "log of shard {shard} is corrupt at byte {offset_bytes}"),
        }
    }
}

impl StdError for KvError {}

impl From<Error> for KvError {
    fn from(e: Error) -> Self {
        KvError::Io(e)
    }
}

/// FNV-1a, 64 bits: picks the shard and the bucket of a key.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

// ANCHOR: route
fn shard_of(key: &[u8]) -> usize {
    (fnv1a(key) % SHARDS as u64) as usize
}

fn bucket_of(key: &[u8]) -> u64 {
    (fnv1a(key) / SHARDS as u64) % BUCKETS
}

/// The clients' handle: one sender per shard. `Clone + Send`, so every
/// task on every core can hold one.
#[derive(Clone)]
struct Kv {
    shards: Vec<Sender<Request>>,
}

impl Kv {
    async fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        let shard = shard_of(key);
        let (done, reply) = oneshot::channel();
        let req = Request::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            done,
        };
        self.shards[shard]
            .send(req)
            .await
            .map_err(|_| KvError::ShardGone(shard))?;
        reply.await.map_err(|_| KvError::ShardGone(shard))?
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        let shard = shard_of(key);
        let (done, reply) = oneshot::channel();
        let req = Request::Get {
            key: key.to_vec(),
            done,
        };
        self.shards[shard]
            .send(req)
            .await
            .map_err(|_| KvError::ShardGone(shard))?;
        reply.await.map_err(|_| KvError::ShardGone(shard))?
    }
}
// ANCHOR_END: route

// ANCHOR: bucket
/// A bucket page: `[count u16]` then `[key len u16][value len u16][key][value]`
/// per entry, zero padded.
type Bucket = Vec<(Vec<u8>, Vec<u8>)>;

fn decode_bucket(page: &[u8]) -> Bucket {
    let u16_at = |at: usize| usize::from(u16::from_le_bytes([page[at], page[at + 1]]));
    let mut entries = Vec::new();
    let mut at = 2;
    for _ in 0..u16_at(0) {
        let (k, v) = (u16_at(at), u16_at(at + 2));
        let key = page[at + 4..at + 4 + k].to_vec();
        let value = page[at + 4 + k..at + 4 + k + v].to_vec();
        entries.push((key, value));
        at += 4 + k + v;
    }
    entries
}

/// Encodes `bucket` into `page`; `false` when it does not fit.
fn encode_bucket(bucket: &Bucket, page: &mut [u8]) -> bool {
    let need: usize = 2 + bucket
        .iter()
        .map(|(k, v)| 4 + k.len() + v.len())
        .sum::<usize>();
    if need > page.len() {
        return false;
    }
    page.fill(0);
    page[0..2].copy_from_slice(&(bucket.len() as u16).to_le_bytes());
    let mut at = 2;
    for (k, v) in bucket {
        page[at..at + 2].copy_from_slice(&(k.len() as u16).to_le_bytes());
        page[at + 2..at + 4].copy_from_slice(&(v.len() as u16).to_le_bytes());
        page[at + 4..at + 4 + k.len()].copy_from_slice(k);
        page[at + 4 + k.len()..at + 4 + k.len() + v.len()].copy_from_slice(v);
        at += 4 + k.len() + v.len();
    }
    true
}
// ANCHOR_END: bucket

/// A log batch: `[magic u32][payload len u32][entries u32][checksum u32]`,
/// then `[key len u16][value len u16][key][value]` per put, zero padded to
/// whole pages.
fn encode_log_batch(dev: &Device, puts: &[(&[u8], &[u8])]) -> DmaBuf {
    let payload: Vec<u8> = puts
        .iter()
        .flat_map(|(k, v)| {
            let lens = [
                (k.len() as u16).to_le_bytes(),
                (v.len() as u16).to_le_bytes(),
            ];
            lens.concat()
                .into_iter()
                .chain(k.iter().copied())
                .chain(v.iter().copied())
        })
        .collect();
    let total = (16 + payload.len()).next_multiple_of(PAGE_BYTES);
    let mut buf = dev.alloc_buf(total);
    let b = buf.as_mut_slice();
    b.fill(0);
    b[0..4].copy_from_slice(&LOG_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    b[8..12].copy_from_slice(&(puts.len() as u32).to_le_bytes());
    b[12..16].copy_from_slice(&(fnv1a(&payload) as u32).to_le_bytes());
    b[16..16 + payload.len()].copy_from_slice(&payload);
    buf
}

/// What one shard did.
#[derive(Clone, Copy, Debug, Default)]
struct ShardStats {
    batches: u64,
    puts: u64,
    gets: u64,
    largest_batch: usize,
}

// ANCHOR: shard
/// One shard: the only task that touches its two files. Runs until every
/// client's sender is gone.
async fn serve_shard(
    shard: usize,
    dir: PathBuf,
    mut requests: Receiver<Request>,
) -> Result<ShardStats, KvError> {
    // The shard makes its own files (async opens on its core), sizes the
    // data file, and makes their names durable before serving.
    let create = || OpenOptions::new().create(true).truncate(true).clone();
    let log = create()
        .open(dir.join(format!("shard-{shard}.log")))
        .await?;
    let data = create()
        .open(dir.join(format!("shard-{shard}.data")))
        .await?;
    data.set_len(BUCKETS * PAGE_BYTES as u64).await?;
    plugio::fs::sync_dir(&dir).await?;
    let mut log_tail_bytes = 0u64;
    let mut stats = ShardStats::default();
    while let Some(first) = requests.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = requests.try_recv() {
            batch.push(more);
        }
        stats.batches += 1;
        stats.largest_batch = stats.largest_batch.max(batch.len());
        match apply_batch(shard, &log, &data, &mut log_tail_bytes, &mut stats, batch).await {
            Ok(()) => {}
            Err(e @ KvError::BucketFull { .. }) => eprintln!("shard {shard}: {e}"),
            Err(e) => return Err(e), // the log or the data file failed: stop
        }
    }
    Ok(stats)
}
// ANCHOR_END: shard

// ANCHOR: batch
/// Serves one batch: (1) the batch's puts go to the log in one FUA write;
/// (2) every touched bucket is read, all in one plug; (3) the requests are
/// applied in arrival order to the buckets in memory, gets answered from
/// them; (4) changed buckets are written back, all in one plug; then the
/// puts are acknowledged.
async fn apply_batch(
    shard: usize,
    log: &Device,
    data: &Device,
    log_tail_bytes: &mut u64,
    stats: &mut ShardStats,
    batch: Vec<Request>,
) -> Result<(), KvError> {
    let puts: Vec<(&[u8], &[u8])> = batch
        .iter()
        .filter_map(|r| match r {
            Request::Put { key, value, .. } => Some((key.as_slice(), value.as_slice())),
            Request::Get { .. } => None,
        })
        .collect();
    if !puts.is_empty() {
        let buf = encode_log_batch(log, &puts);
        let len = buf.len() as u64;
        let (written, _) = log.write_at_with(buf, *log_tail_bytes, IoFlags::FUA).await;
        if let Err(e) = written {
            fail_all(batch, KvError::Io(e.clone()));
            return Err(e.into());
        }
        *log_tail_bytes += len;
    }

    let touched: BTreeSet<u64> = batch.iter().map(|r| bucket_of(request_key(r))).collect();
    let reads = touched
        .iter()
        .map(|&b| data.read_alloc_at(b * PAGE_BYTES as u64, PAGE_BYTES));
    let mut pages: HashMap<u64, DmaBuf> = HashMap::new();
    for (&b, page) in touched.iter().zip(join_all(reads).await) {
        pages.insert(b, page?);
    }

    let mut changed = BTreeSet::new();
    let mut acks = Vec::new();
    for req in batch {
        match req {
            Request::Get { key, done } => {
                stats.gets += 1;
                let bucket = decode_bucket(pages[&bucket_of(&key)].as_slice());
                let found = bucket.into_iter().find(|(k, _)| *k == key).map(|(_, v)| v);
                let _ = done.send(Ok(found));
            }
            Request::Put { key, value, done } => {
                stats.puts += 1;
                let b = bucket_of(&key);
                let page = pages.get_mut(&b).expect("every touched bucket was read");
                let mut bucket = decode_bucket(page.as_slice());
                match bucket.iter_mut().find(|(k, _)| *k == key) {
                    Some(entry) => entry.1 = value,
                    None => bucket.push((key, value)),
                }
                if encode_bucket(&bucket, page.as_mut_slice()) {
                    changed.insert(b);
                    acks.push(done);
                } else {
                    let _ = done.send(Err(KvError::BucketFull { shard, bucket: b }));
                }
            }
        }
    }

    let writes = changed.iter().filter_map(|b| {
        let page = pages.remove(b)?;
        Some(data.write_at(page, b * PAGE_BYTES as u64))
    });
    for (result, _) in join_all(writes).await {
        if let Err(e) = result {
            for done in acks {
                let _ = done.send(Err(KvError::Io(e.clone())));
            }
            return Err(e.into());
        }
    }
    for done in acks {
        let _ = done.send(Ok(()));
    }
    Ok(())
}
// ANCHOR_END: batch

fn request_key(r: &Request) -> &[u8] {
    match r {
        Request::Put { key, .. } | Request::Get { key, .. } => key,
    }
}

fn fail_all(batch: Vec<Request>, e: KvError) {
    for r in batch {
        match r {
            Request::Put { done, .. } => drop(done.send(Err(e.clone()))),
            Request::Get { done, .. } => drop(done.send(Err(e.clone()))),
        }
    }
}

// ANCHOR: client
/// A client: puts its keys, reads them back, overwrites every other one and
/// reads again. Returns the final value of each of its keys.
async fn client(kv: Kv, core: usize, id: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>, KvError> {
    let key = |i: usize| format!("core{core}/client{id:02}/key{i:03}").into_bytes();
    let value = |i: usize, round: usize| format!("value {i} round {round} ").repeat(1 + i % 3);
    let mut last = Vec::new();
    for i in 0..KEYS_PER_CLIENT {
        kv.put(&key(i), value(i, 0).as_bytes()).await?;
    }
    for i in 0..KEYS_PER_CLIENT {
        let got = kv.get(&key(i)).await?;
        assert_eq!(got.as_deref(), Some(value(i, 0).as_bytes()), "first read");
    }
    for i in (0..KEYS_PER_CLIENT).step_by(2) {
        kv.put(&key(i), value(i, 1).as_bytes()).await?;
    }
    for i in 0..KEYS_PER_CLIENT {
        let want = value(i, 1 - i % 2); // even keys were overwritten
        let got = kv.get(&key(i)).await?;
        assert_eq!(
            got.as_deref(),
            Some(want.as_bytes()),
            "read after overwrite"
        );
        last.push((key(i), want.into_bytes()));
    }
    assert_eq!(kv.get(b"never written").await?, None);
    Ok(last)
}
// ANCHOR_END: client

// ANCHOR: recover
/// Replays shard `shard`'s log from the start and reads its data file:
/// returns (the map the log rebuilds, the map the data file holds).
async fn recover(
    dir: &Path,
    shard: usize,
) -> Result<(HashMap<Vec<u8>, Vec<u8>>, HashMap<Vec<u8>, Vec<u8>>), KvError> {
    let log = OpenOptions::new()
        .open(dir.join(format!("shard-{shard}.log")))
        .await?;
    let mut from_log = HashMap::new();
    let mut at = 0u64;
    loop {
        let head = log.read_alloc_at(at, PAGE_BYTES).await?;
        let h = head.as_slice();
        if h.len() < 16 || h[0..4] != LOG_MAGIC.to_le_bytes() {
            break;
        }
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let (payload_len, count, sum) = (word(4) as usize, word(8), word(12));
        let total = (16 + payload_len).next_multiple_of(PAGE_BYTES);
        let batch = log.read_alloc_at(at, total).await?;
        let payload = &batch.as_slice()[16..16 + payload_len];
        if fnv1a(payload) as u32 != sum {
            return Err(KvError::CorruptLog {
                shard,
                offset_bytes: at,
            });
        }
        let mut p = 0;
        for _ in 0..count {
            let k = usize::from(u16::from_le_bytes([payload[p], payload[p + 1]]));
            let v = usize::from(u16::from_le_bytes([payload[p + 2], payload[p + 3]]));
            let key = payload[p + 4..p + 4 + k].to_vec();
            from_log.insert(key, payload[p + 4 + k..p + 4 + k + v].to_vec());
            p += 4 + k + v;
        }
        at += total as u64;
    }
    let data = OpenOptions::new()
        .open(dir.join(format!("shard-{shard}.data")))
        .await?;
    let file = data.read_alloc_at(0, BUCKETS as usize * PAGE_BYTES).await?;
    let from_data = file
        .as_slice()
        .chunks(PAGE_BYTES)
        .flat_map(decode_bucket)
        .collect();
    Ok((from_log, from_data))
}
// ANCHOR_END: recover

// ANCHOR: main
fn main() -> std::process::ExitCode {
    match try_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kv: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn try_main() -> Result<(), Box<dyn StdError>> {
    let tmp = tempfile::tempdir_in(std::env::current_dir()?)?;
    let given = std::env::args().nth(1).map(PathBuf::from);
    // Without an argument the files live in a temporary directory that is
    // deleted on exit: say so rather than print a path that will not exist.
    let shown = given.as_ref().map_or_else(
        || "a temporary directory, deleted on exit".to_owned(),
        |p| p.display().to_string(),
    );
    let dir = given.unwrap_or_else(|| tmp.path().to_path_buf());
    let rt = plugio::runtime::builder(RingConfig::default())
        .cores(SHARDS)
        .build()?;
    let made = dir.clone();
    rt.block_on(async move { plugio::fs::create_dir_all(&made).await })?;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..SHARDS).map(|_| bounded(1024)).unzip();
    let shards: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(s, rx)| rt.spawn_on(s, serve_shard(s, dir.clone(), rx)))
        .collect();
    let kv = Kv { shards: senders };
    let clients: Vec<_> = (0..SHARDS)
        .flat_map(|core| (0..CLIENTS_PER_CORE).map(move |id| (core, id)))
        .map(|(core, id)| rt.spawn_on(core, client(kv.clone(), core, id)))
        .collect();
    drop(kv); // the shards stop once every client is done
    let mut expected = HashMap::new();
    for c in clients {
        expected.extend(rt.block_on(c)??);
    }
    let mut stats = Vec::new();
    for s in shards {
        stats.push(rt.block_on(s)??);
    }
    // ANCHOR_END: main

    // ANCHOR: check
    let recovered = {
        let dir = dir.clone();
        rt.block_on(async move {
            let mut out = Vec::new();
            for shard in 0..SHARDS {
                out.push(recover(&dir, shard).await?);
            }
            Ok::<_, KvError>(out)
        })?
    };
    rt.shutdown(ShutdownMode::Wait)?;
    let total_keys = SHARDS * CLIENTS_PER_CORE * KEYS_PER_CLIENT;
    assert_eq!(expected.len(), total_keys);
    let mut seen = 0;
    for (shard, (from_log, from_data)) in recovered.iter().enumerate() {
        assert_eq!(
            from_log, from_data,
            "shard {shard}: log replay == data file"
        );
        for (k, v) in from_log {
            assert_eq!(shard_of(k), shard, "key on the wrong shard");
            assert_eq!(expected.get(k), Some(v), "recovered value");
        }
        seen += from_log.len();
    }
    assert_eq!(seen, total_keys, "every key recovered once");
    for (shard, s) in stats.iter().enumerate() {
        assert!(
            s.batches < s.puts + s.gets,
            "shard {shard} never batched: {s:?}"
        );
        println!(
            "shard {shard}: {} puts and {} gets in {} batches ({:.1} requests/batch, largest {})",
            s.puts,
            s.gets,
            s.batches,
            (s.puts + s.gets) as f64 / s.batches as f64,
            s.largest_batch
        );
    }
    println!(
        "kv: {total_keys} keys from {} clients on {SHARDS} cores; every shard's log replay \
         equals its data file and the clients' last writes ({})",
        SHARDS * CLIENTS_PER_CORE,
        shown
    );
    Ok(())
}
// ANCHOR_END: check
