//! Timers: `sleep`, `sleep_until`, `timeout`, `interval`.
//!
//! Each core has one timer queue (`timers`: a min-heap plus a slab of
//! registrations); the core fires every expired timer at the start of each
//! tick and parks its driver no longer than until the nearest deadline, so
//! a timer fires in the first tick that starts after its deadline.
//!
//! # Invariants
//!
//! - Timer futures hold plain data (deadline and registration key), so they
//!   are `Send`; they register with whichever core polls them.

use crate::timers::Registration;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A future that completes at a deadline. Made by [`sleep`] and
/// [`sleep_until`]. `Send` and `Unpin`; it must be polled on a plugio core.
///
/// # Panics
/// Polling it before its deadline off a plugio core (outside a
/// [`crate::Runtime`] or [`crate::LocalExecutor`]) panics.
#[must_use = "futures do nothing unless polled"]
pub struct Sleep {
    deadline: Instant,
    registration: Option<Registration>,
}

/// How far ahead a deadline that does not fit in an [`Instant`] is put:
/// about 100 years, a timer that never fires in a process's life, yet far
/// below any clock's limit, so a park timeout computed from it (up to this
/// long) still fits a kernel timespec.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// `now + duration`, saturating: a sum that overflows [`Instant`] (such as
/// `Duration::MAX`) becomes a deadline [`FAR_FUTURE`] away, a timer that
/// can never fire, instead of the standard library's "overflow when adding
/// duration to instant" panic. Every deadline the executor computes goes
/// through here.
pub(crate) fn deadline_after(now: Instant, duration: Duration) -> Instant {
    now.checked_add(duration.min(FAR_FUTURE))
        // Unreachable on Linux (`Instant` is a timespec of i64 seconds), kept
        // so no platform's narrower clock can panic here.
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 60 * 60)))
        .unwrap_or(now)
}

/// Waits until `duration` has passed (from now). Fires in the first tick of
/// the core that starts after the deadline. A duration too large to add to
/// the clock (`Duration::MAX`) saturates: the sleep never completes.
pub fn sleep(duration: Duration) -> Sleep {
    sleep_until(deadline_after(Instant::now(), duration))
}

/// Waits until `deadline`. A deadline in the past completes at the first
/// poll.
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep {
        deadline,
        registration: None,
    }
}

impl Sleep {
    /// The instant this sleep completes at.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the deadline has passed.
    pub fn is_elapsed(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Moves the deadline (earlier or later); the sleep is pending again if
    /// the new deadline is in the future.
    pub fn reset(&mut self, deadline: Instant) {
        self.deregister();
        self.deadline = deadline;
    }

    fn deregister(&mut self) {
        if let Some(reg) = self.registration.take() {
            crate::core::try_with_current(|core| core.timers.borrow_mut().cancel(reg));
        }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            if crate::coop::poll_proceed(cx).is_pending() {
                return Poll::Pending;
            }
            self.deregister();
            return Poll::Ready(());
        }
        let this = &mut *self;
        let registered = crate::core::try_with_current(|core| {
            let mut timers = core.timers.borrow_mut();
            match this.registration {
                Some(reg) if timers.update_waker(reg, cx.waker()) => {}
                _ => this.registration = Some(timers.register(this.deadline, cx.waker().clone())),
            }
        });
        match registered {
            Some(()) => Poll::Pending,
            None => panic!("plugio Sleep polled outside a plugio core (Runtime or LocalExecutor)"),
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.deregister();
    }
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline)
            .field("registered", &self.registration.is_some())
            .finish()
    }
}

/// The error of a [`timeout`] whose deadline passed first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elapsed(());

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

/// Runs `future` with a time limit: `Ok(output)` if it finishes within
/// `duration`, `Err(Elapsed)` (and the future is dropped) otherwise.
/// Dropping the future stops what it would still do, not what it already
/// started: an IO or file-system op sent to the kernel completes anyway
/// (a write may land, a rename happens; a call of several steps may have
/// done some), so `Elapsed` means "no result", not "not done". The
/// future is polled before the timer, so a future ready at the deadline
/// still wins. A `duration` too large to add to the clock
/// (`Duration::MAX`) saturates: the timeout never elapses.
pub fn timeout<F: Future>(duration: Duration, future: F) -> Timeout<F> {
    Timeout {
        future,
        sleep: sleep(duration),
    }
}

/// The future of [`timeout`].
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Timeout<F> {
    future: F,
    sleep: Sleep,
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning of `future` (never moved out of the
        // pinned `Timeout`); `sleep` is `Unpin` and reached by `&mut`.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: `future` is pinned along with `self` (see above).
        let future = unsafe { Pin::new_unchecked(&mut this.future) };
        if let Poll::Ready(out) = future.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        match Pin::new(&mut this.sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed(()))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Ticks every `period`, starting at once. A tick that is late (the task
/// was busy) completes at once; the next one keeps the schedule
/// (`period` after the late tick's scheduled instant) while that is still
/// ahead, and is `period` after *now* when a whole period was missed: so
/// missed ticks are delayed, never bursted. For example, with a 100 ms
/// period, a tick completed 40 ms late is followed by one 60 ms later; a
/// tick 250 ms late, by one 100 ms later.
///
/// A `period` too large to add to the clock (`Duration::MAX`) saturates:
/// the first tick completes at once and the next never does.
///
/// # Panics
/// If `period` is zero.
pub fn interval(period: Duration) -> Interval {
    assert!(!period.is_zero(), "interval period must be non-zero");
    let now = Instant::now();
    Interval {
        period,
        sleep: sleep_until(now),
    }
}

/// A periodic timer made by [`interval`].
#[derive(Debug)]
pub struct Interval {
    period: Duration,
    sleep: Sleep,
}

impl Interval {
    /// Waits for the next tick; returns its scheduled instant.
    pub async fn tick(&mut self) -> Instant {
        std::future::poll_fn(|cx| self.poll_tick(cx)).await
    }

    /// Polls for the next tick (for hand-written futures).
    pub fn poll_tick(&mut self, cx: &mut Context<'_>) -> Poll<Instant> {
        if Pin::new(&mut self.sleep).poll(cx).is_pending() {
            return Poll::Pending;
        }
        let scheduled = self.sleep.deadline();
        let mut next = deadline_after(scheduled, self.period);
        let now = Instant::now();
        if next <= now {
            next = deadline_after(now, self.period);
        }
        self.sleep.reset(next);
        Poll::Ready(scheduled)
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }
}
