//! One io_uring per core.
//!
//! The io_uring itself, its SQ backlog, the raw enters, the CQ-overflow
//! flush and the reap loop live in the generic ring core (`uring.rs`,
//! `RingCore<S, C>`), which this ring and the passthrough [`CmdRing`] both
//! wrap (64-byte and 128-byte SQEs); this file adds the slots, direct ops,
//! registered files, the wake eventfd and the wait policy.
//!
//! Invariants:
//! - Only the core's own thread touches the ring (it is `!Send`; set up with
//!   `SINGLE_ISSUER` where the kernel has it).
//! - An SQE pushed (to the SQ or to the backlog) is in flight until its CQE
//!   is reaped, whatever `io_uring_enter` returned; its slot (handler,
//!   token, file registration, the SQE itself for resubmission) lives
//!   exactly that long.
//! - A file an op names stays open until the op's CQE: the ring keeps one
//!   registration per (backend, ring) holding the backend's descriptor
//!   (an `Arc`, cloned once per registration, not per op); a registration
//!   is released (and its fixed-file slot unregistered) only when its
//!   backend is gone, the SQ and backlog are empty and no slot names it.
//!   A live backend's registration is never released, so the index a
//!   backend caches for this ring (`FileCache`, checked by the ring's
//!   generation) is valid whenever it is read.
//! - A full SQ is submitted by the ring itself (the rest waits in the
//!   backlog), so any number of SQEs may be pushed between parks;
//!   [`submit_now`](crate::submit_now) is optional.
//! - `EAGAIN`/`EBUSY`/`EINTR` from enter, a full SQ, CQ overflow and per-op
//!   `-EAGAIN` results of slot ops are handled here and never reach a
//!   handler or caller.
//! - Direct ops (`Ring::push_direct`, the engine's path) have no slot:
//!   their user_data is `handler << 48 | token` with bits 62 and 63
//!   clear (a slot op's has `SLOT_BIT`, bit 62; a reserved value has
//!   both), so a CQE goes to its handler with no table lookup (one test,
//!   and the handler id is the bits above the token as they are), and a
//!   per-op `-EAGAIN` is delivered as the result (the caller, which keeps
//!   the op, issues it again). `direct_in_flight` counts them from push
//!   to CQE; their files stay open because registrations are only swept
//!   with the SQ and backlog empty (the kernel holds the file of every
//!   submitted op).
//! - Reaping never calls a handler while the ring is borrowed: CQEs are
//!   collected first, then delivered, one
//!   [`complete_batch`](crate::CompletionHandler::complete_batch) call per
//!   run of consecutive completions of one handler.
//! - On a ring without IOPOLL an eventfd read is always armed (user_data
//!   `WAKE_UD`) so another thread can wake a waiting enter; the ring waits
//!   in enter only with that read armed, so it never waits with nothing in
//!   flight. An IOPOLL ring arms none (the kernel refuses a read that
//!   cannot be polled): it never sleeps in enter, so a wake from another
//!   thread is seen at its next tick.
//! - The core's passthrough rings ([`CmdRing`], SQE128/CQE32, built on first
//!   use) are driven by this ring's park: their SQEs are submitted and their
//!   CQs reaped in every park, and the interrupt-driven one's eventfd read
//!   (user_data `CMD_WAKE_UD`) is kept armed here so its completions end a
//!   waiting enter; their commands count in [`Ring::in_flight`], so the
//!   driver drains them before the core goes away.
//!
//! # Wait policy (one enter per park)
//!
//! A park submits what is queued and waits in the same `io_uring_enter`.
//! - Something is ready (CQEs already in the CQ, or task work pending
//!   that will post some: `IORING_SQ_TASKRUN`) or the caller will not
//!   wait (zero timeout, a polled passthrough ring busy): no wait. The
//!   enter is skipped altogether when the SQ is empty, the ring is not
//!   IOPOLL and the kernel has no task work pending that would post CQEs
//!   (`IORING_SQ_TASKRUN`, set up with `TASKRUN_FLAG`: the kernel sets it
//!   when it queues such work, for DEFER_TASKRUN in
//!   `io_req_local_work_add`, and clears it when the work runs; without
//!   the flag a `DEFER_TASKRUN`/`COOP_TASKRUN` ring always enters, since
//!   only an enter posts their completions).
//! - Otherwise it waits for `min(ceil(in_flight / 2), 32)` CQEs, not 1: on
//!   devices whose completions trickle in (zram punted to io-wq) waiting
//!   for one CQE made ~4 IOs per enter and a context switch every 2.5 IOs.
//!   Never for more than half of what is in flight: the other half keeps
//!   the device busy while the core handles the batch and refills it.
//!   Waiting for all of it (the policy before 2026-12-02) drained the
//!   device before every refill: with two merged requests in flight (32
//!   tasks reading sequentially on zram) the core woke only when both were
//!   done, and a replay at queue depth 32 kept about 11 requests at the
//!   device instead of about 20 (`benches/RESULTS.md`, "Half of what is
//!   in flight"). The interval learned from such waits (wait time per CQE
//!   reaped) reads longer than with a wait for everything, since the
//!   first completion's latency is spread over fewer CQEs: at low queue
//!   depths the "slower than one per cap: wait for one" rule below sets in
//!   for devices about half as slow as before, which is the direction the
//!   change wants.
//!   Waiting for many must not trade latency away (a task may wait on one
//!   fast IO while 100 slow ones are in flight), so the batched wait is
//!   bounded by a short time, then falls back to "any CQE": with
//!   `IORING_FEAT_MIN_TIMEOUT` (6.12+) that is the kernel's
//!   `min_wait_usec` in the same enter; without it, a first enter waits
//!   for the batch up to the bound and, only if nothing at all arrived, a
//!   second one waits for one CQE for the rest of the park timeout.
//! - The bound adapts to the observed completion interval (EWMA of wait
//!   time per CQE reaped): twice the time the batch should take to fill,
//!   clamped to 10 µs .. [`RingConfig::batch_wait`] (default 100 µs). A
//!   batch that fills on time ends the wait early anyway; in a timed wait
//!   one that does not (a few fast ops among slow ones) costs at most
//!   about twice the expected fill time, and never more than the cap, on
//!   top of the first completion. When completions come slower than one
//!   per cap the batch could never fill in time, so the ring waits for
//!   one. A fixed bound would add up to that much to every IO of a slow
//!   device for no batching gain; the adaptive one does not. The cap is
//!   what a zram-like device gets: with completions every ~15 µs, 100 µs
//!   gathered 5-12 CQEs per enter (1.3 with a wait for one;
//!   `examples/nop_loop.rs` with `READ=/dev/zramN`); a longer
//!   `batch_wait` gathers more (300 µs: ~30) for more latency.
//! - The bound is a kernel timer per wait, and arming one is not free
//!   (in a VM each reprogramming of the CPU's timer and each timer
//!   interrupt is an exit; zram reads at queue depth 128 ran 20-25 %
//!   slower with one per 32 IOs). So by default
//!   ([`BatchWaitTimer::WhenLate`]) a batched wait arms it only after a
//!   late batch; other batched waits are untimed: bounded by
//!   [`BATCH_WAIT_UNTIMED`] (10 ms, or the cap if longer; longer than a
//!   scheduler tick, so its timer does not reprogram a busy CPU's) and by
//!   the park timeout, with the same "then any CQE" fallback as a ring
//!   without `MIN_TIMEOUT`. [`BatchWaitTimer::Always`] arms the bound on
//!   every batched wait.
//! - Late batches (`note_batch`): an untimed wait that ended without
//!   filling after more than the cap (its limit, the park timeout or a
//!   signal ended it), or that filled after more than 4 times its
//!   expected fill time and the cap (at most half the limit, at least the
//!   cap); a timed one its bound ended with less than a quarter of what
//!   the bound could gather at the estimated completion rate (the batch,
//!   or less where the cap cut the bound short of the batch's expected
//!   fill time). A late untimed batch arms the
//!   bound for [`BATCH_WAITS_BOUNDED`] batched waits, twice as many after
//!   each further late untimed batch in a row (up to 65,536), and an
//!   untimed batch on time resets that; a late timed batch keeps at least
//!   `BATCH_WAITS_BOUNDED` left. (A slow fill arms as many as a stall: a
//!   shorter period after a slow fill let ops that finish late, in
//!   bursts, hold fast ones among them again every few waits.) A late
//!   batch also teaches the interval estimate that completions are slow,
//!   which usually turns the next waits into waits for one. Where the park timeout (an executor
//!   timer) or signals end waits more often than a batch takes to fill
//!   and that is longer than the cap, even completions make batches late
//!   by these rules: each untimed try ends unfilled at the timeout, so
//!   the bound stays armed with one untimed try (held up to that
//!   timeout) after each timed period, the periods doubling as after a
//!   stall; timed waits that the timeout cut are judged by what it left,
//!   so they are on time. After many late batches in a row the
//!   bound stays armed for up to 65,536 batched waits before the next
//!   untimed try, even if completions have become even by then.
//! - Only 1 CQE is waited for with 2 or fewer ops in flight (half of 2 is
//!   1), while an
//!   interrupt-driven passthrough ring has commands in flight (its
//!   completions reach this ring as one eventfd-read CQE), without
//!   `EXT_ARG` (the timeout-SQE fallback), with SQPOLL and with IOPOLL
//!   (which busy-polls for `min_complete` and has no time bound).
//! - What ends a wait: `want` CQEs; the park timeout (the executor's
//!   timers); a signal (an enter that also submitted returns without
//!   `EINTR`); after the bound (a timed wait) or the limit (an untimed
//!   one), any CQE, which includes the eventfd read a cross-thread unpark
//!   completes and the passthrough ring's eventfd read. So an unpark that
//!   arrives while a batch is being waited for is seen at most the bound
//!   (<= `batch_wait`) later in a timed wait, and when the batch fills in
//!   an untimed one.
//! - What an untimed wait costs in latency. Where completions come
//!   evenly, the batch (half of what is in flight) fills in about half an
//!   IO's latency at that depth: that is what it adds to an IO that
//!   completed early, and to an unpark. Where fast completions come among
//!   ones that stay out (the batch cannot fill), an untimed wait lasts its
//!   whole limit (10 ms): once when that starts, then again at each probe
//!   after a timed period, whose length doubles with each such stall, so
//!   they grow rare geometrically (about the 1st, 66th, 195th, 452nd...
//!   batched wait); `BatchWaitTimer::Always` has no such stalls.

