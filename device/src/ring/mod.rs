//! One io_uring per core.
//!
//! Invariants:
//! - Only the core's own thread touches the ring (it is `!Send`; set up with
//!   `SINGLE_ISSUER` where the kernel has it).
//! - An SQE pushed (to the SQ or to the backlog) is in flight until its CQE
//!   is reaped, whatever `io_uring_enter` returned; its slot (handler,
//!   token, the SQE itself for resubmission) lives exactly that long.
//! - `EAGAIN`/`EBUSY`/`EINTR` from enter, a full SQ, CQ overflow and per-op
//!   `-EAGAIN` results are handled here and never reach a handler or caller.
//! - Reaping never calls a handler while the ring is borrowed: CQEs are
//!   collected first, then delivered.
//! - An eventfd read is always armed (user_data `WAKE_UD`) so another
//!   thread can wake a waiting enter; the ring waits in enter only with that
//!   read armed, so it never waits with nothing in flight.
//! - The core's passthrough rings ([`CmdRing`], SQE128/CQE32, built on first
//!   use) are driven by this ring's park: their SQEs are submitted and their
//!   CQs reaped in every park, and the interrupt-driven one's eventfd read
//!   (user_data `CMD_WAKE_UD`) is kept armed here so its completions end a
//!   waiting enter; their commands count in [`Ring::in_flight`], so the
//!   driver drains them before the core goes away.

mod cmd;
mod config;
mod slots;
mod unpark;

#[cfg(test)]
mod tests;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

pub use cmd::CmdRing;
pub(crate) use cmd::CmdSlot;
pub use config::{RingConfig, RingInfo};
pub(crate) use unpark::RingUnpark;

use crate::core::{Completion, Core, HandlerId};
use crate::error::{Error, Result};
use slots::{Slot, Slots};

/// user_data of the armed eventfd read.
pub(crate) const WAKE_UD: u64 = u64::MAX;
/// user_data of a fallback timeout SQE (kernels without `EXT_ARG`).
const TIMEOUT_UD: u64 = u64::MAX - 1;
/// user_data of the cancel SQE issued at shutdown.
const CANCEL_UD: u64 = u64::MAX - 2;
/// user_data of the armed read of the passthrough ring's eventfd.
const CMD_WAKE_UD: u64 = u64::MAX - 3;
/// Set in user_data of a preflush SQE linked ahead of its op.
const PREFLUSH_BIT: u64 = 1 << 40;
/// `IORING_ENTER_GETEVENTS` from the uapi header.
const IORING_ENTER_GETEVENTS: u32 = 1;
/// Longest back-off sleep after `EBUSY`/`EAGAIN` with nothing reaped.
const BACKOFF_MAX: Duration = Duration::from_millis(1);

/// A fault the test hook can inject in place of an enter's result.
#[cfg(test)]
pub(crate) type EnterFault = Box<dyn FnMut() -> Option<i32>>;
/// A test hook that may rewrite a CQE's result (user_data, res) -> res.
#[cfg(test)]
pub(crate) type CqeFault = Box<dyn FnMut(u64, i32) -> i32>;

/// Counters of the push-backs a ring absorbed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// `io_uring_enter` calls.
    pub enters: u64,
    /// Enters that returned `EAGAIN`/`EBUSY` and were retried after a reap.
    pub enter_busy: u64,
    /// Enters interrupted by a signal (`EINTR`).
    pub enter_eintr: u64,
    /// SQEs that found the SQ full and went to the backlog.
    pub sq_full: u64,
    /// GETEVENTS enters issued to flush a CQ overflow.
    pub cq_overflow_flushes: u64,
    /// Ops resubmitted after a per-op `-EAGAIN`.
    pub eagain_resubmits: u64,
    /// CQEs reaped (wake reads included).
    pub cqes: u64,
}

