//! The file backend: regular files and block devices, `O_DIRECT` by default,
//! through the submitting core's io_uring (registered files and buffers
//! where available), with the sync pool for threads without a ring and for
//! ops io_uring has no opcode for (`BLKDISCARD`).
//!
//! Invariants:
//! - One SQE (plus a linked `fdatasync` for PREFLUSH) per op; its
//!   user_data is never a pointer: the handler and token themselves for a
//!   direct op ([`Backend::submit_direct`]), the ring's slot index
//!   otherwise.
//! - The file descriptor stays open while any op on it is in flight, even
//!   after the backend is dropped: pool jobs hold an `Arc` to it; on a
//!   ring, the ring's registration for this backend holds one (cloned once
//!   per ring, not per op) and is released only when the backend is gone
//!   and no slot names it (see `ring`'s invariants).
//! - Per op on a ring: one load from the backend's `FileCache` names the
//!   file (fixed index or raw fd); no hashing, no atomic RMW; the op is
//!   not checked again (`debug_assert!`; callers check once).

use std::fs;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};

use super::sqe::{fsync_sqe, SqWriter, Target};
use super::sync::submit_to_pool;
use super::{check_op, Backend, BackendKind};
use crate::core::HandlerId;
use crate::error::{Error, ErrorKind, Result};
use crate::geometry::Geometry;
use crate::op::{IoFlags, IoOp};
use crate::ring::{self, FileCache, Ring};

/// How to open a file or block device.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    create: bool,
    truncate: bool,
    direct: bool,
    backend: BackendKind,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenOptions {
    /// Read + write, no create, `O_DIRECT`, io_uring.
    pub fn new() -> Self {
        Self {
            read: true,
            write: true,
            create: false,
            truncate: false,
            direct: true,
            backend: BackendKind::Uring,
        }
    }

    /// Open for reading (default true).
    pub fn read(&mut self, yes: bool) -> &mut Self {
        self.read = yes;
        self
    }

    /// Open for writing (default true).
    pub fn write(&mut self, yes: bool) -> &mut Self {
        self.write = yes;
        self
    }

    /// Create the file if missing (default false).
    pub fn create(&mut self, yes: bool) -> &mut Self {
        self.create = yes;
        self
    }

    /// Truncate an existing file to 0 (default false).
    pub fn truncate(&mut self, yes: bool) -> &mut Self {
        self.truncate = yes;
        self
    }

    /// Bypass the page cache with `O_DIRECT` (default true). Set false for
    /// file systems that refuse it.
    pub fn direct(&mut self, yes: bool) -> &mut Self {
        self.direct = yes;
        self
    }

    /// [`BackendKind::Uring`] (default) or [`BackendKind::Sync`] to force
    /// the thread pool.
    pub fn backend(&mut self, kind: BackendKind) -> &mut Self {
        self.backend = kind;
        self
    }

    /// Opens `path`.
    ///
    /// # Errors
    /// [`InvalidInput::PathKind`](crate::InvalidInput::PathKind) (naming
    /// the path) for a directory, FIFO, socket or character device, found
    /// with `stat` before anything is opened (`open(2)` of a FIFO would
    /// block until a writer came); [`ErrorKind::Unsupported`] for an NVMe
    /// generic character device (`/dev/ngXnY`: see `NvmeBackend`) and for
    /// `BackendKind::Mem`; [`ErrorKind::DirectIoRefused`] (naming the
    /// path) when the file system refuses `O_DIRECT`;
    /// [`ErrorKind::PermissionDenied`] (naming the path) when a read-only
    /// block device is opened with `write(true)` (see
    /// [`FileBackend::from_fd`]); otherwise the `open`/`statx`/sysfs error
    /// with the path.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<FileBackend> {
        let path = path.as_ref();
        if self.backend == BackendKind::Mem {
            return Err(Error::new(ErrorKind::Unsupported)
                .with_context("a file cannot use the mem backend"));
        }
        match crate::check_path_kind(path) {
            Ok(crate::PathKind::File | crate::PathKind::BlockDevice) => {}
            Ok(crate::PathKind::NvmeGeneric) => {
                return Err(Error::new(ErrorKind::Unsupported)
                    .with_path(path)
                    .with_context(
                        "an NVMe generic character device is driven by NvmeBackend::open \
                         (plugio::Device::open picks it), not by the file backend",
                    ))
            }
            // Made by the open below.
            Err(e) if self.create && *e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut opts = fs::OpenOptions::new();
        opts.read(self.read)
            .write(self.write)
            .create(self.create)
            .truncate(self.truncate);
        if self.direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let file = opts.open(path).map_err(|e| {
            if self.direct && e.raw_os_error() == Some(libc::EINVAL) {
                Error::new(ErrorKind::DirectIoRefused).with_path(path)
            } else if self.write && path.exists() {
                // An existing file refused writing (not a directory that
                // refused a file's creation).
                explain_write_refusal(Error::from_io(&e).with_path(path))
            } else if self.create
                && e.kind() == std::io::ErrorKind::PermissionDenied
                && !path.exists()
            {
                explain_create_refusal(Error::from_io(&e).with_path(path))
            } else {
                Error::from_io(&e).with_path(path)
            }
        })?;
        FileBackend::from_fd(OwnedFd::from(file), path, self.direct, self.backend)
    }
}

