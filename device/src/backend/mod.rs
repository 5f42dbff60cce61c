//! Backends: one trait, several implementations (`file` over io_uring,
//! `sync` over a thread pool, `mem` simulated).
//!
//! Invariants:
//! - [`Backend::submit`] only queues: an SQE pushed to the current core's
//!   ring, a job to the pool, an event in the core's deadline heap. Nothing
//!   blocks and no completion is delivered from inside `submit`.
//! - A submit that returns `Ok` produces exactly one completion, delivered on
//!   the submitting thread to the given handler with the given token. A
//!   submit that returns `Err` produces none and queues nothing.
//! - [`Backend::check`] refuses bad input (alignment, range, zero or
//!   mismatched length) before anything is queued. Callers check once,
//!   before submitting (the engine's `Device` does, and builds valid
//!   requests from checked bios); the file backend's `submit` only
//!   `debug_assert!`s it, the other backends still run it.
//! - Alignment checks use masks: every alignment a [`Geometry`] builds is
//!   a power of two (asserted where it is built); a hand-made geometry with
//!   another alignment still gets a correct (dividing) check.

use std::fmt;

use crate::core::HandlerId;
use crate::error::{Error, InvalidInput, Result};
use crate::geometry::Geometry;
use crate::op::{IoFlags, IoOp};

pub mod file;
/// The simulated device (test double with faults and power cuts): behind
/// the `test-util` feature.
#[cfg(any(test, feature = "test-util"))]
pub mod mem;
pub mod nvme;
mod sqe;
pub mod sync;

pub use sqe::{SqSession, SqWriter};
/// Which implementation serves a [`Backend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendKind {
    /// Files and block devices through the core's io_uring (with a per-op
    /// fallback to the sync pool on threads without a ring).
    Uring,
    /// `pread`/`pwrite` on a thread pool.
    Sync,
    /// The simulated in-memory device.
    Mem,
    /// NVMe passthrough (`IORING_OP_URING_CMD` on `/dev/ngXnY`).
    NvmePassthrough,
}

/// The most segments one op may carry (`IOV_MAX`).
pub const MAX_OP_SEGMENTS: usize = 1024;

/// A storage target that accepts [`IoOp`]s and completes them on the
/// submitting core. Shared between cores (`Send + Sync`); every submit is
/// tied to the calling thread.
pub trait Backend: Send + Sync + fmt::Debug {
    /// The device's geometry (block sizes, limits, alignment, capacity).
    fn geometry(&self) -> &Geometry;

    /// Which implementation this is.
    fn kind(&self) -> BackendKind;

    /// The file's descriptor, for file-level operations on it (size,
    /// metadata): `Some` for files and block devices, `None` (the default)
    /// for backends without one (the simulated device).
    fn file_fd(&self) -> Option<std::sync::Arc<std::os::fd::OwnedFd>> {
        None
    }

    /// Validates `op` against the geometry without queuing anything.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) with the
    /// offending values and the required alignment.
    fn check(&self, op: &IoOp<'_>) -> Result<()> {
        check_op(self.geometry(), op)
    }

    /// Whether the device has a zeroing op for
    /// [`OpKind::WriteZeroes`](crate::OpKind::WriteZeroes), as far as it is
    /// known before any IO: `Some(false)` where the op would complete with
    /// `Unsupported` (a file on tmpfs), `Some(true)` where it has one (a
    /// block device, whose kernel zeroout writes zeroes itself where the
    /// hardware cannot), `None` (the default) when unknown. A caller that
    /// falls back to writing zeroes decides by it before it issues
    /// anything, so the writes take the op's place in program order (the
    /// kernel's `blkdev_issue_zeroout` decides by the queue's
    /// `max_write_zeroes_sectors` the same way).
    fn write_zeroes_support(&self) -> Option<bool> {
        None
    }

    /// Whether [`Backend::check`] is exactly [`check_op`] on
    /// [`Backend::geometry`], which never changes: a caller holding a copy
    /// of the geometry may then run `check_op` itself, inline, instead of a
    /// call through the trait object per IO. False by default, so a
    /// backend with checks of its own is always asked; the file backend
    /// and the mem device say true.
    fn checks_geometry_only(&self) -> bool {
        false
    }

