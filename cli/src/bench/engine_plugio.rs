//! The plugio engines: `iodepth` tasks per core, each looping
//! `read_into`/`write_at` on one preallocated buffer (`--engine plugio`) or
//! `Device::nop()` (`--engine nop`), so what is measured is the runtime's
//! path: executor, plug, tags, dispatch, io_uring, completion.
//!
//! Invariants: every task reuses its buffer for its whole life (no
//! allocation per IO); a core's counters are written only by that core's
//! thread (tasks and its [`StatsDriver`]); the device is opened before the
//! tasks start and closed after every task has ended.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use plugio_device::{BatchWaitTimer, DeviceDriver, DmaBuf, RingConfig};
use plugio_engine::{Device, DeviceOptions};
use plugio_executor::{Driver, JoinHandle, Placement, ShutdownMode, Unpark};
use rand::RngCore;

use super::error::BenchError;
use super::options::{Ablation, IdleWait, Job};
use super::output::EngineOutput;
use super::stats::{self, Counters, Dir, IoBudget, IoPattern, Latencies, Sampler};
use super::target::Target;

const NAME: &str = "plugio";

/// Alignment of the buffers the bench allocates itself (`--fixedbufs 0`).
const PAGE_BYTES: usize = 4096;

/// A core's [`DeviceDriver`] that copies the ring's call counters into the
/// core's [`WorkerCounters`](super::stats::WorkerCounters) after each park,
/// so the reporter can print IOS/call.
///
/// With `--idle-wait futex` a blocking park with nothing in flight on the
/// ring waits in a futex (`std::thread::park_timeout`) instead of in
/// `io_uring_enter`, and its unparker wakes both. Why: valgrind runs one
/// thread at a time under a lock that it drops only around syscalls it
/// knows may block; its 3.19 wrapper of `io_uring_enter` is not marked so,
/// so a core idling in `io_uring_enter(min_complete = 1)` keeps the lock
/// and the thread that would wake it (spawning the job's tasks, or asking
/// for shutdown) never runs. A futex wait releases the lock. (`--idle-wait
/// auto`, the default, resolves to futex under valgrind.)
struct StatsDriver {
    inner: DeviceDriver,
    counters: Arc<Counters>,
    core: usize,
    /// `Some` with `--idle-wait futex`: the unparker that also wakes the
    /// futex wait.
    futex_unpark: Option<Arc<FutexUnpark>>,
}

/// The longest a futex idle wait lasts before it polls the ring anyway (a
/// safety net for a wake source that does not go through the unparker).
const FUTEX_IDLE_MAX: Duration = Duration::from_millis(100);

/// Wakes a core parked by [`StatsDriver`] in either wait.
struct FutexUnpark {
    ring: Arc<dyn Unpark>,
    thread: std::thread::Thread,
}

impl Unpark for FutexUnpark {
    fn unpark(&self) {
        // The ring first: its eventfd read is reaped by the poll that
        // follows the futex wait, or ends a wait in the ring.
        self.ring.unpark();
        self.thread.unpark();
    }
}

impl StatsDriver {
    /// Wraps `inner`, made on the core's thread (`idle` decides how an idle
    /// park waits).
    fn new(inner: DeviceDriver, counters: Arc<Counters>, core: usize, idle: IdleWait) -> Self {
        let futex_unpark = (idle == IdleWait::Futex).then(|| {
            Arc::new(FutexUnpark {
                ring: inner.unparker(),
                thread: std::thread::current(),
            })
        });
        StatsDriver {
            inner,
            counters,
            core,
            futex_unpark,
        }
    }

    fn park_inner(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        let idle_in_futex = self.futex_unpark.is_some()
            && timeout != Some(Duration::ZERO)
            && self.inner.in_flight() == 0;
        if !idle_in_futex {
            return self.inner.park(timeout);
        }
        // Nothing in flight: only the unparker or the timeout can end this
        // wait. The token semantics of `park_timeout` keep an unpark that
        // came before this point.
        std::thread::park_timeout(timeout.map_or(FUTEX_IDLE_MAX, |t| t.min(FUTEX_IDLE_MAX)));
        self.inner.park(Some(Duration::ZERO))
    }
}

