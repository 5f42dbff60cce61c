//! The crate's one error type.
//!
//! Invariants: every errno that reaches a caller goes through
//! [`Error::from_errno`], the single place where errno values are mapped to
//! [`ErrorKind`]s; transient errnos (`EAGAIN`, `EBUSY`, `EINTR`) are handled
//! inside the crate and never become an `Error` returned by an IO.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// What was wrong with an input that was refused before anything was
/// submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidInput {
    /// `what` (for example `"offset"`, `"length"`, `"buffer address"`) is
    /// `value`, which is not a multiple of `required_bytes`.
    Alignment {
        /// Which quantity is misaligned, worded for the message: a short
        /// name, or a phrase that says where a length came from (`"the
        /// read's length (what its buffers take: ...)"`). Meant for people,
        /// not for matching: match on the variant and `required_bytes`.
        what: &'static str,
        /// The misaligned value (bytes, or an address).
        value: u64,
        /// The alignment it must be a multiple of, in bytes.
        required_bytes: u64,
    },
    /// The range `[offset_bytes, offset_bytes + len_bytes)` does not fit in
    /// a device of `capacity_bytes` (`i64::MAX` for a file: the largest
    /// offset the kernel takes, a `loff_t`).
    Range {
        /// Start of the range.
        offset_bytes: u64,
        /// Length of the range.
        len_bytes: u64,
        /// Capacity of the device.
        capacity_bytes: u64,
    },
    /// A length is larger than allowed.
    Length {
        /// The length given, in bytes.
        len_bytes: u64,
        /// The largest length allowed, in bytes.
        max_bytes: u64,
    },
    /// A length of zero on an op that moves data or covers a range (a
    /// read, write, discard, write-zeroes or fallocate). Such an op does
    /// nothing, and a read of 0 bytes would look like end of file, so it
    /// is refused before submission. Use a length of at least one block.
    ZeroLength,
    /// The op's segments do not match its length or the device limits.
    Segments {
        /// A description of the mismatch.
        detail: String,
    },
    /// An option or setting is out of range (for example a queue depth of
    /// 0); `detail` names the option and the allowed values.
    Config {
        /// Which option, its value and what to use instead.
        detail: String,
    },
    /// The file (or device) is already open in this process through a
    /// handle with other options; one file is one device state with one
    /// set of options (one ordering domain, one tag set). `detail` names
    /// the options that differ.
    AlreadyOpen {
        /// The options that differ: `name: open value vs asked value`.
        detail: String,
    },
    /// The path is not something plugio does IO on (a directory, FIFO,
    /// socket or character device other than an NVMe generic one); see
    /// [`check_path_kind`](crate::check_path_kind).
    PathKind {
        /// What the path is, with its article ("a directory", "a FIFO
        /// (named pipe)").
        found: &'static str,
    },
    /// A descriptor handed over (`FileBackend::from_fd`) was opened in a
    /// way that allows no reads or writes (`O_PATH`); `detail` says how to
    /// open it instead.
    OpenFlags {
        /// What the descriptor's flags are and what to use.
        detail: &'static str,
    },
    /// A flag that only a write takes ([`IoFlags::FUA`](crate::IoFlags::FUA),
    /// [`IoFlags::PREFLUSH`](crate::IoFlags::PREFLUSH)) on another op. The
    /// kernel refuses `REQ_FUA` and `REQ_PREFLUSH` on anything but a write
    /// (`submit_bio_noacct`), and plugio does the same before submission.
    WriteOnlyFlags {
        /// The op that carried them.
        op: crate::OpKind,
        /// The flags given (all of them, priority included).
        flags: crate::IoFlags,
    },
    /// A write (or a write-zeroes or fallocate that may grow the file, or
    /// a `set_len`) on a regular file that would end past the process's
    /// file size limit (`RLIMIT_FSIZE`'s soft limit, `ulimit -f`) while
    /// `SIGXFSZ` has its default action: the kernel answers such an op
    /// with `EFBIG` and sends the thread `SIGXFSZ`, which ends the process
    /// (`generic_write_check_limits`, `inode_newsize_ok`), and cuts a write
    /// that crosses it short, whose remainder would then start at the
    /// limit. So plugio refuses it before submission (see
    /// [`check_file_size_limit`](crate::check_file_size_limit)).
    FileSizeLimit {
        /// The op (`None`: `set_len`, whose `len_bytes` is the new size).
        op: Option<crate::OpKind>,
        /// Where it starts.
        offset_bytes: u64,
        /// Its length.
        len_bytes: u64,
        /// The limit, in bytes.
        limit_bytes: u64,
    },
}

