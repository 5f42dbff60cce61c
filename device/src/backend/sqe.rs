//! SQEs for the file backend's ops, and [`SqWriter`], which writes the
//! SQEs of one dispatch batch on the calling thread's ring.
//!
//! A leaf of the backend module: it names the ring and the op types, not
//! the [`Backend`](crate::Backend) trait or the file backend (both use
//! it), so that the trait can hand out a writer without an import cycle.
//!
//! Invariants:
//! - One SQE per op, built the same way for a writer and for the file
//!   backend's own submit ([`build`]); an op that needs more than one SQE
//!   (a linked PREFLUSH), a ring slot (a token over 48 bits) or no SQE at
//!   all (a block-device discard) is not written by a writer: it says no,
//!   and the caller submits it through the backend.
//! - A writer never outlives the call that made it, and holds its ring
//!   with a strong count of its own for that call.

use std::mem::MaybeUninit;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types};

use crate::core::HandlerId;
use crate::op::{IoFlags, IoOp, OpKind};
use crate::ring::{self, Ring};

/// Whether an SQE addresses a raw fd or a registered file.
#[derive(Clone, Copy)]
pub(crate) enum Target {
    Fd(RawFd),
    Fixed(u32),
}

/// Builds an SQE with `$fd` bound to `types::Fd` or `types::Fixed`.
macro_rules! with_target {
    ($target:expr, |$fd:ident| $body:expr) => {
        match $target {
            Target::Fd(raw) => {
                let $fd = types::Fd(raw);
                $body
            }
            Target::Fixed(index) => {
                let $fd = types::Fixed(index);
                $body
            }
        }
    };
}

/// The SQE of `op` on `target`, or `None` when io_uring has no opcode for
/// it here (a block-device discard: it goes to the sync pool).
/// `is_block_device` picks the zeroing mode and the discard's way. Several
/// segments that all lie in registered buffer `op.fixed_buf` go as
/// `READV_FIXED`/`WRITEV_FIXED` where `ring` has them (Linux 6.15), else
/// as a plain `READV`/`WRITEV`. An SQE on a registered buffer is counted
/// in `ring`'s statistics (`RingStats::fixed_buf_sqes`): the caller pushes
/// every SQE it gets.
#[inline]
pub(crate) fn build(
    target: Target,
    op: &IoOp<'_>,
    is_block_device: bool,
    ring: &Ring,
) -> Option<squeue::Entry> {
    let mut built = MaybeUninit::uninit();
    // SAFETY: `build_into` wrote the entry where it returned true.
    build_into(target, op, is_block_device, ring, &mut built)
        .then(|| unsafe { built.assume_init() })
}

