//! File-level operations: open, stat, rename, unlink, mkdir, fsync of a
//! descriptor and truncate, each as one op on the calling core's io_uring
//! where the kernel has the opcode (`IORING_OP_OPENAT`, `STATX`,
//! `RENAMEAT`, `UNLINKAT`, `MKDIRAT`, `FSYNC`, `FTRUNCATE`), and as the
//! plain system call on the runtime's blocking pool
//! ([`spawn_blocking`](plugio_executor::spawn_blocking)) otherwise: a
//! core without a ring, or a kernel without the opcode (`FTRUNCATE` came
//! in 6.9, `MKDIRAT` in 5.15). Either way the core never blocks.
//!
//! # Mechanism
//!
//! A ring op is one SQE on the core's ring whose completion comes back to
//! the thread's pending-slot handler (shared with [`crate::File`]'s
//! futures). Whatever the SQE points to (the path as a C string, the statx
//! buffer, the descriptor's owner) lives in a box the future owns; a future
//! dropped while its op is in flight hands the box to its slot, which
//! frees it when the CQE arrives (and closes the descriptor an orphaned
//! open returned).
//!
//! Invariants:
//! - A submitted ring op completes exactly once, on the submitting thread;
//!   its memory is freed only after that.
//! - A descriptor an op works on stays open until the op completes: the
//!   op's box holds its owner.
//! - Futures are `Send` (they hold only owned data and a slot number) but,
//!   once polled, must be polled on the same core (the executor never
//!   moves a task).

use std::ffi::CString;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use io_uring::{opcode, squeue, types};

use crate::error::{Error, ErrorKind, InvalidInput, Result};
use crate::fs::pending;
use crate::ring::{self, NO_FILE};

/// Which way an op went (reported by [`last_path`] for tests and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpPath {
    /// One SQE on the core's io_uring.
    Ring,
    /// The system call on the runtime's blocking pool.
    Blocking,
}

thread_local! {
    static LAST_PATH: std::cell::Cell<Option<OpPath>> = const { std::cell::Cell::new(None) };
}

/// The way the calling thread's last file-level op went (`None` before
/// the first). For tests and diagnostics.
pub fn last_path() -> Option<OpPath> {
    LAST_PATH.with(std::cell::Cell::get)
}

fn note(path: OpPath) {
    LAST_PATH.with(|p| p.set(Some(path)));
}

/// Whether the op goes on the calling core's ring: its ring takes opcode
/// `code` and reaps for the caller (else the blocking pool, or `NoDriver`
/// where there is none: off a core, nothing would reap a ring op). A ring
/// that busy-polls (`RingConfig::iopoll`) takes none of these ops (the
/// kernel refused an open on it with a bare `EINVAL`: found by a break-it
/// helper): they go to the blocking pool.
///
/// # Errors
/// [`ErrorKind::Forked`] in a forked child of a process whose runtime was
/// built before the fork: the parent's ring is not mapped here (an SQE
/// written to it would fault), and its blocking pool is the parent's.
fn on_ring(code: u8) -> Result<bool> {
    crate::fork::check()?;
    let yes = crate::core::ring_serves_caller()
        && ring::current_supports(code)
        && !ring::current_is_iopoll();
    note(if yes { OpPath::Ring } else { OpPath::Blocking });
    Ok(yes)
}

/// `path` as a C string.
fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        Error::invalid(InvalidInput::Config {
            detail: format!("path {} holds a NUL byte", path.display()),
        })
    })
}

/// A CQE result as `Ok(value)` or the typed error.
fn check(result: i32) -> Result<i32> {
    if result < 0 {
        Err(Error::from_errno(result))
    } else {
        Ok(result)
    }
}

/// The context of the `NoDriver` error of a file operation off a plugio
/// core: what to change.
const OFF_CORE: &str = "file operations must be awaited in a task on a plugio core: \
    await them inside plugio::runtime::local(RingConfig::default())?.run(..) or a task \
    spawned on a runtime (a plain block_on beside a runtime has no core)";

/// Runs `f` on the runtime's blocking pool.
async fn blocking<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
    T: Send + 'static,
{
    if plugio_executor::blocking::BlockingPool::current().is_none() {
        return Err(Error::new(ErrorKind::NoDriver).with_context(OFF_CORE));
    }
    match plugio_executor::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| Error::from_io(&e)),
        Err(_) => Err(Error::new(ErrorKind::Cancelled)
            .with_context("the blocking pool stopped before the file operation ran")),
    }
}

