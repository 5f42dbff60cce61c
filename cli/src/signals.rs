//! How the `plugio` command ends on a signal or a closed standard output.
//!
//! `plugio bench` and `plugio replay` catch SIGINT, SIGTERM, SIGHUP (a
//! closed terminal or ssh session), SIGQUIT, SIGALRM (`timeout -s ALRM`),
//! SIGUSR1, SIGUSR2 and SIGXCPU (the CPU-time limit, `ulimit -t`, before
//! its SIGKILL) ([`catch_interrupts`]): the handler only records the signal; the
//! bench's clock, or the replay between IOs, sees it ([`interrupted`]),
//! stops the IO, prints the summary so far and removes the file the run
//! created, and the command then ends by the same signal
//! ([`die_of`]) so that a shell or a script sees what it would see from any
//! other tool killed by it. A write to a closed standard output (`plugio
//! bench | head -1`) fails with `EPIPE` (Rust ignores SIGPIPE); the command
//! stops its work, cleans up and then ends by SIGPIPE the same way.
//!
//! Invariants: the handler does one atomic compare-exchange
//! (async-signal-safe) and, for a second caught signal (a second Ctrl-C,
//! or any second caught signal, of whichever kind, while the run winds
//! down), removes the run's temporary file ([`remove_on_second_signal`];
//! `unlink` is async-signal-safe), restores the signal's default action
//! and raises it: the process ends at once, and leaves no file behind.

use std::ffi::CString;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// The first caught signal received (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

/// The path a second caught signal unlinks before it ends the process
/// (null: none): a leaked `CString`, never freed, so the handler may read
/// it whenever it runs.
static DOOMED: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

/// Makes a second caught signal remove `path` (the bench's temporary
/// file, a replay target the run created) before it ends the process;
/// `None` forgets it (the file is gone, or kept). Two
/// signals sent back to back (`kill -USR1; kill -USR2`) ended plugio
/// before its cleanup and left the file (found by a break-it helper).
pub fn remove_on_second_signal(path: Option<&Path>) {
    use std::os::unix::ffi::OsStrExt;
    let ptr = path
        .and_then(|p| CString::new(p.as_os_str().as_bytes()).ok())
        .map_or(std::ptr::null_mut(), CString::into_raw);
    // Release: pairs with the handler's Acquire load, which then sees the
    // string's bytes. The previous string is leaked: a handler running
    // on another thread may still read it.
    DOOMED.store(ptr, Ordering::Release);
}

/// The signals that stop a run cleanly (the file it created removed):
/// each ends a command-line tool by default, so each would leave the file
/// behind uncaught (SIGHUP, then SIGALRM, SIGUSR1, SIGUSR2 and SIGXCPU:
/// found by break-it helpers). SIGPROF and SIGVTALRM stay as they are
/// (profilers install their own handlers); SIGKILL cannot be caught.
const CAUGHT: [Signal; 8] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGALRM,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGXCPU,
];

extern "C" fn record(sig: libc::c_int) {
    // Relaxed: a flag polled by the clock; no data travels with it.
    if PENDING
        .compare_exchange(0, sig, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        // A second caught signal, of either kind: it ends the process at
        // once (raised again with its default action once this handler
        // returns, while it is blocked here), after the run's temporary
        // file is removed.
        // Acquire: pairs with `remove_on_second_signal`'s Release store.
        let doomed = DOOMED.load(Ordering::Acquire);
        // SAFETY: `unlink`, `signal` and `raise` are async-signal-safe; a
        // non-null `doomed` is a leaked NUL-terminated string; the
        // default action of every caught signal ends the process.
        unsafe {
            if !doomed.is_null() {
                libc::unlink(doomed);
            }
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// Catches SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2 and SIGXCPU: they are recorded for [`interrupted`]
/// instead of killing the process (once; a second caught signal kills it). A
/// signal ignored when the process started (SIGINT in a background job
/// of a script) stays ignored.
///
/// # Errors
/// `sigaction` failed.
pub fn catch_interrupts() -> io::Result<()> {
    let action = SigAction::new(
        SigHandler::Handler(record),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in CAUGHT {
        // SAFETY: `record` is async-signal-safe (atomics on statics, then
        // for a second signal `unlink`, `signal` and `raise`).
        let old = unsafe { signal::sigaction(sig, &action) }.map_err(io::Error::from)?;
        if old.handler() == SigHandler::SigIgn {
            // Ignored when we started (a background job of a
            // non-interactive shell ignores SIGINT): stays ignored, as
            // the GNU coding standards ask of a program that catches it.
            // SAFETY: restores the disposition we found.
            unsafe { signal::sigaction(sig, &old) }.map_err(io::Error::from)?;
        }
    }
    Ok(())
}

/// The signal caught since [`catch_interrupts`], if any.
pub fn interrupted() -> Option<Signal> {
    // Relaxed: see `record`.
    match PENDING.load(Ordering::Relaxed) {
        0 => None,
        sig => Signal::try_from(sig).ok(),
    }
}

/// True when `e` is the error of a write to a closed pipe or socket.
pub fn is_broken_pipe(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::BrokenPipe
}

/// Ends the process by `sig` with its default action (SIGINT, SIGTERM,
/// SIGHUP, SIGALRM, SIGUSR1, SIGUSR2 and SIGPIPE terminate, SIGQUIT and
/// SIGXCPU also dump core where core dumps
/// are on), as a tool that did not catch it would have ended;
/// call it once the run's files are removed. Exits with `128 + sig` if the
/// signal somehow does not end the process.
pub fn die_of(sig: Signal) -> ! {
    // What was printed stays printed (a closed stdout just fails again).
    let _ = io::stdout().flush();
    // SAFETY: restores the default disposition; no handler of ours runs
    // afterwards.
    let _ = unsafe { signal::signal(sig, SigHandler::SigDfl) };
    let mut only = SigSet::empty();
    only.add(sig);
    let _ = only.thread_unblock();
    let _ = signal::raise(sig);
    std::process::exit(128 + sig as i32)
}
