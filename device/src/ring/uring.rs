//! The ring core both entry sizes share: one io_uring (`IoUring<S, C>`,
//! generic over the SQE and CQE types as in the io-uring crate: 64-byte
//! SQEs and 16-byte CQEs for the core's [`Ring`](super::Ring), SQE128 and
//! CQE32 for the passthrough [`CmdRing`](super::CmdRing)), its SQ backlog,
//! the raw enters, the CQ-overflow flush and the reap loop (which reads
//! the CQ in place through a second mapping of it, [`CqMap`]). The two rings
//! are thin wrappers that add their slots and wait policy; everything here
//! is monomorphized per entry type (no `dyn` per SQE).
//!
//! Invariants:
//! - An SQE goes to the SQ only when the backlog is empty, so SQEs reach
//!   the kernel in push order (a linked preflush stays right ahead of its
//!   op).
//! - The backlog is moved into the SQ in order, as far as the SQ has room,
//!   and never dropped: an entry leaves it only into the SQ.
//! - A CQ overflow (`IORING_SQ_CQ_OVERFLOW`) is flushed by the reap loop
//!   with `GETEVENTS` enters until the CQ is drained, bounded when the
//!   kernel makes no progress (the rest waits for the next reap).
//! - `EAGAIN`/`EBUSY`/`EINTR` from the raw enters here are not errors
//!   ([`is_transient`]): the caller retries at its next park.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;

use io_uring::{cqueue, squeue, IoUring};

use super::cq::{CqMap, Cqes};
use crate::error::{Error, Result};

/// `IORING_ENTER_GETEVENTS` from the uapi header.
pub(crate) const IORING_ENTER_GETEVENTS: u32 = 1;

/// Set in the user_data of a preflush SQE linked ahead of its op (both
/// rings; slot ops use only the low 32 bits for the slot index).
pub(crate) const PREFLUSH_BIT: u64 = 1 << 40;

/// Reap passes in a row that may flush a CQ overflow without reaping a
/// CQE before the rest is left to the next reap.
const IDLE_FLUSHES_MAX: u32 = 2;

/// Counters of a ring: the push-backs it absorbed, the CQEs it reaped and
/// the IO it queued on registered buffers. Each only grows.
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
    /// SQEs queued with a registered-buffer opcode (`READ_FIXED`,
    /// `WRITE_FIXED`, `READV_FIXED`, `WRITEV_FIXED`), and NVMe passthrough
    /// commands queued with `IORING_URING_CMD_FIXED` on the ring's command
    /// rings: IO on a buffer of the core's registered arena. Like every
    /// field here it only grows. A passthrough command the kernel refuses
    /// in the fixed form goes again on plain memory and stays counted; a
    /// command ring queues no fixed command after its first refusal, so
    /// that is at most the fixed commands it had queued by then.
    pub fixed_buf_sqes: u64,
    /// Parks that waited for a batch of more than one CQE with the bound
    /// armed as a kernel timer (see [`BatchWaitTimer`]).
    ///
    /// [`BatchWaitTimer`]: crate::BatchWaitTimer
    pub batch_waits_timed: u64,
    /// Parks that waited for a batch of more than one CQE without a timer
    /// of their own (bounded by `BATCH_WAIT_UNTIMED` or the park timeout).
    pub batch_waits_untimed: u64,
    /// Batches seen late ([`BatchWaitTimer::WhenLate`]): each armed the
    /// bound for at least the next `BATCH_WAITS_BOUNDED` batched waits
    /// (more after late untimed batches in a row).
    ///
    /// [`BatchWaitTimer::WhenLate`]: crate::BatchWaitTimer::WhenLate
    pub late_batches: u64,
}

/// One io_uring with its backlog and counters (see the module header).
pub(crate) struct RingCore<S: squeue::EntryMarker, C: cqueue::EntryMarker> {
    pub uring: RefCell<IoUring<S, C>>,
    /// `uring`'s CQ, mapped again to be read in place by [`Self::reap`].
    cq: CqMap<C>,
    backlog: RefCell<VecDeque<S>>,
    /// The backlog's length, set wherever the backlog changes (`push_backlog`,
    /// `flush_backlog`): each push tests it without the backlog's borrow.
    backlogged: Cell<usize>,
    pub stats: RefCell<RingStats>,
}

impl<S: squeue::EntryMarker, C: cqueue::EntryMarker> RingCore<S, C> {
    /// # Errors
    /// The CQ could not be mapped again ([`CqMap::new`]).
    pub fn new(uring: IoUring<S, C>) -> io::Result<Self> {
        Ok(Self {
            cq: CqMap::new(&uring)?,
            uring: RefCell::new(uring),
            backlog: RefCell::new(VecDeque::new()),
            backlogged: Cell::new(0),
            stats: RefCell::new(RingStats::default()),
        })
    }

    /// Copies `entry` into the SQ, or into the backlog when the SQ is full
    /// (or the backlog is not empty). Returns true when it went to the
    /// backlog (counted in [`RingStats::sq_full`]); the caller decides
    /// whether to submit at once.
    #[inline]
    pub fn push(&self, entry: &S) -> bool {
        debug_assert_eq!(self.backlogged.get(), self.backlog.borrow().len());
        if self.backlogged.get() == 0 && self.try_push_sq(entry) {
            return false;
        }
        self.push_backlog(entry);
        true
    }

    /// The SQ is full (or the backlog not empty): `entry` waits in the
    /// backlog.
    #[cold]
    fn push_backlog(&self, entry: &S) {
        let mut backlog = self.backlog.borrow_mut();
        backlog.push_back(entry.clone());
        self.backlogged.set(backlog.len());
        self.stats.borrow_mut().sq_full += 1;
    }

