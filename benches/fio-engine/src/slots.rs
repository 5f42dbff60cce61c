//! [`IoSlots`]: the core's IO futures, one slot per IO in flight,
//! allocated once, and the [`Completion`] each finished one gives.
//!
//! A `FuturesUnordered` allocates a task per pushed future and keeps a
//! ready queue; here the futures live in a slice made at start (as many
//! slots as fio's `iodepth`), each slot has a waker made once, and a woken
//! slot sets its bit in a bitmap and wakes the owner's task (the fio
//! core's doorbell, which only unparks the executor). The owner then polls
//! exactly the woken slots.
//!
//! Invariants:
//! - A future stored in a slot never moves: the slice is allocated once
//!   and never resized, and the future is dropped in place when it
//!   finishes (so polling it through `Pin::new_unchecked` is sound).
//! - A slot is either on the free list or holds a future, never both.
//! - A slot's ready bit is set by its waker and taken with a swap of its
//!   word before the slot is polled; a slot whose future already finished
//!   ignores its bit.
//! - The owner's task is woken once per round, not once per slot: the
//!   first slot wake after [`IoSlots::poll_ready`] cleared `notified`
//!   wakes it, later ones only set their bit (a plain load, no locked
//!   instruction). `poll_ready` registers the task's waker before it
//!   clears `notified`, and clears it before it takes the bits, so a wake
//!   is never lost: a waker either finds `notified` cleared (and wakes the
//!   registered task) or set its bit before the bits are taken (see the
//!   orderings below).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// A finished IO: its cookie (the shim's io_u pointer) and its result,
/// the bytes moved (`>= 0`, short at end of file; a trim's whole length)
/// or a negative errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Completion {
    /// The `cookie` given to [`FioCore::queue`](crate::FioCore::queue).
    pub cookie: usize,
    /// Bytes moved (0 for a sync, the length for a trim), or `-errno`.
    pub result: i64,
}

/// The bitmap of woken slots and the owner's task waker.
struct Ready {
    bits: Box<[AtomicU64]>,
    task: AtomicWaker,
    /// The owner's task was woken since the last `poll_ready` began.
    notified: AtomicBool,
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
        let ready = &self.ready;
        // SeqCst: the bit is published before `notified` is read; pairs
        // with the SeqCst store of `notified` and swap of the bits in
        // `poll_ready` (a store-then-load on each side: with SeqCst at
        // least one side sees the other's write), and as a release it
        // makes the completion that woke the slot visible to its poll.
        ready.bits[self.index / 64].fetch_or(1 << (self.index % 64), Ordering::SeqCst);
        // The plain load first: after the round's first wake the task is
        // already woken, and the slot wake costs no second locked
        // instruction.
        if !ready.notified.load(Ordering::SeqCst) && !ready.notified.swap(true, Ordering::SeqCst) {
            ready.task.wake();
        }
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
            notified: AtomicBool::new(false),
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

    /// Stores the future `make` returns in a free slot and polls it once
    /// (the IO's first poll: it issues the bio into the plug). Returns its
    /// completion when it finished at once (refused before submission).
    ///
    /// `make` builds the future straight into its slot: a future is as
    /// large as its largest state, and moving one that was built
    /// elsewhere copies all of it (a `memcpy` per IO).
    ///
    /// # Panics
    /// When no slot is free (check [`IoSlots::has_free`]).
    #[inline]
    pub fn start(&mut self, make: impl FnOnce() -> F, cookie: usize) -> Option<Completion> {
        let i = self.free.pop().expect("IoSlots::start with no free slot");
        let slot = &mut self.futs[i];
        debug_assert!(slot.is_none());
        *slot = Some(make());
        self.cookies[i] = cookie;
        self.poll_slot(i)
    }

