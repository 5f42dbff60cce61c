//! `plugio info PATH`: a human-readable description of a device or file and
//! of this kernel's io_uring.
//!
//! Invariant: describing never writes to the target (it is opened read-only)
//! and leaves no ring installed on the calling thread.

use std::fmt::Write as _;
use std::path::Path;

use crate::backend::file::OpenOptions;
use crate::error::{ErrorKind, Result};
use crate::ring::{Ring, RingConfig};

/// Describes `path`: its geometry (block sizes, queue limits, alignment,
/// capacity; see [`Geometry`](crate::Geometry)), whether `O_DIRECT` is
/// accepted, and the io_uring setup flags, features and probed opcodes of
/// this kernel (or why io_uring is unavailable).
///
/// # Errors
/// The path is not a regular file, block device or NVMe generic character
/// device (checked with `stat` first, so a FIFO is refused rather than
/// waited on; see [`check_path_kind`](crate::check_path_kind)), it cannot be
/// opened read-only, or its geometry cannot be read.
pub fn describe(path: impl AsRef<Path>) -> Result<String> {
    let path = path.as_ref();
    crate::check_path_kind(path)?;
    let mut options = OpenOptions::new();
    options.read(true).write(false);
    let (backend, direct_note) = match options.open(path) {
        Ok(b) => (b, "accepted"),
        Err(e) if *e.kind() == ErrorKind::DirectIoRefused => (
            options.direct(false).open(path)?,
            "refused by the file system (buffered IO used)",
        ),
        Err(e) => return Err(e),
    };
    let mut out = String::new();
    let _ = writeln!(out, "path:                {}", path.display());
    let _ = writeln!(out, "O_DIRECT:            {direct_note}");
    let writable = match write_refusal(path) {
        None => "yes".to_owned(),
        Some(why) => format!("no: {why}"),
    };
    let _ = writeln!(out, "writable:            {writable}");
    let _ = writeln!(out, "{}", crate::Backend::geometry(&backend));
    let _ = writeln!(out, "io_uring:");
    match Ring::new(&RingConfig::default()) {
        Ok(ring) => {
            let _ = write!(out, "{}", ring.info());
        }
        Err(e) => {
            let _ = write!(out, "unavailable ({e}); the sync thread pool is used");
        }
    }
    Ok(out)
}

/// Why this process could not open `path` for writing, or `None` when it
/// could: a read-only block device (`BLKROGET`: `blockdev --setro`,
/// `losetup -r`, or a read-only disk under a partition), a read-only
/// file system (`EROFS`), or permission bits that refuse this user
/// (`access(2)` with `W_OK`, as the kernel checks the effective user).
/// Nothing is opened for writing.
///
/// ```
/// let tmp = tempfile::NamedTempFile::new()?;
/// assert_eq!(plugio::device::write_refusal(tmp.path()), None);
/// # Ok::<_, std::io::Error>(())
/// ```
pub fn write_refusal(path: &Path) -> Option<String> {
    if let Ok(file) = std::fs::File::open(path) {
        if crate::backend::file::is_read_only_block_device(&file) {
            return Some(
                "the block device is read-only (BLKROGET; `blockdev --setrw` undoes \
                 `blockdev --setro`, a `losetup -r` device must be set up again, a partition \
                 follows its disk)"
                    .to_owned(),
            );
        }
    }
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return Some("the path holds a NUL byte".to_owned());
    };
    // SAFETY: access(2) only reads the NUL-terminated string, which lives
    // across the call.
    if unsafe { libc::access(c_path.as_ptr(), libc::W_OK) } == 0 {
        return None;
    }
    let e = std::io::Error::last_os_error();
    Some(match e.raw_os_error() {
        Some(libc::EROFS) => "the file system is mounted read-only".to_owned(),
        Some(libc::EACCES | libc::EPERM) => {
            "this user may not write it (its permission bits)".to_owned()
        }
        _ => format!("access(W_OK) says {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_a_file_with_geometry_and_ring() {
        let tmp = tempfile::NamedTempFile::new_in(crate::testing::direct_io_dir()).expect("tmp");
        let text = describe(tmp.path()).expect("describe");
        for needle in [
            "logical_block_size",
            "dio_mem_align",
            "max_sectors_kb",
            "supported ops",
            "writable:            yes",
        ] {
            assert!(text.contains(needle), "{needle} missing in:\n{text}");
        }
        assert!(describe("/nonexistent/plugio").is_err());
        assert!(matches!(
            describe("/dev/null").map_err(|e| e.kind().clone()),
            Err(ErrorKind::InvalidInput(
                crate::InvalidInput::PathKind { .. }
            ))
        ));
    }
}
