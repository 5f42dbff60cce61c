//! The task state word and every transition of it (tokio's
//! `runtime/task/state.rs` is the model).
//!
//! Each transition is one atomic operation (or one compare-exchange step of
//! a caller's loop) whose result is a `#[must_use]` value saying what the
//! caller now owes: push the task onto the remote queue, drop the output,
//! wake the join waker, fold drop units. The bit meanings and the
//! invariants between them are documented in `raw`; this module only names
//! the operations and keeps each memory ordering next to what it pairs with.
//!
//! # Invariants
//!
//! - Every read-modify-write of the word is in this file; `raw`, `join` and
//!   the core act on the returned values, never on raw bits.
//! - `COMPLETE`, `DETACHED` and `CANCEL_REQUESTED` are never cleared once
//!   set; `JOIN_INTEREST` is never set again once cleared.
//! - `COMPLETE` is set once (`transition_to_complete` asserts it in debug
//!   builds); `JOIN_INTEREST` is cleared once (by the `JoinHandle`'s drop).

use crate::sync::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};

/// A remote wake (or abort, or a cross-core spawn) asks for a poll.
pub(crate) const NOTIFIED: usize = 1;
/// Set once the output slot holds the result (or the task was cancelled).
pub(crate) const COMPLETE: usize = 1 << 1;
/// Set while a `JoinHandle` exists.
pub(crate) const JOIN_INTEREST: usize = 1 << 2;
/// Set by `JoinHandle::abort`.
pub(crate) const CANCEL_REQUESTED: usize = 1 << 3;
/// The task is in the remote queue (or being pushed onto it).
pub(crate) const QUEUED: usize = 1 << 4;
/// The owner core closed; local references count in `refs` now.
pub(crate) const DETACHED: usize = 1 << 5;
/// One local reference dropped off the owner thread, not yet folded.
const DROP_UNIT: usize = 1 << 8;
/// All pending drop units.
const DROP_MASK: usize = !(DROP_UNIT - 1);

/// The task's atomic state word.
pub(crate) struct State(AtomicUsize);

/// A copy of the state word, read with the ordering its method documents.
#[must_use]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Snapshot(usize);

impl Snapshot {
    pub(crate) fn is_notified(self) -> bool {
        self.0 & NOTIFIED != 0
    }
    pub(crate) fn is_complete(self) -> bool {
        self.0 & COMPLETE != 0
    }
    pub(crate) fn has_join_interest(self) -> bool {
        self.0 & JOIN_INTEREST != 0
    }
    pub(crate) fn is_cancel_requested(self) -> bool {
        self.0 & CANCEL_REQUESTED != 0
    }
    /// `is_notified() || is_complete() || is_cancel_requested()`, in one
    /// test: whether a run must do more than poll (`Core::run_task`).
    pub(crate) fn is_notified_complete_or_cancel_requested(self) -> bool {
        self.0 & (NOTIFIED | COMPLETE | CANCEL_REQUESTED) != 0
    }
    pub(crate) fn is_queued(self) -> bool {
        self.0 & QUEUED != 0
    }
    pub(crate) fn is_detached(self) -> bool {
        self.0 & DETACHED != 0
    }
    /// Local references dropped off the owner thread, not yet folded.
    pub(crate) fn drop_units(self) -> usize {
        self.0 >> DROP_UNIT.trailing_zeros()
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Snapshot({:#x})", self.0)
    }
}

/// What a remote wake (`NOTIFIED | QUEUED` in one RMW) leaves to its caller.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RemoteWake {
    /// This wake turned `QUEUED` on: the caller pushes the task onto its
    /// core's remote queue, with one remote reference for the node.
    Push,
    /// The task already is in the remote queue (or being pushed): that node
    /// serves this wake; the caller pushes nothing.
    AlreadyQueued,
}

/// What publishing `COMPLETE` leaves to the thread that wrote the output.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Completed {
    /// A `JoinHandle` exists: it owns the output now; wake its waker.
    NotifyJoin,
    /// No handle (dropped before completion): the completer drops the
    /// output itself.
    DropOutput,
}

