//! The benchmark's target: a file or block device given with `--filename`,
//! or a temporary file filled with random data and removed afterwards.
//!
//! Invariants: a [`Target`]'s `size_bytes` is a non-zero multiple of the
//! job's block size and no larger than the file or device; with O_DIRECT
//! the block size is a multiple of the logical block size, so every offset
//! the engines draw (multiples of `bs` below `size_bytes`) is aligned and
//! every IO is complete (never short). Every check runs before the
//! temporary file is filled (it is created empty, checked, then filled),
//! its size against the free space of its file system among them: a fill
//! never leaves less than [`TEMP_FREE_MARGIN_BYTES`] free; a SIGINT or
//! SIGTERM during the fill stops it and removes the file.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use rand::{RngCore, SeedableRng};

use super::error::BenchError;
use super::options::{Job, DEFAULT_TEMP_SIZE_BYTES};
use super::units::fmt_bytes;

/// Size of the temporary file for NOP jobs (they never touch the data).
const NOP_TEMP_SIZE_BYTES: u64 = 1 << 20;

/// Space the temporary file leaves free on its file system, at least: a
/// `--size` near or past the free space is refused before the fill rather
/// than filling the disk the machine (and the benchmark) runs on.
const TEMP_FREE_MARGIN_BYTES: u64 = 1 << 30;

/// Chunk written at a time while filling the temporary file.
const FILL_CHUNK_BYTES: usize = 1 << 20;

/// Where the IO goes.
#[derive(Debug)]
pub struct Target {
    /// The path the engines open.
    pub path: PathBuf,
    /// Bytes the engines use, from offset 0.
    pub size_bytes: u64,
    /// The logical block size (512 for files on most file systems).
    pub logical_block_bytes: u32,
    /// What the path is: "temporary file", "file" or "block device".
    pub kind: &'static str,
    /// Removes the temporary file on drop.
    _temp: Option<tempfile::TempPath>,
}

impl Drop for Target {
    /// The temporary file goes with the target (its field's drop, after
    /// this): a second signal has nothing left to remove.
    fn drop(&mut self) {
        if self._temp.is_some() {
            crate::signals::remove_on_second_signal(None);
        }
    }
}

/// Finds or creates the target of `job` and checks it against the job;
/// calls `checked` once every check has passed, before the temporary
/// file's fill (the caller's warnings go there: after a refusal they would
/// be about a run that never happens, after the fill they came late or,
/// when the fill was interrupted, never; found by a break-it helper).
///
/// # Errors
/// Missing file, too small for `--size`, O_DIRECT refused, `--bs` not a
/// multiple of the logical block size (exit code 2), or an IO error while
/// creating the temporary file (exit code 1).
pub fn prepare(job: &Job, checked: impl FnOnce()) -> Result<Target, BenchError> {
    let (path, len_bytes, kind, temp) = match &job.filename {
        Some(path) => {
            let (len, kind) = existing_len(path)?;
            // A device node lives on devtmpfs whatever the device is: only
            // a file's own file system says where its data is.
            if let Some(fs) = memory_fs(path).filter(|_| kind != "block device") {
                eprintln!(
                    "plugio: warning: {} is on {fs}: this measures memory, not a device",
                    plugio_cli::shown::path(path)
                );
            }
            (path.clone(), len, kind, None)
        }
        None => {
            let size = if job.nop {
                NOP_TEMP_SIZE_BYTES.max(job.bs_bytes)
            } else {
                job.size_bytes.unwrap_or(DEFAULT_TEMP_SIZE_BYTES)
            };
            // Empty until every check below has passed.
            let temp = create_temp()?;
            // A second signal ends plugio before its cleanup: it removes
            // the file itself.
            crate::signals::remove_on_second_signal(Some(temp.path()));
            if let Some(fs) = memory_fs(temp.path()) {
                eprintln!(
                    "plugio: warning: the temporary file {} is on {fs}: this measures memory, \
                     not a device; set TMPDIR to a directory on a disk (or run from one), or \
                     pass --filename",
                    plugio_cli::shown::path(temp.path())
                );
            }
            (
                temp.path().to_path_buf(),
                size,
                "temporary file",
                Some(temp),
            )
        }
    };
    // NOP jobs never touch the data: their small temporary file ignores
    // --size.
    let asked = if job.nop && temp.is_some() {
        None
    } else {
        job.size_bytes
    };
    let needed = asked.unwrap_or(len_bytes).max(job.bs_bytes);
    if needed > len_bytes {
        return Err(BenchError::target_too_small(path, len_bytes, needed));
    }
    let size_bytes = needed - needed % job.bs_bytes;
    // What is written to a regular file: the whole temporary file (its
    // fill), or the job's range of a given file.
    let written_bytes = match (temp.is_some(), kind, job.writes()) {
        (true, ..) => len_bytes,
        (false, "file", true) => size_bytes,
        _ => 0,
    };
    check_file_size_limit(&path, temp.is_some().then_some(job.nop), written_bytes)?;
    let logical_block_bytes = check_direct(&path, job)?;
    // Warnings only once every check passed: a refused job gets none.
    if kind == "file" && job.reads() {
        warn_if_unwritten(&path, size_bytes);
    }
    if asked.is_none() && temp.is_none() {
        if let Some(warning) = unused_tail_warning(&path, len_bytes, size_bytes, job.bs_bytes) {
            eprintln!("plugio: warning: {warning}");
        }
    }
    checked();
    let temp = match temp {
        Some(file) => {
            check_free_space(file.path(), len_bytes)?;
            Some(fill_temp(file, len_bytes, job.nop, job.quiet)?)
        }
        None => None,
    };
    Ok(Target {
        path,
        size_bytes,
        logical_block_bytes,
        kind,
        _temp: temp,
    })
}

