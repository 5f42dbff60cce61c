//! A file on tmpfs: `O_DIRECT` is refused with a clear error, or (Linux
//! 6.6+) works. The op suite, end-of-file reads and dropped futures on a
//! real file run in every ring configuration in `tests/matrix.rs`.

mod common;

use std::path::Path;

use plugio_device::testing::block_on;
use plugio_device::{DeviceDriver, DmaBuf, ErrorKind, File, OpenOptions, RingConfig};

use common::pattern;

fn filled(file: &File, len: usize, seed: u64) -> DmaBuf {
    let mut b = file.alloc_buf(len);
    b.as_mut_slice().copy_from_slice(&pattern(len, seed));
    b
}

#[test]
fn tmpfs_direct_io_is_refused_clearly_or_works() {
    let path = std::path::Path::new("/dev/shm").join(format!("plugio-shm-{}", std::process::id()));
    let result = File::open_with(&path, OpenOptions::new().create(true));
    match result {
        Err(e) => {
            assert_eq!(*e.kind(), ErrorKind::DirectIoRefused);
            let text = e.to_string();
            assert!(
                text.contains("plugio-shm") && text.contains("direct(false)"),
                "{text}"
            );
            let buffered = File::open_with(&path, OpenOptions::new().create(true).direct(false));
            assert!(buffered.is_ok(), "buffered open works");
        }
        Ok(file) => {
            // Linux >= 6.6 tmpfs accepts O_DIRECT: then IO must simply work.
            let driver = DeviceDriver::with_ring(&RingConfig::default()).expect("ring");
            block_on(&driver, async {
                let (r, _) = file.write_at(filled(&file, 4096, 12), 0).await;
                assert_eq!(r.expect("write"), 4096);
                let (r, buf) = file.read_at(file.alloc_buf(4096), 0).await;
                assert_eq!(r.expect("read"), 4096);
                assert_eq!(buf.as_slice(), &pattern(4096, 12)[..]);
            });
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// The device crate's own open refuses what is neither a file nor a
/// device before opening it, as `plugio::Device::open` does: a FIFO
/// opened read-only blocked in `open(2)` until a writer came (forever), a
/// read-write one opened and its reads hung, a directory opened with a
/// made-up geometry, `/dev/null` opened as a file, and with `O_DIRECT`
/// each was "refused O_DIRECT: open it buffered", advice that led to the
/// hang. A descriptor handed to `FileBackend::from_fd` is checked too.
#[test]
fn opens_refuse_fifos_directories_and_character_devices_before_opening() {
    use plugio_device::{FileBackend, InvalidInput};
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let fifo = dir.path().join("p");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let cases = [
        (fifo.clone(), "a FIFO"),
        (dir.path().to_path_buf(), "a directory"),
        ("/dev/null".into(), "a character device"),
    ];
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for (path, found) in cases {
            for (read_only, direct) in [(true, false), (false, false), (false, true)] {
                let mut o = OpenOptions::new();
                o.direct(direct);
                o.write(!read_only);
                let got = File::open_with(&path, &o).map(drop);
                tx.send((path.clone(), found, got)).expect("send");
            }
        }
    });
    for _ in 0..9 {
        let (path, found, got) = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("each open returns (a FIFO's open blocked forever)");
        let e = got.expect_err("refused");
        assert!(
            matches!(e.kind(), ErrorKind::InvalidInput(InvalidInput::PathKind { found: f }) if f.starts_with(found)),
            "{}: {e}",
            path.display()
        );
        assert!(e.to_string().contains("use a regular file"), "{e}");
    }
    // A descriptor of a pipe, or of a character device, handed over as a
    // file.
    let (r, _w) = nix::unistd::pipe().expect("pipe");
    let e = FileBackend::from_fd(r, &fifo, false, plugio_device::BackendKind::Uring)
        .expect_err("a pipe is refused");
    assert!(e.to_string().contains("a FIFO"), "{e}");
    let null = std::fs::File::open("/dev/null").expect("/dev/null");
    let e = FileBackend::from_fd(
        null.into(),
        Path::new("/dev/null"),
        false,
        plugio_device::BackendKind::Sync,
    )
    .expect_err("a character device is refused");
    assert!(e.to_string().contains("a character device"), "{e}");
    // A descriptor of a regular file opened with O_PATH, whose IO would
    // fail with EBADF.
    use std::os::unix::fs::OpenOptionsExt;
    let plain = dir.path().join("plain");
    std::fs::write(&plain, [0u8; 4096]).expect("write");
    let o_path = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(&plain)
        .expect("open O_PATH");
    let e = FileBackend::from_fd(
        o_path.into(),
        &plain,
        false,
        plugio_device::BackendKind::Uring,
    )
    .expect_err("an O_PATH descriptor is refused");
    assert!(
        matches!(
            e.kind(),
            ErrorKind::InvalidInput(InvalidInput::OpenFlags { .. })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("O_PATH"), "{e}");
    // A name that looks like an NVMe namespace's is not opened as a file.
    let ng = dir.path().join("ng0n1");
    std::os::unix::fs::symlink("/dev/null", &ng).expect("symlink");
    let e = File::open_with(&ng, OpenOptions::new().direct(false)).expect_err("refused");
    assert_eq!(*e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("NvmeBackend"), "{e}");
}

/// A `File` read or write longer than the kernel moves in one call
/// (`MAX_RW_BYTES`) is refused with the limit, where it came back short,
/// which a caller reads as the end of the file; a range past the kernel's
/// largest offset is a typed `Range` error, where it was a bare `EINVAL`.
/// Nothing is submitted and the buffer comes back.
#[test]
fn file_ops_past_the_kernels_limits_are_refused_before_submission() {
    use plugio_device::{InvalidInput, MAX_RW_BYTES};
    let driver = DeviceDriver::new(&RingConfig::default()).expect("driver");
    let tmp = common::temp_file();
    let file = File::open_with(tmp.path(), OpenOptions::new().direct(false)).expect("open");
    block_on(&driver, async {
        // Alignment 1: calloc's lazily zeroed pages, nothing touched.
        let big = DmaBuf::heap(MAX_RW_BYTES as usize + 4096, 1);
        let (r, back) = file.read_at(big, 0).await;
        let e = r.expect_err("refused");
        assert!(
            matches!(e.kind(), ErrorKind::InvalidInput(InvalidInput::Length { max_bytes, .. }) if *max_bytes == MAX_RW_BYTES),
            "{e}"
        );
        assert_eq!(
            back.len(),
            MAX_RW_BYTES as usize + 4096,
            "the buffer back whole"
        );
        let (r, _) = file
            .write_at(filled(&file, 4096, 1), i64::MAX as u64 - 100)
            .await;
        let e = r.expect_err("refused");
        assert!(
            matches!(
                e.kind(),
                ErrorKind::InvalidInput(InvalidInput::Range { .. })
            ),
            "{e}"
        );
        assert!(e.to_string().contains("largest file offset"), "{e}");
        // Within the limits the file takes IO as before.
        let (r, _) = file.write_at(filled(&file, 4096, 2), 0).await;
        assert_eq!(r.expect("write"), 4096);
    });
}

/// A file's zeroing op is known at open (an `O_TMPFILE` probe in its
/// directory): ext4 has `FALLOC_FL_ZERO_RANGE`, tmpfs has not, so the
/// engine can write zeroes in the op's place in program order.
#[test]
fn a_files_zeroing_op_is_probed_at_open() {
    use plugio_device::Backend;
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("disk temp dir");
    let mut cases = vec![(disk, Some(true))];
    match tempfile::tempdir_in("/dev/shm") {
        Ok(d) => cases.push((d, Some(false))),
        Err(e) => eprintln!("no /dev/shm here ({e}): tmpfs not tested"),
    }
    let tmpfs_file = cases.get(1).map(|(d, _)| d.path().join("probed"));
    for (dir, want) in &cases {
        let path = dir.path().join("probed");
        std::fs::write(&path, [0u8; 4096]).expect("write");
        let f = plugio_device::backend::file::OpenOptions::new()
            .direct(false)
            .open(&path)
            .expect("open");
        assert_eq!(f.write_zeroes_support(), *want, "{}", path.display());
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("read_dir").collect();
        assert_eq!(left.len(), 1, "the probe leaves nothing in the directory");
    }
    // A link on the disk to a file on tmpfs is probed where the file
    // lives (it was probed beside the link: unknown, out of order).
    if let Some(target) = tmpfs_file {
        let link = cases[0].0.path().join("link-to-tmpfs");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let f = plugio_device::backend::file::OpenOptions::new()
            .direct(false)
            .open(&link)
            .expect("open");
        assert_eq!(f.write_zeroes_support(), Some(false), "{}", link.display());
    }
    // A read-only open is not probed: its writes fail whatever the file
    // system can do, and the probe's four syscalls are saved.
    for (dir, _) in &cases {
        let path = dir.path().join("probed");
        let f = plugio_device::backend::file::OpenOptions::new()
            .direct(false)
            .write(false)
            .open(&path)
            .expect("open read-only");
        assert_eq!(f.write_zeroes_support(), None, "{}", path.display());
    }
}