    /// Queues `op`; its completion `(token, result)` is later delivered to
    /// `handler` on this thread, inside the driver's `park` (or
    /// `run_completions`).
    ///
    /// `op` should have passed [`Backend::check`]: the file backend does
    /// not check it again (debug builds assert it), so a bad op there gets
    /// the kernel's error (`-EINVAL`, a short count) as its completion
    /// instead of an `Err` here.
    ///
    /// # Safety
    /// The memory described by `op.segments`, and the `segments` array
    /// itself, must stay valid, and the data memory must not be read (for
    /// `Read`) or written (for `Write`) by anyone else, until the
    /// completion is delivered, even if the caller's future is dropped. The
    /// backend itself may be dropped earlier (in-flight ops keep the file
    /// open).
    ///
    /// # Errors
    /// Invalid input (see [`Backend::check`]; not from every backend),
    /// [`ErrorKind::NoDriver`](crate::ErrorKind::NoDriver)
    /// when this thread has no driver and the backend needs one, or an
    /// unrecoverable ring error. Nothing is queued on error.
    unsafe fn submit(&self, op: &IoOp<'_>, handler: HandlerId, token: u64) -> Result<()>;

    /// [`Backend::submit`] for a caller that keeps the op and issues it
    /// again itself (the engine keeps every request in its slab until the
    /// completion): an io_uring backend then queues the SQE with the
    /// handler and token in its user_data and keeps no copy of it (no ring
    /// slot, no lookup when the CQE comes back), and a per-op `-EAGAIN` is
    /// delivered as the completion result instead of being resubmitted by
    /// the ring. Ops that need a slot (a linked PREFLUSH) or whose token
    /// does not fit in 48 bits go the [`Backend::submit`] way. The default
    /// is `submit`.
    ///
    /// Idea: monoio's and tokio-uring's `user_data` = the op's slab index,
    /// and the kernel's `blk_mq_tag_to_rq` (the tag names the request).
    ///
    /// # Safety
    /// As [`Backend::submit`].
    ///
    /// # Errors
    /// As [`Backend::submit`].
    unsafe fn submit_direct(&self, op: &IoOp<'_>, handler: HandlerId, token: u64) -> Result<()> {
        // SAFETY: the caller keeps `submit`'s contract.
        unsafe { self.submit(op, handler, token) }
    }

    /// Runs `f` exactly once, with an [`SqWriter`] for this backend's
    /// file on the calling thread's ring, so that a caller submitting a
    /// batch finds the ring and the file once instead of per op and writes
    /// each SQE with a direct (inlinable) call instead of a call through
    /// the trait object; or with `None` where this backend's ops are not
    /// plain SQEs on this thread's ring (no ring here, a forked child's
    /// stale ring, the sync pool, the mem device, NVMe passthrough: the
    /// default). With `None`, and for each op the writer declines
    /// ([`SqWriter::try_submit_direct`] returns `false`), submit with
    /// [`Backend::submit_direct`]: the result is the same either way.
    ///
    /// Idea: the kernel's `blk_mq_dispatch_rq_list` calling the driver's
    /// `queue_rq` once per request but finding the hardware context once
    /// per batch; a raw io_uring loop holding its SQ across a batch.
    ///
    /// ```
    /// use std::cell::Cell;
    /// use std::io::Write;
    /// use std::rc::Rc;
    /// use std::time::Duration;
    /// use plugio::device::{register_handler, Backend, CompletionHandler, DeviceDriver};
    /// use plugio::device::{DmaBuf, IoOp, OpenOptions, RingConfig};
    /// use plugio::executor::Driver;
    ///
    /// /// Keeps the last `(token, result)`.
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
    /// // This thread's driver (its ring, where io_uring is allowed).
    /// let driver = DeviceDriver::new(&RingConfig::default())?;
    /// let last = Rc::new(Last::default());
    /// let handler = register_handler(last.clone());
    /// let mut buf = DmaBuf::heap(4096, 4096);
    /// let iov = [buf.iovec(4096)];
    /// let op = IoOp::read(0, &iov);
    /// backend.with_sq_writer(handler, &mut |writer| {
    ///     // SAFETY (both calls): `buf` outlives the wait for the
    ///     // completion below, and the driver stays installed.
    ///     let written = writer.is_some_and(|w| unsafe { w.try_submit_direct(&op, 1) });
    ///     if !written {
    ///         unsafe { backend.submit_direct(&op, handler, 1) }.expect("queued");
    ///     }
    /// });
    /// while last.0.get().is_none() {
    ///     driver.park(Some(Duration::from_millis(10)))?;
    /// }
    /// assert_eq!(last.0.get(), Some((1, 4096)));
    /// assert_eq!(buf.as_slice(), &[7u8; 4096][..]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn with_sq_writer(&self, handler: HandlerId, f: &mut dyn FnMut(Option<&SqWriter<'_>>)) {
        let _ = handler;
        f(None);
    }
}