/// The kinds of [`Error`] a caller can match on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Refused before submission; see [`InvalidInput`].
    InvalidInput(InvalidInput),
    /// The operation is not supported by this backend, file system or
    /// device (`EOPNOTSUPP`, `ENOTTY`, `ENOSYS` on an op).
    Unsupported,
    /// The device or file system is full (`ENOSPC`, `EDQUOT`).
    OutOfSpace,
    /// The IO was cancelled (`ECANCELED`), for example because a linked
    /// preflush failed or the ring was shut down.
    Cancelled,
    /// Permission denied (`EPERM`, `EACCES`).
    PermissionDenied,
    /// The path does not exist (`ENOENT`).
    NotFound,
    /// The file system refused `O_DIRECT` (`open` returned `EINVAL`); open
    /// the file buffered to use the page cache: `DeviceOptions { direct:
    /// false, .. }` with `Device::open` (`OpenOptions::direct(false)` with
    /// this crate's file backend).
    DirectIoRefused,
    /// A submission was attempted on a thread that has no plugio device
    /// driver installed: a `Device` future polled outside a plugio core
    /// (a plain `block_on`, another runtime), or on an executor built
    /// without the driver. Run the IO inside `plugio::runtime::local(..)`
    /// or send it to a core with `Handle::spawn_on`; with this crate alone,
    /// install a [`DeviceDriver`](crate::DeviceDriver) on the thread.
    NoDriver,
    /// An NVMe command completed with a non-zero status (passthrough only;
    /// the NVMe base specification's Completion Queue Entry status field).
    /// `sct` 0 is generic (for example `sc` 0x80 "LBA Out of Range"), 1
    /// command specific, 2 media and data integrity errors, 3 path related.
    Nvme {
        /// Status Code Type (3 bits).
        sct: u8,
        /// Status Code (8 bits).
        sc: u8,
        /// Do Not Retry: the same command is expected to fail again.
        dnr: bool,
        /// More: the controller has more status in the Error Information
        /// log page.
        more: bool,
    },
    /// An exact read (`read_exact_at`) reached the end of the file after
    /// `done_bytes` of the `len_bytes` asked for at `offset_bytes`.
    UnexpectedEof {
        /// Where the read started.
        offset_bytes: u64,
        /// Bytes asked for.
        len_bytes: u64,
        /// Bytes read before the end of the file.
        done_bytes: u64,
    },
    /// A full write (`write_all_at`) stopped after `done_bytes` of the
    /// `len_bytes` at `offset_bytes`: the device took no more bytes. The
    /// engine resumes every other short write, so this is a device or
    /// file system that ran out of space part way (a write at
    /// `offset_bytes + done_bytes` normally fails with
    /// [`ErrorKind::OutOfSpace`]), or a file that reached the process's
    /// file size limit in a program that ignores `SIGXFSZ` (then it fails
    /// with `EFBIG`).
    WriteZero {
        /// Where the write started.
        offset_bytes: u64,
        /// Bytes to write.
        len_bytes: u64,
        /// Bytes written.
        done_bytes: u64,
    },
    /// A read or write inside the device moved no data twice in a row
    /// for the same range, where the device has no end of file (a block
    /// device, NVMe namespace or mem device: O_DIRECT returns a short count
    /// only at end of file) or the op was a write. The device or backend is
    /// misbehaving. The engine issues such a request once more before it
    /// returns this.
    NoProgress {
        /// Where the IO stopped moving data, in bytes from the start of the
        /// device.
        offset_bytes: u64,
        /// What was left of the IO from there, in bytes.
        len_bytes: u64,
    },
    /// IO through a runtime that was built before this process was
    /// `fork()`ed, or on a device opened before it: a child shares its
    /// parent's io_uring rings and registered buffers, and a device's tags
    /// held at the fork by the parent's requests are never freed in the
    /// child, so it may not use them. Build a new runtime (and open the
    /// devices again) in the child.
    Forked,
    /// Any other errno from the kernel.
    Io {
        /// The positive errno value.
        errno: i32,
    },
}

/// The crate's error: a kind plus optional context (the path, the op).
///
/// Boxed, so that a `Result<u64, Error>` is two words: IO results move
/// through several future layers on every IO, errors are rare.
#[derive(Clone, PartialEq, Eq)]
pub struct Error(Box<ErrorInner>);

#[derive(Clone, PartialEq, Eq)]
struct ErrorInner {
    kind: ErrorKind,
    path: Option<PathBuf>,
    context: Option<&'static str>,
    /// The IO that failed: op, offset and length in bytes.
    io: Option<(crate::OpKind, u64, u64)>,
    /// The message of the foreign error this one was made from (an
    /// `io::Error::other("checksum mismatch")` through `?`).
    detail: Option<std::sync::Arc<str>>,
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.0.kind)
            .field("path", &self.0.path)
            .field("context", &self.0.context)
            .field("io", &self.0.io)
            .field("detail", &self.0.detail)
            .finish()
    }
}

impl Error {
    /// Creates an error of `kind` with no context.
    pub fn new(kind: ErrorKind) -> Self {
        Self(Box::new(ErrorInner {
            kind,
            path: None,
            context: None,
            io: None,
            detail: None,
        }))
    }

    /// Maps a positive errno (or a negative CQE result, whose sign is
    /// ignored) to an error. This is the one place errnos are mapped.
    ///
    /// Values at or above [`NVME_STATUS_BASE`] are NVMe completion statuses
    /// encoded by [`nvme_status_result`] (the passthrough backend's way of
    /// carrying a status through the `i32` completion result) and become
    /// [`ErrorKind::Nvme`].
    pub fn from_errno(errno: i32) -> Self {
        let errno = errno.checked_abs().unwrap_or(i32::MAX);
        if errno >= NVME_STATUS_BASE {
            let status = (errno - NVME_STATUS_BASE) as u16;
            return Self::new(ErrorKind::Nvme {
                sct: ((status >> 8) & 0x7) as u8,
                sc: (status & 0xff) as u8,
                dnr: status & (1 << 14) != 0,
                more: status & (1 << 13) != 0,
            });
        }
        let kind = match errno {
            libc::ENOSPC | libc::EDQUOT => ErrorKind::OutOfSpace,
            libc::EOPNOTSUPP | libc::ENOTTY | libc::ENOSYS => ErrorKind::Unsupported,
            libc::ECANCELED => ErrorKind::Cancelled,
            libc::EPERM | libc::EACCES => ErrorKind::PermissionDenied,
            libc::ENOENT => ErrorKind::NotFound,
            _ => ErrorKind::Io { errno },
        };
        Self::new(kind)
    }

