//! Loom models of the task state transitions (`task::state`) and of the
//! core's `closed` flag, on the real core with ticks driven by hand (no
//! parking).
//!
//! Each model names the mutation it was checked against: with the
//! mutation applied locally (then reverted) the model fails. The mutations
//! are plausible bugs of the code it covers, not arbitrary breakage.
//!
//! What shows a failure:
//! - a lost wake or cancellation: an explicit `assert!` after the racing
//!   thread joined and the core ticked (no timing, no bounded loops);
//! - a missing happens-before: the payload is a `loom::cell::UnsafeCell`
//!   written on one thread and read on another, which loom reports as a
//!   causality violation when no release/acquire pair orders the two;
//! - a leak or a double free: the `DEALLOCS` count and drop counters.

use super::*;
use crate::driver::ThreadDriver;
use crate::task::{new_task, DEALLOCS};
use loom::cell::UnsafeCell as LoomCell;
use loom::sync::atomic::{AtomicBool as LoomBool, AtomicUsize as LoomUsize};
use loom::sync::Arc as LoomArc;
use std::sync::atomic::Ordering::Release;
use std::task::Poll;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

fn deallocs() -> usize {
    // Relaxed: read after the model's other threads joined.
    DEALLOCS.load(Relaxed)
}

fn new_core() -> Core {
    Core::new(0, Box::new(ThreadDriver::new()), CoreConfig::default())
}

/// Data one thread writes and another reads, checked by loom's causality
/// tracking; counts its drops.
struct Payload {
    value: LoomCell<u32>,
    drops: LoomArc<LoomUsize>,
}

// SAFETY: every access goes through loom's cell, which checks that the
// accesses are ordered (that is what the models test).
unsafe impl Send for Payload {}
// SAFETY: as above.
unsafe impl Sync for Payload {}

impl Payload {
    fn new(drops: &LoomArc<LoomUsize>) -> Payload {
        Payload {
            value: LoomCell::new(0),
            drops: drops.clone(),
        }
    }

    fn write(&self, v: u32) {
        // SAFETY: loom checks this write against every other access.
        self.value.with_mut(|p| unsafe { *p = v });
    }

    fn read(&self) -> u32 {
        // SAFETY: loom checks this read against every other access.
        self.value.with(|p| unsafe { *p })
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        // The read is what loom checks: the dropping thread must be ordered
        // after the writer.
        let _ = self.read();
        // Relaxed: a count read after the threads joined.
        self.drops.fetch_add(1, Relaxed);
    }
}

/// Polls a `JoinHandle` once with a no-op waker (after the task completed).
fn poll_join<T: Unpin>(h: &mut JoinHandle<T>) -> Poll<Result<T, crate::JoinError>> {
    let mut cx = Context::from_waker(Waker::noop());
    std::pin::Pin::new(h).poll(&mut cx)
}