/// [`build`], writing the SQE into `out` from the match arm that builds
/// it (returned, the entry would be copied field by field out of the arm
/// first: about 34 instructions per SQE on the hot path,
/// [`SqWriter::try_submit_direct`]). Returns whether it wrote one: false
/// where [`build`] returns `None`.
#[inline(always)]
fn build_into(
    target: Target,
    op: &IoOp<'_>,
    is_block_device: bool,
    ring: &Ring,
    out: &mut MaybeUninit<squeue::Entry>,
) -> bool {
    let off = op.offset_bytes;
    let rw_flags = if op.flags.contains(IoFlags::FUA) {
        libc::RWF_DSYNC
    } else {
        0
    };
    let prio = op.flags.ioprio();
    let seg = op.segments.first().copied();
    let fixed = op.fixed_buf.filter(|_| op.segments.len() == 1);
    match (op.kind, seg, fixed) {
        (OpKind::Read, Some(s), Some(index)) if op.segments.len() == 1 => {
            ring.count_fixed_buf_sqe();
            with_target!(target, |fd| {
                out.write(
                    opcode::ReadFixed::new(fd, s.iov_base.cast(), s.iov_len as u32, index)
                        .offset(off)
                        .ioprio(prio)
                        .build(),
                )
            })
        }
        (OpKind::Read, Some(s), None) if op.segments.len() == 1 => with_target!(target, |fd| {
            out.write(
                opcode::Read::new(fd, s.iov_base.cast(), s.iov_len as u32)
                    .offset(off)
                    .ioprio(prio)
                    .build(),
            )
        }),
        (OpKind::Read, _, _) => out.write(vectored_sqe(target, op, ring, rw_flags)),
        (OpKind::Write, Some(s), Some(index)) if op.segments.len() == 1 => {
            ring.count_fixed_buf_sqe();
            with_target!(target, |fd| {
                out.write(
                    opcode::WriteFixed::new(fd, s.iov_base.cast(), s.iov_len as u32, index)
                        .offset(off)
                        .ioprio(prio)
                        .rw_flags(rw_flags)
                        .build(),
                )
            })
        }
        (OpKind::Write, Some(s), None) if op.segments.len() == 1 => {
            with_target!(target, |fd| {
                out.write(
                    opcode::Write::new(fd, s.iov_base.cast(), s.iov_len as u32)
                        .offset(off)
                        .ioprio(prio)
                        .rw_flags(rw_flags)
                        .build(),
                )
            })
        }
        (OpKind::Write, _, _) => out.write(vectored_sqe(target, op, ring, rw_flags)),
        (OpKind::Flush, _, _) => out.write(fsync_sqe(target, true)),
        (OpKind::Fsync, _, _) => out.write(fsync_sqe(target, false)),
        (OpKind::Nop, _, _) => out.write(opcode::Nop::new().build()),
        (OpKind::WriteZeroes, _, _) => {
            let mode = if is_block_device {
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
            } else {
                libc::FALLOC_FL_ZERO_RANGE
            };
            out.write(fallocate_sqe(target, op, mode))
        }
        // BLKDISCARD has no io_uring opcode before BLOCK_URING_CMD_DISCARD
        // (6.12); block-device discards go to the pool.
        (OpKind::Discard, _, _) if is_block_device => return false,
        (OpKind::Discard, _, _) => out.write(fallocate_sqe(
            target,
            op,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        )),
        (OpKind::Fallocate { mode }, _, _) => out.write(fallocate_sqe(target, op, mode)),
    };
    true
}

/// The SQE of a read or write of several segments (or none): on registered
/// buffer `op.fixed_buf` where `ring` has `READV_FIXED`/`WRITEV_FIXED`,
/// else a plain `READV`/`WRITEV`. Out of line: one segment is the hot case.
#[inline(never)]
fn vectored_sqe(target: Target, op: &IoOp<'_>, ring: &Ring, rw_flags: i32) -> squeue::Entry {
    let (off, prio) = (op.offset_bytes, op.flags.ioprio());
    let (iov, nr) = (op.segments.as_ptr(), op.segments.len() as u32);
    let fixed = op.fixed_buf.filter(|_| ring.vectored_fixed());
    if fixed.is_some() {
        ring.count_fixed_buf_sqe();
    }
    match (op.kind, fixed) {
        (OpKind::Write, Some(index)) => with_target!(target, |fd| {
            opcode::WritevFixed::new(fd, iov, nr, index)
                .offset(off)
                .ioprio(prio)
                .rw_flags(rw_flags)
                .build()
        }),
        (OpKind::Write, None) => with_target!(target, |fd| {
            opcode::Writev::new(fd, iov, nr)
                .offset(off)
                .ioprio(prio)
                .rw_flags(rw_flags)
                .build()
        }),
        (_, Some(index)) => with_target!(target, |fd| {
            opcode::ReadvFixed::new(fd, iov, nr, index)
                .offset(off)
                .ioprio(prio)
                .build()
        }),
        (_, None) => with_target!(target, |fd| {
            opcode::Readv::new(fd, iov, nr)
                .offset(off)
                .ioprio(prio)
                .build()
        }),
    }
}

/// A linked `fsync`/`fdatasync` SQE on `target`.
pub(crate) fn fsync_sqe(target: Target, datasync: bool) -> squeue::Entry {
    let flags = if datasync {
        types::FsyncFlags::DATASYNC
    } else {
        types::FsyncFlags::empty()
    };
    with_target!(target, |fd| opcode::Fsync::new(fd).flags(flags).build())
}

