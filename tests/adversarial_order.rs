//! Adversarial checks under load: overlapping IO from one core against a
//! program-order model, tiny queue depths, splits, explicit plugs held
//! across awaits, one device shared by two runtimes.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use plugio::device::backend::mem::{Latency, MemClock, MemConfig, MemDevice};
use plugio::{Device, DeviceOptions, IoFlags, RingConfig, ShutdownMode};

mod common;
use common::{local, watchdog};

const BLOCK: u64 = 4096;

/// xorshift64*: deterministic and dependency-free.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Read {
        lba: u64,
        n: u64,
    },
    Write {
        lba: u64,
        n: u64,
        id: u32,
        flags: IoFlags,
    },
    Zero {
        lba: u64,
        n: u64,
    },
    Flush,
}

/// The bytes a write of `id` puts at `lba`.
fn block_of(id: u32, lba: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(BLOCK as usize);
    while v.len() < BLOCK as usize {
        v.extend_from_slice(&id.to_le_bytes());
        v.extend_from_slice(&(lba as u32).to_le_bytes());
    }
    v
}

fn gen_ops(rng: &mut Rng, count: usize, blocks: u64) -> Vec<Op> {
    let mut id = 0;
    (0..count)
        .map(|_| {
            let n = 1 + rng.below(8);
            let lba = rng.below(blocks - n);
            match rng.below(10) {
                0..=3 => Op::Read { lba, n },
                4..=7 => {
                    id += 1;
                    let flags = match rng.below(8) {
                        0 => IoFlags::FUA,
                        1 => IoFlags::NOMERGE,
                        _ => IoFlags::NONE,
                    };
                    Op::Write { lba, n, id, flags }
                }
                8 => Op::Zero { lba, n },
                _ => Op::Flush,
            }
        })
        .collect()
}

/// Issues `ops` in program order from one core (one task per op, spawned
/// in order, in groups separated by random yields), with the device's
/// latencies reordering completions; each read must see exactly the
/// writes issued before it.
fn program_order_case(seed: u64, opts: DeviceOptions, blocks: u64) {
    let m = MemDevice::new(MemConfig {
        capacity_bytes: blocks * BLOCK,
        latency: Latency::Uniform {
            min: Duration::from_micros(1),
            max: Duration::from_micros(500),
        },
        clock: MemClock::Virtual,
        queue_depth: 8,
        seed,
        ..MemConfig::default()
    });
    let dev = Device::with_backend(Arc::new(m), None, opts.clone()).expect("device");
    program_order_on(seed, dev, blocks, 200);
}

