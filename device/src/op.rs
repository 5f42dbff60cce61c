//! The unit of submission: one [`IoOp`], which becomes exactly one backend
//! submission (one SQE, one pool job, one simulated event) and exactly one
//! completion.
//!
//! Invariants: `len_bytes` equals the sum of the segment lengths for data
//! ops (`Read`, `Write`) and is the range length for range ops
//! (`WriteZeroes`, `Discard`, `Fallocate`); `Flush`, `Fsync` and `Nop` carry
//! no segments. Offsets and lengths are in bytes; the LBA view
//! (`offset_bytes >> lba_shift`) is derived from the device geometry so a
//! passthrough backend can build NVMe commands from the same op.

use std::fmt;

/// What an op does. The default is [`OpKind::Nop`] (what an empty
/// request slot holds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpKind {
    /// Read `len_bytes` at `offset_bytes` into the segments.
    Read,
    /// Write the segments at `offset_bytes`.
    Write,
    /// Make written data durable (`fdatasync`; NVMe Flush).
    Flush,
    /// Make data and metadata durable (`fsync`).
    Fsync,
    /// Zero the range (`BLKZEROOUT` / `FALLOC_FL_ZERO_RANGE`; NVMe Write
    /// Zeroes).
    WriteZeroes,
    /// Discard the range (`BLKDISCARD` / `FALLOC_FL_PUNCH_HOLE`; NVMe
    /// Dataset Management deallocate). Data read back afterwards is zeroes
    /// on files and unspecified on block devices.
    Discard,
    /// `fallocate(2)` the range with `mode` (`FALLOC_FL_*` bits).
    Fallocate {
        /// The `FALLOC_FL_*` mode bits.
        mode: i32,
    },
    /// Do nothing; completes with 0 (useful to measure the path).
    #[default]
    Nop,
}

impl OpKind {
    /// True for ops that move data through segments (`Read`, `Write`).
    pub fn has_data(self) -> bool {
        matches!(self, OpKind::Read | OpKind::Write)
    }

    /// True for ops that address a byte range (data ops and range ops).
    pub fn has_range(self) -> bool {
        !matches!(self, OpKind::Flush | OpKind::Fsync | OpKind::Nop)
    }

    /// True for ops that change the device contents.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            OpKind::Write | OpKind::WriteZeroes | OpKind::Discard | OpKind::Fallocate { .. }
        )
    }
}

/// Per-op flags: FUA, PREFLUSH, NOMERGE and an IO priority, packed in a
/// `u32`. The low 16 bits are flags; the high 16 bits hold an `ioprio`
/// value (class << 13 | level) as `ioprio_set(2)` and the SQE's `ioprio`
/// field take it.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct IoFlags(u32);

impl IoFlags {
    /// No flags, default priority.
    pub const NONE: IoFlags = IoFlags(0);
    /// Force unit access: the write is durable when it completes
    /// (`RWF_DSYNC` on files and block devices; `REQ_FUA` in the kernel).
    /// Writes only: any other op with it is refused before submission
    /// ([`InvalidInput::WriteOnlyFlags`](crate::InvalidInput::WriteOnlyFlags)),
    /// as the Linux block layer refuses it (NVMe's Read command has a FUA
    /// bit too, which plugio does not send).
    pub const FUA: IoFlags = IoFlags(1);
    /// Flush the device's volatile cache before this op (`REQ_PREFLUSH`); the
    /// file backend issues an `fdatasync` linked ahead of the op. Writes
    /// only, as [`IoFlags::FUA`].
    pub const PREFLUSH: IoFlags = IoFlags(1 << 1);
    /// Never merge this op with its neighbours (`REQ_NOMERGE`); the device
    /// layer ignores it, the engine reads it.
    pub const NOMERGE: IoFlags = IoFlags(1 << 2);

    const FLAG_MASK: u32 = 0xffff;

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Builds flags from raw bits (unknown flag bits are kept; the device
    /// layer ignores them).
    pub fn from_bits(bits: u32) -> Self {
        IoFlags(bits)
    }

    /// True when every flag of `other` is set in `self`.
    pub fn contains(self, other: IoFlags) -> bool {
        self.0 & other.0 & Self::FLAG_MASK == other.0 & Self::FLAG_MASK
    }

    /// Returns these flags with the IO priority set: `class` is the
    /// `IOPRIO_CLASS_*` value (0 none, 1 realtime, 2 best effort, 3 idle),
    /// `level` 0..=7. Values out of range are masked (class to 3 bits,
    /// level to 13 bits) as the kernel's `IOPRIO_PRIO_VALUE` does.
    pub fn with_ioprio(self, class: u16, level: u16) -> Self {
        let prio = (u32::from(class & 0x7) << 13) | u32::from(level & 0x1fff);
        IoFlags((self.0 & Self::FLAG_MASK) | (prio << 16))
    }

    /// The `ioprio` value (0 = default priority).
    pub fn ioprio(self) -> u16 {
        (self.0 >> 16) as u16
    }

    /// The flags without the priority, for comparing merge eligibility.
    pub fn flag_bits(self) -> u32 {
        self.0 & Self::FLAG_MASK
    }
}

impl std::ops::BitOr for IoFlags {
    type Output = IoFlags;
    fn bitor(self, rhs: IoFlags) -> IoFlags {
        let prio = if rhs.ioprio() != 0 { rhs.0 } else { self.0 } & !Self::FLAG_MASK;
        IoFlags(((self.0 | rhs.0) & Self::FLAG_MASK) | prio)
    }
}

impl fmt::Debug for IoFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_set();
        if self.contains(IoFlags::FUA) {
            list.entry(&"FUA");
        }
        if self.contains(IoFlags::PREFLUSH) {
            list.entry(&"PREFLUSH");
        }
        if self.contains(IoFlags::NOMERGE) {
            list.entry(&"NOMERGE");
        }
        if self.ioprio() != 0 {
            list.entry(&format_args!("ioprio={:#x}", self.ioprio()));
        }
        list.finish()
    }
}

