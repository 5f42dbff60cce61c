//! Random streams with writes live, against a program-order model: the
//! fast lane's reads beside live writes (lane slots, see the engine's
//! `order` module) and the requests of split bios. On one or two real
//! files through the ring, on one core or two (each on its own region):
//! the first tick of each round is write-heavy, so that the interval index
//! is on when the later ticks' reads are flushed; reads of every size (one
//! or two blocks across 16 KiB chunk boundaries, over 32 KiB, past the end
//! of the file), writes that extend the file (without a hole), write
//! zeroes, discards, flushes, NOPs and reads dropped mid-IO; small queue
//! depths and SQs, small plug limits (several flushes a tick), request
//! limits (splits), every `nomerges`, O_DIRECT on and off, the fast lane
//! on and off. Every read sees exactly the writes issued before it on its
//! device; the files' final contents and sizes match; every tag comes
//! back. From a break-it pass (which also found the split writes' file
//! extension, `split_order.rs`).
//!
//! `SEEDS=N` (default 40) and `FIRST=S` pick the seeds, `FL=1`/`FL=0` one
//! fast lane setting, `EXTRA=1` draws more switches (tag sharing, caches,
//! iostats), `HOT=1` packs the IO into a small hot region.

mod common;
#[path = "common/stream.rs"]
mod stream;

use std::path::PathBuf;

use common::{env_u64, fast_lane_settings, file_of, pattern, tmpdir, watchdog, Rng};
use plugio_device::RingConfig;
use plugio_engine::{Device, DeviceOptions, IoFlags};
use stream::{apply, drain, run_and_check, Op, Planned};

/// The last region's size at the start (the others are `REGION` long).
const BASE: usize = 96 * 1024 + 1000;
/// Each core's region of the files.
const REGION: usize = 128 * 1024;
/// Writes may extend the last region up to here (with no hole).
const MAXW: usize = 112 * 1024;

#[test]
fn lane_streams_match_the_model() {
    let first = env_u64("FIRST", 1);
    let fls = fast_lane_settings();
    for seed in first..first + env_u64("SEEDS", 40) {
        for &fl in fls {
            watchdog(90, move || stream(seed, fl));
        }
    }
}

/// The device options, ring and number of devices and cores of a seed.
fn setup(rng: &mut Rng, fl: bool) -> (DeviceOptions, RingConfig, usize, usize) {
    let ndev = 1 + rng.below(2) as usize;
    let o = DeviceOptions {
        fast_lane: fl,
        direct: rng.below(3) != 0,
        nomerges: [0u8, 1, 2, 2][rng.below(4) as usize],
        queue_depth: [1u32, 2, 3, 4, 8, 64][rng.below(6) as usize],
        plug_max_count: [4usize, 32, 256][rng.below(3) as usize],
        plug_flush_bytes: [8192u64, 32768, 128 * 1024][rng.below(3) as usize],
        max_request_bytes: [None, Some(8192), Some(32768)][rng.below(3) as usize],
        tag_batch: rng.below(2) == 0,
        ..DeviceOptions::default()
    };
    // Drawn after the others, so that seeds keep their meaning without it.
    let o = if std::env::var("EXTRA").is_ok() {
        DeviceOptions {
            tag_sharing: if rng.below(3) == 0 && o.queue_depth >= 2 {
                plugio_engine::TagSharing::PerCore { cores: 2 }
            } else {
                plugio_engine::TagSharing::Shared
            },
            tag_batch_retry: rng.below(2) == 0,
            bio_cache: rng.below(2) == 0,
            buffer_cache: rng.below(2) == 0,
            iostats: rng.below(3) != 0,
            cached_clock: rng.below(2) == 0,
            ..o
        }
    } else {
        o
    };
    let cores = if rng.below(4) == 0 { 2 } else { 1 };
    let ring = RingConfig {
        sq_entries: [8u32, 16, 256][rng.below(3) as usize],
        taskrun_flags: rng.below(3) != 0,
        ..RingConfig::default()
    };
    (o, ring, ndev, cores)
}

