//! Adversarial tests of the rewritten per-IO path (slab requests, batched
//! completion, requeue/reissue of short and failed requests, plug
//! boundaries, the thread-local core pointer, registered arena buffers).
//!
//! Every test that could hang runs under `watchdog`; none asserts timing.

use std::sync::Arc;
use std::time::Duration;

use plugio_device::backend::mem::{Fault, FaultOn, Latency, MemClock, MemConfig, MemDevice};
use plugio_device::{Backend, DmaBuf, IoFlags, RingConfig};
use plugio_engine::{Device, DeviceOptions};
use proptest::prelude::*;

mod common;
use common::{local, watchdog};

/// Proptest cases: `default`, or `PLUGIO_ADV_CASES` for a longer hunt.
fn cases(default: u32) -> u32 {
    std::env::var("PLUGIO_ADV_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const CAP: u64 = 256 * 1024;
const AREA: u64 = 64 * 1024;

fn fill(seed: u8, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (((off + i) * 131 + u64::from(seed) * 7) >> 3) as u8 ^ seed)
        .collect()
}

/// A backend that moves at most `max_bytes` of each read or write: the
/// segments are cut to a prefix of that many bytes (a partial count, as a
/// device may return).
#[derive(Debug)]
struct AtMost {
    inner: Arc<MemDevice>,
    max_bytes: u64,
}

impl Backend for AtMost {
    fn geometry(&self) -> &plugio_device::Geometry {
        self.inner.geometry()
    }

    fn kind(&self) -> plugio_device::backend::BackendKind {
        self.inner.kind()
    }

    unsafe fn submit(
        &self,
        op: &plugio_device::IoOp<'_>,
        handler: plugio_device::HandlerId,
        token: u64,
    ) -> plugio_device::Result<()> {
        if !op.kind.has_data() || op.len_bytes <= self.max_bytes {
            // SAFETY: forwarded from the caller.
            return unsafe { self.inner.submit(op, handler, token) };
        }
        let mut segs = Vec::new();
        let mut left = self.max_bytes as usize;
        for s in op.segments {
            if left == 0 {
                break;
            }
            let n = s.iov_len.min(left);
            segs.push(libc::iovec {
                iov_base: s.iov_base,
                iov_len: n,
            });
            left -= n;
        }
        let mut cut = *op;
        cut.segments = &segs;
        cut.len_bytes = self.max_bytes;
        cut.fixed_buf = None;
        // SAFETY: `cut` names a prefix of the caller's memory. The mem
        // backend copies the iovecs at submit (OwnedOp), so `segs` may go.
        unsafe { self.inner.submit(&cut, handler, token) }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Read {
        off: u64,
        len: u64,
    },
    Write {
        off: u64,
        len: u64,
        fua: bool,
        seed: u8,
    },
    WriteV {
        off: u64,
        a: u64,
        b: u64,
        seed: u8,
    },
    ReadV {
        off: u64,
        lens: Vec<u64>,
    },
    /// Write zeroes (`discard` false) or discard (the mem device zeroes).
    Zero {
        off: u64,
        len: u64,
        discard: bool,
    },
    Flush,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Out {
    Read(Result<Vec<u8>, String>),
    Write(Result<usize, String>),
    Flush(Result<(), String>),
    Dropped,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let off = (0..AREA / 512).prop_map(|b| b * 512);
    let len = (1u64..=24).prop_map(|b| b * 512);
    prop_oneof![
        4 => (off.clone(), len.clone()).prop_map(|(off, len)| Op::Read { off, len }),
        3 => (off.clone(), len.clone(), any::<bool>(), any::<u8>())
            .prop_map(|(off, len, fua, seed)| Op::Write { off, len, fua: fua && seed % 4 == 0, seed }),
        1 => (off, 1u64..=8, 1u64..=8, any::<u8>())
            .prop_map(|(off, a, b, seed)| Op::WriteV { off, a: a * 512, b: b * 512, seed }),
        1 => (0..AREA / 512, prop::collection::vec(1u64..=6, 1..5))
            .prop_map(|(b, lens)| Op::ReadV { off: b * 512, lens: lens.into_iter().map(|l| l * 512).collect() }),
        1 => (0..AREA / 512, 1u64..=16, any::<bool>())
            .prop_map(|(b, l, discard)| Op::Zero { off: b * 512, len: l * 512, discard }),
        1 => Just(Op::Flush),
    ]
}

#[derive(Debug, Clone)]
struct Scenario {
    batches: Vec<Vec<Op>>,
    /// (first lba, lbas, on reads only)
    eio: Vec<(u64, u64, bool)>,
    short_lba: Option<u64>,
    seed: u64,
    qd: u32,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        prop::collection::vec(prop::collection::vec(op_strategy(), 1..24), 1..4),
        prop::collection::vec((0..AREA / 512, 1u64..16, any::<bool>()), 0..3),
        prop::option::of(0..AREA / 512),
        any::<u64>(),
        prop_oneof![Just(1u32), Just(2), Just(4), Just(64)],
    )
        .prop_map(|(batches, eio, short_lba, seed, qd)| Scenario {
            batches,
            eio,
            short_lba,
            seed,
            qd,
        })
}

fn faults(s: &Scenario, writes_fail: bool) -> Vec<Fault> {
    let mut f: Vec<Fault> = s
        .eio
        .iter()
        .map(|&(lba, n, reads_only)| Fault::Eio {
            lbas: lba..lba + n,
            on: if reads_only || !writes_fail {
                FaultOn::Read
            } else {
                FaultOn::Both
            },
        })
        .collect();
    if let Some(lba) = s.short_lba {
        f.push(Fault::ShortRead { lba });
    }
    f
}

fn touches(faults: &[Fault], off: u64, len: u64, write: bool) -> bool {
    let (s, e) = (off / 512, (off + len).div_ceil(512));
    faults.iter().any(|f| match f {
        Fault::Eio { lbas, on } => {
            let applies = match on {
                FaultOn::Both => true,
                FaultOn::Read => !write,
                FaultOn::Write => write,
            };
            applies && lbas.start < e && s < lbas.end
        }
        _ => false,
    })
}

const EIO: &str = "Io { errno: 5 }";

/// What a device that runs the IOs one at a time in program order returns.
fn model(s: &Scenario, faults: &[Fault]) -> Vec<Out> {
    let mut img = vec![0u8; CAP as usize];
    let mut out = Vec::new();
    for batch in &s.batches {
        for op in batch {
            let op = &match op {
                Op::ReadV { off, lens } => Op::Read {
                    off: *off,
                    len: lens.iter().sum(),
                },
                op => op.clone(),
            };
            match *op {
                Op::ReadV { .. } => unreachable!(),
                Op::Read { off, len } => {
                    if touches(faults, off, len, false) {
                        out.push(Out::Read(Err(EIO.into())));
                        continue;
                    }
                    // A short read inside the device resumes where it
                    // stopped and fails there when no data comes twice.
                    let stall = faults.iter().find_map(|f| match f {
                        Fault::ShortRead { lba } if (off..off + len).contains(&(lba * 512)) => {
                            Some(lba * 512)
                        }
                        _ => None,
                    });
                    out.push(Out::Read(match stall {
                        Some(at) => Err(format!(
                            "{:?}",
                            plugio_device::ErrorKind::NoProgress {
                                offset_bytes: at,
                                len_bytes: off + len - at
                            }
                        )),
                        None => Ok(img[off as usize..(off + len) as usize].to_vec()),
                    }));
                }
                Op::Write { off, len, seed, .. } => {
                    if touches(faults, off, len, true) {
                        out.push(Out::Write(Err(EIO.into())));
                        continue;
                    }
                    img[off as usize..(off + len) as usize].copy_from_slice(&fill(
                        seed,
                        off,
                        len as usize,
                    ));
                    out.push(Out::Write(Ok(len as usize)));
                }
                Op::WriteV { off, a, b, seed } => {
                    if touches(faults, off, a + b, true) {
                        out.push(Out::Write(Err(EIO.into())));
                        continue;
                    }
                    img[off as usize..(off + a + b) as usize].copy_from_slice(&fill(
                        seed,
                        off,
                        (a + b) as usize,
                    ));
                    out.push(Out::Write(Ok((a + b) as usize)));
                }
                Op::Zero { off, len, .. } => {
                    if touches(faults, off, len, true) {
                        out.push(Out::Flush(Err(EIO.into())));
                        continue;
                    }
                    img[off as usize..(off + len) as usize].fill(0);
                    out.push(Out::Flush(Ok(())));
                }
                Op::Flush => out.push(Out::Flush(Ok(()))),
            }
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Config {
    nomerges: u8,
    at_most: Option<u64>,
    max_request_bytes: Option<u64>,
    /// Drop some reads after a few parks (their result is not compared;
    /// everything else must still match).
    drop_reads: bool,
}

fn run(s: &Scenario, faults: Vec<Fault>, c: Config) -> Vec<Out> {
    let m = Arc::new(MemDevice::new(MemConfig {
        capacity_bytes: CAP,
        latency: Latency::Uniform {
            min: Duration::from_micros(1),
            max: Duration::from_micros(300),
        },
        clock: MemClock::Virtual,
        seed: s.seed,
        faults,
        ..Default::default()
    }));
    let backend: Arc<dyn Backend> = match c.at_most {
        Some(max_bytes) => Arc::new(AtMost {
            inner: m,
            max_bytes,
        }),
        None => m,
    };
    let opts = DeviceOptions {
        nomerges: c.nomerges,
        queue_depth: s.qd,
        max_request_bytes: c.max_request_bytes,
        ..Default::default()
    };
    let dev = Device::with_backend(backend, None, opts).expect("device");
    let batches = s.batches.clone();
    let seed = s.seed;
    local().run(async move {
        let mut outs = Vec::new();
        for batch in batches {
            let futs = batch.into_iter().enumerate().map(|(i, op)| {
                let dev = dev.clone();
                let drop_after =
                    (c.drop_reads && (i as u64 ^ seed) % 3 == 0).then_some((i as u64 + seed) % 4);
                async move {
                    let err = |e: plugio_device::Error| format!("{:?}", e.kind());
                    match op {
                        Op::Read { off, len } if drop_after.is_some() => {
                            let read = dev.read_alloc_at(off, len as usize);
                            let nap = async {
                                for _ in 0..drop_after.unwrap_or(0) {
                                    plugio_executor::sleep(Duration::from_micros(1)).await;
                                }
                            };
                            futures::pin_mut!(read, nap);
                            match futures::future::select(read, nap).await {
                                futures::future::Either::Left((r, _)) => {
                                    Out::Read(r.map(|b| b.as_slice().to_vec()).map_err(err))
                                }
                                futures::future::Either::Right(_) => Out::Dropped,
                            }
                        }
                        Op::Read { off, len } => Out::Read(
                            dev.read_alloc_at(off, len as usize)
                                .await
                                .map(|b| b.as_slice().to_vec())
                                .map_err(err),
                        ),
                        Op::Write {
                            off,
                            len,
                            fua,
                            seed,
                        } => {
                            let mut b = dev.alloc_buf(len as usize);
                            b.as_mut_slice()
                                .copy_from_slice(&fill(seed, off, len as usize));
                            let flags = if fua { IoFlags::FUA } else { IoFlags::NONE };
                            Out::Write(dev.write_at_with(b, off, flags).await.0.map_err(err))
                        }
                        Op::WriteV { off, a, b, seed } => {
                            let data = fill(seed, off, (a + b) as usize);
                            let mut x = dev.alloc_buf(a as usize);
                            x.as_mut_slice().copy_from_slice(&data[..a as usize]);
                            let mut y = dev.alloc_buf(b as usize);
                            y.as_mut_slice().copy_from_slice(&data[a as usize..]);
                            Out::Write(dev.writev_at(vec![x, y], off).await.0.map_err(err))
                        }
                        Op::ReadV { off, lens } => {
                            let bufs = lens
                                .iter()
                                .map(|&l| {
                                    let mut b = dev.alloc_buf(l as usize);
                                    b.as_mut_slice().fill(0xEE);
                                    b
                                })
                                .collect();
                            let (r, bufs) = dev.readv_at(bufs, off).await;
                            Out::Read(
                                r.map(|n| {
                                    let v: Vec<u8> = bufs
                                        .iter()
                                        .flat_map(|b| b.as_slice().iter().copied())
                                        .collect();
                                    assert_eq!(
                                        v.len(),
                                        n,
                                        "readv: buffer lengths sum to the count"
                                    );
                                    v
                                })
                                .map_err(err),
                            )
                        }
                        Op::Zero { off, len, discard } => Out::Flush(
                            if discard {
                                dev.discard(off, len).await
                            } else {
                                dev.write_zeroes(off, len).await
                            }
                            .map_err(err),
                        ),
                        Op::Flush => Out::Flush(dev.sync_data().await.map_err(err)),
                    }
                }
            });
            outs.extend(futures::future::join_all(futs).await);
        }
        // Dropped reads may still be in flight: they finish on their own.
        for _ in 0..100_000 {
            if dev.tags_in_use() == 0 {
                break;
            }
            plugio_executor::sleep(Duration::from_micros(1)).await;
        }
        assert_eq!(dev.tags_in_use(), 0, "tags left in use");
        outs
    })
}

fn check(s: &Scenario, writes_fail: bool, configs: &[Config]) -> Result<(), TestCaseError> {
    let f = faults(s, writes_fail);
    let want = model(s, &f);
    for &c in configs {
        let got = run(s, f.clone(), c);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if *g == Out::Dropped {
                continue;
            }
            if let (Out::Read(Ok(a)), Out::Read(Ok(b))) = (g, w) {
                let first = a.iter().zip(b).position(|(x, y)| x != y);
                prop_assert!(
                    a == b,
                    "IO {} under {:?}: read {} bytes, want {}; first difference at byte {:?} (got {:?}, want {:?})",
                    i, c, a.len(), b.len(), first,
                    first.map(|f| &a[f..(f + 8).min(a.len())]),
                    first.map(|f| &b[f..(f + 8).min(b.len())])
                );
                continue;
            }
            prop_assert_eq!(g, w, "IO {} differs from the model under {:?}", i, c);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(128), failure_persistence: None, ..ProptestConfig::default() })]

    /// Merging (nomerges 0, 1, 2) never changes a result under EIO and
    /// short-read faults: each IO gets what a one-at-a-time device in
    /// program order gives, bytes included.
    #[test]
    fn results_match_the_model_for_every_nomerges(s in scenario()) {
        // The mem device checks EIO over a whole op before a short read:
        // cut into chunks, which of the two a read meets first depends on
        // where the chunks start. Keep one kind of read fault here.
        let mut s2 = s.clone();
        if s2.short_lba.is_some() {
            s2.eio.clear();
        }
        watchdog(120, move || {
            let cfgs: Vec<Config> = (0..3).map(|n| Config { nomerges: n, at_most: None, max_request_bytes: None, drop_reads: false }).collect();
            check(&s2, true, &cfgs)
        })?;
    }

    /// The same with a backend that moves at most a few KiB per request
    /// (every larger request resumes) and a small request limit (big IOs
    /// split). Writes never fail here: a failed write that resumed has
    /// partly landed, which the model does not describe.
    #[test]
    fn results_match_the_model_with_short_transfers_and_splits(s in scenario(), at in 1u64..=6, rq in prop::option::of(1u64..=8)) {
        // The mem device checks EIO over a whole op before a short read:
        // cut into chunks, which of the two a read meets first depends on
        // where the chunks start. Keep one kind of read fault here.
        let mut s2 = s.clone();
        if s2.short_lba.is_some() {
            s2.eio.clear();
        }
        watchdog(120, move || {
            let cfgs: Vec<Config> = (0..3).map(|n| Config {
                nomerges: n,
                at_most: Some(at * 512),
                max_request_bytes: rq.map(|r| r * 1024),
                drop_reads: false,
            }).collect();
            check(&s2, false, &cfgs)
        })?;
    }
}

#[allow(dead_code)]
fn _unused(_: DmaBuf) {}

// ---------------------------------------------------------------------
// Cancellation: futures dropped in the plug, waiting for tags, in flight
// and while their request is being reissued after a short completion.
// ---------------------------------------------------------------------

fn mem_dev(seed: u64, latency_us: u64) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(MemConfig {
        capacity_bytes: CAP,
        latency: Latency::Uniform {
            min: Duration::from_micros(1),
            max: Duration::from_micros(latency_us.max(1)),
        },
        clock: MemClock::Virtual,
        seed,
        ..Default::default()
    }))
}

/// `k` short sleeps: each needs a park, and each park delivers one group
/// of simulated completions. (Not no-ops on a second mem device: with
/// zero latency its virtual deadlines stay earliest and the other mem
/// device's completions are never delivered while it is kept busy.)
async fn steps(_tick: &Device, k: u32) {
    for _ in 0..k {
        plugio_executor::sleep(Duration::from_micros(1)).await;
    }
}

/// Drives until no tag of `dev` is in use (bounded).
async fn settle(tick: &Device, dev: &Device) {
    // Let the plug flush first.
    steps(tick, 1).await;
    for _ in 0..10_000 {
        if dev.tags_in_use() == 0 && dev.iostats().in_flight == 0 {
            // Twice in a row: requests reissued or waiting get tags at once.
            steps(tick, 1).await;
            if dev.tags_in_use() == 0 {
                return;
            }
        }
        steps(tick, 1).await;
    }
    panic!(
        "tags still in use: {}: {:?}",
        dev.tags_in_use(),
        dev.iostats()
    );
}

/// Reads and writes on a backend that cuts every request to 512 bytes
/// (so each IO is reissued many times) are dropped after `k` steps of
/// another device, for every `k`: the orphaned IO must not write into
/// memory handed out again, tags must all come back, and the device
/// must end with each 512-byte block either old or new.
#[test]
fn ios_dropped_while_being_reissued_leave_no_tag_and_no_corruption() {
    watchdog(300, || {
        for qd in [1u32, 2, 32] {
            for nomerges in [0u8, 2] {
                let m = mem_dev(u64::from(qd) * 7 + u64::from(nomerges), 200);
                let backend: Arc<dyn Backend> = Arc::new(AtMost {
                    inner: m.clone(),
                    max_bytes: 512,
                });
                let opts = DeviceOptions {
                    queue_depth: qd,
                    nomerges,
                    ..Default::default()
                };
                let dev = Device::with_backend(backend, None, opts).unwrap();
                let tick = Device::with_backend(
                    Arc::new(MemDevice::new(MemConfig::default())),
                    None,
                    DeviceOptions::default(),
                )
                .unwrap();
                local().run(async move {
                    // Old contents: block b holds byte (b % 251).
                    let mut old = dev.alloc_buf(AREA as usize);
                    for (i, x) in old.as_mut_slice().iter_mut().enumerate() {
                        *x = (i / 512 % 251) as u8;
                    }
                    dev.write_at(old, 0).await.0.expect("fill");
                    for k in 0..40u32 {
                        let off = u64::from(k % 8) * 8192;
                        let mut rbuf = dev.alloc_buf(8192);
                        rbuf.as_mut_slice().fill(0xEE);
                        let mut wbuf = dev.alloc_buf(8192);
                        wbuf.as_mut_slice().fill(0xC0 | (k as u8 & 0x0f));
                        let r = dev.read_at(rbuf, off);
                        let w = dev.write_at(wbuf, off + 4096);
                        let r2 = dev.read_alloc_at(off + 2048, 4096);
                        let victims = futures::future::join3(r, w, r2);
                        let drive = steps(&tick, k);
                        futures::pin_mut!(victims, drive);
                        let done = futures::future::select(victims, drive).await;
                        let completed = matches!(done, futures::future::Either::Left(_));
                        drop(done);
                        // Buffers handed out now must stay as we fill them.
                        let mut mine: Vec<DmaBuf> = (0..8).map(|_| dev.alloc_buf(8192)).collect();
                        for (i, b) in mine.iter_mut().enumerate() {
                            b.as_mut_slice().fill(0x30 + i as u8);
                        }
                        settle(&tick, &dev).await;
                        for (i, b) in mine.iter().enumerate() {
                            assert!(
                                b.as_slice().iter().all(|&x| x == 0x30 + i as u8),
                                "k {k} qd {qd}: a buffer handed out after the drop was written (completed {completed})"
                            );
                        }
                        assert_eq!(dev.tags_in_use(), 0);
                    }
                    let got = dev.read_alloc_at(0, AREA as usize).await.expect("read back");
                    for (b, chunk) in got.as_slice().chunks(512).enumerate() {
                        let first = chunk[0];
                        assert!(
                            chunk.iter().all(|&x| x == first),
                            "block {b} torn inside 512 bytes"
                        );
                        assert!(
                            first == (b % 251) as u8 || first & 0xf0 == 0xC0,
                            "block {b} holds {first:#x}"
                        );
                    }
                });
            }
        }
    });
}

/// Futures dropped right after their first poll (still in the plug) and
/// while waiting for the one tag of a queue-depth-1 device.
#[test]
fn ios_dropped_in_the_plug_and_waiting_for_tags_at_queue_depth_1() {
    watchdog(120, || {
        let m = mem_dev(3, 100);
        let opts = DeviceOptions {
            queue_depth: 1,
            ..Default::default()
        };
        let dev = Device::with_backend(m, None, opts).unwrap();
        let tick = Device::with_backend(
            Arc::new(MemDevice::new(MemConfig::default())),
            None,
            DeviceOptions::default(),
        )
        .unwrap();
        local().run(async move {
            for round in 0..30u32 {
                let mut futs = Vec::new();
                for i in 0..16u64 {
                    let mut b = dev.alloc_buf(4096);
                    b.as_mut_slice().fill(round as u8);
                    if i % 2 == 0 {
                        futs.push(futures::future::Either::Left(dev.write_at(b, i * 4096)));
                    } else {
                        futs.push(futures::future::Either::Right(
                            dev.read_at(b, (i - 1) * 4096),
                        ));
                    }
                }
                let mut all = Box::pin(futures::future::join_all(futs));
                // Poll once: every bio goes into the plug.
                let waker = futures::task::noop_waker();
                let mut cx = std::task::Context::from_waker(&waker);
                let _ = all.as_mut().poll(&mut cx);
                if round % 3 == 0 {
                    drop(all); // in the plug
                } else {
                    // Some in flight, the rest waiting for the one tag.
                    steps(&tick, round % 5).await;
                    drop(all);
                }
                settle(&tick, &dev).await;
            }
            // The device still works and its data is whole.
            let mut b = dev.alloc_buf(65536);
            b.as_mut_slice().fill(0x5a);
            dev.write_at(b, 0).await.0.expect("write");
            let r = dev.read_alloc_at(0, 65536).await.expect("read");
            assert!(r.as_slice().iter().all(|&x| x == 0x5a));
            assert_eq!(dev.tags_in_use(), 0);
        });
    });
}

use std::future::Future;

// ---------------------------------------------------------------------
// Several devices on one core; devices closed with IO in flight and new
// ones opened (taking the freed slot); executors one after another and
// interleaved on one thread.
// ---------------------------------------------------------------------

fn pat(dev: u8, round: u32, off: u64, len: usize) -> Vec<u8> {
    fill(dev.wrapping_mul(37).wrapping_add(round as u8), off, len)
}

/// Each round: IO on every open device in one tick (writes then
/// overlapping reads, in one join), then one device is closed with an
/// orphaned write still in flight and a new one opened; reads verify
/// every device against its own model, and the closed device's backend
/// got its orphaned write.
#[test]
fn many_devices_on_one_core_with_devices_closed_and_opened_mid_flight() {
    watchdog(240, || {
        local().run(async {
            let mut devs: Vec<(u8, Arc<MemDevice>, Device, Vec<u8>)> = Vec::new();
            let mut next_id = 0u8;
            let open = |id: u8| {
                let m = mem_dev(u64::from(id) + 100, 150);
                let opts = DeviceOptions {
                    queue_depth: 1 + u32::from(id % 3) * 3,
                    nomerges: id % 3,
                    ..Default::default()
                };
                let d = Device::with_backend(m.clone(), None, opts).unwrap();
                (id, m, d, vec![0u8; AREA as usize])
            };
            for _ in 0..4 {
                devs.push(open(next_id));
                next_id += 1;
            }
            let tick = Device::with_backend(
                Arc::new(MemDevice::new(MemConfig::default())),
                None,
                DeviceOptions::default(),
            )
            .unwrap();
            for round in 0..24u32 {
                // One tick of IO on every device: writes, then reads that
                // overlap them (program order must hold per device).
                let mut futs = Vec::new();
                for (id, _, d, model) in devs.iter_mut() {
                    for j in 0..4u64 {
                        let off = ((u64::from(round) * 3 + j * 5 + u64::from(*id)) % 14) * 4096;
                        let len = 4096 * (1 + (j as usize + round as usize) % 3);
                        let data = pat(*id, round, off, len);
                        model[off as usize..off as usize + len].copy_from_slice(&data);
                        let mut b = d.alloc_buf(len);
                        b.as_mut_slice().copy_from_slice(&data);
                        let d2 = d.clone();
                        futs.push(Box::pin(async move {
                            d2.write_at(b, off).await.0.expect("write");
                            None
                        })
                            as std::pin::Pin<
                                Box<dyn Future<Output = Option<(u8, u64, Vec<u8>)>>>,
                            >);
                        let roff = off.saturating_sub(2048);
                        let want = model[roff as usize..roff as usize + 8192].to_vec();
                        let d3 = d.clone();
                        let id = *id;
                        futs.push(Box::pin(async move {
                            let r = d3.read_alloc_at(roff, 8192).await.expect("read");
                            assert_eq!(
                                r.as_slice(),
                                &want[..],
                                "device {id} round {round} at {roff}"
                            );
                            Some((id, roff, want))
                        }));
                    }
                }
                futures::future::join_all(futs).await;
                // Close one device with an orphaned write in flight.
                let victim = (round as usize * 7) % devs.len();
                let (vid, vm, vdev, _) = devs.remove(victim);
                let mut b = vdev.alloc_buf(4096);
                b.as_mut_slice().fill(0xD0 | (round as u8 & 0xf));
                {
                    let mut w = Box::pin(vdev.write_at(b, 60 * 1024));
                    let waker = futures::task::noop_waker();
                    let mut cx = std::task::Context::from_waker(&waker);
                    let _ = w.as_mut().poll(&mut cx);
                    if round % 2 == 0 {
                        // Dispatched (the plug flushed at the tick end).
                        steps(&tick, 1).await;
                    }
                }
                drop(vdev);
                // A new device, opened while the old one's write is
                // plugged or in flight, and used in the same tick.
                let (nid, nm, ndev, nmodel) = open(next_id);
                next_id = next_id.wrapping_add(1);
                let mut nb = ndev.alloc_buf(4096);
                nb.as_mut_slice().fill(0x77);
                ndev.write_at(nb, 60 * 1024).await.0.expect("write new");
                devs.push((nid, nm, ndev, nmodel));
                let mut model_n = devs.last().unwrap().3.clone();
                model_n[60 * 1024..64 * 1024].fill(0x77);
                devs.last_mut().unwrap().3 = model_n;
                // The closed device's write lands on its own backend only.
                steps(&tick, 20).await;
                let mut got = [0u8; 4096];
                let peek =
                    Device::with_backend(vm.clone(), None, DeviceOptions::default()).unwrap();
                for _ in 0..1000 {
                    let r = peek.read_alloc_at(60 * 1024, 4096).await.expect("peek");
                    got.copy_from_slice(r.as_slice());
                    if got[0] != 0 {
                        break;
                    }
                    steps(&tick, 1).await;
                }
                assert!(
                    got.iter().all(|&x| x == 0xD0 | (round as u8 & 0xf)),
                    "closed device {vid}: orphaned write did not land whole"
                );
            }
            for (id, _, d, model) in &devs {
                let r = d.read_alloc_at(0, AREA as usize).await.expect("read all");
                assert!(
                    r.as_slice() == &model[..],
                    "device {id} differs from its model"
                );
                assert_eq!(d.tags_in_use(), 0);
            }
        });
    });
}

/// Executors one after another on one thread (only one may be alive at a
/// time), IO on a shared device from each; an IO future first polled on
/// one executor outlives it and is dropped, or polled to its end, inside
/// the next: the thread-local core pointer must never name a state that
/// is gone, and the result must be the one the first executor delivered.
#[test]
// The run returns an issued IO future on purpose.
#[allow(clippy::async_yields_async)]
fn executors_one_after_another_on_one_thread_share_devices_safely() {
    type Held<'a> =
        std::pin::Pin<Box<dyn Future<Output = (Result<usize, plugio_device::Error>, DmaBuf)> + 'a>>;
    watchdog(240, || {
        let m = mem_dev(9, 100);
        let dev = Device::with_backend(m, None, DeviceOptions::default()).unwrap();
        let mut held: Option<(u32, Held<'_>)> = None;
        for round in 0..30u32 {
            let ex = local();
            let leftover = held.take();
            let fut = ex.run(async {
                if let Some((_, mut f)) = leftover {
                    if round % 3 == 0 {
                        // Drop a future issued on the previous executor.
                        drop(f);
                    } else {
                        // Or poll it: it never reached its device (the old
                        // executor returned before its tick ended, so the
                        // plug was never flushed); it must panic as
                        // documented, not wait forever.
                        let waker = futures::task::noop_waker();
                        let mut cx = std::task::Context::from_waker(&waker);
                        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            f.as_mut().poll(&mut cx).is_ready()
                        }));
                        match polled {
                            Ok(ready) => {
                                assert!(ready, "round {round}: a moved IO future is pending")
                            }
                            Err(p) => {
                                let msg = p
                                    .downcast_ref::<&str>()
                                    .map(|s| s.to_string())
                                    .or_else(|| p.downcast_ref::<String>().cloned())
                                    .unwrap_or_default();
                                assert!(msg.contains("moved to another core"), "{msg}");
                            }
                        }
                        drop(f);
                    }
                }
                let off = u64::from(round % 8) * 8192;
                let mut w = dev.alloc_buf(8192);
                w.as_mut_slice().fill(round as u8 + 1);
                let (r, x) = futures::join!(dev.write_at(w, off), dev.read_alloc_at(off, 8192));
                r.0.expect("write");
                assert!(x
                    .expect("read")
                    .as_slice()
                    .iter()
                    .all(|&v| v == round as u8 + 1));
                // Leave one IO issued but unfinished on this executor.
                let mut f: Held<'_> = Box::pin(dev.read_at(dev.alloc_buf(4096), off));
                let waker = futures::task::noop_waker();
                let mut cx = std::task::Context::from_waker(&waker);
                assert!(f.as_mut().poll(&mut cx).is_pending());
                f
            });
            held = Some((round, fut));
            drop(ex);
        }
        drop(held);
        // Off every executor: IO fails cleanly.
        let mut f = Box::pin(dev.read_alloc_at(0, 4096));
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => assert!(r.is_err()),
            std::task::Poll::Pending => panic!("IO off a runtime must fail, not hang"),
        }
    });
}

