//! [`IoSlots`]: the engine task's IO futures, one slot per IO in flight,
//! allocated once.
//!
//! A `FuturesUnordered` allocates a task per pushed future and keeps a
//! ready queue; here the futures live in a slice made at start (as many
//! slots as fio's `iodepth`), each slot has a waker made once, and a woken
//! slot sets its bit in a bitmap and wakes the engine task. The engine task
//! then polls exactly the woken slots.
//!
//! Invariants:
//! - A future stored in a slot never moves: the slice is allocated once
//!   and never resized, and the future is dropped in place when it
//!   finishes (so polling it through `Pin::new_unchecked` is sound).
//! - A slot is either on the free list or holds a future, never both.
//! - A slot's ready bit is set by its waker (release) and taken with a
//!   swap of its word (acquire) before the slot is polled; a slot whose
//!   future already finished ignores its bit.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

use crate::core::Completion;

/// The bitmap of woken slots and the engine task's waker.
struct Ready {
    bits: Box<[AtomicU64]>,
    task: AtomicWaker,
}

/// The waker of one slot.
struct SlotWake {
    index: usize,
    ready: Arc<Ready>,
}

impl Wake for SlotWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Release: pairs with the Acquire swap in `poll_ready`, so the
        // completion that woke the slot is visible when it is polled.
        self.ready.bits[self.index / 64].fetch_or(1 << (self.index % 64), Ordering::Release);
        self.ready.task.wake();
    }
}

/// The IO futures of one core. `F` resolves to the IO's result (bytes or
/// `-errno`).
pub(crate) struct IoSlots<F> {
    futs: Box<[Option<F>]>,
    cookies: Box<[usize]>,
    wakers: Box<[Waker]>,
    ready: Arc<Ready>,
    free: Vec<usize>,
}

impl<F: Future<Output = i64>> IoSlots<F> {
    /// `capacity` slots (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let ready = Arc::new(Ready {
            bits: (0..capacity.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            task: AtomicWaker::new(),
        });
        let wakers = (0..capacity)
            .map(|index| {
                Waker::from(Arc::new(SlotWake {
                    index,
                    ready: ready.clone(),
                }))
            })
            .collect();
        Self {
            futs: (0..capacity).map(|_| None).collect(),
            cookies: vec![0; capacity].into_boxed_slice(),
            wakers,
            ready,
            // Popped from the back: slot 0 first.
            free: (0..capacity).rev().collect(),
        }
    }

    /// Whether a slot is free.
    pub fn has_free(&self) -> bool {
        !self.free.is_empty()
    }

    /// Futures in the slots.
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.futs.len() - self.free.len()
    }

    /// Registers the engine task's waker: slot wakes wake it.
    pub fn register(&self, task: &Waker) {
        self.ready.task.register(task);
    }

    /// Stores `fut` in a free slot and polls it once (the IO's first poll:
    /// it issues the bio into the plug). Returns its completion when it
    /// finished at once (refused before submission).
    ///
    /// # Panics
    /// When no slot is free (check [`IoSlots::has_free`]).
    ///
    /// `make` builds the future straight into its slot: a future is as
    /// large as its largest state, and moving one that was built
    /// elsewhere copies all of it (a `memcpy` per IO).
    #[inline]
    pub fn start(&mut self, make: impl FnOnce() -> F, cookie: usize) -> Option<Completion> {
        let i = self.free.pop().expect("IoSlots::start with no free slot");
        let slot = &mut self.futs[i];
        debug_assert!(slot.is_none());
        *slot = Some(make());
        self.cookies[i] = cookie;
        self.poll_slot(i)
    }

    /// Polls every slot woken since the last call and pushes the
    /// completions of the finished ones onto `done`.
    pub fn poll_ready(&mut self, done: &mut Vec<Completion>) {
        for w in 0..self.ready.bits.len() {
            // Acquire: pairs with the Release fetch_or of the slot wakers.
            let mut bits = self.ready.bits[w].swap(0, Ordering::Acquire);
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(c) = self.poll_slot(i) {
                    done.push(c);
                }
            }
        }
    }

    fn poll_slot(&mut self, i: usize) -> Option<Completion> {
        let fut = self.futs[i].as_mut()?;
        let mut cx = Context::from_waker(&self.wakers[i]);
        // SAFETY: the future lives in a slice that is never moved or
        // resized, and is dropped in place below (the module invariant).
        let pinned = unsafe { Pin::new_unchecked(fut) };
        match pinned.poll(&mut cx) {
            Poll::Pending => None,
            Poll::Ready(result) => {
                self.futs[i] = None;
                self.free.push(i);
                Some(Completion {
                    cookie: self.cookies[i],
                    result,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A future that is pending until its flag is set, then returns 7.
    struct Gate(Rc<Cell<bool>>, Rc<Cell<Option<Waker>>>);

    impl Future for Gate {
        type Output = i64;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<i64> {
            if self.0.get() {
                Poll::Ready(7)
            } else {
                self.1.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        }
    }

    #[test]
    fn only_woken_slots_are_polled_and_finished_slots_are_reused() {
        let mut slots = IoSlots::new(3);
        let gates: Vec<_> = (0..3)
            .map(|_| (Rc::new(Cell::new(false)), Rc::new(Cell::new(None))))
            .collect();
        for (i, (flag, waker)) in gates.iter().enumerate() {
            assert!(slots
                .start(|| Gate(flag.clone(), waker.clone()), 100 + i)
                .is_none());
        }
        assert!(!slots.has_free());
        assert_eq!(slots.in_flight(), 3);
        // Slot 1 finishes; its waker sets its bit.
        gates[1].0.set(true);
        gates[1].1.take().expect("stored").wake();
        let mut done = Vec::new();
        slots.poll_ready(&mut done);
        assert_eq!(
            done,
            vec![Completion {
                cookie: 101,
                result: 7
            }]
        );
        // Slot 0's flag is set but nothing woke it: it is not polled.
        gates[0].0.set(true);
        done.clear();
        slots.poll_ready(&mut done);
        assert!(done.is_empty());
        // The free slot takes a future that is ready at once.
        let now = Rc::new(Cell::new(true));
        let c = slots.start(|| Gate(now, Rc::new(Cell::new(None))), 9);
        assert_eq!(
            c,
            Some(Completion {
                cookie: 9,
                result: 7
            })
        );
        assert_eq!(slots.in_flight(), 2);
    }

    #[test]
    fn a_slot_wake_wakes_the_registered_task() {
        struct Count(std::sync::atomic::AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let mut slots = IoSlots::new(1);
        slots.register(&Waker::from(count.clone()));
        let (flag, waker) = (Rc::new(Cell::new(false)), Rc::new(Cell::new(None)));
        assert!(slots.start(|| Gate(flag, waker.clone()), 0).is_none());
        waker.take().expect("stored").wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }
}
