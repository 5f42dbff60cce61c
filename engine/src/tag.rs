//! Tags: a device's request slots, allocated from a lock-free bitmap of
//! `AtomicU64` words, in the manner of the kernel's `sbitmap_queue`
//! (`lib/sbitmap.c`) as blk-mq uses it (`block/blk-mq-tag.c`).
//!
//! Invariants:
//! - A tag in `0..depth` is held by at most one owner at a time: a bit is
//!   taken only by an atomic `fetch_or` / compare-exchange that saw it zero.
//! - Bits per word follow the kernel's shift rule (the largest power of two
//!   `<= depth / 4`, at most 64) unless [`TagOptions::shift`] says otherwise;
//!   the last word holds the remainder. Each word's allocation bits and its
//!   deferred-free bits sit on their own cache lines.
//! - A batch get takes bits from ONE word only and may return fewer than
//!   asked (never zero: a call that takes nothing returns `None`).
//! - A free makes the tag's bit reusable only after the holder's writes to
//!   the request slot (Release on the free, Acquire on the get).
//! - No wakeup is lost: a waiter registers, then retries, then parks; a free
//!   does its bitmap RMW, then reads `ws_active` (see the `wait` module). Exhaustion
//!   makes the IO wait; it never fails it.
//! - Per-core hints and statistics are heuristics: a wrong core index costs
//!   speed (shared cache lines), never correctness.

mod acquire;
mod batch;
mod set;
mod stats;
mod wait;
mod word;

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests;
pub use acquire::Acquire;
pub use batch::{Tag, TagBatch, MAX_BATCH_TAGS};
pub use set::{
    calculate_shift, default_wake_batch, TagError, TagOptions, TagPuts, TagSet, MAX_DEPTH,
    PUT_BATCH_WORDS,
};
pub use stats::TagStats;
pub use wait::{MAX_AUTO_WAKE_BATCH, MAX_WAIT_QUEUES};