mod cmd;
mod config;
mod cq;
mod slots;
mod unpark;
mod uring;

#[cfg(test)]
mod tests;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use plugio_executor::fork::ForkLocal;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types};

pub use cmd::CmdRing;
pub(crate) use cmd::CmdSlot;
pub use config::{
    BatchWaitTimer, RingConfig, RingInfo, BATCH_WAITS_BOUNDED, BATCH_WAIT_UNTIMED, MAX_BATCH_WAIT,
    MAX_CQ_ENTRIES, MAX_SQ_ENTRIES, MIN_SQPOLL_SQ_ENTRIES,
};
pub(crate) use unpark::RingUnpark;
pub use uring::RingStats;
use uring::{is_retry, is_transient, RingCore, PREFLUSH_BIT};

use crate::completion::{Completion, DeliverBatch, HandlerId, Reaped};
use crate::error::{Error, Result};
pub(crate) use slots::NO_FILE;
use slots::{Meta, Slots, SLOT_BIT};

/// user_data of the armed eventfd read.
pub(crate) const WAKE_UD: u64 = u64::MAX;
/// user_data of a fallback timeout SQE (kernels without `EXT_ARG`).
const TIMEOUT_UD: u64 = u64::MAX - 1;
/// user_data of the cancel SQE issued at shutdown.
const CANCEL_UD: u64 = u64::MAX - 2;
/// user_data of the armed read of the passthrough ring's eventfd.
const CMD_WAKE_UD: u64 = u64::MAX - 3;
/// Set in each reserved user_data value above, and in no op's.
const RESERVED_BIT: u64 = 1 << 63;
const _: () = assert!(
    WAKE_UD & TIMEOUT_UD & CANCEL_UD & CMD_WAKE_UD & RESERVED_BIT != 0
        && (SLOT_BIT
            | (DIRECT_MAX_HANDLER as u64) << DIRECT_TOKEN_BITS
            | ((1 << DIRECT_TOKEN_BITS) - 1)
            | PREFLUSH_BIT
            | u32::MAX as u64)
            & RESERVED_BIT
            == 0
);
/// Where a user_data's bits above a direct op's handler id begin
/// ([`SLOT_BIT`] and bit 63): none is set in a direct op's.
const NOT_DIRECT_SHIFT: u32 = 62;
const _: () = assert!(
    ((DIRECT_MAX_HANDLER as u64) << DIRECT_TOKEN_BITS | ((1 << DIRECT_TOKEN_BITS) - 1))
        >> NOT_DIRECT_SHIFT
        == 0
        && SLOT_BIT >> NOT_DIRECT_SHIFT != 0
        && CMD_WAKE_UD >> NOT_DIRECT_SHIFT != 0
);
/// Bits of a direct op's token (below the handler id).
pub(crate) const DIRECT_TOKEN_BITS: u32 = 48;
/// Handler ids a direct op's user_data can carry (14 bits).
pub(crate) const DIRECT_MAX_HANDLER: u32 = (1 << 14) - 1;
/// An untimed batched wait that filled is late when it lasted more than
/// this many times its expected fill time (or the cap, if more): a change
/// to slow or uneven completions, not the scheduling noise of a busy CPU
/// (a factor of 2 flagged one wait in 40 on zram, 4 one in 800).
const LATE_FACTOR: u64 = 4;
/// Late untimed batches in a row double the timed period, up to
/// `BATCH_WAITS_BOUNDED << LATE_LEVEL_MAX` waits (65,536): where fast
/// completions come among ones that stay out (the batch can never fill
/// without its bound), each untimed wait is a stall, and they grow rarer
/// geometrically.
const LATE_LEVEL_MAX: u32 = 10;
/// Longest back-off sleep after `EBUSY`/`EAGAIN` with nothing reaped.
const BACKOFF_MAX: Duration = Duration::from_millis(1);
/// Most CQEs one park waits for.
const BATCH_WANT: usize = 32;
/// Shortest bound of a batched wait (see the module docs).
const BATCH_WAIT_MIN: Duration = Duration::from_micros(10);
/// The timeout of a batched wait when the park has none: without a general
/// timeout the kernel ends the whole wait when `min_wait_usec` expires,
/// CQE or not (`io_cqring_min_timer_wakeup`); with one it falls back to
/// "any CQE" until that timeout.
const LONG_WAIT: Duration = Duration::from_secs(3600);

/// Rings that get a slot in every backend's [`FileCache`]; the others
/// (cores beyond this many at once) look their registration up by id.
pub(crate) const CACHED_RINGS: usize = 64;

/// Which [`FileCache`] slots are taken by live rings (bit i = slot i).
/// Each fork generation has its own (a forked child's rings start with
/// every slot free: the parent's rings are stale there and never use or
/// release theirs, and the parent's lock may be held by a thread the
/// child does not have).
static RING_SLOTS: ForkLocal<Mutex<u64>> = ForkLocal::new(|| Mutex::new(0));
/// Generation of the next ring (0 marks an empty cache entry).
static RING_GEN: AtomicU32 = AtomicU32::new(1);

/// A backend's cache of its registration on each ring, so the per-op
/// lookup is one load: entry `ring.cache_slot` holds
/// `gen << 32 | (fixed + 1) << 16 | reg` (`fixed + 1` is 0 for the raw
/// fd), valid when `gen` is that ring's generation.
///
/// Entry `i` is written and read only by the thread owning the ring in
/// slot `i`; a slot is handed to a new ring only after its old ring is
/// dropped (under `RING_SLOTS`' lock), and the new ring's new generation
/// makes old values stale.
pub(crate) struct FileCache {
    slots: [AtomicU64; CACHED_RINGS],
}

impl FileCache {
    pub fn new() -> Self {
        Self {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Bumped once by every backend with a [`FileCache`] when it is dropped
/// ([`FileCache::backend_closed`]), so that a ring's next park knows to
/// sweep its registrations. Each ring keeps the last value it swept at.
static FILES_CLOSED: AtomicU64 = AtomicU64::new(0);

impl FileCache {
    /// Called by a backend's drop after it dropped its `Arc<FileCache>`
    /// (the liveness a ring's registration watches through its `Weak`).
    ///
    /// What it guarantees: the bump is `Release` and the ring's load in
    /// `sweep_files` is `Acquire`, so a ring that reads the bumped value
    /// also sees the strong-count decrement the backend's drop made before
    /// it (`Weak::strong_count` then reads 0 if that was the last strong
    /// reference). A ring that reads an older value sweeps at a later park
    /// (nothing is lost: registrations of a dead backend only stay a
    /// little longer). It orders nothing else: the descriptor itself stays
    /// open through the registration's own `Arc<OwnedFd>` whatever a ring
    /// reads.
    pub(crate) fn backend_closed() {
        // Release: pairs with the Acquire load in `Ring::sweep_files`.
        FILES_CLOSED.fetch_add(1, Ordering::Release);
    }
}

impl std::fmt::Debug for FileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileCache").finish_non_exhaustive()
    }
}

/// What an op needs to name its file on a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileRef {
    /// The ring's registration (goes in the op's slot).
    pub reg: u32,
    /// The fixed-file index, or `None` for the raw fd.
    pub fixed: Option<u32>,
}

impl FileRef {
    fn pack(self, gen: u32) -> Option<u64> {
        let fixed = match self.fixed {
            None => 0,
            Some(i) if i < 0xfffe => i + 1,
            Some(_) => return None,
        };
        (self.reg < 0xffff)
            .then(|| u64::from(gen) << 32 | u64::from(fixed) << 16 | u64::from(self.reg))
    }

    #[inline]
    fn unpack(v: u64) -> Self {
        let fixed = ((v >> 16) & 0xffff) as u32;
        Self {
            reg: (v & 0xffff) as u32,
            fixed: fixed.checked_sub(1),
        }
    }
}

/// One (backend, ring) registration.
struct FileReg {
    /// Keeps the descriptor open while this ring may have ops naming it.
    _fd: Arc<OwnedFd>,
    /// The backend's liveness (its cache).
    backend: Weak<FileCache>,
    file_id: u64,
    fixed: Option<u32>,
}

/// The ring's registrations: a slab plus an id index for the slow path.
#[derive(Default)]
struct FileRegs {
    regs: Vec<Option<FileReg>>,
    free: Vec<u32>,
    by_id: HashMap<u64, u32, FileIdHash>,
}

/// A fault the test hook can inject in place of an enter's result.
#[cfg(test)]
pub(crate) type EnterFault = Box<dyn FnMut() -> Option<i32>>;
/// A test hook that may rewrite a CQE's result (user_data, res) -> res.
#[cfg(test)]
pub(crate) type CqeFault = Box<dyn FnMut(u64, i32) -> i32>;