fn fallocate_sqe(target: Target, op: &IoOp<'_>, mode: i32) -> squeue::Entry {
    with_target!(target, |fd| {
        opcode::Fallocate::new(fd, op.len_bytes)
            .offset(op.offset_bytes)
            .mode(mode)
            .build()
    })
}

/// Writes the SQEs of one dispatch batch for one file on the calling
/// thread's ring: the ring and the file's registration were found once,
/// by [`Backend::with_sq_writer`](crate::Backend::with_sq_writer), so each
/// op costs only the SQE's build and push, through a direct (inlinable)
/// call instead of a call through the `dyn Backend`. It lives for that
/// one call; the file's registration cannot change under it (only the
/// ring's park sweeps registrations, and only those of dropped backends).
///
/// Idea: the kernel's `blk_mq_dispatch_rq_list`, which finds the hardware
/// context once per batch and calls the driver's `queue_rq` per request;
/// a raw io_uring loop that holds its SQ across a batch.
pub struct SqWriter<'a> {
    ring: &'a Ring,
    target: Target,
    handler: HandlerId,
    is_block_device: bool,
    /// The user_data of a direct op of `handler` with token 0
    /// ([`ring::direct_user_data`]), found once for the writer: an op's is
    /// this ORed with its token. [`NO_DIRECT`] where `handler` does not fit
    /// a direct op's user_data: the writer then writes nothing.
    direct_base: u64,
}

/// [`SqWriter::direct_base`] of a handler that does not fit a direct op's
/// user_data: all ones, which no direct op's user_data is (its bits 62 and
/// 63 are clear).
const NO_DIRECT: u64 = u64::MAX;

impl std::fmt::Debug for SqWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqWriter")
            .field("handler", &self.handler)
            .field("is_block_device", &self.is_block_device)
            .finish_non_exhaustive()
    }
}

impl<'a> SqWriter<'a> {
    /// A writer for the file named by `target` on `ring`, completing to
    /// `handler`.
    pub(crate) fn new(
        ring: &'a Ring,
        target: Target,
        handler: HandlerId,
        is_block_device: bool,
    ) -> Self {
        let direct_base = if ring::fits_direct(handler, 0) {
            ring::direct_user_data(handler, 0)
        } else {
            NO_DIRECT
        };
        SqWriter {
            ring,
            target,
            handler,
            is_block_device,
            direct_base,
        }
    }

    /// Whether an op of several segments that all lie in one registered
    /// buffer (`IoOp::fixed_buf`) goes as `READV_FIXED`/`WRITEV_FIXED`:
    /// the ring's kernel has both opcodes (Linux 6.15). Without them such
    /// an op is a plain `READV`/`WRITEV` and its pages are pinned per op.
    ///
    /// ```no_run
    /// # fn f(w: &plugio::device::SqWriter<'_>) {
    /// let named_buffer_is_used = w.vectored_fixed();
    /// # }
    /// ```
    #[inline]
    pub fn vectored_fixed(&self) -> bool {
        self.ring.vectored_fixed()
    }

    /// The SQE of `op` for this writer's file and ring (see [`build`]).
    #[inline]
    pub(crate) fn build(&self, op: &IoOp<'_>) -> Option<squeue::Entry> {
        build(self.target, op, self.is_block_device, self.ring)
    }

    /// Writes `op`'s SQE as [`Backend::submit_direct`] would, with the
    /// writer's handler and `token` in its user_data (no ring slot), into
    /// the ring's SQ (or its backlog when the SQ is full; then the SQ is
    /// submitted at once). Returns `false`, having written nothing, for an
    /// op that must take the backend's way instead: a linked PREFLUSH, a
    /// token over 48 bits, a block-device discard. Then call
    /// [`Backend::submit_direct`] with it.
    ///
    /// `op` must have passed the backend's check (as for
    /// [`Backend::submit`]: the SQE is not checked again).
    ///
    /// # Safety
    /// As [`Backend::submit`]; and this thread's driver must still be
    /// installed (the writer keeps its ring alive for the call, but an op
    /// written after the callback dropped the driver is never reaped, so
    /// its completion never comes).
    ///
    /// [`Backend::submit`]: crate::Backend::submit
    /// [`Backend::submit_direct`]: crate::Backend::submit_direct
    #[inline]
    #[must_use = "an op it did not write must be submitted through the backend"]
    pub unsafe fn try_submit_direct(&self, op: &IoOp<'_>, token: u64) -> bool {
        // SAFETY: as this function's own contract.
        unsafe { self.submit_direct_inline(op, token) }
    }

