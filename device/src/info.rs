//! `plugio info PATH`: a human-readable description of a device or file and
//! of this kernel's io_uring.
//!
//! Invariant: describing never writes to the target (it is opened read-only)
//! and leaves no ring installed on the calling thread.

use std::fmt::Write as _;
use std::path::Path;

use crate::backend::file::OpenOptions;
use crate::error::{ErrorKind, Result};
use crate::ring::{Ring, RingConfig};

/// Describes `path`: its geometry (block sizes, queue limits, alignment,
/// capacity; see [`Geometry`](crate::Geometry)), whether `O_DIRECT` is
/// accepted, and the io_uring setup flags, features and probed opcodes of
/// this kernel (or why io_uring is unavailable).
///
/// # Errors
/// The path is not a regular file, block device or NVMe generic character
/// device (checked with `stat` first, so a FIFO is refused rather than
/// waited on; see [`check_path_kind`](crate::check_path_kind)), it cannot be
/// opened read-only, or its geometry cannot be read.
pub fn describe(path: impl AsRef<Path>) -> Result<String> {
    let path = path.as_ref();
    crate::check_path_kind(path)?;
    let mut options = OpenOptions::new();
    options.read(true).write(false);
    let (backend, direct_note) = match options.open(path) {
        Ok(b) => (b, "accepted"),
        Err(e) if *e.kind() == ErrorKind::DirectIoRefused => (
            options.direct(false).open(path)?,
            "refused by the file system (buffered IO used)",
        ),
        Err(e) => return Err(e),
    };
    let mut out = String::new();
    let _ = writeln!(out, "path:                {}", path.display());
    let _ = writeln!(out, "O_DIRECT:            {direct_note}");
    let writable = match write_refusal(path) {
        None => "yes".to_owned(),
        Some(why) => format!("no: {why}"),
    };
    let _ = writeln!(out, "writable:            {writable}");
    if let Some(len) = file_len_bytes(path) {
        // A file's capacity is not fixed (it grows as written): its
        // length now is what a read may reach.
        let _ = writeln!(out, "size:                {len} bytes");
    }
    let geometry = crate::Backend::geometry(&backend);
    let _ = writeln!(out, "{geometry}");
    if let Some(warning) = empty_device_warning(geometry.capacity_bytes, &zram_name(path)) {
        let _ = writeln!(out, "{warning}");
    }
    let _ = writeln!(out, "io_uring:");
    match Ring::new(&RingConfig::default()) {
        Ok(ring) => {
            // The ring's fields sit under their heading, their values in
            // the column of the fields above.
            for (i, (name, value)) in ring.info().fields().iter().enumerate() {
                let name = format!("{name}:");
                let newline = if i == 0 { "" } else { "\n" };
                let _ = write!(out, "{newline}  {name:<19}{value}");
            }
        }
        // Out of descriptors a runtime refuses to start (DeviceDriver::new)
        // rather than fall back.
        Err(e) if matches!(e.errno(), libc::EMFILE | libc::ENFILE) => {
            let _ = write!(out, "  unavailable ({e}); a runtime would not start");
        }
        Err(e) => {
            let _ = write!(out, "  unavailable ({e}); the sync thread pool is used");
        }
    }
    Ok(out)
}

/// The line `describe` adds under the geometry of a block device that
/// holds 0 bytes (an unsized zram device, a loop device over an empty
/// file), where every read and write is out of range: `None` for any
/// other capacity, and for a file (`None`: it grows as written).
/// `zram` is the device's name when it is a zram device, for the advice
/// to size it (found by a helper trying the README: `capacity: 0 bytes`
/// alone did not say what was wrong).
fn empty_device_warning(capacity_bytes: Option<u64>, zram: &Option<String>) -> Option<String> {
    if capacity_bytes != Some(0) {
        return None;
    }
    Some(match zram {
        Some(name) => format!(
            "warning:             it holds 0 bytes, so every read and write is out of \
             range: a zram device has no size until one is set: \
             echo 1G > /sys/block/{name}/disksize (as root)"
        ),
        None => "warning:             it holds 0 bytes, so every read and write is out of range"
            .to_owned(),
    })
}

/// The name of the zram device `path` is or links to (`"zram0"` for
/// `/dev/zram0`): a block device whose resolved name starts with `zram`.
/// `None` for anything else, a file named so included (a break-it
/// helper's finding), or a path that cannot be resolved. Used to advise
/// sizing an unsized zram device (`/sys/block/NAME/disksize`).
///
/// ```
/// assert_eq!(plugio_device::zram_name(std::path::Path::new("/dev/null")), None);
/// let dir = tempfile::tempdir()?;
/// std::fs::write(dir.path().join("zram0"), b"")?;
/// assert_eq!(plugio_device::zram_name(&dir.path().join("zram0")), None);
/// # Ok::<_, std::io::Error>(())
/// ```
pub fn zram_name(path: &Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    let real = std::fs::canonicalize(path).ok()?;
    let is_block = std::fs::metadata(&real).ok()?.file_type().is_block_device();
    let name = real.file_name()?.to_str()?;
    (is_block && name.starts_with("zram")).then(|| name.to_owned())
}

