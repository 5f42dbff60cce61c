//! Live counters the engines update and the reporter reads, the IO pattern
//! generator, and per-thread latency recording.
//!
//! Invariants:
//! - Each [`WorkerCounters`] has exactly one writing thread (a core, or one
//!   psync thread), so updates are a relaxed load and store, not an atomic
//!   read-modify-write; readers may see a value up to one update old.
//! - The stop flag only ever goes from false to true.
//! - Offsets are multiples of `bs_bytes` below `size_bytes`, so every IO is
//!   within the target and (with O_DIRECT) aligned.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::options::Job;

/// Highest latency the histograms track: 100 s, in ns (larger values are
/// clamped).
const MAX_LATENCY_NS: u64 = 100_000_000_000;

/// A snapshot of one worker's (or all workers') counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// IOs completed.
    pub ios: u64,
    /// Bytes moved by completed IOs.
    pub bytes: u64,
    /// Of `ios`, the writes (the rest are reads, or NOPs).
    pub write_ios: u64,
    /// Of `bytes`, those written.
    pub write_bytes: u64,
    /// `io_uring_enter` calls (0 where the engine does not say).
    pub enters: u64,
    /// SQEs submitted (0 where the engine does not say).
    pub submitted: u64,
    /// CQEs reaped (0 where the engine does not say).
    pub reaped: u64,
}

impl Snapshot {
    /// `self - earlier`, field by field (saturating).
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            ios: self.ios.saturating_sub(earlier.ios),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            write_ios: self.write_ios.saturating_sub(earlier.write_ios),
            write_bytes: self.write_bytes.saturating_sub(earlier.write_bytes),
            enters: self.enters.saturating_sub(earlier.enters),
            submitted: self.submitted.saturating_sub(earlier.submitted),
            reaped: self.reaped.saturating_sub(earlier.reaped),
        }
    }

    fn add(&mut self, other: &Snapshot) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.write_ios += other.write_ios;
        self.write_bytes += other.write_bytes;
        self.enters += other.enters;
        self.submitted += other.submitted;
        self.reaped += other.reaped;
    }
}

/// One worker's counters (single writer, see the module invariants).
#[derive(Debug, Default)]
pub struct WorkerCounters {
    ios: AtomicU64,
    bytes: AtomicU64,
    write_ios: AtomicU64,
    write_bytes: AtomicU64,
    enters: AtomicU64,
    submitted: AtomicU64,
    reaped: AtomicU64,
}

impl WorkerCounters {
    /// Counts one completed IO of `bytes` in direction `dir` (a NOP counts
    /// as a read of 0 bytes). Call only from the worker's own thread.
    #[inline]
    pub fn add_io(&self, dir: Dir, bytes: u64) {
        // Relaxed (all): single writer (this thread); the reporter only
        // reads figures for display, nothing else is published through them.
        let bump =
            |c: &AtomicU64, by: u64| c.store(c.load(Ordering::Relaxed) + by, Ordering::Relaxed);
        bump(&self.ios, 1);
        bump(&self.bytes, bytes);
        if dir == Dir::Write {
            bump(&self.write_ios, 1);
            bump(&self.write_bytes, bytes);
        }
    }

    /// Sets the ring-call figures (running totals). Call only from the
    /// worker's own thread.
    #[inline]
    pub fn set_calls(&self, enters: u64, submitted: u64, reaped: u64) {
        // Relaxed (all three): display figures with a single writer; the
        // reporter tolerates seeing them one update apart.
        self.enters.store(enters, Ordering::Relaxed);
        self.submitted.store(submitted, Ordering::Relaxed);
        self.reaped.store(reaped, Ordering::Relaxed);
    }

    /// Reads the counters (any thread).
    pub fn snapshot(&self) -> Snapshot {
        // Relaxed (all): pairs with the relaxed stores above; a display
        // figure, no ordering with other memory is needed.
        Snapshot {
            ios: self.ios.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            write_ios: self.write_ios.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            enters: self.enters.load(Ordering::Relaxed),
            submitted: self.submitted.load(Ordering::Relaxed),
            reaped: self.reaped.load(Ordering::Relaxed),
        }
    }
}

/// The plugio engine's iostats (running totals: merges, plug flushes,
/// requests, tag batches), read by the reporter each second.
pub type StatsProbe = Box<dyn Fn() -> plugio_engine::IoStats + Send + Sync>;

