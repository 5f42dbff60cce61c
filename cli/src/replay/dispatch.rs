//! The replay loop: issues trace IOs through a [`Device`] in trace order,
//! keeping the ordering a real storage stack would, and collects the
//! figures of [`ReplayReport`].
//!
//! Rules (an IO is issued once all hold):
//! - at most `iodepth` IOs in flight;
//! - under `--timing original`, its recorded time has come;
//! - it overlaps no in-flight IO, and no earlier IO still waiting, where
//!   either of the two writes or discards (so reads see the writes before
//!   them and writes land in trace order: what the page cache and the file
//!   system guaranteed when the trace was taken);
//! - a flush, as a barrier (the default), is issued only after every IO
//!   before it has been issued and every write and discard before it has
//!   completed (reads may still be in flight), and nothing after it is
//!   issued until it has completed: writes before a flush are durable when
//!   it completes, as `fdatasync` promises. With `flush_barrier` off, a
//!   flush is queued like any other IO (what fio's iolog replay does):
//!   faster, with no durability promise.
//!
//! With `overlap_order` off the overlap rule is dropped (fio's behaviour:
//! overlapping writes race, nothing can be verified).
//!
//! Either way the engine keeps its own order below the replay
//! (`engine/src/order.rs`), which is exact: a request waits only for the
//! earlier requests of its core it overlaps where either writes, and a
//! flush only for the writes issued before it; nothing else is held back.
//! fio's iolog replay orders nothing (a flush is an `IORING_OP_FSYNC`
//! queued like any IO), so with both options off only overlapping IOs of
//! the trace are sent to the device later than fio would: the report's
//! `depth` figures show how many the engine kept in flight.
//!
//! So IOs leave in trace order except that an IO may pass earlier ones
//! that wait for an overlap, when it conflicts with none of them: the scan
//! looks up to `4 * iodepth` IOs past the first unissued one, and past at
//! most 16 waiting IOs. A database
//! rewriting its WAL page before each `fdatasync` (postgres) would
//! otherwise stall the whole queue behind every rewrite.
//!
//! The IOs of the calling core are futures the loop polls itself (no task
//! and no channel message per IO): a completion wakes the loop, and the
//! IOs it lets go are started in the same poll, so the engine's plug sees
//! them as one batch and merges what is contiguous. With several cores,
//! data IOs go to the core that owns their 1 MiB region (neighbours on one
//! core, so they can merge) as tasks that send their result back; the
//! loop itself, flushes and verification run on the calling core.
//!
//! Invariant: every issued IO is received back before [`replay`] returns,
//! failed or not (its buffer and tag belong to the engine until then).

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use plugio_device::DmaBuf;
use plugio_engine::Device;
use plugio_executor::channel::{self, Receiver, Sender};
use plugio_executor::Handle;

use super::error::ReplayError;
use super::latency;
use super::pattern;
use super::report::{DepthFigures, EngineFigures, OpReport, ReplayReport};
use super::timing::{Schedule, Timing};
use super::trace::{TraceIo, TraceOp};
use super::verify::{self, BlockMap, Unwritten, VerifyStats};

/// Bytes of the region that one core owns when IO is spread over cores.
const CORE_REGION_SHIFT: u32 = 20;

/// Completions between two progress callbacks.
const PROGRESS_EVERY: u64 = 1024;

/// Called with the number of IOs completed so far.
pub type Progress = Arc<dyn Fn(u64) + Send + Sync>;

/// Returns the `io_uring_enter` calls made so far by the replay's cores.
pub type EntersProbe = Arc<dyn Fn() -> u64 + Send + Sync>;