/// The checks every backend applies before queuing an op (see
/// [`Backend::check`]).
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput).
#[inline]
pub fn check_op(geometry: &Geometry, op: &IoOp<'_>) -> Result<()> {
    if one_segment_op_is_valid(geometry, op) {
        return Ok(());
    }
    check_op_each(geometry, op)
}

/// [`check_op`]'s fast path alone: true for an op it accepts without a
/// closer look (one buffer for a read or write in range, aligned), false
/// for every other (which `check_op` may still accept). For a caller that
/// builds `op` only to ask this and keeps the full check out of line, so
/// that the op is never written to memory on the hot path (the full
/// check's cold call takes it by reference).
///
/// ```
/// use plugio_device::{check_op, check_op_fast, Backend, DmaBuf, IoOp, OpenOptions};
/// let tmp = tempfile::NamedTempFile::new()?;
/// tmp.as_file().set_len(8192)?;
/// let backend = OpenOptions::new().direct(false).open(tmp.path())?;
/// let geometry = backend.geometry();
/// let mut buf = DmaBuf::heap(4096, 4096);
/// let iov = [buf.iovec(4096)];
/// assert!(check_op_fast(geometry, &IoOp::read(0, &iov)));
/// // A zero length is not for the fast path; the full check says why.
/// let empty = [buf.iovec(0)];
/// assert!(!check_op_fast(geometry, &IoOp::read(0, &empty)));
/// assert!(check_op(geometry, &IoOp::read(0, &empty)).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[inline]
pub fn check_op_fast(geometry: &Geometry, op: &IoOp<'_>) -> bool {
    one_segment_op_is_valid(geometry, op)
}

/// The common op, one buffer for a read or write in range, checked with
/// masks in one pass; `false` sends it (and everything else) through
/// [`check_op_each`], which says what is wrong. A fast path only: it
/// accepts nothing `check_op_each` refuses.
#[inline]
fn one_segment_op_is_valid(geometry: &Geometry, op: &IoOp<'_>) -> bool {
    let [seg] = op.segments else {
        return false;
    };
    let mem_align = u64::from(geometry.mem_align_bytes());
    let len_align = u64::from(geometry.offset_align_bytes());
    let simple = op.kind.has_data()
        && op.kind.has_range()
        && mem_align.is_power_of_two()
        && len_align.is_power_of_two();
    if !simple {
        return false;
    }
    let in_range = match geometry.capacity_bytes {
        Some(cap) => op.offset_bytes <= cap && op.len_bytes <= cap - op.offset_bytes,
        None => true,
    };
    op.len_bytes != 0
        && write_only_flags_fit(op)
        && seg.iov_len as u64 == op.len_bytes
        && (seg.iov_base as u64) & (mem_align - 1) == 0
        && (op.offset_bytes | op.len_bytes) & (len_align - 1) == 0
        && in_range
}

/// [`check_op`], rule by rule, with the error of the first rule broken.
#[cold]
fn check_op_each(geometry: &Geometry, op: &IoOp<'_>) -> Result<()> {
    if !write_only_flags_fit(op) {
        return Err(Error::invalid(InvalidInput::WriteOnlyFlags {
            op: op.kind,
            flags: op.flags,
        }));
    }
    if op.kind.has_data() {
        check_segments(geometry, op)?;
    } else if !op.segments.is_empty() {
        return Err(Error::invalid(InvalidInput::Segments {
            detail: format!("{:?} carries no data but has segments", op.kind),
        }));
    }
    if op.kind.has_range() {
        check_range(geometry, op)?;
    }
    Ok(())
}

fn check_range(geometry: &Geometry, op: &IoOp<'_>) -> Result<()> {
    if op.len_bytes == 0 {
        return Err(Error::invalid(InvalidInput::ZeroLength));
    }
    let align = u64::from(geometry.offset_align_bytes());
    if misaligned(op.offset_bytes, align) {
        return Err(Error::invalid(InvalidInput::Alignment {
            what: "offset",
            value: op.offset_bytes,
            required_bytes: align,
        }));
    }
    if misaligned(op.len_bytes, align) {
        return Err(Error::invalid(InvalidInput::Alignment {
            what: "length",
            value: op.len_bytes,
            required_bytes: align,
        }));
    }
    if let Some(capacity_bytes) = geometry.capacity_bytes {
        let end = op.offset_bytes.checked_add(op.len_bytes);
        // Reads that start inside a block device may not run past its end;
        // reads past the end of a file return a short count instead.
        if !matches!(end, Some(end) if end <= capacity_bytes) {
            return Err(Error::invalid(InvalidInput::Range {
                offset_bytes: op.offset_bytes,
                len_bytes: op.len_bytes,
                capacity_bytes,
            }));
        }
    }
    Ok(())
}

