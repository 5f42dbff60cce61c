//! NVMe command encoding: the 72-byte `struct nvme_uring_cmd` that rides in
//! a 128-byte SQE (`IORING_OP_URING_CMD`), the ioctl numbers of the NVMe
//! character devices, and the NVM command set opcodes plugio uses.
//!
//! Invariants: [`NvmeCmd`] has the exact uapi layout (checked by a size and
//! offset test); `nlb` fields are 0-based except in Dataset Management
//! ranges, which are 1-based; every builder fills `nsid`, as the kernel
//! refuses a command whose nsid is not the namespace's.

use std::mem::size_of;

/// `NVME_IOCTL_ID` (`_IO('N', 0x40)`): returns the namespace id.
pub const NVME_IOCTL_ID: u64 = 0x4e40;
/// `NVME_IOCTL_ADMIN_CMD` (`_IOWR('N', 0x41, struct nvme_passthru_cmd)`).
pub const NVME_IOCTL_ADMIN_CMD: u64 = 0xc048_4e41;
/// `NVME_URING_CMD_IO` (`_IOWR('N', 0x80, struct nvme_uring_cmd)`): one
/// data buffer at `addr`, `data_len` bytes.
pub const NVME_URING_CMD_IO: u32 = 0xc048_4e80;
/// `NVME_URING_CMD_IO_VEC` (`_IOWR('N', 0x81, ...)`): `addr` is an iovec
/// array and `data_len` its count.
pub const NVME_URING_CMD_IO_VEC: u32 = 0xc048_4e81;

/// NVM command set opcodes (NVMe NVM Command Set specification).
pub mod opcode {
    /// Flush the volatile write cache.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management (deallocate = discard).
    pub const DSM: u8 = 0x09;
    /// Admin Identify.
    pub const ADMIN_IDENTIFY: u8 = 0x06;
}

/// cdw12 bit 30: Force Unit Access (read and write).
pub const CDW12_FUA: u32 = 1 << 30;
/// cdw12 bit 25: Deallocate, for Write Zeroes.
pub const CDW12_DEAC: u32 = 1 << 25;
/// Dataset Management cdw11 bit 2: Attribute Deallocate.
pub const DSM_ATTR_DEALLOCATE: u32 = 1 << 2;
/// Write Zeroes and Read/Write carry a 16-bit 0-based block count.
pub const MAX_NLB_PER_CMD: u64 = 1 << 16;

/// `struct nvme_uring_cmd` (and, with the result field appended,
/// `struct nvme_passthru_cmd` of the admin ioctl): 72 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmeCmd {
    /// Command opcode.
    pub opcode: u8,
    /// Must be 0.
    pub flags: u8,
    /// Reserved.
    pub rsvd1: u16,
    /// Namespace id.
    pub nsid: u32,
    /// Command dword 2.
    pub cdw2: u32,
    /// Command dword 3.
    pub cdw3: u32,
    /// Metadata buffer address (0: none).
    pub metadata: u64,
    /// Data buffer address, or iovec array address for `_IO_VEC`.
    pub addr: u64,
    /// Metadata length in bytes.
    pub metadata_len: u32,
    /// Data length in bytes, or the iovec count for `_IO_VEC`.
    pub data_len: u32,
    /// Command dword 10.
    pub cdw10: u32,
    /// Command dword 11.
    pub cdw11: u32,
    /// Command dword 12.
    pub cdw12: u32,
    /// Command dword 13.
    pub cdw13: u32,
    /// Command dword 14.
    pub cdw14: u32,
    /// Command dword 15.
    pub cdw15: u32,
    /// Timeout in milliseconds (0: the driver's default).
    pub timeout_ms: u32,
    /// Reserved (the admin ioctl's `result` on return).
    pub rsvd2: u32,
}

const _: () = assert!(size_of::<NvmeCmd>() == 72);

/// One Dataset Management range: `{ cattr, nlb (1-based), slba }`, little
/// endian, 16 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DsmRange {
    /// Context attributes (0).
    pub cattr: u32,
    /// Number of logical blocks, 1-based.
    pub nlb: u32,
    /// Starting LBA.
    pub slba: u64,
}

const _: () = assert!(size_of::<DsmRange>() == 16);

impl NvmeCmd {
    /// The command as the 80-byte `cmd` area of a 128-byte SQE (the last 8
    /// bytes zero).
    pub fn to_sqe_cmd(&self) -> [u8; 80] {
        let mut out = [0u8; 80];
        let words = [
            u32::from(self.opcode) | u32::from(self.flags) << 8 | u32::from(self.rsvd1) << 16,
            self.nsid,
            self.cdw2,
            self.cdw3,
            self.metadata as u32,
            (self.metadata >> 32) as u32,
            self.addr as u32,
            (self.addr >> 32) as u32,
            self.metadata_len,
            self.data_len,
            self.cdw10,
            self.cdw11,
            self.cdw12,
            self.cdw13,
            self.cdw14,
            self.cdw15,
            self.timeout_ms,
            self.rsvd2,
        ];
        for (chunk, word) in out.chunks_exact_mut(4).zip(words) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        out
    }

    /// A command addressing `nlb` (1-based count, at least 1) blocks at
    /// `slba`: cdw10/11 = slba, cdw12 = nlb - 1 (0-based).
    fn lba_range(opcode: u8, nsid: u32, slba: u64, nlb: u32) -> Self {
        Self {
            opcode,
            nsid,
            cdw10: slba as u32,
            cdw11: (slba >> 32) as u32,
            cdw12: nlb.saturating_sub(1) & 0xffff,
            ..Self::default()
        }
    }

