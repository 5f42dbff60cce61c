//! Short and failed writes from the kernel itself, against a program-order
//! model: the process's file size limit (`RLIMIT_FSIZE`, with `SIGXFSZ`
//! ignored) cuts a write that crosses it short at the limit and fails one
//! at or past it with `EFBIG`. A write on the fast lane (a lane slot, see
//! the engine's `order` module) that comes back short or failed becomes
//! its request in that slot and takes the general path: the rest issued
//! again, the stall rule, the error. Random streams of reads, writes (FUA
//! or not), writes dropped mid-IO, flushes and NOPs over several ticks,
//! with the fast lane on and off, O_DIRECT on and off, and random
//! `nomerges`, queue depth, plug size, SQ size and request limit. Checked:
//! each read's data, each write's result, the file's size after each round
//! and its bytes at the end, that every flush completes after every write
//! issued before it, and that every tag comes back.
//!
//! One test in this binary: the limit is the whole process's. Seeds:
//! `SEEDS` (default 24), `FIRST` (default 1); `FL` 1 or 0 runs the fast
//! lane on or off only. A break-it pass ran 900 seeds of it (`SEEDS=300`,
//! then `FIRST=1001 SEEDS=600`).

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use common::{env_u64, fast_lane_settings, file_of, pattern, settle, tmpdir, watchdog, Rng};
use futures::StreamExt;
use plugio_device::RingConfig;
use plugio_engine::{Device, DeviceOptions, IoFlags};

/// The file size limit: 4 MiB.
const LIMIT: u64 = 4 << 20;
/// Where the streams' IO starts: 48 KiB below the limit.
const BASE: u64 = LIMIT - 48 * 1024;

/// Writes the models cut short at the limit, and refused past it.
static SHORT: AtomicU64 = AtomicU64::new(0);
static EFBIG: AtomicU64 = AtomicU64::new(0);
/// Requests issued again with the fast lane on (device iostats).
static REQUEUES: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone)]
enum Op {
    Read {
        off: u64,
        len: usize,
    },
    Write {
        off: u64,
        len: usize,
        v: u8,
        fua: bool,
    },
    /// A write whose future is dropped after `after` yields, if it did
    /// not finish at its first poll.
    DroppedWrite {
        off: u64,
        len: usize,
        v: u8,
        after: usize,
    },
    Flush,
    Nop,
}

/// What the model says an op returns.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    Data(Vec<u8>),
    Written(usize),
    /// Crosses the limit: `n` bytes written (the ones below it), or an
    /// error.
    ShortOrFailed(usize),
    Failed,
    Any,
}

/// What an op returned.
#[derive(Debug, Clone)]
enum Got {
    Data(Vec<u8>),
    Written(usize),
    Done,
    /// The error's message (printed with a failed check).
    Failed(#[allow(dead_code)] String),
}

#[test]
fn short_and_failed_writes_match_the_model() {
    // SAFETY: plain libc calls with valid arguments; this binary's only
    // test runs them before any IO.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let r = libc::rlimit {
            rlim_cur: LIMIT,
            rlim_max: libc::RLIM_INFINITY,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &r), 0, "setrlimit");
    }
    let fls = fast_lane_settings();
    let first = env_u64("FIRST", 1);
    for seed in first..first + env_u64("SEEDS", 24) {
        for &fl in fls {
            watchdog(120, move || stream(seed, fl));
        }
    }
    let (short, efbig) = (SHORT.load(Relaxed), EFBIG.load(Relaxed));
    println!(
        "writes crossing the limit {short}, past it {efbig}, requeues (fast lane on) {}",
        REQUEUES.load(Relaxed)
    );
    assert!(
        short > 0 && efbig > 0,
        "the streams never reached the limit"
    );
}