/// Says, on `e`, the `PermissionDenied` error of an open that was to
/// create a file, that the refusal is the directory's (the message gave
/// only the file's path; found by a break-it helper). Used by both
/// opens, this blocking one and the engine's `OpenOptions::open`.
///
/// ```
/// use plugio_device::backend::file::explain_create_refusal;
/// use plugio_device::{Error, ErrorKind};
/// let e = explain_create_refusal(Error::new(ErrorKind::PermissionDenied));
/// assert!(e.to_string().contains("the directory refuses a new file"), "{e}");
/// ```
pub fn explain_create_refusal(e: Error) -> Error {
    e.with_context(
        "the directory refuses a new file: it needs write and search (x) permission for this \
         user, or create the file elsewhere",
    )
}

/// Says, on `e`, the error of an open for reading and writing of an
/// existing file, how to open it to read only when the kernel refused the
/// writing (`ErrorKind::PermissionDenied`: a 0444 file for a user other
/// than root, an immutable file for anyone; `EROFS`: a file system
/// mounted read-only); other errors come back as they were. Not for a file the open was to create: its directory
/// refused that. A helper embedding plugio got a bare "permission denied".
///
/// ```
/// use plugio_device::backend::file::explain_write_refusal;
/// use plugio_device::{Error, ErrorKind};
/// let e = explain_write_refusal(Error::new(ErrorKind::PermissionDenied));
/// assert!(e.to_string().contains("read_only(true)"), "{e}");
/// let other = explain_write_refusal(Error::new(ErrorKind::NotFound));
/// assert_eq!(other.context(), None);
/// let rofs = explain_write_refusal(Error::from_errno(-libc::EROFS));
/// assert!(rofs.to_string().contains("remount the file system read-write"), "{rofs}");
/// ```
pub fn explain_write_refusal(e: Error) -> Error {
    if e.errno() == libc::EROFS && e.context().is_none() {
        return e.with_context(
            "opening it for writing on a file system mounted read-only (to only read it, open \
             it read-only: OpenOptions::read_only(true), DeviceOptions::read_only, or the file \
             backend's write(false); to write it, remount the file system read-write)",
        );
    }
    if *e.kind() == ErrorKind::PermissionDenied && e.context().is_none() {
        e.with_context(
            "opening it for writing (to only read it, open it read-only: \
             OpenOptions::read_only(true), DeviceOptions::read_only, or the file backend's \
             write(false); to write it, change its mode, owner or immutable flag)",
        )
    } else {
        e
    }
}

/// Asks the kernel not to update the access time of `file`'s inode on
/// each read (`O_NOATIME`, set with `fcntl`). The file backend does it for
/// block devices, as fio does for every file that is not a regular file:
/// without it, every read of the device checks whether its atime needs
/// updating (`touch_atime`, about 50 ns per 4 KiB read on zram). Best
/// effort: only the owner (or a process with `CAP_FOWNER`) may set it; on
/// `EPERM` the flags stay as they were. No errors, no panics.
///
/// ```
/// let file = tempfile::tempfile()?;
/// plugio::device::backend::file::skip_atime(&file);
/// # Ok::<_, std::io::Error>(())
/// ```
pub fn skip_atime(file: &fs::File) {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL on a descriptor `file` keeps open; no memory passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return;
    }
    // SAFETY: as above; F_SETFL takes the flags by value. EPERM (not the
    // owner) leaves the flags as they were: atime stays on.
    let _ = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NOATIME) };
}