// ---------------------------------------------------------------------
// Submissions refused by the backend (the `Status::Submit` path, which
// completes inside dispatch, possibly inside a plug flush).
// ---------------------------------------------------------------------

/// Refuses some submissions (a seeded pattern) with `EAGAIN`.
#[derive(Debug)]
struct Refuse {
    inner: Arc<MemDevice>,
    n: std::sync::atomic::AtomicU64,
    seed: u64,
}

impl Backend for Refuse {
    fn geometry(&self) -> &plugio_device::Geometry {
        self.inner.geometry()
    }

    fn kind(&self) -> plugio_device::backend::BackendKind {
        self.inner.kind()
    }

    unsafe fn submit(
        &self,
        op: &plugio_device::IoOp<'_>,
        handler: plugio_device::HandlerId,
        token: u64,
    ) -> plugio_device::Result<()> {
        let n = self.n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if (n ^ self.seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 62 == 0 {
            return Err(plugio_device::Error::from_errno(libc::EAGAIN));
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.submit(op, handler, token) }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(96), failure_persistence: None, ..ProptestConfig::default() })]

    /// Some reads dropped midway (in the plug, waiting for tags, in flight
    /// or being resumed) change no other IO's result, with short
    /// transfers, splits and every nomerges.
    #[test]
    fn dropped_reads_change_no_other_result(s in scenario(), at in prop::option::of(1u64..=4), rq in prop::option::of(1u64..=8)) {
        // As above: a read cut into chunks (by `at` or by the request
        // limit `rq`) may meet the short read or the EIO first, depending
        // on where the chunks start; keep one kind of read fault.
        let mut s2 = s.clone();
        if (at.is_some() || rq.is_some()) && s2.short_lba.is_some() {
            s2.eio.clear();
        }
        watchdog(120, move || {
            let cfgs: Vec<Config> = (0..3).map(|n| Config {
                nomerges: n,
                at_most: at.map(|a| a * 512),
                max_request_bytes: rq.map(|r| r * 1024),
                drop_reads: true,
            }).collect();
            // A failed write split into several requests (or resumed) has
            // partly landed: writes fail only when neither happens.
            check(&s2, at.is_none() && rq.is_none(), &cfgs)
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(96), failure_persistence: None, ..ProptestConfig::default() })]

    /// With about a quarter of submissions refused: nothing hangs, every
    /// tag comes back, and each IO either fails or returns what a
    /// one-at-a-time device gives after the writes that succeeded before
    /// it in program order (a refused write has no effect).
    #[test]
    fn refused_submissions_fail_their_ios_and_nothing_else(s in scenario(), nomerges in 0u8..3) {
        let s = s.clone();
        watchdog(120, move || -> Result<(), TestCaseError> {
            let m = Arc::new(MemDevice::new(MemConfig {
                capacity_bytes: CAP,
                latency: Latency::Uniform { min: Duration::from_micros(1), max: Duration::from_micros(300) },
                seed: s.seed,
                ..Default::default()
            }));
            let backend: Arc<dyn Backend> = Arc::new(Refuse { inner: m, n: Default::default(), seed: s.seed });
            let opts = DeviceOptions { nomerges, queue_depth: s.qd, ..Default::default() };
            let dev = Device::with_backend(backend, None, opts).unwrap();
            let batches = s.batches.clone();
            let outs = local().run(async move {
                let mut outs = Vec::new();
                for batch in batches {
                    let futs = batch.into_iter().map(|op| {
                        let dev = dev.clone();
                        async move {
                            let err = |e: plugio_device::Error| format!("{:?}", e.kind());
                            match op {
                                Op::Read { off, len } => Out::Read(dev.read_alloc_at(off, len as usize).await.map(|b| b.as_slice().to_vec()).map_err(err)),
                                Op::Write { off, len, fua, seed } => {
                                    let mut b = dev.alloc_buf(len as usize);
                                    b.as_mut_slice().copy_from_slice(&fill(seed, off, len as usize));
                                    let flags = if fua { IoFlags::FUA } else { IoFlags::NONE };
                                    Out::Write(dev.write_at_with(b, off, flags).await.0.map_err(err))
                                }
                                Op::WriteV { off, a, b, seed } => {
                                    let data = fill(seed, off, (a + b) as usize);
                                    let mut x = dev.alloc_buf(a as usize);
                                    x.as_mut_slice().copy_from_slice(&data[..a as usize]);
                                    let mut y = dev.alloc_buf(b as usize);
                                    y.as_mut_slice().copy_from_slice(&data[a as usize..]);
                                    Out::Write(dev.writev_at(vec![x, y], off).await.0.map_err(err))
                                }
                                Op::ReadV { off, lens } => {
                                    let bufs = lens.iter().map(|&l| dev.alloc_buf(l as usize)).collect();
                                    let (r, bufs) = dev.readv_at(bufs, off).await;
                                    Out::Read(r.map(|_| bufs.iter().flat_map(|b| b.as_slice().iter().copied()).collect()).map_err(err))
                                }
                                Op::Zero { off, len, discard } => Out::Flush(if discard { dev.discard(off, len).await } else { dev.write_zeroes(off, len).await }.map_err(err)),
                        Op::Flush => Out::Flush(dev.sync_data().await.map_err(err)),
                            }
                        }
                    });
                    outs.extend(futures::future::join_all(futs).await);
                }
                assert_eq!(dev.tags_in_use(), 0, "tags left in use");
                outs
            });
            // Check against the model, applying only the writes that went.
            let mut img = vec![0u8; CAP as usize];
            let ops: Vec<&Op> = s.batches.iter().flatten().collect();
            for (i, (op, out)) in ops.iter().zip(&outs).enumerate() {
                match (op, out) {
                    (Op::ReadV { off, lens }, Out::Read(Ok(got))) => {
                        let len: u64 = lens.iter().sum();
                        prop_assert_eq!(got.len() as u64, len, "readv {} short", i);
                        prop_assert!(got[..] == img[*off as usize..(*off + len) as usize], "readv {} bytes", i);
                    }
                    (Op::Read { off, len }, Out::Read(Ok(got))) => {
                        prop_assert_eq!(got.len() as u64, *len, "read {} short", i);
                        prop_assert!(got[..] == img[*off as usize..(*off + *len) as usize], "read {} bytes", i);
                    }
                    (Op::Write { off, len, seed, .. }, Out::Write(Ok(n))) => {
                        prop_assert_eq!(*n as u64, *len);
                        img[*off as usize..(*off + *len) as usize].copy_from_slice(&fill(*seed, *off, *len as usize));
                    }
                    (Op::WriteV { off, a, b, seed }, Out::Write(Ok(n))) => {
                        prop_assert_eq!(*n as u64, a + b);
                        img[*off as usize..(*off + a + b) as usize].copy_from_slice(&fill(*seed, *off, (a + b) as usize));
                    }
                    (_, Out::Read(Err(e)) | Out::Write(Err(e)) | Out::Flush(Err(e))) => {
                        prop_assert!(e.contains(&libc::EAGAIN.to_string()) || e.contains("WouldBlock") || e.contains("Again"), "IO {} failed with {}", i, e);
                    }
                    (Op::Zero { off, len, .. }, Out::Flush(Ok(()))) => {
                        img[*off as usize..(*off + *len) as usize].fill(0);
                    }
                    (Op::Flush, Out::Flush(Ok(()))) => {}
                    (op, out) => prop_assert!(false, "IO {} {:?} gave {:?}", i, op, out),
                }
            }
            Ok(())
        })?;
    }
}

