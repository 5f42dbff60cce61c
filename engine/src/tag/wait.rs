//! Waiters for tags and their batched wakeups (the kernel's `sbq_wait_state`
//! array, `ws_active`, and the single per-bitmap `completion_cnt` /
//! `wakeup_cnt` counting of "sbitmap: Use single per-bitmap counting to wake
//! up queued tags", 2022).
//!
//! Invariants:
//! - `ws_active` counts waiters that are registered (their entry is queued,
//!   or it was popped by a wake and they have not finished yet). A free reads
//!   it once and does nothing more when it is zero.
//! - A waiter increments `ws_active` (SeqCst) and issues `fence(SeqCst)`
//!   before it retries the allocation; a free does its SeqCst RMW on the
//!   bitmap before it loads `ws_active` (SeqCst). So either the retry sees
//!   the freed bit, or the free sees the waiter and counts a completion.
//! - `completion_cnt` and `wakeup_cnt` only grow (wrapping); whoever moves
//!   `wakeup_cnt` forward by `wake_batch` wakes `wake_batch` waiters. Frees
//!   loop while `completion_cnt - wakeup_cnt >= wake_batch` (a signed
//!   difference: `wakeup_cnt` may run ahead of a stale read), so no full
//!   batch of credit is left unspent.
//! - Liveness: a waiter parks only after a retry that found every tag held,
//!   so at least `depth >= wake_batch` frees follow its registration, as long
//!   as holders free their tags (the engine holds tags only for IO in
//!   flight). Tags held forever can strand waiters, as in the kernel.
//! - A waiter whose entry was popped and that then finishes (gets tags or is
//!   dropped) hands one wakeup on, so a wake never dies with a task that no
//!   longer needs it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, AtomicUsize as StdAtomicUsize, Ordering};
use std::sync::PoisonError;
use std::task::Waker;

use crate::sync::{fence, AtomicUsize, Mutex, MutexGuard};

/// The kernel's `SBQ_WAIT_QUEUES`: the most wait queues a tag set has.
pub const MAX_WAIT_QUEUES: usize = 8;

/// The kernel's `SBQ_WAKE_BATCH`: the largest automatic wake batch.
pub const MAX_AUTO_WAKE_BATCH: u32 = 8;

/// One parked task.
#[derive(Debug)]
struct WaitEntry {
    id: u64,
    waker: Waker,
}

/// Where a registered waiter's entry lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitSlot {
    queue: usize,
    id: u64,
}

/// The wait side of a tag set.
#[derive(Debug)]
pub(crate) struct WaitQueues {
    ws_active: AtomicUsize,
    completion_cnt: AtomicUsize,
    wakeup_cnt: AtomicUsize,
    /// Next queue a wake round looks at first (fairness only).
    wake_index: StdAtomicUsize,
    /// Next queue a new waiter goes to (spreading only).
    wait_index: StdAtomicUsize,
    next_id: StdAtomicU64,
    queues: Box<[Mutex<VecDeque<WaitEntry>>]>,
    wake_batch: usize,
}

impl WaitQueues {
    /// `nr_queues` in `1..=MAX_WAIT_QUEUES`, `wake_batch >= 1` (checked by
    /// the caller).
    pub(crate) fn new(nr_queues: usize, wake_batch: u32) -> Self {
        Self {
            ws_active: AtomicUsize::new(0),
            completion_cnt: AtomicUsize::new(0),
            wakeup_cnt: AtomicUsize::new(0),
            wake_index: StdAtomicUsize::new(0),
            wait_index: StdAtomicUsize::new(0),
            next_id: StdAtomicU64::new(0),
            queues: (0..nr_queues)
                .map(|_| Mutex::new(VecDeque::new()))
                .collect(),
            wake_batch: wake_batch as usize,
        }
    }

    /// The wake batch in tags.
    pub(crate) fn wake_batch(&self) -> usize {
        self.wake_batch
    }