/// What dropping the join interest leaves to the `JoinHandle`.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum JoinDropped {
    /// The task completed first: the handle drops the output.
    DropOutput,
    /// The task has not completed: its completer will drop the output.
    NotComplete,
}

/// What an abort request leaves to the `JoinHandle`.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CancelRequest {
    /// The task has not completed: wake it so that its core sees the
    /// request before its next poll.
    WakeTask,
    /// Already complete: nothing to do.
    AlreadyComplete,
}

/// What the owner learns when it takes a task's node off its remote queue.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Adopted {
    /// The node carried a remote wake (`NOTIFIED` was set).
    pub(crate) woken: bool,
    /// The task had completed.
    pub(crate) complete: bool,
    /// Drop units taken (folded into the local count by the caller).
    pub(crate) drop_units: usize,
}

impl State {
    pub(crate) fn new(bits: usize) -> Self {
        Self(AtomicUsize::new(bits))
    }

    /// A new task queued by a cross-core spawn: the queue node and the
    /// `JoinHandle` exist.
    pub(crate) fn new_remote_spawn() -> Self {
        Self::new(NOTIFIED | QUEUED | JOIN_INTEREST)
    }

    /// A new task spawned on its owner thread: only the `JoinHandle`.
    pub(crate) fn new_local_spawn() -> Self {
        Self::new(JOIN_INTEREST)
    }

    /// Loads with Acquire: pairs with the Release (or AcqRel) RMW of a
    /// completion, remote wake, abort or remote drop, so what those threads
    /// wrote before is visible.
    #[inline]
    pub(crate) fn load_acquire(&self) -> Snapshot {
        Snapshot(self.0.load(Acquire))
    }

    /// Loads with Relaxed, for bits that only the calling thread sets (the
    /// owner's own `COMPLETE` and `DETACHED`) or a first guess of a CAS
    /// loop.
    #[inline]
    pub(crate) fn load_relaxed(&self) -> Snapshot {
        Snapshot(self.0.load(Relaxed))
    }

    /// A wake from a thread that is not the owner: sets `NOTIFIED | QUEUED`.
    pub(crate) fn transition_to_notified_remote(&self) -> RemoteWake {
        // AcqRel: Release publishes what the waker wrote before waking to
        // the poll this wake causes (pairs with the owner's Acquire load in
        // `start_run` or its AcqRel RMW in `transition_to_adopted`); Acquire
        // orders us after the RMW that last cleared QUEUED.
        let prev = self.0.fetch_or(NOTIFIED | QUEUED, AcqRel);
        if prev & QUEUED == 0 {
            RemoteWake::Push
        } else {
            RemoteWake::AlreadyQueued
        }
    }

    /// One step of a remote drop of a local reference: from `cur`, adds a
    /// drop unit and sets `QUEUED` (and `NOTIFIED` when `wake`). `Err`
    /// carries the word seen instead (retry, or stop if it shows
    /// `DETACHED`). The caller took the queue node's reference first when
    /// `cur` showed `QUEUED` clear.
    pub(crate) fn try_add_drop_unit(&self, cur: Snapshot, wake: bool) -> Result<(), Snapshot> {
        debug_assert!(!cur.is_detached());
        debug_assert!(cur.0 < DROP_MASK, "drop unit overflow");
        let wake_bits = if wake { NOTIFIED } else { 0 };
        let new = (cur.0 + DROP_UNIT) | QUEUED | wake_bits;
        // AcqRel: Release publishes our uses of the task to the owner's
        // fold, after which it may free it, and (with `wake`) what the waker
        // wrote to the poll it causes (pairs with the AcqRel RMW of
        // `transition_to_adopted` / `transition_to_detached`, the Acquire
        // load of `start_run`); Acquire to see DETACHED.
        self.0
            .compare_exchange_weak(cur.0, new, AcqRel, Acquire)
            .map(drop)
            .map_err(Snapshot)
    }

