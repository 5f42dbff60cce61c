//! `JoinHandle`: the owned permission to await a task's output.

use super::error::JoinError;
use super::raw::JoinRef;
use super::state::{CancelRequest, JoinDropped};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// An owned permission to await a spawned task's output.
///
/// Awaiting it gives `Ok(output)`, `Err(JoinError::Panic(_))` if the task
/// panicked, or `Err(JoinError::Cancelled)` if it was aborted or its core
/// shut down first. Dropping the handle detaches the task (it keeps
/// running; its output is dropped when it completes). The handle is `Send`
/// when `T` is, whatever the future was; awaiting or aborting from another
/// core is fine.
///
/// # Panics
/// Polling it again after it returned `Ready` panics.
pub struct JoinHandle<T> {
    raw: JoinRef<T>,
}

impl<T> JoinHandle<T> {
    pub(crate) fn new(raw: JoinRef<T>) -> Self {
        Self { raw }
    }

    /// Asks the task to stop: its core drops the future (running its
    /// destructors on the core's thread) the next time it would poll it, and
    /// the handle then yields `Err(JoinError::Cancelled)`. No effect on a
    /// task that already completed. Callable from any thread.
    ///
    /// Work the task started outside itself goes on: an IO it had issued
    /// is orphaned, not cancelled, and completes after the handle has
    /// yielded `Cancelled` (a storage runtime's IO cannot be taken back
    /// from the kernel). Its core keeps that IO in order with the IO it
    /// issues later; another core does not wait for it.
    pub fn abort(&self) {
        let header = self.raw.task.header();
        // Orderings: see `State::request_cancel`.
        match header.state.request_cancel() {
            CancelRequest::WakeTask => self.raw.task.wake_by_ref(),
            CancelRequest::AlreadyComplete => {}
        }
    }

    /// Whether the task has completed (with output, panic or cancellation).
    pub fn is_finished(&self) -> bool {
        self.raw.task.is_complete()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let header = self.raw.task.header();
        // Acquire: pairs with the Release in the task's `complete`.
        if !header.state.load_acquire().is_complete() {
            header.join_waker.register(cx.waker());
            // Re-check after registering (the completer wakes after
            // setting COMPLETE, so one of the two sees the other).
            if !header.state.load_acquire().is_complete() {
                return Poll::Pending;
            }
        }
        if crate::coop::poll_proceed(cx).is_pending() {
            return Poll::Pending;
        }
        // SAFETY: COMPLETE is set and we hold the join interest.
        let out = unsafe { (*self.raw.output()).take() };
        match out {
            Some(result) => Poll::Ready(result),
            None => panic!("JoinHandle polled after it returned Ready"),
        }
    }
}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        let header = self.raw.task.header();
        // Orderings: see `State::unset_join_interest`.
        match header.state.unset_join_interest() {
            JoinDropped::DropOutput => {
                // SAFETY: complete, and we were the interest holder.
                let output = unsafe { (*self.raw.output()).take() };
                // A panic in the output's (or payload's) drop is contained:
                // dropping a handle never panics.
                super::raw::drop_contained(output, "a task's output");
            }
            JoinDropped::NotComplete => {}
        }
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("finished", &self.is_finished())
            .finish()
    }
}
