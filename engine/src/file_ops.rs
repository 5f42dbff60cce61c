//! File-level operations on a [`Device`] and on paths: [`OpenOptions`]
//! (an async open), [`Device::set_len`], [`Device::fallocate`],
//! [`Device::metadata`], and the free functions of [`fs`] (`rename`,
//! `remove_file`, `create_dir_all`, `sync_dir`, `metadata`). Each goes
//! through the core's io_uring where the kernel has the opcode and through
//! the runtime's blocking pool otherwise (see
//! [`fs_ops`](plugio_device::fs_ops)); none blocks the core.
//!
//! Durability follows std's names: [`Device::sync_all`] is `fsync`,
//! [`Device::sync_data`] is `fdatasync`, and [`fs::sync_dir`] makes the
//! names in a directory durable (a file's `fsync` does not cover its
//! name).
//!
//! Like all of plugio's IO, these are awaited on a plugio core: off one
//! they fail with [`ErrorKind::NoDriver`] before anything is done.
//!
//! Invariant: these operations are not ordered against the device's IO in
//! flight (as the kernel does not order `ftruncate` against `pwrite`s in
//! flight): await the IO first.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use plugio_device::fs_ops::{self, FileType, Metadata};
use plugio_device::{Error, ErrorKind, InvalidInput, OpKind};

use crate::device::Device;
use crate::options::DeviceOptions;

/// How [`Device::fallocate`] changes a range (`fallocate(2)` modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FallocateMode {
    /// Allocate blocks for the range, extending the file when it ends past
    /// the end (mode 0): later writes there cannot fail for lack of space.
    Allocate,
    /// Allocate without changing the file size (`FALLOC_FL_KEEP_SIZE`).
    AllocateKeepSize,
    /// Zero the range (`FALLOC_FL_ZERO_RANGE`), writing zeroes where the
    /// file system refuses the mode (tmpfs): see
    /// [`Device::write_zeroes`].
    ZeroRange,
    /// Free the range's blocks, keeping the size (`FALLOC_FL_PUNCH_HOLE |
    /// FALLOC_FL_KEEP_SIZE`); it reads back as zeroes. Same as
    /// [`Device::discard`].
    PunchHole,
}

impl Device {
    /// The file's descriptor (and owner), or `Unsupported` for a backend
    /// without one.
    fn fd(&self) -> Result<Arc<OwnedFd>, Error> {
        self.shared().backend.file_fd().ok_or_else(|| {
            Error::new(ErrorKind::Unsupported)
                .with_context("this device has no file descriptor (a simulated device)")
        })
    }

    /// Sets the file's size to `len_bytes`, cutting it or extending it
    /// with a hole, as [`std::fs::File::set_len`] (`ftruncate`;
    /// `IORING_OP_FTRUNCATE` on Linux 6.9 and later, the blocking pool
    /// before). Not ordered against IO in flight: await it first. The size
    /// change is durable after [`sync_all`](Self::sync_all).
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// dev.set_len(1 << 20).await?;
    /// assert_eq!(dev.metadata().await?.len_bytes, 1 << 20);
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// Checked first, wherever it is awaited: `PermissionDenied` when
    /// opened read-only; `Unsupported` for a block device or NVMe
    /// namespace (its size is its capacity: the kernel said only `EINVAL`;
    /// found by a break-it helper); [`InvalidInput::FileSizeLimit`] for a
    /// length past the process's file size limit (`ulimit -f`) while
    /// `SIGXFSZ` has its default action; `Unsupported` for a device
    /// without a file (simulated). Then [`ErrorKind::NoDriver`] when
    /// awaited off a plugio core (nothing is done), and the kernel's
    /// error otherwise.
    pub async fn set_len(&self, len_bytes: u64) -> Result<(), Error> {
        if self.options().read_only {
            return Err(self.name_err(
                Error::new(ErrorKind::PermissionDenied)
                    .with_context("the device was opened read-only (DeviceOptions::read_only)"),
            ));
        }
        if self.geometry().kind == plugio_device::DeviceKind::BlockDevice {
            return Err(
                self.name_err(Error::new(ErrorKind::Unsupported).with_context(
                    "set_len resizes regular files only: a block device's size is its capacity \
                 (metadata().len_bytes); resize the device with its own tools (lvresize, \
                 losetup -c) and open it again",
                )),
            );
        }
        // Growing a file past the process's file size limit would end the
        // process (SIGXFSZ), from the blocking pool's thread.
        plugio_device::check_set_len(self.geometry().kind, len_bytes, || {
            crate::device::file_len_bytes(self.shared())
        })
        .map_err(|e| self.name_err(e))?;
        let fd = self.fd().map_err(|e| self.name_err(e))?;
        fs_ops::ftruncate(fd.as_raw_fd(), fd, len_bytes)
            .await
            .map_err(|e| self.name_err(e))
    }

