//! Tasks: one allocation per spawned future, holding a header (state,
//! remote link, owner core, join waker), the output slot, and the future.
//!
//! # Invariants
//!
//! - The future is only polled and dropped on its owner core's thread,
//!   except for a task spawned from another thread (`Send` future) that its
//!   core never registered: that one may be cancelled (future dropped) by
//!   whichever thread finds it in a closed core's remote queue.
//! - `NOTIFIED` set means the task is in exactly one run queue (local or
//!   remote) or about to be pushed to one; only the core clears it, when it
//!   pops the task to poll it. A wake that sets it pushes the task.
//! - The output slot is written once by the owner core before `COMPLETE` is
//!   set (Release). After that it is read only by the holder of the join
//!   interest (the `JoinHandle`), or, when the handle is gone, dropped by
//!   whoever saw both `COMPLETE` and no `JOIN_INTEREST` last.
//! - Reference counting is `Arc`'s: a run queue entry, the core's owned-task
//!   slab, each `Waker` and the `JoinHandle` each hold one reference.

mod join;
mod raw;

pub use join::{JoinError, JoinHandle};
pub(crate) use raw::{new_task, Header, TaskRef, UNREGISTERED};

/// The task state bits, for the core's poll loop.
pub(crate) mod raw_bits {
    pub(crate) use super::raw::{CANCEL_REQUESTED, COMPLETE, NOTIFIED};
}
