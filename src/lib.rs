//! plugio: a thread-per-core async storage IO runtime for databases, with a
//! userspace block layer (plug, sbitmap tags, merging, bio and buffer
//! caches, cached clock, iostats) in front of io_uring.
//!
//! Open a file, write, make it durable, read it back:
//!
//! ```
//! use plugio::{OpenOptions, RingConfig};
//!
//! let ex = plugio::runtime::local(RingConfig::default())?;
//! ex.run(async {
//!     let path = "plugio-example.db";
//!     let dev = OpenOptions::new().create(true).truncate(true).open(path).await?;
//!     let mut page = dev.alloc_buf(4096); // aligned for O_DIRECT
//!     page.as_mut_slice().fill(7);
//!     let (written, page) = dev.write_all_at(page, 0).await;
//!     written?;
//!     dev.sync_all().await?; // fsync: data and size durable
//!     let (read, back) = dev.read_exact_at(vec![0u8; 4096], 0).await; // any buffer
//!     read?;
//!     assert_eq!(back, page.as_slice());
//!     plugio::fs::remove_file(path).await
//! })?;
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! IO takes its buffer by value and hands it back with the result, so the
//! kernel may use the memory while the caller cannot: any [`IoBuf`] /
//! [`IoBufMut`] (`Vec<u8>`, `Box<[u8]>`, `bytes::BytesMut`, [`DmaBuf`],
//! [`Page`], or your own type). With `O_DIRECT`, memory that is not aligned
//! goes through an aligned copy (counted in [`IoStats::bounce_ios`]);
//! buffers from [`Device::alloc_buf`] are aligned and, when the core's
//! registered arena has room, go out as `READ_FIXED`/`WRITE_FIXED`.
//! Durability follows std's names: [`Device::sync_all`] is `fsync`,
//! [`Device::sync_data`] is `fdatasync`, [`fs::sync_dir`] makes a
//! directory's names durable. File-level operations ([`OpenOptions`],
//! [`fs`], [`Device::set_len`], [`Device::fallocate`],
//! [`Device::metadata`]) go through io_uring where the kernel has the
//! opcode and the blocking pool otherwise; [`DeviceCursor`] gives the
//! `futures-io` stream traits.
//!
//! On several cores, one thread each (thread-per-core: a task stays on the
//! core it was spawned on, and each core plugs and submits its own IO):
//!
//! ```
//! use plugio::{Device, DeviceOptions, RingConfig, ShutdownMode};
//!
//! let rt = plugio::runtime::builder(RingConfig::default()).cores(2).build()?;
//! let path = std::env::temp_dir().join(format!("plugio-cores-{}.db", std::process::id()));
//! std::fs::write(&path, vec![0u8; 2 * 4096])?;
//! let handles: Vec<_> = (0..2u64)
//!     .map(|core| {
//!         let path = path.clone();
//!         rt.spawn_on(core as usize, async move {
//!             let dev = Device::open(&path, DeviceOptions::default())?;
//!             let mut page = dev.alloc_buf(4096);
//!             page.as_mut_slice().fill(core as u8 + 1);
//!             let (n, _) = dev.write_at(page, core * 4096).await;
//!             n
//!         })
//!     })
//!     .collect();
//! for h in handles {
//!     assert_eq!(rt.block_on(h).expect("the task ran")?, 4096);
//! }
//! rt.shutdown(ShutdownMode::Wait)?;
//! assert_eq!(std::fs::read(&path)?[4096], 2);
//! std::fs::remove_file(&path)?;
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! The book, *plugio for database developers* (`book/` in the repository:
//! `mdbook serve book`), has the tutorials (a write-ahead log, a buffer
//! pool, a sharded key-value store, an sstable), the concepts, tuning and
//! troubleshooting.
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

/// The device layer: io_uring rings, backends, geometry, DMA buffers.
///
/// ```
/// let kinds = [plugio::device::BackendKind::Uring, plugio::device::BackendKind::Sync];
/// assert_ne!(kinds[0], kinds[1]);
/// ```
#[doc(inline)]
pub use plugio_device as device;
/// The engine: bios, plug, tags, merging, dispatch, completion, the
/// [`Device`] handle.
///
/// ```
/// assert!(plugio::engine::MAX_IO_BYTES >= 1 << 30);
/// ```
#[doc(inline)]
pub use plugio_engine as engine;
/// The thread-per-core executor.
///
/// ```
/// let ex = plugio::executor::LocalExecutor::new();
/// assert_eq!(ex.run(async { 6 * 7 }), 42);
/// ```
#[doc(inline)]
pub use plugio_executor as executor;

/// When a park's batched wait arms its bound as a kernel timer
/// ([`RingConfig::batch_wait_timer`]).
///
/// ```
/// let ring = plugio::RingConfig {
///     batch_wait_timer: plugio::BatchWaitTimer::Always, // latency first
///     ..plugio::RingConfig::default()
/// };
/// let ex = plugio::runtime::local(ring)?;
/// ex.run(async {});
/// # Ok::<_, std::io::Error>(())
/// ```
pub use plugio_device::BatchWaitTimer;
/// An aligned buffer for `O_DIRECT` IO, from the heap, the registered arena or the per-core buffer cache. For example:
///
/// ```
/// # plugio::engine::doc_example(|dev| async move {
/// let mut buf = plugio::DmaBuf::new(4096); // zeroed, 4096-aligned
/// buf.as_mut_slice()[..5].copy_from_slice(b"hello");
/// let (n, buf) = dev.write_at(buf, 0).await;
/// assert_eq!(n?, 4096);
/// assert_eq!(&buf.as_slice()[..5], b"hello");
/// # Ok(()) });
/// ```
pub use plugio_device::DmaBuf;
/// The error of every plugio operation: a typed [`ErrorKind`], the operation and the path; converts into `std::io::Error`. For example:
///
/// ```
/// # plugio::engine::doc_example(|dev| async move {
/// let (r, _) = dev.read_at(Vec::<u8>::new(), 0).await; // zero length
/// let err: plugio::Error = r.unwrap_err();
/// assert!(matches!(err.kind(), plugio::ErrorKind::InvalidInput(_)));
/// let io: std::io::Error = err.into(); // for code that speaks std::io
/// assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
/// # Ok(()) });
/// ```
pub use plugio_device::Error;
/// What went wrong, as a match-able kind (not found, invalid input, out of space, forked, an errno, ...). For example:
///
/// ```
/// # plugio::engine::doc_example(|dev| async move {
/// let missing = plugio::OpenOptions::new().open("/no/such/file.db").await;
/// assert_eq!(*missing.unwrap_err().kind(), plugio::ErrorKind::NotFound);
/// # Ok(()) });
/// ```
pub use plugio_device::ErrorKind;
/// Why input was refused before submission (alignment, range, length, options), with the value and what to change. For example:
///
/// ```
/// # plugio::engine::doc_example(|dev| async move {
/// use plugio::{ErrorKind, InvalidInput};
/// let (r, _) = dev.read_at(vec![0u8; 4096], 1).await; // offset 1
/// if dev.options().direct {
///     // (Buffered IO, where the file system refuses O_DIRECT, takes any offset.)
///     match r.unwrap_err().kind() {
///         ErrorKind::InvalidInput(InvalidInput::Alignment { what, .. }) => {
///             assert_eq!(*what, "offset")
///         }
///         other => panic!("{other:?}"),
///     }
/// }
/// # Ok(()) });
/// ```
pub use plugio_device::InvalidInput;
/// Per-IO flags: `FUA`, `PREFLUSH`, `NOMERGE` and the like. For example:
///
/// ```
/// use plugio::IoFlags;
/// let flags = IoFlags::FUA | IoFlags::NOMERGE;
/// assert!(flags.contains(IoFlags::FUA));
/// assert!(!flags.contains(IoFlags::PREFLUSH));
/// ```
pub use plugio_device::IoFlags;
/// A core's io_uring settings: queue sizes, task-run flags, SQPOLL and
/// IOPOLL, registered files, the park's batched wait. For example:
///
/// ```
/// let ring = plugio::RingConfig { sq_entries: 512, ..plugio::RingConfig::default() };
/// let ex = plugio::runtime::local(ring)?;
/// ex.run(async {
///     // The core's ring as built (`None` where the kernel refused io_uring
///     // and file IO runs on the sync thread pool).
///     if let Some(info) = plugio::device::ring::current_info() {
///         assert_eq!(info.sq_entries, 512);
///         assert_eq!(info.cq_entries, 1024); // twice the SQ by default
///     }
/// });
/// drop(ex);
/// // Sizes the kernel would refuse are refused before a ring is built.
/// let bad = plugio::RingConfig { sq_entries: 0, ..plugio::RingConfig::default() };
/// let e = plugio::runtime::local(bad).unwrap_err();
/// assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
/// # Ok::<_, std::io::Error>(())
/// ```
pub use plugio_device::RingConfig;
/// File-system operations on paths (`rename`, `remove_file`,
/// `create_dir_all`, `sync_dir`, `metadata`).
///
/// ```
/// # plugio::engine::doc_dir(|dir| async move {
/// plugio::fs::create_dir_all(dir.join("db/wal")).await?;
/// plugio::fs::sync_dir(&dir).await?;
/// assert!(plugio::fs::metadata(dir.join("db")).await?.is_dir());
/// # Ok(()) });
/// ```
pub use plugio_engine::fs;
/// An open file, block device or NVMe namespace: the async IO handle (read, write, sync, discard) and its iostats. For example:
///
/// ```
/// # plugio::engine::doc_example(|dev| async move {
/// let (n, _) = dev.write_at(vec![1u8; 4096], 0).await;
/// n?;
/// let back = dev.read_alloc_at(0, 4096).await?;
/// assert_eq!(back.as_slice(), &[1u8; 4096][..]);
/// let also = dev.clone(); // a cheap handle to the same device
/// assert_eq!(also.iostats().write.ios, 1);
/// # Ok(()) });
/// ```
pub use plugio_engine::Device;
/// A [`Device`] with a position, for the `futures-io` stream traits (`AsyncRead`, `AsyncWrite`, `AsyncSeek`). For example:
///
/// ```
/// # plugio::engine::doc_example(|dev| async move {
/// use futures::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
/// let mut cur = plugio::DeviceCursor::new(dev).await?;
/// cur.write_all(b"streams of any length").await?;
/// cur.flush().await?;
/// cur.seek(std::io::SeekFrom::Start(11)).await?;
/// let mut word = [0u8; 3];
/// cur.read_exact(&mut word).await?;
/// assert_eq!(&word, b"any");
/// # Ok(()) });
/// ```
pub use plugio_engine::DeviceCursor;
/// A device's settings: queue depth, plug limits, tags, merging, caches, `O_DIRECT`, ordering. For example:
///
/// ```
/// # plugio::engine::doc_dir(|dir| async move {
/// use plugio::{DeviceOptions, OpenOptions};
/// let opts = DeviceOptions { queue_depth: 64, nomerges: 2, direct: false, ..DeviceOptions::default() };
/// let dev = OpenOptions::new().create(true).device_options(opts).open(dir.join("f")).await?;
/// assert_eq!(dev.options().queue_depth, 64);
/// # Ok(()) });
/// ```
pub use plugio_engine::DeviceOptions;
/// What [`Device::fallocate`] does to a range: allocate it (keeping the
/// size or not), zero it, or punch a hole. For example:
///
/// ```
/// # plugio::engine::doc_example(|dev| async move {
/// dev.fallocate(0, 1 << 20, plugio::FallocateMode::Allocate).await?;
/// assert_eq!(dev.metadata().await?.len_bytes, 1 << 20);
/// # Ok(()) });
/// ```
pub use plugio_engine::FallocateMode;
/// A buffer type of your own, usable for writes (and, with
/// [`IoBufMut`], reads):
///
/// ```
/// struct Frame(Vec<u8>);
/// // SAFETY: the Vec's heap memory does not move with the Frame.
/// unsafe impl plugio::IoBuf for Frame {
///     fn stable_ptr(&self) -> *const u8 { self.0.as_ptr() }
///     fn bytes_init(&self) -> usize { self.0.len() }
///     fn bytes_total(&self) -> usize { self.0.capacity() }
/// }
/// # plugio::engine::doc_example(|dev| async move {
/// let (n, _) = dev.write_at(Frame(vec![3u8; 4096]), 0).await;
/// assert_eq!(n?, 4096);
/// # Ok(()) });
/// ```
pub use plugio_engine::IoBuf;
/// A buffer IO may write into (reads): [`IoBuf`] plus a stable mutable pointer and `set_init`. For example:
///
/// ```
/// # plugio::engine::doc_example(|dev| async move {
/// let (n, _) = dev.write_at(vec![4u8; 8192], 0).await;
/// n?;
/// let (n, buf) = dev.read_at(bytes::BytesMut::with_capacity(8192), 0).await;
/// assert_eq!(n?, 8192);
/// assert_eq!(buf.len(), 8192); // set_init marked what was read
/// # Ok(()) });
/// ```
pub use plugio_engine::IoBufMut;
/// A device's counters, shaped as `/proc/diskstats` plus the plug's, tags' and caches' figures. For example:
///
/// ```
/// # plugio::engine::doc_example(|dev| async move {
/// let (n, _) = dev.write_at(vec![0u8; 4096], 0).await;
/// n?;
/// let stats: plugio::IoStats = dev.iostats();
/// assert_eq!((stats.write.ios, stats.write.sectors), (1, 8));
/// # Ok(()) });
/// ```
pub use plugio_engine::IoStats;
/// Opens a file as a [`Device`] through io_uring, with `std::fs::OpenOptions` names (create, truncate, read-only). For example:
///
/// ```
/// # plugio::engine::doc_dir(|dir| async move {
/// use plugio::OpenOptions;
/// let path = dir.join("t.db");
/// let dev = OpenOptions::new().create(true).truncate(true).direct(false).open(&path).await?;
/// dev.set_len(8192).await?;
/// drop(dev); // one set of options per open file at a time
/// let ro = OpenOptions::new().read_only(true).direct(false).open(&path).await?;
/// assert!(ro.write_at(vec![0u8; 1], 0).await.0.is_err());
/// # Ok(()) });
/// ```
pub use plugio_engine::OpenOptions;
/// A page of a [`Region`]: a disjoint, aligned slice of one registered allocation, usable as an IO buffer. For example:
///
/// ```
/// # plugio::engine::doc_example(|dev| async move {
/// use plugio::Region;
/// let mut pages = Region::new(4 * 4096, 4096).into_pages(4096);
/// let page = pages.pop().expect("four pages");
/// let (n, page) = dev.read_at(page, 0).await; // into a buffer pool frame
/// assert_eq!(n?, 0, "the example file is empty");
/// assert_eq!(page.len(), 4096);
/// # Ok(()) });
/// ```
pub use plugio_engine::Page;
/// One aligned allocation cut into pages (a buffer pool's frames). For example:
///
/// ```
/// let pages = plugio::Region::new(8 * 4096, 4096).into_pages(4096);
/// assert_eq!(pages.len(), 8);
/// assert_eq!(pages[1].as_ptr() as usize, pages[0].as_ptr() as usize + 4096);
/// ```
pub use plugio_engine::Region;
/// How cores share a device's request tags. For example:
///
/// ```
/// use plugio::{DeviceOptions, TagSharing};
/// let opts = DeviceOptions { tag_sharing: TagSharing::PerCore { cores: 4 }, ..DeviceOptions::default() };
/// assert!(opts.validate().is_ok());
/// ```
pub use plugio_engine::TagSharing;

/// Waits for a duration on the current core's timers (a min-heap of deadlines). For example:
///
/// ```
/// use std::time::{Duration, Instant};
/// let ex = plugio::executor::LocalExecutor::new();
/// let t0 = Instant::now();
/// ex.run(async { plugio::sleep(Duration::from_millis(1)).await });
/// assert!(t0.elapsed() >= Duration::from_millis(1), "never early");
/// ```
pub use plugio_executor::sleep;
/// Spawns a `Send` task on the current core. For example:
///
/// ```
/// let ex = plugio::executor::LocalExecutor::new();
/// let v = ex.run(async { plugio::spawn(async { 40 + 2 }).await })?;
/// assert_eq!(v, 42);
/// # Ok::<_, plugio::executor::JoinError>(())
/// ```
pub use plugio_executor::spawn;
/// Runs a blocking closure on the blocking pool and awaits its result. For example:
///
/// ```
/// let ex = plugio::executor::LocalExecutor::new();
/// let n = ex.run(async { plugio::spawn_blocking(|| std::thread::current().id()).await })?;
/// assert_ne!(n, std::thread::current().id(), "ran on the blocking pool");
/// # Ok::<_, plugio::executor::JoinError>(())
/// ```
pub use plugio_executor::spawn_blocking;
/// Spawns a task that is not `Send` on the current core. For example:
///
/// ```
/// let ex = plugio::executor::LocalExecutor::new();
/// let rc = std::rc::Rc::new(5); // not Send: fine on this core
/// let v = ex.run(async move { plugio::spawn_local(async move { *rc }).await })?;
/// assert_eq!(v, 5);
/// # Ok::<_, plugio::executor::JoinError>(())
/// ```
pub use plugio_executor::spawn_local;
/// Runs a future with a deadline; `Err(Elapsed)` when it passes first. For example:
///
/// ```
/// use std::time::Duration;
/// let ex = plugio::executor::LocalExecutor::new();
/// let r = ex.run(plugio::timeout(Duration::from_millis(5), std::future::pending::<()>()));
/// assert!(r.is_err(), "elapsed");
/// ```
pub use plugio_executor::timeout;
/// Lets the core run its other tasks (and flush its plug) before this one goes on. For example:
///
/// ```
/// use std::{cell::RefCell, rc::Rc};
/// let ex = plugio::executor::LocalExecutor::new();
/// let order = Rc::new(RefCell::new(Vec::new()));
/// let o = order.clone();
/// ex.run(async move {
///     let other = {
///         let o = o.clone();
///         plugio::spawn_local(async move { o.borrow_mut().push("other task") })
///     };
///     plugio::yield_now().await; // the other ready task runs first
///     o.borrow_mut().push("after the yield");
///     other.await.unwrap();
/// });
/// assert_eq!(*order.borrow(), ["other task", "after the yield"]);
/// ```
pub use plugio_executor::yield_now;
/// A spawned task's handle: await it for the output, or abort it. For example:
///
/// ```
/// let ex = plugio::executor::LocalExecutor::new();
/// ex.run(async {
///     let handle: plugio::JoinHandle<u32> = plugio::spawn(async { 7 });
///     assert_eq!(handle.await.expect("no panic"), 7);
/// });
/// ```
pub use plugio_executor::JoinHandle;
/// A single-thread executor: one core, driven by `run` on the calling thread. For example:
///
/// ```
/// let ex = plugio::LocalExecutor::new(); // on this thread, no IO driver
/// assert_eq!(ex.run(async { 1 + 1 }), 2);
/// let io = plugio::runtime::local(plugio::RingConfig::default())?; // with io_uring
/// io.run(async {});
/// # Ok::<_, std::io::Error>(())
/// ```
pub use plugio_executor::LocalExecutor;
/// A thread-per-core runtime: one executor thread per core, spawn onto any, shut down. For example:
///
/// ```
/// let rt: plugio::Runtime = plugio::runtime::builder(plugio::RingConfig::default())
///     .cores(2)
///     .build()?;
/// let v = rt.block_on(async { 3 });
/// assert_eq!(v, 3);
/// rt.shutdown(plugio::ShutdownMode::Wait).expect("clean shutdown");
/// # Ok::<_, std::io::Error>(())
/// ```
pub use plugio_executor::Runtime;
/// How [`Runtime::shutdown`] treats tasks still running: wait, wait with a bound, or cancel. For example:
///
/// ```
/// use std::time::Duration;
/// let rt = plugio::runtime::builder(plugio::RingConfig::default()).cores(1).build()?;
/// rt.spawn_on(0, async { plugio::sleep(Duration::from_millis(1)).await });
/// rt.shutdown(plugio::ShutdownMode::WaitTimeout(Duration::from_secs(5)))
///     .expect("tasks done");
/// # Ok::<_, std::io::Error>(())
/// ```
pub use plugio_executor::ShutdownMode;

pub use plugio_macros::{main, test};

#[doc(hidden)]
#[path = "macro_support.rs"]
pub mod __macro_support;

/// `Result` with plugio's [`Error`].
///
/// ```
/// fn open_flags(read_only: bool) -> plugio::Result<i32> {
///     Ok(if read_only { 0 } else { 2 })
/// }
/// assert_eq!(open_flags(false)?, 2);
/// # Ok::<_, plugio::Error>(())
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runtimes whose cores drive IO through io_uring: see
/// [`engine::runtime`].
///
/// ```
/// let one = plugio::runtime::local(plugio::RingConfig::default())?;
/// one.run(async {});
/// # Ok::<_, std::io::Error>(())
/// ```
pub mod runtime {
    /// ```
    /// let rt = plugio::runtime::builder(plugio::RingConfig::default()).cores(1).build()?;
    /// rt.block_on(async {});
    /// # Ok::<_, std::io::Error>(())
    /// ```
    pub use plugio_engine::runtime::builder;
    /// ```
    /// let ex = plugio::runtime::local(plugio::RingConfig::default())?;
    /// let dev_ok = ex.run(async { plugio::fs::metadata(".").await.is_ok() });
    /// assert!(dev_ok);
    /// # Ok::<_, std::io::Error>(())
    /// ```
    pub use plugio_engine::runtime::local;
}