/// The core's io_uring plus its in-flight bookkeeping.
pub struct Ring {
    /// Dropped by hand: a ring left stale by a fork is leaked in the child
    /// (its mappings are not there; see `fork`).
    base: std::mem::ManuallyDrop<RingCore<squeue::Entry, cqueue::Entry>>,
    /// The fork generation the ring was built in (see `fork`).
    fork_generation: u64,
    slots: RefCell<Slots>,
    /// Direct ops pushed whose CQE has not been reaped.
    direct_in_flight: Cell<usize>,
    unpark: Arc<RingUnpark>,
    wake_buf: Box<Cell<u64>>,
    wake_armed: Cell<bool>,
    info: RingInfo,
    /// The kernel has `READV_FIXED` and `WRITEV_FIXED` (from `info`'s
    /// probe; a cell so that tests can take the older kernels' way).
    vectored_fixed: Cell<bool>,
    /// [`RingConfig::batch_wait`].
    batch_wait: Duration,
    /// [`RingConfig::batch_wait_timer`] (a cell so that tests can change
    /// it).
    batch_wait_timer: Cell<BatchWaitTimer>,
    /// Batched waits left that arm their bound as a timer
    /// ([`BatchWaitTimer::WhenLate`]): set by a late batch, one less per
    /// timed wait.
    timed_waits_left: Cell<u32>,
    /// Late untimed batches in a row (up to `LATE_LEVEL_MAX`): the next one
    /// arms the bound for `BATCH_WAITS_BOUNDED << late_level` waits. An
    /// untimed batch on time resets it.
    late_level: Cell<u32>,
    /// This ring's entry in every backend's [`FileCache`]
    /// (`CACHED_RINGS` or more: none).
    cache_slot: usize,
    /// This ring's generation (tags its [`FileCache`] entries).
    gen: u32,
    files: RefCell<FileRegs>,
    next_file_index: Cell<u32>,
    free_file_indices: RefCell<Vec<u32>>,
    files_closed_seen: Cell<u64>,
    /// A dead backend's registration is still named by a slot: sweep
    /// again at a later park.
    sweep_pending: Cell<bool>,
    /// EWMA of the wait time per CQE (ns), for the batched-wait bound.
    completion_interval_ns: Cell<u64>,
    reaped: RefCell<Reaped>,
    /// CQEs being handled by `reap` (kept for its capacity).
    /// Slots whose op came back `-EAGAIN` in the current reap, resubmitted
    /// after the CQ pass (kept for its capacity).
    eagain: RefCell<Vec<u32>>,
    /// [`RingStats::fixed_buf_sqes`], counted per SQE (a plain cell).
    fixed_buf_sqes: Cell<u64>,
    /// The passthrough rings (interrupt-driven, polled), built on first use.
    cmd_rings: RefCell<[Option<Rc<CmdRing>>; 2]>,
    cmd_wake_buf: Box<Cell<u64>>,
    cmd_wake_armed: Cell<bool>,
    #[cfg(test)]
    pub(crate) cqe_fault: RefCell<Option<CqeFault>>,
    /// Test hook: behave as if the kernel lacked `EXT_ARG`.
    #[cfg(test)]
    pub(crate) force_timeout_sqe: Cell<bool>,
    /// Test hook: behave as if the kernel lacked `MIN_TIMEOUT`.
    #[cfg(test)]
    pub(crate) force_no_min_timeout: Cell<bool>,
    #[cfg(test)]
    pub(crate) fault: RefCell<Option<EnterFault>>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("info", &self.info)
            .field("in_flight", &self.ops_in_flight())
            .field("backlog", &self.base.backlog_len())
            .finish()
    }
}

impl Ring {
    /// Builds a ring with `config`, probing optional setup flags and falling
    /// back when the kernel refuses them.
    ///
    /// # Errors
    /// `config` is out of range ([`RingConfig::validate`]), io_uring is
    /// unavailable (`ENOSYS`, `EPERM` from `io_uring_disabled` or seccomp)
    /// or the eventfd cannot be created.
    pub fn new(config: &RingConfig) -> Result<Self> {
        crate::fork::install();
        let (uring, info) = config::build(config)?;
        let base = RingCore::new(uring)
            .map_err(|e| Error::from_io(&e).with_context("mmap of the io_uring CQ"))?;
        let unpark = Arc::new(RingUnpark::new()?);
        let cache_slot = {
            let mut taken = RING_SLOTS
                .get()
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let free = (!*taken).trailing_zeros() as usize;
            if free < CACHED_RINGS {
                *taken |= 1 << free;
            }
            free
        };
        // Relaxed: only uniqueness matters (a u32 generation wraps after
        // 4 billion rings; a stale entry would need its ring slot and
        // wrapped generation to match).
        let gen = RING_GEN.fetch_add(1, Ordering::Relaxed).max(1);
        let ring = Self {
            base: std::mem::ManuallyDrop::new(base),
            fork_generation: crate::fork::generation(),
            slots: RefCell::new(Slots::default()),
            direct_in_flight: Cell::new(0),
            unpark,
            wake_buf: Box::new(Cell::new(0)),
            wake_armed: Cell::new(false),
            vectored_fixed: Cell::new(
                info.supports(io_uring::opcode::ReadvFixed::CODE)
                    && info.supports(io_uring::opcode::WritevFixed::CODE),
            ),
            info,
            batch_wait: config.batch_wait,
            batch_wait_timer: Cell::new(config.batch_wait_timer),
            timed_waits_left: Cell::new(0),
            late_level: Cell::new(0),
            cache_slot,
            gen,
            files: RefCell::new(FileRegs::default()),
            next_file_index: Cell::new(0),
            free_file_indices: RefCell::new(Vec::new()),
            files_closed_seen: Cell::new(0),
            sweep_pending: Cell::new(false),
            completion_interval_ns: Cell::new(0),
            reaped: RefCell::new(Reaped::default()),
            eagain: RefCell::new(Vec::new()),
            fixed_buf_sqes: Cell::new(0),
            cmd_rings: RefCell::new([None, None]),
            cmd_wake_buf: Box::new(Cell::new(0)),
            cmd_wake_armed: Cell::new(false),
            #[cfg(test)]
            cqe_fault: RefCell::new(None),
            #[cfg(test)]
            force_timeout_sqe: Cell::new(false),
            #[cfg(test)]
            force_no_min_timeout: Cell::new(false),
            #[cfg(test)]
            fault: RefCell::new(None),
        };
        ring.arm_wake();
        Ok(ring)
    }

    /// The ring was built before a fork of this process: this is the
    /// child's copy of the parent's ring, which the child never touches
    /// (see `fork`).
    #[inline]
    pub(crate) fn stale(&self) -> bool {
        self.fork_generation != crate::fork::generation()
    }

    /// What the ring was set up with and what the kernel supports.
    pub fn info(&self) -> &RingInfo {
        &self.info
    }

    /// Whether this ring's kernel has `READV_FIXED` and `WRITEV_FIXED`
    /// (Linux 6.15): vectored IO on registered buffers, without pinning
    /// each page per op.
    pub(crate) fn vectored_fixed(&self) -> bool {
        self.vectored_fixed.get()
    }

    /// The handle other threads use to wake this ring.
    pub(crate) fn unparker(&self) -> Arc<RingUnpark> {
        self.unpark.clone()
    }

    /// The push-back counters.
    pub fn stats(&self) -> RingStats {
        RingStats {
            fixed_buf_sqes: self.fixed_buf_sqes(),
            ..*self.base.stats.borrow()
        }
    }

    /// SQEs with a registered-buffer opcode on this ring, and passthrough
    /// commands on a registered buffer on its command rings
    /// ([`RingStats::fixed_buf_sqes`]).
    pub(crate) fn fixed_buf_sqes(&self) -> u64 {
        let cmds: u64 = self
            .cmd_rings
            .borrow()
            .iter()
            .flatten()
            .map(|r| r.fixed_cmds())
            .sum();
        self.fixed_buf_sqes.get() + cmds
    }

    /// Counts one SQE with a registered-buffer opcode.
    #[inline]
    pub(crate) fn count_fixed_buf_sqe(&self) {
        self.fixed_buf_sqes.set(self.fixed_buf_sqes.get() + 1);
    }

    /// Ops pushed and not yet completed (the armed wake read excluded),
    /// passthrough commands included.
    pub fn in_flight(&self) -> usize {
        let cmd: usize = self
            .cmd_rings()
            .iter()
            .flatten()
            .map(|r| r.in_flight())
            .sum();
        self.ops_in_flight() + cmd
    }

    /// Ops of this ring (slot and direct) whose CQE has not been reaped.
    fn ops_in_flight(&self) -> usize {
        self.slots.borrow().len() + self.direct_in_flight.get()
    }

    /// The core's passthrough ring (`polled`: the `IOPOLL` one), built on
    /// first use; the interrupt-driven one gets its eventfd watched by this
    /// ring (see [`CmdRing`]).
    ///
    /// # Errors
    /// The kernel refuses SQE128/CQE32 rings (`Unsupported`, naming the
    /// block-device path that still works) or the eventfd registration.
    pub fn cmd_ring(&self, polled: bool) -> Result<Rc<CmdRing>> {
        let which = usize::from(polled);
        if let Some(ring) = &self.cmd_rings.borrow()[which] {
            return Ok(ring.clone());
        }
        let ring = Rc::new(CmdRing::new(polled)?);
        self.cmd_rings.borrow_mut()[which] = Some(ring.clone());
        if !polled {
            self.arm_cmd_wake();
        }
        Ok(ring)
    }

    /// The passthrough rings built so far (a cheap clone: no allocation).
    fn cmd_rings(&self) -> [Option<Rc<CmdRing>>; 2] {
        self.cmd_rings.borrow().clone()
    }

    fn arm_cmd_wake(&self) {
        let Some(efd) = self.cmd_rings.borrow()[0]
            .as_ref()
            .and_then(|r| r.eventfd())
        else {
            return;
        };
        let entry = opcode::Read::new(types::Fd(efd), self.cmd_wake_buf.as_ptr().cast::<u8>(), 8)
            .build()
            .user_data(CMD_WAKE_UD);
        self.cmd_wake_armed.set(true);
        self.push_sqe(&entry);
    }

    /// Before the main enter: submits the passthrough rings' SQEs and reaps
    /// their CQs. True when the main enter must not wait (something was
    /// reaped, or a polled ring has commands to poll for).
    fn cmd_before_enter(&self) -> Result<bool> {
        let rings = self.cmd_rings();
        if rings.iter().all(Option::is_none) {
            return Ok(false);
        }
        let mut busy = false;
        let mut reaped = std::mem::take(&mut *self.reaped.borrow_mut());
        for ring in rings.iter().flatten() {
            ring.submit(false, 0)?;
            busy |= ring.reap(&mut reaped)? > 0 || (ring.is_polled() && ring.in_flight() > 0);
        }
        *self.reaped.borrow_mut() = reaped;
        Ok(busy)
    }

    /// After the main enter: polls the polled ring (waiting for one
    /// completion only when nothing else is ready) and reaps every
    /// passthrough CQ.
    fn cmd_after_enter(&self) -> Result<()> {
        let rings = self.cmd_rings();
        if rings.iter().all(Option::is_none) {
            return Ok(());
        }
        let mut reaped = std::mem::take(&mut *self.reaped.borrow_mut());
        for ring in rings.iter().flatten() {
            if ring.is_polled() && ring.in_flight() > 0 {
                let min = u32::from(reaped.is_empty() && !self.has_cqes());
                ring.submit(true, min)?;
            }
            ring.reap(&mut reaped)?;
        }
        *self.reaped.borrow_mut() = reaped;
        Ok(())
    }