fn program_order_on(seed: u64, dev: Device, blocks: u64, count: usize) {
    let opts = dev.options().clone();
    let mut rng = Rng(seed | 1);
    let ops = gen_ops(&mut rng, count, blocks);
    let groups: Vec<usize> = (0..ops.len()).map(|_| 1 + rng.below(12) as usize).collect();
    // The model: the expected read results, in program order.
    let mut disk = vec![0u8; (blocks * BLOCK) as usize];
    let mut expect = Vec::new();
    for op in &ops {
        match *op {
            Op::Read { lba, n } => {
                let r = (lba * BLOCK) as usize..((lba + n) * BLOCK) as usize;
                expect.push(Some(disk[r].to_vec()));
            }
            Op::Write { lba, n, id, .. } => {
                for b in lba..lba + n {
                    let s = (b * BLOCK) as usize;
                    disk[s..s + BLOCK as usize].copy_from_slice(&block_of(id, b));
                }
                expect.push(None);
            }
            Op::Zero { lba, n } => {
                disk[(lba * BLOCK) as usize..((lba + n) * BLOCK) as usize].fill(0);
                expect.push(None);
            }
            Op::Flush => expect.push(None),
        }
    }
    let ex = local();
    let got: Rc<RefCell<Vec<Option<Vec<u8>>>>> = Rc::new(RefCell::new(vec![None; ops.len()]));
    let d = dev.clone();
    let g = got.clone();
    let ops2 = ops.clone();
    ex.run(async move {
        let ops = ops2;
        let mut handles = Vec::new();
        let mut i = 0;
        let mut k = 0;
        while i < ops.len() {
            let guard = (k % 3 == 0).then(|| d.plug(8).expect("plug"));
            for _ in 0..groups[k].min(ops.len() - i) {
                let (op, dev, got) = (ops[i], d.clone(), g.clone());
                let idx = i;
                handles.push(plugio::spawn_local(async move {
                    match op {
                        Op::Read { lba, n } => {
                            let b = dev.read_alloc_at(lba * BLOCK, (n * BLOCK) as usize).await;
                            got.borrow_mut()[idx] = Some(b.expect("read").as_slice().to_vec());
                        }
                        Op::Write { lba, n, id, flags } => {
                            let mut b = dev.alloc_buf((n * BLOCK) as usize);
                            for (j, c) in b.as_mut_slice().chunks_mut(BLOCK as usize).enumerate() {
                                c.copy_from_slice(&block_of(id, lba + j as u64));
                            }
                            dev.write_at_with(b, lba * BLOCK, flags)
                                .await
                                .0
                                .expect("write");
                        }
                        Op::Zero { lba, n } => dev
                            .write_zeroes(lba * BLOCK, n * BLOCK)
                            .await
                            .expect("zeroes"),
                        Op::Flush => dev.sync_data().await.expect("flush"),
                    }
                }));
                i += 1;
            }
            // Let the group be polled (issued) in order, sometimes across
            // several ticks while the guard is held.
            plugio::yield_now().await;
            if k % 5 == 0 {
                plugio::yield_now().await;
            }
            drop(guard);
            k += 1;
        }
        for h in handles {
            h.await.expect("io task");
        }
    });
    for (i, (e, g)) in expect.iter().zip(got.borrow().iter()).enumerate() {
        if let Some(e) = e {
            let g = g.as_ref().expect("read result");
            if e != g {
                let lba = match ops[i] {
                    Op::Read { lba, .. } => lba,
                    _ => 0,
                };
                let first = e.iter().zip(g).position(|(a, b)| a != b).unwrap_or(0);
                panic!(
                    "seed {seed} opts {opts:?}: read #{i} {:?} saw the wrong data at byte {first} (lba {}): \
                     expected write id {:?}, got {:?}",
                    ops[i],
                    lba + first as u64 / BLOCK,
                    &e[first / 4 * 4..first / 4 * 4 + 4],
                    &g[first / 4 * 4..first / 4 * 4 + 4],
                );
            }
        }
    }
    assert_eq!(dev.tags_in_use(), 0);
}

#[test]
fn overlapping_io_from_one_core_keeps_program_order_at_every_setting() {
    // About 7 s in a debug build, and up to 50 s beside CPU hogs.
    watchdog(240, || {
        let mut seed = 1;
        for qd in 1..=4u32 {
            for nomerges in 0..=2u8 {
                for (max_rq, plug_max) in [(None, 32), (Some(8192), 3), (Some(2048), 1)] {
                    seed += 1;
                    program_order_case(
                        seed * 7919,
                        DeviceOptions {
                            queue_depth: qd,
                            nomerges,
                            max_request_bytes: max_rq,
                            plug_max_count: plug_max,
                            plug_flush_bytes: 4096,
                            ..DeviceOptions::default()
                        },
                        64,
                    );
                }
            }
        }
    });
}

/// The same program-order model on a real file through io_uring, where
/// the kernel may complete overlapping O_DIRECT requests in any order.
#[test]
fn overlapping_io_from_one_core_keeps_program_order_on_a_file() {
    watchdog(60, || {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
        let mut seed = 100;
        for qd in [1u32, 4, 32] {
            for nomerges in 0..=2u8 {
                seed += 1;
                let path = dir.path().join(format!("order-{seed}"));
                std::fs::write(&path, vec![0u8; 64 * BLOCK as usize]).expect("fixture");
                let dev = Device::open(
                    &path,
                    DeviceOptions {
                        queue_depth: qd,
                        nomerges,
                        max_request_bytes: Some(16384),
                        plug_max_count: 4,
                        ..DeviceOptions::default()
                    },
                )
                .expect("open");
                program_order_on(seed * 31, dev, 64, 200);
            }
        }
    });
}