/// How to replay.
#[derive(Clone)]
pub struct ReplayOptions {
    /// When IOs are issued. Default [`Timing::None`].
    pub timing: Timing,
    /// Most IOs in flight (all cores together). Default 32. Must be
    /// 1..=65536.
    pub iodepth: u32,
    /// Cores to spread data IO over: 1 (default) issues everything on the
    /// calling core; more needs a multi-core plugio runtime with at least
    /// that many cores (`plugio::runtime::builder`).
    pub cores: usize,
    /// Check replayed reads as they complete and read every written sector
    /// back at the end. Default false.
    pub verify: bool,
    /// What never-written sectors hold. Default [`Unwritten::Unchecked`].
    pub unwritten: Unwritten,
    /// Flushes are barriers (see the module docs). Default true; false
    /// queues them like other IOs (reads and writes keep their overlap
    /// order either way, so `verify` still holds).
    pub flush_barrier: bool,
    /// Keep overlapping IOs in trace order (see the module docs). Default
    /// true; false issues every IO as soon as the depth (and flush
    /// barriers) allow, as fio does: overlapping writes then race and the
    /// target's contents are undefined, so `verify` needs this on.
    pub overlap_order: bool,
    /// Progress callback (every 1024 completions and at the end).
    pub progress: Option<Progress>,
    /// Reads the ring's enter count, for IOS/call (`None`: reported as
    /// unknown). Read before the first IO and after the last completion.
    pub enters: Option<EntersProbe>,
    /// Asked between IOs, and at least every [`STOP_POLL`] while the
    /// replay waits for an IO's time: once it returns true, no new IO is
    /// issued, those in flight are waited for, and the report says
    /// `interrupted` (`plugio replay` passes "a SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2 or SIGXCPU came").
    /// Default `None`: never stops early.
    pub stop: Option<fn() -> bool>,
}

/// How long a replay with a [`ReplayOptions::stop`] probe sleeps at most
/// before asking it again.
pub const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(100);

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            timing: Timing::None,
            iodepth: 32,
            cores: 1,
            verify: false,
            unwritten: Unwritten::Unchecked,
            flush_barrier: true,
            overlap_order: true,
            progress: None,
            enters: None,
            stop: None,
        }
    }
}

impl std::fmt::Debug for ReplayOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayOptions")
            .field("timing", &self.timing)
            .field("iodepth", &self.iodepth)
            .field("cores", &self.cores)
            .field("verify", &self.verify)
            .field("unwritten", &self.unwritten)
            .field("flush_barrier", &self.flush_barrier)
            .field("overlap_order", &self.overlap_order)
            .finish_non_exhaustive()
    }
}

/// Replays `ios` through `dev` from a task of a plugio runtime, then (with
/// `verify`) reads every written sector back.
///
/// Callers check that the IOs fit the device first
/// ([`Trace::check_fits`](super::trace::Trace::check_fits)); an IO the
/// engine refuses still ends the replay with a clear error.
///
/// # Errors
/// Bad options ([`ReplayError::Usage`]); an IO failed
/// ([`ReplayError::Engine`] naming its trace line; IOs in flight are
/// waited for first); verification found mismatches
/// ([`ReplayError::Verify`]).
pub async fn replay(
    dev: &Device,
    ios: &[TraceIo],
    opts: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    if opts.iodepth == 0 || opts.iodepth > 65536 {
        return Err(ReplayError::usage(format!(
            "--iodepth {} is out of range: use 1..=65536",
            opts.iodepth
        )));
    }
    if opts.verify && !opts.overlap_order {
        return Err(ReplayError::usage(
            "--verify needs overlapping IOs kept in order: drop --overlap-order 0",
        ));
    }
    let handle = spread(opts.cores)?;
    let before = dev.iostats();
    let enters_before = opts.enters.as_ref().map(|p| p());
    let (tx, mut rx) = channel::bounded(opts.iodepth as usize + 1);
    let mut d = Dispatcher::new(dev, ios, opts, handle, tx);
    d.run(&mut rx).await;
    let elapsed = d.schedule_start.elapsed();
    if let Some(e) = d.failed.take() {
        return Err(e);
    }
    let mut engine = EngineFigures::between(&before, &dev.iostats());
    if let (Some(p), Some(b)) = (&opts.enters, enters_before) {
        engine.set_enters(p().saturating_sub(b));
    }
    let mut verify_stats = d.verify.take();
    if d.stopped {
        // Stopped early: the read-back of every written sector is skipped
        // (the replayed reads were still checked).
    } else if let (Some(map), Some(stats)) = (&d.map, verify_stats.as_mut()) {
        verify::verify_all(dev, map, ios, opts.iodepth as usize, stats).await?;
    }
    if let Some(p) = &opts.progress {
        p(d.completed);
    }
    let verify = verify_stats.map(VerifyStats::into_result).transpose()?;
    Ok(d.report(engine, elapsed.as_secs_f64(), verify))
}

