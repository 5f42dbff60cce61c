//! Runtimes with the device driver installed: the executor's builders with
//! each core's park going through that core's io_uring.
//!
//! Invariant: every core built here has a `DeviceDriver` (a ring, or the
//! sync fallback where io_uring is refused) installed before any task runs,
//! so the engine's completions are reaped in the core's park.

use std::io;

use plugio_device::{DeviceDriver, RingConfig};
use plugio_executor::{Builder, Driver, LocalExecutor};

/// A multi-core runtime builder whose cores drive IO through io_uring with
/// `ring` (default [`RingConfig::default`]). Set cores, placement and the
/// rest on the returned executor builder. Its `build` fails when `ring` is
/// out of range ([`RingConfig::validate`]), as [`local`] does.
pub fn builder(ring: RingConfig) -> Builder {
    Builder::new().driver(move |_core| driver(&ring))
}

/// A single-thread executor (core 0, on the calling thread) that drives IO
/// through io_uring with `ring`.
///
/// # Errors
/// The driver could not be installed: one is already installed on this
/// thread, or `ring` is out of range (see [`RingConfig::validate`]; the
/// error's kind is `InvalidInput`). Where the kernel refuses io_uring
/// (`io_uring_disabled`, seccomp, an old kernel) it is not an error: the
/// executor runs and file IO goes through the sync thread pool
/// ([`plugio_device::driver::uring_active`] tells which).
pub fn local(ring: RingConfig) -> io::Result<LocalExecutor> {
    LocalExecutor::builder()
        .driver(move |_core| driver(&ring))
        .build()
}

fn driver(ring: &RingConfig) -> io::Result<Box<dyn Driver>> {
    Ok(Box::new(DeviceDriver::new(ring)?))
}
