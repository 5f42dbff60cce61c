//! The crate's loom facade (tokio's `src/loom/` is the model): the atomics
//! of the lock-free structures, re-exported from `loom` under `--cfg loom`
//! (so the model checker explores their interleavings) and from `std`
//! otherwise.
//!
//! Through here: the buffer cache's return stacks and their `closed` flag
//! (`buf::cache`) and the arena's return stack of chunk indices
//! (`buf::return_stack`).
//!
//! Invariant: every atomic whose interleavings decide correctness in those
//! structures comes through here. Atomics that take part in no handshake
//! (the arena's return counter, a statistic; its registered-buffer index,
//! written and read by the owner thread only) use `std` directly.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64};
