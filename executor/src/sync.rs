//! The crate's loom facade (tokio's `src/loom/` is the model): the
//! synchronisation types of every lock-free handshake, re-exported from
//! `loom` under `--cfg loom` (so the model checker explores their
//! interleavings) and from `std` / `futures` otherwise; plus the thread's
//! current core uid, which loom needs per model thread.
//!
//! Through here: the task state word, reference counts and remote link
//! (`task::raw`, `task::state`), the join waker, the remote wake queue and
//! the park gate (`remote`), the core's `closed` flag and the main future's
//! wake flag (`core`).
//!
//! Invariant: every atomic whose interleavings decide correctness comes
//! through here. Atomics that take part in no handshake (statistics, the
//! process-wide core uid counter, the shutdown request, which is followed
//! by an unconditional unpark) use `std::sync` directly, so that loom does
//! not spend its state space on them.

use std::cell::Cell;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicUsize};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicUsize};

/// The join waker's cell (`futures`' `AtomicWaker`, or loom's model of the
/// same protocol), behind one signature.
#[cfg(not(loom))]
pub(crate) use futures::task::AtomicWaker;

/// Loom's `AtomicWaker`, with `futures`' `register(&Waker)` signature.
#[cfg(loom)]
pub(crate) struct AtomicWaker(loom::future::AtomicWaker);

#[cfg(loom)]
impl AtomicWaker {
    pub(crate) fn new() -> Self {
        Self(loom::future::AtomicWaker::new())
    }

    pub(crate) fn register(&self, waker: &std::task::Waker) {
        self.0.register_by_ref(waker);
    }

    pub(crate) fn wake(&self) {
        self.0.wake();
    }
}

#[cfg(not(loom))]
std::thread_local! {
    /// The uid of the core entered on this thread, 0 when none. Constant
    /// initializer and no destructor: reading it is one TLS load.
    static CURRENT_UID: Cell<u64> = const { Cell::new(0) };
}

#[cfg(loom)]
loom::thread_local! {
    static CURRENT_UID: Cell<u64> = Cell::new(0);
}

/// The uid of the core entered on this thread (0 when none).
#[inline]
pub(crate) fn current_uid() -> u64 {
    CURRENT_UID.with(Cell::get)
}

/// Sets the current core uid; returns the previous one.
pub(crate) fn set_current_uid(uid: u64) -> u64 {
    CURRENT_UID.with(|c| c.replace(uid))
}
