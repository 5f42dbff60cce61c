//! Waking a ring from another thread: an eventfd whose read is kept armed in
//! the ring.
//!
//! Invariant: `pending` is true from the first `unpark` after a re-arm until
//! the ring reaps the wake CQE and re-arms; while it is true further unparks
//! skip the `write` (the ring is already being woken).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use plugio_executor::Unpark;

use crate::error::{Error, Result};

/// A new eventfd (counter 0, close-on-exec) for an io_uring read to
/// wait on: the wake read of the core's ring, and the passthrough ring's
/// registered eventfd.
///
/// Blocking on purpose: io_uring answers a read of an `O_NONBLOCK` eventfd
/// with `-EAGAIN` instead of arming a poll.
///
/// # Errors
/// `eventfd(2)` failed (`EMFILE`, `ENFILE`, `ENOMEM`).
pub(crate) fn blocking_eventfd() -> Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is checked and owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::from_io(&std::io::Error::last_os_error()).with_context("eventfd"));
    }
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The [`Unpark`] of a ring-backed driver.
#[derive(Debug)]
pub(crate) struct RingUnpark {
    efd: OwnedFd,
    pending: AtomicBool,
}

impl RingUnpark {
    pub fn new() -> Result<Self> {
        Ok(Self {
            efd: blocking_eventfd()?,
            pending: AtomicBool::new(false),
        })
    }

    pub fn eventfd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }

    /// Called by the ring after it reaped the wake CQE, before re-arming.
    pub fn rearm(&self) {
        // AcqRel: the acquire pairs with the release of the unpark's swap,
        // so whatever the waker published before unparking is visible to the
        // core once park returns.
        self.pending.swap(false, Ordering::AcqRel);
    }
}

impl Unpark for RingUnpark {
    fn unpark(&self) {
        // AcqRel: release publishes the caller's prior writes (a queued wake)
        // to the ring's `rearm` swap; acquire orders us after a previous
        // rearm so we do not skip a needed write.
        if self.pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to an eventfd we own.
        let rc = unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if rc != 8 {
            // EAGAIN means the counter is saturated: a wake is pending anyway.
            tracing::trace!("eventfd write returned {rc}");
        }
    }
}
