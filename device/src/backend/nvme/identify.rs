//! What a namespace is: nsid (`NVME_IOCTL_ID`), LBA format and size
//! (Identify Namespace, CNS 0), MDTS and optional commands (Identify
//! Controller, CNS 1), cross-checked with the block device's sysfs queue
//! limits where the kernel exposes them.
//!
//! Invariants: every value comes from the device or sysfs, never a guess,
//! except `CAP.MPSMIN` (a controller register, not reachable through
//! passthrough). It is read from the controller's BAR when that can be
//! mapped, which kernels with `CONFIG_IO_STRICT_DEVMEM` refuse while the
//! nvme driver owns the device (the usual case); then 0 (4 KiB pages) is
//! assumed. MPSMIN 0 is the smallest possible value, so the assumption can
//! only under-estimate MDTS (commands smaller than allowed, never larger),
//! and the sysfs `max_hw_sectors_kb`, which the kernel derived from the
//! real CAP and MDTS, caps the result either way.

use std::fs;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use super::cmd::{NvmeCmd, MAX_NLB_PER_CMD, NVME_IOCTL_ADMIN_CMD, NVME_IOCTL_ID};
use crate::buf::DmaBuf;
use crate::error::{nvme_status_result, Error, ErrorKind, Result};

/// The facts about one namespace that commands and geometry need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsInfo {
    /// Namespace id.
    pub nsid: u32,
    /// Namespace size in logical blocks (NSZE).
    pub nsze_blocks: u64,
    /// log2 of the LBA data size (9 = 512 bytes, 12 = 4 KiB).
    pub lba_shift: u32,
    /// Metadata bytes per LBA of the active format (not transferred by
    /// plugio; formats with inline "extended" metadata are refused).
    pub metadata_bytes: u16,
    /// Maximum Data Transfer Size in bytes (`2^MDTS * 2^(12 + CAP.MPSMIN)`);
    /// `None` when the controller reports no limit (MDTS 0).
    pub mdts_bytes: Option<u64>,
    /// CAP.MPSMIN as read from the controller's BAR; `None` when the BAR
    /// could not be mapped (then 0, 4 KiB pages, is assumed for MDTS).
    pub cap_mpsmin: Option<u32>,
    /// The controller supports Write Zeroes (ONCS bit 3).
    pub write_zeroes: bool,
    /// The controller supports Dataset Management (ONCS bit 2).
    pub dsm: bool,
    /// The controller has a volatile write cache (VWC bit 0).
    pub volatile_cache: bool,
}

/// Identify CNS values.
const CNS_NAMESPACE: u8 = 0;
const CNS_CONTROLLER: u8 = 1;

/// Reads the namespace id of an open `/dev/ngXnY` (or `/dev/nvmeXnY`).
///
/// # Errors
/// The ioctl failed (`ENOTTY`: not an NVMe namespace).
pub fn namespace_id(fd: RawFd) -> Result<u32> {
    // SAFETY: NVME_IOCTL_ID takes no argument and returns the nsid.
    let rc = unsafe { libc::ioctl(fd, NVME_IOCTL_ID as _) };
    if rc < 0 {
        return Err(Error::from_io(&std::io::Error::last_os_error()).with_context("NVME_IOCTL_ID"));
    }
    Ok(rc as u32)
}

/// Runs an admin Identify with `cns` for `nsid` and returns the 4096-byte
/// data structure.
///
/// # Errors
/// The ioctl failed (`EACCES` without the right to send admin commands), or
/// the controller returned a non-zero status ([`ErrorKind::Nvme`]).
pub fn identify(fd: RawFd, nsid: u32, cns: u8) -> Result<DmaBuf> {
    let mut buf = DmaBuf::heap(4096, 4096);
    let mut cmd = NvmeCmd::identify(nsid, cns, buf.as_mut_ptr() as u64);
    // SAFETY: NVME_IOCTL_ADMIN_CMD reads and writes one 72-byte
    // nvme_passthru_cmd (NvmeCmd has that layout) and writes at most
    // data_len = 4096 bytes to addr, which points to our live buffer.
    let rc = unsafe { libc::ioctl(fd, NVME_IOCTL_ADMIN_CMD as _, &mut cmd as *mut NvmeCmd) };
    if rc < 0 {
        return Err(Error::from_io(&std::io::Error::last_os_error())
            .with_context("NVMe admin Identify (NVME_IOCTL_ADMIN_CMD)"));
    }
    if rc > 0 {
        return Err(
            Error::from_errno(nvme_status_result(rc as u16)).with_context("NVMe admin Identify")
        );
    }
    Ok(buf)
}

fn le_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