impl Driver for StatsDriver {
    fn park(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        let r = self.park_inner(timeout);
        if let Some(s) = self.inner.ring_stats() {
            let w = self.counters.worker(self.core);
            // The ring does not count SQEs: the reporter takes the engine's
            // request count (one SQE per request) from its iostats.
            w.set_calls(s.enters, 0, s.cqes);
        }
        r
    }

    fn unparker(&self) -> Arc<dyn Unpark> {
        match &self.futex_unpark {
            Some(u) => u.clone(),
            None => self.inner.unparker(),
        }
    }

    fn attach(&self, core_uid: u64) {
        self.inner.attach(core_uid);
    }
}

/// The device options `job` asks for, with its ablations applied; notes
/// name what could not be applied.
pub fn device_options(job: &Job, notes: &mut Vec<String>) -> DeviceOptions {
    let mut opts = DeviceOptions {
        queue_depth: (u64::from(job.iodepth) * job.cores as u64).clamp(1, 65536) as u32,
        direct: job.direct,
        read_only: !job.writes(),
        ..DeviceOptions::default()
    };
    for a in &job.ablate {
        match a {
            Ablation::TagBatch => opts.tag_batch = false,
            Ablation::TagBatchRetry => opts.tag_batch_retry = false,
            Ablation::Plug => opts.plug_max_count = 1,
            Ablation::Merge => opts.nomerges = 2,
            Ablation::CachedClock => opts.cached_clock = false,
            Ablation::Iostats => opts.iostats = false,
            Ablation::BioCache => opts.bio_cache = false,
            Ablation::BufCache => opts.buffer_cache = false,
            Ablation::FastLane => opts.fast_lane = false,
            // A ring setting (`ring_config`).
            Ablation::UntimedWait => {}
        }
    }
    if let Some(n) = job.nomerges {
        if job.ablate.contains(&Ablation::Merge) && n != 2 {
            notes.push(format!(
                "--nomerges {n} overridden by --ablate merge (nomerges 2)"
            ));
        } else {
            opts.nomerges = n;
        }
    }
    opts
}

/// Most bytes of registered buffers a core asks for (the memlock limit of
/// an unprivileged user is often 8 MiB).
const ARENA_MAX_BYTES: usize = 4 << 20;

/// With `--fixedbufs 1`, a registered arena of one `bs`-sized chunk per IO
/// task of the core (as fio registers one buffer per `io_u`), capped at
/// [`ARENA_MAX_BYTES`]; tasks beyond the cap use cached buffers.
fn arena_config(job: &Job) -> Option<plugio_device::buf::ArenaConfig> {
    if !job.fixed_bufs || job.nop {
        return None;
    }
    let chunk_bytes = (job.bs_bytes as usize).next_multiple_of(4096).max(4096);
    let nr_chunks = (job.iodepth as usize)
        .min(ARENA_MAX_BYTES / chunk_bytes)
        .max(1);
    Some(plugio_device::buf::ArenaConfig {
        chunk_bytes,
        nr_chunks: nr_chunks as u32,
    })
}

/// The note of a job whose IO tasks do not all fit the registered arena
/// ([`ARENA_MAX_BYTES`] per core): those beyond it use plain buffers, so
/// only part of the IO is `READ_FIXED`/`WRITE_FIXED`.
fn arena_note(job: &Job, arena: plugio_device::buf::ArenaConfig) -> Option<String> {
    let fixed = arena.nr_chunks;
    (fixed < job.iodepth).then(|| {
        format!(
            "--fixedbufs 1: the registered arena takes at most {fixed} of the {} buffers of \
             each core ({} MiB per core, or one buffer where one is larger, within the usual \
             memlock limit): the other IO tasks use plain buffers, so at most about {}% of \
             the IO uses fixed buffers (none where the registration is refused: see its \
             warning); a smaller --bs or --iodepth fits them all",
            job.iodepth,
            ARENA_MAX_BYTES >> 20,
            u64::from(fixed) * 100 / u64::from(job.iodepth)
        )
    })
}