    /// Registers `buffers` as fixed buffers (`IORING_REGISTER_BUFFERS`).
    ///
    /// # Safety
    /// The memory must stay valid until the ring is dropped.
    ///
    /// # Errors
    /// The kernel refused (`ENOMEM` under `RLIMIT_MEMLOCK`, ...).
    pub(crate) unsafe fn register_buffers(&self, buffers: &[libc::iovec]) -> io::Result<()> {
        // SAFETY: forwarded to the caller's contract.
        unsafe {
            self.base
                .uring
                .borrow()
                .submitter()
                .register_buffers(buffers)
        }
    }

    /// How an op of the backend with `cache` (descriptor `fd`, id
    /// `file_id`) names its file on this ring: one load from the backend's
    /// cache after the first op; the first op registers the file (a
    /// fixed-file slot where one is free, the raw fd otherwise).
    #[inline]
    pub(crate) fn file(&self, cache: &Arc<FileCache>, fd: &Arc<OwnedFd>, file_id: u64) -> FileRef {
        if let Some(entry) = cache.slots.get(self.cache_slot) {
            // Relaxed: only this thread writes this entry (see FileCache);
            // the value is self-contained.
            let v = entry.load(Ordering::Relaxed);
            if (v >> 32) as u32 == self.gen {
                let file = FileRef::unpack(v);
                debug_assert!(self.files.borrow().regs[file.reg as usize]
                    .as_ref()
                    .is_some_and(|r| r.file_id == file_id && r.fixed == file.fixed));
                return file;
            }
        }
        self.file_slow(cache, fd, file_id)
    }

    #[cold]
    fn file_slow(&self, cache: &Arc<FileCache>, fd: &Arc<OwnedFd>, file_id: u64) -> FileRef {
        let known = {
            let files = self.files.borrow();
            files.by_id.get(&file_id).map(|&reg| FileRef {
                reg,
                fixed: files.regs[reg as usize].as_ref().and_then(|r| r.fixed),
            })
        };
        let file = match known {
            Some(file) => file,
            None => {
                let fixed = self.register_fixed(fd);
                let mut files = self.files.borrow_mut();
                let entry = FileReg {
                    _fd: fd.clone(),
                    backend: Arc::downgrade(cache),
                    file_id,
                    fixed,
                };
                let reg = match files.free.pop() {
                    Some(reg) => {
                        files.regs[reg as usize] = Some(entry);
                        reg
                    }
                    None => {
                        files.regs.push(Some(entry));
                        (files.regs.len() - 1) as u32
                    }
                };
                files.by_id.insert(file_id, reg);
                FileRef { reg, fixed }
            }
        };
        if let (Some(entry), Some(v)) = (cache.slots.get(self.cache_slot), file.pack(self.gen)) {
            // Relaxed: see `file`.
            entry.store(v, Ordering::Relaxed);
        }
        file
    }

    /// A fixed-file slot for `fd`; `None` when registration is unavailable
    /// or the table is full (the op then uses the raw fd).
    fn register_fixed(&self, fd: &Arc<OwnedFd>) -> Option<u32> {
        if self.info.registered_files == 0 {
            return None;
        }
        let reused = self.free_file_indices.borrow_mut().pop();
        let index = match reused {
            Some(i) => i,
            None if self.next_file_index.get() < self.info.registered_files => {
                let i = self.next_file_index.get();
                self.next_file_index.set(i + 1);
                i
            }
            None => return None,
        };
        let uring = self.base.uring.borrow();
        match uring
            .submitter()
            .register_files_update(index, &[fd.as_raw_fd()])
        {
            Ok(_) => Some(index),
            Err(e) => {
                self.free_file_indices.borrow_mut().push(index);
                tracing::debug!(error = %e, "file registration failed; using the raw fd");
                None
            }
        }
    }

    /// Releases the registrations of backends that are gone and that no
    /// slot names any more. Only runs when the SQ and the backlog are
    /// empty, so no queued SQE still names a table slot that could be
    /// reused (ops the kernel holds keep their file: the kernel has its
    /// own reference, and a registration named by a slot is kept anyway).
    /// [`Ring::sweep_files`] before a wait, when a backend closed since
    /// the last sweep: what the SQ holds (the wake read armed again, a
    /// tick's last SQEs) is submitted first, since the sweep only runs on
    /// an empty SQ. An extra enter only on a park after a close.
    fn sweep_files_before_wait(&self) -> Result<()> {
        // Acquire: as in `sweep_files`.
        let due = FILES_CLOSED.load(Ordering::Acquire) != self.files_closed_seen.get()
            || self.sweep_pending.get();
        if !due {
            return Ok(());
        }
        if self.sq_len() > 0 {
            self.enter_submit_only()?;
        }
        self.sweep_files();
        Ok(())
    }