    /// Maps an `io::Error`: a plugio `Error` wrapped in it (by the
    /// `From<Error> for io::Error` conversion, as `DeviceCursor`'s
    /// `std::io` traits return; however many `io::Error`s wrap it) comes
    /// back as it was; else the raw OS error, its own or a wrapped
    /// `io::Error`'s; else its `io::ErrorKind`: as the [`ErrorKind`] that
    /// says the same (`NotFound`, `PermissionDenied`, `Unsupported`, and
    /// `StorageFull` as [`ErrorKind::OutOfSpace`]), or as the errno of that
    /// kind (`InvalidInput` as `EINVAL`, `AlreadyExists` as `EEXIST`,
    /// `UnexpectedEof` as `ENODATA` with a context saying it was an end of
    /// file, and so on); `EIO` for the rest. The message of an error the
    /// `io::Error` carries (`io::Error::other("checksum mismatch")`, not an
    /// errno's) is kept as the [`detail`](Self::detail), shown after the
    /// kind.
    ///
    /// ```
    /// use plugio::{Error, ErrorKind};
    /// let e = Error::new(ErrorKind::NotFound).with_path("/missing");
    /// let back = Error::from_io(&std::io::Error::from(e.clone()));
    /// assert_eq!(back, e);
    /// let kind_only = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "no");
    /// assert_eq!(*Error::from_io(&kind_only).kind(), ErrorKind::PermissionDenied);
    /// let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
    /// assert!(Error::from_io(&eof).to_string().contains("end of file"));
    /// let other = std::io::Error::other("checksum mismatch in page 7");
    /// assert_eq!(Error::from_io(&other).detail(), Some("checksum mismatch in page 7"));
    /// ```
    pub fn from_io(err: &io::Error) -> Self {
        let mut at = err;
        while let Some(inner) = at.get_ref() {
            if let Some(e) = inner.downcast_ref::<Self>() {
                return e.clone();
            }
            match inner.downcast_ref::<io::Error>() {
                Some(next) => at = next,
                None => break,
            }
        }
        let mut e = match err.raw_os_error().or(at.raw_os_error()) {
            Some(errno) => Self::from_errno(errno),
            None => Self::from_io_kind(err.kind()),
        };
        e.0.detail = io_detail(at);
        e
    }

    /// [`Error::from_io`] of an `io::Error` with no errno and no plugio
    /// `Error` inside: by its kind.
    fn from_io_kind(kind: io::ErrorKind) -> Self {
        use io::ErrorKind as K;
        let (errno, context) = match kind {
            K::NotFound => return Self::new(ErrorKind::NotFound),
            K::PermissionDenied => return Self::new(ErrorKind::PermissionDenied),
            K::Unsupported => return Self::new(ErrorKind::Unsupported),
            K::StorageFull => return Self::new(ErrorKind::OutOfSpace),
            K::UnexpectedEof => (
                libc::ENODATA,
                Some("an end of file before all the bytes asked for (std's UnexpectedEof)"),
            ),
            K::WriteZero => (libc::EIO, Some("a write moved no bytes (std's WriteZero)")),
            K::InvalidData => (libc::EIO, Some("invalid data (std's InvalidData)")),
            K::InvalidInput => (libc::EINVAL, None),
            K::AlreadyExists => (libc::EEXIST, None),
            K::Interrupted => (libc::EINTR, None),
            K::TimedOut => (libc::ETIMEDOUT, None),
            K::WouldBlock => (libc::EAGAIN, None),
            K::FileTooLarge => (libc::EFBIG, None),
            K::IsADirectory => (libc::EISDIR, None),
            K::NotADirectory => (libc::ENOTDIR, None),
            K::DirectoryNotEmpty => (libc::ENOTEMPTY, None),
            K::ReadOnlyFilesystem => (libc::EROFS, None),
            K::BrokenPipe => (libc::EPIPE, None),
            K::OutOfMemory => (libc::ENOMEM, None),
            K::ResourceBusy => (libc::EBUSY, None),
            K::CrossesDevices => (libc::EXDEV, None),
            K::NotSeekable => (libc::ESPIPE, None),
            K::ExecutableFileBusy => (libc::ETXTBSY, None),
            K::Deadlock => (libc::EDEADLK, None),
            K::StaleNetworkFileHandle => (libc::ESTALE, None),
            K::TooManyLinks => (libc::EMLINK, None),
            K::ArgumentListTooLong => (libc::E2BIG, None),
            // No system call failed: the errno is plugio's mapping (an
            // `io::Error::other` showed as a bare "os error 5").
            _ => (
                libc::EIO,
                Some("not a failed system call: an io::Error without an errno, given EIO"),
            ),
        };
        let e = Self::from_errno(errno);
        match context {
            Some(c) => e.with_context(c),
            None => e,
        }
    }

    /// Shorthand for an [`ErrorKind::InvalidInput`] error.
    pub fn invalid(input: InvalidInput) -> Self {
        Self::new(ErrorKind::InvalidInput(input))
    }