/// The runtime handle to spread IO with (`None`: all on this core).
fn spread(cores: usize) -> Result<Option<Handle>, ReplayError> {
    if cores == 0 {
        return Err(ReplayError::usage("--cpus 0: use at least 1"));
    }
    if cores == 1 {
        return Ok(None);
    }
    match Handle::current() {
        Some(h) if h.cores() >= cores => Ok(Some(h)),
        Some(h) => Err(ReplayError::usage(format!(
            "{cores} cores asked for but the runtime has {}",
            h.cores()
        ))),
        None => Err(ReplayError::usage(format!(
            "{cores} cores asked for but the replay is not running on a multi-core plugio runtime"
        ))),
    }
}

/// An IO in flight.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    seq: usize,
    op: TraceOp,
    start: u64,
    end: u64,
    /// Runs on another core (its result comes through the channel).
    remote: bool,
}

/// What an IO task sends back.
struct Done {
    seq: usize,
    result: Result<usize, plugio_device::Error>,
    /// The read's buffer, when it is to be verified.
    buf: Option<DmaBuf>,
    latency_ns: u64,
}

/// `waited` bit: the IO waited for an overlapping earlier IO.
const WAITED_OVERLAP: u8 = 1;
/// `waited` bit: the IO waited at a flush (a flush for the writes before
/// it or for its turn).
const WAITED_FLUSH: u8 = 2;

/// IOs after the first unissued one that may be issued ahead of it, per
/// unit of queue depth.
const LOOKAHEAD_PER_DEPTH: usize = 4;

/// Waiting IOs one scan looks past before it stops (bounds the cost of a
/// scan when the queue is congested).
const MAX_WAITING_SCANNED: usize = 16;

/// The byte range of trace IO `seq`.
fn span(seq: usize, io: &TraceIo) -> InFlight {
    InFlight {
        seq,
        op: io.op,
        start: io.offset_bytes,
        end: io.end_bytes(),
        remote: false,
    }
}

/// True when `io` overlaps one of `others` and either of the two modifies
/// data. Flushes (empty ranges) overlap nothing.
fn conflicts(others: &[InFlight], io: &TraceIo) -> bool {
    let (start, end) = (io.offset_bytes, io.end_bytes());
    others
        .iter()
        .any(|f| f.start < end && start < f.end && (f.op.modifies() || io.op.modifies()))
}

/// Queue depth, sampled each time the run loop waits for a completion
/// (after issuing everything the rules allowed).
#[derive(Default)]
struct DepthAcc {
    samples: u64,
    max: usize,
    sum: u64,
    sum_tags: u64,
}

impl DepthAcc {
    fn sample(&mut self, in_flight: usize, tags: u32) {
        self.samples += 1;
        self.max = self.max.max(in_flight);
        self.sum += in_flight as u64;
        self.sum_tags += u64::from(tags);
    }

    fn figures(&self) -> DepthFigures {
        let mean = |x: u64| {
            if self.samples == 0 {
                0.0
            } else {
                x as f64 / self.samples as f64
            }
        };
        DepthFigures {
            waits: self.samples,
            max_in_flight: self.max as u64,
            mean_in_flight: mean(self.sum),
            mean_tags_in_use: mean(self.sum_tags),
        }
    }
}