    /// Before a poll on the owner thread: returns the state to act on
    /// (`COMPLETE`, `CANCEL_REQUESTED`), with `NOTIFIED` cleared if it was
    /// set (that remote wake is served by this poll; its node stays queued
    /// until taken). A plain load unless `NOTIFIED` shows.
    pub(crate) fn start_run(&self) -> Snapshot {
        let state = self.load_for_run();
        if !state.is_notified() {
            return state;
        }
        self.serve_remote_wake()
    }

    /// `start_run`'s load (what it returns when `NOTIFIED` is clear).
    pub(crate) fn load_for_run(&self) -> Snapshot {
        // Acquire: pairs with the Release RMW of a remote wake or abort, so
        // the poll sees what they wrote; a plain load on x86.
        Snapshot(self.0.load(Acquire))
    }

    /// The rest of `start_run` once its load showed `NOTIFIED`: clears it
    /// and returns the state without it.
    pub(crate) fn serve_remote_wake(&self) -> Snapshot {
        // AcqRel: Acquire as `load_for_run`; Release so that the RMW of a
        // later remote wake orders after this clear.
        Snapshot(self.0.fetch_and(!NOTIFIED, AcqRel) & !NOTIFIED)
    }

    /// The owner takes the task's node off its remote queue: clears
    /// `NOTIFIED`, `QUEUED` and the drop units.
    pub(crate) fn transition_to_adopted(&self) -> Adopted {
        // AcqRel: Acquire pairs with the Release RMWs of remote wakes (their
        // writes are visible to the poll) and remote drops (their uses of
        // the task happen before we may free it); Release: a later remote
        // wake that sees QUEUED clear pushes again.
        let prev = Snapshot(self.0.fetch_and(!(NOTIFIED | QUEUED | DROP_MASK), AcqRel));
        debug_assert!(!prev.is_detached() && prev.is_queued(), "{prev:?}");
        Adopted {
            woken: prev.is_notified(),
            complete: prev.is_complete(),
            drop_units: prev.drop_units(),
        }
    }

    /// A node taken off a *closed* core's remote queue: clears `NOTIFIED`
    /// and `QUEUED` (a later wake pushes again and is cancelled by its
    /// pusher). Returns the previous state; pending drop units are zero
    /// there (the close detached every task with local references first).
    pub(crate) fn transition_out_of_closed_queue(&self) -> Snapshot {
        // AcqRel: as in `transition_to_adopted`.
        let prev = Snapshot(self.0.fetch_and(!(NOTIFIED | QUEUED), AcqRel));
        debug_assert!(prev.is_queued() && prev.drop_units() == 0, "{prev:?}");
        prev
    }

    /// The owner core closes: sets `DETACHED` and takes the pending drop
    /// units (returned; each still holds a remote count the caller gives
    /// back). The caller added the remote counts of the local references
    /// just before (Relaxed), which this Release publishes.
    pub(crate) fn transition_to_detached(&self) -> usize {
        // Relaxed: only the first guess of the CAS below.
        let mut state = self.0.load(Relaxed);
        loop {
            let new = (state | DETACHED) & !DROP_MASK;
            // AcqRel: Release publishes the counts the caller added to remote
            // droppers that see DETACHED (their Acquire); Acquire pairs with
            // the Release CAS of remote drops whose units we take. Relaxed on
            // failure: we only retry.
            match self.0.compare_exchange_weak(state, new, AcqRel, Relaxed) {
                Ok(prev) => return Snapshot(prev).drop_units(),
                Err(now) => state = now,
            }
        }
    }

    /// Publishes `COMPLETE` after the output slot was written.
    pub(crate) fn transition_to_complete(&self) -> Completed {
        // AcqRel: Release publishes the output to the JoinHandle (pairs with
        // its Acquire loads); Acquire pairs with the handle's AcqRel drop
        // (`unset_join_interest`) so that, if the handle is gone, we may drop
        // the output ourselves.
        let prev = Snapshot(self.0.fetch_or(COMPLETE, AcqRel));
        debug_assert!(!prev.is_complete(), "completed twice");
        if prev.has_join_interest() {
            Completed::NotifyJoin
        } else {
            Completed::DropOutput
        }
    }