    /// Attaches the path the error concerns.
    pub fn with_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.0.path = Some(path.into());
        self
    }

    /// Attaches a short static description of what was being done.
    pub fn with_context(mut self, context: &'static str) -> Self {
        self.0.context = Some(context);
        self
    }

    /// The description [`with_context`](Self::with_context) attached, if
    /// any (shown after the kind in the message).
    ///
    /// ```
    /// use plugio_device::{Error, ErrorKind};
    /// let e = Error::new(ErrorKind::OutOfSpace).with_context("growing the log");
    /// assert_eq!(e.context(), Some("growing the log"));
    /// assert_eq!(Error::new(ErrorKind::OutOfSpace).context(), None);
    /// ```
    pub fn context(&self) -> Option<&'static str> {
        self.0.context
    }

    /// The message of the foreign error this one was made from by
    /// [`Error::from_io`] (the error an `io::Error` carried, such as
    /// `io::Error::other("checksum mismatch")`), shown after the kind; `None`
    /// for plugio's own errors and for bare errnos.
    ///
    /// ```
    /// use plugio_device::Error;
    /// let e = Error::from(std::io::Error::other("checksum mismatch in page 7"));
    /// assert_eq!(e.detail(), Some("checksum mismatch in page 7"));
    /// assert!(e.to_string().ends_with(": checksum mismatch in page 7"), "{e}");
    /// assert_eq!(Error::from_errno(libc::EIO).detail(), None);
    /// ```
    pub fn detail(&self) -> Option<&str> {
        self.0.detail.as_deref()
    }

    /// Attaches the IO that failed: `op` on `len_bytes` bytes at
    /// `offset_bytes`. The engine attaches it to the device's errors of an
    /// IO (not to invalid input, whose text already names the values), so
    /// that a caller can tell which range failed.
    ///
    /// ```
    /// use plugio_device::{Error, OpKind};
    /// let e = Error::from_errno(libc::EIO).with_io(OpKind::Read, 8192, 4096);
    /// assert_eq!(e.io(), Some((OpKind::Read, 8192, 4096)));
    /// assert!(e.to_string().starts_with("read of 4096 bytes at offset 8192: "), "{e}");
    /// ```
    pub fn with_io(mut self, op: crate::OpKind, offset_bytes: u64, len_bytes: u64) -> Self {
        self.0.io = Some((op, offset_bytes, len_bytes));
        self
    }

    /// The IO that failed, when attached ([`Error::with_io`]): op, offset
    /// and length in bytes.
    pub fn io(&self) -> Option<(crate::OpKind, u64, u64)> {
        self.0.io
    }

    /// The kind, for matching.
    pub fn kind(&self) -> &ErrorKind {
        &self.0.kind
    }

    /// The path the error concerns, when one was attached: the engine
    /// names the device's path in the error of every IO on a device
    /// opened by path.
    ///
    /// ```
    /// use plugio_device::{Error, ErrorKind};
    /// let e = Error::new(ErrorKind::NotFound).with_path("/dev/nvme0n1");
    /// assert_eq!(e.path(), Some(std::path::Path::new("/dev/nvme0n1")));
    /// assert_eq!(Error::new(ErrorKind::NotFound).path(), None);
    /// ```
    pub fn path(&self) -> Option<&std::path::Path> {
        self.0.path.as_deref()
    }

    /// The errno this error corresponds to (for `io::Error` conversion and
    /// for completion results): `EINVAL` for invalid input, `EFBIG` for a
    /// write past the file size limit (what `pwrite(2)` returns there).
    /// Kinds that several errnos map to give one of them: `EPERM` for
    /// [`ErrorKind::PermissionDenied`] whether the kernel said `EPERM` or
    /// `EACCES`, `ENOSPC` for [`ErrorKind::OutOfSpace`] (also `EDQUOT`),
    /// `EOPNOTSUPP` for [`ErrorKind::Unsupported`] (also `ENOTTY`,
    /// `ENOSYS`).
    pub fn errno(&self) -> i32 {
        match &self.0.kind {
            ErrorKind::InvalidInput(InvalidInput::FileSizeLimit { .. }) => libc::EFBIG,
            ErrorKind::InvalidInput(_) | ErrorKind::DirectIoRefused => libc::EINVAL,
            ErrorKind::Unsupported => libc::EOPNOTSUPP,
            ErrorKind::OutOfSpace => libc::ENOSPC,
            ErrorKind::Cancelled => libc::ECANCELED,
            ErrorKind::PermissionDenied => libc::EPERM,
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::NoDriver => libc::ENXIO,
            ErrorKind::Nvme { .. }
            | ErrorKind::UnexpectedEof { .. }
            | ErrorKind::WriteZero { .. }
            | ErrorKind::NoProgress { .. } => libc::EIO,
            ErrorKind::Forked => libc::EPERM,
            ErrorKind::Io { errno } => *errno,
        }
    }
}

/// Completion results at or below `-NVME_STATUS_BASE` carry an NVMe status
/// (see [`nvme_status_result`]); errnos are all far below this value.
pub const NVME_STATUS_BASE: i32 = 1 << 16;

/// Encodes an NVMe completion status as a completion result that
/// [`Error::from_errno`] decodes into [`ErrorKind::Nvme`]. `status` is the
/// kernel's passthrough `cqe->res`: the 15-bit NVMe status field without the
/// phase bit (SC bits 7:0, SCT 10:8, CRD 12:11, More 13, DNR 14).
pub fn nvme_status_result(status: u16) -> i32 {
    -(NVME_STATUS_BASE + i32::from(status & 0x7fff))
}