/// A very large read split into many requests at queue depth 1, with small
/// IOs interleaved on the same core: all complete with the right bytes.
#[plugio::test(timeout_s = 30)]
async fn a_huge_split_read_at_queue_depth_one_with_small_ios_interleaved() {
    let cap: u64 = 32 << 20;
    let m = MemDevice::new(MemConfig {
        capacity_bytes: cap,
        ..MemConfig::default()
    });
    let dev = Device::with_backend(
        Arc::new(m),
        None,
        DeviceOptions {
            queue_depth: 1,
            max_request_bytes: Some(256 * 1024),
            ..DeviceOptions::default()
        },
    )
    .expect("device");
    let mut w = dev.alloc_buf(cap as usize);
    for (i, c) in w.as_mut_slice().chunks_mut(4096).enumerate() {
        c.fill(i as u8);
    }
    let (r, _) = dev.write_at(w, 0).await;
    assert_eq!(r.expect("huge write"), cap as usize);
    let small: Vec<_> = (0..64u64)
        .map(|i| {
            let dev = dev.clone();
            plugio::spawn_local(async move {
                let b = dev.read_alloc_at(i * 4096 * 7, 4096).await.expect("small");
                assert!(b.as_slice().iter().all(|&x| x == (i * 7) as u8));
            })
        })
        .collect();
    let big = dev.read_alloc_at(0, cap as usize).await.expect("huge read");
    assert_eq!(big.len(), cap as usize);
    for (i, c) in big.as_slice().chunks(4096).enumerate() {
        assert!(c.iter().all(|&x| x == i as u8), "page {i}");
    }
    for h in small {
        h.await.expect("small task");
    }
    let s = dev.iostats();
    assert!(s.requests >= 256, "{s:?}");
    assert_eq!(dev.tags_in_use(), 0);
}

/// Explicit plugs held across awaits, nested, with absurd counts.
#[plugio::test(timeout_s = 10)]
async fn explicit_plugs_held_across_awaits_never_stall_io() {
    let m = MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        latency: Latency::Fixed(Duration::from_micros(50)),
        clock: MemClock::Real,
        ..MemConfig::default()
    });
    let dev = Device::with_backend(
        Arc::new(m),
        None,
        DeviceOptions {
            queue_depth: 2,
            ..DeviceOptions::default()
        },
    )
    .expect("device");
    let outer = dev.plug(usize::MAX).expect("plug");
    let inner = dev.plug(1000).expect("plug");
    // Reads issued while both guards are held, awaited while held.
    for round in 0..20u64 {
        let hs: Vec<_> = (0..40u64)
            .map(|i| {
                let dev = dev.clone();
                plugio::spawn_local(async move {
                    dev.read_alloc_at((i + round) % 200 * 4096, 4096)
                        .await
                        .expect("read");
                })
            })
            .collect();
        for h in hs {
            plugio::timeout(Duration::from_secs(2), h)
                .await
                .expect("IO under an explicit plug stalled")
                .expect("task");
        }
        // The task holding the guards awaits its own IO too.
        dev.read_alloc_at(0, 4096).await.expect("read under guard");
    }
    drop(inner);
    drop(outer);
    assert_eq!(dev.tags_in_use(), 0);
}

/// An explicit plug raises the count trigger only (as documented on
/// `Device::plug`): of 63 reads of 4 KiB under `plug(64)`, the first 32
/// are flushed by the 128 KiB byte trigger before the guard drops; with
/// `plug_flush_bytes: 0` none is flushed before the drop, which flushes
/// all 63 at once (an API audit helper read the docs as the second).
#[plugio::test(timeout_s = 10)]
async fn a_plug_guard_raises_the_count_trigger_not_the_byte_trigger() {
    for (flush_bytes, early, at_drop) in [(128 << 10, 1, 2), (0, 0, 1)] {
        let m = MemDevice::new(MemConfig {
            capacity_bytes: 1 << 20,
            ..MemConfig::default()
        });
        let options = DeviceOptions {
            nomerges: 2,
            plug_flush_bytes: flush_bytes,
            ..DeviceOptions::default()
        };
        let dev = Device::with_backend(Arc::new(m), None, options).expect("dev");
        let before = dev.iostats();
        let guard = dev.plug(64).expect("plug");
        let mut reads: Vec<_> = (0..63u64)
            .map(|i| Box::pin(dev.read_alloc_at(i * 4096, 4096)))
            .collect();
        for r in &mut reads {
            assert!(futures::poll!(r.as_mut()).is_pending());
        }
        let mid = dev.iostats().delta(&before).plug_flushes;
        drop(guard);
        let after = dev.iostats().delta(&before).plug_flushes;
        assert_eq!(
            (mid, after),
            (early, at_drop),
            "plug_flush_bytes {flush_bytes}"
        );
        for r in futures::future::join_all(reads).await {
            assert_eq!(r.expect("read").len(), 4096);
        }
    }
}