/// A database with many files open: 70 devices on one core, each used
/// once (so each holds a device index), then a read on each alone that
/// comes back short and must resume. A device past index 63 must have its
/// reissued request dispatched like any other.
#[test]
fn short_transfers_resume_on_a_core_with_more_than_64_devices() {
    watchdog(60, || {
        local().run(async {
            let devs: Vec<(Arc<MemDevice>, Device)> = (0..70u64)
                .map(|i| {
                    let m = mem_dev(i, 50);
                    let backend: Arc<dyn Backend> = Arc::new(AtMost {
                        inner: m.clone(),
                        max_bytes: 2048,
                    });
                    (
                        m,
                        Device::with_backend(backend, None, DeviceOptions::default()).unwrap(),
                    )
                })
                .collect();
            // Every device gets its index on this core, in order.
            for (i, (_, d)) in devs.iter().enumerate() {
                let mut b = d.alloc_buf(1024);
                b.as_mut_slice().fill(i as u8);
                d.write_at(b, 0).await.0.expect("write");
            }
            // Now each alone: a 16 KiB read resumes 7 times.
            for (i, (_, d)) in devs.iter().enumerate().rev() {
                let r = d.read_alloc_at(0, 16384).await.expect("read");
                assert_eq!(r.len(), 16384, "device {i}");
                assert!(r.as_slice()[..1024].iter().all(|&x| x == i as u8));
                assert_eq!(d.tags_in_use(), 0);
            }
        });
    });
}