impl fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // A length in decimal (a caller counts bytes), an offset or
            // address in hex (a caller looks for its low bits).
            InvalidInput::Alignment {
                what,
                value,
                required_bytes,
            } if what.contains("length") => write!(
                f,
                "{what} is {value} bytes, not a multiple of {required_bytes} bytes: round it \
                 up to one (the device's Geometry::offset_align_bytes)"
            ),
            InvalidInput::Alignment {
                what,
                value,
                required_bytes,
            } if what.contains("address") => write!(
                f,
                "{what} {value:#x} is not aligned to {required_bytes} bytes: use an aligned \
                 buffer (a DmaBuf from Device::alloc_buf), or leave the engine's \
                 DeviceOptions::bounce_unaligned on to have it copied"
            ),
            InvalidInput::Alignment {
                what,
                value,
                required_bytes,
            } => write!(
                f,
                "{what} {value:#x} is not aligned to {required_bytes} bytes: use a multiple \
                 of {required_bytes} (the device's Geometry::offset_align_bytes)"
            ),
            InvalidInput::Range {
                offset_bytes,
                len_bytes,
                capacity_bytes,
            } if *capacity_bytes == i64::MAX as u64 => write!(
                f,
                "range {offset_bytes}+{len_bytes} bytes ends past the largest file offset \
                 the kernel takes (i64::MAX, {capacity_bytes} bytes)"
            ),
            InvalidInput::Range {
                offset_bytes,
                len_bytes,
                capacity_bytes,
            } => write!(
                f,
                "range {offset_bytes}+{len_bytes} bytes is beyond the capacity of {capacity_bytes} bytes"
            ),
            InvalidInput::ZeroLength => write!(
                f,
                "length 0 bytes: an op that moves data or covers a range needs a length of \
                 at least one block"
            ),
            InvalidInput::Length {
                len_bytes,
                max_bytes,
            } => write!(
                f,
                "length {len_bytes} bytes is larger than the maximum of {max_bytes} bytes"
            ),
            InvalidInput::Segments { detail } => write!(f, "bad segments: {detail}"),
            InvalidInput::Config { detail } => write!(f, "bad option: {detail}"),
            InvalidInput::AlreadyOpen { detail } => write!(
                f,
                "the file is already open in this process with other options ({detail}); \
                 open it with the same options (or clone that handle) to share its device \
                 state and write ordering, or drop every handle of it first"
            ),
            InvalidInput::PathKind { found } => write!(
                f,
                "the path is {found}: use a regular file, a block device or an NVMe \
                 generic character device (/dev/ngXnY)"
            ),
            InvalidInput::OpenFlags { detail } => {
                write!(f, "the descriptor's open flags allow no IO: {detail}")
            }
            InvalidInput::FileSizeLimit {
                op,
                offset_bytes,
                len_bytes,
                limit_bytes,
            } => {
                match op {
                    Some(op) => write!(
                        f,
                        "{} of {len_bytes} bytes at offset {offset_bytes} would end",
                        op_name(*op)
                    )?,
                    None => write!(f, "set_len to {len_bytes} bytes would grow the file")?,
                }
                write!(
                    f,
                    " past this process's file size limit of {limit_bytes} bytes \
                     (RLIMIT_FSIZE, `ulimit -f`), where the kernel would cut it short at \
                     the limit and then send SIGXFSZ, which ends the process: raise the limit (`ulimit -f \
                     unlimited`, setrlimit), stay below it, or ignore or handle SIGXFSZ \
                     (then the kernel's EFBIG and short counts come back instead)"
                )
            }
            InvalidInput::WriteOnlyFlags { op, flags } => {
                let names = match (
                    flags.contains(crate::IoFlags::FUA),
                    flags.contains(crate::IoFlags::PREFLUSH),
                ) {
                    (true, true) => "FUA|PREFLUSH",
                    (true, false) => "FUA",
                    _ => "PREFLUSH",
                };
                write!(
                    f,
                    "{op:?} with IoFlags::{names}: FUA and PREFLUSH are write flags (the \
                     kernel's block layer refuses REQ_FUA and REQ_PREFLUSH on any other op): \
                     remove them; to make earlier writes durable before this op, await a \
                     flush (Device::sync_data) first"
                )
            }
        }
    }
}

