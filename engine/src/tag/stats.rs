//! Per-core allocation hints and tag statistics.
//!
//! Invariants: each core index owns one cache-padded [`CoreSlot`]; its
//! counters are bumped with a relaxed load + store (no locked instruction),
//! so they are exact when each core index is used by one thread at a time and
//! may drop increments when two threads share an index. Nothing here decides
//! correctness, so it uses `std` atomics even under `--cfg loom`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A counter written by (normally) one thread and read by anyone.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Relaxed load + store: a statistic with one writer per core.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        let value = self.0.load(Ordering::Relaxed);
        self.0.store(value.wrapping_add(n), Ordering::Relaxed);
    }

    /// The current value (Relaxed: a statistic).
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One core's allocation hint and counters.
#[derive(Debug, Default)]
pub(crate) struct CoreSlot {
    /// The kernel's per-cpu `alloc_hint`: a tag number in `0..depth`.
    pub(crate) hint: AtomicU32,
    pub(crate) single_calls: Counter,
    pub(crate) single_tags: Counter,
    pub(crate) batch_calls: Counter,
    pub(crate) batch_tags: Counter,
    pub(crate) partial_batches: Counter,
    pub(crate) empty_batches: Counter,
    pub(crate) short_allocs: Counter,
    pub(crate) waits: Counter,
    pub(crate) puts: Counter,
}

impl CoreSlot {
    /// The hint (Relaxed: a heuristic only).
    #[inline]
    pub(crate) fn hint(&self) -> u32 {
        self.hint.load(Ordering::Relaxed)
    }

    /// Stores the hint (Relaxed: a heuristic only).
    #[inline]
    pub(crate) fn set_hint(&self, hint: u32) {
        self.hint.store(hint, Ordering::Relaxed);
    }
}

/// A snapshot of a tag set's counters, summed over cores: the figures the
/// engine shows in iostats. All counts are since the tag set was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TagStats {
    /// Single-tag gets ([`TagSet::get`](super::TagSet::get) calls).
    pub single_calls: u64,
    /// Tags those single gets returned.
    pub single_tags: u64,
    /// Batch gets ([`TagSet::get_batch`](super::TagSet::get_batch) calls,
    /// including each try of the retry loop).
    pub batch_calls: u64,
    /// Tags those batch gets returned.
    pub batch_tags: u64,
    /// Batch gets that returned some tags, but fewer than asked.
    pub partial_batches: u64,
    /// Batch gets that returned no tag.
    pub empty_batches: u64,
    /// [`TagSet::get_tags`](super::TagSet::get_tags) calls that ended with
    /// fewer tags than asked (the bitmap ran dry).
    pub short_allocs: u64,
    /// Times a waiter parked because the bitmap was exhausted.
    pub waits: u64,
    /// Tags freed (single and batch puts).
    pub puts: u64,
}

impl TagStats {
    /// What happened between the snapshot `earlier` and this one: every
    /// field is a count, so each is `self - earlier` (0 if `earlier` is in
    /// fact later).
    ///
    /// ```
    /// use plugio::engine::tag::TagStats;
    ///
    /// let before = TagStats { puts: 10, waits: 1, ..TagStats::default() };
    /// let now = TagStats { puts: 25, waits: 1, ..TagStats::default() };
    /// assert_eq!(now.delta(&before).puts, 15);
    /// assert_eq!(now.delta(&before).waits, 0);
    /// ```
    pub fn delta(&self, earlier: &TagStats) -> TagStats {
        TagStats {
            single_calls: self.single_calls.saturating_sub(earlier.single_calls),
            single_tags: self.single_tags.saturating_sub(earlier.single_tags),
            batch_calls: self.batch_calls.saturating_sub(earlier.batch_calls),
            batch_tags: self.batch_tags.saturating_sub(earlier.batch_tags),
            partial_batches: self.partial_batches.saturating_sub(earlier.partial_batches),
            empty_batches: self.empty_batches.saturating_sub(earlier.empty_batches),
            short_allocs: self.short_allocs.saturating_sub(earlier.short_allocs),
            waits: self.waits.saturating_sub(earlier.waits),
            puts: self.puts.saturating_sub(earlier.puts),
        }
    }

    /// Mean tags per batch get (0.0 before the first batch get).
    pub fn tags_per_batch(&self) -> f64 {
        if self.batch_calls == 0 {
            0.0
        } else {
            self.batch_tags as f64 / self.batch_calls as f64
        }
    }

    /// Adds one core's counters.
    pub(crate) fn add_core(&mut self, slot: &CoreSlot) {
        self.single_calls += slot.single_calls.get();
        self.single_tags += slot.single_tags.get();
        self.batch_calls += slot.batch_calls.get();
        self.batch_tags += slot.batch_tags.get();
        self.partial_batches += slot.partial_batches.get();
        self.empty_batches += slot.empty_batches.get();
        self.short_allocs += slot.short_allocs.get();
        self.waits += slot.waits.get();
        self.puts += slot.puts.get();
    }
}