    /// Registers `task` (the owner's task waker: the next slot wake wakes
    /// it), then polls every slot woken since the last call and pushes the
    /// completions of the finished ones onto `done`.
    pub fn poll_ready(&mut self, task: &Waker, done: &mut Vec<Completion>) {
        self.ready.task.register(task);
        // SeqCst: pairs with the slot wakers' SeqCst fetch_or and load (see
        // `SlotWake::wake_by_ref`): a wake after this store wakes `task`.
        self.ready.notified.store(false, Ordering::SeqCst);
        for w in 0..self.ready.bits.len() {
            // SeqCst (an acquire): pairs with the slot wakers' fetch_or.
            let mut bits = self.ready.bits[w].swap(0, Ordering::SeqCst);
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
    use std::sync::atomic::AtomicUsize;

    /// A task waker that counts its wakes.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting_waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

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
        let (_, task) = counting_waker();
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
        slots.poll_ready(&task, &mut done);
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
        slots.poll_ready(&task, &mut done);
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
    fn the_first_slot_wake_of_a_round_wakes_the_task_once() {
        let (count, task) = counting_waker();
        let mut slots = IoSlots::new(3);
        let mut done = Vec::new();
        slots.poll_ready(&task, &mut done);
        let gates: Vec<_> = (0..3)
            .map(|_| (Rc::new(Cell::new(false)), Rc::new(Cell::new(None))))
            .collect();
        for (i, (flag, waker)) in gates.iter().enumerate() {
            assert!(slots
                .start(|| Gate(flag.clone(), waker.clone()), i)
                .is_none());
        }
        // Two slots of one round: the task is woken once.
        for g in &gates[..2] {
            g.0.set(true);
            g.1.take().expect("stored").wake();
        }
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        slots.poll_ready(&task, &mut done);
        assert_eq!(done.len(), 2);
        // A wake after the round began wakes it again.
        gates[2].0.set(true);
        gates[2].1.take().expect("stored").wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        slots.poll_ready(&task, &mut done);
        assert_eq!(done.len(), 3);
    }

    /// Slot wakes from other threads while the task polls: every slot is
    /// polled to completion and no wake is lost (the task would otherwise
    /// wait forever with a bit set).
    #[test]
    fn wakes_from_other_threads_are_never_lost() {
        /// Pending until its flag is set; stores its waker for a thread.
        struct Remote(
            Arc<std::sync::atomic::AtomicBool>,
            Arc<std::sync::Mutex<Option<Waker>>>,
        );
        impl Future for Remote {
            type Output = i64;
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<i64> {
                *self.1.lock().unwrap() = Some(cx.waker().clone());
                if self.0.load(Ordering::SeqCst) {
                    Poll::Ready(1)
                } else {
                    Poll::Pending
                }
            }
        }
        let (count, task) = counting_waker();
        let n = 64;
        for _round in 0..50 {
            let mut slots = IoSlots::new(n);
            let mut done = Vec::new();
            slots.poll_ready(&task, &mut done);
            let remotes: Vec<_> = (0..n)
                .map(|_| {
                    (
                        Arc::new(std::sync::atomic::AtomicBool::new(false)),
                        Arc::new(std::sync::Mutex::new(None)),
                    )
                })
                .collect();
            for (i, (flag, waker)) in remotes.iter().enumerate() {
                assert!(slots
                    .start(|| Remote(flag.clone(), waker.clone()), i)
                    .is_none());
            }
            // Read before the thread starts: its first wake may come at
            // once, and a count read after it would hide that wake.
            let mut seen = count.0.load(Ordering::SeqCst);
            let thread = {
                let remotes = remotes.clone();
                std::thread::spawn(move || {
                    for (flag, waker) in &remotes {
                        flag.store(true, Ordering::SeqCst);
                        let w = waker.lock().unwrap().clone();
                        w.expect("polled once").wake();
                    }
                })
            };
            // The task's loop: poll again only when it was woken.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while done.len() < n {
                let now = count.0.load(Ordering::SeqCst);
                if now != seen {
                    seen = now;
                    slots.poll_ready(&task, &mut done);
                } else {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "a wake was lost: {} of {n} done",
                        done.len()
                    );
                    std::thread::yield_now();
                }
            }
            thread.join().unwrap();
        }
    }
}
