//! Range ops (discard, write zeroes, fallocate) over ranges longer than
//! one request carries ([`MAX_IO_BYTES`]): the range is split into parts
//! of [`RANGE_PART_BYTES`], all issued in the same poll, so they are
//! plugged together and reach the kernel in one batch; the op returns
//! when every part has completed. The kernel does the same for a discard
//! or zeroout longer than the queue takes in one bio
//! (`blkdev_issue_discard` and `blkdev_issue_zeroout` split the range at
//! `max_discard_sectors` / `max_write_zeroes_sectors` and chain the bios,
//! waiting for the last). Each part goes to the device as one request
//! where the backend takes a range whole (a file, a block device), so a
//! part is one `fallocate` or ioctl, not one per read/write size limit.
//!
//! A range that fits one request takes the single-op path unchanged.
//!
//! # Invariants
//!
//! - A range longer than [`MAX_RANGE_BYTES`] is refused first, before
//!   any part is counted.
//! - The whole range is checked before any part is issued (its end,
//!   read-only, alignment, capacity; then each part against the
//!   backend's own limits): a refused range issues nothing, and its error names the
//!   caller's range, not a part's.
//! - The parts cover the range exactly, in order, with no overlap; each
//!   starts at a multiple of [`RANGE_PART_BYTES`] from the range's start
//!   (so stays aligned as the start is) and is at most that long.
//! - The op's future returns only after every part has completed, failed
//!   or not: a part still in flight could otherwise change the range
//!   after the caller saw the op end.

use plugio_device::{Error, InvalidInput, IoFlags, IoOp, OpKind};

use crate::bio::BioBuf;
use crate::device::{BioInit, Device, MAX_IO_BYTES};

/// The length of each part of a range op longer than [`MAX_IO_BYTES`]:
/// 1 GiB, a multiple of every logical block size and below that limit.
pub const RANGE_PART_BYTES: u64 = 1 << 30;

/// The longest range one range op takes: 64 TiB, 65,536 parts. Past it a
/// length is refused (`InvalidInput::Length`) before anything is built:
/// each part is a bio and a request, so a range near `i64::MAX` would ask
/// for billions of them. Larger than any one file system's largest file
/// but XFS's and btrfs's; issue several ops for more.
pub const MAX_RANGE_BYTES: u64 = 64 << 40;

const _: () = assert!(RANGE_PART_BYTES <= MAX_IO_BYTES);

/// Runs `parts` together (each polled in the same poll of the returned
/// future, so they are plugged together) until every one has completed;
/// then the first error in `parts`' order, if any. A part still in flight
/// could change the range after the caller saw the op end, so an error
/// does not return early.
pub(crate) async fn all_complete<F, T>(parts: impl IntoIterator<Item = F>) -> Result<(), Error>
where
    F: std::future::Future<Output = Result<T, Error>>,
{
    let results = futures::future::join_all(parts).await;
    results
        .into_iter()
        .find_map(Result::err)
        .map_or(Ok(()), Err)
}

impl Device {
    /// `op` (a range op without memory) on `[offset_bytes, offset_bytes +
    /// len_bytes)`: one IO when it fits one request, else split into
    /// parts of [`RANGE_PART_BYTES`] issued together (see the module
    /// docs). The first error of a part, after every part has completed.
    pub(crate) async fn range_op(
        &self,
        op: OpKind,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), Error> {
        debug_assert!(op.has_range() && !op.has_data(), "{op:?} is not a range op");
        if len_bytes <= MAX_IO_BYTES {
            return self
                .io(op, IoFlags::NONE, offset_bytes, len_bytes)
                .await
                .map(drop);
        }
        self.check_range_op(op, offset_bytes, len_bytes)
            .map_err(|e| self.name_err(e))?;
        let parts = parts(offset_bytes, len_bytes)
            .map(|(offset, len)| self.io(op, IoFlags::NONE, offset, len));
        all_complete(parts).await
    }

    /// Checks a range op's range as a whole, whatever its length (so an
    /// error names the caller's range): its end, the device's mode and the
    /// geometry's rules (alignment, capacity); then each of its parts as
    /// the single-op path would (the backend's own limits, such as an
    /// NVMe command's), before anything is issued.
    pub(crate) fn check_range_op(
        &self,
        op: OpKind,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), Error> {
        let shared = self.shared();
        if len_bytes > MAX_RANGE_BYTES {
            return Err(Error::invalid(InvalidInput::Length {
                len_bytes,
                max_bytes: MAX_RANGE_BYTES,
            }));
        }
        Device::check_end_and_mode(shared, op, offset_bytes, len_bytes)?;
        let whole = IoOp {
            kind: op,
            offset_bytes,
            len_bytes,
            segments: &[],
            fixed_buf: None,
            flags: IoFlags::NONE,
        };
        plugio_device::check_op(&shared.geometry, &whole)?;
        for (offset, len) in parts(offset_bytes, len_bytes) {
            let init = BioInit {
                op,
                flags: IoFlags::NONE,
                offset_bytes: offset,
                len_bytes: len,
                buf: BioBuf::None,
                bounced: false,
            };
            Device::check(shared, &init)?;
        }
        Ok(())
    }
}

/// The parts of `[offset_bytes, offset_bytes + len_bytes)`: `(offset,
/// length)` pairs of [`RANGE_PART_BYTES`], the last one shorter when the
/// length is not a multiple of it. `offset_bytes + len_bytes` must not
/// overflow (checked before: the range is within the device).
fn parts(offset_bytes: u64, len_bytes: u64) -> impl Iterator<Item = (u64, u64)> {
    let end = offset_bytes + len_bytes;
    (offset_bytes..end)
        .step_by(RANGE_PART_BYTES as usize)
        .map(move |offset| (offset, RANGE_PART_BYTES.min(end - offset)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_range_exactly_in_order() {
        for (offset, len) in [
            (0, 3 * RANGE_PART_BYTES),
            (4096, 2 * RANGE_PART_BYTES + 512),
            (7 << 20, RANGE_PART_BYTES + 1),
        ] {
            let got: Vec<_> = parts(offset, len).collect();
            let mut next = offset;
            for &(o, l) in &got {
                assert_eq!(o, next, "parts are contiguous");
                assert!(l > 0 && l <= RANGE_PART_BYTES, "{l}");
                assert_eq!((o - offset) % RANGE_PART_BYTES, 0);
                next = o + l;
            }
            assert_eq!(next, offset + len, "the parts end where the range does");
            assert_eq!(got.len() as u64, len.div_ceil(RANGE_PART_BYTES));
        }
    }
}