fn stream(seed: u64, fl: bool) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let (o, ring, ndev, cores) = setup(&mut rng, fl);
    let desc = format!(
        "seed {seed} fl {fl} ndev {ndev} cores {cores} ring sq {} taskrun {} {o:?}",
        ring.sq_entries, ring.taskrun_flags
    );
    let dir = tmpdir();
    // Core c works on [c * REGION, ...) of each file; the last core's
    // region runs to the end of the file. `regions[c][k]`: the model of
    // core c's region of file k.
    let mut paths = Vec::new();
    let mut regions: Vec<Vec<Vec<u8>>> = vec![Vec::new(); cores];
    for k in 0..ndev {
        let mut all = Vec::new();
        for (c, region) in regions.iter_mut().enumerate() {
            let len = if c + 1 == cores { BASE } else { REGION };
            let data = pattern(len, (seed as u8).wrapping_add(k as u8 * 40 + c as u8 * 3));
            all.extend_from_slice(&data);
            region.push(data);
        }
        paths.push(file_of(dir.path(), &format!("f{k}"), &all));
    }
    let finals = if cores == 1 {
        vec![run_one_core(
            o,
            ring,
            &paths,
            regions.pop().unwrap(),
            &mut rng,
            &desc,
        )]
    } else {
        run_cores(o, ring, &paths, regions, &mut rng, &desc)
    };
    for (k, path) in paths.iter().enumerate() {
        let got = std::fs::read(path).unwrap();
        let want: Vec<u8> = finals.iter().flat_map(|f| f[k].iter().copied()).collect();
        if got != want {
            let first = got.iter().zip(want.iter()).position(|(a, b)| a != b);
            panic!(
                "{desc}: final contents of dev {k}: {} bytes, want {}; first difference at {first:?}",
                got.len(),
                want.len()
            );
        }
    }
}

fn open_all(paths: &[PathBuf], o: &DeviceOptions) -> Vec<Device> {
    paths
        .iter()
        .map(|p| Device::open(p, o.clone()).expect("open"))
        .collect()
}

/// The stream on a single-thread executor; returns the final models.
fn run_one_core(
    o: DeviceOptions,
    ring: RingConfig,
    paths: &[PathBuf],
    models: Vec<Vec<u8>>,
    rng: &mut Rng,
    desc: &str,
) -> Vec<Vec<u8>> {
    let (paths, desc, rng) = (paths.to_vec(), desc.to_string(), Rng(rng.next() | 1));
    plugio_engine::runtime::local(ring)
        .expect("executor")
        .run(async move {
            let devs = open_all(&paths, &o);
            let models = body(&devs, models, rng, &desc, 0, &paths).await;
            drain(&devs, &desc).await;
            for dev in &devs {
                dev.sync_all().await.expect("sync_all");
            }
            models
        })
}

/// The stream on a runtime of several cores, each on its own region of
/// the same devices; returns each core's final models.
fn run_cores(
    o: DeviceOptions,
    ring: RingConfig,
    paths: &[PathBuf],
    regions: Vec<Vec<Vec<u8>>>,
    rng: &mut Rng,
    desc: &str,
) -> Vec<Vec<Vec<u8>>> {
    let cores = regions.len();
    let rt = plugio_engine::runtime::builder(ring)
        .cores(cores)
        .build()
        .expect("runtime");
    let devs = open_all(paths, &o);
    let handles: Vec<_> = regions
        .into_iter()
        .enumerate()
        .map(|(c, models)| {
            let (devs, rng, desc) = (
                devs.clone(),
                Rng(rng.next() | 1),
                format!("{desc} core {c}"),
            );
            // Only the last region's size moves: its core checks the files'.
            let sized = if c + 1 == cores {
                paths.to_vec()
            } else {
                Vec::new()
            };
            let base = (c * REGION) as u64;
            rt.spawn_on(c, async move {
                body(&devs, models, rng, &desc, base, &sized).await
            })
        })
        .collect();
    let out = handles
        .into_iter()
        .map(|h| futures::executor::block_on(h).expect("core"))
        .collect();
    let desc = desc.to_string();
    rt.block_on(async move { drain(&devs, &desc).await });
    let _ = rt.shutdown(plugio_executor::ShutdownMode::Wait);
    out
}

