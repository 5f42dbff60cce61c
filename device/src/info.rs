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
