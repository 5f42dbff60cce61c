//! The sync backend: blocking `preadv`/`pwritev2`/`fsync`/`fallocate`/ioctl
//! calls on a bounded thread pool, completing through the submitting
//! core's inbox. The pool is the executor's: the sync IO pool of the
//! submitting core's runtime (`plugio::executor::blocking`), separate from
//! the pool of `spawn_blocking` so that user blocking calls never starve
//! IO; off an executor core, one process-wide pool of the same kind.
//!
//! Invariants:
//! - A job owns a copy of the op's iovec array and a reference to the open
//!   file, so the file stays open and the array valid until the job ends;
//!   the buffer memory is the submitter's promise (Backend::submit).
//! - Every job posts exactly one completion to the inbox of the thread that
//!   submitted it; `EINTR`/`EAGAIN` are retried inside the job.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, PoisonError};

use plugio_executor::blocking::BlockingPool;
use plugio_executor::fork::ForkLocal;

use crate::core::{with_core, Completion, HandlerId, Inbox};
use crate::error::{Error, Result};
use crate::op::{IoFlags, IoOp, OpKind};

/// Threads of the pool that serves threads driving IO without a plugio
/// executor. On an executor core, jobs go to its runtime's sync IO pool
/// instead (`plugio::executor::Builder::sync_io_threads`, default 4).
pub const POOL_THREADS: usize = 4;

/// `BLKDISCARD`: `_IO(0x12, 119)`.
pub(crate) const BLKDISCARD: libc::c_ulong = 0x1277;
/// `BLKZEROOUT`: `_IO(0x12, 127)`.
pub(crate) const BLKZEROOUT: libc::c_ulong = 0x127f;

/// An op copied for another thread: the iovec array is owned.
pub(crate) struct OwnedOp {
    pub kind: OpKind,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub iovecs: Vec<libc::iovec>,
    pub flags: IoFlags,
}

impl OwnedOp {
    pub fn from_op(op: &IoOp<'_>) -> Self {
        Self {
            kind: op.kind,
            offset_bytes: op.offset_bytes,
            len_bytes: op.len_bytes,
            iovecs: op.segments.to_vec(),
            flags: op.flags,
        }
    }
}

struct Job {
    file: Arc<OwnedFd>,
    is_block_device: bool,
    op: OwnedOp,
    inbox: Arc<Inbox>,
    handler: HandlerId,
    token: u64,
}

// SAFETY: the iovecs point to memory the submitter handed over until the
// completion (Backend::submit's contract); nothing else in a Job is !Send.
unsafe impl Send for Job {}

/// The pool a job runs on: the sync IO pool of the runtime whose core
/// submits it, or, on a thread that drives IO without a plugio executor
/// (a `DeviceDriver` parked by hand), one process-wide pool of
/// [`POOL_THREADS`] threads, made again in a forked child (a
/// [`ForkLocal`]: the parent's threads are not there, and its lock may
/// have been held by one of them at the fork).
fn pool() -> BlockingPool {
    static DRIVER_ONLY: ForkLocal<Mutex<Option<BlockingPool>>> =
        ForkLocal::new(|| Mutex::new(None));
    BlockingPool::current_sync_io().unwrap_or_else(|| {
        DRIVER_ONLY
            .get()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(|| BlockingPool::new("plugio-sync", POOL_THREADS))
            .clone()
    })
}

impl Job {
    fn run(self) {
        let result = execute(self.file.as_raw_fd(), self.is_block_device, &self.op);
        self.inbox.post(Completion {
            handler: self.handler,
            token: self.token,
            result,
        });
    }
}