/// One SQE on the calling core's ring; resolves to its CQE result and the
/// memory it used. `K` holds whatever the SQE points into; `build` makes
/// the SQE from it at the first poll (the box no longer moves).
struct RingOp<K: Send + 'static> {
    keep: Option<Box<K>>,
    build: fn(&mut K) -> squeue::Entry,
    /// What to do with the result if the future is gone by then.
    on_orphan: Option<fn(i32)>,
    slot: Option<u32>,
}

impl<K: Send + 'static> RingOp<K> {
    fn new(keep: K, build: fn(&mut K) -> squeue::Entry) -> Self {
        Self {
            keep: Some(Box::new(keep)),
            build,
            on_orphan: None,
            slot: None,
        }
    }
}

impl<K: Send + 'static> Unpin for RingOp<K> {}

impl<K: Send + 'static> Future for RingOp<K> {
    type Output = Result<(i32, Box<K>)>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let (pending, handler) = pending();
        match this.slot {
            None => {
                let Some(keep) = this.keep.as_mut() else {
                    panic!("a plugio file operation was polled after it completed")
                };
                // Checked again here (`on_ring` chose the ring): a future
                // first polled elsewhere must not write to a ring that is
                // not mapped (a forked child) or not reaped for it.
                if let Err(e) = crate::fork::check() {
                    return Poll::Ready(Err(e));
                }
                if !crate::core::ring_serves_caller() {
                    return Poll::Ready(
                        Err(Error::new(ErrorKind::NoDriver).with_context(OFF_CORE)),
                    );
                }
                let entry = (this.build)(keep);
                let slot = pending.waiting(cx.waker().clone());
                let pushed = ring::with_current(|r| {
                    r.push(entry, None, NO_FILE, handler, u64::from(slot));
                });
                if pushed.is_none() {
                    pending.free(slot);
                    return Poll::Ready(
                        Err(Error::new(ErrorKind::NoDriver).with_context(OFF_CORE)),
                    );
                }
                this.slot = Some(slot);
                Poll::Pending
            }
            Some(slot) => match pending.poll(slot, cx.waker()) {
                Some(result) => {
                    this.slot = None;
                    let keep = this.keep.take().expect("the op's memory");
                    Poll::Ready(Ok((result, keep)))
                }
                None => Poll::Pending,
            },
        }
    }
}

impl<K: Send + 'static> Drop for RingOp<K> {
    fn drop(&mut self) {
        if let (Some(slot), Some(keep)) = (self.slot, self.keep.take()) {
            pending().0.orphan_with(slot, keep, self.on_orphan);
        }
    }
}

/// Closes a descriptor an orphaned open returned.
fn close_result(result: i32) {
    if result >= 0 {
        // SAFETY: the kernel just returned this descriptor to nobody.
        drop(unsafe { OwnedFd::from_raw_fd(result) });
    }
}

/// Opens `path` with `flags` (`O_*`; `O_CLOEXEC` is added) and `mode`
/// (for `O_CREAT`), relative to the current directory.
///
/// # Errors
/// The kernel's error, typed, with the path.
pub async fn open(path: &Path, flags: i32, mode: u32) -> Result<OwnedFd> {
    let flags = flags | libc::O_CLOEXEC;
    let cpath = c_path(path)?;
    let r = if on_ring(opcode::OpenAt::CODE)? {
        let mut op = RingOp::new((cpath, flags, mode), |(p, flags, mode)| {
            opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), p.as_ptr())
                .flags(*flags)
                .mode(*mode)
                .build()
        });
        op.on_orphan = Some(close_result);
        op.await
            .and_then(|(r, _)| check(r))
            // SAFETY: a fresh descriptor the kernel returned to us.
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
    } else {
        blocking(move || {
            // SAFETY: a NUL-terminated path; plain flags.
            let fd = unsafe { libc::open(cpath.as_ptr(), flags, mode) };
            if fd < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                // SAFETY: a fresh descriptor the kernel returned to us.
                Ok(unsafe { OwnedFd::from_raw_fd(fd) })
            }
        })
        .await
    };
    r.map_err(|e| e.with_path(path))
}

