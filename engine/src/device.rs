//! [`Device`]: the public, clonable handle a database issues IO through.
//!
//! Invariants:
//! - Every IO is checked (length, alignment, range, limits) before it gets a
//!   bio; a refused IO touches nothing else.
//! - An IO future that was polled once owns a bio on the polling core. If
//!   the future is dropped before the bio completes, the bio is orphaned:
//!   its buffer stays alive until the kernel is done with it, then the slot
//!   is recycled. The IO itself still happens (as in the kernel, a
//!   submitted bio cannot be taken back).
//! - IO futures are `Send`: they carry only the device handle and a bio id;
//!   after the first poll they must be polled on the same core (the
//!   executor never moves a task between cores).

use std::future::Future;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use plugio_device::{Backend, DmaBuf, Error, Geometry, InvalidInput, IoFlags, IoOp, OpKind};

use crate::bio::{forget_if_none, BioBuf, BioId, BioInfo, BioResult, Keep};
use crate::core::EngineCore;
use crate::options::DeviceOptions;
use crate::shared::DeviceShared;
pub use crate::shared::MAX_IO_BYTES;

/// A cheap, clonable handle to an open device, usable from the tasks of
/// any core of a plugio runtime.
///
/// Dropping the last handle closes the device: each core that used it
/// lets go of it at the end of its next tick once nothing of it is waiting
/// or in flight there, and the file is closed when the last core has.
/// The ordering domain ends with it: a write whose future was dropped
/// while it was in flight may still land after a new open of the file
/// (a new device state) has issued IO, and is not ordered against that
/// IO. Await every write (or drop none in flight) before dropping the
/// last handle of a file you reopen.
///
/// A handle belongs to the process that opened it: in a `fork()`ed child,
/// IO on a device the parent opened fails with
/// [`ErrorKind::Forked`](plugio_device::ErrorKind::Forked) (open it again
/// there); its `iostats` and `tags_in_use` still answer.
///
/// # IO futures
/// - **They stay on their core.** An IO future (`read_at`, `write_at`,
///   `sync_data`, ...) is `Send`, so it can be built on one thread and
///   spawned on any core ([`Runtime::spawn_on`](plugio_executor::Runtime::spawn_on)),
///   but its first poll issues the IO on the polling core, whose plug,
///   tags and ring finish it. Polling it again on another core **panics**
///   ("a plugio IO future was moved to another core after its first
///   poll"); dropping it there is fine. Move results between cores, not
///   futures.
/// - **Nothing happens until the first poll**, and the IO goes to the
///   device at the end of that tick (the plug). So `timeout(Duration::ZERO,
///   io)` always elapses, even for an IO that would be fast.
/// - **Dropping a future cancels the wait, not the IO.** An IO dropped
///   after its first poll, even in the same tick, while still in the plug,
///   is sent and completes: it still costs the device its bandwidth, and a
///   dropped write may land (or not: its outcome is unknown, as after a
///   crash). Its buffer is kept until the device is done with it. A
///   dropped `sync_data`/`sync_all` still runs: whether the writes before
///   it are durable is unknown until a later flush succeeds. The kernel's
///   block layer does the same (a plugged bio is never taken back). When
///   the executor closes (dropped, or shut down) the IO it never sent
///   (still plugged, or waiting for a tag or for an earlier overlapping
///   IO) is ended instead, and its buffer freed; what is in flight
///   completes as the executor's driver drains.
#[derive(Debug)]
pub struct Device {
    /// Dropped by hand in `drop`, before the cores are woken.
    shared: ManuallyDrop<Arc<DeviceShared>>,
}

impl Clone for Device {
    fn clone(&self) -> Self {
        // Relaxed: a count of handles; closing is decided by the Release
        // decrement in `drop` and the Acquire load in `is_closed`.
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        Device {
            shared: ManuallyDrop::new(Arc::clone(&self.shared)),
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let wake = self.shared.drop_handle();
        // SAFETY: dropped once, here; `self.shared` is not used after.
        unsafe { ManuallyDrop::drop(&mut self.shared) };
        // The last handle: the cores that used the device are woken only
        // now that this handle's reference is gone, so that whoever drops
        // the last reference (a woken core, or this thread) closes the
        // file before the core's next wait, or wakes it again by that.
        for waker in wake.into_iter().flatten() {
            waker.unpark();
        }
    }
}

impl Device {
    /// Opens a file or a block device at `path` for IO through io_uring
    /// (or the sync fallback where io_uring is refused), with `O_DIRECT`
    /// unless `options.direct` is false. The open itself is a blocking
    /// call on the calling thread (`open`, `statx`, sysfs reads: tens of
    /// microseconds on a local file system, longer on a slow or network
    /// one; the first writable open of a regular file on each file system
    /// in the process also probes whether it zeroes ranges, 1 to 5 ms on
    /// ext4); inside a task that must not stall its core, use
    /// [`OpenOptions::open`](crate::OpenOptions::open), which awaits the
    /// `open` and the file's metadata through io_uring (a block device's
    /// geometry is still read from sysfs on the calling thread). An NVMe
    /// namespace's character device
    /// (`/dev/ngXnY`) is opened for passthrough (`IORING_OP_URING_CMD`);
    /// use `NvmeBackend::open` with [`Device::with_backend`] to reach
    /// `/dev/nvmeXnY` through passthrough too.
    ///
    /// A file this process already has open with equal options is not
    /// opened again: the new handle shares the open device's state, as a
    /// clone of it would (one ordering domain, so overlapping IO through
    /// any of the handles keeps program order; one tag set; one set of
    /// iostats). Hard links, symlinks and device nodes of one disk count
    /// as the same file. One file has one set of options: while a handle
    /// of it is open, an open with other options is refused (it would be a
    /// second device state whose IO is not ordered against the first's).
    ///
    /// # Errors
    /// Invalid options; the path does not exist or cannot be opened;
    /// [`InvalidInput::PathKind`] at
    /// once, without opening it, when the path is a directory, FIFO, socket
    /// or other character device (see
    /// [`check_path_kind`](plugio_device::check_path_kind));
    /// [`ErrorKind::DirectIoRefused`](plugio_device::ErrorKind::DirectIoRefused)
    /// when the file system refuses `O_DIRECT` (set `direct: false`);
    /// [`InvalidInput::AlreadyOpen`] when the file is open through a
    /// handle with other options (the message names them).
    pub fn open(path: impl AsRef<Path>, options: DeviceOptions) -> Result<Device, Error> {
        options.validate()?;
        let path = path.as_ref();
        // stat, not open: an open of a FIFO would block until a writer came.
        plugio_device::check_path_kind(path)?;
        let key = crate::open_files::FileKey::of(path);
        let mut registry = crate::open_files::Registry::lock();
        if let Some(k) = key {
            if let Some(shared) = registry.find(k, &options).map_err(|e| e.with_path(path))? {
                return Ok(Device::of(shared));
            }
        }
        let device = if plugio_device::is_passthrough_path(path) {
            let ns = plugio_device::backend::nvme::NvmeBackend::open(path)?;
            Self::with_backend(Arc::new(ns), Some(path.to_path_buf()), options)?
        } else {
            let backend = plugio_device::backend::file::OpenOptions::new()
                .write(!options.read_only)
                .direct(options.direct)
                .backend(options.backend)
                .open(path)?;
            Self::with_backend(Arc::new(backend), Some(path.to_path_buf()), options)?
        };
        if let Some(k) = key {
            registry.insert(k, &device.shared);
        }
        Ok(device)
    }