/// The warning for a given target used whole (no `--size`) whose length
/// is not a multiple of `--bs`: the job's range ends at the last whole
/// block, and the header shows that range, so without it the target's
/// tail went unused without a word (found by a helper trying the
/// README). `None` when nothing is left over. A `--size` off the block
/// size is warned of by `limits::check`.
fn unused_tail_warning(
    path: &Path,
    len_bytes: u64,
    size_bytes: u64,
    bs_bytes: u64,
) -> Option<String> {
    let tail_bytes = len_bytes.checked_sub(size_bytes).filter(|&t| t > 0)?;
    Some(format!(
        "{} holds {len_bytes} bytes, not a multiple of --bs {}: the job uses its first \
         {size_bytes} bytes and never reads or writes the last {tail_bytes}",
        plugio_cli::shown::path(path),
        fmt_bytes(bs_bytes),
    ))
}

/// Below this share of data in the job's range of a given file, the bench
/// warns that its reads measure holes (percent).
const WRITTEN_WARN_PCT: u64 = 90;

/// Most extents [`written_bytes`] walks (about 0.1 s); past them the share
/// of data in the part walked stands for the rest (a file of 70,000 data
/// runs, 1 % data, got no warning when the walk gave up; found by a
/// break-it helper).
const MAX_EXTENTS_WALKED: usize = 65_536;

/// Warns when less than [`WRITTEN_WARN_PCT`] of `path`'s first
/// `size_bytes` hold data: holes and unwritten extents (a `truncate`d or
/// `fallocate`d file never written) read as zeros without touching the
/// disk, so a read job there measures the file system, not the device
/// (a new-user helper measured 1.2 M IOPS on a fallocated file against
/// 85 K once it was written).
fn warn_if_unwritten(path: &Path, size_bytes: u64) {
    // A file on tmpfs or ramfs is already warned about as memory.
    if memory_fs(path).is_some() {
        return;
    }
    let Some((data, exact)) = File::open(path)
        .ok()
        .and_then(|f| written_bytes(&f, size_bytes))
    else {
        return;
    };
    if size_bytes == 0 || data.saturating_mul(100) >= size_bytes.saturating_mul(WRITTEN_WARN_PCT) {
        return;
    }
    let shown = plugio_cli::shown::path(path);
    eprintln!(
        "plugio: warning: only {}{}% of the first {} bytes of {shown} hold data; the rest are \
         holes or unwritten extents (never written), which read as zeros without touching the \
         disk: fill it first (for instance `dd if=/dev/urandom of={shown} bs=1M count={} \
         conv=notrunc`)",
        if exact { "" } else { "about " },
        data.saturating_mul(100) / size_bytes,
        size_bytes,
        size_bytes.div_ceil(1 << 20),
    );
}