/// The length of `path` when it is a regular file (`None` for a block
/// or character device, whose capacity its geometry gives).
pub fn file_len_bytes(path: impl AsRef<Path>) -> Option<u64> {
    std::fs::metadata(path)
        .ok()
        .filter(std::fs::Metadata::is_file)
        .map(|m| m.len())
}

/// Why this process could not open `path` for writing, or `None` when it
/// could, as far as can be told without opening it for writing (which
/// has effects of its own: inotify's `IN_CLOSE_WRITE`, for one):
/// - a read-only block device (`BLKROGET`: `blockdev --setro`,
///   `losetup -r`, or a read-only disk under a partition);
/// - an immutable or append-only file (`chattr +i`, `chattr +a`:
///   plugio writes at offsets, which an append-only file refuses);
/// - a read-only file system (`EROFS`), or permission bits that refuse
///   this process's effective user (`faccessat` with `AT_EACCESS`);
/// - a program running from the file, or a swap file (`ETXTBSY`).
///
/// A regular file or block device is opened read-only and non-blocking
/// for its ioctls; anything else (a FIFO, a socket) is only `stat`ed, so
/// the call never waits.
///
/// ```
/// let tmp = tempfile::NamedTempFile::new()?;
/// assert_eq!(plugio::device::write_refusal(tmp.path()), None);
/// # Ok::<_, std::io::Error>(())
/// ```
pub fn write_refusal(path: &Path) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return Some(format!("cannot stat it ({e})")),
    };
    let kind = meta.file_type();
    if kind.is_file() || kind.is_block_device() {
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path);
        if let Ok(file) = opened {
            if let Some(why) = attribute_refusal(&file, kind.is_block_device()) {
                return Some(why);
            }
        }
    }
    if let Some(why) = access_refusal(path) {
        return Some(why);
    }
    if kind.is_file() && busy_text_or_swap(&meta) {
        return Some(
            "a running program's file or a swap file (ETXTBSY): the kernel refuses to open it \
             for writing while it runs or is in use"
                .to_owned(),
        );
    }
    None
}

/// [`write_refusal`]'s checks that need the open file: `BLKROGET` for a
/// block device, the inode's immutable and append-only flags for a file.
fn attribute_refusal(file: &std::fs::File, block_device: bool) -> Option<String> {
    use std::os::fd::AsRawFd;
    if block_device {
        return crate::backend::file::is_read_only_block_device(file).then(|| {
            "the block device is read-only (BLKROGET; `blockdev --setrw` undoes \
             `blockdev --setro`, a `losetup -r` device must be set up again, a partition \
             follows its disk)"
                .to_owned()
        });
    }
    const FS_IMMUTABLE_FL: libc::c_long = 0x10;
    const FS_APPEND_FL: libc::c_long = 0x20;
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS writes the inode's flags (an int) through
    // the pointer, which points to a live, larger local.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    if rc != 0 {
        return None;
    }
    if flags & FS_IMMUTABLE_FL != 0 {
        return Some("the file is immutable (chattr +i; `chattr -i` undoes it)".to_owned());
    }
    (flags & FS_APPEND_FL != 0).then(|| {
        "the file is append-only (chattr +a; plugio writes at offsets, which it refuses; \
         `chattr -a` undoes it)"
            .to_owned()
    })
}

/// [`write_refusal`]'s `faccessat(W_OK, AT_EACCESS)`: what the kernel's
/// permission check says for this process's effective user.
fn access_refusal(path: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return Some("the path holds a NUL byte".to_owned());
    };
    // SAFETY: faccessat only reads the NUL-terminated string, which lives
    // across the call.
    let rc = unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            libc::W_OK,
            libc::AT_EACCESS,
        )
    };
    if rc == 0 {
        return None;
    }
    let e = std::io::Error::last_os_error();
    Some(match e.raw_os_error() {
        Some(libc::EROFS) => "the file system is mounted read-only".to_owned(),
        Some(libc::EACCES) => "this user may not write it (its permission bits)".to_owned(),
        Some(libc::ETXTBSY) => "a running program's file (ETXTBSY)".to_owned(),
        _ => format!("the kernel refuses write access ({e})"),
    })
}

/// Whether a program runs from the file whose metadata is `meta` (a
/// `/proc/PID/exe` is it: exec denies writes to it) or it is an active
/// swap file (`/proc/swaps`). Only executable files are looked up in
/// `/proc`; processes this user may not see are skipped.
fn busy_text_or_swap(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let same = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino())
    };
    if let Ok(swaps) = std::fs::read_to_string("/proc/swaps") {
        let mut lines = swaps.lines().skip(1);
        if lines.any(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|p| same(Path::new(p)))
        }) {
            return true;
        }
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return false;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs
        .flatten()
        .any(|entry| is_pid(&entry.file_name()) && same(&entry.path().join("exe")))
}