fn stream(seed: u64, fast_lane: bool) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let direct = rng.below(2) == 0;
    let o = DeviceOptions {
        fast_lane,
        direct,
        nomerges: [0u8, 1, 2, 2][rng.below(4) as usize],
        queue_depth: [1u32, 2, 4, 64][rng.below(4) as usize],
        plug_max_count: [1usize, 4, 32, 256][rng.below(4) as usize],
        max_request_bytes: [None, Some(8192)][rng.below(2) as usize],
        ..DeviceOptions::default()
    };
    let ring = RingConfig {
        sq_entries: [8u32, 256][rng.below(2) as usize],
        ..RingConfig::default()
    };
    let desc = format!(
        "seed {seed} fast_lane {fast_lane} sq {} {o:?}",
        ring.sq_entries
    );
    let dir = tmpdir();
    // BASE + 20 or 40 KiB (+ 1,000 bytes, unaligned, when buffered).
    let above = if rng.below(2) == 0 { 40 } else { 20 } * 1024;
    let size0 = (BASE + above) as usize + if direct { 0 } else { 1000 };
    let data = pattern(size0, seed as u8);
    let path = file_of(dir.path(), "f", &data);
    let mut model = data;
    let p = path.clone();
    plugio_engine::runtime::local(ring)
        .unwrap()
        .run(async move {
            let dev = Device::open(&p, o).expect("open");
            for round in 0..10 {
                let n = 2 + rng.below(30) as usize;
                let mut ops: Vec<(usize, Op)> = (0..n)
                    .map(|_| (rng.below(3) as usize, gen_op(&mut rng)))
                    .collect();
                let want = apply(&mut ops, &mut model);
                run_round(&dev, &ops, &want, &desc, round).await;
                // Dropped writes may still be in flight, or in the plug (one
                // dropped in the round's last tick holds no tag yet).
                settle(&dev, &desc).await;
                let size = std::fs::metadata(&p).unwrap().len() as usize;
                assert_eq!(
                    size,
                    model.len(),
                    "{desc}: round {round}: file size\nops: {ops:?}"
                );
            }
            settle(&dev, &desc).await;
            assert_eq!(dev.tags_in_use(), 0, "{desc}: tags left in use");
            if fast_lane {
                REQUEUES.fetch_add(dev.iostats().requeues, Relaxed);
            }
            let got = std::fs::read(&p).unwrap();
            if got != model {
                let at = got.iter().zip(model.iter()).position(|(a, b)| a != b);
                panic!(
                    "{desc}: final contents: {} bytes, want {}; first difference at {at:?}",
                    got.len(),
                    model.len()
                );
            }
        });
}

fn gen_op(rng: &mut Rng) -> Op {
    let len = 512 * (1 + rng.below(24) as usize);
    let off = BASE + 512 * rng.below(120);
    match rng.below(16) {
        0..=5 => Op::Write {
            off,
            len,
            v: (rng.next() as u8) | 1,
            fua: rng.below(8) == 0,
        },
        6 => Op::DroppedWrite {
            off,
            len,
            v: (rng.next() as u8) | 1,
            after: rng.below(3) as usize,
        },
        7 => Op::Flush,
        8 => Op::Nop,
        _ => Op::Read { off, len },
    }
}

/// Applies `ops` to the model in program order (by delay, then index) and
/// returns what each returns. A write that would start past the size the
/// file had when the round began becomes a NOP: a later write that
/// overlaps no earlier read may still leave a hole under that read (only
/// overlapping IO is ordered), which the model does not follow.
fn apply(ops: &mut [(usize, Op)], m: &mut Vec<u8>) -> Vec<Want> {
    let mut order: Vec<usize> = (0..ops.len()).collect();
    order.sort_by_key(|&i| (ops[i].0, i));
    let mut want = vec![Want::Any; ops.len()];
    let start_size = m.len() as u64;
    for i in order {
        let size = m.len() as u64;
        match ops[i].1.clone() {
            Op::Read { off, len } => {
                let s = off.min(size) as usize;
                let e = (off + len as u64).min(size).max(s as u64) as usize;
                want[i] = Want::Data(m[s..e].to_vec());
            }
            Op::Write { off, len, v, .. } | Op::DroppedWrite { off, len, v, .. } => {
                let dropped = matches!(ops[i].1, Op::DroppedWrite { .. });
                if off > size || off > start_size {
                    ops[i].1 = Op::Nop;
                    continue;
                }
                let end = off + len as u64;
                if off >= LIMIT {
                    EFBIG.fetch_add(1, Relaxed);
                    want[i] = if dropped { Want::Any } else { Want::Failed };
                    continue;
                }
                let kept = end.min(LIMIT);
                if kept > size {
                    m.resize(kept as usize, 0);
                }
                m[off as usize..kept as usize].fill(v);
                want[i] = if dropped {
                    Want::Any
                } else if end > LIMIT {
                    SHORT.fetch_add(1, Relaxed);
                    Want::ShortOrFailed((LIMIT - off) as usize)
                } else {
                    Want::Written(len)
                };
            }
            Op::Flush | Op::Nop => {}
        }
    }
    want
}

