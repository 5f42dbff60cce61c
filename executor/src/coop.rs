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

use std::cell::Cell;
use std::ptr;
use std::task::{Context, Poll};

/// The budget of the task the core polls: `coop_budget` units, refilled
/// before each poll. The core holds it; [`Budget::enter`] makes it the
/// thread's current one while the core is entered, so that this module
/// finds it without knowing the core.
///
/// Invariant: [`CURRENT`] is non-null only while a [`BudgetGuard`] borrows
/// the budget it points to (the core's `EnterGuard` holds one), so the
/// pointer is valid and the budget unmoved.
pub(crate) struct Budget(Cell<u32>);

thread_local! {
    /// The budget of the core entered on this thread; null off a core.
    static CURRENT: Cell<*const Budget> = const { Cell::new(ptr::null()) };
}

impl Budget {
    pub(crate) fn new(units: u32) -> Self {
        Budget(Cell::new(units))
    }

    /// Refills the budget to `units` (before each task poll).
    #[inline]
    pub(crate) fn reset(&self, units: u32) {
        self.0.set(units);
    }

    /// Makes this the thread's current budget until the guard drops (which
    /// restores the previous one: cores may be entered inside each other).
    pub(crate) fn enter(&self) -> BudgetGuard<'_> {
        let prev = CURRENT.with(|c| c.replace(self));
        BudgetGuard {
            prev,
            _budget: self,
        }
    }

    /// Spends one unit; false when none is left.
    fn consume(&self) -> bool {
        let left = self.0.get();
        if left == 0 {
            return false;
        }
        self.0.set(left - 1);
        true
    }
}

/// Restores the previous current budget on drop.
pub(crate) struct BudgetGuard<'a> {
    prev: *const Budget,
    _budget: &'a Budget,
}

impl Drop for BudgetGuard<'_> {
    fn drop(&mut self) {
        let prev = self.prev;
        // try_with: the guard may drop during thread teardown.
        let _ = CURRENT.try_with(|c| c.set(prev));
    }
}

/// Runs `f` with the current budget, or returns `None` off a core.
#[inline]
fn with_current<R>(f: impl FnOnce(&Budget) -> R) -> Option<R> {
    let budget = CURRENT.try_with(Cell::get).ok()?;
    if budget.is_null() {
        return None;
    }
    // SAFETY: non-null only while a `BudgetGuard` borrows the budget on
    // this thread (the type's invariant), so it is valid and unmoved.
    Some(f(unsafe { &*budget }))
}

/// Spends one unit of the current task's budget. Returns `Pending` (having
/// woken the task, so it is polled again next tick) when the budget is
/// spent; `Ready` otherwise, and always `Ready` off a plugio core.
pub fn poll_proceed(cx: &mut Context<'_>) -> Poll<()> {
    match with_current(Budget::consume) {
        Some(false) => {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
        _ => Poll::Ready(()),
    }
}

/// Gives back the unit a [`poll_proceed`] that returned `Ready` spent, for
/// a resource that then found itself not ready (an empty channel): only
/// ready polls spend budget, so a task that polls many idle resources is
/// not made to yield and woken again at once, tick after tick (a core
/// polling 200 empty receivers spun instead of parking: found by an API
/// audit helper).
pub(crate) fn refund() {
    with_current(|b| b.0.set(b.0.get().saturating_add(1)));
}

/// Whether the current task still has budget (true off a plugio core).
pub fn has_budget_remaining() -> bool {
    with_current(|b| b.0.get() > 0).unwrap_or(true)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::task::Waker;

    fn proceed() -> Poll<()> {
        poll_proceed(&mut Context::from_waker(Waker::noop()))
    }

    /// Off a core every resource may proceed; an entered budget is spent
    /// unit by unit and refilled; a budget entered inside another is the
    /// current one only until its guard drops, and then the outer one is
    /// current again, with what it had left.
    #[test]
    fn the_entered_budget_is_spent_and_nested_enters_restore_the_outer_one() {
        assert!(has_budget_remaining());
        assert_eq!(proceed(), Poll::Ready(()));
        let outer = Budget::new(2);
        {
            let _outer = outer.enter();
            assert_eq!(proceed(), Poll::Ready(()));
            {
                let inner = Budget::new(0);
                let _inner = inner.enter();
                assert!(!has_budget_remaining());
                assert_eq!(proceed(), Poll::Pending);
            }
            assert!(has_budget_remaining());
            assert_eq!(proceed(), Poll::Ready(()));
            assert_eq!(proceed(), Poll::Pending);
            outer.reset(1);
            assert_eq!(proceed(), Poll::Ready(()));
        }
        assert!(has_budget_remaining());
        assert_eq!(proceed(), Poll::Ready(()));
    }
}