/// A guard moved into a task that is aborted while it holds the guard.
#[plugio::test(timeout_s = 10)]
async fn a_plug_guard_dropped_by_task_cancellation_releases_the_plug() {
    let m = MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        ..MemConfig::default()
    });
    let dev = Device::with_backend(Arc::new(m), None, DeviceOptions::default()).expect("dev");
    let d = dev.clone();
    let h = plugio::spawn_local(async move {
        let _g = d.plug(10_000).expect("plug");
        std::future::pending::<()>().await;
    });
    plugio::yield_now().await;
    h.abort();
    let _ = h.await;
    // With no guard left, 40 bios in one tick flush early at the
    // default max count (32): the plug limit is back.
    let hs: Vec<_> = (0..40u64)
        .map(|i| {
            let dev = dev.clone();
            plugio::spawn_local(async move { dev.read_alloc_at(i * 4096, 4096).await })
        })
        .collect();
    for h in hs {
        h.await.expect("task").expect("read");
    }
    assert_eq!(dev.tags_in_use(), 0);
}

/// One device used by two runtimes at once (four cores) at queue depth 1.
#[test]
fn one_device_shared_by_two_runtimes_at_queue_depth_one() {
    watchdog(30, || {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
        let path = dir.path().join("shared");
        let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i / 4096) as u8).collect();
        std::fs::write(&path, &data).expect("fixture");
        let dev = Device::open(
            &path,
            DeviceOptions {
                queue_depth: 1,
                ..DeviceOptions::default()
            },
        )
        .expect("open");
        let rts: Vec<_> = (0..2)
            .map(|_| {
                plugio::runtime::builder(RingConfig::default())
                    .cores(2)
                    .build()
                    .expect("runtime")
            })
            .collect();
        let mut joins = Vec::new();
        for rt in &rts {
            for core in 0..2 {
                let dev = dev.clone();
                joins.push(rt.spawn_on(core, async move {
                    let hs: Vec<_> = (0..500u64)
                        .map(|i| {
                            let dev = dev.clone();
                            plugio::spawn(async move {
                                let off = (i * 13 + core as u64) % 256 * 4096;
                                let b = dev.read_alloc_at(off, 4096).await.expect("read");
                                assert!(b.as_slice().iter().all(|&x| x == (off / 4096) as u8));
                            })
                        })
                        .collect();
                    for h in hs {
                        h.await.expect("io");
                    }
                }));
            }
        }
        for j in joins {
            futures::executor::block_on(j).expect("core task");
        }
        for rt in rts {
            rt.shutdown(ShutdownMode::Wait).expect("shutdown");
        }
        assert_eq!(dev.tags_in_use(), 0);
    });
}

/// Thousands of IOs from many tasks on a 2-core runtime, queue depth
/// 1..4, writes to disjoint per-task ranges then read back.
#[test]
fn thousands_of_ios_on_two_cores_at_tiny_queue_depths() {
    watchdog(30, || {
        for qd in 1..=4u32 {
            let m = MemDevice::new(MemConfig {
                capacity_bytes: 4 << 20,
                latency: Latency::Uniform {
                    min: Duration::from_micros(1),
                    max: Duration::from_micros(100),
                },
                clock: MemClock::Virtual,
                seed: u64::from(qd),
                ..MemConfig::default()
            });
            let dev = Device::with_backend(
                Arc::new(m),
                None,
                DeviceOptions {
                    queue_depth: qd,
                    ..DeviceOptions::default()
                },
            )
            .expect("dev");
            let rt = plugio::runtime::builder(RingConfig::default())
                .cores(2)
                .build()
                .expect("runtime");
            let mut joins = Vec::new();
            for core in 0..2u64 {
                let dev = dev.clone();
                joins.push(rt.spawn_on(core as usize, async move {
                    let hs: Vec<_> = (0..64u64)
                        .map(|t| {
                            let dev = dev.clone();
                            plugio::spawn(async move {
                                let base = (core * 64 + t) * 16384;
                                for j in 0..8u64 {
                                    let off = base + (j % 4) * 4096;
                                    let mut b = dev.alloc_buf(4096);
                                    b.as_mut_slice().fill((t + j) as u8);
                                    dev.write_at(b, off).await.0.expect("write");
                                    let r = dev.read_alloc_at(off, 4096).await.expect("read");
                                    assert!(
                                        r.as_slice().iter().all(|&x| x == (t + j) as u8),
                                        "read after write on one core saw stale data"
                                    );
                                }
                            })
                        })
                        .collect();
                    for h in hs {
                        h.await.expect("io task");
                    }
                }));
            }
            for j in joins {
                futures::executor::block_on(j).expect("core task");
            }
            rt.shutdown(ShutdownMode::Wait).expect("shutdown");
            assert_eq!(dev.tags_in_use(), 0);
        }
    });
}