/// The most bytes one read or write moves in the kernel (`MAX_RW_COUNT`:
/// `INT_MAX` rounded down to a 4 KiB page, `0x7fff_f000`); a larger one
/// comes back short, as if it had reached the end of the file. The
/// engine's largest IO (`plugio::MAX_IO_BYTES`) and [`crate::File`]'s.
///
/// ```
/// assert_eq!(plugio::device::MAX_RW_BYTES, 0x7fff_f000);
/// ```
pub const MAX_RW_BYTES: u64 = 0x7fff_f000;

/// One op as handed to [`Backend::submit`](crate::Backend::submit).
///
/// The segments are plain `iovec`s: the memory they point to must stay valid
/// (and, for reads, not otherwise accessed) until the op's completion is
/// delivered; that is the caller's promise when it calls the `unsafe`
/// submit.
#[derive(Clone, Copy)]
pub struct IoOp<'a> {
    /// What to do.
    pub kind: OpKind,
    /// Byte offset on the device or in the file.
    pub offset_bytes: u64,
    /// Length in bytes: the sum of the segment lengths for `Read`/`Write`,
    /// the range length for range ops, 0 for `Flush`/`Fsync`/`Nop`.
    pub len_bytes: u64,
    /// The memory of a data op; empty for the other ops.
    pub segments: &'a [libc::iovec],
    /// The registered buffer index every segment lies in (see
    /// `DmaBuf::fixed_index`): one segment goes as `READ_FIXED`/
    /// `WRITE_FIXED`, several as `READV_FIXED`/`WRITEV_FIXED` where the
    /// ring's kernel has them (Linux 6.15; else as plain `READV`/`WRITEV`,
    /// see [`SqWriter::vectored_fixed`](crate::SqWriter::vectored_fixed)),
    /// so that the kernel pins no page per op. Ignored by backends without
    /// fixed buffers, and by NVMe passthrough for several segments. A
    /// segment outside that buffer fails the op with `EFAULT`.
    pub fixed_buf: Option<u16>,
    /// FUA, PREFLUSH, NOMERGE, priority.
    pub flags: IoFlags,
}

impl<'a> IoOp<'a> {
    /// A read of one or more segments at `offset_bytes`.
    pub fn read(offset_bytes: u64, segments: &'a [libc::iovec]) -> Self {
        Self::data(OpKind::Read, offset_bytes, segments)
    }

    /// A write of one or more segments at `offset_bytes`.
    pub fn write(offset_bytes: u64, segments: &'a [libc::iovec]) -> Self {
        Self::data(OpKind::Write, offset_bytes, segments)
    }

    fn data(kind: OpKind, offset_bytes: u64, segments: &'a [libc::iovec]) -> Self {
        let len_bytes = segments.iter().map(|s| s.iov_len as u64).sum();
        Self {
            kind,
            offset_bytes,
            len_bytes,
            segments,
            fixed_buf: None,
            flags: IoFlags::NONE,
        }
    }

    /// A range op (`WriteZeroes`, `Discard`, `Fallocate`) over
    /// `[offset_bytes, offset_bytes + len_bytes)`.
    pub fn range(kind: OpKind, offset_bytes: u64, len_bytes: u64) -> Self {
        Self {
            kind,
            offset_bytes,
            len_bytes,
            segments: &[],
            fixed_buf: None,
            flags: IoFlags::NONE,
        }
    }

    /// An op without range or data (`Flush`, `Fsync`, `Nop`).
    pub fn bare(kind: OpKind) -> Self {
        Self::range(kind, 0, 0)
    }

    /// Returns the op with `flags`.
    pub fn with_flags(mut self, flags: IoFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Returns the op using registered buffer `index`.
    pub fn with_fixed_buf(mut self, index: Option<u16>) -> Self {
        self.fixed_buf = index;
        self
    }

    /// The first LBA for a device of `1 << lba_shift`-byte blocks.
    pub fn start_lba(&self, lba_shift: u32) -> u64 {
        self.offset_bytes >> lba_shift
    }

    /// The number of blocks covered, for a device of `1 << lba_shift`-byte
    /// blocks (rounded up).
    pub fn nr_blocks(&self, lba_shift: u32) -> u64 {
        let block = 1u64 << lba_shift;
        let end = self.offset_bytes + self.len_bytes;
        end.div_ceil(block) - self.offset_bytes / block
    }
}

impl fmt::Debug for IoOp<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoOp")
            .field("kind", &self.kind)
            .field("offset_bytes", &self.offset_bytes)
            .field("len_bytes", &self.len_bytes)
            .field("nr_segments", &self.segments.len())
            .field("fixed_buf", &self.fixed_buf)
            .field("flags", &self.flags)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_priority_pack() {
        let f = (IoFlags::FUA | IoFlags::NOMERGE).with_ioprio(2, 4);
        assert!(f.contains(IoFlags::FUA) && f.contains(IoFlags::NOMERGE));
        assert!(!f.contains(IoFlags::PREFLUSH));
        assert_eq!(f.ioprio(), (2 << 13) | 4);
        assert_eq!(f.flag_bits(), 5);
    }

    #[test]
    fn lba_view() {
        let op = IoOp::range(OpKind::Discard, 1024, 1536);
        assert_eq!(op.start_lba(9), 2);
        assert_eq!(op.nr_blocks(9), 3);
        assert_eq!(op.nr_blocks(12), 1);
    }
}