/// Per-op accumulators.
struct OpAcc {
    ios: u64,
    bytes: u64,
    latency: Histogram<u64>,
}

struct Dispatcher<'a> {
    dev: &'a Device,
    ios: &'a [TraceIo],
    iodepth: usize,
    cores: usize,
    handle: Option<Handle>,
    here: usize,
    tx: Sender<Done>,
    timing: Timing,
    schedule: Schedule,
    schedule_start: Instant,
    in_flight: Vec<InFlight>,
    /// IOs of `in_flight` running on other cores.
    remote_in_flight: usize,
    /// IOs issued on this core that the run loop has yet to start.
    to_start: Vec<usize>,
    /// Queue depth samples.
    depth: DepthAcc,
    writes_in_flight: usize,
    flush_in_flight: bool,
    flush_barrier: bool,
    overlap_order: bool,
    map: Option<BlockMap>,
    verify: Option<VerifyStats>,
    acc: Vec<OpAcc>,
    /// Which IOs have been issued (those before `next` all have).
    issued: Vec<bool>,
    /// Why each IO waited (`WAITED_*` bits), so each wait counts once.
    waited: Vec<u8>,
    /// How far past the first unissued IO the scan looks.
    lookahead: usize,
    overlap_waits: u64,
    flush_waits: u64,
    completed: u64,
    failed: Option<ReplayError>,
    progress: Option<Progress>,
    /// See [`ReplayOptions::stop`].
    stop: Option<fn() -> bool>,
    /// The stop probe said stop: nothing more is issued.
    stopped: bool,
}

impl<'a> Dispatcher<'a> {
    fn new(
        dev: &'a Device,
        ios: &'a [TraceIo],
        opts: &ReplayOptions,
        handle: Option<Handle>,
        tx: Sender<Done>,
    ) -> Self {
        let schedule = Schedule::new(opts.timing, ios);
        Dispatcher {
            dev,
            ios,
            iodepth: opts.iodepth as usize,
            cores: opts.cores,
            handle,
            here: plugio_executor::core_id().unwrap_or(0),
            tx,
            timing: opts.timing,
            // One clock for the schedule and the report: no IO is due
            // before `schedule_start`, so under original timing the
            // elapsed time is at least the trace's span.
            schedule_start: schedule.start(),
            schedule,
            in_flight: Vec::with_capacity(opts.iodepth as usize),
            remote_in_flight: 0,
            to_start: Vec::with_capacity(opts.iodepth as usize),
            depth: DepthAcc::default(),
            writes_in_flight: 0,
            flush_in_flight: false,
            flush_barrier: opts.flush_barrier,
            overlap_order: opts.overlap_order,
            map: opts.verify.then(|| BlockMap::new(opts.unwritten)),
            verify: opts.verify.then(VerifyStats::default),
            acc: TraceOp::ALL
                .iter()
                .map(|_| OpAcc {
                    ios: 0,
                    bytes: 0,
                    latency: latency::new_histogram(),
                })
                .collect(),
            issued: vec![false; ios.len()],
            waited: vec![0; ios.len()],
            lookahead: (opts.iodepth as usize).saturating_mul(LOOKAHEAD_PER_DEPTH),
            overlap_waits: 0,
            flush_waits: 0,
            completed: 0,
            failed: None,
            progress: opts.progress.clone(),
            stop: opts.stop,
            stopped: false,
        }
    }