    fn sweep_files(&self) {
        // Acquire: pairs with the Release bump of
        // `FileCache::backend_closed`, which the backend's drop makes after
        // dropping its cache `Arc`: once this load sees the bump, the dead
        // backend's strong count is seen as 0 below (see that function for
        // what is and is not promised).
        let closed = FILES_CLOSED.load(Ordering::Acquire);
        if closed == self.files_closed_seen.get() && !self.sweep_pending.get() {
            return;
        }
        if self.base.backlog_len() > 0 || self.sq_len() > 0 {
            return;
        }
        self.files_closed_seen.set(closed);
        let dead: Vec<u32> = self
            .files
            .borrow()
            .regs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.as_ref().is_some_and(|r| r.backend.strong_count() == 0))
            .map(|(i, _)| i as u32)
            .collect();
        let mut pending = false;
        for reg in dead {
            if self.slots.borrow().uses_file(reg) {
                pending = true;
                continue;
            }
            let entry = {
                let mut files = self.files.borrow_mut();
                let entry = files.regs[reg as usize].take();
                files.free.push(reg);
                if let Some(e) = &entry {
                    files.by_id.remove(&e.file_id);
                }
                entry
            };
            if let Some(index) = entry.and_then(|e| e.fixed) {
                let uring = self.base.uring.borrow();
                match uring.submitter().register_files_update(index, &[-1]) {
                    Ok(_) => self.free_file_indices.borrow_mut().push(index),
                    Err(e) => tracing::debug!(error = %e, "file unregistration failed"),
                }
            }
        }
        self.sweep_pending.set(pending);
    }

    /// Registered files currently in the fixed-file table.
    pub fn registered_file_count(&self) -> usize {
        self.files
            .borrow()
            .regs
            .iter()
            .flatten()
            .filter(|r| r.fixed.is_some())
            .count()
    }

    /// Queues `entry` (and an optional `preflush` SQE linked ahead of it)
    /// for `handler`/`token`; `file` is the registration (from
    /// [`Ring::file`], or [`NO_FILE`]) that keeps the op's file open until
    /// the CQE (so a raw fd number in a queued SQE can never be closed and
    /// reused under it). Submits by itself when the SQ is full. Never
    /// blocks; never delivers.
    #[inline]
    pub(crate) fn push(
        &self,
        entry: squeue::Entry,
        preflush: Option<squeue::Entry>,
        file: u32,
        handler: HandlerId,
        token: u64,
    ) {
        let mut slots = self.slots.borrow_mut();
        let meta = Meta {
            token,
            handler,
            file,
            preflush_result: 0,
            has_preflush: preflush.is_some(),
        };
        // The SQE is written once into its slot (user_data = the index
        // and SLOT_BIT) and copied from there into the SQ.
        let index = slots.insert(meta, entry);
        if let Some(pre) = preflush {
            let pre = pre
                .flags(squeue::Flags::IO_LINK)
                .user_data(u64::from(index) | PREFLUSH_BIT | SLOT_BIT);
            self.push_sqe(&pre);
            slots.set_preflush_sqe(index, pre);
        }
        self.push_sqe(slots.sqe_ref(index));
    }

    /// Queues `entry`, whose user_data is [`direct_user_data`]'s, as a
    /// direct op: no slot; the CQE is delivered as `(token, res)` with no
    /// table lookup, and a per-op `-EAGAIN` is delivered as it is (the
    /// caller issues the op again). Submits by itself when the SQ is full;
    /// never blocks, never delivers. The caller's file must stay
    /// registered until the op is submitted (a live backend's
    /// registration always is). By reference: the SQE is built in its
    /// caller's frame, user_data included, and copied once, into the SQ
    /// (not field by field into a second copy first).
    #[inline(always)]
    pub(crate) fn push_direct(&self, entry: &squeue::Entry) {
        debug_assert!(
            entry.get_user_data() >> NOT_DIRECT_SHIFT == 0,
            "a direct op's user_data comes from direct_user_data"
        );
        self.direct_in_flight.set(self.direct_in_flight.get() + 1);
        self.push_sqe(entry);
    }

    /// Runs `f` with an [`SqBurst`] of this ring: the SQ borrowed once for
    /// every SQE `f` pushes through it ([`Ring::push_direct_burst`]), the
    /// kernel's head read once, the tail kept local and published once,
    /// when the burst ends, before this returns. While `f` runs, nothing
    /// else can reach the SQ: any other push or enter on this ring would
    /// find the io_uring borrowed and panic (never run on a stale tail).
    /// An SQE that finds the SQ full waits in the backlog, as any push's;
    /// the enters that a push would make then are made once the burst's
    /// tail is published ([`Ring::submit_burst_backlog`]).
    #[inline(always)]
    pub(crate) fn sq_burst<R>(&self, f: impl FnOnce(&mut SqBurst<'_>) -> R) -> R {
        let (r, backlogged) = {
            let mut uring = self.base.uring.borrow_mut();
            let mut burst = SqBurst {
                ring: self,
                // Loads the kernel's SQ head with Acquire: pairs with the
                // kernel's release store of the head once it has read the
                // SQEs before it, so the slots this burst may fill are
                // free. The tail is this thread's own (plain load).
                sq: uring.submission(),
                // SQEs go to the SQ only while the backlog is empty (the
                // push order is kept; see `RingCore::push`).
                backlogged: self.base.backlog_len() > 0,
                pushed: 0,
            };
            let r = f(&mut burst);
            // The burst's direct ops are counted once, when it drops
            // (also where `f` unwinds).
            (r, burst.backlogged)
            // `burst.sq` dropped here: the tail is stored with Release,
            // which pairs with the kernel's acquire load of the tail in
            // `io_submit_sqes`, so the SQEs written before it are seen
            // whole; it happens before the borrow ends, so before any
            // enter of this ring.
        };
        if backlogged {
            self.submit_burst_backlog();
        }
        r
    }

    /// [`Ring::push_direct`] within an [`SqBurst`]: the SQE is copied into
    /// the burst's SQ (the tail published when the burst ends), or into
    /// the backlog when the SQ is full (submitted when the burst ends).
    #[inline(always)]
    pub(crate) fn push_direct_burst(&self, burst: &mut SqBurst<'_>, entry: &squeue::Entry) {
        debug_assert!(
            entry.get_user_data() >> NOT_DIRECT_SHIFT == 0,
            "a direct op's user_data comes from direct_user_data"
        );
        // Counted into `direct_in_flight` when the burst ends.
        burst.pushed += 1;
        if burst.backlogged || !burst.try_push(entry) {
            self.base.push_backlog_burst(entry);
            burst.backlogged = true;
        }
    }

    /// The end of an [`SqBurst`] whose SQEs went, from some point on, to
    /// the backlog: what each such push would have done at once (submit
    /// the SQ, then move the backlog in), repeated until the backlog is
    /// empty or an enter moves nothing (then the park retries).
    #[cold]
    #[inline(never)]
    fn submit_burst_backlog(&self) {
        while self.base.backlog_len() > 0 {
            let before = self.base.backlog_len();
            self.submit_full_sq();
            if self.base.backlog_len() >= before {
                break;
            }
        }
    }

    /// Copies `entry` into the SQ, or into the backlog (then submits) when
    /// the SQ is full. Touches neither the slots nor the reaped list.
    /// Always inlined, down to the engine's fast-lane loop
    /// (`SqWriter::try_submit_one`); the full SQ's submit is out of line.
    #[inline(always)]
    fn push_sqe(&self, entry: &squeue::Entry) {
        if self.base.push(entry) {
            self.submit_full_sq();
        }
    }

    /// [`Ring::push_sqe`] that found the SQ full (the entry went to the
    /// backlog): submits what is there, then moves the backlog in.
    #[cold]
    #[inline(never)]
    fn submit_full_sq(&self) {
        if let Err(e) = self.enter_submit_only() {
            tracing::debug!(error = %e, "submit on a full SQ failed; kept in the backlog");
        }
        self.base.flush_backlog();
    }

    fn arm_wake(&self) {
        if self.info.iopoll {
            // An IOPOLL ring takes only pollable ops (O_DIRECT on a queue
            // with poll queues): the kernel answers an eventfd read on it
            // with EOPNOTSUPP at once, and re-arming it made every park
            // spin. Its park never sleeps (enter busy-polls and returns
            // when nothing is pollable), so it sees an unpark's work in the
            // next tick without the read.
            return;
        }
        let entry = opcode::Read::new(
            types::Fd(self.unpark.eventfd()),
            self.wake_buf.as_ptr().cast::<u8>(),
            8,
        )
        .build()
        .user_data(WAKE_UD);
        self.wake_armed.set(true);
        self.push_sqe(&entry);
    }

    /// Submits what is queued without waiting (`submit_now`); no syscall
    /// when nothing is.
    pub(crate) fn submit_pending(&self) -> Result<()> {
        if self.cmd_rings.borrow().iter().any(Option::is_some) {
            for ring in self.cmd_rings().iter().flatten() {
                ring.submit(false, 0)?;
            }
        }
        self.base.flush_backlog();
        if self.sq_len() == 0 {
            return Ok(());
        }
        self.enter_submit_only()?;
        self.base.flush_backlog();
        Ok(())
    }

    /// SQEs in the SQ not yet submitted.
    fn sq_len(&self) -> usize {
        self.base.sq_len()
    }

    /// True when the kernel may have task work pending that posts CQEs
    /// only on a `GETEVENTS` enter (or, for COOP_TASKRUN, at the next
    /// syscall): `IORING_SQ_TASKRUN` where the ring was set up with
    /// `TASKRUN_FLAG`; without the flag, always for DEFER/COOP_TASKRUN
    /// rings, never for plain ones (their task work runs on its own).
    fn taskrun_pending(&self) -> bool {
        if self.info.taskrun_flag {
            self.base.uring.borrow_mut().submission().taskrun()
        } else {
            self.info.defer_taskrun || self.info.coop_taskrun
        }
    }

    fn enter_submit_only(&self) -> Result<()> {
        match self.enter(0, None) {
            Ok(()) => Ok(()),
            Err(e) if is_transient(&e) => Ok(()),
            Err(e) => Err(Error::from_io(&e).with_context("io_uring_enter")),
        }
    }

    /// One `io_uring_enter`: submit the SQ and wait for `want` CQEs or
    /// `timeout`. Timeouts (`ETIME`) are success.
    fn enter(&self, want: usize, timeout: Option<Duration>) -> io::Result<()> {
        self.enter_min_wait(want, timeout, Duration::ZERO)
    }

    /// [`Ring::enter`] where, with `min_wait` non-zero (the kernel has
    /// `MIN_TIMEOUT`), the wait for `want` CQEs turns into a wait for any
    /// CQE after `min_wait`.
    fn enter_min_wait(
        &self,
        want: usize,
        timeout: Option<Duration>,
        min_wait: Duration,
    ) -> io::Result<()> {
        let timeout = match timeout {
            None if !min_wait.is_zero() => Some(LONG_WAIT),
            t => t,
        };
        self.base.stats.borrow_mut().enters += 1;
        #[cfg(test)]
        if let Some(fault) = self.fault.borrow_mut().as_mut() {
            if let Some(errno) = fault() {
                return Err(io::Error::from_raw_os_error(errno));
            }
        }
        let uring = self.base.uring.borrow();
        let submitter = uring.submitter();
        let result = match (want, timeout) {
            (0, _) if self.info.sqpoll => submitter.submit().map(drop),
            (0, _) => {
                drop(uring);
                return self.enter_getevents_nowait();
            }
            (_, None) => submitter.submit_and_wait(want).map(drop),
            (_, Some(t)) if self.ext_arg() => {
                let ts = types::Timespec::from(t);
                let min_us = u32::try_from(min_wait.as_micros()).unwrap_or(u32::MAX);
                let args = types::SubmitArgs::new().timespec(&ts).min_wait_usec(min_us);
                submitter.submit_with_args(want, &args).map(drop)
            }
            (_, Some(t)) => {
                drop(uring);
                return self.enter_with_timeout_sqe(want, t);
            }
        };
        match result {
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(()),
            other => other,
        }
    }

    /// Submits the SQ and runs pending task work without waiting: an enter
    /// with `GETEVENTS` and `min_complete = 0`. Plain `submit` would skip
    /// GETEVENTS, and with `DEFER_TASKRUN` completions are only posted to
    /// the CQ by an enter carrying it, so a core that never blocks would
    /// never see them.
    fn enter_getevents_nowait(&self) -> io::Result<()> {
        self.base.enter_raw(true, 0, true)
    }

    fn ext_arg(&self) -> bool {
        #[cfg(test)]
        if self.force_timeout_sqe.get() {
            return false;
        }
        self.info.ext_arg
    }

    fn enter_with_timeout_sqe(&self, want: usize, timeout: Duration) -> io::Result<()> {
        let ts = types::Timespec::from(timeout);
        let entry = opcode::Timeout::new(&ts).build().user_data(TIMEOUT_UD);
        if self.base.backlog_len() > 0 || !self.base.try_push_sq(&entry) {
            // No room for the timeout: submit without waiting.
            return self.base.uring.borrow().submitter().submit().map(drop);
        }
        // The kernel copies `ts` while preparing the SQE, inside this enter.
        self.base
            .uring
            .borrow()
            .submitter()
            .submit_and_wait(want)
            .map(drop)
    }

    /// Submits what is queued and waits up to `timeout` (`None`: until an
    /// event) for completions, then delivers them, in one enter (see the
    /// module docs for the wait policy). Handles every transient
    /// push-back. Returns how many completions were delivered.
    pub(crate) fn park<D: DeliverBatch>(
        &self,
        core: &D,
        timeout: Option<Duration>,
    ) -> Result<usize> {
        if self.stale() {
            return Err(crate::fork::forked_error());
        }
        self.base.flush_backlog();
        let cmd_busy = self.cmd_before_enter()?;
        let nowait = cmd_busy || timeout.is_some_and(|t| t.is_zero());
        // Completions are ready when they sit in the CQ or, flagged by
        // IORING_SQ_TASKRUN, wait as task work for this enter to post them:
        // then do not wait for more.
        let ready = self.has_cqes() || (self.info.taskrun_flag && self.taskrun_pending());
        if nowait || ready {
            // Enter only to submit, to let the kernel post deferred
            // completions, or to poll (IOPOLL).
            if self.info.iopoll || self.sq_len() > 0 || self.taskrun_pending() {
                self.enter_retrying(0, None, Duration::ZERO)?;
            }
        } else {
            // Before a wait that may be long (an idle core), too: a file
            // closed during this tick is not held through it.
            self.sweep_files_before_wait()?;
            self.wait(timeout)?;
        }
        // Right after the enter the SQ is normally empty: the moment to
        // release registered files of closed backends.
        self.sweep_files();
        self.reap()?;
        self.cmd_after_enter()?;
        self.base.flush_backlog();
        Ok(self.deliver(core))
    }

    /// How many CQEs to wait for with `in_flight` ops in flight, and for
    /// how long at most before falling back to any CQE.
    fn batch_policy(&self, in_flight: usize) -> (usize, Duration) {
        let cmd_waiting = self.cmd_rings.borrow()[0]
            .as_ref()
            .is_some_and(|r| r.in_flight() > 0);
        let interval = self.completion_interval_ns.get();
        let max = self.batch_wait;
        if in_flight < 2
            || cmd_waiting
            || !self.ext_arg()
            || self.info.sqpoll
            || self.info.iopoll
            || u128::from(interval) >= max.as_nanos()
        {
            return (1, Duration::ZERO);
        }
        // Half of what is in flight (rounded up), so the other half keeps
        // the device busy while this core handles the batch and refills.
        let want = in_flight
            .div_ceil(2)
            .min(BATCH_WANT)
            .min(self.info.cq_entries as usize);
        let fill_ns = 2 * want as u64 * interval;
        let bound = Duration::from_nanos(fill_ns).clamp(BATCH_WAIT_MIN.min(max), max);
        (want, bound)
    }

    /// The blocking part of a park: nothing is ready yet.
    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        // Ops the kernel has or is about to get: those still in the backlog
        // (a tick that pushed more than the SQ holds) cannot complete in
        // this wait.
        let in_flight = self.ops_in_flight().saturating_sub(self.base.backlog_len());
        let (want, bound) = self.batch_policy(in_flight);
        debug_assert!(want >= 1 && want <= in_flight.max(1));
        // The bound as the park's timeout leaves it: the kernel arms its
        // first timer at min_wait even when the general timeout is
        // shorter, and a timed wait is judged by what the sooner of the
        // two allowed.
        let bound = timeout.map_or(bound, |t| bound.min(t));
        // Clock reads only where the completion interval is sampled (two
        // per blocking park with 2 or more ops in flight).
        let start = (in_flight >= 2).then(Instant::now);
        let timed = want > 1 && self.bound_armed();
        let expected_fill_ns = want as u64 * self.completion_interval_ns.get();
        if want == 1 {
            self.enter_retrying(1, timeout, Duration::ZERO)?;
        } else if !timed {
            self.wait_batch_then_one(want, self.untimed_limit(), timeout, start)?;
        } else if self.min_timeout() {
            self.enter_retrying(want, timeout, bound)?;
        } else {
            self.wait_batch_then_one(want, bound, timeout, start)?;
        }
        if let Some(start) = start {
            let (waited, got) = (start.elapsed(), self.cq_len());
            self.observe(waited, got);
            if want > 1 {
                self.note_batch(timed, waited, expected_fill_ns, bound, want, got);
            }
        }
        Ok(())
    }

    /// A batched wait without `min_wait`: for `want` CQEs up to `limit`
    /// (or the park's `timeout`, if sooner), then, only if nothing at all
    /// arrived, for one CQE for the rest of the park's timeout.
    fn wait_batch_then_one(
        &self,
        want: usize,
        limit: Duration,
        timeout: Option<Duration>,
        start: Option<Instant>,
    ) -> Result<()> {
        let first = timeout.map_or(limit, |t| t.min(limit));
        let stop = self.enter_retrying(want, Some(first), Duration::ZERO)?;
        let rest = match (timeout, start) {
            (Some(t), Some(s)) => t.checked_sub(s.elapsed()).map(Some),
            (Some(t), None) => t.checked_sub(first).map(Some),
            (None, _) => Some(None),
        };
        if let Some(rest) = rest {
            if !stop && !self.has_cqes() && rest != Some(Duration::ZERO) {
                // Nothing at all within the limit: wait for one.
                self.enter_retrying(1, rest, Duration::ZERO)?;
            }
        }
        Ok(())
    }

    /// Whether the next batched wait arms its bound as a kernel timer (see
    /// [`BatchWaitTimer`]).
    fn bound_armed(&self) -> bool {
        match self.batch_wait_timer.get() {
            BatchWaitTimer::Always => true,
            BatchWaitTimer::WhenLate => self.timed_waits_left.get() > 0,
        }
    }

    /// The limit of an untimed batched wait: [`BATCH_WAIT_UNTIMED`], or
    /// the cap where that is longer (the bound never outlasts it).
    fn untimed_limit(&self) -> Duration {
        BATCH_WAIT_UNTIMED.max(self.batch_wait)
    }

    /// After a batched wait of `want` that took `waited` and found `got`
    /// CQEs (`timed`: its bound, `bound`, was armed; `expected_fill_ns`:
    /// the interval estimate's fill time for the batch when it began): counts
    /// it, and under [`BatchWaitTimer::WhenLate`] decides whether the next
    /// batched waits arm the bound. A batch is late when:
    /// - untimed, it ended without filling after more than the cap (its
    ///   limit, the park's timeout or "nothing at all arrived" ended it:
    ///   the bound would have handed the CQEs over sooner), or it filled
    ///   after more than [`LATE_FACTOR`] times its expected fill time (and
    ///   the cap), capped at half the untimed limit (but never below the
    ///   cap);
    /// - timed, its bound ended it with less than a quarter of what the
    ///   bound could gather at the estimated rate ([`bound_share`]: the
    ///   batch, or less where the cap cut the bound below the batch's
    ///   expected fill time).
    ///
    /// A late untimed batch arms the bound for `BATCH_WAITS_BOUNDED <<
    /// late_level` waits and raises the level ([`LATE_LEVEL_MAX`] at
    /// most); a late timed one keeps at least `BATCH_WAITS_BOUNDED` left;
    /// a timed one on time counts down; an untimed one on time resets the
    /// level.
    fn note_batch(
        &self,
        timed: bool,
        waited: Duration,
        expected_fill_ns: u64,
        bound: Duration,
        want: usize,
        got: usize,
    ) {
        let cap_ns = self.batch_wait.as_nanos() as u64;
        let late = if timed {
            4 * got < bound_share(bound, expected_fill_ns, want)
        } else {
            let unfilled = got < want && waited > self.batch_wait;
            let slow_ns = (LATE_FACTOR * expected_fill_ns.max(cap_ns))
                .min(self.untimed_limit().as_nanos() as u64 / 2)
                .max(cap_ns);
            unfilled || waited.as_nanos() > u128::from(slow_ns)
        };
        let mut stats = self.base.stats.borrow_mut();
        if timed {
            stats.batch_waits_timed += 1;
        } else {
            stats.batch_waits_untimed += 1;
        }
        if self.batch_wait_timer.get() == BatchWaitTimer::Always {
            return;
        }
        stats.late_batches += u64::from(late);
        let left = self.timed_waits_left.get();
        match (timed, late) {
            (false, true) => {
                let level = self.late_level.get();
                self.timed_waits_left.set(BATCH_WAITS_BOUNDED << level);
                self.late_level.set((level + 1).min(LATE_LEVEL_MAX));
            }
            (true, true) => self.timed_waits_left.set(left.max(BATCH_WAITS_BOUNDED)),
            (true, false) => self.timed_waits_left.set(left.saturating_sub(1)),
            (false, false) => self.late_level.set(0),
        }
    }

    /// Feeds one blocking wait (`waited`, `got` CQEs) into the completion
    /// interval estimate (an EWMA with weight 1/8; one long idle wait is
    /// capped so it cannot pin the policy at "wait for one" for long).
    fn observe(&self, waited: Duration, got: usize) {
        if got == 0 {
            return;
        }
        let cap = 10 * self.batch_wait.max(BATCH_WAIT_MIN).as_nanos() as u64;
        let sample = (waited.as_nanos() as u64 / got as u64).min(cap);
        let old = self.completion_interval_ns.get();
        self.completion_interval_ns.set(old - old / 8 + sample / 8);
    }

    /// One enter (submit, wait for `want` or `timeout`, `min_wait` as in
    /// [`Ring::enter_min_wait`]) absorbing `EINTR`, `EAGAIN` and `EBUSY`.
    /// Returns true when the wait ended early without its condition: a
    /// signal, or completions reaped to make room.
    fn enter_retrying(
        &self,
        want: usize,
        timeout: Option<Duration>,
        min_wait: Duration,
    ) -> Result<bool> {
        let mut backoff = Duration::from_micros(10);
        loop {
            match self.enter_min_wait(want, timeout, min_wait) {
                Ok(()) => return Ok(false),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    self.base.stats.borrow_mut().enter_eintr += 1;
                    return Ok(true);
                }
                Err(e) if is_transient(&e) => {
                    self.base.stats.borrow_mut().enter_busy += 1;
                    // EAGAIN/EBUSY: the kernel needs us to reap first.
                    if self.reap()? == 0 {
                        std::thread::sleep(backoff);
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                    if want == 0 || self.reaped_len() > 0 {
                        return Ok(true);
                    }
                }
                Err(e) => return Err(Error::from_io(&e).with_context("io_uring_enter")),
            }
        }
    }

    /// Test hook: the ring's [`RingConfig::batch_wait_timer`].
    #[cfg(test)]
    pub(crate) fn set_batch_wait_timer(&self, timer: BatchWaitTimer) {
        self.batch_wait_timer.set(timer);
    }

    fn min_timeout(&self) -> bool {
        #[cfg(test)]
        if self.force_no_min_timeout.get() {
            return false;
        }
        self.info.min_timeout
    }

    /// Submits, reaps without waiting, and delivers.
    pub(crate) fn poll_completions<D: DeliverBatch>(&self, core: &D) -> Result<usize> {
        self.park(core, Some(Duration::ZERO))
    }

    fn has_cqes(&self) -> bool {
        self.base.has_cqes()
    }

    fn cq_len(&self) -> usize {
        self.base.cq_len()
    }

    fn reaped_len(&self) -> usize {
        self.reaped.borrow().len()
    }

    /// Moves every available CQE into the reaped list (flushing CQ overflow
    /// with a GETEVENTS enter), resubmitting `-EAGAIN` ops and re-arming
    /// the wake read. Returns how many CQEs were seen.
    fn reap(&self) -> Result<usize> {
        let mut eagain = std::mem::take(&mut *self.eagain.borrow_mut());
        let seen = self.base.reap(
            &mut eagain,
            |eagain, cq| {
                // One pass over the CQ with the slots and the reaped list
                // borrowed once; resubmissions wait until the CQ is
                // released.
                let mut slots = self.slots.borrow_mut();
                let mut reaped = self.reaped.borrow_mut();
                let mut n = 0;
                for cqe in cq {
                    n += 1;
                    #[cfg(test)]
                    let res = match self.cqe_fault.borrow_mut().as_mut() {
                        Some(f) => f(cqe.user_data(), cqe.result()),
                        None => cqe.result(),
                    };
                    #[cfg(not(test))]
                    let res = cqe.result();
                    self.handle_cqe(&mut slots, &mut reaped, eagain, cqe.user_data(), res);
                }
                n
            },
            |eagain| {
                for index in eagain.drain(..) {
                    self.resubmit(index);
                }
            },
            "io_uring_enter(GETEVENTS)",
        )?;
        if !self.wake_armed.get() {
            self.unpark.rearm();
            self.arm_wake();
        }
        if !self.cmd_wake_armed.get() {
            self.arm_cmd_wake();
        }
        *self.eagain.borrow_mut() = eagain;
        Ok(seen)
    }

    #[inline]
    fn handle_cqe(
        &self,
        slots: &mut Slots,
        reaped: &mut Reaped,
        eagain: &mut Vec<u32>,
        ud: u64,
        res: i32,
    ) {
        // A direct op's user_data has neither SLOT_BIT nor the reserved
        // values' bit 63: one test on the path of every direct CQE, and
        // its handler id is the bits above the token as they are.
        if ud >> NOT_DIRECT_SHIFT == 0 {
            let handler = HandlerId((ud >> DIRECT_TOKEN_BITS) as u32);
            let token = ud & ((1 << DIRECT_TOKEN_BITS) - 1);
            self.direct_in_flight.set(self.direct_in_flight.get() - 1);
            reaped.push(Completion {
                handler,
                token,
                result: res,
            });
            return;
        }
        // The reserved values have bit 63 set, which no op's user_data
        // has.
        if ud & RESERVED_BIT != 0 && self.reserved_cqe(ud) {
            return;
        }
        self.handle_slot_cqe(slots, reaped, eagain, ud, res);
    }

    /// [`handle_cqe`](Self::handle_cqe) of a slot op's CQE (or its
    /// preflush's). Out of line: the direct ops' path keeps its values in
    /// registers.
    #[inline(never)]
    fn handle_slot_cqe(
        &self,
        slots: &mut Slots,
        reaped: &mut Reaped,
        eagain: &mut Vec<u32>,
        ud: u64,
        res: i32,
    ) {
        let index = (ud & u64::from(u32::MAX)) as u32;
        if ud & PREFLUSH_BIT != 0 {
            slots.set_preflush_result(index, res);
            return;
        }
        let Some(&meta) = slots.get(index) else {
            tracing::error!(ud, res, "CQE for an unknown slot");
            return;
        };
        if is_retry(res, meta.preflush_result) {
            // Per-op EAGAIN: resubmitted after this CQ pass.
            self.base.stats.borrow_mut().eagain_resubmits += 1;
            slots.reset_preflush(index);
            eagain.push(index);
            return;
        }
        slots.remove(index);
        let result = if res == -libc::ECANCELED && meta.preflush_result < 0 {
            meta.preflush_result
        } else {
            res
        };
        reaped.push(Completion {
            handler: meta.handler,
            token: meta.token,
            result,
        });
    }

    /// The CQE of a reserved user_data value (the wake reads, the
    /// fallback timeout, the shutdown cancel): handled here, returns true.
    /// False for any other value with bit 63 set (none is issued), which
    /// goes on as an op's.
    #[cold]
    #[inline(never)]
    fn reserved_cqe(&self, ud: u64) -> bool {
        match ud {
            WAKE_UD => self.wake_armed.set(false),
            CMD_WAKE_UD => self.cmd_wake_armed.set(false),
            TIMEOUT_UD | CANCEL_UD => {}
            _ => return false,
        }
        true
    }

    /// Per-op EAGAIN: resubmits the op's kept SQE (and its preflush).
    #[cold]
    fn resubmit(&self, index: u32) {
        let (entry, preflush) = {
            let slots = self.slots.borrow();
            let has_preflush = slots.get(index).is_some_and(|m| m.has_preflush);
            let preflush = has_preflush.then(|| slots.preflush_sqe(index)).flatten();
            (slots.sqe(index), preflush)
        };
        if let Some(pre) = preflush {
            self.push_sqe(&pre);
        }
        if let Some(entry) = entry {
            self.push_sqe(&entry);
        }
    }

    fn deliver<D: DeliverBatch>(&self, core: &D) -> usize {
        // Take the list (a handler may reap again through
        // `run_completions` while we deliver), then give its capacity
        // back: no allocation per batch.
        let mut reaped = std::mem::take(&mut *self.reaped.borrow_mut());
        let n = reaped.len();
        reaped.deliver(core);
        reaped.clear();
        let mut slot = self.reaped.borrow_mut();
        if slot.is_empty() && slot.capacity() < reaped.capacity() {
            *slot = reaped;
        }
        n
    }

    /// Asks the kernel to cancel every request in flight on this ring
    /// (`IORING_ASYNC_CANCEL_ANY`, Linux 5.19; before that the cancel fails
    /// and is ignored). For shutdown: an op that would never complete on
    /// its own (a read of a pipe with no writer) completes with
    /// `ECANCELED`; one a device is already working on completes as usual.
    /// The cancel's own CQE is dropped at reap; the armed wake reads are
    /// cancelled too, and armed again at the next park.
    pub(crate) fn cancel_in_flight(&self) {
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(CANCEL_UD);
        self.push_sqe(&cancel);
    }

    /// Cancels the armed eventfd reads (the wake read and the passthrough
    /// ring's), so that their buffers can be freed with the ring; a read
    /// the kernel did not give back within about a second stays armed (and
    /// its buffer is leaked by the drop).
    fn cancel_wake(&self) {
        let reads = [
            (WAKE_UD, &self.wake_armed),
            (CMD_WAKE_UD, &self.cmd_wake_armed),
        ];
        let mut armed = false;
        for (ud, flag) in reads {
            if flag.get() {
                let cancel = opcode::AsyncCancel::new(ud).build().user_data(CANCEL_UD);
                self.push_sqe(&cancel);
                armed = true;
            }
        }
        if !armed {
            return;
        }
        for _ in 0..100 {
            if self.enter(1, Some(Duration::from_millis(10))).is_err() {
                break;
            }
            let batch: Vec<cqueue::Entry> = {
                let mut uring = self.base.uring.borrow_mut();
                let cq = uring.completion();
                cq.collect()
            };
            for c in &batch {
                for (ud, flag) in reads {
                    if c.user_data() == ud {
                        flag.set(false);
                    }
                }
            }
            if reads.iter().all(|(_, flag)| !flag.get()) {
                return;
            }
        }
    }
}

