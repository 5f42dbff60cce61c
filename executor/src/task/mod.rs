//! Tasks: one allocation per spawned future, holding a header (state,
//! reference counts, remote link, owner core, owner-thread-only local
//! state, join waker), the output slot, and the future.
//!
//! # Invariants
//!
//! - The future is only polled and dropped on its owner core's thread,
//!   except for a task spawned from another thread (`Send` future) that its
//!   core never registered: that one may be cancelled (future dropped) by
//!   whichever thread finds it in a closed core's remote queue.
//! - A task is in the local run queue at most once (`local.notified`, a
//!   plain flag) and in the remote queue at most once (`QUEUED`); a task in
//!   both runs once (the first poll serves both wakes).
//! - The output slot is written once by the owner core before `COMPLETE` is
//!   set (Release). After that it is read only by the holder of the join
//!   interest (the `JoinHandle`), or, when the handle is gone, dropped by
//!   whoever saw both `COMPLETE` and no `JOIN_INTEREST` last.
//! - Reference counting is split (details in `raw`): references held on the
//!   owner thread (run queue, owned slab, wakers cloned there) are counted
//!   in a plain `Cell` that together holds one atomic reference; the
//!   `JoinHandle`, remote queue nodes and wakers cloned elsewhere are
//!   counted atomically. A poll/wake cycle on the owner thread (waker
//!   clone, wake by value or by reference, drop, re-poll) does no locked
//!   atomic operation.
//! - Every change of the atomic state word is a transition of
//!   `state::State`, which returns a `#[must_use]` value naming what the
//!   caller owes (push the task, drop the output, wake the join waker).

mod error;
mod join;
mod raw;
mod state;
pub(crate) use state::Snapshot;

pub use error::{JoinError, TaskPanic};
pub use join::JoinHandle;
pub(crate) use raw::{
    adopt_remote, detach_all, new_local_task, new_task, CoreShared, LocalRef, SHUTDOWN_CANCEL,
    SHUTDOWN_DRAIN, SHUTDOWN_NONE, UNREGISTERED,
};
pub use raw::{clone_waker, drop_contained, wake_all, LocalWake};

