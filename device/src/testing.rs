//! Test helpers: a minimal single-thread `block_on` that parks a
//! [`Driver`] between polls (the executor crate provides the real runtime).
//!
//! Invariant: the future is polled again only after a wake or a park
//! returned; park blocks only when no wake is pending.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use plugio_executor::{Driver, Unpark};

struct Flag {
    woken: AtomicBool,
    unpark: Arc<dyn Unpark>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        // Release pairs with the Acquire swap in `block_on`.
        if !self.woken.swap(true, Ordering::Release) {
            self.unpark.unpark();
        }
    }
}

/// Runs `fut` to completion on this thread, parking `driver` whenever the
/// future is pending and no wake arrived.
///
/// # Panics
/// When `driver.park` returns an error.
pub fn block_on<F: Future>(driver: &dyn Driver, fut: F) -> F::Output {
    let flag = Arc::new(Flag {
        woken: AtomicBool::new(true),
        unpark: driver.unparker(),
    });
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        // Acquire pairs with the Release swap in `wake_by_ref`.
        if flag.woken.swap(false, Ordering::Acquire) {
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return out;
            }
            if let Err(e) = driver.park(Some(std::time::Duration::ZERO)) {
                panic!("park failed: {e}");
            }
            continue;
        }
        if let Err(e) = driver.park(None) {
            panic!("park failed: {e}");
        }
    }
}

/// A directory whose file system accepts `O_DIRECT`: the system temp dir
/// when it does, else `$CARGO_TARGET_DIR/tmp` or `./target/tmp`.
///
/// # Panics
/// When none of them accepts `O_DIRECT`.
pub fn direct_io_dir() -> std::path::PathBuf {
    use std::os::unix::fs::OpenOptionsExt;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("target"));
    let candidates = [std::env::temp_dir(), target.join("tmp")];
    for dir in candidates {
        let _ = std::fs::create_dir_all(&dir);
        let probe = dir.join(format!("plugio-direct-probe-{}", std::process::id()));
        let ok = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .custom_flags(libc::O_DIRECT)
            .open(&probe)
            .is_ok();
        let _ = std::fs::remove_file(&probe);
        if ok {
            return dir;
        }
    }
    panic!("no directory accepting O_DIRECT (tried the temp dir and target/tmp)");
}

/// A [`CompletionHandler`](crate::CompletionHandler) that records every
/// completion: how many times each token completed and its last result.
#[derive(Debug, Default)]
pub struct RecordingHandler {
    /// `(times completed, last result)` per token index.
    pub seen: std::cell::RefCell<std::collections::HashMap<u64, (u32, i32)>>,
}

impl RecordingHandler {
    /// Total completions recorded.
    pub fn total(&self) -> u64 {
        self.seen
            .borrow()
            .values()
            .map(|&(n, _)| u64::from(n))
            .sum()
    }

    /// Tokens that completed more than once.
    pub fn duplicates(&self) -> Vec<u64> {
        let mut d: Vec<u64> = self
            .seen
            .borrow()
            .iter()
            .filter(|(_, &(n, _))| n > 1)
            .map(|(&t, _)| t)
            .collect();
        d.sort_unstable();
        d
    }
}

impl crate::CompletionHandler for RecordingHandler {
    fn complete(&self, token: u64, result: i32) {
        let mut seen = self.seen.borrow_mut();
        let entry = seen.entry(token).or_insert((0, 0));
        entry.0 += 1;
        entry.1 = result;
    }
}

/// Parks `driver` until `done()` holds or `limit` passes; returns whether
/// `done()` held.
///
/// # Panics
/// When `park` fails.
pub fn park_until(
    driver: &dyn Driver,
    limit: std::time::Duration,
    mut done: impl FnMut() -> bool,
) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while !done() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        if let Err(e) = driver.park(Some(std::time::Duration::from_millis(10))) {
            panic!("park failed: {e}");
        }
    }
    true
}

/// Runs `body` while another thread holds what `hold` takes (a lock's
/// guard, typically): the thread takes it, `body` runs, then the thread
/// lets it go and is joined. For tests of a fork while another thread
/// holds a process-wide lock: the child inherits the lock word but not
/// its holder.
///
/// # Panics
/// When `hold` panics (the holder thread's panic is passed on).
///
/// ```
/// use std::sync::Mutex;
/// static M: Mutex<u32> = Mutex::new(0);
/// let busy = plugio_device::testing::while_another_thread_holds(
///     || M.lock().unwrap(),
///     || M.try_lock().is_err(),
/// );
/// assert!(busy);
/// assert!(M.try_lock().is_ok());
/// ```
pub fn while_another_thread_holds<G, R>(
    hold: impl FnOnce() -> G + Send,
    body: impl FnOnce() -> R,
) -> R {
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    // A scoped thread: `hold` may borrow what it locks. `release_tx` moves
    // into the scope's closure, so a panic in `body` drops it (letting the
    // holder go) before the scope joins the holder.
    std::thread::scope(move |scope| {
        let release_tx = release_tx;
        let holder = scope.spawn(move || {
            let guard = hold();
            let _ = held_tx.send(());
            let _ = release_rx.recv();
            drop(guard);
        });
        if held_rx.recv().is_err() {
            // The holder panicked before it held anything.
            std::panic::resume_unwind(holder.join().expect_err("the holder ended early"));
        }
        let out = body();
        drop(release_tx);
        if let Err(panic) = holder.join() {
            std::panic::resume_unwind(panic);
        }
        out
    })
}

/// Forks this (test) process and runs `check` in the child, which reports
/// through a pipe and leaves with `_exit` (no destructors, no unwinding
/// into the parent's test harness); `alarm(seconds)` ends a child that
/// hangs. Returns the child's report: `Ok` when `check` returned `Ok` and
/// the child exited with 0.
///
/// # Errors
/// The child's `Err`, a panic in the child, or the child's death (by the
/// alarm when it hung) with its wait status.
///
/// # Panics
/// When `pipe`, `fork` or `waitpid` fails.
pub fn in_forked_child(
    seconds: u32,
    check: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe() writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: fresh descriptors, owned by nobody else.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child only runs `check`, writes its report and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: a plain syscall.
        unsafe { libc::alarm(seconds) };
        let msg = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
            Ok(Ok(())) => "ok".to_owned(),
            Ok(Err(e)) => e,
            Err(_) => "the child panicked".to_owned(),
        };
        // SAFETY: writes the report to the pipe, then ends the process at
        // once (nothing of the parent's state is run).
        unsafe {
            libc::write(write_end.as_raw_fd(), msg.as_ptr().cast(), msg.len());
            libc::_exit(0)
        }
    }
    drop(write_end);
    let mut status = 0;
    // SAFETY: waits for our own child.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid, "waitpid");
    let mut msg = String::new();
    let _ = std::fs::File::from(read_end).read_to_string(&mut msg);
    match (
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        msg,
    ) {
        (true, msg) if msg == "ok" => Ok(()),
        (true, msg) => Err(msg),
        (false, msg) => Err(format!("the child died (status {status:#x}): {msg}")),
    }
}
