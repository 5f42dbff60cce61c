//! Helpers shared by the engine's adversarial integration tests (the
//! engine's twin of the facade's `tests/common`, which the engine crate
//! cannot import).

#![allow(dead_code)] // each test binary uses its own subset

use std::time::Duration;

use plugio_device::RingConfig;

/// A single-thread executor with the device driver installed.
pub fn local() -> plugio_executor::LocalExecutor {
    plugio_engine::runtime::local(RingConfig::default()).expect("executor")
}

/// A temporary directory on a file system that takes O_DIRECT (the target
/// dir, not a tmpfs /tmp).
pub fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

/// Runs `f` on its own thread; a hang fails the test after `secs` instead
/// of blocking the suite, and a panic in `f` is re-raised.
pub fn watchdog<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().expect("test thread"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(_) => panic!("hang: not finished after {secs} s"),
    }
}