/// Bytes of `file`'s first `len_bytes` that hold data, by `SEEK_DATA` and
/// `SEEK_HOLE` (unwritten extents count as holes on ext4, XFS and btrfs
/// unless cached), and whether the count is exact: past
/// [`MAX_EXTENTS_WALKED`] data runs it is the share of the part walked,
/// scaled to the whole. `None` when the file system cannot say.
fn written_bytes(file: &File, len_bytes: u64) -> Option<(u64, bool)> {
    written_bytes_walking(file, len_bytes, MAX_EXTENTS_WALKED)
}

/// [`written_bytes`] walking at most `max_runs` data runs.
fn written_bytes_walking(file: &File, len_bytes: u64, max_runs: usize) -> Option<(u64, bool)> {
    use nix::unistd::{lseek, Whence};
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let len = i64::try_from(len_bytes).ok()?;
    let (mut at, mut data) = (0i64, 0u64);
    for _ in 0..max_runs {
        if at >= len {
            return Some((data, true));
        }
        let start = match lseek(fd, at, Whence::SeekData) {
            Ok(s) => s,
            // No data at or after `at`.
            Err(nix::errno::Errno::ENXIO) => return Some((data, true)),
            Err(_) => return None,
        };
        if start >= len {
            return Some((data, true));
        }
        let end = lseek(fd, start, Whence::SeekHole).ok()?.min(len);
        data += end.saturating_sub(start) as u64;
        at = end.max(start + 1);
    }
    // `at` > 0 here: each step moved it forward.
    let scaled = u128::from(data) * u128::from(len_bytes) / (at as u128);
    Some((u64::try_from(scaled).unwrap_or(len_bytes), false))
}

/// The size and kind of an existing file or block device.
fn existing_len(path: &Path) -> Result<(u64, &'static str), BenchError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(BenchError::MissingTarget {
                path: path.to_path_buf(),
            })
        }
        Err(e) => {
            return Err(BenchError::io(
                format!("stat {}", plugio_cli::shown::path(path)),
                e,
            ))
        }
    };
    if plugio_device::is_passthrough_path(path) {
        let ns = plugio_device::backend::nvme::NvmeBackend::open(path).map_err(|e| {
            BenchError::engine(
                "plugio",
                format!("open {}: {e}", plugio_cli::shown::path(path)),
            )
        })?;
        let info = ns.info();
        Ok((
            info.nsze_blocks << info.lba_shift,
            "NVMe passthrough namespace",
        ))
    } else if meta.file_type().is_block_device() {
        let mut f = File::open(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EACCES | libc::EPERM) => unreadable(path),
            _ => BenchError::io(format!("open {}", plugio_cli::shown::path(path)), e),
        })?;
        let len = f
            .seek(SeekFrom::End(0))
            .map_err(|e| BenchError::io(format!("size of {}", plugio_cli::shown::path(path)), e))?;
        Ok((len, "block device"))
    } else if meta.is_file() {
        Ok((meta.len(), "file"))
    } else {
        Err(BenchError::usage(format!(
            "{} is {}: pass a regular file, a block device or an NVMe generic character \
             device (/dev/ngXnY) to --filename",
            plugio_cli::shown::path(path),
            plugio_device::path_kind::describe(path).unwrap_or("neither a file nor a device")
        )))
    }
}

/// A target this user may not read: bad input (exit 2), as a writing job
/// on a target it may not write is.
fn unreadable(path: &Path) -> BenchError {
    BenchError::usage(format!(
        "{} cannot be read (permission denied): {}",
        plugio_cli::shown::path(path),
        plugio_cli::permission_hint(nix::unistd::geteuid().is_root())
    ))
}