/// Runs one round (each op after its delay in yields) and checks each
/// result, and that every flush completed after every write issued
/// before it.
async fn run_round(dev: &Device, ops: &[(usize, Op)], want: &[Want], desc: &str, round: usize) {
    let done: Rc<RefCell<Vec<usize>>> = Rc::default();
    let mut futs = futures::stream::FuturesUnordered::new();
    for (i, (delay, op)) in ops.iter().enumerate() {
        let (delay, op, done) = (*delay, op.clone(), done.clone());
        futs.push(async move {
            for _ in 0..delay {
                plugio_executor::yield_now().await;
            }
            let r = run_op(dev, op).await;
            done.borrow_mut().push(i);
            (i, r)
        });
    }
    let mut got = vec![None; ops.len()];
    while let Some((i, r)) = futs.next().await {
        got[i] = Some(r);
    }
    for (i, w) in want.iter().enumerate() {
        let g = got[i].take().expect("every op ends");
        let ok = match (w, &g) {
            (Want::Any, _) => true,
            (Want::Data(d), Got::Data(x)) => d == x,
            (Want::Written(n), Got::Written(x)) => n == x,
            (Want::ShortOrFailed(n), Got::Written(x)) => n == x,
            (Want::ShortOrFailed(_) | Want::Failed, Got::Failed(_)) => true,
            _ => false,
        };
        assert!(
            ok,
            "{desc}: round {round} op {i} {:?}: got {g:?}, want {w:?}\nops: {ops:?}",
            ops[i]
        );
    }
    let done = done.borrow();
    let pos = |i: usize| done.iter().position(|&d| d == i).expect("done");
    for (f, (fd, fop)) in ops.iter().enumerate() {
        if !matches!(fop, Op::Flush) {
            continue;
        }
        for (w, (wd, wop)) in ops.iter().enumerate() {
            let before = (*wd, w) < (*fd, f);
            assert!(
                !(matches!(wop, Op::Write { .. }) && before && pos(w) > pos(f)),
                "{desc}: round {round}: flush {f} completed before write {w}, issued before it\nops: {ops:?}\ndone: {done:?}"
            );
        }
    }
}

async fn run_op(dev: &Device, op: Op) -> Got {
    let failed = |e: plugio_engine::Error| Got::Failed(e.to_string());
    match op {
        Op::Read { off, len } => match dev.read_alloc_at(off, len).await {
            Ok(b) => Got::Data(b.as_slice().to_vec()),
            Err(e) => failed(e),
        },
        Op::Write { off, len, v, fua } => {
            let mut b = dev.alloc_buf(len);
            b.as_mut_slice().fill(v);
            let flags = if fua { IoFlags::FUA } else { IoFlags::NONE };
            match dev.write_at_with(b, off, flags).await.0 {
                Ok(n) => Got::Written(n),
                Err(e) => failed(e),
            }
        }
        Op::DroppedWrite { off, len, v, after } => {
            let mut b = dev.alloc_buf(len);
            b.as_mut_slice().fill(v);
            let mut f = Box::pin(dev.write_at(b, off));
            if futures::poll!(f.as_mut()).is_ready() {
                return Got::Done;
            }
            for _ in 0..after {
                plugio_executor::yield_now().await;
            }
            drop(f);
            Got::Done
        }
        Op::Flush => dev.sync_data().await.map_or_else(failed, |_| Got::Done),
        Op::Nop => dev.nop().await.map_or_else(failed, |_| Got::Done),
    }
}
