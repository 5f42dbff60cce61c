//! plugio: a thread-per-core async storage IO runtime for databases, with a
//! userspace block layer (plug, sbitmap tags, merging, bio and buffer
//! caches, cached clock, iostats) in front of io_uring.
//!
//! ```no_run
//! use plugio::{Device, DeviceOptions, RingConfig};
//!
//! let ex = plugio::runtime::local(RingConfig::default())?;
//! ex.run(async {
//!     let dev = Device::open("data.db", DeviceOptions::default())?;
//!     let mut page = dev.alloc_buf(4096);
//!     page.as_mut_slice().fill(7);
//!     let (written, page) = dev.write_at(page, 0).await;
//!     written?;
//!     dev.flush().await?;
//!     let back = dev.read_at(0, 4096).await?;
//!     assert_eq!(back.as_slice(), page.as_slice());
//!     Ok::<_, plugio::Error>(())
//! })?;
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! The crates behind the facade, in dependency order: [`executor`]
//! (thread-per-core runtime, tick hooks, park driver seam) <- [`device`]
//! (io_uring rings, file/block/sync/mem backends, geometry, DMA buffers)
//! <- [`engine`] (bio, plug, tags, merge, dispatch, completion, the
//! [`Device`] handle).
//!
//! Invariants kept across the crates: a buffer and its tag belong to the
//! kernel from submission until completion (dropping a future never frees
//! either early); the executor never parks with IO plugged; every IO
//! completes exactly once; bad input is refused before submission.

pub use plugio_device as device;
pub use plugio_engine as engine;
pub use plugio_executor as executor;

pub use plugio_device::{DmaBuf, Error, ErrorKind, InvalidInput, IoFlags, RingConfig};
pub use plugio_engine::{Device, DeviceOptions, IoBuf, IoStats, Page, Region, TagSharing};
pub use plugio_executor::{
    sleep, spawn, spawn_local, timeout, yield_now, JoinHandle, LocalExecutor, Runtime, ShutdownMode,
};

/// `Result` with plugio's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runtimes whose cores drive IO through io_uring: see
/// [`plugio_engine::runtime`].
pub mod runtime {
    pub use plugio_engine::runtime::{builder, local};
}