/// The counters of one run: one [`WorkerCounters`] per worker, the stop
/// flag, the start time and the plugio engine's iostats probe.
pub struct Counters {
    workers: Vec<CachePadded<WorkerCounters>>,
    stop: AtomicBool,
    started: Mutex<Option<Mark>>,
    ended: Mutex<Option<Mark>>,
    stats_probe: Mutex<Option<StatsProbe>>,
}

/// What was measured when IO started or ended: the bounds of the
/// measured window and of the run's CPU time and allocation count, so the
/// engine's setup (rings, buffers filled with random bytes) and teardown
/// (freeing them) are in none of the figures.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    /// When.
    pub at: Instant,
    /// The process's CPU time then.
    pub cpu: CpuTimes,
    /// The process's allocations then ([`super::alloc_count::allocations`]).
    pub allocations: u64,
}

impl Mark {
    fn now() -> Mark {
        Mark {
            cpu: cpu_times(),
            allocations: super::alloc_count::allocations(),
            at: Instant::now(),
        }
    }
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters")
            .field("workers", &self.workers.len())
            .field("total", &self.total())
            .finish_non_exhaustive()
    }
}

impl Counters {
    /// Counters for `workers` workers (at least 1).
    pub fn new(workers: usize) -> Arc<Counters> {
        Arc::new(Counters {
            workers: (0..workers.max(1))
                .map(|_| CachePadded::default())
                .collect(),
            stop: AtomicBool::new(false),
            started: Mutex::new(None),
            ended: Mutex::new(None),
            stats_probe: Mutex::new(None),
        })
    }

    /// Worker `index`'s counters (indices wrap around).
    #[inline]
    pub fn worker(&self, index: usize) -> &WorkerCounters {
        &self.workers[index % self.workers.len()]
    }

    /// The sum over all workers.
    pub fn total(&self) -> Snapshot {
        let mut sum = Snapshot::default();
        self.workers.iter().for_each(|w| sum.add(&w.snapshot()));
        sum
    }

    /// True once the run should end; workers check it before each IO.
    #[inline]
    pub fn stopped(&self) -> bool {
        // Relaxed: workers only need to see the flag eventually; no data
        // is published with it (results travel through join handles).
        self.stop.load(Ordering::Relaxed)
    }

    /// Tells the workers to stop issuing IO.
    pub fn request_stop(&self) {
        // Relaxed: pairs with the relaxed load in `stopped`.
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Records that the engine is set up and IO starts now, with the CPU
    /// time and allocation baselines (first call wins).
    pub fn mark_started(&self) {
        let mut s = self.started.lock().unwrap_or_else(PoisonError::into_inner);
        s.get_or_insert_with(Mark::now);
    }

    /// Records that a worker's last IO was counted (the latest call wins:
    /// the last worker to end closes the window). Every engine calls it
    /// once per core, task or thread, before its buffers and rings are
    /// torn down; an engine that never called it would be measured until
    /// it returns.
    pub fn mark_ended(&self) {
        *self.ended.lock().unwrap_or_else(PoisonError::into_inner) = Some(Mark::now());
    }

    /// When and at which counts the last worker ended, if one marked it.
    pub fn ended(&self) -> Option<Mark> {
        *self.ended.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When the engine started IO, if it has.
    pub fn started_at(&self) -> Option<Instant> {
        self.started().map(|s| s.at)
    }

    /// When and from which baselines the engine started IO, if it has.
    pub fn started(&self) -> Option<Mark> {
        *self.started.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Installs the engine's iostats probe (plugio engines only).
    pub fn set_stats_probe(&self, probe: StatsProbe) {
        *self
            .stats_probe
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(probe);
    }

    /// The engine's iostats (running totals), when it has them.
    pub fn iostats(&self) -> Option<plugio_engine::IoStats> {
        self.stats_probe
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|p| p())
    }
}

/// How many IOs a job may still issue (`--number_ios`), shared by the
/// job's tasks or threads.
///
/// Invariant: [`IoBudget::take_local`] is a relaxed load and store, not a
/// read-modify-write, so it costs no locked instruction per IO; it is only
/// correct when every caller runs on one thread (one core's tasks, one
/// raw-loop worker). Engines whose takers run on several threads use
/// [`IoBudget::take_shared`].
#[derive(Debug)]
pub struct IoBudget {
    /// `None`: unlimited (only `runtime` ends the job).
    limited: bool,
    left: AtomicU64,
}

impl IoBudget {
    /// A budget of `ios` IOs (`None`: unlimited).
    pub fn new(ios: Option<u64>) -> IoBudget {
        IoBudget {
            limited: ios.is_some(),
            left: AtomicU64::new(ios.unwrap_or(u64::MAX)),
        }
    }

    /// Takes one IO; false when the budget is spent. Call only from the
    /// one thread that all takers of this budget run on.
    #[inline]
    pub fn take_local(&self) -> bool {
        if !self.limited {
            return true;
        }
        // Relaxed: single thread (see the type's invariant); there is no
        // await or other taker between the load and the store.
        let left = self.left.load(Ordering::Relaxed);
        if left == 0 {
            return false;
        }
        // Relaxed: as above.
        self.left.store(left - 1, Ordering::Relaxed);
        true
    }

    /// Takes one IO from any thread (an atomic read-modify-write); false
    /// when the budget is spent.
    #[inline]
    pub fn take_shared(&self) -> bool {
        if !self.limited {
            return true;
        }
        // Relaxed: a ticket counter; only the count matters, no data is
        // published through it.
        self.left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1))
            .is_ok()
    }

