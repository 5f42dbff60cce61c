//! What `#[plugio::main]` and `#[plugio::test]` expand to call. Not a
//! public API: the names may change with the macros.

use std::future::Future;
use std::sync::mpsc;
use std::time::Duration;

use crate::RingConfig;

/// The runtime a macro asked for.
#[derive(Debug)]
pub struct Settings {
    /// `None`: one core on the calling thread; `Some(n)`: `n` core threads.
    pub cores: Option<usize>,
    /// The bound of the `spawn_blocking` pool (`None`: the default).
    pub max_blocking_threads: Option<usize>,
    /// Each core's ring.
    pub ring: RingConfig,
}

/// Runs `body` on a local executor (core 0 on this thread) with the device
/// driver installed.
///
/// # Panics
/// When the executor cannot be built (the message says why), or
/// re-raises the body's panic.
pub fn block_on_local<F: Future>(settings: Settings, body: F) -> F::Output {
    let mut builder = plugio_executor::LocalExecutor::builder();
    if let Some(n) = settings.max_blocking_threads {
        builder = builder.max_blocking_threads(n);
    }
    let ring = settings.ring;
    let ex = builder
        .driver(move |_| {
            Ok(Box::new(plugio_device::DeviceDriver::new(&ring)?)
                as Box<dyn plugio_executor::Driver>)
        })
        .build()
        .unwrap_or_else(|e| panic!("plugio: cannot build the executor: {e}"));
    ex.run(body)
}

/// Runs `body` on core 0 of a runtime of `settings.cores` cores with the
/// device driver installed, and shuts the runtime down after it.
///
/// # Panics
/// When the runtime cannot be built (the message says why), or re-raises
/// the body's panic.
pub fn block_on_cores<F>(settings: Settings, body: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut builder = crate::runtime::builder(settings.ring).cores(settings.cores.unwrap_or(1));
    if let Some(n) = settings.max_blocking_threads {
        builder = builder.max_blocking_threads(n);
    }
    let rt = builder
        .build()
        .unwrap_or_else(|e| panic!("plugio: cannot build the runtime: {e}"));
    rt.block_on(body)
}

/// Runs `f` on a thread of its own and returns its output; if it has not
/// finished after `timeout_s` seconds, panics (fails the test) instead of
/// waiting. A panic in `f` is re-raised here, with its payload.
///
/// # Panics
/// On the timeout, or with `f`'s panic.
pub fn watchdog<T: Send + 'static>(
    name: &str,
    timeout_s: u64,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let out = f();
            let _ = tx.send(());
            out
        })
        .unwrap_or_else(|e| panic!("plugio::test: cannot start the test thread: {e}"));
    match rx.recv_timeout(Duration::from_secs(timeout_s)) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match thread.join() {
            Ok(out) => out,
            Err(payload) => std::panic::resume_unwind(payload),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
            "test {name} did not finish within {timeout_s} s (the watchdog of \
             #[plugio::test(timeout_s = {timeout_s})]): a hang, or raise timeout_s"
        ),
    }
}
