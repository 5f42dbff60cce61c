//! What a path names, checked with `stat` before anything opens it.
//!
//! `open(2)` blocks on a FIFO until a writer appears, and a directory,
//! `/dev/null` or a socket opens (or fails) in ways that later look like a
//! device with odd geometry. [`check_path_kind`] refuses them at once
//! without opening the path: only a regular file, a block device or an NVMe
//! generic character device (`/dev/ngXnY`) is something plugio does IO on.
//!
//! Invariant: [`check_path_kind`] never opens `path` (it only calls
//! `stat`, following symlinks as `open` does), so it cannot block.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use crate::error::{Error, InvalidInput, Result};

/// The kinds of path plugio opens for IO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// A regular file.
    File,
    /// A block device (`/dev/sda`, `/dev/nvme0n1`, `/dev/loop0`).
    BlockDevice,
    /// An NVMe generic character device (`/dev/ngXnY`), opened for
    /// passthrough.
    NvmeGeneric,
}

/// Checks with `stat` (no `open`) that `path` is a regular file, a block
/// device or an NVMe generic character device.
///
/// # Errors
/// The `stat` error with the path ([`ErrorKind::NotFound`] for a missing
/// path); [`InvalidInput::PathKind`] naming what the path is (directory,
/// FIFO, socket, character device) for anything else.
///
/// [`ErrorKind::NotFound`]: crate::ErrorKind::NotFound
pub fn check_path_kind(path: impl AsRef<Path>) -> Result<PathKind> {
    let path = path.as_ref();
    let meta = std::fs::metadata(path).map_err(|e| Error::from_io(&e).with_path(path))?;
    let t = meta.file_type();
    if t.is_file() {
        return Ok(PathKind::File);
    } else if t.is_block_device() {
        return Ok(PathKind::BlockDevice);
    } else if t.is_char_device() && crate::is_passthrough_path(path) {
        return Ok(PathKind::NvmeGeneric);
    }
    Err(Error::invalid(InvalidInput::PathKind {
        found: kind_name(t),
    })
    .with_path(path))
}

/// What `path` is (symbolic links followed), in words with its article,
/// as [`InvalidInput::PathKind`] names it: "a regular file", "a block
/// device", "a directory", "a FIFO (named pipe)", "a socket", "a character
/// device". `None` when it cannot be examined (missing, no permission).
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// assert_eq!(plugio::device::path_kind::describe(dir.path()), Some("a directory"));
/// assert_eq!(plugio::device::path_kind::describe(dir.path().join("none")), None);
/// ```
pub fn describe(path: impl AsRef<Path>) -> Option<&'static str> {
    std::fs::metadata(path)
        .ok()
        .map(|m| kind_name(m.file_type()))
}

/// What a file type is, in words, for [`InvalidInput::PathKind`].
pub(crate) fn kind_name(t: std::fs::FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else {
        "neither a file nor a device"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn refused_as(path: &Path) -> &'static str {
        match check_path_kind(path).map_err(|e| e.kind().clone()) {
            Err(ErrorKind::InvalidInput(InvalidInput::PathKind { found })) => found,
            other => panic!("{}: {other:?}", path.display()),
        }
    }

    #[test]
    fn files_pass_and_directories_fifos_and_dev_null_are_refused_without_opening() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        assert_eq!(check_path_kind(&file).expect("file"), PathKind::File);
        assert_eq!(refused_as(dir.path()), "a directory");
        // A FIFO nobody writes to: an open would block; the check returns.
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        assert_eq!(refused_as(&fifo), "a FIFO (named pipe)");
        assert_eq!(refused_as(Path::new("/dev/null")), "a character device");
        let e = check_path_kind(dir.path().join("missing")).unwrap_err();
        assert_eq!(*e.kind(), ErrorKind::NotFound);
        let msg = check_path_kind(&fifo).unwrap_err().to_string();
        assert!(
            msg.contains("FIFO") && msg.contains("block device") && msg.contains("fifo"),
            "{msg}"
        );
    }
}