    /// A device over `fd`, just opened from `path` with `options` (see
    /// [`OpenOptions::open`](crate::OpenOptions::open)): shares the state of
    /// the same file already open with equal options (the new descriptor is
    /// closed then), as [`Device::open`] does.
    pub(crate) fn from_fd(
        fd: std::os::fd::OwnedFd,
        path: &Path,
        options: DeviceOptions,
    ) -> Result<Device, Error> {
        let file = std::fs::File::from(fd);
        let key = crate::open_files::FileKey::of_file(&file);
        let mut registry = crate::open_files::Registry::lock();
        if let Some(k) = key {
            if let Some(shared) = registry.find(k, &options).map_err(|e| e.with_path(path))? {
                return Ok(Device::of(shared));
            }
        }
        let backend = plugio_device::FileBackend::from_fd(
            file.into(),
            path,
            options.direct,
            options.backend,
        )?;
        let device = Self::with_backend(Arc::new(backend), Some(path.to_path_buf()), options)?;
        if let Some(k) = key {
            registry.insert(k, &device.shared);
        }
        Ok(device)
    }

    /// Wraps an already opened backend (a `MemDevice`, a `SyncBackend`, a
    /// passthrough namespace).
    ///
    /// # Errors
    /// Invalid options.
    pub fn with_backend(
        backend: Arc<dyn Backend>,
        path: Option<PathBuf>,
        options: DeviceOptions,
    ) -> Result<Device, Error> {
        let shared = DeviceShared::new(backend, path, options)?;
        Ok(Device::of(Arc::new(shared)))
    }

    /// A handle of `shared`, whose handle count already counts it.
    fn of(shared: Arc<DeviceShared>) -> Device {
        Device {
            shared: ManuallyDrop::new(shared),
        }
    }

    /// The device's `tracing` span, `plugio_device` with the fields `dev`
    /// (a process-unique id), `path` and `backend`. The engine's events
    /// about the device (and, with the crate feature `trace-io`, one
    /// `trace` event per IO issued and completed, target `plugio::io`)
    /// have it as their parent; enter it, or name it as `parent:`, to put
    /// your own events in it.
    ///
    /// ```
    /// use plugio::device::backend::mem::{MemConfig, MemDevice};
    /// use plugio::{Device, DeviceOptions};
    /// use std::sync::Arc;
    ///
    /// let mem = MemDevice::new(MemConfig::default());
    /// let dev = Device::with_backend(Arc::new(mem), None, DeviceOptions::default())?;
    /// let _in_device = dev.span().enter();
    /// tracing::info!("checkpoint started"); // reported inside plugio_device{dev=..}
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn span(&self) -> &tracing::Span {
        &self.shared.span
    }

    /// The path the device was opened from (`None` for a backend passed to
    /// [`Device::with_backend`] without one), which IO errors name. One
    /// file is one device state in a process: a handle opened under
    /// another name of an open file (after a rename, through a link, a
    /// `/dev/disk/by-id` alias of a block device) shares it and reports
    /// the path of the first open.
    pub fn path(&self) -> Option<&Path> {
        self.shared.path.as_deref()
    }

    /// The device's geometry (block sizes, limits, alignment, capacity).
    pub fn geometry(&self) -> &Geometry {
        &self.shared.geometry
    }

    /// The options the device was opened with.
    pub fn options(&self) -> &DeviceOptions {
        &self.shared.opts
    }

    /// The largest request sent to the backend, in bytes; larger IOs are
    /// split.
    pub fn max_request_bytes(&self) -> u64 {
        self.shared.max_request_bytes
    }

    /// A snapshot of the device's iostats, summed over every core that
    /// used it. See [`IoStats`](crate::IoStats).
    pub fn iostats(&self) -> crate::IoStats {
        self.shared.iostats()
    }

    /// Tags held right now by requests in flight, from all cores. 0 in a
    /// forked child for a device its parent opened (the tags the parent's
    /// requests held at the fork are the parent's; the child's IO on such
    /// a device is refused).
    pub fn tags_in_use(&self) -> u32 {
        if self.shared.inherited() {
            return 0;
        }
        self.shared.tag_sets.iter().map(|t| t.busy()).sum()
    }

    /// A buffer aligned for this device's direct IO, of `len_bytes`. With
    /// the device's `buffer_cache` option on (the default) and an
    /// alignment of at most 4096: from the core's registered buffer arena
    /// when it has a free chunk that fits (IO on it then goes out as
    /// `READ_FIXED`/`WRITE_FIXED`, as fio's `fixedbufs` does), else from
    /// the core's buffer cache; contents not zeroed (whatever the last user
    /// left). Otherwise a fresh zeroed allocation.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let mut buf = dev.alloc_buf(4096);
    /// assert_eq!(buf.len(), 4096);
    /// buf.as_mut_slice().fill(1);
    /// let (written, _buf) = dev.write_at(buf, 0).await;
    /// assert_eq!(written?, 4096);
    /// # Ok(()) });
    /// ```
    ///
    /// # Panics
    /// When the allocation fails, or `len_bytes` rounded up to the
    /// alignment is more than `isize::MAX` (see
    /// [`DmaBuf::heap`](plugio_device::DmaBuf::heap)). A length that may
    /// be absurd (read from disk or the network) is better checked first;
    /// [`Device::read_alloc_at`] does, and refuses it as invalid input.
    pub fn alloc_buf(&self, len_bytes: usize) -> DmaBuf {
        self.shared.alloc_buf(len_bytes)
    }