    /// [`RingCore::push_backlog`] for a burst's push (`Ring::sq_burst`),
    /// which holds the io_uring borrowed: the backlog only.
    #[cold]
    #[inline(never)]
    pub fn push_backlog_burst(&self, entry: &S) {
        self.push_backlog(entry);
    }

    /// Copies `entry` into the SQ if it has room (ignoring the backlog).
    #[inline]
    pub fn try_push_sq(&self, entry: &S) -> bool {
        let mut uring = self.uring.borrow_mut();
        // Dropping `sq` publishes the new tail (one store; no `sync`,
        // which would also load the head again).
        let mut sq = uring.submission();
        // SAFETY: every pointer an SQE carries (buffers, iovecs, timespecs,
        // command payloads) stays valid until its CQE: buffers by the
        // Backend::submit contract, iovec arrays, payloads and eventfd read
        // buffers are owned by the op's slot or the ring.
        unsafe { sq.push(entry) }.is_ok()
    }

    /// Moves the backlog into the SQ, in order, as far as there is room.
    pub fn flush_backlog(&self) {
        let mut backlog = self.backlog.borrow_mut();
        while let Some(entry) = backlog.front() {
            if !self.try_push_sq(entry) {
                break;
            }
            backlog.pop_front();
        }
        self.backlogged.set(backlog.len());
    }

    /// SQEs waiting in the backlog.
    pub fn backlog_len(&self) -> usize {
        debug_assert_eq!(self.backlogged.get(), self.backlog.borrow().len());
        self.backlogged.get()
    }

    /// SQEs in the SQ not yet submitted.
    pub fn sq_len(&self) -> usize {
        self.uring.borrow_mut().submission().len()
    }

    /// True when SQEs wait to be submitted (in the SQ or the backlog).
    pub fn has_pending(&self) -> bool {
        self.sq_len() > 0 || self.backlog_len() > 0
    }

    /// True when CQEs wait in the CQ.
    pub fn has_cqes(&self) -> bool {
        !self.uring.borrow_mut().completion().is_empty()
    }

    /// CQEs waiting in the CQ.
    pub fn cq_len(&self) -> usize {
        self.uring.borrow_mut().completion().len()
    }

    /// `IORING_SQ_CQ_OVERFLOW`: completions wait in the kernel's overflow
    /// list.
    pub fn cq_overflowed(&self) -> bool {
        self.uring.borrow_mut().submission().cq_overflow()
    }

    /// One raw `io_uring_enter` with no argument: submits the SQ when
    /// `submit`, with `GETEVENTS` (waiting for `min_complete` CQEs) when
    /// `getevents`. (The callers count [`RingStats::enters`].)
    pub fn enter_raw(&self, submit: bool, min_complete: u32, getevents: bool) -> io::Result<()> {
        let to_submit = if submit { self.sq_len() as u32 } else { 0 };
        let flags = if getevents { IORING_ENTER_GETEVENTS } else { 0 };
        let uring = self.uring.borrow();
        // SAFETY: no argument pointer is passed; the SQEs being submitted
        // point to memory kept valid until their CQEs (see try_push_sq).
        unsafe {
            uring
                .submitter()
                .enter::<libc::sigset_t>(to_submit, min_complete, flags, None)
        }
        .map(drop)
    }

    /// A `GETEVENTS` enter that moves the kernel's CQ overflow list into
    /// the CQ (transient errnos are not errors: the next reap tries again).
    fn flush_overflow(&self, context: &'static str) -> Result<()> {
        self.stats.borrow_mut().cq_overflow_flushes += 1;
        match self.enter_raw(false, 0, true) {
            Ok(()) => Ok(()),
            Err(e) if is_transient(&e) => Ok(()),
            Err(e) => Err(Error::from_io(&e).with_context(context)),
        }
    }

    /// Drains the CQ: `pass` handles every CQE the CQ holds (and returns
    /// how many), then `after` runs with the CQ released (resubmissions),
    /// both with the caller's `state`;
    /// repeats while CQEs come, flushing a CQ overflow between passes
    /// (`context` names the ring in an error). Returns how many CQEs were
    /// handled, counted in [`RingStats::cqes`].
    #[inline]
    pub fn reap<T>(
        &self,
        state: &mut T,
        mut pass: impl FnMut(&mut T, Cqes<'_, C>) -> usize,
        mut after: impl FnMut(&mut T),
        context: &'static str,
    ) -> Result<usize> {
        let mut seen = 0;
        let mut idle_flushes = 0;
        loop {
            // The io-uring crate's CQ stays borrowed while the pass reads
            // the CQ through `cq` (see `cq`'s invariants).
            let n = {
                let _uring = self.uring.borrow_mut();
                pass(state, self.cq.drain())
            };
            seen += n;
            self.stats.borrow_mut().cqes += n as u64;
            after(state);
            if !self.cq_overflowed() {
                if n == 0 {
                    return Ok(seen);
                }
                continue;
            }
            // Bounded: if flushing makes no progress (the kernel keeps
            // answering EBUSY), leave the rest to the next reap.
            idle_flushes = if n == 0 { idle_flushes + 1 } else { 0 };
            if idle_flushes > IDLE_FLUSHES_MAX {
                return Ok(seen);
            }
            self.flush_overflow(context)?;
        }
    }
}

/// `EAGAIN`, `EBUSY` and `EINTR` from an enter: retried, never an error.
pub(crate) fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::EINTR)
    )
}

/// True when a slot op's CQE (`res`, with its linked preflush's result)
/// asks for the op to be issued again: a per-op `-EAGAIN`, or the op
/// cancelled because its preflush got one.
#[inline]
pub(crate) fn is_retry(res: i32, preflush_result: i32) -> bool {
    res == -libc::EAGAIN || (res == -libc::ECANCELED && preflush_result == -libc::EAGAIN)
}