/// What `statx` reports about a file (symlinks followed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// Size in bytes (`st_size`; 0 for a block device: use its geometry).
    /// `std::fs::Metadata::len()` under plugio's naming rule (units last).
    #[doc(alias = "len")]
    pub len_bytes: u64,
    /// What the path is.
    pub file_type: FileType,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Hard links.
    pub nlink: u32,
    /// File system device number (`st_dev`).
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// The device a block or character device node stands for (`st_rdev`),
    /// 0 otherwise.
    pub rdev: u64,
    /// Space allocated, in 512-byte units (`st_blocks`): less than the size
    /// for a sparse file.
    pub blocks_512: u64,
    /// Preferred IO size in bytes (`st_blksize`).
    pub block_bytes: u32,
    /// Last modification.
    pub modified: SystemTime,
    /// Last access.
    pub accessed: SystemTime,
    /// Creation, where the file system records it.
    pub created: Option<SystemTime>,
}

/// The kind of file a [`Metadata`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (only when not followed).
    Symlink,
    /// A block device node.
    BlockDevice,
    /// A character device node.
    CharDevice,
    /// A FIFO.
    Fifo,
    /// A socket.
    Socket,
}

impl Metadata {
    /// True for a regular file.
    pub fn is_file(&self) -> bool {
        self.file_type == FileType::File
    }

    /// True for a directory.
    pub fn is_dir(&self) -> bool {
        self.file_type == FileType::Dir
    }

    fn from_statx(st: &libc::statx) -> Self {
        let time = |t: libc::statx_timestamp| {
            let d = Duration::new(t.tv_sec.unsigned_abs(), t.tv_nsec);
            if t.tv_sec >= 0 {
                SystemTime::UNIX_EPOCH + d
            } else {
                SystemTime::UNIX_EPOCH - d
            }
        };
        let file_type = match u32::from(st.stx_mode) & libc::S_IFMT {
            libc::S_IFDIR => FileType::Dir,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFBLK => FileType::BlockDevice,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            _ => FileType::File,
        };
        Metadata {
            len_bytes: st.stx_size,
            file_type,
            mode: u32::from(st.stx_mode) & 0o7777,
            nlink: st.stx_nlink,
            dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
            ino: st.stx_ino,
            rdev: libc::makedev(st.stx_rdev_major, st.stx_rdev_minor),
            blocks_512: st.stx_blocks,
            block_bytes: st.stx_blksize,
            modified: time(st.stx_mtime),
            accessed: time(st.stx_atime),
            created: (st.stx_mask & libc::STATX_BTIME != 0).then(|| time(st.stx_btime)),
        }
    }
}

/// The buffer and path of one statx.
struct StatxKeep {
    path: CString,
    dirfd: RawFd,
    flags: i32,
    /// Keeps the descriptor open while the op runs (fd-relative stat).
    _owner: Option<Arc<dyn Send + Sync>>,
    st: libc::statx,
}

async fn statx(keep: StatxKeep) -> Result<Metadata> {
    const MASK: u32 = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
    if on_ring(opcode::Statx::CODE)? {
        let op = RingOp::new(keep, |k| {
            opcode::Statx::new(
                types::Fd(k.dirfd),
                k.path.as_ptr(),
                std::ptr::from_mut(&mut k.st).cast::<types::statx>(),
            )
            .flags(k.flags)
            .mask(MASK)
            .build()
        });
        let (r, keep) = op.await?;
        check(r)?;
        Ok(Metadata::from_statx(&keep.st))
    } else {
        blocking(move || {
            let mut keep = keep;
            // SAFETY: a NUL-terminated path, an open dirfd (or AT_FDCWD)
            // and a statx buffer we own.
            let r = unsafe {
                libc::statx(
                    keep.dirfd,
                    keep.path.as_ptr(),
                    keep.flags,
                    MASK,
                    &mut keep.st,
                )
            };
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(Metadata::from_statx(&keep.st))
            }
        })
        .await
    }
}

/// The metadata of `path`, symlinks followed (`statx`).
///
/// # Errors
/// `NotFound` and the kernel's other errors, typed, with the path.
pub async fn metadata(path: &Path) -> Result<Metadata> {
    let keep = StatxKeep {
        path: c_path(path)?,
        dirfd: libc::AT_FDCWD,
        flags: libc::AT_STATX_SYNC_AS_STAT,
        _owner: None,
        // SAFETY: statx is plain old data.
        st: unsafe { std::mem::zeroed() },
    };
    statx(keep).await.map_err(|e| e.with_path(path))
}

