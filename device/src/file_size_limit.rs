//! The process's file size limit (`RLIMIT_FSIZE`, `ulimit -f`) and the
//! check of an op against it, before submission.
//!
//! The kernel refuses a write to a regular file at or past the limit with
//! `EFBIG` and sends the thread `SIGXFSZ`, whose default action ends the
//! process (`generic_write_check_limits`); it cuts a write that crosses it
//! short, whose remainder would then start at the limit; and a
//! `fallocate` or `ftruncate` that grows the file past it is refused and
//! signalled the same way (`inode_newsize_ok`; one that stays inside the
//! file's length is not held to it). An `O_DIRECT` write
//! through io_uring runs inline in `io_uring_enter`, in the submitting
//! thread, and the blocking pool's calls run in threads of the process:
//! either way the process died with no word of why. So while `SIGXFSZ`
//! has its default action, an op on a regular file that would end past
//! the limit is refused before submission instead
//! ([`InvalidInput::FileSizeLimit`]). A program that ignores or handles
//! `SIGXFSZ` (as databases often do) gets the kernel's answers, as from
//! `pwrite(2)`: a short count up to the limit, then `EFBIG`. Block devices
//! are not held to the limit.
//!
//! Invariant: `LIMIT_BYTES` holds the soft limit as last read (`u64::MAX`
//! for none), or 0 when it is to be read again: before the first read,
//! and after each park of a device driver (once per executor tick,
//! `forget_cached_limit`), so the first op of a tick held to the limit
//! reads it. Every op that ends past the value held reads the limit and
//! the signal's action again before it is refused, so a limit raised
//! since is seen at once; one lowered since (`setrlimit`, `prlimit --pid`)
//! is seen from the next tick on. An op of the same tick then goes to the
//! kernel, which fails it (or signals) as it would `pwrite(2)`; the threads
//! plugio starts block `SIGXFSZ`, so there it fails with `EFBIG`
//! (`plugio_executor::block_file_size_signal`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, InvalidInput, Result};
use crate::geometry::DeviceKind;
use crate::op::OpKind;

/// The limit as last read; 0 before the first read (every op held to it
/// then reads it).
static LIMIT_BYTES: AtomicU64 = AtomicU64::new(0);

/// Refuses an op on a regular file (`kind` [`DeviceKind::File`]) of
/// `len_bytes` at `offset_bytes` that would end past the process's file
/// size limit (`RLIMIT_FSIZE`'s soft limit) while `SIGXFSZ` has its
/// default action, as the kernel holds each op to it: a [`OpKind::Write`]
/// (whatever the file's length: `generic_write_check_limits`), or a
/// [`OpKind::WriteZeroes`] or [`OpKind::Fallocate`] without
/// `FALLOC_FL_KEEP_SIZE` that grows the file past it (`inode_newsize_ok`:
/// one inside a file already longer goes; `file_len` gives the file's
/// length, read only then, `None` when unknown, which refuses). Every
/// other op and target passes. One load and compare on the common path.
///
/// ```
/// use plugio_device::{check_file_size_limit, DeviceKind, OpKind};
/// // Reads are never held to it, nor block devices.
/// assert!(check_file_size_limit(DeviceKind::File, OpKind::Read, u64::MAX / 2, 4096, || None).is_ok());
/// assert!(check_file_size_limit(DeviceKind::BlockDevice, OpKind::Write, 1 << 40, 4096, || None).is_ok());
/// ```
///
/// # Errors
/// [`InvalidInput::FileSizeLimit`] (errno `EFBIG`) naming the op and the
/// limit.
#[inline]
pub fn check_file_size_limit(
    kind: DeviceKind,
    op: OpKind,
    offset_bytes: u64,
    len_bytes: u64,
    file_len: impl FnOnce() -> Option<u64>,
) -> Result<()> {
    let may_grow = match op {
        OpKind::Write | OpKind::WriteZeroes => true,
        OpKind::Fallocate { mode } => mode & libc::FALLOC_FL_KEEP_SIZE == 0,
        _ => false,
    };
    if !may_grow || kind != DeviceKind::File {
        return Ok(());
    }
    // Relaxed: a cached copy of a value the kernel holds; the refusal
    // below reads the kernel's again, so no other memory depends on it.
    if offset_bytes.saturating_add(len_bytes) <= LIMIT_BYTES.load(Ordering::Relaxed) {
        return Ok(());
    }
    let grows_only = op != OpKind::Write;
    past_cached_limit(Some(op), offset_bytes, len_bytes, grows_only, file_len)
}