/// Opens the target as the engines will and returns its logical block
/// size, checking O_DIRECT and `--bs` alignment when `job.direct`.
fn check_direct(path: &Path, job: &Job) -> Result<u32, BenchError> {
    if plugio_device::is_passthrough_path(path) {
        // NVMe passthrough has no page cache to bypass: the LBA size is
        // the alignment.
        let ns = plugio_device::backend::nvme::NvmeBackend::open(path).map_err(|e| {
            BenchError::engine(
                "plugio",
                format!("open {}: {e}", plugio_cli::shown::path(path)),
            )
        })?;
        let lbs = 1u32 << ns.info().lba_shift;
        if job.bs_bytes % u64::from(lbs) != 0 {
            return Err(BenchError::Misaligned {
                bs_bytes: job.bs_bytes,
                logical_block_bytes: lbs,
            });
        }
        return Ok(lbs);
    }
    let mut opts = OpenOptions::new();
    // As the engines will: a job that writes needs write access.
    opts.read(true).write(job.writes());
    if job.direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = match opts.open(path) {
        Ok(f) => f,
        Err(e) if job.direct && e.raw_os_error() == Some(libc::EINVAL) => {
            return Err(BenchError::DirectRefused {
                path: path.to_path_buf(),
            })
        }
        Err(e)
            if job.writes()
                && matches!(
                    e.raw_os_error(),
                    Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ETXTBSY)
                ) =>
        {
            return Err(BenchError::NotWritable {
                path: path.to_path_buf(),
                rw: job.rw.name(),
                source: e,
            })
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
            return Err(unreadable(path));
        }
        Err(e) => {
            return Err(BenchError::io(
                format!("open {}", plugio_cli::shown::path(path)),
                e,
            ))
        }
    };
    // Linux opens a read-only block device for writing and fails each
    // write; the engines refuse the open (plugio) or fail at the first
    // write (the peers), so it is refused here for all of them.
    if job.writes() && plugio_device::backend::file::is_read_only_block_device(&file) {
        return Err(BenchError::NotWritable {
            path: path.to_path_buf(),
            rw: job.rw.name(),
            source: io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                plugio_cli::READ_ONLY_DEVICE,
            ),
        });
    }
    let geometry = plugio_device::Geometry::of_file(&file, job.direct).map_err(|e| {
        BenchError::engine(
            "plugio",
            format!("geometry of {}: {e}", plugio_cli::shown::path(path)),
        )
    })?;
    let lbs = geometry.logical_block_bytes.max(1);
    if job.direct && job.bs_bytes % u64::from(lbs) != 0 {
        return Err(BenchError::Misaligned {
            bs_bytes: job.bs_bytes,
            logical_block_bytes: lbs,
        });
    }
    Ok(lbs)
}

/// The memory file system `path` is on (tmpfs, ramfs), if it is on one.
fn memory_fs(path: &Path) -> Option<&'static str> {
    use nix::sys::statfs::{statfs, FsType, TMPFS_MAGIC};
    // linux/magic.h's RAMFS_MAGIC (neither nix nor libc names it); the
    // cast keeps its bits whatever the width of the platform's f_type.
    const RAMFS_MAGIC: FsType = FsType(0x8584_58f6_u32 as _);
    match statfs(path).ok()?.filesystem_type() {
        TMPFS_MAGIC => Some("tmpfs"),
        RAMFS_MAGIC => Some("ramfs"),
        _ => None,
    }
}

/// The directory for the temporary file: the system temp directory unless
/// it is in memory (tmpfs, ramfs: a file there would measure memory, not
/// a device), else the current directory.
fn temp_dir() -> PathBuf {
    let tmp = std::env::temp_dir();
    if memory_fs(&tmp).is_some() {
        std::env::current_dir().unwrap_or(tmp)
    } else {
        tmp
    }
}

/// Creates the (empty) temporary file, removed when dropped.
fn create_temp() -> Result<tempfile::NamedTempFile, BenchError> {
    let dir = temp_dir();
    tempfile::Builder::new()
        .prefix("plugio-bench-")
        .tempfile_in(&dir)
        .map_err(|e| {
            BenchError::io(
                format!(
                    "creating a temporary file in {}",
                    plugio_cli::shown::path(&dir)
                ),
                e,
            )
        })
}