/// Queues `op` on the pool; its completion goes to the calling thread.
///
/// # Errors
/// The pool has no threads left (all failed to spawn).
pub(crate) fn submit_to_pool(
    file: &Arc<OwnedFd>,
    is_block_device: bool,
    op: &IoOp<'_>,
    handler: HandlerId,
    token: u64,
) -> Result<()> {
    let job = Job {
        file: file.clone(),
        is_block_device,
        op: OwnedOp::from_op(op),
        inbox: with_core(|core| core.inbox()),
        handler,
        token,
    };
    pool().execute(move || job.run()).map_err(|e| {
        tracing::error!(error = %e, "sync IO pool refused a job");
        Error::from_errno(libc::EAGAIN)
            .with_context("the sync IO pool is shut down or cannot start a thread")
    })?;
    with_core(|core| core.add_external());
    Ok(())
}

/// Runs `op` on `fd` with blocking calls; returns bytes or `-errno`.
/// `EINTR` and `EAGAIN` are retried.
pub(crate) fn execute(fd: RawFd, is_block_device: bool, op: &OwnedOp) -> i32 {
    if op.flags.contains(IoFlags::PREFLUSH) {
        let r = retry(|| {
            // SAFETY: plain syscall on an open fd.
            unsafe { libc::fdatasync(fd) as isize }
        });
        if r < 0 {
            return r as i32;
        }
    }
    let r = match op.kind {
        OpKind::Read => retry(|| {
            // SAFETY: the iovecs describe memory owned by the submitter
            // until completion (Backend::submit contract).
            unsafe {
                libc::preadv(
                    fd,
                    op.iovecs.as_ptr(),
                    op.iovecs.len() as i32,
                    op.offset_bytes as i64,
                )
            }
        }),
        OpKind::Write => {
            let rwf = if op.flags.contains(IoFlags::FUA) {
                libc::RWF_DSYNC
            } else {
                0
            };
            retry(|| {
                // SAFETY: as for preadv.
                unsafe {
                    libc::pwritev2(
                        fd,
                        op.iovecs.as_ptr(),
                        op.iovecs.len() as i32,
                        op.offset_bytes as i64,
                        rwf,
                    )
                }
            })
        }
        OpKind::Flush => retry(|| {
            // SAFETY: plain syscall on an open fd.
            unsafe { libc::fdatasync(fd) as isize }
        }),
        OpKind::Fsync => retry(|| {
            // SAFETY: plain syscall on an open fd.
            unsafe { libc::fsync(fd) as isize }
        }),
        OpKind::WriteZeroes if is_block_device => range_ioctl(fd, BLKZEROOUT, op),
        OpKind::Discard if is_block_device => range_ioctl(fd, BLKDISCARD, op),
        OpKind::WriteZeroes => fallocate(fd, libc::FALLOC_FL_ZERO_RANGE, op),
        OpKind::Discard => fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            op,
        ),
        OpKind::Fallocate { mode } => fallocate(fd, mode, op),
        OpKind::Nop => 0,
    };
    r.clamp(i32::MIN as isize, i32::MAX as isize) as i32
}

fn fallocate(fd: RawFd, mode: i32, op: &OwnedOp) -> isize {
    retry(|| {
        // SAFETY: plain syscall on an open fd.
        unsafe { libc::fallocate(fd, mode, op.offset_bytes as i64, op.len_bytes as i64) as isize }
    })
}

fn range_ioctl(fd: RawFd, request: libc::c_ulong, op: &OwnedOp) -> isize {
    let range: [u64; 2] = [op.offset_bytes, op.len_bytes];
    retry(|| {
        // SAFETY: BLKDISCARD/BLKZEROOUT read two u64s from a live local.
        unsafe { libc::ioctl(fd, request as _, range.as_ptr()) as isize }
    })
}

/// Calls `f` until it returns something other than `-1` with
/// `EINTR`/`EAGAIN`; maps `-1` to `-errno`. Data calls return the count.
fn retry(mut f: impl FnMut() -> isize) -> isize {
    loop {
        let r = f();
        if r >= 0 {
            // fsync/fallocate/ioctl return 0 on success; data calls the count.
            return r;
        }
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        if errno != libc::EINTR && errno != libc::EAGAIN {
            return -(errno as isize);
        }
    }
}