    /// The file's metadata (`statx` of the open descriptor): size, type,
    /// times, allocated blocks. For a block device `len_bytes` is its
    /// capacity (the geometry's), where `statx` says 0.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let meta = dev.metadata().await?;
    /// assert!(meta.is_file());
    /// assert_eq!(meta.len_bytes, 0);
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`] when awaited off a plugio core (before
    /// anything is done). Otherwise:
    /// `Unsupported` for a device without a file; the kernel's error.
    pub async fn metadata(&self) -> Result<Metadata, Error> {
        let fd = self.fd().map_err(|e| self.name_err(e))?;
        let mut meta = fs_ops::metadata_fd(fd.as_raw_fd(), fd)
            .await
            .map_err(|e| self.name_err(e))?;
        if meta.file_type == fs_ops::FileType::BlockDevice {
            meta.len_bytes = self.geometry().capacity_bytes.unwrap_or(meta.len_bytes);
        }
        Ok(meta)
    }

    /// Allocates, zeroes or frees `[offset_bytes, offset_bytes +
    /// len_bytes)` (`fallocate(2)`, `IORING_OP_FALLOCATE`) through the
    /// device's IO path, ordered against overlapping IO as a write is.
    /// [`FallocateMode::ZeroRange`] falls back to writing zeroes where the
    /// file system refuses it (tmpfs), as [`write_zeroes`](Self::write_zeroes)
    /// does. A range longer than [`MAX_IO_BYTES`](crate::MAX_IO_BYTES) is
    /// split into parts of [`RANGE_PART_BYTES`](crate::RANGE_PART_BYTES),
    /// issued together; it returns when every part has completed, with
    /// the first part's error.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// use plugio::FallocateMode;
    /// dev.fallocate(0, 1 << 20, FallocateMode::Allocate).await?;
    /// assert_eq!(dev.metadata().await?.len_bytes, 1 << 20);
    /// dev.fallocate(0, 4096, FallocateMode::ZeroRange).await?;
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// First, before anything is done, also off a plugio core: for
    /// `Allocate`/`AllocateKeepSize` on a block device, invalid input (a
    /// range off the direct-IO alignment, zero length), then
    /// `Unsupported` (it has no blocks to allocate: its space is all
    /// there). Then [`ErrorKind::NoDriver`] when awaited off a plugio
    /// core. Otherwise:
    /// invalid input (as above) before submission; for `ZeroRange`,
    /// [`write_zeroes`](Self::write_zeroes)' errors (among them its
    /// refusal of a range over 64 GiB where the zeroes must be written);
    /// `Unsupported` where the file system lacks the mode (except
    /// `ZeroRange`); `OutOfSpace` (a file system may have allocated part
    /// of the range and grown the file by then, as `fallocate(2)` leaves
    /// it).
    pub async fn fallocate(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        mode: FallocateMode,
    ) -> Result<(), Error> {
        let allocates = matches!(
            mode,
            FallocateMode::Allocate | FallocateMode::AllocateKeepSize
        );
        if allocates && self.geometry().kind == plugio_device::DeviceKind::BlockDevice {
            // Bad input first, as everywhere.
            self.check_range_op(OpKind::Fallocate { mode: 0 }, offset_bytes, len_bytes)
                .map_err(|e| self.name_err(e))?;
            return Err(
                self.name_err(Error::new(ErrorKind::Unsupported).with_context(
                    "a block device has no blocks to allocate (all its space is there): there is \
                 nothing to preallocate; zero a range with write_zeroes or free it with discard",
                )),
            );
        }
        let mode = match mode {
            FallocateMode::Allocate => 0,
            FallocateMode::AllocateKeepSize => libc::FALLOC_FL_KEEP_SIZE,
            FallocateMode::ZeroRange => return self.write_zeroes(offset_bytes, len_bytes).await,
            FallocateMode::PunchHole => return self.discard(offset_bytes, len_bytes).await,
        };
        self.range_op(OpKind::Fallocate { mode }, offset_bytes, len_bytes)
            .await
    }
}

/// How to open a file as a [`Device`], asynchronously: the open (and the
/// stat before it) go through the core's io_uring
/// (`IORING_OP_OPENAT`/`STATX`) or the blocking pool, never blocking the
/// core, unlike [`Device::open`]. Shaped like [`std::fs::OpenOptions`].
/// One step still runs on the core: the first writable open of a regular
/// file on each file system in the process probes whether that file
/// system zeroes ranges (an unnamed file made and removed: 1 to 5 ms on
/// ext4); later opens there reuse the answer.
///
/// Defaults: read-write, no create, no truncate, `O_DIRECT` on, the other
/// [`DeviceOptions`] at their defaults.
///
/// ```
/// # plugio::engine::doc_dir(|dir| async move {
/// use plugio::OpenOptions;
/// let path = dir.join("table.db");
/// let dev = OpenOptions::new().create(true).direct(false).open(&path).await?;
/// let (r, _) = dev.write_all_at(b"hello".to_vec(), 0).await;
/// r?;
/// dev.sync_all().await?;
/// // A file is open with one set of options at a time: close it first.
/// drop(dev);
/// let ro = OpenOptions::new().read_only(true).direct(false).open(&path).await?;
/// let (r, buf) = ro.read_exact_at(vec![0u8; 5], 0).await;
/// r?;
/// assert_eq!(&buf, b"hello");
/// # Ok(()) });
/// ```
#[derive(Debug, Clone)]
pub struct OpenOptions {
    options: DeviceOptions,
    /// What [`OpenOptions::read_only`] and [`OpenOptions::direct`] set:
    /// they win over [`OpenOptions::device_options`] in either order.
    read_only: Option<bool>,
    direct: Option<bool>,
    create: bool,
    truncate: bool,
}

/// Equal when they open alike: the same [`OpenOptions::options`],
/// `create` and `truncate`, however they were set.
impl PartialEq for OpenOptions {
    fn eq(&self, other: &Self) -> bool {
        self.options() == other.options()
            && self.create == other.create
            && self.truncate == other.truncate
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenOptions {
    /// Read-write, no create, no truncate, `O_DIRECT`, default
    /// [`DeviceOptions`].
    pub fn new() -> Self {
        Self {
            options: DeviceOptions::default(),
            read_only: None,
            direct: None,
            create: false,
            truncate: false,
        }
    }

    /// Create the file when it does not exist (`O_CREAT`, mode `0o666`
    /// before the umask). Default false.
    pub fn create(&mut self, yes: bool) -> &mut Self {
        self.create = yes;
        self
    }

    /// Cut an existing file to 0 bytes, as `O_TRUNC` does, but only once
    /// the open is accepted: an open refused (another handle has the file
    /// with other options) leaves the file as it was. A block device is
    /// not cut (as `O_TRUNC` does nothing there). Refused with
    /// [`read_only`](Self::read_only). Default false.
    ///
    /// An accepted open with the same options as another handle of this
    /// process shares that handle's device, and cuts the file under it
    /// too, as `O_TRUNC` cuts it under every descriptor: its reads then
    /// see 0 bytes. Truncate only a file nothing else has open.
    pub fn truncate(&mut self, yes: bool) -> &mut Self {
        self.truncate = yes;
        self
    }

    /// Open for reading only (`O_RDONLY`; writes are refused before
    /// submission, and so is [`truncate`](Self::truncate)). Default
    /// false: read-write.
    pub fn read_only(&mut self, yes: bool) -> &mut Self {
        self.read_only = Some(yes);
        self
    }

    /// Bypass the page cache (`O_DIRECT`). Default true; a file system
    /// that refuses it (tmpfs before Linux 6.6) needs false: the open then
    /// fails with [`ErrorKind::DirectIoRefused`].
    pub fn direct(&mut self, yes: bool) -> &mut Self {
        self.direct = Some(yes);
        self
    }

    /// All the device's options (queue depth, plugging, merging...).
    /// Their `read_only` and `direct` apply unless
    /// [`read_only`](Self::read_only) or [`direct`](Self::direct) was
    /// called, before or after: those win, so a later `device_options`
    /// does not undo a `read_only(true)`.
    ///
    /// ```
    /// use plugio::{DeviceOptions, OpenOptions};
    /// let mut o = OpenOptions::new();
    /// o.read_only(true).device_options(DeviceOptions { direct: false, ..DeviceOptions::default() });
    /// assert!(o.options().read_only && !o.options().direct);
    /// ```
    pub fn device_options(&mut self, options: DeviceOptions) -> &mut Self {
        self.options = options;
        self
    }

    /// The device options an [`open`](Self::open) uses: those of
    /// [`device_options`](Self::device_options) (default
    /// [`DeviceOptions::default`]) with `read_only` and `direct` as
    /// [`read_only`](Self::read_only) and [`direct`](Self::direct) set
    /// them, where they were called.
    pub fn options(&self) -> DeviceOptions {
        DeviceOptions {
            read_only: self.read_only.unwrap_or(self.options.read_only),
            direct: self.direct.unwrap_or(self.options.direct),
            ..self.options.clone()
        }
    }

    /// Opens `path`. A file this process already has open with equal
    /// device options shares its state, as with [`Device::open`].
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`] when awaited off a plugio core (before
    /// anything is done). Otherwise:
    /// Invalid options ([`InvalidInput::Config`] for `truncate` with
    /// `read_only`); `NotFound` without `create`;
    /// [`InvalidInput::PathKind`] for a directory, FIFO, socket or other
    /// character device (checked before opening);
    /// [`InvalidInput::AlreadyOpen`] when this process has the file open
    /// through a handle with other device options (it names them);
    /// [`ErrorKind::DirectIoRefused`] when the file system refuses
    /// `O_DIRECT` (open with `direct(false)`); the kernel's other errors,
    /// with the path.
    pub async fn open(&self, path: impl AsRef<Path>) -> Result<Device, Error> {
        let path = path.as_ref();
        let opts = &self.options();
        opts.validate()?;
        if self.truncate && opts.read_only {
            // The kernel would cut the file with O_RDONLY | O_TRUNC.
            return Err(Error::invalid(InvalidInput::Config {
                detail: "truncate(true) with a read-only open (read_only(true) or \
                         DeviceOptions::read_only): a read-only open may not cut the file; drop \
                         one of them"
                    .into(),
            })
            .with_path(path));
        }
        // Whether there is an existing file to cut once the open is
        // accepted (a new one is empty, a block device is not cut).
        let (cut, exists) = match fs_ops::metadata(path).await {
            // An NVMe generic character device: its open is no file open
            // (found by name and type after the stat, not by a blocking
            // stat first; a file to create named like one, `ng0n1`, was
            // taken for a device and not created).
            Ok(m)
                if m.file_type == FileType::CharDevice
                    && plugio_device::is_passthrough_name(path) =>
            {
                return Device::open(path, opts.clone());
            }
            Ok(m) => {
                check_kind(&m).map_err(|e| e.with_path(path))?;
                (self.truncate && m.is_file(), true)
            }
            Err(e) if *e.kind() == ErrorKind::NotFound && self.create => (false, false),
            Err(e) => return Err(e),
        };
        let mut flags = if opts.read_only {
            libc::O_RDONLY
        } else {
            libc::O_RDWR
        };
        if self.create {
            flags |= libc::O_CREAT;
        }
        if opts.direct {
            flags |= libc::O_DIRECT;
        }
        let fd = fs_ops::open(path, flags, 0o666).await.map_err(|e| {
            if opts.direct
                && *e.kind()
                    == (ErrorKind::Io {
                        errno: libc::EINVAL,
                    })
            {
                Error::new(ErrorKind::DirectIoRefused).with_path(path)
            } else if !exists && *e.kind() == ErrorKind::PermissionDenied {
                plugio_device::backend::file::explain_create_refusal(e)
            } else if opts.read_only || !exists {
                e
            } else {
                plugio_device::backend::file::explain_write_refusal(e)
            }
        })?;
        // Not O_TRUNC: the file is cut only after the registry accepted
        // the open (a refused open must leave it as it was).
        let dev = Device::from_fd(fd, path, opts.clone())?;
        if cut {
            dev.set_len(0).await.map_err(|e| e.with_path(path))?;
        }
        Ok(dev)
    }
}

/// Refuses what is not a file or a block device, as
/// [`check_path_kind`](plugio_device::check_path_kind) does.
fn check_kind(m: &Metadata) -> Result<(), Error> {
    let found = match m.file_type {
        FileType::File | FileType::BlockDevice => return Ok(()),
        FileType::Dir => "a directory",
        FileType::Fifo => "a FIFO (named pipe)",
        FileType::Socket => "a socket",
        FileType::CharDevice => "a character device",
        FileType::Symlink => "neither a file nor a device",
    };
    Err(Error::invalid(InvalidInput::PathKind { found }))
}

/// File-system operations on paths, each through the core's io_uring
/// where the kernel has the opcode and the blocking pool otherwise (never
/// blocking the core). Call them from a task on a plugio core.
///
/// Cancellation: a call goes to the kernel (or the pool) one step at a
/// time, each step at a poll, and dropping its future (a `timeout` that
/// elapses, a `select!` that took another branch, an aborted task) stops
/// the steps not yet sent, never the one in flight. A one-step call
/// ([`rename`](fs::rename), [`remove_file`](fs::remove_file),
/// [`remove_dir`](fs::remove_dir),
/// [`Device::set_len`](crate::Device::set_len)) dropped after its first
/// poll still happens; only its result is lost. A call of several steps
/// may have done some of them: [`create_dir_all`](fs::create_dir_all)
/// looks before it makes each directory, and
/// [`OpenOptions::open`](crate::OpenOptions::open) looks at the path
/// before it opens (and creates) the file, and cuts it (`truncate`) only
/// after that (a descriptor it opened is closed). After a dropped call,
/// look (`metadata`) before you take it as done or not done.
pub mod fs {
    use std::path::Path;

    use plugio_device::fs_ops;
    pub use plugio_device::fs_ops::{FileType, Metadata};
    use plugio_device::Error;

    /// Renames `from` to `to`, replacing `to` if it exists, as
    /// [`std::fs::rename`] (`IORING_OP_RENAMEAT`). Durable after
    /// [`sync_dir`] of both parents.
    ///
    /// ```
    /// # plugio::engine::doc_dir(|dir| async move {
    /// use plugio::fs;
    /// let (a, b) = (dir.join("wal.tmp"), dir.join("wal"));
    /// plugio::OpenOptions::new().create(true).direct(false).open(&a).await?;
    /// fs::rename(&a, &b).await?;
    /// fs::sync_dir(&dir).await?;
    /// assert!(fs::metadata(&b).await?.is_file());
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`](plugio_device::ErrorKind::NoDriver) off a plugio core (before
    /// anything is done). Otherwise:
    /// The kernel's error, typed, with the source path; a `NotFound` whose
    /// source exists names the destination (its directory is missing).
    pub async fn rename(from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<(), Error> {
        fs_ops::rename(from.as_ref(), to.as_ref()).await
    }

    /// Removes a file, as [`std::fs::remove_file`]
    /// (`IORING_OP_UNLINKAT`).
    ///
    /// ```
    /// # plugio::engine::doc_dir(|dir| async move {
    /// use plugio::{fs, ErrorKind};
    /// let path = dir.join("old.sst");
    /// plugio::OpenOptions::new().create(true).direct(false).open(&path).await?;
    /// fs::remove_file(&path).await?;
    /// let gone = fs::metadata(&path).await.unwrap_err();
    /// assert_eq!(*gone.kind(), ErrorKind::NotFound);
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`](plugio_device::ErrorKind::NoDriver) off a plugio core (before
    /// anything is done). Otherwise:
    /// `NotFound`; the kernel's other errors, with the path.
    pub async fn remove_file(path: impl AsRef<Path>) -> Result<(), Error> {
        fs_ops::unlink(path.as_ref(), false).await
    }

    /// Removes an empty directory, as [`std::fs::remove_dir`].
    ///
    /// ```
    /// # plugio::engine::doc_dir(|dir| async move {
    /// use plugio::fs;
    /// let sub = dir.join("empty");
    /// fs::create_dir_all(&sub).await?;
    /// fs::remove_dir(&sub).await?;
    /// assert!(fs::metadata(&sub).await.is_err());
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`](plugio_device::ErrorKind::NoDriver) off a plugio core (before
    /// anything is done). Otherwise:
    /// The kernel's error (`ENOTEMPTY`...), with the path.
    pub async fn remove_dir(path: impl AsRef<Path>) -> Result<(), Error> {
        fs_ops::unlink(path.as_ref(), true).await
    }

    /// Creates a directory and every missing parent, as
    /// [`std::fs::create_dir_all`] (`IORING_OP_MKDIRAT`, after `statx`
    /// finds the deepest existing parent).
    ///
    /// ```
    /// # plugio::engine::doc_dir(|dir| async move {
    /// use plugio::fs;
    /// let deep = dir.join("db/000001/wal");
    /// fs::create_dir_all(&deep).await?;
    /// fs::create_dir_all(&deep).await?; // already there: fine
    /// assert!(fs::metadata(&deep).await?.is_dir());
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`](plugio_device::ErrorKind::NoDriver) off a plugio core (before
    /// anything is done). Otherwise:
    /// A parent that is not a directory; the kernel's error, with the path.
    pub async fn create_dir_all(path: impl AsRef<Path>) -> Result<(), Error> {
        fs_ops::create_dir_all(path.as_ref()).await
    }

    /// Makes the names in directory `path` durable: opens it and `fsync`s
    /// it. A database calls it after creating, renaming or removing a file
    /// (the file's own `sync_all` covers its data and size, not its name).
    ///
    /// ```
    /// # plugio::engine::doc_dir(|dir| async move {
    /// plugio::fs::sync_dir(&dir).await?;
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`](plugio_device::ErrorKind::NoDriver) off a plugio core (before
    /// anything is done). Otherwise:
    /// The kernel's error, with the path.
    pub async fn sync_dir(path: impl AsRef<Path>) -> Result<(), Error> {
        fs_ops::sync_dir(path.as_ref()).await
    }

    /// The metadata of `path`, symlinks followed (`IORING_OP_STATX`).
    ///
    /// ```
    /// # plugio::engine::doc_dir(|dir| async move {
    /// let meta = plugio::fs::metadata(&dir).await?;
    /// assert!(meta.is_dir());
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`](plugio_device::ErrorKind::NoDriver) off a plugio core (before
    /// anything is done). Otherwise:
    /// `NotFound`; the kernel's other errors, with the path.
    pub async fn metadata(path: impl AsRef<Path>) -> Result<Metadata, Error> {
        fs_ops::metadata(path.as_ref()).await
    }
}