/// The message an `io::Error` (the innermost of a chain) says beyond its
/// kind and errno: the error it carries (`io::Error::other("checksum
/// mismatch")`), or std's own message (`"stream did not contain valid
/// UTF-8"`); `None` for a bare errno or kind, or a message that only
/// repeats the kind's (`"Permission denied"`, found by a break-it helper).
fn io_detail(err: &io::Error) -> Option<std::sync::Arc<str>> {
    if err.raw_os_error().is_some() {
        return None;
    }
    let text = match err.get_ref() {
        Some(inner) => inner.to_string(),
        None => err.to_string(),
    };
    let kind_text = io::Error::from(err.kind()).to_string();
    (!text.is_empty() && !text.eq_ignore_ascii_case(&kind_text)).then(|| text.into())
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(context) = self.0.context {
            write!(f, "{context}: ")?;
        }
        if let Some((op, offset_bytes, len_bytes)) = self.0.io {
            write_io(f, op, offset_bytes, len_bytes)?;
        }
        match &self.0.kind {
            ErrorKind::InvalidInput(input) => write!(f, "invalid input: {input}")?,
            ErrorKind::Unsupported => write!(f, "operation not supported")?,
            // A context (the engine's: a block device that shrank) says
            // what to do instead; the advice would contradict it.
            ErrorKind::OutOfSpace if self.0.context.is_some() => write!(f, "out of space (ENOSPC)")?,
            ErrorKind::OutOfSpace => write!(
                f,
                "out of space (ENOSPC): free space on the file system or device, or raise \
                 the quota, before writing again"
            )?,
            ErrorKind::Cancelled => write!(f, "IO cancelled")?,
            ErrorKind::PermissionDenied => write!(f, "permission denied")?,
            ErrorKind::NotFound => write!(f, "not found")?,
            ErrorKind::DirectIoRefused => write!(
                f,
                "the file system refused O_DIRECT; open it buffered: DeviceOptions {{ direct: false, .. }}"
            )?,
            // A context (the engine's) already says what to do: the
            // advice is not given twice.
            ErrorKind::NoDriver if self.0.context.is_some() => {
                write!(f, "no plugio device driver on this thread")?
            }
            ErrorKind::NoDriver => write!(
                f,
                "no plugio device driver on this thread: run the IO on a plugio core \
                 (plugio::runtime::local, or Handle::spawn_on onto a plugio::runtime::builder runtime), \
                 or install a DeviceDriver on this thread"
            )?,
            ErrorKind::Nvme { sct, sc, dnr, more } => write!(
                f,
                "NVMe status sct={sct:#x} sc={sc:#04x} ({}){}{}",
                nvme_status_name(*sct, *sc),
                if *dnr { " dnr" } else { "" },
                if *more { " more" } else { "" }
            )?,
            ErrorKind::UnexpectedEof {
                offset_bytes,
                len_bytes,
                done_bytes,
            } => write!(
                f,
                "unexpected end of file: {done_bytes} of {len_bytes} bytes read at offset {offset_bytes}"
            )?,
            ErrorKind::WriteZero {
                offset_bytes,
                len_bytes,
                done_bytes,
            } => write!(
                f,
                "write stopped short: {done_bytes} of {len_bytes} bytes written at offset {offset_bytes} (the device took no more: out of space, or the process's file size limit)"
            )?,
            ErrorKind::NoProgress {
                offset_bytes,
                len_bytes,
            } => write!(
                f,
                "no progress: {len_bytes} bytes at offset {offset_bytes} moved no data twice \
                 in a row, inside the device (not an end of file)"
            )?,
            // A context (the engine's) says what was made before the fork.
            ErrorKind::Forked if self.0.context.is_some() => write!(
                f,
                "a child process may not use its parent's io_uring rings, runtimes or \
                 devices: build a new runtime and open the devices again in the child"
            )?,
            ErrorKind::Forked => write!(
                f,
                "this runtime was built before fork(): a child process may not use its \
                 parent's io_uring rings; build a new runtime in the child"
            )?,
            ErrorKind::Io { errno } => {
                write!(f, "{}", io::Error::from_raw_os_error(*errno))?;
                if *errno == libc::EFBIG {
                    // The kernel's answer names neither the limit nor the
                    // cause; plugio checks i64::MAX and, for writes, the
                    // file size limit up front (as read then).
                    write!(
                        f,
                        ": the file would end past the largest file this file system \
                         holds (ext4 with 4 KiB blocks: 16 TiB) or past this process's \
                         file size limit (RLIMIT_FSIZE, `ulimit -f`); use a lower offset \
                         or length, or raise the limit"
                    )?;
                }
                if *errno == libc::EMFILE {
                    write!(
                        f,
                        ": this process has as many files open as its limit allows \
                         (RLIMIT_NOFILE, `ulimit -n`); raise the limit or drop devices it \
                         no longer uses (each open device holds one descriptor; each core, \
                         two for its io_uring and its wake eventfd)"
                    )?;
                }
                if *errno == libc::ENFILE {
                    write!(
                        f,
                        ": the system has as many files open as its limit allows \
                         (`sysctl fs.file-max`); raise it or close files"
                    )?;
                }
            }
        }
        if let Some(detail) = &self.0.detail {
            write!(f, ": {detail}")?;
        }
        if let Some(path) = &self.0.path {
            write!(f, " (path {})", path.display())?;
        }
        Ok(())
    }
}

/// The failed IO's part of an error's text: `read of 4096 bytes at offset
/// 8192: `, `flush: `.
fn write_io(
    f: &mut fmt::Formatter<'_>,
    op: crate::OpKind,
    offset_bytes: u64,
    len_bytes: u64,
) -> fmt::Result {
    let name = op_name(op);
    if op.has_range() {
        write!(f, "{name} of {len_bytes} bytes at offset {offset_bytes}: ")
    } else {
        write!(f, "{name}: ")
    }
}

/// The name of `op` in messages.
fn op_name(op: crate::OpKind) -> &'static str {
    use crate::OpKind;
    match op {
        OpKind::Read => "read",
        OpKind::Write => "write",
        OpKind::Flush => "flush",
        OpKind::Fsync => "fsync",
        OpKind::WriteZeroes => "write zeroes",
        OpKind::Discard => "discard",
        OpKind::Fallocate { .. } => "fallocate",
        OpKind::Nop => "no-op",
    }
}

/// A short name for the common generic and media NVMe status codes.
fn nvme_status_name(sct: u8, sc: u8) -> &'static str {
    match (sct, sc) {
        (0, 0x01) => "invalid command opcode",
        (0, 0x02) => "invalid field in command",
        (0, 0x04) => "data transfer error",
        (0, 0x06) => "internal error",
        (0, 0x0b) => "invalid namespace or format",
        (0, 0x80) => "LBA out of range",
        (0, 0x81) => "capacity exceeded",
        (0, 0x82) => "namespace not ready",
        (1, _) => "command specific",
        (2, 0x81) => "unrecovered read error",
        (2, _) => "media or data integrity error",
        (3, _) => "path related",
        _ => "see the NVMe base specification",
    }
}

impl std::error::Error for Error {}

/// An `io::Error` of the matching [`io::ErrorKind`] that carries the
/// plugio error (its message, path and context) as its inner error. Its
/// `raw_os_error()` is therefore `None` (std keeps either an errno or a
/// custom error, not both): get the errno from the inner error, as below
/// (found by a break-it helper that matched on `raw_os_error`).
///
/// ```
/// use plugio_device::{Error, ErrorKind};
/// let io: std::io::Error = Error::new(ErrorKind::OutOfSpace).into();
/// assert_eq!(io.kind(), std::io::ErrorKind::StorageFull);
/// assert_eq!(io.raw_os_error(), None);
/// let errno = io.get_ref().and_then(|e| e.downcast_ref::<Error>()).map(Error::errno);
/// assert_eq!(errno, Some(libc::ENOSPC));
/// ```
impl From<Error> for io::Error {
    fn from(err: Error) -> Self {
        let kind = match err.0.kind {
            // What the kernel's EFBIG converts to, so that code written
            // against `std::io` sees the same kind whether plugio refused
            // the op or the kernel did.
            ErrorKind::InvalidInput(InvalidInput::FileSizeLimit { .. }) => {
                io::ErrorKind::FileTooLarge
            }
            ErrorKind::InvalidInput(_) => io::ErrorKind::InvalidInput,
            ErrorKind::Unsupported => io::ErrorKind::Unsupported,
            ErrorKind::NotFound => io::ErrorKind::NotFound,
            ErrorKind::PermissionDenied => io::ErrorKind::PermissionDenied,
            ErrorKind::UnexpectedEof { .. } => io::ErrorKind::UnexpectedEof,
            ErrorKind::WriteZero { .. } => io::ErrorKind::WriteZero,
            _ => io::Error::from_raw_os_error(err.errno()).kind(),
        };
        io::Error::new(kind, err)
    }
}