/// Refuses a temporary file of `size_bytes` at `path` that would leave
/// less than [`TEMP_FREE_MARGIN_BYTES`] free on its file system (the
/// blocks an unprivileged process may use, `statvfs`'s `f_bavail`), or,
/// on a memory file system (tmpfs, ramfs: its pages are memory, and its
/// own size may exceed what the machine has), of the memory files may
/// still take there ([`plugio_cli::machine::memory_for_files`]). A file
/// system that cannot say is not checked.
///
/// # Errors
/// [`BenchError::TooBig`] (exit code 2), naming the sizes and what to
/// change.
fn check_free_space(path: &Path, size_bytes: u64) -> Result<(), BenchError> {
    let Ok(st) = nix::sys::statvfs::statvfs(path) else {
        return Ok(());
    };
    // The widths of fsblkcnt_t and c_ulong differ between platforms.
    #[allow(clippy::useless_conversion)]
    let free_bytes = u64::from(st.blocks_available()).saturating_mul(u64::from(st.fragment_size()));
    let memory = memory_fs(path).and_then(|fs| {
        let (bytes, source) = plugio_cli::machine::memory_for_files()?;
        Some((bytes, fs, source))
    });
    let (room_bytes, memory) = room_bytes(free_bytes, memory);
    if size_bytes.saturating_add(TEMP_FREE_MARGIN_BYTES) <= room_bytes {
        return Ok(());
    }
    let dir = plugio_cli::shown::path(path.parent().unwrap_or(path));
    let free = match memory {
        Some((fs, source)) => format!(
            "the {} of memory left ({source}) where {dir} is on {fs}",
            super::units::human(room_bytes)
        ),
        None => format!("the {} free in {dir}", super::units::human(room_bytes)),
    };
    Err(BenchError::TooBig(format!(
        "a temporary file of {} (--size) would leave less than {} of {free}: \
         lower --size, or pass a file or block device that large with --filename",
        super::units::human(size_bytes),
        super::units::human(TEMP_FREE_MARGIN_BYTES),
    )))
}

/// The room for a temporary file: the file system's free bytes, or the
/// memory left where the file system is in memory (`memory`: the bytes,
/// the file system's name and where the figure comes from) and that is
/// less; with the name and source when memory is the limit.
fn room_bytes(
    free_bytes: u64,
    memory: Option<(u64, &'static str, &'static str)>,
) -> (u64, Option<(&'static str, &'static str)>) {
    match memory {
        // ramfs has no size: it says 0 free, and only memory bounds it.
        Some((bytes, fs, source)) if bytes < free_bytes || fs == "ramfs" => {
            (bytes, Some((fs, source)))
        }
        _ => (free_bytes, None),
    }
}

/// Refuses a job that writes a regular file up to `written_bytes` past
/// the process's file size limit (`RLIMIT_FSIZE`, `ulimit -f`): the
/// kernel refuses such a write and sends `SIGXFSZ`, which ended the
/// process (the fill of the temporary file, or a peer engine's write),
/// with no word of why. `temp_nop`: `None` for a given file, else whether
/// the temporary file is a NOP job's (its size is fixed, not `--size`).
///
/// # Errors
/// [`BenchError::TooBig`] (exit code 2), naming the sizes in bytes and
/// what to change.
fn check_file_size_limit(
    path: &Path,
    temp_nop: Option<bool>,
    written_bytes: u64,
) -> Result<(), BenchError> {
    let Some(limit_bytes) = plugio_cli::machine::file_size_limit_bytes() else {
        return Ok(());
    };
    if written_bytes <= limit_bytes {
        return Ok(());
    }
    // KiB below a MiB: a limit of 64 KiB is not "0.1 MiB".
    let short = |n: u64| {
        if n < 1 << 20 {
            format!("{:.1} KiB", n as f64 / 1024.0)
        } else {
            super::units::human(n)
        }
    };
    let bytes = |n: u64| format!("{n} bytes ({})", short(n));
    let (what, change) = match temp_nop {
        Some(true) => (
            format!("the NOP job's temporary file of {}", bytes(written_bytes)),
            "pass a file with --filename",
        ),
        Some(false) => (
            format!(
                "the temporary file of {written_bytes} bytes ({}, --size)",
                short(written_bytes)
            ),
            "lower --size, or pass a file or block device with --filename",
        ),
        None => (
            format!(
                "the job's writes to the first {} of {}",
                bytes(written_bytes),
                plugio_cli::shown::path(path)
            ),
            "lower --size, or pass a block device with --filename",
        ),
    };
    Err(BenchError::TooBig(format!(
        "{what} would pass this process's file size limit (RLIMIT_FSIZE, `ulimit -f`) of {}, \
         where the kernel ends the process (SIGXFSZ): raise the limit (`ulimit -f unlimited`), \
         or {change}",
        bytes(limit_bytes)
    )))
}

