//! The core's passthrough ring: a second io_uring with 128-byte SQEs and
//! 32-byte CQEs (`IORING_SETUP_SQE128 | IORING_SETUP_CQE32`, both required
//! by the NVMe driver for `IORING_OP_URING_CMD`), driven by the core's main
//! [`Ring`](super::Ring) inside the same park. The regular ring stays at 64
//! bytes per SQE.
//!
//! How it is driven (no busy spinning):
//! - Interrupt-driven ring: an eventfd is registered with it
//!   (`IORING_REGISTER_EVENTFD`), and the main ring keeps an 8-byte read of
//!   that eventfd armed. A passthrough CQE signals the eventfd, which
//!   completes the read on the main ring and wakes the core's single
//!   blocking `io_uring_enter`. Each park submits this ring's SQs first (one
//!   extra enter when it has SQEs), and reaps its CQ before and after the
//!   main enter. This ring must not use `DEFER_TASKRUN`: with it, CQEs are
//!   only posted when its own owner enters it, so the eventfd would never
//!   fire while the core sleeps on the main ring; it uses `COOP_TASKRUN`
//!   (task work runs at the core's next syscall, which the main enter is).
//! - Polled ring (`IORING_SETUP_IOPOLL`, for namespaces whose queue has
//!   poll queues): completions only appear when the ring is entered with
//!   `GETEVENTS`, so while it has commands in flight the main ring is
//!   entered without waiting and this ring is polled instead: that is
//!   IOPOLL's trade (a busy core for lower latency), chosen per device.
//!
//! The SQ backlog, the raw enters, the CQ-overflow flush and the reap loop
//! are the generic ring core's (`uring.rs`, shared with the main ring);
//! this file adds the command slots and the result mapping.
//!
//! Invariants:
//! - A slot is occupied from push to its final CQE; user_data is the slot
//!   index; the slot keeps the file and any command payload (the DSM range
//!   list) alive until then.
//! - A CQE's `res` is mapped once, here: 0 becomes the slot's success
//!   result (the byte count for data commands), a positive NVMe status
//!   becomes [`nvme_status_result`], a negative errno stays; `-EAGAIN` is
//!   resubmitted, never delivered.

use std::any::Any;
use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;

use io_uring::{cqueue, squeue, IoUring};

use super::unpark::blocking_eventfd;
use super::uring::{is_retry, RingCore, PREFLUSH_BIT};
use crate::buf::{current_arena, Arena};
use crate::completion::{Completion, HandlerId, Reaped};
use crate::error::{nvme_status_result, Error, ErrorKind, Result};

/// Entries of a passthrough ring's SQ (the CQ gets twice as many).
pub(crate) const CMD_RING_ENTRIES: u32 = 256;

/// One passthrough command in flight.
pub(crate) struct CmdSlot {
    pub handler: HandlerId,
    pub token: u64,
    /// The SQE, kept to resubmit on a per-command `-EAGAIN`.
    pub entry: squeue::Entry128,
    /// The result delivered when the command succeeds (`res == 0`).
    pub ok_result: i32,
    /// A Flush linked ahead of the command (`PREFLUSH`).
    pub preflush: Option<squeue::Entry128>,
    /// The preflush CQE's raw `res` (0 until it arrives).
    pub preflush_result: i32,
    /// The same command without `IORING_URING_CMD_FIXED`, for a command
    /// that uses a registered buffer: resubmitted once if the kernel
    /// refuses the fixed form with `-EINVAL` (kernels or buffer layouts
    /// where passthrough cannot map a registered buffer).
    pub unfixed: Option<squeue::Entry128>,
    /// Memory the command points to that the submitter does not own (the
    /// DSM range list), freed only after the CQE.
    pub _payload: Option<Box<dyn Any>>,
    /// The namespace node the SQE names, held open until the CQE.
    pub _file: Arc<OwnedFd>,
}