    /// Read or Write (`write`) of `nlb` blocks at `slba` into/from the data
    /// at `addr` (`data_len` bytes; or an iovec array and its count for
    /// `_IO_VEC`), with FUA in cdw12 bit 30 when asked.
    pub fn rw(write: bool, nsid: u32, slba: u64, nlb: u32, fua: bool) -> Self {
        let op = if write { opcode::WRITE } else { opcode::READ };
        let mut cmd = Self::lba_range(op, nsid, slba, nlb);
        if fua {
            cmd.cdw12 |= CDW12_FUA;
        }
        cmd
    }

    /// Write Zeroes of `nlb` blocks at `slba`, with the Deallocate bit
    /// (cdw12 bit 25) when `deallocate`.
    pub fn write_zeroes(nsid: u32, slba: u64, nlb: u32, deallocate: bool) -> Self {
        let mut cmd = Self::lba_range(opcode::WRITE_ZEROES, nsid, slba, nlb);
        if deallocate {
            cmd.cdw12 |= CDW12_DEAC;
        }
        cmd
    }

    /// Flush.
    pub fn flush(nsid: u32) -> Self {
        Self {
            opcode: opcode::FLUSH,
            nsid,
            ..Self::default()
        }
    }

    /// Dataset Management with the Deallocate attribute over `nr_ranges`
    /// ranges stored at `ranges_addr` (cdw10 = nr_ranges - 1, data_len =
    /// 16 bytes per range).
    pub fn deallocate(nsid: u32, ranges_addr: u64, nr_ranges: u32) -> Self {
        Self {
            opcode: opcode::DSM,
            nsid,
            addr: ranges_addr,
            data_len: nr_ranges * size_of::<DsmRange>() as u32,
            cdw10: nr_ranges.saturating_sub(1),
            cdw11: DSM_ATTR_DEALLOCATE,
            ..Self::default()
        }
    }

    /// Admin Identify with `cns` into a 4096-byte buffer at `addr`.
    pub fn identify(nsid: u32, cns: u8, addr: u64) -> Self {
        Self {
            opcode: opcode::ADMIN_IDENTIFY,
            nsid,
            addr,
            data_len: 4096,
            cdw10: u32::from(cns),
            ..Self::default()
        }
    }
}

/// A decoded NVMe completion status, as the kernel returns it in a
/// passthrough `cqe->res > 0` (the status field without the phase bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmeStatus {
    /// Status Code Type, bits 10:8.
    pub sct: u8,
    /// Status Code, bits 7:0.
    pub sc: u8,
    /// Command Retry Delay index, bits 12:11.
    pub crd: u8,
    /// More, bit 13.
    pub more: bool,
    /// Do Not Retry, bit 14.
    pub dnr: bool,
}

impl NvmeStatus {
    /// Decodes the 15-bit status.
    pub fn from_raw(raw: u16) -> Self {
        Self {
            sc: (raw & 0xff) as u8,
            sct: ((raw >> 8) & 0x7) as u8,
            crd: ((raw >> 11) & 0x3) as u8,
            more: raw & (1 << 13) != 0,
            dnr: raw & (1 << 14) != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn layout_matches_the_uapi_struct() {
        assert_eq!(offset_of!(NvmeCmd, nsid), 4);
        assert_eq!(offset_of!(NvmeCmd, metadata), 16);
        assert_eq!(offset_of!(NvmeCmd, addr), 24);
        assert_eq!(offset_of!(NvmeCmd, data_len), 36);
        assert_eq!(offset_of!(NvmeCmd, cdw10), 40);
        assert_eq!(offset_of!(NvmeCmd, timeout_ms), 64);
    }

    #[test]
    fn sqe_bytes_equal_the_struct_bytes() {
        let mut cmd = NvmeCmd::rw(true, 3, 0x1_2345_6789, 8, true);
        cmd.addr = 0xdead_beef_0000;
        cmd.data_len = 4096;
        let bytes = cmd.to_sqe_cmd();
        // SAFETY: NvmeCmd is repr(C), 72 bytes, no padding, plain integers.
        let raw: [u8; 72] = unsafe { std::mem::transmute(cmd) };
        assert_eq!(&bytes[..72], &raw[..]);
        assert_eq!(&bytes[72..], &[0u8; 8]);
    }

    #[test]
    fn lba_fields_are_split_and_zero_based() {
        let cmd = NvmeCmd::rw(false, 1, 0x1_0000_0002, 8, false);
        assert_eq!((cmd.opcode, cmd.cdw10, cmd.cdw11, cmd.cdw12), (2, 2, 1, 7));
        let cmd = NvmeCmd::rw(true, 1, 0, 1, true);
        assert_eq!((cmd.opcode, cmd.cdw12), (1, CDW12_FUA));
        let wz = NvmeCmd::write_zeroes(1, 10, 4, true);
        assert_eq!((wz.opcode, wz.cdw12), (8, CDW12_DEAC | 3));
        let dsm = NvmeCmd::deallocate(1, 0x1000, 1);
        assert_eq!(
            (dsm.opcode, dsm.cdw10, dsm.cdw11, dsm.data_len),
            (9, 0, 4, 16)
        );
        assert_eq!(NvmeCmd::flush(7).nsid, 7);
    }

    #[test]
    fn status_fields_decode() {
        let s = NvmeStatus::from_raw(0x4080);
        assert_eq!(
            (s.sct, s.sc, s.dnr, s.more, s.crd),
            (0, 0x80, true, false, 0)
        );
        let s = NvmeStatus::from_raw(0x3a81);
        assert_eq!(
            (s.sct, s.sc, s.dnr, s.more, s.crd),
            (2, 0x81, false, true, 3)
        );
    }
}
