//! The fork generation: a counter bumped in the child of every fork (a
//! `pthread_atfork` handler), the lowest layer of [`fork`](super), used by
//! the ring and the core to tell state built before a fork.
//!
//! Invariant: the counter only grows, by one per fork, in the child.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use crate::error::{Error, ErrorKind};

/// Forks this process came through (0 in the original process).
static GENERATION: AtomicU64 = AtomicU64::new(0);

extern "C" fn in_child() {
    // Relaxed: the child has one thread (the forking one) right now, and
    // every later reader is that thread or one it spawns (spawning
    // synchronizes). An atomic add is async-signal-safe, as a
    // pthread_atfork child handler must be.
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Installs the child handler (once per process; later calls do nothing).
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only does an atomic add; it
        // stays valid for the life of the process (a static function).
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if rc != 0 {
            tracing::warn!(
                rc,
                "pthread_atfork failed: IO in a forked child is not refused"
            );
        }
    });
}

/// The number of forks this process came through (0 in the process that
/// first created a driver, 1 in its child, ...).
#[inline]
pub fn generation() -> u64 {
    // Relaxed: see `in_child`.
    GENERATION.load(Ordering::Relaxed)
}

/// The error for IO through state built before a fork.
pub fn forked_error() -> Error {
    Error::new(ErrorKind::Forked)
}