    /// [`SqWriter::try_submit_direct`] of the op of `kind` with `flags` on
    /// `[offset_bytes, offset_bytes + len_bytes)` whose memory, for a read
    /// or write, is the one segment `seg` (in registered buffer
    /// `fixed_buf`, if any): the op given by its fields, which stay in
    /// registers, where an [`IoOp`] built for the call was written to
    /// memory and read back (the engine's fast lane, one call per IO).
    /// Always inlined, with the SQ push (`Ring::push_sqe`): a call took
    /// its prologue, the arguments' stack slots and the caller's spills,
    /// about 27 instructions per NOP.
    ///
    /// ```
    /// use std::cell::Cell;
    /// use std::io::Write;
    /// use std::rc::Rc;
    /// use std::time::Duration;
    /// use plugio_device::{register_handler, Backend, CompletionHandler, DeviceDriver};
    /// use plugio_device::{DmaBuf, IoFlags, OpKind, OpenOptions, RingConfig};
    /// use plugio_executor::Driver;
    ///
    /// #[derive(Default)]
    /// struct Last(Cell<Option<(u64, i32)>>);
    /// impl CompletionHandler for Last {
    ///     fn complete(&self, token: u64, result: i32) {
    ///         self.0.set(Some((token, result)));
    ///     }
    /// }
    ///
    /// let mut tmp = tempfile::NamedTempFile::new()?;
    /// tmp.write_all(&[7u8; 4096])?;
    /// let backend = OpenOptions::new().direct(false).open(tmp.path())?;
    /// let driver = DeviceDriver::new(&RingConfig::default())?;
    /// let last = Rc::new(Last::default());
    /// let handler = register_handler(last.clone());
    /// let mut buf = DmaBuf::heap(4096, 4096);
    /// let seg = buf.iovec(4096);
    /// let mut sent = false;
    /// backend.with_sq_writer(handler, &mut |writer| {
    ///     // SAFETY: `buf` outlives the wait below; the driver stays installed.
    ///     sent = writer.is_some_and(|w| unsafe {
    ///         w.try_submit_one(OpKind::Read, IoFlags::NONE, 0, 4096, seg, None, 1)
    ///     });
    /// });
    /// if sent {
    ///     // Written on this thread's ring (where io_uring is allowed).
    ///     while last.0.get().is_none() {
    ///         driver.park(Some(Duration::from_millis(10)))?;
    ///     }
    ///     assert_eq!(last.0.get(), Some((1, 4096)));
    ///     assert_eq!(buf.as_slice(), &[7u8; 4096][..]);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Safety
    /// As [`SqWriter::try_submit_direct`].
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    #[must_use = "an op it did not write must be submitted through the backend"]
    pub unsafe fn try_submit_one(
        &self,
        kind: OpKind,
        flags: IoFlags,
        offset_bytes: u64,
        len_bytes: u64,
        seg: libc::iovec,
        fixed_buf: Option<u16>,
        token: u64,
    ) -> bool {
        let segs = [seg];
        let op = IoOp {
            kind,
            offset_bytes,
            len_bytes,
            segments: if kind.has_data() { &segs } else { &[] },
            fixed_buf,
            flags,
        };
        // SAFETY: as this function's own contract.
        unsafe { self.submit_direct_inline(&op, token) }
    }

    /// The body of [`SqWriter::try_submit_direct`], inlined into its two
    /// ways in.
    ///
    /// # Safety
    /// As [`SqWriter::try_submit_direct`].
    #[inline(always)]
    unsafe fn submit_direct_inline(&self, op: &IoOp<'_>, token: u64) -> bool {
        // SAFETY: as this function's own contract.
        unsafe { self.write_direct(op, token, |entry| self.ring.push_direct(entry)) }
    }

