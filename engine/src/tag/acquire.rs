//! [`Acquire`]: the future that waits for tags when the bitmap is exhausted
//! (the async form of `blk_mq_get_tag`'s prepare-to-wait / retry / sleep
//! loop).
//!
//! Invariants: the future holds no tag while it is pending (it only resolves
//! once it holds at least one), so waiters can never deadlock each other
//! over partial batches; it always registers its waker before the retry that
//! precedes `Pending`; and it ends its registration (handing on a wakeup it
//! was given) when it resolves or is dropped.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::batch::{TagBatch, MAX_BATCH_TAGS};
use super::set::TagSet;
use super::wait::WaitSlot;

/// Waits until at least one tag is free, then takes up to `nr` of them.
/// Made by [`TagSet::acquire`].
///
/// Exhaustion makes the IO wait; it never fails it. Polling again after the
/// future resolved starts a new acquisition.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Acquire<'a> {
    set: &'a TagSet,
    core: usize,
    nr: usize,
    slot: Option<WaitSlot>,
}

impl TagSet {
    /// Waits until at least one tag is free, then takes up to `nr` of them
    /// (clamped to `1..=MAX_BATCH_TAGS`) as [`get_tags`](Self::get_tags)
    /// does. The future parks while the bitmap is exhausted and is woken in
    /// batches of [`wake_batch`](Self::wake_batch) frees; it holds no tag
    /// while parked, so waiters never deadlock over partial batches. Callers
    /// that need more tags dispatch what they got and acquire again.
    pub fn acquire(&self, core: usize, nr: usize) -> Acquire<'_> {
        Acquire::new(self, core, nr)
    }
}

impl<'a> Acquire<'a> {
    fn new(set: &'a TagSet, core: usize, nr: usize) -> Self {
        Self {
            set,
            core,
            nr: nr.clamp(1, MAX_BATCH_TAGS),
            slot: None,
        }
    }

    /// Takes tags into `batch`; true if it got any.
    fn try_take(&self, batch: &mut TagBatch) -> bool {
        self.set.get_tags(self.core, self.nr, batch) > 0
    }
}

impl Future for Acquire<'_> {
    type Output = TagBatch;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<TagBatch> {
        let this = self.get_mut();
        let mut batch = TagBatch::new();
        if this.try_take(&mut batch) {
            this.set.waiters.finish(&mut this.slot);
            return Poll::Ready(batch);
        }
        // prepare_to_wait, then retry: a free after this point either is seen
        // by the retry or sees us in `ws_active`.
        this.set.waiters.register(&mut this.slot, cx.waker());
        if this.try_take(&mut batch) {
            this.set.waiters.finish(&mut this.slot);
            return Poll::Ready(batch);
        }
        this.set.core_slot(this.core).waits.add(1);
        Poll::Pending
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        // Removes a queued entry, or hands on a wakeup we were given and
        // will never use.
        self.set.waiters.finish(&mut self.slot);
    }
}