/// A passthrough ring (see the module header).
pub struct CmdRing {
    /// The io_uring, its backlog and counters (the generic core shared
    /// with the main ring).
    base: RingCore<squeue::Entry128, cqueue::Entry32>,
    slots: RefCell<Vec<Option<CmdSlot>>>,
    free: RefCell<Vec<u32>>,
    in_flight: std::cell::Cell<usize>,
    /// Registered with the ring; `None` for the polled ring.
    efd: Option<OwnedFd>,
    polled: bool,
    /// The core's arena is registered as fixed buffer 0 (the same index it
    /// has on the main ring), so `IoOp::fixed_buf == Some(0)` is valid here.
    fixed_buffers: std::cell::Cell<bool>,
    /// Commands queued on a registered buffer (`IORING_URING_CMD_FIXED`):
    /// this ring's share of `RingStats::fixed_buf_sqes`. Only grows: a
    /// command the kernel refuses in that form and that goes again plain
    /// stays counted (at most the fixed commands queued before the ring's
    /// first refusal, after which it queues none).
    fixed_cmds: std::cell::Cell<u64>,
    _arena: Option<Rc<Arena>>,
}

impl std::fmt::Debug for CmdRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmdRing")
            .field("polled", &self.polled)
            .field("in_flight", &self.in_flight.get())
            .field("fixed_buffers", &self.fixed_buffers.get())
            .finish()
    }
}

fn build_uring(polled: bool) -> Result<IoUring<squeue::Entry128, cqueue::Entry32>> {
    let mut last = None;
    for coop in [true, false] {
        let mut builder = IoUring::<squeue::Entry128, cqueue::Entry32>::builder();
        // Not shared with a forked child (see `fork`).
        builder.dontfork();
        if coop {
            builder.setup_coop_taskrun();
        }
        if polled {
            builder.setup_iopoll();
        }
        match builder.build(CMD_RING_ENTRIES) {
            Ok(uring) => return Ok(uring),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && coop => last = Some(e),
            Err(e) => return Err(setup_error(&e)),
        }
    }
    let e = last.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL));
    Err(setup_error(&e))
}

fn setup_error(e: &io::Error) -> Error {
    if e.raw_os_error() == Some(libc::EINVAL) {
        Error::new(ErrorKind::Unsupported).with_context(
            "this kernel refuses io_uring SQE128/CQE32 rings (NVMe passthrough needs Linux 5.19+); \
             the block device /dev/nvmeXnY still works through the file backend",
        )
    } else {
        Error::from_io(e).with_context("io_uring_setup(SQE128|CQE32)")
    }
}

impl CmdRing {
    /// Builds the ring of the calling core; `polled` adds `IOPOLL`.
    pub(crate) fn new(polled: bool) -> Result<Self> {
        let uring = build_uring(polled)?;
        let efd = if polled {
            None
        } else {
            let efd = blocking_eventfd()?;
            uring
                .submitter()
                .register_eventfd(efd.as_raw_fd())
                .map_err(|e| Error::from_io(&e).with_context("IORING_REGISTER_EVENTFD"))?;
            Some(efd)
        };
        let arena = current_arena().filter(|a| a.stats().registered);
        let fixed_buffers = match &arena {
            Some(a) => {
                // SAFETY: `_arena` keeps the arena's memory alive as long as
                // this ring (and so its registration) exists.
                unsafe { uring.submitter().register_buffers(&[a.iovec()]) }.is_ok()
            }
            None => false,
        };
        Ok(Self {
            base: RingCore::new(uring)
                .map_err(|e| Error::from_io(&e).with_context("mmap of the io_uring CQ"))?,
            slots: RefCell::new(Vec::new()),
            free: RefCell::new(Vec::new()),
            in_flight: std::cell::Cell::new(0),
            efd,
            polled,
            fixed_buffers: std::cell::Cell::new(fixed_buffers),
            fixed_cmds: std::cell::Cell::new(0),
            _arena: arena,
        })
    }

    /// True for the `IOPOLL` ring.
    pub fn is_polled(&self) -> bool {
        self.polled
    }

    /// Commands queued on a registered buffer (see the field).
    pub(crate) fn fixed_cmds(&self) -> u64 {
        self.fixed_cmds.get()
    }

    /// True when registered buffer 0 (the core's arena) can be used with
    /// `IORING_URING_CMD_FIXED`.
    pub fn fixed_buffers(&self) -> bool {
        self.fixed_buffers.get()
    }

