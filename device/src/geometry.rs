//! Device geometry: block sizes, queue limits, alignment and capacity.
//!
//! Invariants: every size is a power of two where the kernel requires one
//! (block sizes, alignments); `mem_align_bytes()`/`offset_align_bytes()`
//! return 1 for buffered (non-`O_DIRECT`) files; a partition reports its
//! parent disk's queue limits (sysfs `queue/` lives on the disk) and its
//! own capacity.

use std::fmt;
use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// What kind of target the geometry describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceKind {
    /// A regular file on a file system.
    File,
    /// A block device (disk, partition, loop device, NVMe namespace).
    BlockDevice,
    /// The simulated in-memory device.
    Memory,
}

/// Default `max_sectors_kb` for files (1 MiB per request).
pub const FILE_MAX_SECTORS_KB: u32 = 1024;
/// Default `max_segments` for files.
pub const FILE_MAX_SEGMENTS: u32 = 128;
/// Default `nr_requests` for files and the mem device.
pub const FILE_NR_REQUESTS: u32 = 128;

/// The shape and limits of a device, as `/sys/block/<disk>/queue/` reports
/// them for block devices, `statx(STATX_DIOALIGN)` for files, or the
/// configuration for the mem device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    /// File, block device or memory.
    pub kind: DeviceKind,
    /// Whether IO bypasses the page cache (`O_DIRECT`), which makes the
    /// alignments below binding.
    pub direct: bool,
    /// Logical block size in bytes (the smallest addressable unit; LBA
    /// size).
    pub logical_block_bytes: u32,
    /// Physical block size in bytes (the unit written atomically).
    pub physical_block_bytes: u32,
    /// Required alignment of buffer addresses for direct IO, in bytes
    /// (`stx_dio_mem_align`, or `dma_alignment + 1` for block devices).
    pub dio_mem_align_bytes: u32,
    /// Required alignment of offsets and lengths for direct IO, in bytes
    /// (`stx_dio_offset_align`, or the logical block size).
    pub dio_offset_align_bytes: u32,
    /// Largest request the block layer builds, KiB (`max_sectors_kb`).
    pub max_sectors_kb: u32,
    /// Largest request the hardware accepts, KiB (`max_hw_sectors_kb`).
    pub max_hw_sectors_kb: u32,
    /// Most segments per request (`max_segments`).
    pub max_segments: u32,
    /// Largest segment, bytes (`max_segment_size`).
    pub max_segment_bytes: u32,
    /// Depth of the device queue (`nr_requests`); 0 for bio-based
    /// devices (zram, brd), which have none.
    pub nr_requests: u32,
    /// Spinning disk (`rotational`).
    pub rotational: bool,
    /// Merge policy (`nomerges`): 0 all merges, 1 only simple one-hit
    /// merges, 2 none.
    pub nomerges: u8,
    /// Size in bytes; `None` for files, which grow as they are written.
    pub capacity_bytes: Option<u64>,
    /// Where the limits were read (sysfs queue dir), for display.
    pub source: Option<PathBuf>,
}

impl Geometry {
    /// log2 of the logical block size (9 for 512, 12 for 4096).
    pub fn lba_shift(&self) -> u32 {
        self.logical_block_bytes.max(1).trailing_zeros()
    }

    /// Alignment binding on buffer addresses (1 when buffered).
    #[inline]
    pub fn mem_align_bytes(&self) -> u32 {
        if self.direct {
            self.dio_mem_align_bytes.max(1)
        } else {
            1
        }
    }

    /// Alignment binding on offsets and lengths (1 when buffered).
    #[inline]
    pub fn offset_align_bytes(&self) -> u32 {
        if self.direct {
            self.dio_offset_align_bytes.max(1)
        } else {
            1
        }
    }

    /// Largest request in bytes (`max_sectors_kb` * 1024).
    pub fn max_request_bytes(&self) -> u64 {
        u64::from(self.max_sectors_kb) * 1024
    }