    /// `sbitmap_queue_wake_up(sbq, nr)`: called after `nr` tags were freed
    /// with a SeqCst RMW. Returns the number of waiters woken.
    pub(crate) fn wake_up(&self, nr: usize) -> usize {
        crate::sync::seqcst_fence_for_loom();
        // SeqCst: the load half of the handshake with `register` (see the
        // module invariants).
        if self.ws_active.load(Ordering::SeqCst) == 0 {
            return 0;
        }
        // AcqRel: the RMWs on the counter are totally ordered, so the last
        // adder's loads below see the whole sum.
        self.completion_cnt.fetch_add(nr, Ordering::AcqRel);
        // Acquire: pairs with the AcqRel CAS below in other freers.
        let mut wakeups = self.wakeup_cnt.load(Ordering::Acquire);
        let mut woken = 0;
        loop {
            // Acquire: pairs with other freers' AcqRel fetch_add; reads at
            // least our own addition (coherence after our RMW).
            let completions = self.completion_cnt.load(Ordering::Acquire);
            // Signed: another freer may already have spent credit we have
            // not seen yet (wakeups ahead of our completions): then it owns
            // the wakeups and we stop, as the kernel's signed `atomic_t`
            // difference does.
            let pending = completions.wrapping_sub(wakeups) as isize;
            if pending < self.wake_batch as isize {
                break;
            }
            let next = wakeups.wrapping_add(self.wake_batch);
            // AcqRel: whoever moves the counter owns this batch of wakeups.
            match self.wakeup_cnt.compare_exchange(
                wakeups,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    woken += self.wake_nr(self.wake_batch);
                    wakeups = next;
                }
                Err(current) => wakeups = current,
            }
        }
        woken
    }

    /// `__sbitmap_queue_wake_up`: wakes up to `nr` waiters, walking the
    /// queues from `wake_index` and advancing it before each queue. Returns
    /// how many were woken.
    pub(crate) fn wake_nr(&self, nr: usize) -> usize {
        let nr_queues = self.queues.len();
        let mut woken = 0;
        for _ in 0..nr_queues {
            if woken == nr {
                break;
            }
            // Relaxed: a fairness rotor, no data depends on it.
            let index = self.wake_index.fetch_add(1, Ordering::Relaxed) % nr_queues;
            while woken < nr {
                let entry = self.lock(index).pop_front();
                match entry {
                    Some(entry) => {
                        entry.waker.wake();
                        woken += 1;
                    }
                    None => break,
                }
            }
        }
        woken
    }

    /// Wakes every queued waiter (`sbitmap_queue_wake_all`).
    pub(crate) fn wake_all(&self) -> usize {
        let mut woken = 0;
        for index in 0..self.queues.len() {
            let entries: Vec<WaitEntry> = self.lock(index).drain(..).collect();
            woken += entries.len();
            entries.into_iter().for_each(|entry| entry.waker.wake());
        }
        woken
    }

    /// Queues (or refreshes) the waiter's entry, then orders the caller's
    /// allocation retry after it (`sbitmap_prepare_to_wait`). The caller must
    /// retry the allocation after this returns.
    pub(crate) fn register(&self, slot: &mut Option<WaitSlot>, waker: &Waker) {
        match *slot {
            Some(existing) => {
                let mut queue = self.lock(existing.queue);
                match queue.iter_mut().find(|entry| entry.id == existing.id) {
                    Some(entry) => entry.waker.clone_from(waker),
                    None => queue.push_back(WaitEntry {
                        id: existing.id,
                        waker: waker.clone(),
                    }),
                }
            }
            None => {
                // Relaxed: spreading and identity only.
                let queue = self.wait_index.fetch_add(1, Ordering::Relaxed) % self.queues.len();
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                self.lock(queue).push_back(WaitEntry {
                    id,
                    waker: waker.clone(),
                });
                *slot = Some(WaitSlot { queue, id });
                // SeqCst: the store half of the handshake with frees; the
                // entry pushed above is published by the queue lock.
                self.ws_active.fetch_add(1, Ordering::SeqCst);
            }
        }
        // SeqCst fence: orders the registration before the retry's loads of
        // the bitmap (pairs with the frees' SeqCst RMW + SeqCst load).
        fence(Ordering::SeqCst);
    }

    /// Ends a registration (`sbitmap_finish_wait`): removes the entry if it
    /// is still queued, and hands one wakeup on when it had been popped.
    pub(crate) fn finish(&self, slot: &mut Option<WaitSlot>) {
        let Some(existing) = slot.take() else {
            return;
        };
        let was_queued = {
            let mut queue = self.lock(existing.queue);
            match queue.iter().position(|entry| entry.id == existing.id) {
                Some(position) => {
                    queue.remove(position);
                    true
                }
                None => false,
            }
        };
        // AcqRel: pairs with the SeqCst increment in `register`; frees that
        // still see us only count a completion, which is harmless.
        self.ws_active.fetch_sub(1, Ordering::AcqRel);
        if !was_queued {
            self.wake_nr(1);
        }
    }

    /// Number of queued (not yet woken) waiters; exact only when quiet.
    pub(crate) fn queued(&self) -> usize {
        (0..self.queues.len())
            .map(|index| self.lock(index).len())
            .sum()
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, VecDeque<WaitEntry>> {
        self.queues[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
