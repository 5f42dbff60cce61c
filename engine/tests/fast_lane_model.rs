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

use common::{file_of, local, pattern, tmpdir, watchdog, Rng};
use plugio_engine::{Device, DeviceOptions, IoFlags};

fn filled(dev: &Device, v: u8, len: usize) -> plugio_engine::DmaBuf {
    let mut b = dev.alloc_buf(len);
    b.as_mut_slice().fill(v);
    b
}

fn err_of(e: &plugio_engine::Error) -> String {
    format!("{:?}", e.kind())
}

/// One op of a stream (offsets and lengths in bytes).
#[derive(Debug, Clone)]
enum Op {
    Read {
        off: u64,
        len: usize,
        flags: IoFlags,
    },
    Write {
        off: u64,
        len: usize,
        v: u8,
        flags: IoFlags,
    },
    Nop,
    Flush,
    DroppedRead {
        off: u64,
        len: usize,
        after: usize,
    },
}

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
    let size = data.len();
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
            let mut ops = Vec::new();
            for _ in 0..n {
                let op = match rng.below(12) {
                    10 | 11 => Op::DroppedRead {
                        off: rng.below(140) * 512,
                        len: (1 + rng.below(16) as usize) * 512,
                        after: rng.below(3) as usize,
                    },
                    0..=4 => {
                        let off = rng.below(140) * 512;
                        let len = (1 + rng.below(24) as usize) * 512;
                        let flags = if rng.below(6) == 0 { IoFlags::NOMERGE } else { IoFlags::NONE };
                        Op::Read { off, len, flags }
                    }
                    5..=7 => {
                        let len = (1 + rng.below(16) as usize) * 512;
                        let off = rng.below(((64 * 1024 - len) / 512) as u64 + 1) * 512;
                        let flags = if rng.below(6) == 0 { IoFlags::FUA } else { IoFlags::NONE };
                        Op::Write { off, len, v: rng.next() as u8, flags }
                    }
                    8 => Op::Nop,
                    _ => Op::Flush,
                };
                let delay = rng.below(3) as usize;
                ops.push((delay, op));
            }
            // Issue order: by delay (tick), then list order.
            let mut order: Vec<usize> = (0..ops.len()).collect();
            order.sort_by_key(|&i| (ops[i].0, i));
            let mut want: Vec<Option<Vec<u8>>> = vec![None; ops.len()];
            for &i in &order {
                match &ops[i].1 {
                    Op::Read { off, len, .. } => {
                        let s = (*off as usize).min(size);
                        let e = (s + len).min(size);
                        want[i] = Some(model[s..e].to_vec());
                    }
                    Op::Write { off, len, v, .. } => {
                        model[*off as usize..*off as usize + len].fill(*v);
                    }
                    _ => {}
                }
            }
            let futs = ops.iter().map(|(delay, op)| {
                let dev = &dev;
                let delay = *delay;
                let op = op.clone();
                async move {
                    for _ in 0..delay {
                        plugio_executor::yield_now().await;
                    }
                    match op {
                        Op::Read { off, len, flags } => {
                            let (r, b) = dev.read_at_with(dev.alloc_buf(len), off, flags).await;
                            r.map(|_| Some(b.as_slice().to_vec())).map_err(|e| err_of(&e))
                        }
                        Op::Write { off, len, v, flags } => {
                            let (r, _) = dev.write_at_with(filled(dev, v, len), off, flags).await;
                            r.map(|_| None).map_err(|e| err_of(&e))
                        }
                        Op::Nop => dev.nop().await.map(|_| None).map_err(|e| err_of(&e)),
                        Op::Flush => dev.sync_data().await.map(|_| None).map_err(|e| err_of(&e)),
                        Op::DroppedRead { off, len, after } => {
                            let mut f = Box::pin(dev.read_alloc_at(off, len));
                            if futures::poll!(f.as_mut()).is_ready() {
                                return Ok(None);
                            }
                            for _ in 0..after {
                                plugio_executor::yield_now().await;
                            }
                            drop(f);
                            Ok(None)
                        }
                    }
                }
            });
            let got = futures::future::join_all(futs).await;
            for (i, g) in got.into_iter().enumerate() {
                let g = g.unwrap_or_else(|e| panic!("{desc}: round {round} op {i} {:?}: {e}", ops[i]));
                if let Some(w) = &want[i] {
                    let g = g.expect("read data");
                    if g != *w {
                        let first = g.iter().zip(w.iter()).position(|(a, b)| a != b);
                        panic!(
                            "{desc}: round {round} op {i} {:?} (delay {}): got {} bytes, want {}; first diff at {first:?}\nops: {ops:?}",
                            ops[i].1, ops[i].0, g.len(), w.len()
                        );
                    }
                }
            }
        }
        let mut spins = 0;
        while dev.tags_in_use() > 0 && spins < 1000 {
            dev.nop().await.unwrap();
            spins += 1;
        }
        assert_eq!(dev.tags_in_use(), 0, "{desc}");
        assert_eq!(dev.iostats().in_flight, 0, "{desc}");
    });
}