/// One core's stream on its region at `base` of each device; `sized`
/// names the files where this region is the last (their sizes are
/// checked against the model at each round's start). Returns the models.
async fn body(
    devs: &[Device],
    mut models: Vec<Vec<u8>>,
    mut rng: Rng,
    desc: &str,
    base: u64,
    sized: &[PathBuf],
) -> Vec<Vec<u8>> {
    let last = !sized.is_empty();
    for round in 0..12 {
        let mut ops = gen_round(&mut rng, devs.len(), last);
        for (k, p) in sized.iter().enumerate() {
            let real = std::fs::metadata(p).unwrap().len() - base;
            assert_eq!(
                real as usize,
                models[k].len(),
                "{desc}: round {round} dev {k}: file size"
            );
        }
        let want = apply(&mut ops, &mut models);
        run_and_check(devs, &ops, base, want, desc, round).await;
    }
    models
}

fn hot() -> bool {
    std::env::var("HOT").is_ok()
}

/// The ops of one round.
fn gen_round(rng: &mut Rng, ndev: usize, last: bool) -> Vec<Planned> {
    let n = 4 + rng.below(if hot() { 120 } else { 40 }) as usize;
    (0..n)
        .map(|_| {
            let dev = rng.below(ndev as u64) as usize;
            let delay = rng.below(3) as usize;
            (dev, delay, clip(gen_op(rng, delay), last))
        })
        .collect()
}

/// An IO length: one or two sectors, one or two pages, over 32 KiB, or
/// anything up to 12 KiB.
fn gen_len(rng: &mut Rng) -> usize {
    if hot() {
        return 512 * (1 + rng.below(8) as usize);
    }
    match rng.below(8) {
        0 => (33 + rng.below(40) as usize) * 1024,
        1 | 2 => 512 * (1 + rng.below(2) as usize),
        3 => 4096 * (1 + rng.below(2) as usize),
        _ => 512 * (1 + rng.below(24) as usize),
    }
}

/// An offset for an IO of `len` bytes: near a 16 KiB chunk boundary half
/// the time (the interval index's buckets), else anywhere.
fn gen_offset(rng: &mut Rng, len: usize) -> u64 {
    if hot() {
        return if rng.below(4) == 0 {
            (BASE as u64 - 4096) / 512 * 512 + rng.below(8) * 512
        } else {
            16384 - 4096 + rng.below(16) * 512
        };
    }
    if rng.below(2) == 0 {
        let boundary = 16384 * (1 + rng.below(6)) as i64;
        let straddle = (len as i64 / 2 / 512 * 512) * rng.below(2) as i64;
        (boundary - 4096 + 512 * rng.below(16) as i64 - straddle).max(0) as u64
    } else {
        rng.below(230) * 512
    }
}

/// One op; those of tick 0 (`delay` 0) are writes more often.
fn gen_op(rng: &mut Rng, delay: usize) -> Op {
    let writes = if delay == 0 { 5 } else { 2 };
    let r = rng.below(16);
    let len = gen_len(rng);
    if r < writes {
        let off = gen_offset(rng, len).min((MAXW - len) as u64);
        let flags = if rng.below(8) == 0 {
            IoFlags::FUA
        } else {
            IoFlags::NONE
        };
        return Op::Write {
            off,
            len,
            v: (rng.next() as u8) | 1,
            flags,
        };
    }
    if r == writes {
        let (off, len) = (4096 * rng.below(24), 4096 * (1 + rng.below(3) as usize));
        return match rng.below(4) {
            0 => Op::Zeroes { off, len },
            1 => Op::Discard { off, len },
            2 => Op::Nop,
            _ => Op::Flush,
        };
    }
    let off = gen_offset(rng, len);
    if r >= 14 {
        return Op::DroppedRead {
            off,
            len,
            after: rng.below(3) as usize,
        };
    }
    let flags = if rng.below(10) == 0 {
        IoFlags::NOMERGE
    } else {
        IoFlags::NONE
    };
    Op::Read { off, len, flags }
}

/// Keeps the reads of a region that is not the last inside it.
fn clip(op: Op, last: bool) -> Op {
    match op {
        Op::Read { off, len, flags } if !last && off as usize + len > REGION => Op::Read {
            off,
            len: REGION - off as usize,
            flags,
        },
        Op::DroppedRead { off, len, after } if !last && off as usize + len > REGION => {
            Op::DroppedRead {
                off,
                len: REGION - off as usize,
                after,
            }
        }
        op => op,
    }
}