/// The ring each core gets.
fn ring_config(job: &Job) -> RingConfig {
    RingConfig {
        sq_entries: job.iodepth.clamp(32, 4096).next_power_of_two(),
        registered_files: if job.register_files { 64 } else { 0 },
        batch_wait_timer: if job.ablate.contains(&Ablation::UntimedWait) {
            BatchWaitTimer::Always
        } else {
            BatchWaitTimer::WhenLate
        },
        ..RingConfig::default()
    }
}

/// Runs the plugio (or plugio NOP) engine until `counters` says stop.
///
/// # Errors
/// Runtime or device setup failed, or an IO failed.
pub fn run(
    job: &Job,
    target: &Target,
    counters: &Arc<Counters>,
) -> Result<EngineOutput, BenchError> {
    let mut notes = Vec::new();
    let opts = device_options(job, &mut notes);
    let ring = ring_config(job);
    let arena = arena_config(job);
    notes.extend(arena.and_then(|a| arena_note(job, a)));
    let driver_counters = counters.clone();
    let idle_wait = job.idle_wait;
    // Set by a core whose driver came up without io_uring (refused by the
    // kernel, a seccomp filter or `io_uring_disabled`): the sync pool
    // served its IO, and the report says so.
    let fell_back = Arc::new(AtomicBool::new(false));
    let core_fell_back = fell_back.clone();
    let rt = plugio_executor::Builder::new()
        .cores(job.cores)
        .placement(Placement::Pinned)
        .thread_name("plugio-bench")
        .driver(move |core| {
            if let Some(arena) = arena {
                // Before the core's first buffer: the arena the driver
                // registers holds one chunk per IO task.
                plugio_device::buf::configure_arena(arena);
            }
            let inner = DeviceDriver::new(&ring)?;
            if inner.ring_info().is_none() {
                // Relaxed: read after the runtime's shutdown joined the
                // core threads, which orders it.
                core_fell_back.store(true, Ordering::Relaxed);
            }
            Ok(Box::new(StatsDriver::new(
                inner,
                driver_counters.clone(),
                core,
                idle_wait,
            )) as Box<dyn Driver>)
        })
        .build()
        .map_err(|e| BenchError::engine(NAME, format!("starting the runtime: {e}")))?;
    let dev = Device::open(&target.path, opts).map_err(|e| {
        BenchError::engine(
            NAME,
            format!("opening {}: {e}", plugio_cli::shown::path(&target.path)),
        )
    })?;
    let probe_dev = dev.clone();
    counters.set_stats_probe(Box::new(move || probe_dev.iostats()));
    // The cores and this thread meet at the start line once every task's
    // buffer is ready: setup is outside the measured window.
    let start_line = Arc::new(Barrier::new(job.cores + 1));
    let handles: Vec<_> = (0..job.cores)
        .map(|core| {
            let cj = CoreJob {
                dev: dev.clone(),
                job: job.clone(),
                size_bytes: target.size_bytes,
                counters: counters.clone(),
                core,
                start_line: StartLine(start_line.clone()),
            };
            rt.spawn_on(core, cj.run())
        })
        .collect();
    start_line.wait();
    counters.mark_started();
    let mut latency = Latencies::default();
    let mut first_err = None;
    for h in handles {
        match futures::executor::block_on(h) {
            Ok(Ok(hist)) => latency.merge(&hist),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(format!("core task ended: {e}"));
            }
        }
    }
    let iostats = dev.iostats();
    // The probe holds a device handle: drop it with ours before shutdown.
    counters.set_stats_probe(Box::new(move || iostats));
    drop(dev);
    if let Err(e) = rt.shutdown(ShutdownMode::Wait) {
        first_err.get_or_insert(format!("runtime shutdown: {e}"));
    }
    if let Some(e) = first_err {
        return Err(BenchError::engine(NAME, e));
    }
    // Relaxed: see the store; the shutdown above joined the cores.
    if fell_back.load(Ordering::Relaxed) {
        notes.push(plugio_cli::FALLBACK_NOTE.to_owned());
    }
    Ok(EngineOutput {
        latency,
        notes,
        iostats: Some(iostats),
    })
}