/// The core's io_uring plus its in-flight bookkeeping.
pub struct Ring {
    uring: RefCell<IoUring>,
    slots: RefCell<Slots>,
    backlog: RefCell<VecDeque<squeue::Entry>>,
    unpark: Arc<RingUnpark>,
    wake_buf: Box<Cell<u64>>,
    wake_armed: Cell<bool>,
    info: RingInfo,
    files: RefCell<HashMap<u64, (u32, Weak<OwnedFd>), FileIdHash>>,
    next_file_index: Cell<u32>,
    free_file_indices: RefCell<Vec<u32>>,
    files_closed_seen: Cell<u64>,
    reaped: RefCell<Vec<Completion>>,
    /// CQEs being handled by `reap` (kept for its capacity).
    cqe_scratch: RefCell<Vec<cqueue::Entry>>,
    stats: RefCell<RingStats>,
    /// The passthrough rings (interrupt-driven, polled), built on first use.
    cmd_rings: RefCell<[Option<Rc<CmdRing>>; 2]>,
    cmd_wake_buf: Box<Cell<u64>>,
    cmd_wake_armed: Cell<bool>,
    #[cfg(test)]
    pub(crate) cqe_fault: RefCell<Option<CqeFault>>,
    /// Test hook: behave as if the kernel lacked `EXT_ARG`.
    #[cfg(test)]
    pub(crate) force_timeout_sqe: Cell<bool>,
    #[cfg(test)]
    pub(crate) fault: RefCell<Option<EnterFault>>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("info", &self.info)
            .field("in_flight", &self.slots.borrow().len())
            .field("backlog", &self.backlog.borrow().len())
            .finish()
    }
}

impl Ring {
    /// Builds a ring with `config`, probing optional setup flags and falling
    /// back when the kernel refuses them.
    ///
    /// # Errors
    /// io_uring is unavailable (`ENOSYS`, `EPERM` from `io_uring_disabled`
    /// or seccomp) or the eventfd cannot be created.
    pub fn new(config: &RingConfig) -> Result<Self> {
        let (uring, info) = config::build(config)?;
        let unpark = Arc::new(RingUnpark::new()?);
        let ring = Self {
            uring: RefCell::new(uring),
            slots: RefCell::new(Slots::default()),
            backlog: RefCell::new(VecDeque::new()),
            unpark,
            wake_buf: Box::new(Cell::new(0)),
            wake_armed: Cell::new(false),
            info,
            files: RefCell::new(HashMap::default()),
            next_file_index: Cell::new(0),
            free_file_indices: RefCell::new(Vec::new()),
            files_closed_seen: Cell::new(0),
            reaped: RefCell::new(Vec::new()),
            cqe_scratch: RefCell::new(Vec::new()),
            stats: RefCell::new(RingStats::default()),
            cmd_rings: RefCell::new([None, None]),
            cmd_wake_buf: Box::new(Cell::new(0)),
            cmd_wake_armed: Cell::new(false),
            #[cfg(test)]
            cqe_fault: RefCell::new(None),
            #[cfg(test)]
            force_timeout_sqe: Cell::new(false),
            #[cfg(test)]
            fault: RefCell::new(None),
        };
        ring.arm_wake();
        Ok(ring)
    }

    /// What the ring was set up with and what the kernel supports.
    pub fn info(&self) -> &RingInfo {
        &self.info
    }

    /// The handle other threads use to wake this ring.
    pub(crate) fn unparker(&self) -> Arc<RingUnpark> {
        self.unpark.clone()
    }

    /// The push-back counters.
    pub fn stats(&self) -> RingStats {
        *self.stats.borrow()
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
        self.slots.borrow().len() + cmd
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
        self.push_sqe(entry);
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
        unsafe { self.uring.borrow().submitter().register_buffers(buffers) }
    }