fn le_u64(b: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(w)
}

/// The active LBA format index: FLBAS bits 3:0, plus bits 6:5 as the high
/// bits when the namespace has more than 16 formats.
fn active_format(nlbaf: u8, flbas: u8) -> usize {
    let low = usize::from(flbas & 0xf);
    if nlbaf < 16 {
        low
    } else {
        low | (usize::from((flbas >> 5) & 3) << 4)
    }
}

/// Parses Identify Namespace data: (nsze, lba_shift, metadata bytes,
/// extended-LBA flag).
///
/// # Errors
/// A format whose LBA data size is not 512 B .. 64 KiB (or 0: the format is
/// not in use).
pub fn parse_namespace(data: &[u8]) -> Result<(u64, u32, u16, bool)> {
    let nsze = le_u64(data, 0);
    let nlbaf = data[25];
    let flbas = data[26];
    let fmt = active_format(nlbaf, flbas);
    let lbaf = 128 + 4 * fmt;
    let ms = le_u16(data, lbaf);
    let ds = u32::from(data[lbaf + 2]);
    if !(9..=16).contains(&ds) {
        return Err(Error::new(ErrorKind::Unsupported)
            .with_context("NVMe namespace reports an LBA size outside 512 B..64 KiB"));
    }
    Ok((nsze, ds, ms, flbas & 0x10 != 0))
}

/// Parses Identify Controller data: (MDTS exponent, ONCS, VWC).
pub fn parse_controller(data: &[u8]) -> (u8, u16, u8) {
    (data[77], le_u16(data, 520), data[525])
}

/// Reads the namespace and controller facts through admin Identify.
///
/// # Errors
/// Identify failed (see [`identify`]); the namespace uses inline metadata
/// ([`ErrorKind::Unsupported`]).
pub fn read_ns_info(fd: RawFd, sysfs_ctrl: Option<&Path>) -> Result<NsInfo> {
    let nsid = namespace_id(fd)?;
    let ns = identify(fd, nsid, CNS_NAMESPACE)?;
    let (nsze_blocks, lba_shift, metadata_bytes, extended) = parse_namespace(ns.as_slice())?;
    if extended && metadata_bytes > 0 {
        return Err(Error::new(ErrorKind::Unsupported).with_context(
            "NVMe namespace is formatted with inline (extended LBA) metadata; plugio transfers data only",
        ));
    }
    let ctrl = identify(fd, 0, CNS_CONTROLLER)?;
    let (mdts, oncs, vwc) = parse_controller(ctrl.as_slice());
    let cap_mpsmin = sysfs_ctrl.and_then(read_cap_mpsmin);
    let page_shift = 12 + cap_mpsmin.unwrap_or(0);
    let mdts_bytes = (mdts != 0).then(|| 1u64 << (u32::from(mdts) + page_shift));
    Ok(NsInfo {
        nsid,
        nsze_blocks,
        lba_shift,
        metadata_bytes,
        mdts_bytes,
        cap_mpsmin,
        write_zeroes: oncs & (1 << 3) != 0,
        dsm: oncs & (1 << 2) != 0,
        volatile_cache: vwc & 1 != 0,
    })
}

/// Reads CAP.MPSMIN (bits 51:48 of the CAP register at BAR0 offset 0) by
/// mapping the controller's PCI `resource0` read-only. `None` where that is
/// not possible (not PCI, no permission, locked down, or the BAR is claimed
/// by the driver under `CONFIG_IO_STRICT_DEVMEM`: `EINVAL`).
fn read_cap_mpsmin(ctrl_dir: &Path) -> Option<u32> {
    let path = ctrl_dir.join("device/resource0");
    let file = fs::File::open(&path).ok()?;
    // SAFETY: a fresh read-only shared mapping of one page of the BAR; it is
    // only read through volatile 32-bit loads (NVMe registers allow 32-bit
    // access) and unmapped before returning.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        if map == libc::MAP_FAILED {
            return None;
        }
        let cap_hi = std::ptr::read_volatile(map.cast::<u32>().add(1));
        libc::munmap(map, 4096);
        // An all-ones read means the device is gone or the BAR is not the
        // controller's registers.
        (cap_hi != u32::MAX).then_some((cap_hi >> 16) & 0xf)
    }
}

/// The block-device and controller sysfs directories of a namespace.
#[derive(Debug, Clone, Default)]
pub struct SysfsDirs {
    /// `/sys/block/nvmeXnY` when present.
    pub block: Option<PathBuf>,
    /// `/sys/class/nvme/nvmeX` when present.
    pub ctrl: Option<PathBuf>,
}