    /// Commands pushed and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight.get()
    }

    /// The registered eventfd the main ring watches (interrupt ring only).
    pub(crate) fn eventfd(&self) -> Option<RawFd> {
        self.efd.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Queues a command; it is submitted at the core's next park or
    /// `submit_now`. Never blocks, never delivers.
    pub(crate) fn push(&self, slot: CmdSlot) {
        if slot.unfixed.is_some() {
            // A command on a registered buffer (it has an unfixed form).
            self.fixed_cmds.set(self.fixed_cmds.get() + 1);
        }
        let entry = slot.entry.clone();
        let preflush = slot.preflush.clone();
        let index = {
            let mut slots = self.slots.borrow_mut();
            match self.free.borrow_mut().pop() {
                Some(i) => {
                    slots[i as usize] = Some(slot);
                    i
                }
                None => {
                    slots.push(Some(slot));
                    (slots.len() - 1) as u32
                }
            }
        };
        self.in_flight.set(self.in_flight.get() + 1);
        self.push_linked(index, entry, preflush);
    }

    fn push_linked(&self, index: u32, entry: squeue::Entry128, preflush: Option<squeue::Entry128>) {
        let ud = u64::from(index);
        if let Some(pre) = preflush {
            self.push_sqe(
                pre.flags(squeue::Flags::IO_LINK)
                    .user_data(ud | PREFLUSH_BIT),
            );
        }
        self.push_sqe(entry.user_data(ud));
    }

    fn push_sqe(&self, entry: squeue::Entry128) {
        // A full SQ leaves the rest in the backlog until the next submit
        // (at the core's park or `submit_now`).
        self.base.push(&entry);
    }

    /// Submits the queued SQEs (one enter, only when there are some), then
    /// moves the backlog into the freed SQ space. With `poll`, also polls
    /// for completions (`GETEVENTS`, waiting for `min_complete`).
    pub(crate) fn submit(&self, poll: bool, min_complete: u32) -> Result<()> {
        self.base.flush_backlog();
        if !poll && !self.base.has_pending() {
            return Ok(());
        }
        let min = if poll { min_complete } else { 0 };
        match self.base.enter_raw(true, min, poll) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EBUSY | libc::EINTR | libc::ETIME)
                ) => {}
            Err(e) => {
                return Err(Error::from_io(&e).with_context("io_uring_enter (passthrough ring)"))
            }
        }
        self.base.flush_backlog();
        Ok(())
    }

    /// Moves every available CQE into `out` as a [`Completion`], flushing a
    /// CQ overflow; resubmits `-EAGAIN` commands. Returns how many commands
    /// completed.
    pub(crate) fn reap(&self, out: &mut Reaped) -> Result<usize> {
        let mut done = 0;
        // The CQEs of one pass, handled once the CQ is released (a retry
        // pushes to the SQ).
        let mut batch = Vec::new();
        self.base.reap(
            &mut batch,
            |batch, cq| {
                batch.extend(cq.map(|c| (c.user_data(), c.result())));
                batch.len()
            },
            |batch| {
                for (ud, res) in batch.drain(..) {
                    done += usize::from(self.complete_one(ud, res, out));
                }
            },
            "io_uring_enter (passthrough CQ)",
        )?;
        Ok(done)
    }

    fn complete_one(&self, ud: u64, res: i32, out: &mut Reaped) -> bool {
        let index = ud as u32;
        if ud & PREFLUSH_BIT != 0 {
            if let Some(Some(slot)) = self.slots.borrow_mut().get_mut(index as usize) {
                slot.preflush_result = res;
            }
            return false;
        }
        if let Some((entry, preflush)) = self.retry_of(index, res) {
            self.push_linked(index, entry, preflush);
            return false;
        }
        if let Some(entry) = self.unfixed_retry_of(index, res) {
            self.push_sqe(entry.user_data(ud));
            return false;
        }
        let slot = self
            .slots
            .borrow_mut()
            .get_mut(index as usize)
            .and_then(Option::take);
        let Some(slot) = slot else {
            tracing::error!(ud, res, "passthrough CQE for an unknown slot");
            return false;
        };
        self.free.borrow_mut().push(index);
        self.in_flight.set(self.in_flight.get() - 1);
        // A failed preflush is the op's error (an NVMe status does not
        // break an io_uring link, an errno cancels the op).
        let result = if slot.preflush_result != 0 {
            map_result(slot.preflush_result, 0)
        } else {
            map_result(res, slot.ok_result)
        };
        out.push(Completion {
            handler: slot.handler,
            token: slot.token,
            result,
        });
        true
    }

    /// The unfixed form of a fixed-buffer command the kernel refused with
    /// `-EINVAL`; the ring stops using fixed buffers from then on (logged
    /// once per ring).
    fn unfixed_retry_of(&self, index: u32, res: i32) -> Option<squeue::Entry128> {
        if res != -libc::EINVAL {
            return None;
        }
        let mut slots = self.slots.borrow_mut();
        let slot = slots.get_mut(index as usize)?.as_mut()?;
        let unfixed = slot.unfixed.take()?;
        slot.entry = unfixed.clone();
        if self.fixed_buffers.replace(false) {
            tracing::info!("passthrough refused a registered buffer (EINVAL); using plain buffers on this core");
        }
        Some(unfixed)
    }

    /// The SQEs to resubmit when the command (or its preflush) got a
    /// transient `-EAGAIN`; resets the preflush result.
    fn retry_of(
        &self,
        index: u32,
        res: i32,
    ) -> Option<(squeue::Entry128, Option<squeue::Entry128>)> {
        let mut slots = self.slots.borrow_mut();
        let slot = slots.get_mut(index as usize)?.as_mut()?;
        if !is_retry(res, slot.preflush_result) {
            return None;
        }
        slot.preflush_result = 0;
        Some((slot.entry.clone(), slot.preflush.clone()))
    }
}

