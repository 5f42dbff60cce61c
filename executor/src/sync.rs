//! A small shim over the atomics used by the lock-free handshakes (the remote
//! wake queue and the park gate), so that `--cfg loom` builds check them
//! with `loom`'s model checker and normal builds use `std`.
//!
//! Invariant: only the types the loom tests exercise come through here; the
//! rest of the crate uses `std::sync` directly.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicPtr};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicPtr};
