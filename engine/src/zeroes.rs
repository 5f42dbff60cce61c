//! `write_zeroes`, with the block layer's fallback: when the device or file
//! system refuses the zeroing op (`FALLOC_FL_ZERO_RANGE` on tmpfs,
//! `BLKZEROOUT` on a device without Write Zeroes: `Unsupported`), the range
//! is zeroed by writing zero-filled buffers, as the kernel's
//! `blkdev_issue_zeroout` does when `REQ_OP_WRITE_ZEROES` is not supported.
//! [`Device::write_zeroes_no_fallback`] asks for the op alone (the kernel's
//! `BLKDEV_ZERO_NOFALLBACK`).
//!
//! # Mechanism
//!
//! Which way a range is zeroed is decided before anything is issued, from
//! what the backend knows of its zeroing op
//! ([`Backend::write_zeroes_support`](plugio_device::Backend::write_zeroes_support):
//! a file system probed at open, a block device, an NVMe namespace's ONCS),
//! as the kernel decides by the queue's `max_write_zeroes_sectors`:
//!
//! - a device without one gets the writes at once: every zero-filled write
//!   is issued in the call's first poll, from one shared zeroed buffer, so
//!   the writes take the op's place in program order: IO issued after the
//!   call, overlapping the range, runs after them (with
//!   [`DeviceOptions::overlap_order`](crate::DeviceOptions::overlap_order)),
//!   never under them;
//! - otherwise the zeroing op goes through the whole path as any IO. Where
//!   support was unknown and the op completes with `Unsupported`, the
//!   writes follow then; IO issued after the call may have run before
//!   them (documented on [`Device::write_zeroes`]).
//!
//! The whole range is checked (alignment, capacity, read-only) before
//! anything is issued, either way.
//!
//! # Invariants
//!
//! - Nothing is issued for a refused range.
//! - The fallback's writes cover the range exactly, each at most
//!   [`ZEROES_CHUNK_BYTES`], all issued in one poll; the call returns
//!   after every one has completed.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use plugio_device::{Error, ErrorKind, InvalidInput, OpKind};

use crate::device::Device;
use plugio_device::DmaBuf;

/// The size of each zero-filled write of the fallback: large enough that a
/// big range takes few writes (the engine splits it at the device's
/// request limit), small enough to allocate freely.
pub const ZEROES_CHUNK_BYTES: u64 = 1 << 20;

/// The longest range [`Device::write_zeroes`] zeroes by writing (where the
/// device has no zeroing op): 64 GiB. Its writes are all issued at once,
/// to keep program order, and each costs the engine about 700 bytes until
/// it completes, so 64 GiB takes about 45 MB; the longest range otherwise
/// allowed, 64 TiB, would have taken about 48 GB (found by a break-it
/// helper). Longer ranges are refused before anything is written.
pub const MAX_ZEROES_BY_WRITING_BYTES: u64 = 64 << 30;