    /// Issues and completes IOs until every issued IO is back and either
    /// the trace is done or an IO failed.
    ///
    /// The IOs of this core are futures polled by this task (in `local`):
    /// an IO's completion wakes the loop directly and the IOs it lets go
    /// are plugged in the same poll, with no task spawned and no channel
    /// message per IO. Only IOs sent to other cores go through `rx`.
    async fn run(&mut self, rx: &mut Receiver<Done>) {
        let dev = self.dev;
        let ios = self.ios;
        let keep_reads = self.map.is_some();
        let mut local = FuturesUnordered::new();
        let mut next = 0;
        loop {
            let mut due = None;
            if !self.stopped && self.stop.is_some_and(|stop| stop()) {
                self.stopped = true;
            }
            if self.failed.is_none() && !self.stopped {
                (next, due) = self.issue_ready(next);
                // With a stop probe, never sleep long without asking it.
                if self.stop.is_some() {
                    due = due.map(|at| at.min(Instant::now() + STOP_POLL));
                }
                for seq in self.to_start.drain(..) {
                    local.push(run_io(dev, seq, ios[seq], keep_reads));
                }
            }
            if self.in_flight.is_empty() {
                match due {
                    Some(at) if self.failed.is_none() && !self.stopped => {
                        plugio_executor::sleep_until(at).await;
                        continue;
                    }
                    _ => break,
                }
            }
            self.depth.sample(self.in_flight.len(), dev.tags_in_use());
            let remote = self.remote_in_flight > 0;
            let mut sleep = pin!(due.map(plugio_executor::sleep_until));
            let first = poll_fn(|cx| {
                if let Poll::Ready(d) = poll_done(&mut local, rx, remote, cx) {
                    return Poll::Ready(Some(d));
                }
                match sleep.as_mut().as_pin_mut().map(|s| s.poll(cx)) {
                    Some(Poll::Ready(())) => Poll::Ready(None),
                    _ => Poll::Pending,
                }
            })
            .await;
            // `None`: the next IO's time has come.
            let Some(done) = first else { continue };
            self.complete(done);
            // Everything else that is back already, before issuing more.
            loop {
                let remote = self.remote_in_flight > 0;
                let more = poll_fn(|cx| match poll_done(&mut local, rx, remote, cx) {
                    Poll::Ready(d) => Poll::Ready(Some(d)),
                    Poll::Pending => Poll::Ready(None),
                })
                .await;
                match more {
                    Some(d) => self.complete(d),
                    None => break,
                }
            }
        }
    }

    /// Issues every IO of the look-ahead window (from `next`, the first IO
    /// not issued yet) that the rules allow; returns the new `next` and,
    /// when the scan stopped at an IO whose time has not come, that time.
    fn issue_ready(&mut self, mut next: usize) -> (usize, Option<Instant>) {
        let mut now = Instant::now();
        // Ranges of earlier IOs that are still waiting: a later IO that
        // overlaps one (where either modifies) must not pass it.
        let mut waiting: Vec<InFlight> = Vec::new();
        let window_end = self.ios.len().min(next.saturating_add(self.lookahead));
        let mut j = next;
        let mut due_stop = None;
        while j < window_end && self.in_flight.len() < self.iodepth && !self.flush_in_flight {
            if self.issued[j] {
                j += 1;
                continue;
            }
            let io = self.ios[j];
            if let Some(at) = self.schedule.due(&io) {
                if at > now {
                    now = Instant::now();
                    if at > now {
                        due_stop = Some(at);
                        break;
                    }
                }
            }
            if io.op == TraceOp::Flush {
                // A barrier keeps its place: everything before it is
                // issued and every write before it has completed. A queued
                // flush goes when the depth allows.
                if self.flush_barrier && (j != next || self.writes_in_flight > 0) {
                    self.count_wait(j, WAITED_FLUSH);
                    break;
                }
            } else if self.overlap_order
                && (conflicts(&self.in_flight, &io) || conflicts(&waiting, &io))
            {
                self.count_wait(j, WAITED_OVERLAP);
                if waiting.len() + 1 >= MAX_WAITING_SCANNED {
                    break;
                }
                waiting.push(span(j, &io));
                j += 1;
                continue;
            }
            self.schedule.issued(&io, now);
            self.issue(j);
            j += 1;
            while next < self.ios.len() && self.issued[next] {
                next += 1;
            }
        }
        if self.flush_in_flight {
            // The IOs after an in-flight barrier wait for it.
            if let Some(k) = (j..window_end).find(|&k| !self.issued[k]) {
                self.count_wait(k, WAITED_FLUSH);
            }
        }
        (next, due_stop)
    }