    /// True when no IO is left to take.
    #[inline]
    pub fn spent(&self) -> bool {
        // Relaxed: read by the taking thread itself or as a hint.
        self.limited && self.left.load(Ordering::Relaxed) == 0
    }
}

/// Whether an IO reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// A read.
    Read,
    /// A write.
    Write,
}

/// Draws the (direction, offset) of each IO of one worker.
#[derive(Debug)]
pub struct IoPattern {
    rng: SmallRng,
    blocks: u64,
    bs_bytes: u64,
    read_pct: u32,
    sequential: bool,
    /// Shared by the tasks of one core so that sequential IO from many
    /// tasks stays contiguous (block index; wraps at `blocks`).
    cursor: Arc<AtomicU64>,
}

impl IoPattern {
    /// The pattern of `job` over `size_bytes` for worker `worker`;
    /// sequential workers of one core share `cursor`, which should start
    /// at [`IoPattern::start_block`].
    pub fn new(job: &Job, size_bytes: u64, seed: u64, cursor: Arc<AtomicU64>) -> IoPattern {
        IoPattern {
            rng: SmallRng::seed_from_u64(seed),
            blocks: (size_bytes / job.bs_bytes).max(1),
            bs_bytes: job.bs_bytes,
            read_pct: job.read_pct,
            sequential: job.rw.is_sequential(),
            cursor,
        }
    }

    /// Where core `core` of `cores` starts its sequential stream: evenly
    /// spread over the target.
    pub fn start_block(job: &Job, size_bytes: u64, core: usize) -> u64 {
        let blocks = (size_bytes / job.bs_bytes).max(1);
        blocks / job.cores.max(1) as u64 * core as u64
    }

    /// The next IO.
    #[inline]
    pub fn next_io(&mut self) -> (Dir, u64) {
        // Relaxed: a shared ticket counter; only uniqueness matters.
        self.next_with(|cursor| cursor.fetch_add(1, Ordering::Relaxed))
    }

    /// [`IoPattern::next_io`] where every pattern sharing this one's
    /// cursor is used on the calling thread only (the plugio engine's
    /// tasks of one core, spawned locally): the cursor advances with a
    /// load and a store instead of a locked read-modify-write, which the
    /// per-IO counts of `benches/instructions.sh` would otherwise charge
    /// to the runtime (one locked instruction per IO of a sequential job).
    #[inline]
    pub fn next_io_local(&mut self) -> (Dir, u64) {
        self.next_with(|cursor| {
            // Relaxed (both): one thread (see above), and nothing else is
            // published through the cursor; no other taker runs between
            // the load and the store.
            let block = cursor.load(Ordering::Relaxed);
            cursor.store(block.wrapping_add(1), Ordering::Relaxed);
            block
        })
    }

