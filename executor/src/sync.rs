//! A small shim over the atomics used by the lock-free handshakes (the remote
//! wake queue, the park gate, and the task state and reference counts), so
//! that `--cfg loom` builds check them with `loom`'s model checker and normal
//! builds use `std`; plus the thread's current core uid, which loom needs
//! per model thread.
//!
//! Invariant: only the types the loom tests exercise come through here; the
//! rest of the crate uses `std::sync` directly.

use std::cell::Cell;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicUsize};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicUsize};

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