    /// Counts IO `seq` as having waited for `why`, once per reason.
    fn count_wait(&mut self, seq: usize, why: u8) {
        if self.waited[seq] & why == 0 {
            self.waited[seq] |= why;
            match why {
                WAITED_OVERLAP => self.overlap_waits += 1,
                _ => self.flush_waits += 1,
            }
        }
    }

    /// Issues IO `seq`: on this core it joins `to_start` (the run loop
    /// makes it a future of its own), on another core it is spawned there.
    fn issue(&mut self, seq: usize) {
        let io = self.ios[seq];
        self.issued[seq] = true;
        if let Some(map) = &mut self.map {
            map.record(seq as u64, &io);
        }
        match io.op {
            TraceOp::Flush => self.flush_in_flight = self.flush_barrier,
            op if op.modifies() => self.writes_in_flight += 1,
            _ => {}
        }
        let core = match (&self.handle, io.op) {
            (Some(_), op) if op != TraceOp::Flush => {
                ((io.offset_bytes >> CORE_REGION_SHIFT) % self.cores as u64) as usize
            }
            _ => self.here,
        };
        match &self.handle {
            Some(h) if core != self.here => {
                self.in_flight.push(InFlight {
                    remote: true,
                    ..span(seq, &io)
                });
                self.remote_in_flight += 1;
                let task = run_io_remote(
                    self.dev.clone(),
                    seq,
                    io,
                    self.map.is_some(),
                    self.tx.clone(),
                );
                drop(h.spawn_on(core, task));
            }
            _ => {
                self.in_flight.push(span(seq, &io));
                self.to_start.push(seq);
            }
        }
    }

    fn complete(&mut self, done: Done) {
        let Some(pos) = self.in_flight.iter().position(|f| f.seq == done.seq) else {
            return;
        };
        let f = self.in_flight.swap_remove(pos);
        if f.remote {
            self.remote_in_flight -= 1;
        }
        match f.op {
            TraceOp::Flush => self.flush_in_flight = false,
            op if op.modifies() => self.writes_in_flight -= 1,
            _ => {}
        }
        let io = self.ios[done.seq];
        self.completed += 1;
        if let Some(p) = &self.progress {
            if self.completed % PROGRESS_EVERY == 0 {
                p(self.completed);
            }
        }
        let n = match done.result {
            Ok(n) => n as u64,
            Err(e) => {
                let context = match e.io() {
                    // The error names its IO already.
                    Some(_) => format!("trace line {}", io.line),
                    None => format!(
                        "trace line {}: {} of {} bytes at offset {}",
                        io.line,
                        io.op.name(),
                        io.len_bytes,
                        io.offset_bytes
                    ),
                };
                self.failed.get_or_insert(ReplayError::engine(context, e));
                return;
            }
        };
        if io.op != TraceOp::Flush && n != io.len_bytes {
            // The target was checked to hold the trace before the first
            // IO: a short transfer now is the run failing (exit code 1),
            // not bad input.
            self.failed.get_or_insert(ReplayError::io(
                format!(
                    "trace line {}: {} of {} bytes at offset {}",
                    io.line,
                    io.op.name(),
                    io.len_bytes,
                    io.offset_bytes
                ),
                if io.op == TraceOp::Write {
                    // The engine resumes short writes: only a device that
                    // filled up part way stops one short.
                    std::io::Error::new(
                        std::io::ErrorKind::StorageFull,
                        format!("wrote {n} bytes: the target ran out of space"),
                    )
                } else {
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!(
                            "moved {n} bytes: the target ended early (truncated during the \
                             replay?)"
                        ),
                    )
                },
            ));
            return;
        }
        let acc = &mut self.acc[io.op.index()];
        acc.ios += 1;
        acc.bytes += n;
        latency::record(&mut acc.latency, done.latency_ns);
        if let (Some(buf), Some(map), Some(stats)) = (&done.buf, &self.map, self.verify.as_mut()) {
            let what = format!("read at trace line {}", io.line);
            let checked = map.check(buf.as_slice(), io.offset_bytes, self.ios, &what, stats);
            stats.read_sectors_checked += checked;
        }
    }

    fn report(
        &self,
        engine: EngineFigures,
        elapsed_s: f64,
        verify: Option<VerifyStats>,
    ) -> ReplayReport {
        let ops: Vec<OpReport> = TraceOp::ALL
            .iter()
            .map(|&op| {
                let a = &self.acc[op.index()];
                OpReport {
                    op: op.name(),
                    ios: a.ios,
                    bytes: a.bytes,
                    latency: latency::summary(&a.latency),
                }
            })
            .collect();
        let ios: u64 = ops.iter().map(|o| o.ios).sum();
        let bytes = self.acc[TraceOp::Read.index()].bytes + self.acc[TraceOp::Write.index()].bytes;
        let per_s = |x: f64| if elapsed_s > 0.0 { x / elapsed_s } else { 0.0 };
        ReplayReport {
            timing: self.timing,
            iodepth: self.iodepth as u32,
            cores: self.cores,
            flush_barrier: self.flush_barrier,
            overlap_order: self.overlap_order,
            ios,
            bytes,
            elapsed_s,
            iops: per_s(ios as f64),
            bandwidth_bytes_per_s: per_s(bytes as f64),
            ops,
            engine,
            lag: self.schedule.lag(),
            overlap_waits: self.overlap_waits,
            flush_waits: self.flush_waits,
            depth: self.depth.figures(),
            verify,
            interrupted: self.stopped,
        }
    }
}