/// Whether the file system of `file` (opened from `path`) zeroes a range
/// with `FALLOC_FL_ZERO_RANGE`: tried on an unnamed file (`O_TMPFILE`) in
/// the directory of the file as opened (`/proc/self/fd`, so a symbolic
/// link is followed to where the file lives; `path`'s directory where
/// `/proc` is not there), so nothing of `file` or the directory changes
/// (the file is gone when closed). `None` when that cannot be known: a
/// directory that takes no `O_TMPFILE` (not writable, or a file system
/// without it), a file mounted apart from its directory, no space.
///
/// The answer is kept per file system (its device number, type and
/// `f_fsid`), so only the first writable open on each pays for the probe
/// (1 to 5 ms on ext4: the unnamed file's creation and removal; paid at
/// every open before, found by a break-it helper). A kept answer must be
/// right: a `ZERO_RANGE` believed supported is ordered as one op, and when
/// it comes back `Unsupported` the zeroes the engine then writes go out
/// after IO issued behind it.
fn probe_zero_range(
    file: &fs::File,
    path: &Path,
    stat: Option<&nix::sys::statfs::Statfs>,
) -> Option<bool> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static KNOWN: Mutex<Option<HashMap<FsKey, bool>>> = Mutex::new(None);
    let Some(fs_key) = stat.and_then(|stat| file_system_key(file, stat)) else {
        // Nothing to keep the answer by: probed at each open.
        return probe_zero_range_once(file, path);
    };
    let kept = KNOWN
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .and_then(|m| m.get(&fs_key).copied());
    if kept.is_some() {
        return kept;
    }
    let answer = probe_zero_range_once(file, path)?;
    KNOWN
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .insert(fs_key, answer);
    Some(answer)
}

/// `FS_EXTENT_FL` (`include/uapi/linux/fs.h`): the inode maps its blocks
/// with extents.
const FS_EXTENT_FL: libc::c_int = 0x0008_0000;

/// `FS_INLINE_DATA_FL` (`include/uapi/linux/fs.h`): the file's bytes live
/// in its inode (ext4's `inline_data`, files of about 60 bytes or less).
const FS_INLINE_DATA_FL: libc::c_int = 0x1000_0000;

/// True for a file on ext4 that has no extents (made by ext3, or on an
/// ext4 without the extent feature): ext4 refuses `FALLOC_FL_ZERO_RANGE`
/// on such a file (`ext4_fallocate`), while the probe's new file, which
/// has extents, says the file system takes it. Taken for supported, the
/// refusal came after later IO and broke program order (found by a
/// break-it helper).
///
/// A file whose data is inline has no extent flag either, but ext4
/// moves its data out of the inode before it zeroes a range, and the
/// moved file has extents exactly when the file system has the feature:
/// the probe's answer holds for it (it was said to have no zeroing op,
/// and `write_zeroes` wrote every zero; found by a reviewer).
fn ext4_without_extents(file: &fs::File, stat: Option<&nix::sys::statfs::Statfs>) -> bool {
    let on_ext4 = stat.is_some_and(|s| s.filesystem_type() == nix::sys::statfs::EXT4_SUPER_MAGIC);
    if !on_ext4 {
        return false;
    }
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes the inode's flags, a C int (despite
    // the ioctl's declared long), through the pointer, which points to a
    // live local of that type.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    rc == 0 && flags & (FS_EXTENT_FL | FS_INLINE_DATA_FL) == 0
}