    /// Reads `len_bytes` at `offset_bytes` into a new buffer from
    /// [`alloc_buf`](Self::alloc_buf) (so from the registered arena when it
    /// has room: `READ_FIXED`). The returned buffer's length is the number
    /// of bytes read: shorter at end of file, 0 at or past it.
    ///
    /// # Errors
    /// Invalid input (zero, unaligned, past a block device's capacity,
    /// above [`MAX_IO_BYTES`]) before submission; the device's error
    /// otherwise. A read at or past a file's end is no error: it reads
    /// 0 bytes.
    pub async fn read_alloc_at(
        &self,
        offset_bytes: u64,
        len_bytes: usize,
    ) -> Result<DmaBuf, Error> {
        // Refuse absurd lengths before allocating the buffer for them.
        check_len(len_bytes as u64, true).map_err(|e| self.name_err(e))?;
        let buf = self.alloc_buf(len_bytes);
        let (res, buf) = self.read_at(buf, offset_bytes).await;
        res.map(|_| buf)
    }

    /// Makes the file's completed writes and its metadata durable: `fsync`
    /// (`IORING_OP_FSYNC`), as [`std::fs::File::sync_all`]. On a block
    /// device or NVMe namespace it flushes the volatile write cache. Covers
    /// the writes that completed before it was issued (with
    /// [`DeviceOptions::overlap_order`], also those issued before it on
    /// this core).
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let (n, _) = dev.write_at(vec![1u8; 4096], 0).await;
    /// n?;
    /// dev.sync_all().await?;
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// The kernel's error (`EIO` after a failed writeback, for one).
    pub fn sync_all(&self) -> impl Future<Output = Result<(), Error>> + '_ {
        UnitIo(self.io(OpKind::Fsync, IoFlags::NONE, 0, 0))
    }