// ---------------------------------------------------------------------
// Power cut with writes in flight.
// ---------------------------------------------------------------------

/// Eight adjacent 4 KiB writes in flight when the power is cut: each one
/// fails with ENODEV (its op never took effect), whatever `nomerges` says.
/// The results of the three settings must be the same.
fn writes_in_flight_at_a_power_cut(nomerges: u8) -> Vec<Result<usize, String>> {
    let m = mem_dev(5, 200);
    let opts = DeviceOptions {
        nomerges,
        ..Default::default()
    };
    let dev = Device::with_backend(m.clone(), None, opts).unwrap();
    local().run(async move {
        let writes = (0..8u64).map(|i| {
            let mut b = dev.alloc_buf(4096);
            b.as_mut_slice().fill(0x60 + i as u8);
            dev.write_at(b, i * 4096)
        });
        let guard = dev.plug(8).expect("plug");
        let mut all = Box::pin(futures::future::join_all(writes));
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(all.as_mut().poll(&mut cx).is_pending());
        // The explicit plug's end flushes and submits; the ops wait for
        // their (virtual) deadlines, delivered at the next park.
        drop(guard);
        assert!(dev.tags_in_use() > 0, "the writes are in flight");
        m.power_cut();
        all.await
            .into_iter()
            .map(|(r, _)| r.map_err(|e| format!("{:?}", e.kind())))
            .collect()
    })
}