/// How many of a timed batched wait's `want` CQEs its `bound` can gather
/// at the completion rate the ring estimated when the wait began (`want`
/// in `expected_fill_ns`): all of them where the bound covers the
/// expected fill time (or there is no estimate yet), fewer where the cap
/// cut the bound short of it (a device completing one IO per 30 µs fills
/// a batch of 32 in about 1 ms; a 100 µs bound gathers about 3). A timed
/// wait is late only against this share, so that such a device does not
/// keep the timer armed for good.
fn bound_share(bound: Duration, expected_fill_ns: u64, want: usize) -> usize {
    if expected_fill_ns == 0 {
        return want;
    }
    let bound_ns = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    let share = bound_ns.saturating_mul(want as u64) / expected_fill_ns;
    (share as usize).min(want)
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.stale() {
            self.drop_stale();
            return;
        }
        self.cancel_wake();
        if self.wake_armed.get() {
            // The kernel may still write the wake buffer: leak it rather
            // than free memory it owns.
            let buf = std::mem::replace(&mut self.wake_buf, Box::new(Cell::new(0)));
            std::mem::forget(buf);
        }
        if self.cmd_wake_armed.get() {
            // The passthrough eventfd read is still armed: its 8-byte buffer
            // is leaked rather than freed under the kernel.
            let buf = std::mem::replace(&mut self.cmd_wake_buf, Box::new(Cell::new(0)));
            std::mem::forget(buf);
        }
        let n = self.ops_in_flight();
        if n > 0 {
            tracing::error!(in_flight = n, "ring dropped with ops in flight");
            // The registrations keep files open for ops the kernel may
            // still hold: leak them rather than close under it.
            std::mem::forget(std::mem::take(&mut *self.files.borrow_mut()));
        }
        self.release_cache_slot();
        // SAFETY: dropped once, here, and not used after.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.base) };
    }
}