    /// Makes the file's completed writes durable, and only the metadata
    /// needed to read them back (its size, not its times): `fdatasync`
    /// (`IORING_OP_FSYNC` with `DATASYNC`), as
    /// [`std::fs::File::sync_data`]; an NVMe Flush on a passthrough
    /// namespace. Covers what [`sync_all`](Self::sync_all) covers.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let (n, _) = dev.write_at(vec![1u8; 4096], 0).await;
    /// n?;
    /// dev.sync_data().await?;
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// As [`sync_all`](Self::sync_all).
    pub fn sync_data(&self) -> impl Future<Output = Result<(), Error>> + '_ {
        UnitIo(self.io(OpKind::Flush, IoFlags::NONE, 0, 0))
    }

    /// Zeroes `[offset_bytes, offset_bytes + len_bytes)` with the device's
    /// zeroing op only, no fallback to writing zeroes (the kernel's
    /// `BLKDEV_ZERO_NOFALLBACK`); [`write_zeroes`](Self::write_zeroes), in
    /// `zeroes.rs`, falls back. A range longer than [`MAX_IO_BYTES`] is
    /// split as [`discard`](Self::discard) splits one.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// use plugio::ErrorKind;
    /// let (n, _) = dev.write_at(vec![7u8; 4096], 0).await;
    /// n?;
    /// match dev.write_zeroes_no_fallback(0, 4096).await {
    ///     Ok(()) => {
    ///         let (n, buf) = dev.read_at(vec![1u8; 4096], 0).await;
    ///         assert_eq!(n?, 4096);
    ///         assert!(buf.iter().all(|&b| b == 0));
    ///     }
    ///     // tmpfs has no FALLOC_FL_ZERO_RANGE.
    ///     Err(e) if *e.kind() == ErrorKind::Unsupported => {}
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// As `write_zeroes`, and [`ErrorKind::Unsupported`] where the device
    /// or file system has no zeroing op (tmpfs has no
    /// `FALLOC_FL_ZERO_RANGE`): call `write_zeroes` to have zeroes written
    /// then.
    ///
    /// [`ErrorKind::Unsupported`]: plugio_device::ErrorKind::Unsupported
    pub async fn write_zeroes_no_fallback(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), Error> {
        self.range_op(OpKind::WriteZeroes, offset_bytes, len_bytes)
            .await
    }

    /// Discards `[offset_bytes, offset_bytes + len_bytes)`: tells the
    /// device the range's data is no longer needed (`BLKDISCARD` on a
    /// block device, `FALLOC_FL_PUNCH_HOLE` on a file, NVMe Dataset
    /// Management Deallocate); reads of it then return zeroes on a file,
    /// and whatever the device says on a block device (see
    /// `discard_zeroes_data` in its queue limits). Ordered against
    /// overlapping IO as a write is. A range longer than
    /// [`MAX_IO_BYTES`] is split into parts of
    /// [`RANGE_PART_BYTES`](crate::RANGE_PART_BYTES) issued together, as
    /// the kernel's `blkdev_issue_discard` splits one at the queue's
    /// `max_discard_sectors`; it returns when every part has completed.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let (n, _) = dev.write_at(vec![7u8; 8192], 0).await;
    /// n?;
    /// dev.discard(0, 4096).await?;
    /// let (n, buf) = dev.read_at(vec![1u8; 4096], 0).await;
    /// assert_eq!(n?, 4096);
    /// assert!(buf.iter().all(|&b| b == 0), "a file's discarded range reads as zeroes");
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// Before anything is issued: a zero length, an offset or length off
    /// the direct-IO alignment, a range past the device's end
    /// ([`InvalidInput`]); `PermissionDenied` on a read-only device. Then
    /// the device's error (`Unsupported` where it has no discard); for a
    /// split range, the first part's error, the other parts done.
    pub fn discard(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> impl Future<Output = Result<(), Error>> + '_ {
        self.range_op(OpKind::Discard, offset_bytes, len_bytes)
    }

    /// Sends a no-op through the whole path (bio, plug, tag, dispatch,
    /// completion; `IORING_OP_NOP` on an io_uring backend): measures the
    /// runtime's own cost per IO.
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`](plugio_device::ErrorKind::NoDriver) off a
    /// plugio core or on a core without a device driver (an executor
    /// built without one), `Forked` in a forked child for a device its
    /// parent opened, and a broken ring's error.
    pub fn nop(&self) -> impl Future<Output = Result<(), Error>> + '_ {
        UnitIo(self.io(OpKind::Nop, IoFlags::NONE, 0, 0))
    }

    /// Starts an explicit plug for `nr_ios` IOs that the caller is about to
    /// issue (the kernel's `blk_start_plug_nr_ios`): until the guard is
    /// dropped, the plug's count trigger is the larger of `nr_ios` bios
    /// (capped at the queue depth) and `plug_max_count`, so a guard only
    /// ever raises it; dropping the guard flushes the plug
    /// (`blk_finish_plug`). Only the count is raised: the byte trigger
    /// (`DeviceOptions::plug_flush_bytes`, default 128 KiB) still flushes
    /// early, as the kernel's `BLK_PLUG_FLUSH_SIZE` does under any plug
    /// (set it to 0 for a plug bounded by count alone). The end of the
    /// tick still flushes, as a sleeping task does in the kernel. The
    /// guard is the calling core's
    /// and not `Send` (a task holding it across an `.await` is spawned
    /// with `spawn_local`); it covers the IOs whose futures are first
    /// polled while it lives.
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`](plugio_device::ErrorKind::NoDriver) outside a plugio runtime.
    pub fn plug(&self, nr_ios: usize) -> Result<PlugGuard, Error> {
        let core = EngineCore::current()?;
        let cap = self.shared.opts.queue_depth as usize;
        {
            let mut plug = core.plug.borrow_mut();
            plug.guards += 1;
            plug.nr_ios = plug.nr_ios.max(nr_ios.min(cap));
        }
        Ok(PlugGuard { core })
    }

    /// One IO without memory (see [`BioFuture`]) through the whole path.
    pub(crate) fn io(
        &self,
        op: OpKind,
        flags: IoFlags,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> BioFuture<'_> {
        debug_assert!(!op.has_data(), "IO on memory has its own future (buf_io)");
        BioFuture {
            shared: &self.shared,
            op,
            flags,
            offset_bytes,
            len_bytes,
            issued: None,
            done: false,
        }
    }

    /// `e` naming this device's path (see [`named`]): for the errors the
    /// IO methods make themselves, outside the IO futures.
    #[cold]
    pub(crate) fn name_err(&self, e: Error) -> Error {
        name_device(&self.shared, e)
    }

    /// What all handles of this device share.
    pub(crate) fn shared(&self) -> &Arc<DeviceShared> {
        &self.shared
    }

    /// The checks of an op's range and kind that do not depend on the
    /// backend: its end at most `i64::MAX` (offsets are signed in the
    /// kernel, a `loff_t`, whatever the capacity), and no write on a
    /// read-only device.
    #[inline(always)]
    pub(crate) fn check_end_and_mode(
        shared: &DeviceShared,
        op: OpKind,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), Error> {
        if op.has_range() {
            let end = offset_bytes.checked_add(len_bytes);
            if end.is_none_or(|e| e > i64::MAX as u64) {
                return Err(Error::invalid(InvalidInput::Range {
                    offset_bytes,
                    len_bytes,
                    capacity_bytes: shared.geometry.capacity_bytes.unwrap_or(i64::MAX as u64),
                }));
            }
            plugio_device::check_file_size_limit(
                shared.geometry.kind,
                op,
                offset_bytes,
                len_bytes,
                || file_len_bytes(shared),
            )?;
        }
        if shared.opts.read_only && op.is_write() {
            return Err(Error::new(plugio_device::ErrorKind::PermissionDenied)
                .with_context("the device was opened read-only (DeviceOptions::read_only)"));
        }
        Ok(())
    }

    /// Checks an IO against the device before it gets a bio.
    #[inline(always)]
    pub(crate) fn check(shared: &DeviceShared, init: &BioInit) -> Result<(), Error> {
        if !init.op.has_range() {
            // A no-op, flush or fsync: no data (`has_data` implies
            // `has_range`), no range, not a write (so read-only does not
            // refuse it), nothing for the backend to check: its length
            // is all there is to check. (One test of the op, where the
            // general path below tested its kind four times.)
            debug_assert!(!init.op.has_data() && !init.op.is_write());
            return check_len(init.len_bytes, false);
        }
        check_len(init.len_bytes, init.op.has_data())?;
        Self::check_end_and_mode(shared, init.op, init.offset_bytes, init.len_bytes)?;
        if init.flags.contains(IoFlags::PREFLUSH) {
            refuse_preflush_on_iopoll_ring(shared)?;
        }
        // One buffer on a device the geometry checks (the common case):
        // the check's fast path, its op in registers. (The full check's
        // cold call below takes its op by reference, which wrote the op to
        // memory before the fast path ran.)
        if shared.geometry_check_only && init.op.has_data() && !matches!(init.buf, BioBuf::Many(_))
        {
            let seg = [init.buf.first_iovec()];
            let op = IoOp {
                kind: init.op,
                offset_bytes: init.offset_bytes,
                len_bytes: init.len_bytes,
                segments: &seg,
                fixed_buf: None,
                flags: init.flags,
            };
            if plugio_device::check_op_fast(&shared.geometry, &op) {
                return Ok(());
            }
        }
        // One buffer is checked without a heap vector.
        let mut one = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }];
        let mut many = Vec::new();
        let segments: &[libc::iovec] = match &init.buf {
            _ if !init.op.has_data() => &[],
            BioBuf::Many(_) => {
                init.buf.push_iovecs(0, init.len_bytes, &mut many);
                &many
            }
            buf => {
                one[0] = buf.first_iovec();
                &one
            }
        };
        let op = IoOp {
            kind: init.op,
            offset_bytes: init.offset_bytes,
            len_bytes: init.len_bytes,
            segments,
            fixed_buf: None,
            flags: init.flags,
        };
        if shared.geometry_check_only {
            plugio_device::check_op(&shared.geometry, &op)
        } else {
            shared.backend.check(&op)
        }
    }
}

/// The length of the device's file, read now (`fstat`); `None` without
/// a file or where it cannot be read.
#[cold]
pub(crate) fn file_len_bytes(shared: &DeviceShared) -> Option<u64> {
    let fd = shared.backend.file_fd()?;
    plugio_device::file_size_limit::fd_len_bytes(std::os::fd::AsFd::as_fd(&*fd))
}