    /// The registered-file index for backend `file_id` (descriptor `fd`),
    /// registering it on first use; `None` when registration is unavailable
    /// or the table is full (the op then uses the raw fd).
    pub(crate) fn fixed_file(&self, file_id: u64, fd: &Arc<OwnedFd>) -> Option<u32> {
        if self.info.registered_files == 0 {
            return None;
        }
        if let Some((index, _)) = self.files.borrow().get(&file_id) {
            return Some(*index);
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
        let uring = self.uring.borrow();
        match uring
            .submitter()
            .register_files_update(index, &[fd.as_raw_fd()])
        {
            Ok(_) => {
                self.files
                    .borrow_mut()
                    .insert(file_id, (index, Arc::downgrade(fd)));
                Some(index)
            }
            Err(e) => {
                self.free_file_indices.borrow_mut().push(index);
                tracing::debug!(error = %e, "file registration failed; using the raw fd");
                None
            }
        }
    }

    /// Unregisters the files whose backends are all gone. Only called when
    /// the SQ and the backlog are empty, so no queued SQE still names a
    /// table slot that could be reused (in-flight ops keep their file: the
    /// kernel holds a reference until they complete).
    fn sweep_files(&self) {
        // Relaxed: a hint that something closed; the Arc counts checked
        // below carry their own synchronisation.
        let closed = crate::backend::file::FILES_CLOSED.load(Ordering::Relaxed);
        if closed == self.files_closed_seen.get() || !self.backlog.borrow().is_empty() {
            return;
        }
        {
            let mut uring = self.uring.borrow_mut();
            if !uring.submission().is_empty() {
                return;
            }
        }
        self.files_closed_seen.set(closed);
        let gone: Vec<(u64, u32)> = self
            .files
            .borrow()
            .iter()
            .filter(|(_, (_, weak))| weak.strong_count() == 0)
            .map(|(&id, &(index, _))| (id, index))
            .collect();
        for (id, index) in gone {
            self.files.borrow_mut().remove(&id);
            let uring = self.uring.borrow();
            match uring.submitter().register_files_update(index, &[-1]) {
                Ok(_) => self.free_file_indices.borrow_mut().push(index),
                Err(e) => tracing::debug!(error = %e, "file unregistration failed"),
            }
        }
    }

    /// Registered files currently in the table.
    pub fn registered_file_count(&self) -> usize {
        self.files.borrow().len()
    }

    /// Queues `entry` (and an optional `preflush` SQE linked ahead of it)
    /// for `handler`/`token`; `file` is kept open until the CQE (so a raw
    /// fd number in a queued SQE can never be closed and reused under it).
    /// Never blocks; never delivers.
    pub(crate) fn push(
        &self,
        entry: squeue::Entry,
        preflush: Option<squeue::Entry>,
        file: Option<Arc<OwnedFd>>,
        handler: HandlerId,
        token: u64,
    ) {
        let index = self.slots.borrow_mut().insert(Slot {
            handler,
            token,
            entry: entry.clone(),
            preflush: preflush.clone(),
            preflush_result: 0,
            _file: file,
        });
        let ud = u64::from(index);
        if let Some(pre) = preflush {
            self.push_sqe(
                pre.flags(squeue::Flags::IO_LINK)
                    .user_data(ud | PREFLUSH_BIT),
            );
        }
        self.push_sqe(entry.user_data(ud));
    }

    fn push_sqe(&self, entry: squeue::Entry) {
        let mut backlog = self.backlog.borrow_mut();
        if backlog.is_empty() && self.try_push_sq(&entry) {
            return;
        }
        backlog.push_back(entry);
        drop(backlog);
        self.stats.borrow_mut().sq_full += 1;
        // SQ full: submit what is there, then move the backlog in.
        if let Err(e) = self.enter_submit_only() {
            tracing::debug!(error = %e, "submit on a full SQ failed; kept in the backlog");
        }
        self.flush_backlog();
    }

    fn try_push_sq(&self, entry: &squeue::Entry) -> bool {
        let mut uring = self.uring.borrow_mut();
        let mut sq = uring.submission();
        // SAFETY: every pointer an SQE carries (buffers, iovecs, timespecs)
        // stays valid until its CQE: buffers by the Backend::submit contract,
        // iovec arrays and the wake buffer are owned by the slot/op or the
        // ring.
        let pushed = unsafe { sq.push(entry) }.is_ok();
        sq.sync();
        pushed
    }

    fn flush_backlog(&self) {
        let mut backlog = self.backlog.borrow_mut();
        while let Some(entry) = backlog.front() {
            if !self.try_push_sq(entry) {
                break;
            }
            backlog.pop_front();
        }
    }

    fn arm_wake(&self) {
        let entry = opcode::Read::new(
            types::Fd(self.unpark.eventfd()),
            self.wake_buf.as_ptr().cast::<u8>(),
            8,
        )
        .build()
        .user_data(WAKE_UD);
        self.wake_armed.set(true);
        self.push_sqe(entry);
    }

    /// Submits what is queued without waiting (`submit_now`).
    pub(crate) fn submit_pending(&self) -> Result<()> {
        for ring in self.cmd_rings().iter().flatten() {
            ring.submit(false, 0)?;
        }
        self.flush_backlog();
        self.enter_submit_only()?;
        self.flush_backlog();
        Ok(())
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
        self.stats.borrow_mut().enters += 1;
        #[cfg(test)]
        if let Some(fault) = self.fault.borrow_mut().as_mut() {
            if let Some(errno) = fault() {
                return Err(io::Error::from_raw_os_error(errno));
            }
        }
        let uring = self.uring.borrow();
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
                let args = types::SubmitArgs::new().timespec(&ts);
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
        let mut uring = self.uring.borrow_mut();
        let to_submit = uring.submission().len() as u32;
        // SAFETY: no argument pointer is passed; the SQEs being submitted
        // point to memory kept valid until their CQEs (see try_push_sq).
        unsafe {
            uring
                .submitter()
                .enter::<libc::sigset_t>(to_submit, 0, IORING_ENTER_GETEVENTS, None)
        }
        .map(drop)
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
        if !self.backlog.borrow().is_empty() || !self.try_push_sq(&entry) {
            // No room for the timeout: submit without waiting.
            return self.uring.borrow().submitter().submit().map(drop);
        }
        // The kernel copies `ts` while preparing the SQE, inside this enter.
        self.uring
            .borrow()
            .submitter()
            .submit_and_wait(want)
            .map(drop)
    }

    /// Submits what is queued and waits up to `timeout` (`None`: until an
    /// event) for completions, then delivers them. Handles every transient
    /// push-back. Returns how many completions were delivered.
    pub(crate) fn park(&self, core: &Core, timeout: Option<Duration>) -> Result<usize> {
        self.flush_backlog();
        let cmd_busy = self.cmd_before_enter()?;
        let want = match timeout {
            Some(t) if t.is_zero() => 0,
            _ if cmd_busy => 0,
            _ => 1,
        };
        let mut backoff = Duration::from_micros(10);
        loop {
            if want > 0 && self.has_cqes() {
                // Something is already there: do not block.
                self.enter(0, None).or_else(ignore_transient)?;
                break;
            }
            match self.enter(want, timeout) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    self.stats.borrow_mut().enter_eintr += 1;
                    break;
                }
                Err(e) if is_transient(&e) => {
                    self.stats.borrow_mut().enter_busy += 1;
                    // EAGAIN/EBUSY: the kernel needs us to reap first.
                    if self.reap()? == 0 {
                        std::thread::sleep(backoff);
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                    if want == 0 {
                        break;
                    }
                    if self.reaped_len() > 0 {
                        break;
                    }
                }
                Err(e) => return Err(Error::from_io(&e).with_context("io_uring_enter")),
            }
        }
        // Right after the enter the SQ is normally empty: the moment to
        // release registered files of closed backends.
        self.sweep_files();
        self.reap()?;
        self.cmd_after_enter()?;
        self.flush_backlog();
        Ok(self.deliver(core))
    }