    /// A geometry with file defaults (documented on the constants) and the
    /// given block size and alignments.
    pub fn file_defaults(
        block_bytes: u32,
        mem_align: u32,
        offset_align: u32,
        direct: bool,
    ) -> Self {
        debug_assert!(
            mem_align.is_power_of_two() && offset_align.is_power_of_two(),
            "alignments are powers of two: mem {mem_align}, offset {offset_align}"
        );
        Self {
            kind: DeviceKind::File,
            direct,
            logical_block_bytes: block_bytes,
            physical_block_bytes: block_bytes,
            dio_mem_align_bytes: mem_align,
            dio_offset_align_bytes: offset_align,
            max_sectors_kb: FILE_MAX_SECTORS_KB,
            max_hw_sectors_kb: FILE_MAX_SECTORS_KB,
            max_segments: FILE_MAX_SEGMENTS,
            max_segment_bytes: u32::MAX,
            nr_requests: FILE_NR_REQUESTS,
            rotational: false,
            nomerges: 0,
            capacity_bytes: None,
            source: None,
        }
    }

    /// Reads the geometry of an open file or block device.
    ///
    /// # Errors
    /// `fstat`/`statx` failures, or an unreadable sysfs queue directory for
    /// a block device.
    pub fn of_file(file: &fs::File, direct: bool) -> Result<Self> {
        let meta = file.metadata()?;
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_block_device() {
            use std::os::unix::fs::MetadataExt;
            let rdev = meta.rdev();
            let mut geometry = Self::of_block_device(libc::major(rdev), libc::minor(rdev))?;
            geometry.direct = direct;
            geometry.capacity_bytes = Some(block_device_len_bytes(file)?);
            Ok(geometry)
        } else {
            Self::of_regular_file(file, direct)
        }
    }

    fn of_regular_file(file: &fs::File, direct: bool) -> Result<Self> {
        // SAFETY: statx is plain old data; all-zero is a valid value.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open for the call; the path is a NUL-terminated empty
        // string used with AT_EMPTY_PATH; stx is a valid out pointer.
        let rc = unsafe {
            libc::statx(
                file.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH,
                libc::STATX_BASIC_STATS | libc::STATX_DIOALIGN,
                &mut stx,
            )
        };
        if rc != 0 {
            return Err(Error::from_io(&std::io::Error::last_os_error()).with_context("statx"));
        }
        let block = stx.stx_blksize.max(512);
        let (mem, offset) =
            if stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align != 0 {
                (stx.stx_dio_mem_align, stx.stx_dio_offset_align)
            } else {
                (block, block)
            };
        Ok(Self::file_defaults(offset.max(512), mem, offset, direct))
    }

    /// Reads the queue limits of block device `major:minor` from sysfs
    /// (`/sys/dev/block/MAJ:MIN`, the parent disk for a partition). The
    /// capacity comes from `size` (512-byte sectors).
    ///
    /// # Errors
    /// The sysfs directory or one of its files cannot be read or parsed.
    pub fn of_block_device(major: u32, minor: u32) -> Result<Self> {
        Self::of_block_device_in(Path::new("/sys"), major, minor)
    }

