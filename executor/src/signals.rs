//! The signal mask of the threads plugio starts (a multi-core runtime's
//! cores, the blocking pools' workers).
//!
//! Invariant: each such thread blocks `SIGXFSZ` from its start and never
//! unblocks it.

/// Blocks `SIGXFSZ` in the calling thread. The kernel sends it to the
/// thread whose write (or `fallocate`, `ftruncate`) goes past the
/// process's file size limit (`RLIMIT_FSIZE`, `ulimit -f`), and its
/// default action ends the whole process. plugio refuses such IO before
/// submission (`plugio_device::check_file_size_limit`), with the limit as
/// it read it in the tick; an op of the tick in which the limit was
/// lowered (`prlimit --pid`) goes to the kernel, and on the threads
/// plugio starts it then fails with `EFBIG` instead of ending the
/// process, as it does where a program ignores the signal.
/// The signal stays pending on the thread and goes with it. Called at the
/// start of each thread plugio starts; a caller's own threads keep their
/// mask.
///
/// ```
/// plugio::executor::block_file_size_signal();
/// let mut mask = nix::sys::signal::SigSet::empty();
/// nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_BLOCK, None, Some(&mut mask))
///     .unwrap();
/// assert!(mask.contains(nix::sys::signal::Signal::SIGXFSZ));
/// ```
pub fn block_file_size_signal() {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGXFSZ);
    if let Err(e) = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None) {
        tracing::warn!(error = %e, "cannot block SIGXFSZ in a plugio thread");
    }
}