/// Whether a `/proc` entry's name is a process id (digits only).
fn is_pid(name: &std::ffi::OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let b = name.as_bytes();
    !b.is_empty() && b.iter().all(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_a_file_with_geometry_and_ring() {
        let tmp = tempfile::NamedTempFile::new_in(crate::testing::direct_io_dir()).expect("tmp");
        let text = describe(tmp.path()).expect("describe");
        for needle in [
            "logical_block_size",
            "dio_mem_align",
            "max_sectors_kb",
            "supported ops",
            "writable:            yes",
            "size:                0 bytes",
        ] {
            assert!(text.contains(needle), "{needle} missing in:\n{text}");
        }
        // The ring's fields are indented under their heading, values in
        // the same column as the fields above.
        let after = text.split("io_uring:\n").nth(1).expect("io_uring heading");
        for line in after.lines() {
            assert!(line.starts_with("  "), "not indented: {line:?} in:\n{text}");
            if !line.contains("unavailable") {
                let field_end = line.find(": ").expect("a field") + 1;
                let value_at = field_end + line[field_end..].find(|c| c != ' ').unwrap_or(0);
                assert_eq!(value_at, "path:                ".len(), "{line:?}");
            }
        }
        assert!(describe("/nonexistent/plugio").is_err());
        assert!(matches!(
            describe("/dev/null").map_err(|e| e.kind().clone()),
            Err(ErrorKind::InvalidInput(
                crate::InvalidInput::PathKind { .. }
            ))
        ));
    }

    /// A block device of 0 bytes gets a warning under its geometry (with
    /// the advice to size it when it is zram); a file or a device with a
    /// size gets none. `describe` of a loop device over an empty file
    /// shows it, where root and losetup allow (skipped otherwise).
    #[test]
    fn an_empty_block_device_is_warned_about() {
        let zram = Some("zram3".to_owned());
        let w = empty_device_warning(Some(0), &zram).expect("a warning");
        assert!(w.contains("holds 0 bytes"), "{w}");
        assert!(w.contains("echo 1G > /sys/block/zram3/disksize"), "{w}");
        let w = empty_device_warning(Some(0), &None).expect("a warning");
        assert!(w.contains("out of range") && !w.contains("zram"), "{w}");
        assert_eq!(empty_device_warning(Some(4096), &zram), None);
        assert_eq!(empty_device_warning(None, &None), None);

        let dir = tempfile::tempdir().expect("dir");
        let img = dir.path().join("empty.img");
        std::fs::File::create(&img).expect("create");
        let Some(loop_dev) = losetup(&img) else {
            eprintln!("skipped the loop device: needs root and losetup");
            return;
        };
        let text = describe(&loop_dev);
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&loop_dev)
            .status();
        let text = text.expect("describe");
        assert!(text.contains("capacity:            0 bytes"), "{text}");
        assert!(
            text.contains("warning:             it holds 0 bytes"),
            "{text}"
        );
        // A regular file of 0 bytes grows as written: no warning.
        let text = describe(&img).expect("describe");
        assert!(!text.contains("warning:"), "{text}");
    }

    /// A loop device over `file` (`losetup -f --show`), or `None` without
    /// root or losetup.
    fn losetup(file: &Path) -> Option<std::path::PathBuf> {
        let out = std::process::Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .ok()?;
        let name = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !name.trim().is_empty()).then(|| name.trim().into())
    }

    /// `write_refusal` finds what `access(2)` alone missed (found by a
    /// break-it helper): a running program's file, an append-only and an
    /// immutable file (where `chattr` works here), and it never waits on
    /// a FIFO.
    #[test]
    fn write_refusal_sees_running_programs_and_attributes_and_never_waits() {
        let dir = tempfile::tempdir_in(crate::testing::direct_io_dir()).expect("dir");
        let prog = dir.path().join("busy");
        std::fs::copy("/bin/sleep", &prog).expect("copy sleep");
        assert_eq!(write_refusal(&prog), None, "not running yet");
        // Another test's fork may hold the copy's write descriptor for a
        // moment (the fork/exec race of a freshly written executable).
        let mut running = loop {
            match std::process::Command::new(&prog).arg("30").spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                other => break other.expect("run it"),
            }
        };
        let busy = write_refusal(&prog);
        let _ = running.kill();
        let _ = running.wait();
        assert!(
            busy.as_deref().is_some_and(|w| w.contains("ETXTBSY")),
            "{busy:?}"
        );

        let file = dir.path().join("attrs");
        std::fs::write(&file, [0u8; 4096]).expect("write");
        for (flag, word) in [("+a", "append-only"), ("+i", "immutable")] {
            let set = std::process::Command::new("chattr")
                .arg(flag)
                .arg(&file)
                .output();
            if !set.is_ok_and(|o| o.status.success()) {
                println!("SKIPPED: chattr {flag} does not work here");
                continue;
            }
            let why = write_refusal(&file);
            let undo = flag.replace('+', "-");
            let _ = std::process::Command::new("chattr")
                .arg(&undo)
                .arg(&file)
                .status();
            assert!(why.as_deref().is_some_and(|w| w.contains(word)), "{why:?}");
        }

        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("no NUL");
        // SAFETY: mkfifo reads the NUL-terminated path, alive across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(write_refusal(&fifo)));
        rx.recv_timeout(std::time::Duration::from_secs(20))
            .expect("write_refusal returned on a FIFO");
    }
}