/// What one core runs: spawns the IO tasks, waits for them, returns the
/// core's latency histogram.
struct CoreJob {
    dev: Device,
    job: Job,
    size_bytes: u64,
    counters: Arc<Counters>,
    core: usize,
    /// Passed once the core's buffers are ready.
    start_line: StartLine,
}

/// Holds a core until every core and the bench thread are ready to start
/// IO. Passed on drop, so a core that fails or panics while it prepares
/// does not leave the others waiting.
struct StartLine(Arc<Barrier>);

impl Drop for StartLine {
    fn drop(&mut self) {
        // Blocks this core's thread: it runs nothing else before IO
        // starts (its only task is the core job that drops this).
        self.0.wait();
    }
}

impl CoreJob {
    async fn run(self) -> Result<Latencies, String> {
        // Every task's buffer, allocated and filled before IO starts; a
        // SIGINT or SIGTERM meanwhile (a stop) ends the preparation, and
        // only the tasks with a buffer are spawned.
        let mut bufs = Vec::with_capacity(self.job.iodepth as usize);
        while bufs.len() < self.job.iodepth as usize && !self.counters.stopped() {
            bufs.push((!self.job.nop).then(|| task_buf(&self.dev, &self.job)));
        }
        drop(self.start_line);
        // Marked here too (the first mark wins): the bench thread, which
        // passed the line with the cores, may get to its mark after a
        // short job's IO has ended.
        self.counters.mark_started();
        let cursor = Arc::new(AtomicU64::new(IoPattern::start_block(
            &self.job,
            self.size_bytes,
            self.core,
        )));
        // The core's tasks all run on this core's thread.
        let budget = Arc::new(IoBudget::new(self.job.number_ios));
        let handles: Vec<JoinHandle<Result<Option<DmaBuf>, String>>> = (0..self.job.iodepth)
            .zip(bufs)
            .map(|(i, buf)| {
                let seed = (self.core as u64) << 32 | u64::from(i);
                let task = IoTask {
                    dev: self.dev.clone(),
                    budget: budget.clone(),
                    pattern: IoPattern::new(&self.job, self.size_bytes, seed, cursor.clone()),
                    sampler: Sampler::new(self.job.clat_sample),
                    counters: self.counters.clone(),
                    core: self.core,
                    nop: self.job.nop,
                    buf,
                    buf_per_io: self.job.buf_per_io,
                    bs_bytes: self.job.bs_bytes as usize,
                };
                // Each loop is a task of its own, not one nested in the
                // other's future: nested, the NOP loop's future held a
                // second copy of the task's fields inside the read loop's
                // (656 bytes a task), lines a core touches per IO.
                if task.nop {
                    plugio_executor::spawn_local(task.run_nop())
                } else {
                    plugio_executor::spawn_local(task.run())
                }
            })
            .collect();
        let mut first_err = None;
        // The buffers handed back, freed once the core's last IO is
        // counted: 128 buffers of 16 MiB take a while to unmap.
        let mut kept = Vec::with_capacity(handles.len());
        for h in handles {
            match h.await {
                Ok(Ok(buf)) => kept.extend(buf),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => {
                    first_err.get_or_insert(format!("IO task ended: {e}"));
                }
            }
        }
        self.counters.mark_ended();
        drop(kept);
        match first_err {
            Some(e) => Err(e),
            None => Ok(stats::take_latency()),
        }
    }
}

