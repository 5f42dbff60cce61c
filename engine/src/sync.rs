//! A small shim over the synchronisation types used by the engine's lock-free
//! structures, so that `--cfg loom` builds check them with `loom`'s model
//! checker and normal builds use `std`.
//!
//! Invariants: only the types whose interleavings matter for correctness come
//! through here (tag words, the `cleared` words and their swap locks, the wait
//! counters and wait queues). Heuristics that never decide correctness (per-core
//! allocation hints, statistics counters, fairness indexes) use `std` atomics
//! directly so that loom does not spend its state space on them.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Orders a preceding `SeqCst` read-modify-write before a following `SeqCst`
/// load, for the store-then-load (Dekker) handshakes between a freeing thread
/// and a registering waiter.
///
/// Under the C++20 memory model that Rust uses, a `SeqCst` RMW followed by a
/// `SeqCst` load in one thread, against a `SeqCst` RMW + `fence(SeqCst)` +
/// load in the other, already forbids both loads seeing the old values, so
/// normal builds emit nothing here (on x86 the locked RMW is a full barrier,
/// as the kernel's `smp_mb__after_atomic()` is a no-op there). `loom` does not
/// model `SeqCst` on plain atomic operations (only on fences), so under
/// `--cfg loom` this is a real `fence(SeqCst)`.
#[inline(always)]
pub(crate) fn seqcst_fence_for_loom() {
    #[cfg(loom)]
    fence(std::sync::atomic::Ordering::SeqCst);
}