/// See [`Error::from_io`]: a plugio `Error` inside comes back unchanged.
impl From<io::Error> for Error {
    fn from(err: io::Error) -> Self {
        Self::from_io(&err)
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// An `Error` taken through `io::Error` (as `DeviceCursor`'s `std::io`
    /// traits return it, and `?` converts it back) is the same error after:
    /// kind, path and context; an `io::Error` without an errno keeps what
    /// its kind says (an API audit helper found both turned into `EIO`).
    #[test]
    fn errors_come_back_unchanged_from_io_errors() {
        // A foreign error's message is kept as the detail, shown after
        // the kind (it was dropped: noted in the last stop); an errno has
        // none.
        let other = Error::from(io::Error::other("checksum mismatch in page 7"));
        assert_eq!(*other.kind(), ErrorKind::Io { errno: libc::EIO });
        assert_eq!(other.detail(), Some("checksum mismatch in page 7"));
        let shown = other.to_string();
        assert!(
            shown.starts_with("not a failed system call: an io::Error without an errno"),
            "{shown}"
        );
        assert!(
            shown.ends_with("(os error 5): checksum mismatch in page 7"),
            "{shown}"
        );
        let wrapped = io::Error::other(io::Error::new(io::ErrorKind::InvalidData, "bad magic"));
        assert_eq!(Error::from(wrapped).detail(), Some("bad magic"));
        assert_eq!(
            Error::from(io::Error::from_raw_os_error(libc::EBADF)).detail(),
            None
        );
        assert_eq!(
            Error::from(io::Error::from(io::ErrorKind::TimedOut)).detail(),
            None
        );
        // std's own messages too (`read_to_string` of bytes that are not
        // UTF-8), but not one that only repeats the kind's.
        let utf8 = std::io::read_to_string(&[0xffu8, 0xfe][..]).expect_err("not UTF-8");
        assert_eq!(
            Error::from(utf8).detail(),
            Some("stream did not contain valid UTF-8")
        );
        let repeat = io::Error::new(io::ErrorKind::PermissionDenied, "Permission denied");
        assert_eq!(Error::from(repeat).detail(), None);
        let back = Error::from(io::Error::from(other.clone().with_path("/db/pages")));
        assert_eq!(back.detail(), Some("checksum mismatch in page 7"));
        let errors = [
            Error::new(ErrorKind::NotFound).with_path("/missing"),
            Error::invalid(InvalidInput::Alignment {
                what: "offset",
                value: 3,
                required_bytes: 512,
            })
            .with_context("a test"),
            Error::new(ErrorKind::UnexpectedEof {
                offset_bytes: 0,
                len_bytes: 8192,
                done_bytes: 4096,
            }),
            Error::from_errno(libc::EBADF),
        ];
        for e in errors {
            assert_eq!(Error::from(io::Error::from(e.clone())), e);
            assert_eq!(Error::from_io(&io::Error::from(e.clone())), e);
        }
        for (kind, want) in [
            (io::ErrorKind::NotFound, ErrorKind::NotFound),
            (io::ErrorKind::PermissionDenied, ErrorKind::PermissionDenied),
            (io::ErrorKind::Unsupported, ErrorKind::Unsupported),
            (io::ErrorKind::StorageFull, ErrorKind::OutOfSpace),
            (
                io::ErrorKind::InvalidInput,
                ErrorKind::Io {
                    errno: libc::EINVAL,
                },
            ),
            (
                io::ErrorKind::UnexpectedEof,
                ErrorKind::Io {
                    errno: libc::ENODATA,
                },
            ),
            (io::ErrorKind::Other, ErrorKind::Io { errno: libc::EIO }),
        ] {
            let back = Error::from(io::Error::new(kind, "x"));
            assert_eq!(*back.kind(), want, "{kind:?}");
            // Its kind survives the way back to std (as far as the errno
            // tells it).
            if kind != io::ErrorKind::Other && kind != io::ErrorKind::UnexpectedEof {
                assert_eq!(io::Error::from(back).kind(), kind);
            }
        }
        // Wrapped twice (`io::Error::other` of an io::Error of an Error),
        // or re-wrapped under its own kind: the Error comes back whole; a
        // wrapped io::Error's errno counts.
        let e = Error::from_errno(libc::ENOSPC)
            .with_path("/x/y")
            .with_context("ctx");
        let twice = io::Error::other(io::Error::from(e.clone()));
        assert_eq!(Error::from(twice), e);
        let once = io::Error::from(e.clone());
        let rewrapped = io::Error::new(once.kind(), once);
        assert_eq!(Error::from(rewrapped), e);
        let errno_inside = io::Error::other(io::Error::from_raw_os_error(libc::EEXIST));
        assert_eq!(
            *Error::from(errno_inside).kind(),
            ErrorKind::Io {
                errno: libc::EEXIST
            }
        );
        let os = io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(*Error::from(os).kind(), ErrorKind::OutOfSpace);
    }

    /// The advice is given once: by the context where one says what to
    /// do (the engine's), else by the kind (a fresh user found it twice).
    #[test]
    fn no_driver_advises_once() {
        let bare = Error::new(ErrorKind::NoDriver).to_string();
        assert!(bare.contains("run the IO on a plugio core"), "{bare}");
        let with = Error::new(ErrorKind::NoDriver)
            .with_context("await it inside plugio::runtime::local")
            .to_string();
        assert_eq!(
            with,
            "await it inside plugio::runtime::local: no plugio device driver on this thread"
        );
    }

    #[test]
    fn an_io_result_is_two_words() {
        assert_eq!(std::mem::size_of::<Result<u64>>(), 16);
        assert_eq!(std::mem::size_of::<Error>(), 8);
    }

    #[test]
    fn errno_maps_to_kinds() {
        assert_eq!(
            *Error::from_errno(libc::ENOSPC).kind(),
            ErrorKind::OutOfSpace
        );
        assert_eq!(
            *Error::from_errno(-libc::EIO).kind(),
            ErrorKind::Io { errno: libc::EIO }
        );
        assert_eq!(
            *Error::from_errno(libc::EOPNOTSUPP).kind(),
            ErrorKind::Unsupported
        );
        assert_eq!(Error::from_errno(libc::EIO).errno(), libc::EIO);
    }

    #[test]
    fn nvme_status_round_trips_through_a_result() {
        // DNR | SCT 0 | SC 0x80 (LBA out of range), as the kernel reports it.
        let result = nvme_status_result(0x4080);
        assert!(result < 0);
        let err = Error::from_errno(result);
        assert_eq!(
            *err.kind(),
            ErrorKind::Nvme {
                sct: 0,
                sc: 0x80,
                dnr: true,
                more: false
            }
        );
        assert!(err.to_string().contains("LBA out of range"), "{err}");
        assert_eq!(err.errno(), libc::EIO);
        assert_eq!(
            *Error::from_errno(nvme_status_result(0x2281)).kind(),
            ErrorKind::Nvme {
                sct: 2,
                sc: 0x81,
                dnr: false,
                more: true
            }
        );
    }

    #[test]
    fn alignment_message_names_values() {
        let err = Error::invalid(InvalidInput::Alignment {
            what: "offset",
            value: 513,
            required_bytes: 512,
        });
        let text = err.to_string();
        assert!(text.contains("0x201") && text.contains("512"), "{text}");
        let io: io::Error = err.into();
        assert_eq!(io.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn range_message_names_the_capacity_or_the_kernels_offset_limit() {
        let range = |capacity_bytes| {
            Error::invalid(InvalidInput::Range {
                offset_bytes: 8192,
                len_bytes: 4096,
                capacity_bytes,
            })
            .to_string()
        };
        let device = range(8192);
        assert!(
            device.contains("beyond the capacity of 8192 bytes"),
            "{device}"
        );
        // A file has no capacity: its limit is the kernel's loff_t.
        let file = range(i64::MAX as u64);
        assert!(
            file.contains("largest file offset the kernel takes (i64::MAX"),
            "{file}"
        );
    }

    #[test]
    fn efbig_says_the_io_ends_past_the_file_systems_largest_file_or_the_limit() {
        let e = Error::from_errno(-libc::EFBIG).to_string();
        assert!(e.starts_with("File too large"), "{e}");
        assert!(e.contains("largest file this file system holds"), "{e}");
        assert!(e.contains("file size limit (RLIMIT_FSIZE"), "{e}");
        assert!(e.ends_with("or raise the limit"), "{e}");
        let other = Error::from_errno(-libc::EIO).to_string();
        assert!(!other.contains("largest file"), "{other}");
    }

    #[test]
    fn too_many_open_files_says_which_limit_and_what_to_do() {
        let e = Error::from_errno(-libc::EMFILE).to_string();
        assert!(e.contains("RLIMIT_NOFILE, `ulimit -n`"), "{e}");
        assert!(e.contains("raise the limit or drop devices"), "{e}");
        let e = Error::from_errno(-libc::ENFILE).to_string();
        assert!(e.contains("fs.file-max"), "{e}");
        // EROFS has no advice of its own: what to do depends on the op
        // (see `explain_write_refusal` for a writable open).
        let e = Error::from_errno(-libc::EROFS).to_string();
        assert!(!e.contains("read_only"), "{e}");
        let other = Error::from_errno(-libc::EIO).to_string();
        assert!(!other.contains("limit"), "{other}");
    }

    #[test]
    fn a_write_past_the_file_size_limit_says_which_limit_and_how_to_raise_it() {
        let input = InvalidInput::FileSizeLimit {
            op: Some(crate::OpKind::Write),
            offset_bytes: 1 << 20,
            len_bytes: 4096,
            limit_bytes: 1 << 20,
        };
        let e = Error::invalid(input.clone());
        assert_eq!(*e.kind(), ErrorKind::InvalidInput(input));
        let text = e.to_string();
        assert!(
            text.contains("write of 4096 bytes at offset 1048576 would end past"),
            "{text}"
        );
        assert!(
            text.contains("file size limit of 1048576 bytes (RLIMIT_FSIZE"),
            "{text}"
        );
        assert!(text.contains("SIGXFSZ"), "{text}");
        assert!(text.contains("ulimit -f unlimited"), "{text}");
        assert_eq!(e.errno(), libc::EFBIG);
        // As std::io sees the kernel's EFBIG.
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            io::Error::from(Error::from_errno(-libc::EFBIG)).kind(),
            io::ErrorKind::FileTooLarge
        );
        let set_len = Error::invalid(InvalidInput::FileSizeLimit {
            op: None,
            offset_bytes: 0,
            len_bytes: 2 << 20,
            limit_bytes: 1 << 20,
        })
        .to_string();
        assert!(
            set_len.starts_with("invalid input: set_len to 2097152 bytes would grow the file past"),
            "{set_len}"
        );
    }
}