impl Device {
    /// Zeroes `[offset_bytes, offset_bytes + len_bytes)`. Tries the
    /// device's zeroing op (`BLKZEROOUT` on block devices,
    /// `FALLOC_FL_ZERO_RANGE` on files, NVMe Write Zeroes); where it is not
    /// supported (tmpfs, for one), writes zeroes instead, in writes of
    /// [`ZEROES_CHUNK_BYTES`]. A range longer than
    /// [`MAX_IO_BYTES`](crate::MAX_IO_BYTES) is zeroed in parts of
    /// [`RANGE_PART_BYTES`](crate::RANGE_PART_BYTES) issued together, as
    /// `blkdev_issue_zeroout` splits one. Use
    /// [`write_zeroes_no_fallback`](Self::write_zeroes_no_fallback) when
    /// writing the zeroes out is not acceptable (a large range, or a
    /// device where an unmapped range is the point).
    ///
    /// Program order: where the device is known to have no zeroing op
    /// ([`Backend::write_zeroes_support`](plugio_device::Backend::write_zeroes_support)
    /// is `Some(false)`: a file on tmpfs, probed when it is opened), the
    /// zero-filled writes are issued at once, in the call's place: IO
    /// issued after it and overlapping the range sees the zeroes and is
    /// never undone by them. Where that was unknown (the probe could not
    /// run: a directory without `O_TMPFILE` or not writable, a file
    /// mounted apart from its directory) and the op is refused, the writes
    /// are issued only then, after IO issued in the meantime: await that
    /// first call before issuing IO that overlaps its range. The device
    /// remembers the refusal, and later calls write in program order.
    ///
    /// A range that ends past the end of a regular file makes it that
    /// long (`FALLOC_FL_ZERO_RANGE` without `KEEP_SIZE`, and the fallback's
    /// writes alike), up to the file system's limit.
    ///
    /// # Errors
    /// Invalid input (unaligned, beyond the device) before anything is
    /// issued; a range over [`MAX_ZEROES_BY_WRITING_BYTES`] that would be
    /// zeroed by writing (`InvalidInput::Length`, before any write); the
    /// device's error otherwise. When a fallback write fails, the range
    /// before it is zeroed and the rest is unspecified.
    pub async fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), Error> {
        let shared = self.shared();
        // Relaxed: see `DeviceShared::zeroes_refused`.
        if shared.backend.write_zeroes_support() == Some(false)
            || shared.zeroes_refused.load(Ordering::Relaxed)
        {
            self.check_range_op(OpKind::WriteZeroes, offset_bytes, len_bytes)
                .map_err(|e| self.name_err(e))?;
            return self.write_zeroes_by_writing(offset_bytes, len_bytes).await;
        }
        match self.write_zeroes_no_fallback(offset_bytes, len_bytes).await {
            Err(e) if *e.kind() == ErrorKind::Unsupported => {
                // The next calls keep program order (see the docs above).
                // Not for a refusal of this core's busy-polling ring: the
                // device can zero from other cores (one call on such a
                // core made every later one write zeroes; found by a
                // break-it helper).
                if e.context() != Some(crate::device::IOPOLL_REFUSES) {
                    shared.zeroes_refused.store(true, Ordering::Relaxed);
                }
                tracing::debug!(
                    offset_bytes,
                    len_bytes,
                    "write zeroes unsupported here; writing zeroes instead"
                );
                self.write_zeroes_by_writing(offset_bytes, len_bytes).await
            }
            r => r,
        }
    }

    /// The fallback: writes the range in writes of [`ZEROES_CHUNK_BYTES`]
    /// from one shared zeroed buffer, all issued in the first poll (see the
    /// module docs). The first error, after every write has completed.
    async fn write_zeroes_by_writing(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), Error> {
        if len_bytes > MAX_ZEROES_BY_WRITING_BYTES {
            return Err(self.name_err(
                Error::invalid(InvalidInput::Length {
                    len_bytes,
                    max_bytes: MAX_ZEROES_BY_WRITING_BYTES,
                })
                .with_context(
                    "this file or device has no zeroing op, so write_zeroes writes the zeroes, \
                     all issued at once: zero a longer range in calls of at most 64 GiB",
                ),
            ));
        }
        let chunk = len_bytes.min(ZEROES_CHUNK_BYTES) as usize;
        let align = self.geometry().mem_align_bytes().max(1) as usize;
        let mut buf = DmaBuf::heap(chunk, align);
        buf.as_mut_slice().fill(0);
        // Shared by every write: the kernel only reads it.
        let zeroes = Bytes::from_owner(buf);
        let end = offset_bytes + len_bytes;
        let writes = (offset_bytes..end)
            .step_by(chunk)
            .map(|at| self.write_all_at(zeroes.slice(..(end - at).min(chunk as u64) as usize), at))
            .map(|write| futures::FutureExt::map(write, |(r, _)| r));
        crate::long_range::all_complete(writes).await
    }
}