    /// [`Geometry::of_block_device`] with sysfs mounted at `sysfs` (for
    /// tests and chroots).
    ///
    /// # Errors
    /// As [`Geometry::of_block_device`].
    pub fn of_block_device_in(sysfs: &Path, major: u32, minor: u32) -> Result<Self> {
        let dev_dir = sysfs.join(format!("dev/block/{major}:{minor}"));
        let dev_dir =
            fs::canonicalize(&dev_dir).map_err(|e| Error::from_io(&e).with_path(&dev_dir))?;
        let disk_dir = if dev_dir.join("partition").exists() {
            dev_dir
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| dev_dir.clone())
        } else {
            dev_dir.clone()
        };
        let q = disk_dir.join("queue");
        let logical = read_sysfs(&q, "logical_block_size")?;
        let dma_alignment = read_sysfs(&q, "dma_alignment").unwrap_or(511);
        let sectors = read_sysfs(&dev_dir, "size")?;
        // The kernel keeps both powers of two (a mask + 1 and a block size);
        // the checks in `check_op` rely on it for their masks.
        debug_assert!(
            (dma_alignment + 1).is_power_of_two() && logical.is_power_of_two(),
            "sysfs alignments are powers of two: dma_alignment {dma_alignment}, logical {logical}"
        );
        Ok(Self {
            kind: DeviceKind::BlockDevice,
            direct: true,
            logical_block_bytes: logical as u32,
            physical_block_bytes: read_sysfs(&q, "physical_block_size")? as u32,
            // At least the logical block: zram on 6.18 advertises
            // dma_alignment 511 but a 4 KiB O_DIRECT read into a buffer
            // that is not page-aligned overwrites the whole pages it
            // touches (found by `plugio bench`, benches/RESULTS.md).
            dio_mem_align_bytes: ((dma_alignment + 1) as u32).max(logical as u32),
            dio_offset_align_bytes: logical as u32,
            max_sectors_kb: read_sysfs(&q, "max_sectors_kb")? as u32,
            max_hw_sectors_kb: read_sysfs(&q, "max_hw_sectors_kb")? as u32,
            max_segments: read_sysfs(&q, "max_segments")? as u32,
            max_segment_bytes: read_sysfs(&q, "max_segment_size")?.min(u64::from(u32::MAX)) as u32,
            // Bio-based drivers (zram, brd) have no request queue and no
            // `nr_requests`: 0 says so.
            nr_requests: read_sysfs(&q, "nr_requests").unwrap_or(0) as u32,
            rotational: read_sysfs(&q, "rotational")? != 0,
            nomerges: read_sysfs(&q, "nomerges")? as u8,
            capacity_bytes: Some(sectors * 512),
            source: Some(q),
        })
    }
}

fn read_sysfs(dir: &Path, name: &str) -> Result<u64> {
    let path = dir.join(name);
    let text = fs::read_to_string(&path).map_err(|e| Error::from_io(&e).with_path(&path))?;
    text.trim().parse::<u64>().map_err(|_| {
        Error::from_errno(libc::EINVAL)
            .with_context("parsing a sysfs number")
            .with_path(&path)
    })
}

/// `BLKGETSIZE64`: `_IOR(0x12, 114, size_t)`.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// A block device's size in bytes now (`BLKGETSIZE64`), which may differ
/// from the capacity its [`Geometry`] read at open (`losetup -c`,
/// `lvresize`, `blockdev --rereadpt`).
///
/// Public for the engine's errors: a device that shrank after its open is
/// told apart from one that ran out of space (found by a break-it helper).
///
/// # Errors
/// The ioctl's error (`ENOTTY` for a regular file), with the context
/// `BLKGETSIZE64`.
///
/// ```
/// let file = tempfile::tempfile()?;
/// assert!(plugio_device::geometry::block_device_len_bytes(&file).is_err());
/// # Ok::<_, std::io::Error>(())
/// ```
pub fn block_device_len_bytes(file: &impl std::os::fd::AsFd) -> Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // to a live local.
    let rc = unsafe { libc::ioctl(file.as_fd().as_raw_fd(), BLKGETSIZE64 as _, &mut size) };
    if rc != 0 {
        return Err(Error::from_io(&std::io::Error::last_os_error()).with_context("BLKGETSIZE64"));
    }
    Ok(size)
}

