//! The fork generation: a counter bumped in the child of every `fork()`
//! (a `pthread_atfork` handler). The lowest layer of fork safety: the
//! runtime's cores record it when they are built, and so do the device
//! layer's drivers and rings (`plugio_device::fork`), to tell state built
//! before a fork, whose threads and rings the child does not have.
//!
//! Invariant: the counter only grows, by one per fork, in the child.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

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
/// Called when the first core, device driver or ring is built; forks
/// before that are not counted (nothing of plugio's existed to go stale).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only does an atomic add; it
        // stays valid for the life of the process (a static function).
        let rc = unsafe { nix::libc::pthread_atfork(None, None, Some(in_child)) };
        if rc != 0 {
            tracing::warn!(
                rc,
                "pthread_atfork failed: use of a runtime in a forked child is not refused"
            );
        }
    });
}

/// The number of forks this process came through since [`install`]
/// first ran (0 in that process, 1 in its child, ...).
///
/// ```
/// plugio::executor::fork::install();
/// assert_eq!(plugio::executor::fork::generation(), 0);
/// ```
#[inline]
pub fn generation() -> u64 {
    // Relaxed: see `in_child`.
    GENERATION.load(Ordering::Relaxed)
}