impl Ring {
    fn release_cache_slot(&self) {
        if self.cache_slot < CACHED_RINGS {
            // After this the slot may go to a new ring, whose new
            // generation makes this ring's cache entries stale.
            *RING_SLOTS
                .get()
                .lock()
                .unwrap_or_else(PoisonError::into_inner) &= !(1 << self.cache_slot);
        }
    }

    /// The drop of a ring in a forked child: nothing that reaches the
    /// kernel's ring (no cancel SQE, no unmapping: the mappings are
    /// `MADV_DONTFORK`, absent here, and their addresses may hold the
    /// child's own mappings by now); only the child's copy of the
    /// descriptor is closed. Buffers the parent's kernel ring may write
    /// and the passthrough rings are leaked.
    fn drop_stale(&mut self) {
        let fd = self.base.uring.borrow().as_raw_fd();
        std::mem::forget(std::mem::replace(
            &mut self.wake_buf,
            Box::new(Cell::new(0)),
        ));
        std::mem::forget(std::mem::replace(
            &mut self.cmd_wake_buf,
            Box::new(Cell::new(0)),
        ));
        std::mem::forget(self.cmd_rings.borrow_mut().clone());
        // SAFETY: `fd` is this process's copy of the ring's descriptor,
        // owned by the `IoUring` that is never dropped (ManuallyDrop);
        // closing it leaves the parent's ring open.
        unsafe { libc::close(fd) };
        // Its cache slot is not released: it is a slot of the parent's
        // table, and the same bit of the child's table may belong to a
        // live ring of the child (freeing it gave two rings one slot).
    }
}