    /// Runs `f` with an [`SqSession`] of this writer: every SQE that `f`
    /// writes through it goes into the ring's SQ with the SQ found once
    /// (the kernel's head read once, the tail kept local and published,
    /// with Release, once `f` returns, before this does). While `f` runs
    /// the ring takes no other push and no enter (one would panic on the
    /// ring's borrow, it never runs on a stale tail): submit through the
    /// writer itself or the backend only after the session. An SQE that
    /// finds the SQ full waits in the ring's backlog and is submitted
    /// when the session ends.
    #[inline(always)]
    pub fn session<R>(&self, f: impl FnOnce(&mut SqSession<'_, '_>) -> R) -> R {
        self.ring.sq_burst(|burst| {
            f(&mut SqSession {
                writer: self,
                burst,
            })
        })
    }

    /// [`SqWriter::submit_direct_inline`]'s checks and build, the SQE then
    /// handed to `push` (the ring's, or a session's).
    ///
    /// # Safety
    /// As [`SqWriter::try_submit_direct`].
    #[inline(always)]
    unsafe fn write_direct(
        &self,
        op: &IoOp<'_>,
        token: u64,
        push: impl FnOnce(&squeue::Entry),
    ) -> bool {
        // The handler's half of `ring::fits_direct` was checked once, in
        // `new` (`direct_base` NO_DIRECT: it does not fit); the token's is
        // here.
        if op.flags.contains(IoFlags::PREFLUSH)
            || self.direct_base == NO_DIRECT
            || token >> ring::DIRECT_TOKEN_BITS != 0
        {
            return false;
        }
        debug_assert!(ring::fits_direct(self.handler, token));
        // A token of DIRECT_TOKEN_BITS bits ORed into the handler's base:
        // `ring::direct_user_data(self.handler, token)`, without its
        // checks and shifts.
        let ud = self.direct_base | token;
        debug_assert_eq!(ud, ring::direct_user_data(self.handler, token));
        let mut entry = MaybeUninit::uninit();
        if !build_into(self.target, op, self.is_block_device, self.ring, &mut entry) {
            return false;
        }
        // SAFETY: `build_into` wrote the entry (it returned true).
        let entry = unsafe { entry.assume_init_mut() };
        ring::set_user_data(entry, ud);
        push(entry);
        true
    }
}

/// An [`SqWriter`] with its ring's SQ held for a burst of SQEs
/// ([`SqWriter::session`]): each op costs its SQE's build and one copy
/// into the SQ, without the SQ's borrow, head load and tail store per op.
pub struct SqSession<'a, 'b> {
    writer: &'a SqWriter<'a>,
    burst: &'a mut ring::SqBurst<'b>,
}

impl std::fmt::Debug for SqSession<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqSession")
            .field("writer", self.writer)
            .finish_non_exhaustive()
    }
}

impl SqSession<'_, '_> {
    /// [`SqWriter::try_submit_one`] within the session: the same checks
    /// and the same SQE, pushed into the session's SQ.
    ///
    /// # Safety
    /// As [`SqWriter::try_submit_direct`].
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    #[must_use = "an op it did not write must be submitted through the backend"]
    pub unsafe fn try_submit_one(
        &mut self,
        kind: OpKind,
        flags: IoFlags,
        offset_bytes: u64,
        len_bytes: u64,
        seg: libc::iovec,
        fixed_buf: Option<u16>,
        token: u64,
    ) -> bool {
        let segs = [seg];
        let op = IoOp {
            kind,
            offset_bytes,
            len_bytes,
            segments: if kind.has_data() { &segs } else { &[] },
            fixed_buf,
            flags,
        };
        let (writer, burst) = (self.writer, &mut *self.burst);
        // SAFETY: as this function's own contract.
        unsafe {
            writer.write_direct(&op, token, |entry| {
                writer.ring.push_direct_burst(burst, entry);
            })
        }
    }
}