/// A merged request that fails is issued again bio by bio, which keeps
/// results equal for errors tied to blocks (a bad LBA). A failure of the
/// whole device at one instant is not retried: the mem device's power cut
/// fails the ops in flight with `ENODEV` (a device gone offline), and
/// every write in flight gets it, merged or not (retried after the cut,
/// merged ones used to succeed where unmerged ones failed).
#[test]
fn writes_in_flight_at_a_power_cut_fail_alike_for_every_nomerges() {
    watchdog(60, || {
        let none = writes_in_flight_at_a_power_cut(2);
        let one = writes_in_flight_at_a_power_cut(1);
        let all = writes_in_flight_at_a_power_cut(0);
        println!("nomerges 2: {none:?}\nnomerges 1: {one:?}\nnomerges 0: {all:?}");
        let gone = format!(
            "{:?}",
            plugio_device::ErrorKind::Io {
                errno: libc::ENODEV
            }
        );
        assert!(
            none.iter().all(|r| r.as_ref().err() == Some(&gone)),
            "every write in flight at the cut fails: {none:?}"
        );
        assert_eq!(none, all, "merging changed the results of a power cut");
        assert_eq!(
            none, one,
            "one-hit merging changed the results of a power cut"
        );
    });
}

// ---------------------------------------------------------------------
// Several cores sharing one device's tags at a tiny queue depth.
// ---------------------------------------------------------------------

