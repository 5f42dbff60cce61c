//! plugio-engine: the userspace block layer between a database's async IO
//! calls and the device layer.
//!
//! # The path of one IO
//!
//! ```text
//! task: dev.read_at(buf, off).await
//!   -> check             (device)   length, alignment, range: refused here, nothing queued
//!   -> bio               (bio)      a slot in the core's bio table (reused, no malloc)
//!   -> plug              (plug)     appended; flushed at max_count / flush_bytes / tick end
//!   -> requests          (flush)    built in place in the device's request slab
//!                                   (queue), merged (merge), split at the request
//!                                   limit, ordered (order); a bio that needs none
//!                                   of that takes the fast lane (queue::FAST):
//!                                   no request, its SQE written from the bio
//!   -> tags              (tag)      all the flush needs in one batch (sbitmap), retried;
//!                                   the rest wait (a task parked on the tag set)
//!   -> dispatch          (dispatch) one backend submission per request,
//!                                   token = (device, request slot)
//!   -> io_uring_enter    (device)   once per tick, in the core's park
//!   -> complete          (complete) a batch of tokens -> requests -> split the
//!                                   results into their bios -> wake their tasks;
//!                                   tags, clock and iostats once per batch
//! ```
//!
//! # Invariants
//!
//! - A bio's buffer and its requests' tags belong to the kernel from
//!   dispatch until the completion is delivered: dropping the IO future
//!   orphans the bio, it never frees or reuses either early.
//! - The executor never parks while this core's plug holds bios (the tick
//!   hook flushes it before every park).
//! - Every IO completes exactly once: with its bytes, a short count (a
//!   read at end of file; a write an error stopped after its first
//!   bytes), or a typed error. Bad input is refused before a bio exists.
//! - Tag exhaustion makes IO wait, never fail.
//! - Everything per core (bio table, plug, request arrays) is touched only
//!   by its core's thread; only the tag sets are shared between cores.

#![cfg_attr(not(test), warn(missing_docs))]

mod bio;
pub mod buf;
mod buf_io;
pub mod clock;
mod complete;
mod core;
pub mod cursor;
pub mod device;
mod dispatch;
mod file_ops;
mod flush;
mod interval;
mod long_range;
mod merge;
mod open_files;
pub mod options;
mod order;
mod plug;
mod queue;
pub mod region;
mod request;
pub mod runtime;
mod shared;
pub mod stats;
mod status;
pub(crate) mod sync;
pub mod tag;
mod zeroes;

pub use buf::{IoBuf, IoBufMut};
pub use cursor::DeviceCursor;
pub use device::{Device, PlugGuard, MAX_IO_BYTES};
pub use file_ops::{fs, FallocateMode, OpenOptions};
pub use long_range::{MAX_RANGE_BYTES, RANGE_PART_BYTES};
pub use options::{DeviceOptions, TagSharing};
pub use plugio_device::{DmaBuf, Error, ErrorKind, IoFlags};
pub use region::{Page, Region};
pub use stats::{IoStats, OpStats};
pub use zeroes::{MAX_ZEROES_BY_WRITING_BYTES, ZEROES_CHUNK_BYTES};

/// Runs `f` with a new empty directory (on the disk under the system's
/// temp directory) on a one-core runtime; removes it after. For the
/// examples in this crate's and the facade's docs.
///
/// # Panics
/// When the runtime cannot start, the directory cannot be made, or `f`
/// fails.
#[doc(hidden)]
pub fn doc_dir<F, Fut>(f: F)
where
    F: FnOnce(std::path::PathBuf) -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Relaxed: only uniqueness matters.
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("plugio-doc-dir-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the example directory");
    let ex = runtime::local(plugio_device::RingConfig::default()).expect("start a runtime");
    let result = ex.run(f(dir.clone()));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        panic!("example failed: {e}");
    }
}

/// Runs `f` with a [`Device`] over a new empty file in the system's temp
/// directory (`O_DIRECT` where the file system takes it, buffered
/// otherwise), on a one-core runtime; removes the file after. For the
/// examples in this crate's and the facade's docs.
///
/// # Panics
/// When the runtime cannot start, the file cannot be made, or `f` fails.
#[doc(hidden)]
pub fn doc_example<F, Fut>(f: F)
where
    F: FnOnce(Device) -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Relaxed: only uniqueness matters.
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("plugio-doc-{}-{n}", std::process::id()));
    std::fs::File::create(&path).expect("create the example file");
    let ex = runtime::local(plugio_device::RingConfig::default()).expect("start a runtime");
    let result = ex.run(async {
        let dev = match Device::open(&path, DeviceOptions::default()) {
            Err(e) if *e.kind() == ErrorKind::DirectIoRefused => Device::open(
                &path,
                DeviceOptions {
                    direct: false,
                    ..DeviceOptions::default()
                },
            ),
            r => r,
        }?;
        f(dev).await
    });
    let _ = std::fs::remove_file(&path);
    if let Err(e) = result {
        panic!("example failed: {e}");
    }
}