/// `(st_dev, f_type, f_fsid)` of the file system `file` is on (`stat` is
/// its `fstatfs`). The device number and type alone named a new file
/// system made on the same device the same (ext2 after ext4: one magic
/// number), and the kept answer was wrong (found by a break-it helper);
/// `f_fsid` comes from the file system's identity (ext4 and btrfs: their
/// UUID; XFS: its device number), so it differs there. `None` where the
/// file system leaves `f_fsid` at 0 (FUSE, virtiofs, NFS): an anonymous
/// device number is handed out again after an unmount, so nothing would
/// tell the next file system from the last one.
fn file_system_key(file: &fs::File, stat: &nix::sys::statfs::Statfs) -> Option<FsKey> {
    use std::os::unix::fs::MetadataExt;
    let dev = file.metadata().ok()?.dev();
    // SAFETY: `fsid_t` is `#[repr(C)]` and holds exactly two C ints (its
    // fields are private in libc); the bytes are only compared.
    let fsid = unsafe { std::mem::transmute::<libc::fsid_t, [i32; 2]>(stat.filesystem_id()) };
    if fsid == [0, 0] {
        return None;
    }
    Some((dev, stat.filesystem_type().0, fsid))
}

/// What [`file_system_key`] tells file systems apart by.
type FsKey = (u64, i64, [i32; 2]);

#[cfg(test)]
thread_local! {
    /// Probes run on this thread (tests only).
    static PROBES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// [`probe_zero_range`] without the kept answers.
fn probe_zero_range_once(file: &fs::File, path: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    #[cfg(test)]
    PROBES.with(|p| p.set(p.get() + 1));
    let real = fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok();
    let named = real.as_deref().filter(|p| p.is_absolute()).unwrap_or(path);
    let dir = match named.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let probe = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
        .ok()?;
    if probe.metadata().ok()?.dev() != file.metadata().ok()?.dev() {
        return None;
    }
    // KEEP_SIZE: the probe never grows the file, so a file size limit
    // (`ulimit -f`) below 4 KiB cannot refuse it with SIGXFSZ, which ended
    // the process at every writable open; a file system that zeroes
    // ranges takes the flag with it (ext4, XFS), one that does not
    // refuses either way (tmpfs: EOPNOTSUPP).
    let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on a descriptor `probe` keeps open; no memory passed.
    let r = unsafe { libc::fallocate(probe.as_raw_fd(), mode, 0, 4096) };
    if r == 0 {
        return Some(true);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EOPNOTSUPP) => Some(false),
        _ => None,
    }
}

/// `BLKROGET`: `_IO(0x12, 94)`; writes an `int`, non-zero when the block
/// device is read-only.
const BLKROGET: libc::c_ulong = 0x125e;

/// Whether the block device `file` is read-only (`BLKROGET`: set by
/// `losetup -r`, `blockdev --setro`, a write-protected medium). Linux lets
/// such a device be opened for writing and fails each write with `EPERM`,
/// so [`FileBackend::from_fd`] checks it at a writable open. False when
/// the ioctl fails (`ENOTTY` for a regular file): writes then say it
/// themselves. No errors, no panics. The kernel's `bdev_read_only`.
///
/// ```
/// let file = tempfile::tempfile()?;
/// assert!(!plugio::device::backend::file::is_read_only_block_device(&file));
/// # Ok::<_, std::io::Error>(())
/// ```
pub fn is_read_only_block_device(file: &impl std::os::fd::AsFd) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut ro: libc::c_int = 0;
    // SAFETY: BLKROGET writes one int through the pointer, which points to
    // a live local.
    let rc = unsafe { libc::ioctl(file.as_fd().as_raw_fd(), BLKROGET as _, &mut ro) };
    rc == 0 && ro != 0
}

/// The refusal of a writable open of a read-only block device.
fn read_only_device_error(path: &Path) -> Error {
    Error::new(ErrorKind::PermissionDenied)
        .with_path(path)
        .with_context(READ_ONLY_DEVICE_HINT)
}

/// What a writable open of a read-only block device is told: how to open
/// it read-only, and how each way of making a device read-only is undone
/// (`blockdev --setrw` does not undo `losetup -r`, and a partition stays
/// read-only while its disk is).
const READ_ONLY_DEVICE_HINT: &str = "the block device is read-only (BLKROGET): open it read-only \
     (DeviceOptions::read_only; read_only(true) or write(false) on the open options), or make \
     it writable: `blockdev --setrw` undoes `blockdev --setro`; a loop device set up with \
     `losetup -r` must be set up again without -r; a partition is read-only while its disk is";