/// A task's buffer, filled with random bytes: from the registered arena
/// (`Device::alloc_buf`) with `--fixedbufs 1`, else from the heap.
fn task_buf(dev: &Device, job: &Job) -> DmaBuf {
    let bs_bytes = job.bs_bytes as usize;
    let mut buf = if job.fixed_bufs {
        dev.alloc_buf(bs_bytes)
    } else {
        // Page-aligned even where the device allows less: Linux 6.18's
        // zram advertises dma_alignment 511 but an O_DIRECT read into a
        // buffer that is not page-aligned writes the whole pages it
        // touches, outside the buffer (heap corruption).
        let align = dev.geometry().mem_align_bytes() as usize;
        DmaBuf::heap(bs_bytes, align.max(PAGE_BYTES))
    };
    rand::thread_rng().fill_bytes(buf.as_mut_slice());
    buf
}

/// One of the `iodepth` tasks of a core.
struct IoTask {
    dev: Device,
    /// The core's `--number_ios` budget (taken on this core's thread only).
    budget: Arc<IoBudget>,
    pattern: IoPattern,
    sampler: Sampler,
    counters: Arc<Counters>,
    core: usize,
    nop: bool,
    /// The task's buffer (none for NOPs), filled with random bytes.
    buf: Option<DmaBuf>,
    buf_per_io: bool,
    bs_bytes: usize,
}

impl IoTask {
    /// Runs the task's IOs; hands its buffer back.
    async fn run(mut self) -> Result<Option<DmaBuf>, String> {
        let Some(mut buf) = self.buf.take() else {
            return Err("an IO task was spawned without its buffer".to_owned());
        };
        let worker = self.counters.worker(self.core);
        while !self.counters.stopped() && self.budget.take_local() {
            // The core's tasks share the cursor and all run on this
            // thread (spawned locally).
            let (dir, offset) = self.pattern.next_io_local();
            let t0 = self.sampler.start();
            if self.buf_per_io {
                // A fresh buffer per IO, as `Device::read_at` takes one:
                // from the core's buffer cache unless it is ablated.
                buf = self.dev.alloc_buf(self.bs_bytes);
            }
            buf.set_len(self.bs_bytes);
            let (res, b) = match dir {
                Dir::Read => self.dev.read_at(buf, offset).await,
                Dir::Write => self.dev.write_at(buf, offset).await,
            };
            buf = b;
            let n = res.map_err(|e| match e.io() {
                // The error names its IO already.
                Some(_) => e.to_string(),
                None => format!("{dir:?} of {} bytes at {offset}: {e}", self.bs_bytes),
            })?;
            worker.add_io(dir, n as u64);
            if let Some(t0) = t0 {
                stats::record_latency(dir, t0.elapsed());
            }
        }
        Ok(Some(buf))
    }

    async fn run_nop(mut self) -> Result<Option<DmaBuf>, String> {
        let worker = self.counters.worker(self.core);
        while !self.counters.stopped() && self.budget.take_local() {
            let t0 = self.sampler.start();
            self.dev.nop().await.map_err(|e| format!("nop: {e}"))?;
            worker.add_io(Dir::Read, 0);
            if let Some(t0) = t0 {
                stats::record_latency(Dir::Read, t0.elapsed());
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::{arena_config, arena_note};
    use crate::bench::options::test_job as job;

    #[test]
    fn a_job_whose_buffers_outgrow_the_arena_is_noted() {
        let big = job(&["--bs", "1m"]);
        let note = arena_note(&big, arena_config(&big).expect("fixedbufs on")).expect("noted");
        assert!(
            note.contains("at most 4 of the 128 buffers") && note.contains("about 3%"),
            "{note}"
        );
        let small = job(&["--bs", "4k"]);
        assert_eq!(arena_note(&small, arena_config(&small).expect("on")), None);
    }
}
