//! One core's timer queue: the data structure behind `time`'s futures.
//!
//! # Mechanism
//!
//! A binary min-heap of `(deadline, sequence, slot)` plus a slab of
//! registrations (waker and sequence). No thread per timer: the core fires
//! every expired timer at the start of each tick (in deadline order, ties
//! in registration order) and parks its driver no longer than until the
//! nearest deadline, so a timer fires in the first tick that starts after
//! its deadline.
//!
//! This module depends on nothing else in the crate: the core owns one
//! queue, and the futures of `time` reach it through the current core.
//!
//! # Invariants
//!
//! - A heap item is live only while the slab slot it names still holds the
//!   same sequence number; cancelled registrations leave stale heap items
//!   that are skipped when they surface and compacted away when they
//!   outnumber live ones.
//! - A registration names the queue (core uid) it was made in; a queue
//!   ignores registrations of another.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::task::Waker;
use std::time::Instant;

/// A timer registration's key in a core's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Registration {
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

    pub(crate) fn register(&mut self, deadline: Instant, waker: Waker) -> Registration {
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
    pub(crate) fn update_waker(&mut self, reg: Registration, waker: &Waker) -> bool {
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

    pub(crate) fn cancel(&mut self, reg: Registration) {
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::Duration;

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