/// Finds the sysfs directories of namespace node `ng_name` (`ngXnY`).
pub fn sysfs_dirs(sysfs: &Path, ng_name: &str) -> SysfsDirs {
    let block_name = block_name_of(ng_name);
    let block = block_name
        .as_ref()
        .map(|b| sysfs.join("block").join(b))
        .filter(|p| p.join("queue").is_dir());
    let ctrl = ng_name
        .strip_prefix("ng")
        .and_then(|rest| rest.split('n').next())
        .map(|ctrl| sysfs.join("class/nvme").join(format!("nvme{ctrl}")))
        .filter(|p| p.is_dir());
    SysfsDirs { block, ctrl }
}

/// `ngXnY` -> `nvmeXnY`.
pub fn block_name_of(ng_name: &str) -> Option<String> {
    ng_name.strip_prefix("ng").map(|rest| format!("nvme{rest}"))
}

/// Reads a number from `dir/queue/name`.
pub fn queue_limit(block_dir: &Path, name: &str) -> Option<u64> {
    fs::read_to_string(block_dir.join("queue").join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The largest command in bytes: MDTS, the 16-bit block count, and the
/// kernel's `max_hw_sectors_kb` (which it derived from CAP and MDTS and
/// its own DMA limits), whichever is smallest; at least one block.
pub fn max_command_bytes(info: &NsInfo, sysfs_max_hw_kb: Option<u64>) -> u64 {
    let block = 1u64 << info.lba_shift;
    let mut max = MAX_NLB_PER_CMD * block;
    if let Some(mdts) = info.mdts_bytes {
        max = max.min(mdts);
    }
    if let Some(kb) = sysfs_max_hw_kb {
        max = max.min(kb * 1024);
    }
    (max / block * block).max(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns_data(nsze: u64, nlbaf: u8, flbas: u8, formats: &[(u16, u8)]) -> Vec<u8> {
        let mut d = vec![0u8; 4096];
        d[..8].copy_from_slice(&nsze.to_le_bytes());
        d[25] = nlbaf;
        d[26] = flbas;
        for (i, &(ms, ds)) in formats.iter().enumerate() {
            let off = 128 + 4 * i;
            d[off..off + 2].copy_from_slice(&ms.to_le_bytes());
            d[off + 2] = ds;
        }
        d
    }

    #[test]
    fn namespace_format_is_the_active_one() {
        let d = ns_data(131072, 1, 1, &[(0, 9), (0, 12)]);
        assert_eq!(parse_namespace(&d).expect("parse"), (131072, 12, 0, false));
        let d = ns_data(1 << 20, 1, 0x10, &[(8, 9)]);
        assert_eq!(parse_namespace(&d).expect("parse"), (1 << 20, 9, 8, true));
    }

    #[test]
    fn more_than_16_formats_use_the_high_flbas_bits() {
        let mut formats = vec![(0u16, 9u8); 18];
        formats[17] = (16, 12);
        // index 17 = low 1 | high 1 << 4 (FLBAS bits 6:5 = 01).
        let d = ns_data(8, 17, 0x21, &formats);
        assert_eq!(parse_namespace(&d).expect("parse"), (8, 12, 16, false));
    }

    #[test]
    fn unused_format_is_refused() {
        let d = ns_data(8, 0, 0, &[(0, 0)]);
        assert!(parse_namespace(&d).is_err());
    }

    #[test]
    fn controller_fields() {
        let mut d = vec![0u8; 4096];
        d[77] = 6;
        d[520] = 0x0c;
        d[525] = 1;
        assert_eq!(parse_controller(&d), (6, 0x0c, 1));
    }

    #[test]
    fn command_limit_is_the_smallest_of_mdts_nlb_and_sysfs() {
        let mut info = NsInfo {
            nsid: 1,
            nsze_blocks: 1 << 20,
            lba_shift: 9,
            metadata_bytes: 0,
            mdts_bytes: Some(256 << 10),
            cap_mpsmin: Some(0),
            write_zeroes: true,
            dsm: true,
            volatile_cache: true,
        };
        assert_eq!(max_command_bytes(&info, None), 256 << 10);
        assert_eq!(max_command_bytes(&info, Some(128)), 128 << 10);
        info.mdts_bytes = None;
        // 65536 blocks of 512 bytes.
        assert_eq!(max_command_bytes(&info, None), 32 << 20);
    }

    #[test]
    fn node_names_map() {
        assert_eq!(block_name_of("ng0n1").as_deref(), Some("nvme0n1"));
        assert_eq!(block_name_of("ng12n3").as_deref(), Some("nvme12n3"));
        assert_eq!(block_name_of("sda"), None);
    }
}