    /// The `JoinHandle` goes away.
    pub(crate) fn unset_join_interest(&self) -> JoinDropped {
        // AcqRel: pairs with the AcqRel RMW of `transition_to_complete`:
        // whichever of the two runs last sees the other and drops the
        // output.
        let prev = Snapshot(self.0.fetch_and(!JOIN_INTEREST, AcqRel));
        debug_assert!(prev.has_join_interest());
        if prev.is_complete() {
            JoinDropped::DropOutput
        } else {
            JoinDropped::NotComplete
        }
    }

    /// `JoinHandle::abort`: sets `CANCEL_REQUESTED`.
    pub(crate) fn request_cancel(&self) -> CancelRequest {
        // AcqRel: Release makes the request visible to the core's Acquire
        // load before the poll (`start_run`); Acquire to see a completed
        // state.
        let prev = Snapshot(self.0.fetch_or(CANCEL_REQUESTED, AcqRel));
        if prev.is_complete() {
            CancelRequest::AlreadyComplete
        } else {
            CancelRequest::WakeTask
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn remote_wake_pushes_once_until_adopted() {
        let s = State::new_local_spawn();
        assert_eq!(s.transition_to_notified_remote(), RemoteWake::Push);
        assert_eq!(s.transition_to_notified_remote(), RemoteWake::AlreadyQueued);
        let adopted = s.transition_to_adopted();
        assert!(adopted.woken && !adopted.complete && adopted.drop_units == 0);
        assert_eq!(s.transition_to_notified_remote(), RemoteWake::Push);
    }

    #[test]
    fn start_run_serves_a_visible_remote_wake() {
        let s = State::new_local_spawn();
        assert_eq!(s.transition_to_notified_remote(), RemoteWake::Push);
        let run = s.start_run();
        assert!(!run.is_notified() && run.is_queued());
        // The node is still queued; taking it later finds no wake left to
        // serve (the poll served it), and leaves only the join interest.
        assert!(!s.transition_to_adopted().woken);
        assert_eq!(s.load_relaxed(), Snapshot(JOIN_INTEREST));
    }

    #[test]
    fn whoever_goes_last_of_complete_and_join_drop_drops_the_output() {
        let s = State::new_local_spawn();
        assert_eq!(s.transition_to_complete(), Completed::NotifyJoin);
        assert_eq!(s.unset_join_interest(), JoinDropped::DropOutput);

        let s = State::new_local_spawn();
        assert_eq!(s.unset_join_interest(), JoinDropped::NotComplete);
        assert_eq!(s.transition_to_complete(), Completed::DropOutput);
    }

    #[test]
    fn abort_after_completion_does_not_wake() {
        let s = State::new_local_spawn();
        assert_eq!(s.request_cancel(), CancelRequest::WakeTask);
        assert!(s.start_run().is_cancel_requested());
        assert_eq!(s.transition_to_complete(), Completed::NotifyJoin);
        assert_eq!(s.request_cancel(), CancelRequest::AlreadyComplete);
    }

    /// Adds one drop unit (retrying a spurious weak-CAS failure).
    fn add_drop_unit(s: &State, wake: bool) {
        while s.try_add_drop_unit(s.load_relaxed(), wake).is_err() {}
    }

    #[test]
    fn drop_units_are_folded_by_adopt_and_taken_by_detach() {
        let s = State::new_local_spawn();
        let before = s.load_relaxed();
        add_drop_unit(&s, false);
        let cur = s.load_relaxed();
        assert!(cur.is_queued() && !cur.is_notified() && cur.drop_units() == 1);
        add_drop_unit(&s, true);
        // A stale `cur` fails and reports the word seen.
        assert_eq!(s.try_add_drop_unit(before, true), Err(s.load_relaxed()));
        let adopted = s.transition_to_adopted();
        assert_eq!(
            adopted,
            Adopted {
                woken: true,
                complete: false,
                drop_units: 2
            }
        );
        add_drop_unit(&s, false);
        assert_eq!(s.transition_to_detached(), 1);
        let now = s.load_relaxed();
        assert!(now.is_detached() && now.drop_units() == 0);
    }
}