/// [`check_file_size_limit`] of a `set_len` (`ftruncate`) of a regular
/// file to `len_bytes`: refused only where it grows the file past the
/// limit (`file_len`, read only then, gives the file's length; `None`
/// refuses).
///
/// # Errors
/// [`InvalidInput::FileSizeLimit`] with no op.
pub fn check_set_len(
    kind: DeviceKind,
    len_bytes: u64,
    file_len: impl FnOnce() -> Option<u64>,
) -> Result<()> {
    if kind != DeviceKind::File
        // Relaxed: see `check_file_size_limit`.
        || len_bytes <= LIMIT_BYTES.load(Ordering::Relaxed)
    {
        return Ok(());
    }
    past_cached_limit(None, 0, len_bytes, true, file_len)
}

/// An op ending past the limit as last read: reads it again, and refuses
/// the op if it still ends past it while `SIGXFSZ` has its default action,
/// unless `grows_only` and it ends inside the file (`file_len`).
#[cold]
#[inline(never)]
fn past_cached_limit(
    op: Option<OpKind>,
    offset_bytes: u64,
    len_bytes: u64,
    grows_only: bool,
    file_len: impl FnOnce() -> Option<u64>,
) -> Result<()> {
    let limit_bytes = file_size_limit_bytes();
    // Relaxed: see `check_file_size_limit`.
    LIMIT_BYTES.store(limit_bytes, Ordering::Relaxed);
    let end = offset_bytes.saturating_add(len_bytes);
    if end <= limit_bytes || !signal_ends_process() {
        return Ok(());
    }
    if grows_only && file_len().is_some_and(|len| end <= len) {
        return Ok(());
    }
    Err(Error::invalid(InvalidInput::FileSizeLimit {
        op,
        offset_bytes,
        len_bytes,
        limit_bytes,
    }))
}

/// Makes the next op held to the limit read it again (see the module's
/// invariant): called at each park of a device driver. One load where
/// nothing was cached since the last call.
#[inline]
pub(crate) fn forget_cached_limit() {
    // Relaxed: see `check_file_size_limit`.
    if LIMIT_BYTES.load(Ordering::Relaxed) != 0 {
        LIMIT_BYTES.store(0, Ordering::Relaxed);
    }
}

/// The length of the open file `fd` (`fstat`), for the `file_len` of
/// [`check_file_size_limit`].
pub fn fd_len_bytes(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    let st = nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(&fd)).ok()?;
    u64::try_from(st.st_size).ok()
}

/// Whether `SIGXFSZ` has its default action (ending the process), read
/// now; true when it cannot be read.
fn signal_ends_process() -> bool {
    // SAFETY: an all-zero `sigaction` is a valid value to be overwritten.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `old`,
    // which is valid and writable for the call.
    if unsafe { libc::sigaction(libc::SIGXFSZ, std::ptr::null(), &mut old) } != 0 {
        return true;
    }
    old.sa_sigaction == libc::SIG_DFL
}

/// The process's file size limit (`RLIMIT_FSIZE`'s soft limit) in bytes,
/// read now; `u64::MAX` for no limit or a `getrlimit` that failed.
pub fn file_size_limit_bytes() -> u64 {
    use nix::sys::resource::{getrlimit, Resource};
    match getrlimit(Resource::RLIMIT_FSIZE) {
        Ok((soft, _)) if soft != libc::RLIM_INFINITY => soft,
        _ => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writes_to_regular_files_are_held_to_the_limit() {
        // Whatever the test process's limit, these never reach it.
        let keep_size = OpKind::Fallocate {
            mode: libc::FALLOC_FL_KEEP_SIZE,
        };
        for op in [
            OpKind::Read,
            OpKind::Discard,
            OpKind::Flush,
            OpKind::Nop,
            keep_size,
        ] {
            assert!(
                check_file_size_limit(DeviceKind::File, op, u64::MAX - 1, 4096, || None).is_ok()
            );
        }
        for kind in [DeviceKind::BlockDevice, DeviceKind::Memory] {
            assert!(
                check_file_size_limit(kind, OpKind::Write, u64::MAX - 1, 4096, || None).is_ok()
            );
        }
    }

    #[test]
    fn a_write_below_the_limit_passes_and_one_past_it_names_it() {
        let limit = file_size_limit_bytes();
        assert!(check_file_size_limit(DeviceKind::File, OpKind::Write, 0, 4096, || None).is_ok());
        if limit == u64::MAX {
            // No limit in this process: even the largest end passes (the
            // i64::MAX bound is the range check's, not this one's).
            assert!(check_file_size_limit(
                DeviceKind::File,
                OpKind::Write,
                u64::MAX - 1,
                1,
                || None
            )
            .is_ok());
            return;
        }
        // The test binary leaves SIGXFSZ at its default action.
        let e = check_file_size_limit(DeviceKind::File, OpKind::Write, limit, 4096, || None)
            .expect_err("a write at the limit");
        assert_eq!(e.errno(), libc::EFBIG);
    }
}
