//! Timers: `sleep`, `sleep_until`, `timeout`, `interval`.
//!
//! # Mechanism
//!
//! Each core has one timer queue: a binary min-heap of
//! `(deadline, sequence, slot)` plus a slab of registrations (waker and
//! sequence). No thread per timer: the core fires every expired timer at the
//! start of each tick (in deadline order, ties in registration order) and
//! parks its driver no longer than until the nearest deadline, so a timer
//! fires in the first tick that starts after its deadline.
//!
//! # Invariants
//!
//! - A heap item is live only while the slab slot it names still holds the
//!   same sequence number; cancelled registrations leave stale heap items
//!   that are skipped when they surface and compacted away when they
//!   outnumber live ones.
//! - Timer futures hold plain data (deadline and registration key), so they
//!   are `Send`; they register with whichever core polls them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// A timer registration's key in a core's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Registration {
    core_uid: u64,
    slot: usize,
    seq: u64,
}

struct Entry {
    seq: u64,
    waker: Option<Waker>,
}

/// One core's timers.
pub(crate) struct TimerQueue {
    core_uid: u64,
    heap: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    entries: Vec<Option<Entry>>,
    free: Vec<usize>,
    live: usize,
    next_seq: u64,
}

impl TimerQueue {
    pub(crate) fn new(core_uid: u64) -> Self {
        Self {
            core_uid,
            heap: BinaryHeap::new(),
            entries: Vec::new(),
            free: Vec::new(),
            live: 0,
            next_seq: 0,
        }
    }

    fn register(&mut self, deadline: Instant, waker: Waker) -> Registration {
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.entries.push(None);
                self.entries.len() - 1
            }
        };
        self.entries[slot] = Some(Entry {
            seq,
            waker: Some(waker),
        });
        self.live += 1;
        self.heap.push(Reverse((deadline, seq, slot)));
        if self.heap.len() > 2 * self.live + 64 {
            self.compact();
        }
        Registration {
            core_uid: self.core_uid,
            slot,
            seq,
        }
    }

    fn entry_mut(&mut self, reg: Registration) -> Option<&mut Entry> {
        if reg.core_uid != self.core_uid {
            return None;
        }
        self.entries
            .get_mut(reg.slot)?
            .as_mut()
            .filter(|e| e.seq == reg.seq)
    }

    /// Replaces the waker of a live registration; false if it is gone.
    fn update_waker(&mut self, reg: Registration, waker: &Waker) -> bool {
        match self.entry_mut(reg) {
            Some(entry) => {
                match &entry.waker {
                    Some(w) if w.will_wake(waker) => {}
                    _ => entry.waker = Some(waker.clone()),
                }
                true
            }
            None => false,
        }
    }

    fn cancel(&mut self, reg: Registration) {
        if self.entry_mut(reg).is_some() {
            self.entries[reg.slot] = None;
            self.free.push(reg.slot);
            self.live -= 1;
        }
    }

    fn compact(&mut self) {
        let entries = &self.entries;
        let items = std::mem::take(&mut self.heap).into_vec();
        self.heap = items
            .into_iter()
            .filter(|Reverse((_, seq, slot))| matches!(&entries[*slot], Some(e) if e.seq == *seq))
            .collect();
    }

    /// Removes every registration whose deadline is at or before `now` and
    /// moves its waker into `fired`, in deadline order. Returns how many
    /// fired.
    pub(crate) fn fire_expired(&mut self, now: Instant, fired: &mut Vec<Waker>) -> u64 {
        let mut count = 0;
        while let Some(Reverse((deadline, seq, slot))) = self.heap.peek().copied() {
            if deadline > now {
                break;
            }
            self.heap.pop();
            let live = matches!(&self.entries[slot], Some(e) if e.seq == seq);
            if live {
                if let Some(entry) = self.entries[slot].take() {
                    fired.extend(entry.waker);
                }
                self.free.push(slot);
                self.live -= 1;
                count += 1;
            }
        }
        count
    }

    /// The nearest live deadline, dropping stale heap items on the way.
    pub(crate) fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((deadline, seq, slot))) = self.heap.peek().copied() {
            if matches!(&self.entries[slot], Some(e) if e.seq == seq) {
                return Some(deadline);
            }
            self.heap.pop();
        }
        None
    }

    /// Number of live timers.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn len(&self) -> usize {
        self.live
    }
}

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

/// Waits until `duration` has passed (from now). Fires in the first tick of
/// the core that starts after the deadline.
pub fn sleep(duration: Duration) -> Sleep {
    sleep_until(Instant::now() + duration)
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
/// `duration`, `Err(Elapsed)` (and the future is dropped) otherwise. The
/// future is polled before the timer, so a future ready at the deadline
/// still wins.
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
/// was busy) completes at once and the next one is scheduled `period` after
/// *now*, so missed ticks are delayed, never bursted.
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
        let mut next = scheduled + self.period;
        let now = Instant::now();
        if next <= now {
            next = now + self.period;
        }
        self.sleep.reset(next);
        Poll::Ready(scheduled)
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Counter(AtomicUsize);
    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn fires_in_deadline_order_and_skips_cancelled() {
        let mut q = TimerQueue::new(7);
        let base = Instant::now();
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let late = q.register(base + Duration::from_millis(30), waker.clone());
        let early = q.register(base + Duration::from_millis(10), waker.clone());
        let cancelled = q.register(base + Duration::from_millis(20), waker.clone());
        q.cancel(cancelled);
        assert_eq!(q.len(), 2);
        assert_eq!(q.next_deadline(), Some(base + Duration::from_millis(10)));
        let mut fired = Vec::new();
        assert_eq!(
            q.fire_expired(base + Duration::from_millis(9), &mut fired),
            0
        );
        assert_eq!(
            q.fire_expired(base + Duration::from_millis(25), &mut fired),
            1
        );
        assert!(!q.update_waker(early, &waker));
        assert!(q.update_waker(late, &waker));
        assert_eq!(q.next_deadline(), Some(base + Duration::from_millis(30)));
        assert_eq!(
            q.fire_expired(base + Duration::from_millis(30), &mut fired),
            1
        );
        assert_eq!(fired.len(), 2);
        assert_eq!(q.next_deadline(), None);
        fired.into_iter().for_each(Waker::wake);
        assert_eq!(counter.0.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn stale_items_are_compacted() {
        let mut q = TimerQueue::new(1);
        let waker = Waker::from(Arc::new(Counter(AtomicUsize::new(0))));
        let far = Instant::now() + Duration::from_secs(3600);
        for _ in 0..10_000 {
            let r = q.register(far, waker.clone());
            q.cancel(r);
        }
        assert!(q.heap.len() <= 2 * q.live + 65);
        assert_eq!(q.len(), 0);
        assert_eq!(q.next_deadline(), None);
    }

    #[test]
    fn foreign_registration_is_ignored() {
        let mut a = TimerQueue::new(1);
        let mut b = TimerQueue::new(2);
        let waker = Waker::from(Arc::new(Counter(AtomicUsize::new(0))));
        let r = a.register(Instant::now(), waker.clone());
        assert!(!b.update_waker(r, &waker));
        b.cancel(r);
        assert_eq!(a.len(), 1);
    }
}