/// Hashes the process-unique `u64` file ids of the registered-file table
/// with one multiply (Fibonacci hashing) instead of SipHash: the lookup is
/// on every submission, and the ids are not attacker-controlled.
type FileIdHash = std::hash::BuildHasherDefault<FileIdHasher>;

#[derive(Default)]
struct FileIdHasher(u64);

impl std::hash::Hasher for FileIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Whether `handler` and `token` fit in a direct op's user_data.
#[inline]
pub(crate) fn fits_direct(handler: HandlerId, token: u64) -> bool {
    handler.0 <= DIRECT_MAX_HANDLER && token >> DIRECT_TOKEN_BITS == 0
}

/// The byte offset of `user_data` in `struct io_uring_sqe` (the kernel's
/// ABI: opcode, flags, ioprio, fd, off, addr, len, op flags, then
/// user_data).
const SQE_USER_DATA_OFFSET: usize = 32;

/// Sets `entry`'s user_data in place. io-uring's `Entry::user_data` takes
/// and returns the 64-byte entry by value, and on the hot path (an entry
/// built in one of several match arms) the compiler copied it field by
/// field to do so (about 34 instructions per SQE); this is one store.
#[inline(always)]
pub(crate) fn set_user_data(entry: &mut squeue::Entry, ud: u64) {
    const _: () = assert!(std::mem::size_of::<squeue::Entry>() == 64);
    // SAFETY: `squeue::Entry` is `#[repr(C)]` around the kernel's
    // 64-byte `io_uring_sqe`, whose `user_data` is the `u64` at byte
    // `SQE_USER_DATA_OFFSET` (the ABI; debug builds check it below and the
    // ring's tests in every build): the write stays inside the entry, and
    // any `u64` is a valid user_data.
    unsafe {
        std::ptr::from_mut(entry)
            .cast::<u8>()
            .add(SQE_USER_DATA_OFFSET)
            .cast::<u64>()
            .write_unaligned(ud);
    }
    debug_assert_eq!(entry.get_user_data(), ud, "user_data offset in the SQE");
}

/// The user_data of a direct op of `handler` with `token` (see
/// [`Ring::push_direct`]).
///
/// # Panics
/// `token` does not fit in [`DIRECT_TOKEN_BITS`] bits or `handler`
/// exceeds [`DIRECT_MAX_HANDLER`] (callers check [`fits_direct`] first).
#[inline]
pub(crate) fn direct_user_data(handler: HandlerId, token: u64) -> u64 {
    assert!(
        fits_direct(handler, token),
        "token or handler too large for a direct op"
    );
    u64::from(handler.0) << DIRECT_TOKEN_BITS | token
}

thread_local! {
    /// The ring installed in this thread's core (null: none): a copy of the
    /// pointer of the `Rc<Ring>` the core holds, kept by
    /// [`Core::set_ring`](crate::core::Core) and cleared when the core is
    /// dropped, so the per-op lookup is one load (no lazy-init check, no
    /// `RefCell`).
    static CURRENT: Cell<*const Ring> = const { Cell::new(std::ptr::null()) };
    /// Depth of `with_current` calls running (debug builds check that no
    /// ring is installed or removed under one).
    #[cfg(debug_assertions)]
    static BORROWS: Cell<usize> = const { Cell::new(0) };
}

/// Records the ring the thread's core now holds (`None`: none).
pub(crate) fn set_current(ring: Option<&Rc<Ring>>) {
    #[cfg(debug_assertions)]
    assert_eq!(
        BORROWS.with(Cell::get),
        0,
        "the ring was installed or removed while in use"
    );
    let ptr = ring.map_or(std::ptr::null(), Rc::as_ptr);
    // try_with: the core may be dropped during thread teardown, after this
    // slot (a const slot without destructor stays usable until then).
    let _ = CURRENT.try_with(|c| c.set(ptr));
}

/// The counters of the calling thread's ring; `None` on a thread without
/// a driver or whose driver has no ring (the sync fallback).
pub fn current_stats() -> Option<RingStats> {
    with_current(Ring::stats)
}

/// [`RingStats::fixed_buf_sqes`] of the calling thread's ring: the IO it
/// queued on a registered buffer so far (READ_FIXED and its kin, and
/// passthrough commands with `IORING_URING_CMD_FIXED`); 0 without a ring.
/// A caller that reads it before and after submitting a batch learns how
/// many of the batch's ops the backend sent on a registered buffer (the
/// mem device, the sync pool and a refused submit send none). Two loads
/// and the command rings' counts: no `RefCell` of the ring is borrowed
/// mutably, so it may be called from inside
/// [`Backend::with_sq_writer`](crate::Backend::with_sq_writer)'s callback.
///
/// ```
/// assert_eq!(plugio::device::ring::current_fixed_buf_sqes(), 0); // no driver here
/// ```
pub fn current_fixed_buf_sqes() -> u64 {
    with_current(Ring::fixed_buf_sqes).unwrap_or(0)
}

/// What the calling thread's ring supports (its probed opcodes:
/// [`RingInfo::supports`]); `None` without a ring.
pub fn current_info() -> Option<RingInfo> {
    with_current(|r| r.info().clone())
}

/// Whether the calling thread's ring supports opcode `code`
/// (`IORING_OP_*`, e.g. `io_uring::opcode::Statx::CODE`); false without a
/// ring. No allocation: one bit test.
pub fn current_supports(code: u8) -> bool {
    with_current(|r| r.info().supports(code)).unwrap_or(false)
}

/// Whether the current thread's ring busy-polls its completions
/// (`IORING_SETUP_IOPOLL`): it takes only pollable ops (direct reads and
/// writes), and the kernel refuses file-level ops (open, stat, fsync,
/// rename...) on it with `EINVAL`. False without a ring.
pub fn current_is_iopoll() -> bool {
    with_current(|r| r.info().iopoll).unwrap_or(false)
}

/// The current thread's ring with a strong count of its own, if a driver
/// with a ring is installed: for a caller that runs code it does not
/// control while it holds the ring (`Backend::with_sq_writer`'s
/// callback), so that the ring outlives that code even if it drops the
/// thread's driver. One non-atomic increment; see [`with_current`] for the
/// per-op lookup without it.
pub(crate) fn current_rc() -> Option<Rc<Ring>> {
    let ptr = CURRENT.try_with(Cell::get).ok()?;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: a non-null `CURRENT` is `Rc::as_ptr` of the `Rc<Ring>` the
    // thread's core holds right now (set by `set_current`, reset before
    // that `Rc` is dropped); taking one more strong count and an `Rc` for
    // it is what `Rc::clone` does.
    Some(unsafe {
        Rc::increment_strong_count(ptr);
        Rc::from_raw(ptr)
    })
}

/// Runs `f` with the current thread's ring (no `Rc` clone), if a driver
/// with a ring is installed. `f` must not install or remove the ring
/// (debug builds check).
#[inline]
pub(crate) fn with_current<R>(f: impl FnOnce(&Ring) -> R) -> Option<R> {
    let ptr = CURRENT.try_with(Cell::get).ok()?;
    if ptr.is_null() {
        return None;
    }
    #[cfg(debug_assertions)]
    let _borrow = Borrow::new();
    // SAFETY: `ptr` is the `Rc<Ring>` the thread's core holds: set by
    // `Core::set_ring` when installed, reset before it is removed or the
    // core dropped (`set_current`), and `f` does not remove it (checked in
    // debug builds), so the ring outlives this call. Only this thread
    // reads the slot.
    Some(f(unsafe { &*ptr }))
}

/// One running `with_current` (debug builds), undone on unwind too.
#[cfg(debug_assertions)]
struct Borrow;

#[cfg(debug_assertions)]
impl Borrow {
    fn new() -> Self {
        BORROWS.with(|b| b.set(b.get() + 1));
        Borrow
    }
}

#[cfg(debug_assertions)]
impl Drop for Borrow {
    fn drop(&mut self) {
        BORROWS.with(|b| b.set(b.get() - 1));
    }
}

impl AsRawFd for Ring {
    fn as_raw_fd(&self) -> RawFd {
        self.base.uring.borrow().as_raw_fd()
    }
}

/// The SQ of a [`Ring`] held for a burst of pushes ([`Ring::sq_burst`]):
/// its head read once, its tail kept here and published when the burst
/// ends. `backlogged`: the SQEs of the burst go to the backlog (it was
/// not empty, or the SQ filled), so that the push order is kept.
pub(crate) struct SqBurst<'a> {
    ring: &'a Ring,
    sq: squeue::SubmissionQueue<'a, squeue::Entry>,
    backlogged: bool,
    /// Direct ops pushed (to the SQ or the backlog) in this burst.
    pushed: usize,
}

impl Drop for SqBurst<'_> {
    /// Counts the burst's direct ops in `direct_in_flight`, once (nothing
    /// reads the count while the burst holds the ring's io_uring), before
    /// `sq` drops and publishes the tail.
    #[inline(always)]
    fn drop(&mut self) {
        let in_flight = &self.ring.direct_in_flight;
        in_flight.set(in_flight.get() + self.pushed);
    }
}

impl SqBurst<'_> {
    /// Copies `entry` into the SQ where it has room (the head read again
    /// once where it looked full: an SQPOLL kernel thread may have moved
    /// it). Returns false, having written nothing, when the SQ is full.
    #[inline(always)]
    fn try_push(&mut self, entry: &squeue::Entry) -> bool {
        // SAFETY: as `RingCore::try_push_sq`: every pointer an SQE carries
        // stays valid until its CQE (the caller's contract, see
        // `SqWriter::try_submit_one`). `push` never overruns the ring: it
        // refuses when `tail - head` is the ring's size.
        unsafe { self.sq.push(entry) }.is_ok() || self.push_after_sync(entry)
    }

    /// [`SqBurst::try_push`] that found the SQ full: publishes the tail
    /// (Release, as at the burst's end) and loads the head again (Acquire,
    /// pairing with the kernel's release store of it: an SQPOLL thread may
    /// have taken SQEs), then tries once more.
    #[cold]
    #[inline(never)]
    fn push_after_sync(&mut self, entry: &squeue::Entry) -> bool {
        self.sq.sync();
        // SAFETY: as in `try_push`.
        unsafe { self.sq.push(entry) }.is_ok()
    }
}
