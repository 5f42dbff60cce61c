//! The park/unpark seam between the executor and whatever waits for events.
//!
//! # Contract
//!
//! A core's executor owns exactly one [`Driver`]. When no task is ready, the
//! executor calls [`Driver::park`] with the time until the nearest timer (or
//! `None` when there is none). The driver blocks the calling thread until one
//! of these happens:
//!
//! - an event it drives completes (for the io_uring driver: a CQE arrives and
//!   is dispatched, which wakes the task that waits for it);
//! - another thread calls [`Unpark::unpark`] on the handle from
//!   [`Driver::unparker`];
//! - the timeout passes.
//!
//! `park(Some(Duration::ZERO))` must not block: it only collects what is
//! already there (for io_uring: submit queued SQEs and reap CQEs without
//! waiting). This is what the executor calls when a tick-end hook reports
//! pending work.
//!
//! An `unpark` that happens before `park` is entered is never lost: the next
//! `park` returns at once (a token, as with `std::thread::park`).
//!
//! Invariants the executor keeps for the driver:
//! - `park` is only ever called from the core's own thread;
//! - `park` is never called with a blocking timeout while a task is ready, a
//!   remote wake is queued, or a tick-end hook reported pending work.
//!
//! The device layer implements this trait over the core's io_uring (submit and
//! wait in one `io_uring_enter`); [`ThreadDriver`] is the default, which
//! parks the thread on a futex through `std::thread::park_timeout`.

use std::sync::Arc;
use std::time::Duration;

/// Waits for events on one core. See the module documentation for the
/// contract.
pub trait Driver {
    /// Blocks until an event is handled, an unpark arrives, or `timeout`
    /// passes. `None` waits without limit; `Some(Duration::ZERO)` never
    /// blocks.
    ///
    /// # Errors
    /// An unrecoverable error of the underlying mechanism (for io_uring, an
    /// errno other than the transient `EINTR`, `EAGAIN`, `EBUSY`, which the
    /// driver handles itself). The executor logs it and keeps running.
    fn park(&self, timeout: Option<Duration>) -> std::io::Result<()>;

    /// Returns a handle that other threads use to wake this core out of
    /// [`Driver::park`]. Cheap to clone; called once per core at start.
    fn unparker(&self) -> Arc<dyn Unpark>;

    /// Tells the driver which executor core owns it: called once, on the
    /// core's thread, as the core is built around it, with the core's
    /// [`core_uid`](crate::core_uid). A driver whose events only its own
    /// core may consume (the device layer's, which reaps the thread's
    /// io_uring) records it, so that IO polled on another executor of the
    /// same thread is refused instead of waiting for a park that never
    /// comes. A driver that wraps another forwards it. The default does
    /// nothing.
    ///
    /// ```
    /// use std::cell::Cell;
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use plugio::executor::{core_uid, Driver, LocalExecutor, ThreadDriver, Unpark};
    ///
    /// struct Owned(ThreadDriver, Arc<std::sync::Mutex<Option<u64>>>);
    /// impl Driver for Owned {
    ///     fn park(&self, t: Option<Duration>) -> std::io::Result<()> { self.0.park(t) }
    ///     fn unparker(&self) -> Arc<dyn Unpark> { self.0.unparker() }
    ///     fn attach(&self, uid: u64) { *self.1.lock().unwrap() = Some(uid); }
    /// }
    /// let owner = Arc::new(std::sync::Mutex::new(None));
    /// let o = owner.clone();
    /// let ex = LocalExecutor::builder()
    ///     .driver(move |_| Ok(Box::new(Owned(ThreadDriver::new(), o.clone())) as Box<dyn Driver>))
    ///     .build()?;
    /// let uid = ex.run(async { core_uid() });
    /// assert_eq!(*owner.lock().unwrap(), uid);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    fn attach(&self, core_uid: u64) {
        let _ = core_uid;
    }
}

/// Wakes a parked core from any thread.
pub trait Unpark: Send + Sync + 'static {
    /// Makes the current or next [`Driver::park`] of the core return promptly.
    /// Idempotent; safe to call from any thread, including the core's own.
    fn unpark(&self);
}

/// The default driver: parks the thread with `std::thread::park_timeout`
/// (a futex on Linux). It drives no IO; it only sleeps until unparked or
/// until the nearest timer.
#[derive(Debug)]
pub struct ThreadDriver {
    unparker: Arc<ThreadUnpark>,
}

/// The [`Unpark`] of a thread that parks with `std::thread::park_timeout`
/// (a futex on Linux): [`ThreadDriver`]'s, and the device driver's on a
/// thread without an io_uring. `unpark` is `Thread::unpark` (a token, so a
/// wake that comes before the park is not lost).
#[derive(Debug)]
pub struct ThreadUnpark {
    thread: std::thread::Thread,
}

impl ThreadUnpark {
    /// The unparker of the calling thread.
    pub fn current() -> Self {
        Self {
            thread: std::thread::current(),
        }
    }
}

impl Unpark for ThreadUnpark {
    fn unpark(&self) {
        self.thread.unpark();
    }
}

impl ThreadDriver {
    /// Creates a driver bound to the calling thread. Must be called on the
    /// thread that will park.
    pub fn new() -> Self {
        Self {
            unparker: Arc::new(ThreadUnpark::current()),
        }
    }
}

impl Default for ThreadDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl Driver for ThreadDriver {
    fn park(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        match timeout {
            Some(d) if d.is_zero() => {}
            Some(d) => std::thread::park_timeout(d),
            None => std::thread::park(),
        }
        Ok(())
    }

    fn unparker(&self) -> Arc<dyn Unpark> {
        self.unparker.clone()
    }
}