/// Three cores share a queue depth of 2 on one device whose requests all
/// come back short (so every IO is requeued several times while the other
/// cores hold the tags); each core writes and reads back its own area,
/// some futures are dropped midway. Everything completes, data is right,
/// and every tag comes back.
#[test]
fn three_cores_share_two_tags_with_requeues_and_drops() {
    watchdog(240, || {
        let m = mem_dev(77, 100);
        let backend: Arc<dyn Backend> = Arc::new(AtMost {
            inner: m,
            max_bytes: 1024,
        });
        let opts = DeviceOptions {
            queue_depth: 2,
            ..Default::default()
        };
        let dev = Device::with_backend(backend, None, opts).unwrap();
        let rt = plugio_engine::runtime::builder(RingConfig::default())
            .cores(3)
            .build()
            .expect("runtime");
        let handles: Vec<_> = (0..3usize)
            .map(|core| {
                let dev = dev.clone();
                rt.spawn_on(core, async move {
                    let base = core as u64 * 20 * 1024;
                    for round in 0..30u32 {
                        let byte = (core as u8) << 6 | (round as u8 & 0x3f);
                        let writes = (0..4u64).map(|j| {
                            let mut b = dev.alloc_buf(4096);
                            b.as_mut_slice().fill(byte);
                            dev.write_at(b, base + j * 4096)
                        });
                        for (r, _) in futures::future::join_all(writes).await {
                            assert_eq!(r.expect("write"), 4096);
                        }
                        // Some reads are dropped after a few sleeps.
                        let dropped = dev.read_alloc_at(base, 16384);
                        let nap = async {
                            for _ in 0..(round % 4) {
                                plugio_executor::sleep(Duration::from_micros(1)).await;
                            }
                        };
                        futures::pin_mut!(dropped, nap);
                        let _ = futures::future::select(dropped, nap).await;
                        let r = dev.read_alloc_at(base, 16384).await.expect("read");
                        assert!(
                            r.as_slice().iter().all(|&x| x == byte),
                            "core {core} round {round}: read back wrong bytes"
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            futures::executor::block_on(h).expect("core task");
        }
        // Orphaned reads finish on their cores.
        for _ in 0..10_000 {
            if dev.tags_in_use() == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(dev.tags_in_use(), 0);
        rt.shutdown(plugio_executor::ShutdownMode::Wait)
            .expect("shutdown");
    });
}

// ---------------------------------------------------------------------
// A real file through io_uring: more IO in one tick than the SQ holds.
// ---------------------------------------------------------------------

/// 3000 page IOs in one tick on a file (writes, then reads of the same
/// pages in the next tick), with a deep queue and tiny plug limits: the
/// plug fills many times in one tick, the SQ overflows into the ring's
/// backlog and completions arrive in batches. Every byte is right.
#[test]
fn thousands_of_ios_in_one_tick_on_a_file() {
    watchdog(240, || {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let path = dir.path().join("many");
        std::fs::write(&path, vec![0u8; 3000 * 4096]).unwrap();
        for (nomerges, plug_max_count) in [(2u8, 3usize), (0, 7), (1, 64)] {
            let path = path.clone();
            local().run(async move {
                let dev = Device::open(
                    &path,
                    DeviceOptions {
                        nomerges,
                        plug_max_count,
                        queue_depth: 1024,
                        ..Default::default()
                    },
                )
                .expect("open");
                // Pages in a scrambled order.
                let order: Vec<u64> = (0..3000u64).map(|i| (i * 1237) % 3000).collect();
                let writes = order.iter().map(|&p| {
                    let mut b = dev.alloc_buf(4096);
                    b.as_mut_slice().fill((p % 251) as u8 ^ nomerges);
                    dev.write_at(b, p * 4096)
                });
                for (r, _) in futures::future::join_all(writes).await {
                    assert_eq!(r.expect("write"), 4096);
                }
                let reads = order.iter().map(|&p| dev.read_alloc_at(p * 4096, 4096));
                for (r, &p) in futures::future::join_all(reads)
                    .await
                    .into_iter()
                    .zip(&order)
                {
                    let r = r.expect("read");
                    assert!(
                        r.as_slice()
                            .iter()
                            .all(|&x| x == (p % 251) as u8 ^ nomerges),
                        "page {p}"
                    );
                }
                assert_eq!(dev.tags_in_use(), 0);
            });
        }
    });
}

/// Executors one after another on one thread, each leaving nothing
/// behind: each new core state retires the idle old ones (unregistering
/// their completion handlers) and its own IO still completes.
#[test]
fn idle_core_states_retire_cleanly_across_executors() {
    watchdog(120, || {
        let m = mem_dev(11, 50);
        let dev = Device::with_backend(m, None, DeviceOptions::default()).unwrap();
        for round in 0..25u32 {
            let ex = local();
            let dev = dev.clone();
            ex.run(async move {
                let mut b = dev.alloc_buf(4096);
                b.as_mut_slice().fill(round as u8);
                let (w, r) = futures::join!(dev.write_at(b, 0), dev.read_alloc_at(0, 4096));
                w.0.expect("write");
                assert!(r
                    .expect("read")
                    .as_slice()
                    .iter()
                    .all(|&x| x == round as u8));
            });
        }
    });
}

/// A 4 MiB read split into 64 KiB requests at queue depth 4 (requests
/// wait for tags, complete out of order): an EIO in part 30 fails the
/// whole read; a short read in part 30 (inside the device: no end of
/// file) resumes there, makes no progress twice and fails the read with
/// `NoProgress` naming exactly that byte and what was left of the read,
/// although later parts completed in full.
#[test]
fn huge_split_read_with_a_fault_in_a_middle_part() {
    watchdog(120, || {
        const BIG: usize = 4 << 20;
        let bad_lba = (30 * 65536 + 4096) / 512;
        for fault in [
            Fault::Eio {
                lbas: bad_lba..bad_lba + 1,
                on: FaultOn::Read,
            },
            Fault::ShortRead { lba: bad_lba },
        ] {
            let m = Arc::new(MemDevice::new(MemConfig {
                capacity_bytes: 8 << 20,
                latency: Latency::Uniform {
                    min: Duration::from_micros(1),
                    max: Duration::from_micros(500),
                },
                seed: 21,
                ..Default::default()
            }));
            let opts = DeviceOptions {
                queue_depth: 4,
                max_request_bytes: Some(65536),
                ..Default::default()
            };
            let dev = Device::with_backend(m.clone(), None, opts).unwrap();
            let is_eio = matches!(fault, Fault::Eio { .. });
            local().run(async move {
                let data: Vec<u8> = (0..BIG).map(|i| (i / 512 % 253) as u8).collect();
                let mut b = dev.alloc_buf(BIG);
                b.as_mut_slice().copy_from_slice(&data);
                dev.write_at(b, 0).await.0.expect("write");
                m.inject(fault);
                let r = dev.read_alloc_at(0, BIG).await;
                if is_eio {
                    assert!(r.is_err(), "EIO in a middle part must fail the read");
                } else {
                    let at = bad_lba * 512;
                    assert_eq!(
                        r.expect_err("a short read inside the device is no end of file")
                            .kind(),
                        &plugio_device::ErrorKind::NoProgress {
                            offset_bytes: at,
                            len_bytes: BIG as u64 - at
                        }
                    );
                }
                // The device still serves reads around the bad block.
                let after = dev
                    .read_alloc_at(31 * 65536, 65536)
                    .await
                    .expect("later part");
                assert!(after.as_slice() == &data[31 * 65536..32 * 65536]);
                assert_eq!(dev.tags_in_use(), 0);
            });
        }
    });
}

/// The last thing an executor's `run` does is drop an IO future that is
/// still in the plug (it lost a race); then the executor goes away. The
/// core state must not keep the device (and its file) alive for good:
/// once the thread runs a new executor, the old device is released.
#[test]
fn an_io_dropped_in_the_plug_as_run_returns_does_not_pin_the_device() {
    watchdog(60, || {
        let m = mem_dev(1, 10);
        {
            let dev = Device::with_backend(m.clone(), None, DeviceOptions::default()).unwrap();
            let ex = local();
            ex.run(async {
                let mut b = dev.alloc_buf(4096);
                b.as_mut_slice().fill(1);
                let w = dev.write_at(b, 0);
                futures::pin_mut!(w);
                // Lost the race: polled once (plugged), then dropped.
                let _ = futures::future::select(w, futures::future::ready(())).await;
            });
            drop(ex);
        }
        // A new executor on this thread, with IO of its own.
        let other = Device::with_backend(mem_dev(2, 10), None, DeviceOptions::default()).unwrap();
        local().run(async {
            other.read_alloc_at(0, 4096).await.expect("read");
        });
        assert_eq!(
            Arc::strong_count(&m),
            1,
            "the dropped device is still held by a dead core state"
        );
    });
}

/// An executor dropped while IO that keeps being reissued (every request
/// comes back short) is in flight at queue depth 1, with more requests
/// waiting for the one tag: the driver's drain delivers completions that
/// requeue and dispatch again outside any task. It must neither panic nor
/// hang, and a new executor on the thread works.
#[test]
fn an_executor_dropped_with_requeueing_io_in_flight_at_queue_depth_1() {
    watchdog(60, || {
        for variant in 0..3u32 {
            let m = mem_dev(31 + u64::from(variant), 100);
            let backend: Arc<dyn Backend> = Arc::new(AtMost {
                inner: m.clone(),
                max_bytes: 512,
            });
            let opts = DeviceOptions {
                queue_depth: 1,
                ..Default::default()
            };
            let dev = Device::with_backend(backend, None, opts).unwrap();
            let ex = local();
            ex.run(async {
                let ios = (0..6u64).map(|i| dev.read_alloc_at(i * 8192, 8192));
                let all = futures::future::join_all(ios);
                futures::pin_mut!(all);
                let nap = async {
                    for _ in 0..variant * 3 {
                        plugio_executor::sleep(Duration::from_micros(1)).await;
                    }
                };
                futures::pin_mut!(nap);
                let _ = futures::future::select(all, nap).await;
            });
            drop(ex);
            local().run(async {
                let r = dev
                    .read_alloc_at(0, 8192)
                    .await
                    .expect("read on a new executor");
                assert_eq!(r.len(), 8192);
            });
            drop(dev);
            // The states of both executors retire when a third one does IO.
            let other =
                Device::with_backend(mem_dev(3, 10), None, DeviceOptions::default()).unwrap();
            local().run(async {
                other.read_alloc_at(0, 4096).await.expect("read");
            });
            assert_eq!(
                Arc::strong_count(&m),
                1,
                "variant {variant}: device still held"
            );
        }
    });
}

/// An explicit plug held across awaits (a database batching a commit)
/// must not stall the IO awaited under it; one kept past its executor
/// and dropped inside the next one must do no harm there.
#[test]
fn explicit_plug_held_across_awaits_and_past_its_executor() {
    watchdog(60, || {
        let m = mem_dev(41, 50);
        let dev = Device::with_backend(m, None, DeviceOptions::default()).unwrap();
        let guard = local().run(async {
            let g = dev.plug(64).expect("plug");
            for i in 0..20u64 {
                let mut b = dev.alloc_buf(4096);
                b.as_mut_slice().fill(i as u8);
                dev.write_at(b, i * 4096)
                    .await
                    .0
                    .expect("write under a plug");
                let r = dev
                    .read_alloc_at(i * 4096, 4096)
                    .await
                    .expect("read under a plug");
                assert!(r.as_slice().iter().all(|&x| x == i as u8));
            }
            // Leave IO in the plug, and keep the guard past this executor.
            let mut f = Box::pin(dev.write_at(dev.alloc_buf(4096), 50 * 4096));
            let waker = futures::task::noop_waker();
            let mut cx = std::task::Context::from_waker(&waker);
            assert!(f.as_mut().poll(&mut cx).is_pending());
            drop(f);
            g
        });
        local().run(async {
            for i in 0..20u64 {
                let r = dev.read_alloc_at(i * 4096, 4096).await.expect("read");
                assert!(r.as_slice().iter().all(|&x| x == i as u8));
            }
            drop(guard);
            let r = dev
                .read_alloc_at(0, 4096)
                .await
                .expect("read after the old guard");
            assert!(r.as_slice().iter().all(|&x| x == 0));
            assert_eq!(dev.tags_in_use(), 0);
        });
    });
}

/// A per-op `-EAGAIN` (what io_uring delivers for a direct submission,
/// modelled by the mem device's `Fault::Eagain`) sends the same request
/// again: a merged write, a read, a flush and a NOP each meet one, and
/// every result is what it would have been without the fault.
#[test]
fn a_per_op_eagain_issues_the_request_again_with_the_same_result() {
    watchdog(60, || {
        let m = mem_dev(7, 20);
        let dev = Device::with_backend(m.clone(), None, DeviceOptions::default()).unwrap();
        local().run(async move {
            m.inject(Fault::Eagain { ops: 1 });
            // Two adjacent writes issued in one tick merge into one request,
            // which meets the EAGAIN.
            let (a, b) = (fill(1, 0, 4096), fill(2, 4096, 4096));
            let mut ba = dev.alloc_buf(4096);
            ba.as_mut_slice().copy_from_slice(&a);
            let mut bb = dev.alloc_buf(4096);
            bb.as_mut_slice().copy_from_slice(&b);
            let (ra, rb) = futures::join!(dev.write_at(ba, 0), dev.write_at(bb, 4096));
            assert_eq!(ra.0.expect("first write"), 4096);
            assert_eq!(rb.0.expect("second write"), 4096);
            for _ in 0..3 {
                m.inject(Fault::Eagain { ops: 1 });
            }
            let r = dev.read_alloc_at(0, 8192).await.expect("read after EAGAIN");
            assert!(r.as_slice()[..4096] == a[..] && r.as_slice()[4096..] == b[..]);
            dev.sync_data().await.expect("flush after EAGAIN");
            dev.nop().await.expect("nop after EAGAIN");
            assert_eq!(dev.iostats().requeues, 4, "one requeue per EAGAIN");
            assert_eq!(dev.tags_in_use(), 0);
        });
    });
}

/// A backend that answers `EAGAIN` for good does not make the engine
/// spin: after 64 tries in a row the IO ends with the error, and the
/// device serves IO again once the fault is gone.
#[test]
fn eagain_for_good_ends_the_io_with_the_error() {
    watchdog(60, || {
        let m = mem_dev(8, 5);
        let dev = Device::with_backend(m.clone(), None, DeviceOptions::default()).unwrap();
        local().run(async move {
            m.inject(Fault::Eagain { ops: 1_000 });
            let e = dev
                .read_alloc_at(0, 4096)
                .await
                .expect_err("EAGAIN for good");
            assert_eq!(e.errno(), libc::EAGAIN, "{e}");
            assert_eq!(dev.iostats().requeues, 64);
            m.clear_faults();
            dev.read_alloc_at(0, 4096)
                .await
                .expect("read once the fault is gone");
            assert_eq!(dev.tags_in_use(), 0);
        });
    });
}

/// Exact write ordering: 64 one-block writes issued in one tick, 4 to each
/// of 16 offsets (not adjacent, so none merge), on a device serving 64 at once with a fixed 100 µs
/// latency. Each offset's 4 writes must run one after another (program
/// order), and nothing else need wait: the batch takes 4 latencies of
/// simulated time (the device's virtual clock, which load does not move),
/// not the ~49 it took when a write that overlapped anything waited for
/// every request before it. Each offset ends with its last writer's data,
/// and a read issued after a write in the same tick sees that write.
#[test]
fn overlapping_writes_wait_only_for_what_they_overlap() {
    watchdog(60, || {
        const LAT: Duration = Duration::from_micros(100);
        let m = Arc::new(MemDevice::new(MemConfig {
            capacity_bytes: 1 << 20,
            queue_depth: 64,
            latency: Latency::Fixed(LAT),
            clock: MemClock::Virtual,
            ..Default::default()
        }));
        let opts = DeviceOptions {
            queue_depth: 64,
            ..Default::default()
        };
        let dev = Device::with_backend(m.clone(), None, opts).unwrap();
        local().run(async move {
            let block = |i: usize| vec![i as u8 + 1; 4096];
            let t0 = m.now();
            let writes = (0..64).map(|i| {
                let mut b = dev.alloc_buf(4096);
                b.as_mut_slice().copy_from_slice(&block(i));
                // A block apart: no two writes are adjacent, none merge.
                dev.write_at(b, (i % 16) as u64 * 8192)
            });
            for (r, _) in futures::future::join_all(writes).await {
                assert_eq!(r.expect("write"), 4096);
            }
            let took = m.now() - t0;
            assert!(took >= 4 * LAT, "4 writes per offset in order: {took:?}");
            assert!(
                took <= 6 * LAT,
                "overlapping writes serialized more than their overlaps: {took:?}"
            );
            for off in 0..16usize {
                let r = dev
                    .read_alloc_at(off as u64 * 8192, 4096)
                    .await
                    .expect("read");
                assert!(
                    r.as_slice() == &block(48 + off)[..],
                    "offset {off}: last writer wins"
                );
            }
            // Write then read of the same block in one tick: the read sees it.
            let mut b = dev.alloc_buf(4096);
            b.as_mut_slice().fill(0xab);
            let (w, r) = futures::join!(dev.write_at(b, 8192), dev.read_alloc_at(8192, 4096));
            w.0.expect("write");
            assert!(r.expect("read").as_slice().iter().all(|&x| x == 0xab));
            assert_eq!(dev.tags_in_use(), 0);
        });
    });
}

/// Two handles opened on one file (equal options, and once through a
/// symlink) are one device: a write through the first and an overlapping
/// write through the second, issued in that order in one tick, land in
/// that order in every trial, and both show in either handle's iostats.
#[test]
fn handles_opened_twice_on_one_file_share_one_ordering_domain() {
    watchdog(120, || {
        let dir = common::tmpdir();
        let path = dir.path().join("twice");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let link = dir.path().join("twice-link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        local().run(async move {
            let a = Device::open(&path, DeviceOptions::default()).expect("open a");
            let b = Device::open(&link, DeviceOptions::default()).expect("open b");
            for trial in 0..200u64 {
                let off = (trial % 64) * 8192;
                let mut ba = a.alloc_buf(8192);
                ba.as_mut_slice().fill(1);
                let mut bb = b.alloc_buf(4096);
                bb.as_mut_slice().fill(2);
                // b's write covers the second half of a's.
                let (ra, rb) = futures::join!(a.write_at(ba, off), b.write_at(bb, off + 4096));
                ra.0.expect("write a");
                rb.0.expect("write b");
                let r = a.read_alloc_at(off, 8192).await.expect("read");
                assert!(
                    r.as_slice()[..4096].iter().all(|&x| x == 1),
                    "trial {trial}"
                );
                assert!(
                    r.as_slice()[4096..].iter().all(|&x| x == 2),
                    "trial {trial}: A overtook B"
                );
            }
            assert_eq!(a.iostats().write.ios, b.iostats().write.ios);
            assert!(a.iostats().write.ios >= 400, "{:?}", a.iostats().write);
            drop((a, b));
            // The shared state closed with its last handle; a new open with
            // the first options gets a fresh one.
            let d = Device::open(&path, DeviceOptions::default()).expect("open d");
            d.read_alloc_at(0, 4096).await.expect("read d");
            assert_eq!(d.iostats().write.ios, 0);
        });
    });
}

/// One file has one set of options. A second open with other options
/// while a handle is open (through the path, a symlink or a hard link)
/// used to give a second device state whose writes were not ordered
/// against the first's; it is refused, naming the options that differ,
/// and nothing of the open state changes. Once every handle is gone the
/// file opens with the new options.
#[test]
fn a_second_open_with_other_options_is_refused_while_the_first_is_open() {
    watchdog(60, || {
        use plugio_device::{ErrorKind, InvalidInput};
        let dir = common::tmpdir();
        let path = dir.path().join("options");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let link = dir.path().join("options-link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let hard = dir.path().join("options-hard");
        std::fs::hard_link(&path, &hard).unwrap();
        local().run(async move {
            let a = Device::open(&path, DeviceOptions::default()).expect("open a");
            a.write_at(a.alloc_buf(4096), 0).await.0.expect("write a");
            let other = DeviceOptions {
                queue_depth: 8,
                nomerges: 2,
                ..DeviceOptions::default()
            };
            for p in [&path, &link, &hard] {
                let e = Device::open(p, other.clone()).expect_err("other options while open");
                let ErrorKind::InvalidInput(InvalidInput::AlreadyOpen { detail }) = e.kind() else {
                    panic!("{p:?}: {e:?}");
                };
                assert_eq!(detail, "queue_depth: 256 vs 8, nomerges: 0 vs 2");
                // The text of book/src/troubleshooting.md.
                assert_eq!(
                    e.to_string(),
                    format!(
                        "invalid input: the file is already open in this process with other \
                         options (queue_depth: 256 vs 8, nomerges: 0 vs 2); open it with the \
                         same options (or clone that handle) to share its device state and \
                         write ordering, or drop every handle of it first (path {})",
                        p.display()
                    )
                );
            }
            // The refusals took no handle and changed nothing.
            let b = Device::open(&hard, DeviceOptions::default()).expect("same options");
            assert_eq!(b.iostats().write.ios, 1);
            drop((a, b));
            let c = Device::open(&link, other).expect("other options once closed");
            assert_eq!(c.iostats().write.ios, 0, "a fresh device state");
            c.read_alloc_at(0, 4096).await.expect("read c");
        });
    });
}

/// `overlap_order: false` orders nothing, as the kernel and fio: 32
/// writes of one block, issued in one tick, are all in flight at once
/// (one latency of simulated time), where the default orders them one
/// after another (32 latencies); a flush issued with them does not wait.
#[test]
fn overlap_order_off_orders_nothing() {
    watchdog(60, || {
        const LAT: Duration = Duration::from_micros(100);
        for ordered in [true, false] {
            let m = Arc::new(MemDevice::new(MemConfig {
                capacity_bytes: 1 << 20,
                queue_depth: 64,
                latency: Latency::Fixed(LAT),
                clock: MemClock::Virtual,
                ..Default::default()
            }));
            let opts = DeviceOptions {
                queue_depth: 64,
                overlap_order: ordered,
                ..Default::default()
            };
            let dev = Device::with_backend(m.clone(), None, opts).unwrap();
            local().run(async move {
                let t0 = m.now();
                let writes = (0..32u8).map(|i| {
                    let mut b = dev.alloc_buf(4096);
                    b.as_mut_slice().fill(i);
                    dev.write_at(b, 0)
                });
                let (results, flushed) =
                    futures::join!(futures::future::join_all(writes), dev.sync_data());
                flushed.expect("flush");
                for (r, _) in results {
                    r.expect("write");
                }
                let took = m.now() - t0;
                if ordered {
                    assert!(took >= 32 * LAT, "ordered: {took:?}");
                    let r = dev.read_alloc_at(0, 4096).await.expect("read");
                    assert!(r.as_slice().iter().all(|&x| x == 31), "last writer wins");
                } else {
                    assert!(took <= 2 * LAT, "unordered: all at once: {took:?}");
                }
            });
        }
    });
}