/// The metadata of the open descriptor `fd` (`statx` with
/// `AT_EMPTY_PATH`); `owner` keeps it open until the op is done.
///
/// # Errors
/// The kernel's error, typed.
pub async fn metadata_fd(fd: RawFd, owner: Arc<dyn Send + Sync>) -> Result<Metadata> {
    let keep = StatxKeep {
        path: CString::default(),
        dirfd: fd,
        flags: libc::AT_EMPTY_PATH | libc::AT_STATX_SYNC_AS_STAT,
        _owner: Some(owner),
        // SAFETY: statx is plain old data.
        st: unsafe { std::mem::zeroed() },
    };
    statx(keep).await
}

/// Renames `from` to `to`, replacing `to` if it exists (`renameat2` with
/// no flags, as [`std::fs::rename`]).
///
/// # Errors
/// The kernel's error, typed, with the source path; a `NotFound` whose
/// source exists names the destination (its directory is missing).
pub async fn rename(from: &Path, to: &Path) -> Result<()> {
    let (a, b) = (c_path(from)?, c_path(to)?);
    let r = if on_ring(opcode::RenameAt::CODE)? {
        RingOp::new((a, b), |(a, b)| {
            opcode::RenameAt::new(
                types::Fd(libc::AT_FDCWD),
                a.as_ptr(),
                types::Fd(libc::AT_FDCWD),
                b.as_ptr(),
            )
            .build()
        })
        .await
        .and_then(|(r, _)| check(r))
        .map(drop)
    } else {
        let (from, to) = (from.to_path_buf(), to.to_path_buf());
        blocking(move || std::fs::rename(from, to)).await
    };
    match r {
        Ok(()) => Ok(()),
        // Either side's directory may be missing: say which (the error
        // named the source, which existed; found by a break-it helper).
        Err(e) if *e.kind() == ErrorKind::NotFound && source_exists(from).await => Err(e
            .with_path(to)
            .with_context("renaming into a directory that does not exist")),
        Err(e) if e.errno() == libc::EXDEV => Err(e.with_path(from).with_context(
            "rename moves within one file system, and the destination is on another: copy \
             it there and remove it here",
        )),
        Err(e) => Err(e.with_path(from)),
    }
}

/// Whether `path` names anything, a dangling symbolic link included (a
/// rename moves the link): an `lstat` on the blocking pool, on a rename's
/// error path only.
async fn source_exists(path: &Path) -> bool {
    let path = path.to_path_buf();
    blocking(move || std::fs::symlink_metadata(path))
        .await
        .is_ok()
}

/// Removes a file (`dir` false, as [`std::fs::remove_file`]) or an empty
/// directory (`dir` true, as [`std::fs::remove_dir`]).
///
/// # Errors
/// The kernel's error, typed, with the path.
pub async fn unlink(path: &Path, dir: bool) -> Result<()> {
    let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
    let p = c_path(path)?;
    let r = if on_ring(opcode::UnlinkAt::CODE)? {
        RingOp::new((p, flags), |(p, flags)| {
            opcode::UnlinkAt::new(types::Fd(libc::AT_FDCWD), p.as_ptr())
                .flags(*flags)
                .build()
        })
        .await
        .and_then(|(r, _)| check(r))
        .map(drop)
    } else {
        let path = path.to_path_buf();
        blocking(move || {
            if dir {
                std::fs::remove_dir(path)
            } else {
                std::fs::remove_file(path)
            }
        })
        .await
    };
    r.map_err(|e| e.with_path(path))
}

/// Creates the directory `path` with `mode` (before the umask).
///
/// # Errors
/// The kernel's error, typed (`EEXIST` as `Io { errno: EEXIST }`), with
/// the path.
pub async fn mkdir(path: &Path, mode: u32) -> Result<()> {
    let p = c_path(path)?;
    let r = if on_ring(opcode::MkDirAt::CODE)? {
        RingOp::new((p, mode), |(p, mode)| {
            opcode::MkDirAt::new(types::Fd(libc::AT_FDCWD), p.as_ptr())
                .mode(*mode)
                .build()
        })
        .await
        .and_then(|(r, _)| check(r))
        .map(drop)
    } else {
        blocking(move || {
            // SAFETY: a NUL-terminated path.
            if unsafe { libc::mkdir(p.as_ptr(), mode) } < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        })
        .await
    };
    r.map_err(|e| e.with_path(path))
}

