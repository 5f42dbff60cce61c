//! Running the `plugio` binary from the CLI's tests: its SIGINT set as
//! the test needs it whatever this process inherited, and a wait that
//! turns a hang into a failure.
//!
//! Invariant: nothing here depends on timing; a deadline only ends a run
//! that would otherwise never end.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

use nix::sys::signal::{signal, SigHandler, Signal};

/// Sets the child's SIGINT to `handler` (`SigDfl` or `SigIgn`), and its
/// SIGHUP, SIGTERM, SIGALRM, SIGUSR1 and SIGUSR2 (the signals tests send) to their
/// default actions, between fork and exec. A
/// test run started in the background of a non-interactive shell (a CI
/// script's `cmd &`) ignores SIGINT, one started under `nohup` ignores
/// SIGHUP, and their children inherit that; `plugio` (as any Unix tool)
/// keeps an ignored signal ignored, so a test that sends one sets the
/// default first (under `nohup`, the SIGHUP tests waited for the whole
/// run before: found by a new-user helper).
pub fn set_sigint(c: &mut Command, handler: SigHandler) -> &mut Command {
    // SAFETY: between fork and exec the closure only calls `signal(2)`,
    // which is async-signal-safe, and allocates nothing.
    unsafe {
        c.pre_exec(move || {
            signal(Signal::SIGINT, handler)
                .and_then(|_| signal(Signal::SIGHUP, SigHandler::SigDfl))
                .and_then(|_| signal(Signal::SIGTERM, SigHandler::SigDfl))
                .and_then(|_| signal(Signal::SIGALRM, SigHandler::SigDfl))
                .and_then(|_| signal(Signal::SIGUSR1, SigHandler::SigDfl))
                .and_then(|_| signal(Signal::SIGUSR2, SigHandler::SigDfl))
                .map(drop)
                .map_err(std::io::Error::from)
        })
    }
}

/// Waits for `child`; a hang (the fault some tests guard against) kills it
/// and fails the test after `secs`.
pub fn wait_guarded(child: &mut Child, secs: u64, what: &str) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {secs} s (hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`wait_guarded`], then the child's piped standard output and error
/// (for reports that fit a pipe's buffer: it is read after the exit).
#[allow(dead_code)] // Not every test file reads the output this way.
pub fn output_guarded(mut child: Child, secs: u64, what: &str) -> Output {
    let status = wait_guarded(&mut child, secs, what);
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    if let Some(mut o) = child.stdout.take() {
        o.read_to_end(&mut stdout).expect("stdout");
    }
    if let Some(mut e) = child.stderr.take() {
        e.read_to_end(&mut stderr).expect("stderr");
    }
    Output {
        status,
        stdout,
        stderr,
    }
}
