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
//! The zeroing op goes through the whole path as any IO. Only when it
//! completes with `Unsupported` does the fallback run: it is plain
//! `write_at` calls from one zeroed buffer, so the hot path carries nothing
//! for it, and the writes are ordered against overlapping IO as any write.
//! The range was checked (alignment, capacity) before the op was issued,
//! so the fallback's writes are valid IO.

use plugio_device::{Error, ErrorKind};

use crate::device::Device;

/// The size of each zero-filled write of the fallback: large enough that a
/// big range takes few writes (the engine splits it at the device's
/// request limit), small enough to allocate freely.
pub const ZEROES_CHUNK_BYTES: u64 = 1 << 20;

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
    /// # Errors
    /// Invalid input (unaligned, beyond the device) before anything is
    /// issued; the device's error otherwise. When a fallback write fails,
    /// the range before it is zeroed and the rest is unspecified.
    pub async fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), Error> {
        match self.write_zeroes_no_fallback(offset_bytes, len_bytes).await {
            Err(e) if *e.kind() == ErrorKind::Unsupported => {
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

    /// The fallback: writes the range from one zeroed buffer, a chunk at a
    /// time.
    async fn write_zeroes_by_writing(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), Error> {
        let chunk = len_bytes.min(ZEROES_CHUNK_BYTES) as usize;
        let mut buf = self.alloc_buf(chunk);
        // `alloc_buf` may hand out a reused buffer with old contents.
        buf.as_mut_slice().fill(0);
        let end = offset_bytes + len_bytes;
        let mut at = offset_bytes;
        while at < end {
            let n = (end - at).min(chunk as u64) as usize;
            buf.set_len(n);
            let (r, back) = self.write_at(buf, at).await;
            buf = back;
            match r? {
                0 => {
                    return Err(Error::new(ErrorKind::Io { errno: libc::EIO }).with_context(
                        "write zeroes fallback: a write of zeroes made no progress; \
                         the range is zeroed only up to that write",
                    ))
                }
                written => at += written as u64,
            }
        }
        Ok(())
    }
}