/// Refuses a zero length for a data op and a length above
/// [`MAX_IO_BYTES`].
#[inline]
fn check_len(len_bytes: u64, has_data: bool) -> Result<(), Error> {
    if has_data && len_bytes == 0 {
        return Err(Error::invalid(InvalidInput::ZeroLength));
    }
    if len_bytes > MAX_IO_BYTES {
        return Err(Error::invalid(InvalidInput::Length {
            len_bytes,
            max_bytes: MAX_IO_BYTES,
        }));
    }
    Ok(())
}

/// An explicit plug; see [`Device::plug`]. Flushes on drop.
pub struct PlugGuard {
    core: std::rc::Rc<EngineCore>,
}

impl std::fmt::Debug for PlugGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlugGuard")
            .field("core", &self.core.core)
            .finish()
    }
}

impl Drop for PlugGuard {
    fn drop(&mut self) {
        {
            let mut plug = self.core.plug.borrow_mut();
            plug.guards -= 1;
            if plug.guards == 0 {
                plug.nr_ios = 0;
            }
        }
        self.core.flush();
        if let Err(e) = plugio_device::submit_now() {
            tracing::warn!(error = %e, "submit at the end of an explicit plug failed; the park will retry");
        }
    }
}

pub(crate) struct BioInit {
    pub op: OpKind,
    pub flags: IoFlags,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub buf: BioBuf,
    /// The memory is a bounce buffer (counted in iostats at issue).
    pub bounced: bool,
}

/// An issued bio: its core and its id in that core's bio table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Issued {
    uid: u64,
    id: BioId,
    /// When it was issued, if a subscriber wanted its `plugio::io` events
    /// then (feature `trace-io`).
    #[cfg(feature = "trace-io")]
    at: Option<std::time::Instant>,
}

/// Checks the IO that `init` makes and plugs it as a bio on the calling
/// core; the bio's waker is `cx`'s. The bio's result (an error, with the
/// memory handed back) when it is refused or there is no core here.
/// Inlined into the IO futures' polls (as the single IO future's poll had
/// it). `init` is called after the waker's clone, so that what it reads
/// (a future's fields) is read then, not kept on the stack across the
/// call.
#[inline(always)]
pub(crate) fn issue_inline(
    shared: &Arc<DeviceShared>,
    init: impl FnOnce() -> BioInit,
    cx: &Context<'_>,
) -> Result<Issued, BioResult> {
    // The waker first: its clone (inline for a task of this core, else
    // the issue's one call), made here, with little live, makes the
    // values computed below stay in registers (made after the bio's
    // allocation, they were spilled around it). A refused IO drops it
    // again (cold).
    let waker = plugio_executor::clone_waker(cx.waker());
    let init = init();
    if let Err(e) = Device::check(shared, &init) {
        forget_if_none(init.buf);
        return Err(Err(e));
    }
    // A forked child may not use its parent's rings (the fork guard), nor
    // its parent's devices: their tags may be held by requests that only
    // the parent completes (a child's IO waited for them forever; found
    // by a break-it helper).
    // (Two tests, each with its own way out: a `Result` merged from both
    // was built on the stack on every IO.)
    let core = match current_core() {
        Some(c) => c,
        None => match current_core_slow() {
            Ok(c) => c,
            Err(e) => {
                forget_if_none(init.buf);
                return Err(Err(e));
            }
        },
    };
    // SAFETY: `core` names a state that the thread's `CORES` holds (see
    // `current_core`); states leave it only in `EngineCore::create` and
    // in a closing executor's hook (and in the thread's exit), which
    // nothing below reaches before `plug_bio` returns: the last use of
    // `core`. The flush it may ask for, the one step that could reach
    // them, runs after that, with a count of its own.
    let core: &EngineCore = unsafe { &*core };
    if !core.serves_generation(shared.fork_generation) {
        let e = fork_refusal(core);
        forget_if_none(init.buf);
        return Err(Err(e));
    }
    let dev = core.dev_index(shared);
    if init.bounced {
        core.count_bounce(dev, init.len_bytes);
    }
    let info = BioInfo {
        op: init.op,
        flags: init.flags,
        offset_bytes: init.offset_bytes,
        len_bytes: init.len_bytes,
    };
    let (id, hit) = {
        let mut bios = core.bios.borrow_mut();
        let (id, hit, bio) = bios.alloc(shared.opts.bio_cache);
        bio.dev = dev;
        bio.op = info.op;
        bio.flags = info.flags;
        bio.offset_bytes = info.offset_bytes;
        bio.len_bytes = info.len_bytes;
        bio.set_buf(init.buf);
        bio.set_waker(waker);
        (id, hit)
    };
    let uid = core.uid;
    if let Some(full_only) = core.plug_bio(dev, id, &info, hit) {
        EngineCore::flush_now(uid, full_only);
    }
    Ok(Issued {
        uid,
        id,
        #[cfg(feature = "trace-io")]
        at: trace_issued(shared, &info, id),
    })
}

/// The calling core's engine state when it exists and is the last-used
/// one (every IO but a core's first): a pointer, with no reference count
/// taken or dropped per IO (an `Rc` clone and its drop were two
/// read-modify-writes and a test on every issue). The state stays in the
/// thread's `CORES` (which holds an `Rc` of it) until the executor's
/// closing hook or a replacing `create` forgets it.
#[inline(always)]
fn current_core() -> Option<*const EngineCore> {
    let uid = plugio_executor::core_uid()?;
    EngineCore::with_uid(uid, |c| c as *const EngineCore)
}

/// [`current_core`] for a core's first IO (its state made here) or off a
/// core (the error `EngineCore::current` gives). The `Rc` it drops is
/// not the last one: `CORES` holds the state.
#[cold]
#[inline(never)]
fn current_core_slow() -> Result<*const EngineCore, Error> {
    EngineCore::current().map(|c| Rc::as_ptr(&c))
}