fn next_file_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // Relaxed: only uniqueness matters.
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// An open file or block device.
#[derive(Debug)]
pub struct FileBackend {
    fd: Arc<OwnedFd>,
    /// This backend's registration on each ring; rings hold it weakly as
    /// the backend's liveness.
    cache: ManuallyDrop<Arc<FileCache>>,
    id: u64,
    is_block_device: bool,
    geometry: Geometry,
    path: PathBuf,
    kind: BackendKind,
    /// [`Backend::write_zeroes_support`]: true for a block device, probed
    /// for a file opened for writing ([`probe_zero_range`]), unknown for
    /// one opened read-only (its writes fail anyway).
    zero_range: Option<bool>,
}

impl FileBackend {
    /// A backend over `fd`, a file or block device already opened from
    /// `path` (with `O_DIRECT` when `direct`; see
    /// [`crate::fs_ops::open`]), served by `kind`. Reads the geometry
    /// (`fstat`, `statx`, and sysfs for a block device). On a block device
    /// it sets `O_NOATIME` on `fd` ([`skip_atime`]): a file status flag,
    /// so every duplicate of `fd` (`dup`, a fork's copy) gets it too.
    ///
    /// # Errors
    /// [`InvalidInput::PathKind`](crate::InvalidInput::PathKind) when `fd`
    /// is a directory, FIFO, socket or character device;
    /// [`InvalidInput::OpenFlags`](crate::InvalidInput::OpenFlags) when it
    /// was opened with `O_PATH` (its IO would fail with `EBADF`);
    /// [`ErrorKind::PermissionDenied`] when `fd` is open for writing on a
    /// read-only block device (`BLKROGET`: `losetup -r`, `blockdev
    /// --setro`), whose every write Linux would fail with `EPERM`;
    /// [`ErrorKind::Unsupported`] for `BackendKind::Mem`; the `fstat`,
    /// `statx` or sysfs error, with the path.
    pub fn from_fd(fd: OwnedFd, path: &Path, direct: bool, kind: BackendKind) -> Result<Self> {
        if kind == BackendKind::Mem {
            return Err(Error::new(ErrorKind::Unsupported)
                .with_context("a file cannot use the mem backend"));
        }
        let file = fs::File::from(fd);
        let file_type = file
            .metadata()
            .map_err(|e| Error::from_io(&e).with_path(path))?
            .file_type();
        // What `open` checked by path, checked again on what was opened
        // (the path may have changed in between; `fd` may be anything).
        if !(file_type.is_file() || file_type.is_block_device()) {
            let found = crate::path_kind::kind_name(file_type);
            return Err(Error::invalid(crate::InvalidInput::PathKind { found }).with_path(path));
        }
        // SAFETY: F_GETFL on a descriptor `file` keeps open; no memory passed.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if flags >= 0 && flags & libc::O_PATH != 0 {
            let detail = "it was opened with O_PATH: open it with O_RDWR (O_RDONLY for reads only)";
            return Err(Error::invalid(crate::InvalidInput::OpenFlags { detail }).with_path(path));
        }
        // Unknown flags (F_GETFL failed) count as writable: the checks
        // that follow only refuse or probe more.
        let writable = flags < 0 || flags & libc::O_ACCMODE != libc::O_RDONLY;
        Self::of_file(
            file,
            file_type.is_block_device(),
            writable,
            path,
            direct,
            kind,
        )
    }

    /// A FIFO opened read-write as a backend, which `open` and `from_fd`
    /// refuse: a read of it stays in flight until data is written, which
    /// the tests of ops in flight need.
    #[cfg(test)]
    pub(crate) fn fifo_for_tests(path: &Path) -> Result<Self> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::from_io(&e).with_path(path))?;
        Self::of_file(file, false, true, path, false, BackendKind::Uring)
    }

    /// The backend over `file`, whose type was checked; `writable`: it
    /// was opened for writing (`O_WRONLY` or `O_RDWR`).
    fn of_file(
        file: fs::File,
        is_block_device: bool,
        writable: bool,
        path: &Path,
        direct: bool,
        kind: BackendKind,
    ) -> Result<Self> {
        if is_block_device {
            if writable && is_read_only_block_device(&file) {
                return Err(read_only_device_error(path));
            }
            skip_atime(&file);
        }
        let geometry = Geometry::of_file(&file, direct).map_err(|e| e.with_path(path))?;
        // One `fstatfs` for both questions below.
        let stat = (!is_block_device && writable)
            .then(|| nix::sys::statfs::fstatfs(&file).ok())
            .flatten();
        let zero_range = match (is_block_device, writable) {
            (true, _) => Some(true),
            // No for a file ext4 refuses it for, whatever the file
            // system's answer (and also where its probe cannot run: a
            // directory this user may not write); else that answer.
            (false, true) if ext4_without_extents(&file, stat.as_ref()) => Some(false),
            (false, true) => probe_zero_range(&file, path, stat.as_ref()),
            // Its writes fail (EBADF) whatever the file system can do.
            (false, false) => None,
        };
        Ok(FileBackend {
            fd: Arc::new(OwnedFd::from(file)),
            cache: ManuallyDrop::new(Arc::new(FileCache::new())),
            id: next_file_id(),
            is_block_device,
            geometry,
            path: path.to_path_buf(),
            kind,
            zero_range,
        })
    }

    /// The descriptor, shared: holding it keeps the file open.
    pub fn fd(&self) -> &Arc<OwnedFd> {
        &self.fd
    }

    /// Opens `path` with default [`OpenOptions`] (read/write, `O_DIRECT`).
    ///
    /// # Errors
    /// See [`OpenOptions::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        OpenOptions::new().open(path)
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True for block devices.
    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    /// The raw descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The current size in bytes (`fstat` for files, the device size for
    /// block devices).
    ///
    /// # Errors
    /// `fstat` failed.
    pub fn size_bytes(&self) -> Result<u64> {
        if let Some(c) = self.geometry.capacity_bytes {
            return Ok(c);
        }
        // SAFETY: plain-old-data out parameter for fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open; st is a valid out pointer.
        if unsafe { libc::fstat(self.raw_fd(), &mut st) } != 0 {
            return Err(Error::from_io(&std::io::Error::last_os_error()).with_path(&self.path));
        }
        Ok(st.st_size as u64)
    }

    /// Queues `op` on `ring`; false when the op must go to the pool
    /// (block-device discard). `direct`: without a ring slot where the op
    /// allows it (see [`Backend::submit_direct`]).
    #[inline]
    fn queue(
        &self,
        ring: &Ring,
        op: &IoOp<'_>,
        handler: HandlerId,
        token: u64,
        direct: bool,
    ) -> bool {
        let file = ring.file(&self.cache, &self.fd, self.id);
        let target = self.target(file.fixed);
        // The direct way is the SQ writer's: one place decides which ops
        // may go without a slot and writes them.
        let writer = SqWriter::new(ring, target, handler, self.is_block_device);
        // SAFETY: the caller keeps `submit`'s contract; the thread's
        // driver holds `ring`.
        if direct && unsafe { writer.try_submit_direct(op, token) } {
            return true;
        }
        let Some(entry) = writer.build(op) else {
            return false;
        };
        let preflush = op
            .flags
            .contains(IoFlags::PREFLUSH)
            .then(|| fsync_sqe(Target::Fd(self.raw_fd()), true));
        ring.push(entry, preflush, file.reg, handler, token);
        true
    }

    /// How an SQE names this file on a ring: its fixed-file index there,
    /// or the raw fd.
    #[inline]
    fn target(&self, fixed: Option<u32>) -> Target {
        match fixed {
            Some(index) => Target::Fixed(index),
            None => Target::Fd(self.raw_fd()),
        }
    }
}

