//! Cooperative scheduling budget (as in tokio's `coop`).
//!
//! Each time the core polls a task (or the main future) it gives it a
//! budget of `coop_budget` units (default 128, see
//! [`crate::Builder::coop_budget`]). Every plugio resource that is *ready*
//! — a channel send or receive, an elapsed [`crate::time::Sleep`], a
//! finished [`crate::JoinHandle`] — spends one unit through
//! [`poll_proceed`] before it returns `Ready`. When the budget is spent the
//! resource returns `Pending` and wakes the task at once instead, so the
//! task goes to the back of the FIFO run queue and every other ready task
//! runs before it is polled again. A task that loops on always-ready
//! resources therefore cannot starve the core. A resource whose first poll
//! always returns `Pending` needs no budget: the engine's IO future
//! (`BioFuture`) is one (an IO is only plugged on its first poll and
//! completes in a park), so it does not call [`poll_proceed`].

use std::task::{Context, Poll};

/// Spends one unit of the current task's budget. Returns `Pending` (having
/// woken the task, so it is polled again next tick) when the budget is
/// spent; `Ready` otherwise, and always `Ready` off a plugio core.
pub fn poll_proceed(cx: &mut Context<'_>) -> Poll<()> {
    match crate::core::try_with_current(|core| core.consume_budget()) {
        Some(false) => {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
        _ => Poll::Ready(()),
    }
}

/// Whether the current task still has budget (true off a plugio core).
pub fn has_budget_remaining() -> bool {
    crate::core::try_with_current(|core| core.budget_remaining() > 0).unwrap_or(true)
}