impl Issued {
    /// The bio's result once it completed (its slot is freed then), else
    /// records `cx`'s waker. An IO whose executor was dropped before it
    /// was sent (an embedder's poll inside `LocalExecutor::enter`, then
    /// the executor gone) fails with `ECANCELED`.
    ///
    /// # Panics
    /// When polled on another thread than the one that issued it (its
    /// state lives there), or on another core of that thread while the
    /// issuing core's executor still exists.
    #[inline]
    pub(crate) fn poll(self, cx: &Context<'_>) -> Poll<BioResult> {
        let Issued { uid, id, .. } = self;
        let ready = EngineCore::with_uid(uid, |ec| ec.bios.borrow_mut().take_result(id))
            .expect("a plugio IO future was moved to another core after its first poll");
        if let Some(r) = ready {
            return Poll::Ready(r);
        }
        // Not done yet: only this IO's own core can finish it. A future
        // moved to another executor on this thread would otherwise find its
        // old core's state (kept while busy) and wait forever: its plug is
        // never flushed and its completions never come. (Checked only
        // here, not on the ready path.)
        if plugio_executor::core_uid() != Some(uid) {
            return Self::poll_off_core(uid, id);
        }
        let replaced = EngineCore::with_uid(uid, |ec| {
            if ec.forked() {
                return Err(());
            }
            let mut bios = ec.bios.borrow_mut();
            let Some(bio) = bios.get_mut(id) else {
                return Ok(None);
            };
            match &bio.waker {
                Some(w) if w.will_wake(cx.waker()) => Ok(None),
                _ => Ok(bio.waker.replace(cx.waker().clone())),
            }
        });
        match replaced {
            Some(Err(())) => Self::poll_forked(uid, id),
            // The waker replaced, if any, is dropped here, with the bio
            // table released: its drop is the caller's code, which may
            // issue IO (found by a break-it helper).
            _ => Poll::Pending,
        }
    }

    /// The byte count of a bio that completed without an error, taken
    /// and its slot freed, where that calls nothing: its core is the
    /// thread's last-used one, its bio table is not borrowed, and the bio
    /// is the simple case of [`BioTable::take_ok_cached`](crate::bio::BioTable::take_ok_cached).
    /// `None`, with nothing changed, in every other case: [`Issued::poll`]
    /// then does what this did and the rest.
    #[inline(always)]
    pub(crate) fn take_ok(self) -> Option<u64> {
        let Issued { uid, id, .. } = self;
        EngineCore::with_last(uid, |ec| ec.bios.try_borrow_mut().ok()?.take_ok_cached(id)).flatten()
    }

    /// [`Issued::poll`] of an unfinished bio in a forked child: it was
    /// plugged or in flight at the fork, and the inherited core never
    /// sends or reaps anything (the ring is the parent's), so it would
    /// wait forever. It ends with `ErrorKind::Forked`; the bio is
    /// orphaned (the child's copy of it never completes). Safe for the
    /// memory: the kernel moves the data of IO in flight at the fork into
    /// the parent's pages (pinned pages are copied for the child at fork),
    /// never the child's.
    #[cold]
    fn poll_forked(uid: u64, id: BioId) -> Poll<BioResult> {
        // The waker is dropped after the bio table is released (see
        // `Bio::orphan`).
        let waker = EngineCore::with_uid(uid, |ec| {
            ec.bios
                .borrow_mut()
                .get_mut(id)
                .and_then(|bio| bio.orphan(None))
        });
        drop(waker);
        Poll::Ready(Err(plugio_device::fork::forked_error().with_context(
            "this IO was in flight at the fork (it completes in the parent only)",
        )))
    }

    /// [`Issued::poll`] of an unfinished bio off its core: cancelled when
    /// its executor is gone (the thread's device driver no longer serves
    /// it, so nothing will send or reap it), else a misuse.
    #[cold]
    fn poll_off_core(uid: u64, id: BioId) -> Poll<BioResult> {
        assert!(
            !plugio_device::driver_serves(uid),
            "a plugio IO future was moved to another core after its first poll"
        );
        // The executor of `uid` is gone, so its state may be abandoned:
        // what is still in its plug or FIFOs ends with ECANCELED (what was
        // in flight was reaped as its driver dropped).
        let r = EngineCore::with_uid(uid, |ec| {
            ec.abandon();
            ec.bios.borrow_mut().take_result(id)
        });
        Poll::Ready(r.flatten().unwrap_or_else(|| {
            Err(Error::from_errno(libc::ECANCELED)
                .with_context("the executor this IO was issued on was dropped before it ran"))
        }))
    }

    /// Lets go of the bio as its future is dropped before taking the
    /// result: a finished bio is freed (its result dropped); an unfinished
    /// one is orphaned and keeps `keep`, the memory the kernel may still
    /// use, until it completes (on another thread than the bio's core,
    /// through the device's remote orphan list).
    #[cold]
    #[inline(never)]
    pub(crate) fn release(self, shared: &DeviceShared, keep: Option<Keep>) {
        let Issued { uid, id, .. } = self;
        let Some(ec) = EngineCore::by_uid(uid) else {
            // Not on the core's thread (or that thread is gone, and its bio
            // table with it, after the driver drained the ring): the core
            // frees the bio at this device's next completion batch or plug
            // flush on it.
            shared.orphan_remote(uid, id, keep);
            return;
        };
        let mut bios = ec.bios.borrow_mut();
        // A finished bio is freed with its result; an unfinished one is
        // orphaned. Its waker is dropped after the bio table is released
        // (see `Bio::orphan`).
        let mut waker = None;
        if bios.take_result(id).is_none() {
            if let Some(bio) = bios.get_mut(id) {
                waker = bio.orphan(keep);
            }
        }
        drop(bios);
        drop(waker);
    }
}

/// The future of one IO without caller memory (flush, fsync, discard,
/// zeroing, no-op): checks and plugs it on first poll, then waits for its
/// bio to complete. It borrows the device handle (no reference count
/// touched per IO). IO on caller buffers has its own future (`buf_io`).
pub(crate) struct BioFuture<'a> {
    shared: &'a Arc<DeviceShared>,
    /// The IO, issued as a bio at the first poll.
    op: OpKind,
    flags: IoFlags,
    offset_bytes: u64,
    len_bytes: u64,
    /// The bio, from the first poll until its result is taken.
    issued: Option<Issued>,
    /// The result was handed out.
    done: bool,
}

impl BioFuture<'_> {
    /// The IO's result as the future hands it out: an error names the IO
    /// and the device (see [`name_io`]). The success path is one test of
    /// the result.
    #[inline(always)]
    fn named(&self, r: BioResult) -> BioResult {
        match r {
            Ok(n) => Ok(n),
            Err(e) => Err(name_io(
                self.shared,
                e,
                self.op,
                self.offset_bytes,
                self.len_bytes,
            )),
        }
    }
}

