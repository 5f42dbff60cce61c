//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::mpsc;
use std::time::Duration;

/// Runs `f` on its own thread and fails the test (instead of hanging) if it
/// takes longer than `limit`.
pub fn with_watchdog<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(limit) {
        Ok(()) => worker.join().expect("test body panicked"),
        Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Ok(_) => unreachable!("sender dropped without sending"),
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("watchdog: test body stalled for {limit:?}"),
    }
}

/// A future-drop detector: counts drops.
pub struct DropCounter(pub std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}