impl FileBackend {
    /// `submit` (`direct` false) or `submit_direct`.
    ///
    /// # Safety
    /// As [`Backend::submit`].
    #[inline]
    unsafe fn submit_on_ring(
        &self,
        op: &IoOp<'_>,
        handler: HandlerId,
        token: u64,
        direct: bool,
    ) -> Result<()> {
        // Callers check once before submitting (Backend::submit's docs).
        debug_assert!(
            check_op(&self.geometry, op).is_ok(),
            "unchecked op submitted: {op:?}: {:?}",
            check_op(&self.geometry, op)
        );
        if self.kind == BackendKind::Uring {
            // A ring from before a fork is the parent's: never touched.
            match ring::with_current(|ring| {
                (!ring.stale()).then(|| self.queue(ring, op, handler, token, direct))
            }) {
                Some(Some(true)) => return Ok(()),
                Some(None) => return Err(crate::fork::forked_error()),
                Some(Some(false)) | None => {}
            }
        }
        // The pool's threads are not in a child either.
        crate::fork::check()?;
        submit_to_pool(&self.fd, self.is_block_device, op, handler, token)
    }
}

impl Backend for FileBackend {
    fn with_sq_writer(&self, handler: HandlerId, f: &mut dyn FnMut(Option<&SqWriter<'_>>)) {
        // An `Rc` of its own, not `with_current`'s borrow: `f` is the
        // caller's code, and the ring must outlive it even if it drops this
        // thread's driver.
        let ring = if self.kind == BackendKind::Uring {
            ring::current_rc()
        } else {
            None
        };
        // A ring from before a fork is the parent's: never touched.
        let Some(ring) = ring.filter(|r| !r.stale()) else {
            f(None);
            return;
        };
        let file = ring.file(&self.cache, &self.fd, self.id);
        f(Some(&SqWriter::new(
            &ring,
            self.target(file.fixed),
            handler,
            self.is_block_device,
        )));
    }

    fn checks_geometry_only(&self) -> bool {
        true
    }

    fn write_zeroes_support(&self) -> Option<bool> {
        self.zero_range
    }

    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn file_fd(&self) -> Option<Arc<OwnedFd>> {
        Some(self.fd.clone())
    }

    unsafe fn submit(&self, op: &IoOp<'_>, handler: HandlerId, token: u64) -> Result<()> {
        // SAFETY: the caller keeps `submit`'s contract.
        unsafe { self.submit_on_ring(op, handler, token, false) }
    }

    unsafe fn submit_direct(&self, op: &IoOp<'_>, handler: HandlerId, token: u64) -> Result<()> {
        // SAFETY: the caller keeps `submit_direct`'s contract.
        unsafe { self.submit_on_ring(op, handler, token, true) }
    }
}

impl Drop for FileBackend {
    fn drop(&mut self) {
        // Release the liveness first, so a ring that sees the bump below
        // also sees the weak count drop.
        // SAFETY: `cache` is dropped exactly once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.cache) };
        // Tells the rings to sweep (a Release bump; see there what a ring
        // that sees it is promised).
        FileCache::backend_closed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_atime_sets_o_noatime_on_a_file_we_own() {
        let file = tempfile::tempfile().expect("tempfile");
        // SAFETY: F_GETFL on an open descriptor.
        let before = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(before & libc::O_NOATIME, 0);
        skip_atime(&file);
        // SAFETY: as above.
        let after = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        assert_ne!(after & libc::O_NOATIME, 0, "the owner may set O_NOATIME");
        assert_eq!(after & !libc::O_NOATIME, before, "no other flag changed");
    }

    /// The zero-range probe runs once per file system, not at every
    /// writable open (it cost 1 to 5 ms an open on ext4), and later opens
    /// there get the same answer.
    #[test]
    fn the_zero_range_probe_runs_once_per_file_system() {
        // In the crate's directory (a disk file system), not /tmp, which
        // may be a tmpfs (a killed run leaves a `.tmp*` directory there).
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).expect("dir");
        let open = |name: &str| {
            let path = dir.path().join(name);
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .expect("open");
            let stat = nix::sys::statfs::fstatfs(&file).ok();
            probe_zero_range(&file, &path, stat.as_ref())
        };
        let first = open("a");
        let probes = PROBES.with(std::cell::Cell::get);
        for name in ["b", "c", "d"] {
            assert_eq!(open(name), first, "{name}: the same answer");
        }
        if first.is_some() {
            assert_eq!(PROBES.with(std::cell::Cell::get), probes, "no probe again");
        }
    }
}