/// `fsync` (`datasync` false) or `fdatasync` of the descriptor `fd`, which
/// `owner` keeps open until the op is done.
///
/// # Errors
/// The kernel's error, typed.
pub async fn fsync(fd: RawFd, owner: Arc<dyn Send + Sync>, datasync: bool) -> Result<()> {
    if on_ring(opcode::Fsync::CODE)? {
        RingOp::new((fd, owner, datasync), |(fd, _, datasync)| {
            let flags = if *datasync {
                types::FsyncFlags::DATASYNC
            } else {
                types::FsyncFlags::empty()
            };
            opcode::Fsync::new(types::Fd(*fd)).flags(flags).build()
        })
        .await
        .and_then(|(r, _)| check(r))
        .map(drop)
    } else {
        blocking(move || {
            let _owner = owner;
            // SAFETY: `owner` keeps `fd` open.
            let r = unsafe {
                if datasync {
                    libc::fdatasync(fd)
                } else {
                    libc::fsync(fd)
                }
            };
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        })
        .await
    }
}

/// Sets the size of the file `fd` to `len_bytes` (`ftruncate`: cut, or
/// extended with a hole); `owner` keeps it open until the op is done.
///
/// # Errors
/// The kernel's error, typed.
pub async fn ftruncate(fd: RawFd, owner: Arc<dyn Send + Sync>, len_bytes: u64) -> Result<()> {
    let Ok(len) = i64::try_from(len_bytes) else {
        return Err(Error::invalid(InvalidInput::Length {
            len_bytes,
            max_bytes: i64::MAX as u64,
        }));
    };
    if on_ring(opcode::Ftruncate::CODE)? {
        RingOp::new((fd, owner, len_bytes), |(fd, _, len)| {
            opcode::Ftruncate::new(types::Fd(*fd), *len).build()
        })
        .await
        .and_then(|(r, _)| check(r))
        .map(drop)
    } else {
        blocking(move || {
            let _owner = owner;
            // SAFETY: `owner` keeps `fd` open.
            if unsafe { libc::ftruncate(fd, len) } < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        })
        .await
    }
}

/// Opens the directory `path` and `fsync`s it, making the names created,
/// renamed or removed in it durable (what a database does after creating
/// or renaming a file: the file's own `fsync` does not cover its name).
///
/// # Errors
/// The kernel's error, typed, with the path.
pub async fn sync_dir(path: &Path) -> Result<()> {
    let dir = Arc::new(open(path, libc::O_RDONLY | libc::O_DIRECTORY, 0).await?);
    let fd = dir.as_raw_fd();
    fsync(fd, dir, false).await.map_err(|e| e.with_path(path))
}

/// Creates `path` and every missing parent, as
/// [`std::fs::create_dir_all`]: finds the deepest existing ancestor with
/// `statx`, then `mkdir`s downward; a directory made meanwhile by someone
/// else is fine.
///
/// # Errors
/// A parent that exists but is not a directory, or the kernel's error,
/// with the path.
pub async fn create_dir_all(path: &Path) -> Result<()> {
    let mut missing: Vec<PathBuf> = Vec::new();
    let mut at = Some(path);
    while let Some(p) = at.filter(|p| !p.as_os_str().is_empty()) {
        match metadata(p).await {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return Err(Error::new(ErrorKind::Io {
                    errno: libc::ENOTDIR,
                })
                .with_path(p))
            }
            Err(e) if *e.kind() == ErrorKind::NotFound => {
                missing.push(p.to_path_buf());
                at = p.parent();
            }
            Err(e) => return Err(e),
        }
    }
    for dir in missing.iter().rev() {
        match mkdir(dir, 0o777).await {
            Err(e)
                if *e.kind()
                    == (ErrorKind::Io {
                        errno: libc::EEXIST,
                    }) =>
            {
                if !metadata(dir).await?.is_dir() {
                    return Err(e);
                }
            }
            r => r?,
        }
    }
    Ok(())
}
