//! The engine against a program-order model on a real file through the
//! ring, with the fast lane on and off (the proptest model in `model.rs`
//! runs on the mem device, which has no SQ writer, so its fast-lane bios
//! always become requests at dispatch): random streams of reads, writes,
//! NOPs, flushes and reads dropped mid-flight, issued over a few ticks in
//! a known order, under random `nomerges`, queue depths, plug sizes and
//! request limits. Every read must see exactly the writes issued before
//! it (overlapping IO keeps program order) and end at the end of the
//! file; every tag comes back. `SEEDS=N` runs more seeds (default 60).
//! (From a break-it pass on the fast lane, 2026-12-04.)

mod common;
#[path = "common/stream.rs"]
mod stream;

use common::{file_of, local, pattern, tmpdir, watchdog, Rng};
use plugio_engine::{Device, DeviceOptions, IoFlags};
use stream::{apply, drain, run_and_check, Op, Planned};

/// Random streams against the model, fast lane on and off.
#[test]
fn random_streams_match_the_model() {
    let seeds: u64 = std::env::var("SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    for seed in 1..=seeds {
        for fl in [true, false] {
            watchdog(60, move || random_stream(seed, fl));
        }
    }
}

/// One stream: 15 rounds of 1 to 24 ops, each op issued after 0 to 2
/// yields (its tick), checked against the model applied in issue order.
fn random_stream(seed: u64, fl: bool) {
    let mut rng = Rng(seed.wrapping_mul(0x9e3779b97f4a7c15) | 1);
    let size = 64 * 1024 + 1000;
    let data = pattern(size, seed as u8);
    let dir = tmpdir();
    let path = file_of(dir.path(), "f", &data);
    let o = DeviceOptions {
        fast_lane: fl,
        nomerges: rng.below(3) as u8,
        queue_depth: [1u32, 2, 4, 64][rng.below(4) as usize],
        plug_max_count: [1usize, 4, 32][rng.below(3) as usize],
        max_request_bytes: [None, Some(4096), Some(8192)][rng.below(3) as usize],
        ..DeviceOptions::default()
    };
    let desc = format!("seed {seed} fl {fl} {o:?}");
    let mut model = data.clone();
    local().run(async move {
        let dev = Device::open(&path, o).expect("open");
        for round in 0..15 {
            let n = 1 + rng.below(24) as usize;
            let mut ops: Vec<Planned> = (0..n)
                .map(|_| {
                    let op = random_op(&mut rng);
                    (0, rng.below(3) as usize, op)
                })
                .collect();
            let want = apply(&mut ops, std::slice::from_mut(&mut model));
            run_and_check(std::slice::from_ref(&dev), &ops, 0, want, &desc, round).await;
        }
        drain(std::slice::from_ref(&dev), &desc).await;
    });
}

/// One op of a stream: reads (some dropped mid-flight, some `NOMERGE`),
/// writes within the first 64 KiB (some `FUA`), NOPs and flushes.
fn random_op(rng: &mut Rng) -> Op {
    match rng.below(12) {
        10 | 11 => Op::DroppedRead {
            off: rng.below(140) * 512,
            len: (1 + rng.below(16) as usize) * 512,
            after: rng.below(3) as usize,
        },
        0..=4 => {
            let off = rng.below(140) * 512;
            let len = (1 + rng.below(24) as usize) * 512;
            let flags = if rng.below(6) == 0 {
                IoFlags::NOMERGE
            } else {
                IoFlags::NONE
            };
            Op::Read { off, len, flags }
        }
        5..=7 => {
            let len = (1 + rng.below(16) as usize) * 512;
            let off = rng.below(((64 * 1024 - len) / 512) as u64 + 1) * 512;
            let flags = if rng.below(6) == 0 {
                IoFlags::FUA
            } else {
                IoFlags::NONE
            };
            Op::Write {
                off,
                len,
                v: rng.next() as u8,
                flags,
            }
        }
        8 => Op::Nop,
        _ => Op::Flush,
    }
}
