//! Fork safety: a child process made by `fork()` inherits its parent's
//! io_uring rings (their file descriptors and, unless told otherwise, the
//! SQ/CQ mappings, which stay shared with the parent), its registered
//! buffers and the state of every core that used them, but none of the
//! threads (the other cores, the sync pool). IO through any of that in
//! the child would reach the parent's rings, or wait for threads that are
//! not there.
//!
//! Invariants:
//! - [`generation`] counts the forks this process came through: a
//!   `pthread_atfork` child handler, installed when the first driver is
//!   created (`install`), adds one in every child.
//! - A driver, a ring and the sync pool record the generation they were
//!   built in. One from an older generation is *stale*: every submission
//!   on a thread whose driver is stale fails at once with
//!   [`ErrorKind::Forked`](crate::ErrorKind::Forked) ([`check`]); a stale ring is never touched
//!   (no SQE, no enter, no CQE read, and its drop only closes the child's
//!   copy of the descriptor); a stale driver parks like one without a ring
//!   and waits for nothing at drop; a stale pool is rebuilt (new threads)
//!   for the child's new drivers.
//! - The ring mappings are `MADV_DONTFORK` (io-uring's `dontfork`) and the
//!   buffer arena `MADV_WIPEONFORK`: even by mistake, the child cannot
//!   reach the parent's rings, and the parent's registered (pinned) pages
//!   are never shared copy-on-write with the child (the child gets zeroed
//!   pages there).
//!
//! A child builds a new runtime (new threads, new rings) and opens its
//! devices again; IO that was in flight at the fork completes in the
//! parent only (the engine's futures of such IO end with
//! [`ErrorKind::Forked`](crate::ErrorKind::Forked) when the child awaits
//! them).

mod counter;

pub(crate) use counter::install;
pub use counter::{forked_error, generation};

use crate::error::Result;

/// `Ok` unless the calling thread's driver was built before a fork of
/// this process (then [`ErrorKind::Forked`](crate::ErrorKind::Forked)). A thread without a driver
/// passes (its IO fails with `NoDriver` elsewhere).
///
/// # Errors
/// [`ErrorKind::Forked`](crate::ErrorKind::Forked).
pub fn check() -> Result<()> {
    if crate::core::with_core(|c| c.stale()) {
        return Err(forked_error());
    }
    Ok(())
}

/// The fork generation of the calling thread's driver (`None` without
/// one): IO on this thread is refused while it differs from
/// [`generation`].
pub fn driver_generation() -> Option<u64> {
    crate::core::with_core(|c| c.driver_generation())
}