    /// The next IO, taking a sequential block number from `take_block`.
    #[inline(always)]
    fn next_with(&mut self, take_block: impl FnOnce(&AtomicU64) -> u64) -> (Dir, u64) {
        let dir = match self.read_pct {
            100 => Dir::Read,
            0 => Dir::Write,
            pct => {
                if self.rng.gen_range(0..100) < pct {
                    Dir::Read
                } else {
                    Dir::Write
                }
            }
        };
        let block = if self.sequential {
            take_block(&self.cursor) % self.blocks
        } else {
            self.rng.gen_range(0..self.blocks)
        };
        (dir, block * self.bs_bytes)
    }
}

/// A latency histogram in ns (3 significant digits, up to 100 s).
pub fn new_histogram() -> Histogram<u64> {
    // Only fails for bounds below 1, high < 2 * low or sigfig > 5: never
    // with these constants.
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("constant histogram bounds are valid")
}

/// Decides which IOs have their latency recorded: one in `every`.
#[derive(Debug, Clone, Copy)]
pub struct Sampler {
    every: u32,
    count: u32,
}

impl Sampler {
    /// One in `every` (0: none).
    pub fn new(every: u32) -> Sampler {
        Sampler { every, count: 0 }
    }

    /// The start time when this IO is sampled.
    #[inline]
    pub fn start(&mut self) -> Option<Instant> {
        if self.every == 0 {
            return None;
        }
        self.count += 1;
        if self.count >= self.every {
            self.count = 0;
            Some(Instant::now())
        } else {
            None
        }
    }
}

/// Sampled IO latencies in ns, by direction (a NOP counts as a read).
#[derive(Debug, Clone)]
pub struct Latencies {
    /// Reads (and NOPs).
    pub read: Histogram<u64>,
    /// Writes.
    pub write: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            read: new_histogram(),
            write: new_histogram(),
        }
    }
}

impl Latencies {
    /// Records one IO's latency.
    #[inline]
    pub fn record(&mut self, dir: Dir, elapsed: Duration) {
        let h = match dir {
            Dir::Read => &mut self.read,
            Dir::Write => &mut self.write,
        };
        h.saturating_record((elapsed.as_nanos() as u64).max(1));
    }

    /// Adds `other`'s samples into `self`.
    pub fn merge(&mut self, other: &Latencies) {
        merge_into(&mut self.read, &other.read);
        merge_into(&mut self.write, &other.write);
    }

    /// Both directions in one histogram.
    pub fn all(&self) -> Histogram<u64> {
        let mut h = self.read.clone();
        merge_into(&mut h, &self.write);
        h
    }
}

thread_local! {
    static LATENCY: RefCell<Option<Latencies>> = const { RefCell::new(None) };
}

/// Records `elapsed` for an IO in direction `dir` in this thread's
/// latency histograms.
#[inline]
pub fn record_latency(dir: Dir, elapsed: Duration) {
    LATENCY.with(|h| {
        h.borrow_mut()
            .get_or_insert_with(Latencies::default)
            .record(dir, elapsed);
    });
}

/// Takes this thread's latency histograms (empty when nothing was
/// recorded).
pub fn take_latency() -> Latencies {
    LATENCY.with(|h| h.borrow_mut().take().unwrap_or_default())
}

/// Adds `from` into `into`, ignoring values out of range (none are: both
/// share bounds).
fn merge_into(into: &mut Histogram<u64>, from: &Histogram<u64>) {
    if let Err(e) = into.add(from) {
        tracing::warn!(error = %e, "latency histogram merge failed");
    }
}

/// The process's CPU time so far (all threads), split as `getrusage(2)`
/// reports it: in user space, and in the kernel on its behalf (the
/// syscalls and the IO the kernel runs inline in them, such as a
/// page-cache copy or a zram decompression). The total is exact; the
/// split is sampled at the timer tick on most kernels (see
/// `BenchResult::cpu_user_ns_per_io`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub user: Duration,
    pub system: Duration,
}

impl CpuTimes {
    /// User plus system time.
    pub fn total(self) -> Duration {
        self.user + self.system
    }

    /// The time from `earlier` to `self` (zero where a clock went back).
    pub fn since(self, earlier: CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }
}

/// Process CPU time (user and system) so far; zero if `getrusage` fails.
pub fn cpu_times() -> CpuTimes {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000)
            };
            CpuTimes {
                user: tv(u.user_time()),
                system: tv(u.system_time()),
            }
        }
        Err(_) => CpuTimes::default(),
    }
}