/// Maps a passthrough CQE's `res` (see the module header).
pub(crate) fn map_result(res: i32, ok_result: i32) -> i32 {
    match res {
        0 => ok_result,
        r if r > 0 => nvme_status_result(r as u16),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use io_uring::{opcode, types};
    use plugio_executor::Driver;

    use super::*;
    use crate::error::Error;
    use crate::testing::{park_until, RecordingHandler};
    use crate::{register_handler, DeviceDriver, RingConfig};

    #[test]
    fn results_map_to_bytes_statuses_and_errnos() {
        assert_eq!(map_result(0, 4096), 4096);
        assert_eq!(map_result(-libc::EINVAL, 4096), -libc::EINVAL);
        let err = Error::from_errno(map_result(0x4080, 4096));
        assert!(
            matches!(
                err.kind(),
                ErrorKind::Nvme {
                    sct: 0,
                    sc: 0x80,
                    dnr: true,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    /// A driver with a ring, its passthrough ring and a registered
    /// recording handler; `None` where the kernel (or seccomp) refuses
    /// io_uring or SQE128 rings.
    fn setup() -> Option<(DeviceDriver, Rc<CmdRing>, Rc<RecordingHandler>, HandlerId)> {
        let driver = match DeviceDriver::with_ring(&RingConfig::default()) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("skipped: no io_uring here: {e}");
                return None;
            }
        };
        let ring = driver.ring().expect("ring").clone();
        match ring.cmd_ring(false) {
            Ok(cmd) => {
                let handler = Rc::new(RecordingHandler::default());
                let id = register_handler(handler.clone());
                Some((driver, cmd, handler, id))
            }
            Err(e) => {
                eprintln!("skipped: no SQE128/CQE32 rings here: {e}");
                None
            }
        }
    }

    fn null_fd() -> Arc<OwnedFd> {
        Arc::new(OwnedFd::from(
            std::fs::File::open("/dev/null").expect("/dev/null"),
        ))
    }

    fn slot(
        handler: HandlerId,
        token: u64,
        entry: squeue::Entry128,
        payload: Option<Box<dyn Any>>,
    ) -> CmdSlot {
        CmdSlot {
            handler,
            token,
            entry,
            ok_result: token as i32,
            preflush: None,
            preflush_result: 0,
            unfixed: None,
            _payload: payload,
            _file: null_fd(),
        }
    }

    /// Pushes a timeout of `nsec` on `cmd`, completing (`-ETIME`) like a
    /// device command, asynchronously.
    fn push_timeout(cmd: &CmdRing, id: HandlerId, token: u64, nsec: u32) {
        let ts = Box::new(types::Timespec::new().nsec(nsec));
        let entry = opcode::Timeout::new(&*ts).build().into();
        cmd.push(slot(id, token, entry, Some(ts)));
    }

    #[test]
    fn passthrough_completion_wakes_a_blocking_park() {
        let Some((driver, cmd, handler, id)) = setup() else {
            return;
        };
        // A 20 ms timeout completes asynchronously on the passthrough ring,
        // like a device command: only its eventfd can end the main wait.
        push_timeout(&cmd, id, 1, 20_000_000);
        assert_eq!(driver.in_flight(), 1);
        let start = Instant::now();
        let limit = Duration::from_secs(5);
        while handler.total() == 0 && start.elapsed() < limit {
            driver.park(Some(limit)).expect("park");
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "woken by the eventfd, not the park timeout"
        );
        assert_eq!(handler.seen.borrow().get(&1), Some(&(1, -libc::ETIME)));
        assert_eq!(driver.in_flight(), 0);
    }

    #[test]
    fn passthrough_completion_ends_a_park_with_main_ring_ops_in_flight() {
        use crate::ring::tests::SlowReads;
        let Some((driver, cmd, handler, id)) = setup() else {
            return;
        };
        let ring = driver.ring().expect("ring").clone();
        // 31 main-ring reads that stay in flight: without the passthrough
        // command the park would wait for a batch of them.
        let mut slow = SlowReads::new(31);
        slow.push(&ring, id);
        push_timeout(&cmd, id, 1000, 20_000_000);
        while !handler.seen.borrow().contains_key(&1000) {
            driver.park(None).expect("park");
        }
        let (fired, _slow) = slow.finish();
        assert!(!fired, "the passthrough completion did not end the wait");
        assert!(park_until(&driver, Duration::from_secs(10), || handler
            .total()
            == 32));
    }

    #[test]
    fn a_thousand_commands_through_a_full_sq_complete_once() {
        let Some((driver, cmd, handler, id)) = setup() else {
            return;
        };
        for token in 0..1000u64 {
            cmd.push(slot(id, token, opcode::Nop::new().build().into(), None));
        }
        assert!(park_until(&driver, Duration::from_secs(10), || handler
            .total()
            == 1000));
        assert!(handler.duplicates().is_empty());
        for (token, &(_, result)) in handler.seen.borrow().iter() {
            assert_eq!(result, *token as i32, "res 0 delivers the slot's ok_result");
        }
        assert_eq!(cmd.in_flight(), 0);
    }

    #[test]
    fn uring_cmd_results_and_failed_preflush_errors_are_delivered() {
        let Some((driver, cmd, handler, id)) = setup() else {
            return;
        };
        // A regular file has no uring_cmd handler: -EOPNOTSUPP.
        let tmp = tempfile::tempfile().expect("tmp");
        let bad_fd = tmp.as_raw_fd();
        let bad = || opcode::UringCmd80::new(types::Fd(bad_fd), 0).build();
        cmd.push(slot(id, 1, bad(), None));
        // /dev/null answers uring_cmd with 0 (Linux 6.0+): success delivers
        // the slot's ok_result.
        let null = null_fd();
        let ok = opcode::UringCmd80::new(types::Fd(null.as_raw_fd()), 0).build();
        cmd.push(slot(id, 2, ok, None));
        // A NOP behind a failing linked preflush gets the preflush's error.
        let mut linked = slot(id, 3, opcode::Nop::new().build().into(), None);
        linked.preflush = Some(bad());
        cmd.push(linked);
        assert!(park_until(&driver, Duration::from_secs(5), || handler
            .total()
            == 3));
        let seen = handler.seen.borrow();
        assert_eq!(seen[&1], (1, -libc::EOPNOTSUPP));
        // (Kernels before /dev/null grew its uring_cmd hook, 6.0, refuse it
        // like the regular file.)
        assert!(
            seen[&2] == (1, 2) || seen[&2] == (1, -libc::EOPNOTSUPP),
            "{:?}",
            seen[&2]
        );
        assert_eq!(
            seen[&3],
            (1, -libc::EOPNOTSUPP),
            "the preflush error, not -ECANCELED"
        );
    }

    #[test]
    fn driver_drop_waits_for_passthrough_commands() {
        let Some((driver, cmd, handler, id)) = setup() else {
            return;
        };
        push_timeout(&cmd, id, 9, 50_000_000);
        let start = Instant::now();
        drop(driver);
        assert!(start.elapsed() >= Duration::from_millis(40));
        assert_eq!(
            handler.total(),
            1,
            "drained and delivered before drop returned"
        );
    }

    #[test]
    fn polled_ring_builds_without_an_eventfd() {
        match CmdRing::new(true) {
            Ok(ring) => {
                assert!(ring.is_polled() && ring.eventfd().is_none());
            }
            Err(e) => eprintln!("skipped: {e}"),
        }
    }
}