/// Fills the temporary file with `size_bytes` of random data (zeros for
/// NOP jobs), written through the page cache and synced so later O_DIRECT
/// reads find it on the disk.
///
/// # Errors
/// [`BenchError::InterruptedBeforeRun`] when SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2 or SIGXCPU came during the fill
/// (the file is removed), or the write error.
fn fill_temp(
    mut file: tempfile::NamedTempFile,
    size_bytes: u64,
    zeros: bool,
    quiet: bool,
) -> Result<tempfile::TempPath, BenchError> {
    let dir = file
        .path()
        .parent()
        .map_or_else(PathBuf::new, Path::to_path_buf);
    let ctx = |what: &str| {
        format!(
            "{what} a temporary file in {}",
            plugio_cli::shown::path(&dir)
        )
    };
    let bar = if quiet || zeros {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(size_bytes)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(format!("filling {}", plugio_cli::shown::path(file.path())));
    let mut rng = rand::rngs::SmallRng::from_entropy();
    let mut chunk = vec![0u8; FILL_CHUNK_BYTES];
    let mut left = size_bytes;
    while left > 0 {
        if let Some(sig) = crate::signals::interrupted() {
            bar.finish_and_clear();
            // Said here: the run's own message comes with its summary,
            // and there is none (found by a break-it helper: the command
            // ended silently). Ignored when stderr is gone (SIGHUP).
            let e = BenchError::InterruptedBeforeRun(sig);
            let _ = writeln!(std::io::stderr(), "plugio: {e}");
            // Dropping `file` removes it.
            return Err(e);
        }
        let n = left.min(FILL_CHUNK_BYTES as u64) as usize;
        if !zeros {
            rng.fill_bytes(&mut chunk[..n]);
        }
        file.write_all(&chunk[..n])
            .map_err(|e| BenchError::io(ctx("filling"), e))?;
        left -= n as u64;
        bar.inc(n as u64);
    }
    file.as_file()
        .sync_data()
        .map_err(|e| BenchError::io(ctx("syncing"), e))?;
    bar.finish_and_clear();
    Ok(file.into_temp_path())
}

#[cfg(test)]
mod tests {
    use super::{room_bytes, written_bytes, written_bytes_walking};

    /// A file of more data runs than the walk takes gets the share of the
    /// part walked, marked as an estimate (it got no count at all, so a
    /// 1 %-data file of 70,000 runs was not warned about). Skipped where
    /// the file system reports holes as data.
    #[test]
    fn a_file_of_more_runs_than_the_walk_gets_an_estimate() {
        use std::os::unix::fs::FileExt;
        let f = tempfile::tempfile().expect("a temporary file");
        let runs = 400;
        let len = runs * 16384;
        f.set_len(len).expect("set_len");
        let Some((0, true)) = written_bytes(&f, len) else {
            eprintln!("skipped: this file system reports holes as data");
            return;
        };
        for i in 0..runs {
            f.write_all_at(&[1u8; 4096], i * 16384)
                .expect("a 4 KiB run");
        }
        assert_eq!(written_bytes(&f, len), Some((runs * 4096, true)));
        let (data, exact) = written_bytes_walking(&f, len, 100).expect("a count");
        assert!(!exact, "more runs than the walk takes");
        let pct = data * 100 / len;
        assert!((20..=30).contains(&pct), "{pct}% of data, 25% written");
        let (few, exact) = written_bytes_walking(&f, 100 * 16384, 200).expect("a count");
        assert!(exact && few == 100 * 4096, "{few}");
    }

    /// On a memory file system the memory left bounds the temporary file
    /// where it is below the file system's own free space (a tmpfs may be
    /// sized past the machine's memory); elsewhere the free space does.
    #[test]
    fn the_room_on_a_memory_file_system_is_the_smaller_of_its_space_and_the_memory() {
        let gib = 1u64 << 30;
        let memory = |bytes| Some((bytes, "tmpfs", "MemAvailable"));
        assert_eq!(
            room_bytes(23 * gib, memory(18 * gib)),
            (18 * gib, Some(("tmpfs", "MemAvailable")))
        );
        assert_eq!(room_bytes(4 * gib, memory(18 * gib)), (4 * gib, None));
        assert_eq!(room_bytes(23 * gib, None), (23 * gib, None));
        // ramfs says 0 free (found by a break-it helper: every size was
        // refused there).
        assert_eq!(
            room_bytes(0, Some((18 * gib, "ramfs", "MemAvailable"))),
            (18 * gib, Some(("ramfs", "MemAvailable")))
        );
    }
}