/// The error of an IO as its future hands it out: it names the IO (`op`
/// on `len_bytes` at `offset_bytes`) when the device reported it (not
/// invalid input or a misuse, whose text says what is wrong), says so
/// when a write failed with a permission error because the block device
/// became read-only after it was opened (`blockdev --setro`), and names
/// the device's path ([`name_device`]): so that a caller with several
/// devices sees which one failed, and where.
#[cold]
#[inline(never)]
pub(crate) fn name_io(
    shared: &DeviceShared,
    e: Error,
    op: OpKind,
    offset_bytes: u64,
    len_bytes: u64,
) -> Error {
    use plugio_device::ErrorKind as K;
    let device_said = matches!(
        e.kind(),
        K::Io { .. }
            | K::Nvme { .. }
            | K::PermissionDenied
            | K::OutOfSpace
            | K::Unsupported
            | K::Cancelled
    );
    let e = if device_said && e.io().is_none() {
        e.with_io(op, offset_bytes, len_bytes)
    } else {
        e
    };
    let e = if *e.kind() == K::PermissionDenied && op.is_write() && became_read_only(shared) {
        e.with_context(BECAME_READ_ONLY)
    } else if refused_by_iopoll_ring(shared, &e, op) {
        // The kernel's bare EINVAL, said as what it means (found by a
        // break-it helper).
        Error::new(K::Unsupported)
            .with_io(op, offset_bytes, len_bytes)
            .with_context(IOPOLL_REFUSES)
    } else if unpollable_on_iopoll_ring(shared, &e, op) {
        e.with_context(IOPOLL_UNPOLLABLE)
    } else if past_end_of_shrunk_device(shared, &e, offset_bytes, len_bytes) {
        e.with_context(SHRANK)
    } else {
        e
    };
    name_device(shared, e)
}

/// Refuses a write with [`IoFlags::PREFLUSH`] on a core whose ring
/// busy-polls: its flush goes as a linked fsync, which the kernel refuses
/// there with a bare `EINVAL` (it did, after the SQEs were built; noted in
/// the last stop). Checked before the IO gets a bio.
#[cold]
#[inline(never)]
fn refuse_preflush_on_iopoll_ring(shared: &DeviceShared) -> Result<(), Error> {
    if shared.backend.kind() == plugio_device::BackendKind::Uring
        && plugio_device::ring::current_is_iopoll()
    {
        return Err(Error::new(plugio_device::ErrorKind::Unsupported).with_context(IOPOLL_REFUSES));
    }
    Ok(())
}

/// What an op the kernel refused on a ring that busy-polls is told.
pub(crate) const IOPOLL_REFUSES: &str = "this core's io_uring busy-polls its completions \
     (RingConfig::iopoll), and the kernel takes only O_DIRECT reads and writes on such a ring, \
     never an fsync or fallocate (nor a write's PREFLUSH, a linked fsync): do this from a core \
     whose ring is built without iopoll";

/// What a read or write the kernel could not poll on such a ring is told.
const IOPOLL_UNPOLLABLE: &str = "this core's io_uring busy-polls its completions \
     (RingConfig::iopoll), which the kernel does only for O_DIRECT IO on devices with poll \
     queues (NVMe with nvme.poll_queues=N; queue/io_poll is 0 here, or the IO is buffered): \
     build this core's ring without iopoll for this device";

/// Whether `e` is the kernel's `EOPNOTSUPP` for a read or write on this
/// core's busy-polling ring: the device has no poll queues, or the IO is
/// buffered. A file system may still take the writes (ext4 on a virtio
/// disk did, and refused the reads; found by a helper embedding plugio).
fn unpollable_on_iopoll_ring(shared: &DeviceShared, e: &Error, op: OpKind) -> bool {
    matches!(op, OpKind::Read | OpKind::Write)
        && *e.kind() == plugio_device::ErrorKind::Unsupported
        && e.context().is_none()
        && shared.backend.kind() == plugio_device::BackendKind::Uring
        && plugio_device::ring::current_is_iopoll()
}

/// Whether `e` is the kernel's `EINVAL` for an fsync or fallocate op that
/// went on this core's ring, which busy-polls (`IORING_SETUP_IOPOLL`):
/// the kernel refuses every op it cannot poll there. Only ops of the
/// io_uring file backend that become `IORING_OP_FSYNC` or
/// `IORING_OP_FALLOCATE` SQEs: a block device's discard and zeroing go to
/// the blocking pool as ioctls, a sync backend's ops never reach a ring,
/// so their `EINVAL` is the kernel's own word (a break-it helper found a
/// shrunk device's discard told it was the ring).
fn refused_by_iopoll_ring(shared: &DeviceShared, e: &Error, op: OpKind) -> bool {
    let sqe_on_ring = match op {
        OpKind::Flush | OpKind::Fsync | OpKind::Fallocate { .. } => true,
        OpKind::Discard | OpKind::WriteZeroes => {
            shared.geometry.kind != plugio_device::DeviceKind::BlockDevice
        }
        _ => false,
    };
    sqe_on_ring
        && *e.kind()
            == (plugio_device::ErrorKind::Io {
                errno: libc::EINVAL,
            })
        && shared.backend.kind() == plugio_device::BackendKind::Uring
        && plugio_device::ring::current_is_iopoll()
}

/// What an IO past the new end of a block device that shrank after its
/// open is told (the kernel says "out of space" for a write there, and a
/// read moves no data; plugio checks ranges against the capacity it read
/// at open).
const SHRANK: &str = "the block device is now smaller than when it was opened, and this IO \
     ends past its new end (losetup -c, lvresize): open it again to check IO against its new size";

/// Whether `e`, the error of an IO on `offset_bytes..+len_bytes`, came
/// from a block device that shrank below the IO's end since its open: an
/// error that a shrink gives (out of space, no progress, a short or
/// failed transfer) without a context of its own. One ioctl, on this cold
/// path only.
fn past_end_of_shrunk_device(
    shared: &DeviceShared,
    e: &Error,
    offset_bytes: u64,
    len_bytes: u64,
) -> bool {
    use plugio_device::ErrorKind as K;
    let shrink_says = matches!(
        e.kind(),
        K::OutOfSpace
            | K::NoProgress { .. }
            | K::UnexpectedEof { .. }
            | K::WriteZero { .. }
            | K::Io { errno: libc::EIO }
    );
    if !shrink_says || e.context().is_some() {
        return false;
    }
    if shared.geometry.kind != plugio_device::DeviceKind::BlockDevice {
        return false;
    }
    let Some(fd) = shared.backend.file_fd() else {
        return false;
    };
    let end = offset_bytes.saturating_add(len_bytes);
    plugio_device::geometry::block_device_len_bytes(&*fd)
        .is_ok_and(|now| now < shared.geometry.capacity_bytes.unwrap_or(0) && end > now)
}