/// **Wake while running.** The task is queued for its second poll; a
/// remote thread sets a flag and wakes the task (by value, with a waker
/// cloned on the owner) while the owner runs that tick: before the task is
/// taken, while it is polled, or after the poll returned `Pending`. Either
/// the poll saw the flag, or the wake makes the next tick poll the task
/// again.
///
/// Mutation checked (fails: "the wake that arrived while running was
/// lost"): in `Core::run_task`, clearing `NOTIFIED` again after a poll that
/// returned `Pending` (`let _ = task.header().state.start_run();`, the
/// classic "go idle and forget the wake that came during the poll").
#[test]
fn loom_wake_while_running_is_not_lost() {
    model(|| {
        let core = new_core();
        let enter = core.enter();
        let go = LoomArc::new(LoomBool::new(false));
        let stored = Rc::new(RefCell::new(None));
        let (g, st) = (go.clone(), stored.clone());
        let mut polls = 0;
        let h = core.spawn_local(std::future::poll_fn(move |cx| {
            polls += 1;
            if polls == 1 {
                // Keep a waker for the remote thread, and ask for a second
                // poll in the next tick.
                *st.borrow_mut() = Some(cx.waker().clone());
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // Acquire: pairs with the remote thread's Release store.
            if g.load(Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }));
        core.tick();
        let w = stored
            .borrow_mut()
            .take()
            .expect("first poll stored a waker");
        let th = loom::thread::spawn(move || {
            go.store(true, Release);
            w.wake();
        });
        // Races the remote wake: adopt, poll (which may or may not see the
        // flag), and whatever follows a `Pending` poll.
        core.tick();
        th.join().expect("waker thread");
        // The wake is in the remote queue now: one tick takes it and polls.
        core.tick();
        assert!(
            h.is_finished(),
            "the wake that arrived while running was lost"
        );
        drop(h);
        drop(enter);
        drop(core);
        assert_eq!(deallocs(), 1);
    });
}

/// **Wake after complete.** A remote thread wakes the task (by value, with
/// a clone of its waker) while the owner polls it to completion. The late
/// wake may push a node after the task completed: the core must take it,
/// must not poll the completed task, and the task must be freed exactly
/// once.
///
/// Mutation checked (fails on `deallocs() == 1`: the node's reference is
/// leaked): in `task::raw::adopt_remote`, returning early for a completed
/// task (`if adopted.complete { return false; }` before the node's
/// reference is dropped).
#[test]
fn loom_wake_after_complete_frees_once() {
    model(|| {
        let core = new_core();
        let enter = core.enter();
        let remote = Rc::new(RefCell::new(None));
        let r = remote.clone();
        let mut polls = 0;
        let h = core.spawn_local(std::future::poll_fn(move |cx| {
            polls += 1;
            if polls == 1 {
                *r.borrow_mut() = Some(cx.waker().clone());
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(polls)
        }));
        core.tick();
        let w = remote
            .borrow_mut()
            .take()
            .expect("first poll stored a waker");
        let th = loom::thread::spawn(move || w.wake());
        // Completes the task (it woke itself), racing the remote wake.
        core.tick();
        assert!(h.is_finished());
        th.join().expect("waker thread");
        // Takes a late node, if any; the task must not run again.
        core.tick();
        let mut h = h;
        assert!(matches!(poll_join(&mut h), Poll::Ready(Ok(2))));
        drop(h);
        assert_eq!(deallocs(), 1, "freed once the late node was taken");
        drop(enter);
        drop(core);
        assert_eq!(deallocs(), 1);
    });
}

/// **Abort racing completion.** A remote thread aborts the task while the
/// owner polls it to completion. The handle then yields either the output
/// or `Cancelled`; the output is dropped exactly once and the task freed
/// once.
///
/// Mutation checked: in `State::request_cancel`, a load and a store in
/// place of the `fetch_or` (`let prev = load(Acquire); store(prev |
/// CANCEL_REQUESTED, Release)`), which can overwrite bits set in between.
/// It fails on the `debug_assert!` of `State::transition_to_adopted` (the
/// `QUEUED` bit of a pushed node was lost): one reason CI runs loom with
/// debug assertions on.
#[test]
fn loom_abort_racing_completion() {
    model(|| {
        let core = new_core();
        let enter = core.enter();
        let drops = LoomArc::new(LoomUsize::new(0));
        let d = drops.clone();
        let mut polls = 0;
        let h = core.spawn_local(std::future::poll_fn(move |cx| {
            polls += 1;
            if polls == 1 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let p = Payload::new(&d);
            p.write(polls);
            Poll::Ready(p)
        }));
        core.tick();
        let h = LoomArc::new(h);
        let aborter = h.clone();
        let th = loom::thread::spawn(move || aborter.abort());
        core.tick();
        th.join().expect("abort thread");
        // A wake of the abort may still be queued; after it, the task is
        // complete either way.
        core.tick();
        let Ok(mut h) = LoomArc::try_unwrap(h) else {
            panic!("the abort thread joined, so this is the last handle reference")
        };
        assert!(h.is_finished(), "abort and completion both lost COMPLETE");
        // The output (if the poll won) is dropped at the end of its arm.
        let outputs = match poll_join(&mut h) {
            Poll::Ready(Ok(p)) => {
                assert_eq!(p.read(), 2);
                1
            }
            Poll::Ready(Err(e)) => {
                assert!(e.is_cancelled(), "{e:?}");
                0
            }
            Poll::Pending => panic!("finished but pending"),
        };
        drop(h);
        drop(enter);
        drop(core);
        // Relaxed: read after the threads joined.
        assert_eq!(drops.load(Relaxed), outputs, "output dropped once");
        assert_eq!(deallocs(), 1);
    });
}

/// **JoinHandle drop racing the output write.** A remote thread drops the
/// handle while the owner completes the task and writes its output.
/// Whichever goes last drops the output, exactly once, and only after the
/// write is visible to it.
///
/// Mutation checked (fails with a loom causality violation on the
/// payload): in `State::unset_join_interest`, `Release` in place of
/// `AcqRel` (the handle then drops an output whose write it is not ordered
/// after).
#[test]
fn loom_join_handle_drop_racing_output_write() {
    model(|| {
        let core = new_core();
        let enter = core.enter();
        let drops = LoomArc::new(LoomUsize::new(0));
        let d = drops.clone();
        let mut polls = 0;
        let h = core.spawn_local(std::future::poll_fn(move |cx| {
            polls += 1;
            if polls == 1 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let p = Payload::new(&d);
            p.write(9);
            Poll::Ready(p)
        }));
        core.tick();
        let th = loom::thread::spawn(move || drop(h));
        core.tick();
        th.join().expect("dropper thread");
        // Relaxed: read after the threads joined.
        assert_eq!(drops.load(Relaxed), 1, "output dropped once");
        drop(enter);
        drop(core);
        assert_eq!(deallocs(), 1);
    });
}

/// **The `closed` flag.** Another thread spawns a `Send` task onto the core
/// (`Handle::spawn_on`'s path: `new_task` + `push_remote`) while the core
/// closes. Either the close's final drain takes the node, or the pusher
/// sees `closed` and cancels the task itself: the task is never stranded in
/// the queue of a closed core.
///
/// Mutation checked (fails: "stranded in a closed core's queue"): in
/// `CoreShared::push_remote`, no `fence(SeqCst)` between the push and the
/// load of `closed` (the store-buffering pair with `close` then lets both
/// sides miss each other).
#[test]
fn loom_push_racing_close_is_never_stranded() {
    model(|| {
        let core = new_core();
        let shared = core.shared.clone();
        let drops = LoomArc::new(LoomUsize::new(0));
        let d = drops.clone();
        let spawner = loom::thread::spawn(move || {
            let p = Payload::new(&d);
            let (task, join) = new_task(async move { p.read() }, shared.clone());
            shared.push_remote(task);
            JoinHandle::new(join)
        });
        // Close: cancels what it finds, then sets `closed` and drains.
        drop(core);
        let mut h = spawner.join().expect("spawner");
        assert!(h.is_finished(), "stranded in a closed core's queue");
        assert!(matches!(poll_join(&mut h), Poll::Ready(Err(e)) if e.is_cancelled()));
        // Relaxed: read after the threads joined.
        assert_eq!(drops.load(Relaxed), 1, "the future was dropped once");
        drop(h);
        assert_eq!(deallocs(), 1);
    });
}
