//! Running one seed: a database-like workload per core through one
//! `Device` on the mem device, faults injected and cleared as it goes,
//! the power cut at a random point while IO is in flight, then the image
//! that survived read back.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use plugio_device::backend::mem::{Fault, FaultOn, MemDevice};
use plugio_device::IoFlags;
use plugio_engine::Device;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::config::{Mutation, SimConfig, BLOCK_BYTES};
use crate::history::{fill_block, History, Kind, Outcome, Rec};

/// State the cores share during a run.
struct Shared {
    /// The logical clock.
    clock: AtomicU64,
    /// IOs issued so far, all cores together (for the cut).
    issued: AtomicU32,
    /// The next IO id (0 is never used).
    next_id: AtomicU32,
    cut_start: AtomicU64,
    /// Set once the power was cut: no core issues a new batch after it.
    cut_done: AtomicBool,
    faults_injected: AtomicU64,
}

impl Shared {
    fn stamp(&self) -> u64 {
        // SeqCst: the stamps of all cores form one order that agrees with
        // real time (an IO stamped done on one core before another core
        // stamps an issue did take effect first).
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    fn cut(&self, mem: &MemDevice) {
        self.cut_start.store(self.stamp(), Ordering::SeqCst);
        mem.power_cut();
        self.cut_done.store(true, Ordering::SeqCst);
    }
}

type Log = Arc<Mutex<Vec<Rec>>>;
type Io = Pin<Box<dyn Future<Output = ()> + Send>>;

fn lock(log: &Log) -> std::sync::MutexGuard<'_, Vec<Rec>> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Everything one core's workload needs.
#[derive(Clone)]
struct Ctx {
    core: u8,
    cfg: Arc<SimConfig>,
    dev: Device,
    mem: Arc<MemDevice>,
    shared: Arc<Shared>,
    log: Log,
}

/// Runs seed `cfg` on `rt` (whose core count is `cfg.cores`) and returns
/// what happened. `None` when the run did not end within `hang_s`.
pub fn run(rt: &plugio_executor::Runtime, cfg: &SimConfig, hang_s: u64) -> Option<History> {
    let mem = Arc::new(MemDevice::new(cfg.mem.clone()));
    let dev = Device::with_backend(mem.clone(), None, cfg.opts.clone()).expect("device options");
    let shared = Arc::new(Shared {
        clock: AtomicU64::new(1),
        issued: AtomicU32::new(0),
        next_id: AtomicU32::new(1),
        cut_start: AtomicU64::new(u64::MAX),
        cut_done: AtomicBool::new(false),
        faults_injected: AtomicU64::new(0),
    });
    let cfg = Arc::new(cfg.clone());
    let logs: Vec<Log> = (0..cfg.cores).map(|_| Log::default()).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    let handles: Vec<_> = (0..cfg.cores)
        .map(|core| {
            let ctx = Ctx {
                core: core as u8,
                cfg: cfg.clone(),
                dev: dev.clone(),
                mem: mem.clone(),
                shared: shared.clone(),
                log: logs[core].clone(),
            };
            rt.spawn_on(core, core_workload(ctx))
        })
        .collect();
    let (dev2, mem2, shared2) = (dev.clone(), mem.clone(), shared.clone());
    std::thread::spawn(move || {
        for h in handles {
            if let Err(e) = futures::executor::block_on(h) {
                let _ = tx.send(Err(format!("a core's workload failed: {e:?}")));
                return;
            }
        }
        let _ = tx.send(Ok(()));
    });
    match rx.recv_timeout(Duration::from_secs(hang_s)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("seed {}: {e}", cfg.seed),
        Err(_) => return None,
    }
    let (image, durable, tags_left) = rt.block_on(async move {
        // The cut happens during the run unless every core stopped first.
        if !shared2.cut_done.load(Ordering::SeqCst) {
            shared2.cut(&mem2);
        }
        mem2.clear_faults();
        // A second cut: what is checked is what survives one.
        mem2.power_cut();
        let cap = capacity_bytes(&dev2);
        let durable = mem2.durable_bytes(0..cap);
        let mut image = Vec::with_capacity(cap as usize);
        let mut at = 0;
        while at < cap {
            let n = (cap - at).min(64 * 1024);
            let b = dev2
                .read_alloc_at(at, n as usize)
                .await
                .expect("read back after the cut");
            image.extend_from_slice(b.as_slice());
            at += n;
        }
        (image, durable, dev2.tags_in_use())
    });
    let mut recs = Vec::new();
    for log in &logs {
        recs.append(&mut lock(log));
    }
    Some(History {
        recs,
        cut_start: shared.cut_start.load(Ordering::SeqCst),
        image,
        durable,
        faults_injected: shared.faults_injected.load(Ordering::SeqCst),
        ordered: cfg.opts.overlap_order || cfg.mutation == Some(Mutation::Unordered),
        tags_left,
    })
}

fn capacity_bytes(dev: &Device) -> u64 {
    dev.geometry()
        .capacity_bytes
        .expect("the mem device has a capacity")
}

/// One core's workload: batches of IO issued together (as a database's
/// group of page writes, reads and commits), some futures dropped
/// mid-flight, faults changed between batches; the core that reaches the
/// cut point cuts the power while its batch is in flight.
async fn core_workload(ctx: Ctx) {
    let mut rng = SmallRng::seed_from_u64(ctx.cfg.seed.wrapping_mul(31) + u64::from(ctx.core) + 1);
    let mut left = ctx.cfg.ops_per_core;
    while left > 0 && !ctx.shared.cut_done.load(Ordering::SeqCst) {
        let n = rng.gen_range(1..=12).min(left);
        left -= n;
        let mut batch: Vec<Io> = Vec::with_capacity(n as usize + 1);
        for _ in 0..n {
            if rng.gen_ratio(1, 30) {
                change_faults(&ctx, &mut rng);
            }
            let op_no = ctx.shared.issued.fetch_add(1, Ordering::SeqCst);
            if op_no == ctx.cfg.cut_at_op {
                batch.push(Box::pin(cut_after(ctx.clone(), rng.gen_range(0..4))));
            }
            batch.push(io(&ctx, &mut rng));
        }
        futures::future::join_all(batch).await;
        ticks(rng.gen_range(0..3)).await;
    }
    settle(&ctx.dev).await;
}

/// Waits until no tag is held on three checks in a row, a tick apart: the
/// IO of this core's dropped futures has then ended (a bio waiting for a
/// tag or for an overlapping request implies one in flight).
async fn settle(dev: &Device) {
    let mut quiet = 0;
    while quiet < 3 {
        quiet = if dev.tags_in_use() == 0 { quiet + 1 } else { 0 };
        ticks(1).await;
    }
}

/// `k` parks: each delivers one group of simulated completions.
async fn ticks(k: u32) {
    for _ in 0..k {
        plugio_executor::sleep(Duration::from_micros(1)).await;
    }
}

async fn cut_after(ctx: Ctx, k: u32) {
    ticks(k).await;
    ctx.shared.cut(&ctx.mem);
}

fn change_faults(ctx: &Ctx, rng: &mut SmallRng) {
    let cap = ctx.cfg.capacity_blocks;
    let fault = match rng.gen_range(0..7) {
        0 => {
            ctx.mem.clear_faults();
            return;
        }
        1 | 2 => {
            let start = pick_lba(&ctx.cfg, rng);
            let on = [FaultOn::Read, FaultOn::Write, FaultOn::Both][rng.gen_range(0..3)];
            Fault::Eio {
                lbas: start..(start + rng.gen_range(1..8)).min(cap),
                on,
            }
        }
        3 => Fault::ShortRead {
            lba: pick_lba(&ctx.cfg, rng),
        },
        4 => Fault::Partial {
            bytes: rng.gen_range(0..4096),
            on: [FaultOn::Read, FaultOn::Write, FaultOn::Both][rng.gen_range(0..3)],
            ops: rng.gen_range(1..4),
        },
        5 => Fault::EnospcAfter {
            bytes: ctx.mem.written_bytes() + rng.gen_range(0..64 * 1024),
        },
        _ => Fault::Eagain {
            ops: rng.gen_range(1..6),
        },
    };
    ctx.mem.inject(fault);
    ctx.shared.faults_injected.fetch_add(1, Ordering::SeqCst);
}

/// A block: in the hot zone half the time (so IO overlaps), else anywhere.
fn pick_lba(cfg: &SimConfig, rng: &mut SmallRng) -> u64 {
    if rng.gen_bool(0.5) {
        rng.gen_range(0..cfg.hot_blocks.min(cfg.capacity_blocks))
    } else {
        rng.gen_range(0..cfg.capacity_blocks)
    }
}

/// One IO of a random kind, range and fate (dropped after a few ticks now
/// and then).
fn io(ctx: &Ctx, rng: &mut SmallRng) -> Io {
    let kind = match rng.gen_range(0..100) {
        0..=39 => Kind::Write,
        40..=47 => Kind::FuaWrite,
        48..=77 => Kind::Read,
        78..=87 => Kind::Flush,
        88..=93 => Kind::Zeroes,
        _ => Kind::Discard,
    };
    let (lba, blocks) = if kind == Kind::Flush {
        (0, 0)
    } else {
        let lba = pick_lba(&ctx.cfg, rng);
        let max = if rng.gen_ratio(1, 8) { 64 } else { 8 };
        let blocks = rng.gen_range(1..=max).min(ctx.cfg.capacity_blocks - lba);
        (lba, blocks)
    };
    let fut = run_io(ctx.clone(), kind, lba, blocks);
    if rng.gen_ratio(1, 25) {
        let k = rng.gen_range(0..4);
        Box::pin(async move {
            let fut = std::pin::pin!(fut);
            let nap = std::pin::pin!(ticks(k));
            futures::future::select(fut, nap).await;
        })
    } else {
        Box::pin(fut)
    }
}

/// Issues one IO and records it: the record exists from the first poll
/// (as `Dropped`) and gets its outcome when the IO completes.
async fn run_io(ctx: Ctx, kind: Kind, lba: u64, blocks: u64) {
    let id = ctx.shared.next_id.fetch_add(1, Ordering::SeqCst);
    let off = lba * BLOCK_BYTES;
    let len = blocks * BLOCK_BYTES;
    let index = {
        let mut log = lock(&ctx.log);
        log.push(Rec {
            id,
            core: ctx.core,
            kind,
            lba,
            blocks,
            issue: ctx.shared.stamp(),
            ack: None,
            outcome: Outcome::Dropped,
            data: Vec::new(),
        });
        log.len() - 1
    };
    let dev = &ctx.dev;
    let (result, data) = match kind {
        Kind::Write | Kind::FuaWrite => {
            let mut b = dev.alloc_buf(len as usize);
            for (i, chunk) in b
                .as_mut_slice()
                .chunks_exact_mut(BLOCK_BYTES as usize)
                .enumerate()
            {
                fill_block(id, lba + i as u64, chunk);
            }
            let flags = if kind == Kind::FuaWrite {
                IoFlags::FUA
            } else {
                IoFlags::NONE
            };
            (dev.write_at_with(b, off, flags).await.0, Vec::new())
        }
        Kind::Read => {
            let (r, b) = dev.read_at(dev.alloc_buf(len as usize), off).await;
            let data = if r.is_ok() {
                b.as_slice().to_vec()
            } else {
                Vec::new()
            };
            (r, data)
        }
        Kind::Flush => (dev.sync_data().await.map(|()| 0), Vec::new()),
        Kind::Zeroes => (dev.write_zeroes(off, len).await.map(|()| 0), Vec::new()),
        Kind::Discard => (dev.discard(off, len).await.map(|()| 0), Vec::new()),
    };
    let ack = ctx.shared.stamp();
    let mut log = lock(&ctx.log);
    let rec = &mut log[index];
    rec.ack = Some(ack);
    rec.data = data;
    rec.outcome = match result {
        Ok(n) => Outcome::Ok(n),
        Err(e) => Outcome::Err(e.kind().clone()),
    };
}