    /// Submits, reaps without waiting, and delivers.
    pub(crate) fn poll_completions(&self, core: &Core) -> Result<usize> {
        self.park(core, Some(Duration::ZERO))
    }

    fn has_cqes(&self) -> bool {
        let mut uring = self.uring.borrow_mut();
        let empty = uring.completion().is_empty();
        !empty
    }

    fn reaped_len(&self) -> usize {
        self.reaped.borrow().len()
    }

    /// Moves every available CQE into the reaped list (flushing CQ overflow
    /// with a GETEVENTS enter), resubmitting `-EAGAIN` ops and re-arming
    /// the wake read. Returns how many CQEs were seen.
    fn reap(&self) -> Result<usize> {
        let mut seen = 0;
        let mut idle_flushes = 0;
        // One vector reused across reaps: no allocation per batch.
        let mut batch = std::mem::take(&mut *self.cqe_scratch.borrow_mut());
        loop {
            batch.clear();
            {
                let mut uring = self.uring.borrow_mut();
                batch.extend(uring.completion());
            }
            seen += batch.len();
            self.stats.borrow_mut().cqes += batch.len() as u64;
            for cqe in &batch {
                #[cfg(test)]
                let res = match self.cqe_fault.borrow_mut().as_mut() {
                    Some(f) => f(cqe.user_data(), cqe.result()),
                    None => cqe.result(),
                };
                #[cfg(not(test))]
                let res = cqe.result();
                self.handle_cqe(cqe.user_data(), res);
            }
            if !self.cq_overflowed() {
                if batch.is_empty() {
                    break;
                }
                continue;
            }
            // Bounded: if flushing makes no progress (the kernel keeps
            // answering EBUSY), leave the rest to the next park.
            idle_flushes = if batch.is_empty() {
                idle_flushes + 1
            } else {
                0
            };
            if idle_flushes > 2 {
                break;
            }
            // IORING_SQ_CQ_OVERFLOW: completions wait in the kernel's
            // overflow list; an enter with GETEVENTS flushes them to the CQ.
            self.stats.borrow_mut().cq_overflow_flushes += 1;
            self.flush_overflow()?;
        }
        if !self.wake_armed.get() {
            self.unpark.rearm();
            self.arm_wake();
        }
        if !self.cmd_wake_armed.get() {
            self.arm_cmd_wake();
        }
        batch.clear();
        *self.cqe_scratch.borrow_mut() = batch;
        Ok(seen)
    }