#[cfg(all(test, loom))]
pub(crate) use raw::DEALLOCS;

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::{spawn_local, yield_now, LocalExecutor};
    use std::cell::Cell;
    use std::rc::Rc;

    /// Counts drops of task outputs and futures.
    struct Tracked(Rc<Cell<u32>>);

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    #[test]
    fn output_is_dropped_exactly_once_whoever_goes_last() {
        let drops = Rc::new(Cell::new(0));
        let ex = LocalExecutor::new();
        let d = drops.clone();
        ex.run(async move {
            // Handle dropped before completion: the core drops the output.
            let d1 = d.clone();
            drop(spawn_local(async move {
                yield_now().await;
                Tracked(d1)
            }));
            // Handle dropped after completion without awaiting.
            let d2 = d.clone();
            let h = spawn_local(async move { Tracked(d2) });
            yield_now().await;
            yield_now().await;
            assert!(h.is_finished());
            drop(h);
            // Awaited: the caller owns (and here drops) it.
            let d3 = d.clone();
            drop(spawn_local(async move { Tracked(d3) }).await);
        });
        assert_eq!(drops.get(), 3);
    }

    #[test]
    fn future_and_allocation_are_freed_after_completion() {
        let drops = Rc::new(Cell::new(0));
        let weak;
        {
            let ex = LocalExecutor::new();
            let token = Rc::new(());
            weak = Rc::downgrade(&token);
            let d = drops.clone();
            ex.run(async move {
                let guard = Tracked(d);
                spawn_local(async move {
                    let _g = guard;
                    let _t = token;
                    yield_now().await;
                })
                .await
                .expect("join");
            });
        }
        assert_eq!(drops.get(), 1);
        assert!(weak.upgrade().is_none(), "task state leaked");
    }

    #[test]
    fn local_wake_queues_only_an_unqueued_task_of_this_core() {
        use std::cell::RefCell;
        use std::task::{Poll, Waker};

        // Another core's view: no core entered on this thread.
        assert!(crate::LocalWake::current()
            .try_wake(Waker::noop().clone())
            .is_err());
        let ex = LocalExecutor::new();
        ex.run(async move {
            let parked: Rc<RefCell<Option<Waker>>> = Rc::default();
            let polls = Rc::new(Cell::new(0u32));
            let (p, n) = (parked.clone(), polls.clone());
            let h = spawn_local(async move {
                std::future::poll_fn(|cx| {
                    n.set(n.get() + 1);
                    if n.get() == 1 {
                        *p.borrow_mut() = Some(cx.waker().clone());
                        Poll::Pending
                    } else {
                        Poll::Ready(())
                    }
                })
                .await;
            });
            while parked.borrow().is_none() {
                yield_now().await;
            }
            let waker = parked.borrow_mut().take().expect("parked");
            let again = waker.clone();
            let local = crate::LocalWake::current();
            // A foreign waker is given back.
            assert!(local.try_wake(Waker::noop().clone()).is_err());
            assert!(local.try_wake(waker).is_ok());
            // Queued already: given back, to be woken (dropped) later.
            let again = local.try_wake(again).expect_err("queued");
            drop(again);
            h.await.expect("join");
            assert_eq!(polls.get(), 2);
        });
    }

    #[test]
    fn clone_waker_clones_a_local_waker_inline_and_others_as_clone_does() {
        use std::cell::RefCell;
        use std::task::{Poll, Waker};

        let ex = LocalExecutor::new();
        ex.run(async move {
            let parked: Rc<RefCell<Option<Waker>>> = Rc::default();
            let polls = Rc::new(Cell::new(0u32));
            let (p, n) = (parked.clone(), polls.clone());
            let h = spawn_local(async move {
                std::future::poll_fn(|cx| {
                    n.set(n.get() + 1);
                    if n.get() == 1 {
                        *p.borrow_mut() = Some(crate::clone_waker(cx.waker()));
                        assert!(crate::clone_waker(cx.waker()).will_wake(cx.waker()));
                        Poll::Pending
                    } else {
                        Poll::Ready(())
                    }
                })
                .await;
            });
            while parked.borrow().is_none() {
                yield_now().await;
            }
            let waker = parked.borrow_mut().take().expect("parked");
            // Cloned on the owner thread: the same waker, which wakes.
            let again = crate::clone_waker(&waker);
            assert!(again.will_wake(&waker));
            // Off the owner thread: a clone through the vtable.
            let remote = std::thread::scope(|s| {
                s.spawn(|| crate::clone_waker(&waker))
                    .join()
                    .expect("thread")
            });
            assert!(!remote.will_wake(&waker));
            drop(waker);
            again.wake();
            h.await.expect("join");
            assert_eq!(polls.get(), 2);
            // The task completed: its remote reference's wake does nothing.
            remote.wake();
        });
    }

    #[test]
    fn wake_all_wakes_local_and_foreign_wakers_in_order() {
        use std::cell::RefCell;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use std::task::{Poll, Wake, Waker};

        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }

        let count = Arc::new(Count(AtomicUsize::new(0)));
        let foreign = Waker::from(count.clone());
        let ex = LocalExecutor::new();
        ex.run(async move {
            let parked: Rc<RefCell<Vec<Waker>>> = Rc::default();
            let order: Rc<RefCell<Vec<u32>>> = Rc::default();
            let handles: Vec<_> = (0..2)
                .map(|i| {
                    let (parked, order) = (parked.clone(), order.clone());
                    spawn_local(async move {
                        let mut first = true;
                        std::future::poll_fn(|cx| {
                            if std::mem::take(&mut first) {
                                parked.borrow_mut().push(cx.waker().clone());
                                Poll::Pending
                            } else {
                                order.borrow_mut().push(i);
                                Poll::Ready(())
                            }
                        })
                        .await;
                    })
                })
                .collect();
            while parked.borrow().len() < 2 {
                yield_now().await;
            }
            let mut wakers = std::mem::take(&mut *parked.borrow_mut());
            // Task 1 first, a foreign waker, task 0, and task 0 again
            // (already queued: its reference is only dropped).
            wakers.reverse();
            let again = wakers[1].clone();
            wakers.insert(1, foreign);
            wakers.push(again);
            crate::wake_all(&mut wakers);
            assert!(wakers.is_empty());
            for h in handles {
                h.await.expect("join");
            }
            assert_eq!(*order.borrow(), [1, 0]);
        });
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
    }
}
