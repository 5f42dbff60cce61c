//! The process's file size limit (`RLIMIT_FSIZE`, `ulimit -f`) and the
//! check of a write against it, before submission.
//!
//! The kernel refuses a write to a regular file at or past the limit with
//! `EFBIG` and sends the writing thread `SIGXFSZ`, whose default action
//! ends the process (`generic_write_check_limits`); a write that crosses it
//! comes back short, and its remainder would then start at the limit. An
//! `O_DIRECT` write through io_uring runs inline in `io_uring_enter`, in
//! the submitting thread, and a write through the blocking pool runs in a
//! thread of the process: either way the process died with no word of
//! why. So a write to a regular file that would end past the limit is
//! refused before submission instead
//! ([`InvalidInput::FileSizeLimit`]). Block devices are not held to the
//! limit.
//!
//! Invariant: `LIMIT_BYTES` holds the soft limit as last read (`u64::MAX`
//! for none), or 0 before the first read; every write that ends past the
//! value held reads the limit again before it is refused, so a limit
//! raised since is seen. A limit lowered since the last read is not (the
//! write then fails, or signals, as `pwrite(2)` would).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, InvalidInput, Result};
use crate::geometry::DeviceKind;
use crate::op::OpKind;

/// The limit as last read; 0 before the first read (every write then
/// reads it).
static LIMIT_BYTES: AtomicU64 = AtomicU64::new(0);

/// Refuses a write (`op` [`OpKind::Write`]) to a regular file (`kind`
/// [`DeviceKind::File`]) of `len_bytes` at `offset_bytes` that would end
/// past the process's file size limit (`RLIMIT_FSIZE`'s soft limit); every
/// other op and target passes. One load and compare on the common path.
///
/// ```
/// use plugio_device::{check_file_size_limit, DeviceKind, OpKind};
/// // Reads are never held to it, nor block devices.
/// assert!(check_file_size_limit(DeviceKind::File, OpKind::Read, u64::MAX / 2, 4096).is_ok());
/// assert!(check_file_size_limit(DeviceKind::BlockDevice, OpKind::Write, 1 << 40, 4096).is_ok());
/// ```
///
/// # Errors
/// [`InvalidInput::FileSizeLimit`] (errno `EFBIG`) naming the write and
/// the limit.
#[inline]
pub fn check_file_size_limit(
    kind: DeviceKind,
    op: OpKind,
    offset_bytes: u64,
    len_bytes: u64,
) -> Result<()> {
    if op != OpKind::Write || kind != DeviceKind::File {
        return Ok(());
    }
    // Relaxed: a cached copy of a value the kernel holds; the refusal
    // below reads the kernel's again, so no other memory depends on it.
    if offset_bytes.saturating_add(len_bytes) <= LIMIT_BYTES.load(Ordering::Relaxed) {
        return Ok(());
    }
    past_cached_limit(offset_bytes, len_bytes)
}

/// [`check_file_size_limit`] of a write that ends past the limit as last
/// read: reads it again, then refuses the write if it still ends past it.
#[cold]
#[inline(never)]
fn past_cached_limit(offset_bytes: u64, len_bytes: u64) -> Result<()> {
    let limit_bytes = file_size_limit_bytes();
    // Relaxed: see `check_file_size_limit`.
    LIMIT_BYTES.store(limit_bytes, Ordering::Relaxed);
    if offset_bytes.saturating_add(len_bytes) <= limit_bytes {
        return Ok(());
    }
    Err(Error::invalid(InvalidInput::FileSizeLimit {
        offset_bytes,
        len_bytes,
        limit_bytes,
    }))
}

/// The process's file size limit (`RLIMIT_FSIZE`'s soft limit) in bytes,
/// read now; `u64::MAX` for no limit or a `getrlimit` that failed.
pub fn file_size_limit_bytes() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable `rlimit` for the call's
    // duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return u64::MAX;
    }
    limit.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writes_to_regular_files_are_held_to_the_limit() {
        // Whatever the test process's limit, these never reach it.
        for op in [OpKind::Read, OpKind::Discard, OpKind::Flush, OpKind::Nop] {
            assert!(check_file_size_limit(DeviceKind::File, op, u64::MAX - 1, 4096).is_ok());
        }
        for kind in [DeviceKind::BlockDevice, DeviceKind::Memory] {
            assert!(check_file_size_limit(kind, OpKind::Write, u64::MAX - 1, 4096).is_ok());
        }
    }

    #[test]
    fn a_write_below_the_limit_passes_and_one_past_it_names_it() {
        let limit = file_size_limit_bytes();
        assert!(check_file_size_limit(DeviceKind::File, OpKind::Write, 0, 4096).is_ok());
        if limit == u64::MAX {
            // No limit in this process: even the largest end passes (the
            // i64::MAX bound is the range check's, not this one's).
            assert!(
                check_file_size_limit(DeviceKind::File, OpKind::Write, u64::MAX - 1, 1).is_ok()
            );
            return;
        }
        let e = check_file_size_limit(DeviceKind::File, OpKind::Write, limit, 4096)
            .expect_err("a write at the limit");
        assert_eq!(e.errno(), libc::EFBIG);
    }
}