/// What a write refused by a block device that became read-only after
/// its open is told.
const BECAME_READ_ONLY: &str = "the block device became read-only after it was opened \
     (BLKROGET; `blockdev --setrw` undoes `blockdev --setro`; a loop device set up with \
     `losetup -r` must be set up again; a partition follows its disk)";

/// Whether a device opened for writing is a block device that is
/// read-only now.
fn became_read_only(shared: &DeviceShared) -> bool {
    !shared.opts.read_only
        && shared.geometry.kind == plugio_device::DeviceKind::BlockDevice
        && shared
            .backend
            .file_fd()
            .is_some_and(|fd| plugio_device::backend::file::is_read_only_block_device(&*fd))
}

/// The refusal of IO in a forked child through `core`, a core of its
/// parent's runtime, or on a device its parent opened (see
/// [`DeviceShared::inherited`]).
#[cold]
#[inline(never)]
fn fork_refusal(core: &EngineCore) -> Error {
    if core.forked() {
        return plugio_device::fork::forked_error();
    }
    plugio_device::fork::forked_error().with_context(
        "this device was opened before fork(): open it again in the child (Device::open)",
    )
}

/// An error of this device that names no path yet: it names the
/// device's path (when it was opened by path).
#[cold]
#[inline(never)]
pub(crate) fn name_device(shared: &DeviceShared, e: Error) -> Error {
    match &shared.path {
        Some(path) if e.path().is_none() => e.with_path(path.clone()),
        _ => e,
    }
}

/// The per-IO events (feature `trace-io`): `trace` level, target
/// `plugio::io`, in the device's span. Only the IO futures call them, at
/// issue and when they return `Ready`: nothing is added to the engine's
/// dispatch or completion loops. The issue event gives the time to
/// measure the latency from, when a subscriber wants the events.
#[cfg(feature = "trace-io")]
fn trace_issued(shared: &DeviceShared, info: &BioInfo, id: BioId) -> Option<std::time::Instant> {
    if !tracing::enabled!(target: "plugio::io", tracing::Level::TRACE) {
        return None;
    }
    tracing::trace!(
        target: "plugio::io",
        parent: &shared.span,
        op = ?info.op,
        offset_bytes = info.offset_bytes,
        len_bytes = info.len_bytes,
        bio = ?id,
        "io issued"
    );
    Some(std::time::Instant::now())
}

/// The completion event of an IO issued at `at` (see [`trace_issued`]).
#[cfg(feature = "trace-io")]
pub(crate) fn trace_done(shared: &DeviceShared, issued: Issued, result: &Result<u64, Error>) {
    let Some(at) = issued.at else { return };
    let latency_ns = u64::try_from(at.elapsed().as_nanos()).unwrap_or(u64::MAX);
    match result {
        Ok(bytes) => tracing::trace!(
            target: "plugio::io",
            parent: &shared.span,
            bytes,
            latency_ns,
            "io completed"
        ),
        Err(error) => tracing::trace!(
            target: "plugio::io",
            parent: &shared.span,
            %error,
            latency_ns,
            "io failed"
        ),
    }
}

/// The future of an IO without memory whose caller wants only success
/// (`nop`, `sync_all`, `sync_data`, `discard`): the bio's future with its
/// byte count dropped, one future layer instead of an `async fn` around
/// it.
struct UnitIo<'a>(BioFuture<'a>);

impl Future for UnitIo<'_> {
    type Output = Result<(), Error>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|r| r.map(|_| ()))
    }
}

impl Future for BioFuture<'_> {
    type Output = BioResult;

    /// The last poll of a common IO (its bio done without an error) is
    /// small, calls nothing ([`Issued::take_ok`]) and is inlined into the
    /// caller's poll; the first poll (the issue, [`BioFuture::issue`])
    /// and every other case ([`BioFuture::poll_result`]) are out of line.
    /// (With the issue inline, this was one function that both polls
    /// called, and each saved and restored every callee-saved register.)
    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<BioResult> {
        let this = &mut *self;
        let Some(issued) = this.issued else {
            return this.issue(cx);
        };
        if let Some(n) = issued.take_ok() {
            this.issued = None;
            this.done = true;
            #[cfg(feature = "trace-io")]
            trace_done(this.shared, issued, &Ok(n));
            return Poll::Ready(Ok(n));
        }
        this.poll_result(cx)
    }
}

impl BioFuture<'_> {
    /// A later poll where [`Issued::take_ok`] took nothing: the bio is
    /// not done, failed, or its slot is not the simple case. (The bio is
    /// read from `self`, not passed: passed, it was copied to the stack.)
    #[inline(never)]
    fn poll_result(&mut self, cx: &Context<'_>) -> Poll<BioResult> {
        let issued = self.issued.expect("a later poll has an issued bio");
        let r = std::task::ready!(issued.poll(cx));
        self.issued = None;
        self.done = true;
        #[cfg(feature = "trace-io")]
        trace_done(self.shared, issued, &r);
        Poll::Ready(self.named(r))
    }

    /// The first poll: checks and plugs the IO (see [`issue_inline`]).
    #[inline(never)]
    fn issue(&mut self, cx: &Context<'_>) -> Poll<BioResult> {
        assert!(
            !self.done,
            "a plugio IO future was polled after it completed"
        );
        let init = || BioInit {
            op: self.op,
            flags: self.flags,
            offset_bytes: self.offset_bytes,
            len_bytes: self.len_bytes,
            buf: BioBuf::None,
            bounced: false,
        };
        match issue_inline(self.shared, init, cx) {
            Ok(issued) => {
                self.issued = Some(issued);
                Poll::Pending
            }
            Err(r) => {
                self.done = true;
                Poll::Ready(self.named(r))
            }
        }
    }
}

impl Drop for BioFuture<'_> {
    /// A finished IO has nothing to release: one test, inline (the
    /// release of an unfinished one is out of line, see
    /// [`Issued::release`]).
    #[inline]
    fn drop(&mut self) {
        if let Some(issued) = self.issued {
            issued.release(self.shared, None);
        }
    }
}