/// False when `op` carries FUA or PREFLUSH and is not a write: the kernel
/// refuses those flags on any other op (`submit_bio_noacct` fails a bio
/// whose `op_is_flush` flags sit on anything but `REQ_OP_WRITE`).
#[inline]
fn write_only_flags_fit(op: &IoOp<'_>) -> bool {
    const WRITE_ONLY: u32 = IoFlags::FUA.bits() | IoFlags::PREFLUSH.bits();
    op.flags.bits() & WRITE_ONLY == 0 || op.kind == crate::OpKind::Write
}

/// True when `value` is not a multiple of `align` (> 0): a mask for the
/// powers of two every built geometry has, a division otherwise.
#[inline]
fn misaligned(value: u64, align: u64) -> bool {
    if align.is_power_of_two() {
        value & (align - 1) != 0
    } else {
        value % align != 0
    }
}

fn check_segments(geometry: &Geometry, op: &IoOp<'_>) -> Result<()> {
    if op.segments.is_empty() || op.segments.len() > MAX_OP_SEGMENTS {
        return Err(Error::invalid(InvalidInput::Segments {
            detail: format!(
                "{} segments; a data op needs 1 to {MAX_OP_SEGMENTS}",
                op.segments.len()
            ),
        }));
    }
    let sum: u64 = op.segments.iter().map(|s| s.iov_len as u64).sum();
    if sum != op.len_bytes {
        return Err(Error::invalid(InvalidInput::Segments {
            detail: format!(
                "segments hold {sum} bytes but the op says {} bytes",
                op.len_bytes
            ),
        }));
    }
    let mem_align = u64::from(geometry.mem_align_bytes());
    let len_align = u64::from(geometry.offset_align_bytes());
    for seg in op.segments {
        let addr = seg.iov_base as u64;
        if misaligned(addr, mem_align) {
            return Err(Error::invalid(InvalidInput::Alignment {
                what: "buffer address",
                value: addr,
                required_bytes: mem_align,
            }));
        }
        if misaligned(seg.iov_len as u64, len_align) {
            return Err(Error::invalid(InvalidInput::Alignment {
                what: segment_length_name(op),
                value: seg.iov_len as u64,
                required_bytes: len_align,
            }));
        }
    }
    Ok(())
}

/// How an unaligned segment length is named: where the op has one
/// segment, it is the whole IO, whose length the caller may not have seen
/// as such (one buffer, or the bounce copy of several), so the name says
/// where it comes from.
fn segment_length_name(op: &IoOp<'_>) -> &'static str {
    match (op.segments.len(), op.kind) {
        (1, crate::OpKind::Read) => {
            "the read's length (what its buffers take: bytes_total, a Vec's capacity)"
        }
        (1, _) => "the write's length (what its buffers hold: bytes_init, a Vec's len)",
        _ => "segment length",
    }
}

#[cfg(test)]
mod check_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The one-pass check of a one-buffer op accepts exactly what the
        /// rule-by-rule check accepts (it only decides faster), for
        /// aligned and misaligned addresses, offsets and lengths, zero and
        /// overflowing ranges, with and without a capacity.
        #[test]
        fn the_fast_check_agrees_with_the_rules(
            direct in any::<bool>(),
            align_shift in 0u32..13,
            addr in prop_oneof![Just(0u64), Just(4096), 0u64..1 << 20, Just(u64::MAX - 4095)],
            offset in prop_oneof![Just(0u64), 0u64..1 << 24, Just(u64::MAX - 511), any::<u64>()],
            len in prop_oneof![Just(0u64), Just(4096u64), 0u64..1 << 17, any::<u64>()],
            seg_len_delta in prop_oneof![Just(0i64), -1i64..=1],
            capacity in proptest::option::of(prop_oneof![Just(1u64 << 24), any::<u64>()]),
            write in any::<bool>(),
        ) {
            let align = 1u32 << align_shift;
            let mut geometry = Geometry::file_defaults(align, align, align, direct);
            geometry.capacity_bytes = capacity;
            let seg_len = (len as i64).wrapping_add(seg_len_delta) as u64;
            let segments = [libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: seg_len as usize,
            }];
            let op = IoOp {
                kind: if write { crate::OpKind::Write } else { crate::OpKind::Read },
                offset_bytes: offset,
                len_bytes: len,
                segments: &segments,
                fixed_buf: None,
                flags: crate::IoFlags::NONE,
            };
            prop_assert_eq!(check_op(&geometry, &op).is_ok(), check_op_each(&geometry, &op).is_ok());
            if one_segment_op_is_valid(&geometry, &op) {
                prop_assert!(check_op_each(&geometry, &op).is_ok());
            }
        }
    }
}