impl fmt::Display for Geometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "kind:                {:?}", self.kind)?;
        writeln!(f, "direct:              {}", self.direct)?;
        match self.capacity_bytes {
            Some(c) => writeln!(f, "capacity:            {c} bytes")?,
            None => writeln!(f, "capacity:            grows (file)")?,
        }
        writeln!(f, "logical_block_size:  {}", self.logical_block_bytes)?;
        writeln!(f, "physical_block_size: {}", self.physical_block_bytes)?;
        writeln!(f, "dio_mem_align:       {}", self.dio_mem_align_bytes)?;
        writeln!(f, "dio_offset_align:    {}", self.dio_offset_align_bytes)?;
        writeln!(f, "max_sectors_kb:      {}", self.max_sectors_kb)?;
        writeln!(f, "max_hw_sectors_kb:   {}", self.max_hw_sectors_kb)?;
        writeln!(f, "max_segments:        {}", self.max_segments)?;
        writeln!(f, "max_segment_size:    {}", self.max_segment_bytes)?;
        writeln!(f, "nr_requests:         {}", self.nr_requests)?;
        writeln!(f, "rotational:          {}", self.rotational)?;
        write!(f, "nomerges:            {}", self.nomerges)?;
        if let Some(src) = &self.source {
            write!(f, "\nsource:              {}", src.display())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, value: &str) {
        fs::write(dir.join(name), format!("{value}\n")).expect("write sysfs file");
    }

    /// A fake sysfs with disk `sdz` (8:0) and its partition `sdz1` (8:1).
    fn fake_sysfs() -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tmp");
        let disk = root.path().join("devices/virtual/block/sdz");
        let part = disk.join("sdz1");
        let queue = disk.join("queue");
        fs::create_dir_all(&part).expect("dirs");
        fs::create_dir_all(&queue).expect("dirs");
        for (name, value) in [
            ("logical_block_size", "512"),
            ("physical_block_size", "4096"),
            ("dma_alignment", "3"),
            ("max_sectors_kb", "1280"),
            ("max_hw_sectors_kb", "2048"),
            ("max_segments", "33"),
            ("max_segment_size", "65536"),
            ("nr_requests", "64"),
            ("rotational", "1"),
            ("nomerges", "2"),
        ] {
            write(&queue, name, value);
        }
        write(&disk, "size", "1000");
        write(&part, "size", "100");
        write(&part, "partition", "1");
        let links = root.path().join("dev/block");
        fs::create_dir_all(&links).expect("dirs");
        std::os::unix::fs::symlink(&disk, links.join("8:0")).expect("link");
        std::os::unix::fs::symlink(&part, links.join("8:1")).expect("link");
        root
    }

    #[test]
    fn disk_limits_come_from_its_queue() {
        let sysfs = fake_sysfs();
        let g = Geometry::of_block_device_in(sysfs.path(), 8, 0).expect("disk");
        assert_eq!(g.logical_block_bytes, 512);
        assert_eq!(g.physical_block_bytes, 4096);
        assert_eq!(
            g.dio_mem_align_bytes, 512,
            "dma_alignment 3, raised to the logical block"
        );
        assert_eq!((g.max_sectors_kb, g.max_hw_sectors_kb), (1280, 2048));
        assert_eq!((g.max_segments, g.max_segment_bytes), (33, 65536));
        assert_eq!((g.nr_requests, g.rotational, g.nomerges), (64, true, 2));
        assert_eq!(g.capacity_bytes, Some(1000 * 512));
        assert_eq!(g.lba_shift(), 9);
    }

    #[test]
    fn partition_uses_parent_queue_and_own_size() {
        let sysfs = fake_sysfs();
        let g = Geometry::of_block_device_in(sysfs.path(), 8, 1).expect("partition");
        assert_eq!(g.max_sectors_kb, 1280);
        assert_eq!(g.capacity_bytes, Some(100 * 512));
        assert!(g.source.as_ref().is_some_and(|s| s.ends_with("sdz/queue")));
    }

    #[test]
    fn missing_device_is_an_error_naming_the_path() {
        let sysfs = fake_sysfs();
        let err = Geometry::of_block_device_in(sysfs.path(), 9, 9).expect_err("missing");
        assert!(err.to_string().contains("9:9"), "{err}");
    }

    #[test]
    fn regular_file_uses_statx_alignment() {
        let tmp = tempfile::NamedTempFile::new_in(crate::testing::direct_io_dir()).expect("tmp");
        let g = Geometry::of_file(tmp.as_file(), true).expect("geometry");
        assert_eq!(g.kind, DeviceKind::File);
        assert!(g.dio_offset_align_bytes.is_power_of_two());
        assert!(g.dio_mem_align_bytes.is_power_of_two());
        assert_eq!(g.max_sectors_kb, FILE_MAX_SECTORS_KB);
        assert_eq!(g.capacity_bytes, None);
        let buffered = Geometry::of_file(tmp.as_file(), false).expect("geometry");
        assert_eq!(buffered.offset_align_bytes(), 1);
    }
}