    fn cq_overflowed(&self) -> bool {
        let mut uring = self.uring.borrow_mut();
        let sq = uring.submission();
        sq.cq_overflow()
    }

    fn flush_overflow(&self) -> Result<()> {
        let uring = self.uring.borrow();
        // SAFETY: an enter with no submissions and no argument touches no
        // user memory.
        let r = unsafe {
            uring
                .submitter()
                .enter::<libc::sigset_t>(0, 0, IORING_ENTER_GETEVENTS, None)
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) if is_transient(&e) => Ok(()),
            Err(e) => Err(Error::from_io(&e).with_context("io_uring_enter(GETEVENTS)")),
        }
    }

    fn handle_cqe(&self, ud: u64, res: i32) {
        match ud {
            WAKE_UD => {
                self.wake_armed.set(false);
                return;
            }
            CMD_WAKE_UD => {
                self.cmd_wake_armed.set(false);
                return;
            }
            TIMEOUT_UD | CANCEL_UD => return,
            _ => {}
        }
        let index = (ud & u64::from(u32::MAX)) as u32;
        if ud & PREFLUSH_BIT != 0 {
            self.slots.borrow_mut().set_preflush_result(index, res);
            return;
        }
        let mut slots = self.slots.borrow_mut();
        let Some(slot) = slots.get(index) else {
            tracing::error!(ud, res, "CQE for an unknown slot");
            return;
        };
        let preflush_failed = slot.preflush_result < 0;
        if res == -libc::EAGAIN
            || (res == -libc::ECANCELED && slot.preflush_result == -libc::EAGAIN)
        {
            // Per-op EAGAIN: resubmit the same op (and its preflush).
            self.stats.borrow_mut().eagain_resubmits += 1;
            let entry = slot.entry.clone();
            let preflush = slot.preflush.clone();
            slots.reset_preflush(index);
            drop(slots);
            let ud = u64::from(index);
            if let Some(pre) = preflush {
                self.push_sqe(
                    pre.flags(squeue::Flags::IO_LINK)
                        .user_data(ud | PREFLUSH_BIT),
                );
            }
            self.push_sqe(entry.user_data(ud));
            return;
        }
        let Some(slot) = slots.remove(index) else {
            return;
        };
        let result = if res == -libc::ECANCELED && preflush_failed {
            slot.preflush_result
        } else {
            res
        };
        self.reaped.borrow_mut().push(Completion {
            handler: slot.handler,
            token: slot.token,
            result,
        });
    }

    fn deliver(&self, core: &Core) -> usize {
        // Take the list (handlers may push new completions while we
        // deliver), then give its capacity back: no allocation per batch.
        let mut reaped = std::mem::take(&mut *self.reaped.borrow_mut());
        let n = reaped.len();
        for c in reaped.drain(..) {
            core.deliver(c);
        }
        let mut slot = self.reaped.borrow_mut();
        if slot.is_empty() && slot.capacity() < reaped.capacity() {
            *slot = reaped;
        }
        n
    }

    fn cancel_wake(&self) {
        if !self.wake_armed.get() {
            return;
        }
        let cancel = opcode::AsyncCancel::new(WAKE_UD)
            .build()
            .user_data(CANCEL_UD);
        self.push_sqe(cancel);
        for _ in 0..100 {
            if self.enter(1, Some(Duration::from_millis(10))).is_err() {
                break;
            }
            let batch: Vec<cqueue::Entry> = {
                let mut uring = self.uring.borrow_mut();
                let cq = uring.completion();
                cq.collect()
            };
            if batch.iter().any(|c| c.user_data() == WAKE_UD) {
                self.wake_armed.set(false);
                return;
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
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
        let n = self.slots.borrow().len();
        if n > 0 {
            tracing::error!(in_flight = n, "ring dropped with ops in flight");
        }
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

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::EINTR)
    )
}

fn ignore_transient(e: io::Error) -> io::Result<()> {
    if is_transient(&e) {
        Ok(())
    } else {
        Err(e)
    }
}

/// The ring of the current thread, if a driver with a ring is installed.
pub(crate) fn current() -> Option<Rc<Ring>> {
    crate::core::with_core(|core| core.ring())
}

impl AsRawFd for Ring {
    fn as_raw_fd(&self) -> RawFd {
        self.uring.borrow().as_raw_fd()
    }
}