/// The first completion of a local IO, or (when IOs are in flight on
/// other cores) of a remote one.
fn poll_done<F: Future<Output = Done>>(
    local: &mut FuturesUnordered<F>,
    rx: &mut Receiver<Done>,
    remote: bool,
    cx: &mut Context<'_>,
) -> Poll<Done> {
    if let Poll::Ready(Some(d)) = local.poll_next_unpin(cx) {
        return Poll::Ready(d);
    }
    if remote {
        // The dispatcher holds a sender, so the channel never closes. The
        // receiver keeps the waker (`poll_recv`): a `recv()` future polled
        // here would be dropped at once, and its registration with it, so a
        // remote completion would wake nobody.
        if let Poll::Ready(Some(d)) = rx.poll_recv(cx) {
            return Poll::Ready(d);
        }
    }
    Poll::Pending
}

/// One IO: issues it through `dev` and returns its result.
async fn run_io(dev: &Device, seq: usize, io: TraceIo, keep_read: bool) -> Done {
    let len = io.len_bytes as usize;
    let t0 = Instant::now();
    let (result, buf) = match io.op {
        TraceOp::Read => {
            let buf = dev.alloc_buf(len);
            let (r, buf) = dev.read_at(buf, io.offset_bytes).await;
            (r, keep_read.then_some(buf))
        }
        TraceOp::Write => {
            let mut buf = dev.alloc_buf(len);
            pattern::fill(buf.as_mut_slice(), io.offset_bytes, seq as u64);
            (dev.write_at(buf, io.offset_bytes).await.0, None)
        }
        TraceOp::Flush => (dev.sync_data().await.map(|()| 0), None),
        TraceOp::Discard => (
            dev.discard(io.offset_bytes, io.len_bytes)
                .await
                .map(|()| len),
            None,
        ),
    };
    let latency_ns = t0.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
    Done {
        seq,
        result,
        buf,
        latency_ns,
    }
}

/// One IO run on another core; sends its result back to the dispatcher.
async fn run_io_remote(dev: Device, seq: usize, io: TraceIo, keep_read: bool, tx: Sender<Done>) {
    let done = run_io(&dev, seq, io, keep_read).await;
    // A closed channel means the replay is gone; nothing is left to tell.
    let _ = tx.send(done).await;
}
