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
/// rest on the returned executor builder.
pub fn builder(ring: RingConfig) -> Builder {
    Builder::new().driver(move |_core| driver(&ring))
}

/// A single-thread executor (core 0, on the calling thread) that drives IO
/// through io_uring with `ring`.
///
/// # Errors
/// The driver could not be installed (one is already installed on this
/// thread).
pub fn local(ring: RingConfig) -> io::Result<LocalExecutor> {
    LocalExecutor::builder()
        .driver(move |_core| driver(&ring))
        .build()
}

fn driver(ring: &RingConfig) -> io::Result<Box<dyn Driver>> {
    Ok(Box::new(DeviceDriver::new(ring)?))
}
