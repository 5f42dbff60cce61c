//! File-level operations (OpenOptions, set_len, fallocate, rename,
//! remove_file, remove_dir, create_dir_all, sync_dir, metadata, sync_all,
//! sync_data) on ext4 (a directory under the target dir, on the disk) and
//! tmpfs (/dev/shm), each through io_uring (a core with a ring: the kernel
//! here has every opcode) and through the blocking pool (a core whose
//! driver has no ring).

mod common;

use std::path::{Path, PathBuf};

use plugio_device::fs_ops::{last_path, OpPath};
use plugio_device::{DeviceDriver, ErrorKind, InvalidInput, RingConfig};
use plugio_engine::{fs, FallocateMode, OpenOptions};
use plugio_executor::LocalExecutor;

fn with_ring() -> LocalExecutor {
    plugio_engine::runtime::local(RingConfig::default()).expect("runtime")
}

fn without_ring() -> LocalExecutor {
    LocalExecutor::builder()
        .driver(|_| Ok(Box::new(DeviceDriver::without_ring()?)))
        .build()
        .expect("ring-less runtime")
}

/// Asserts the last file operation went the `want` way.
fn went(want: OpPath, what: &str) {
    assert_eq!(last_path(), Some(want), "{what}");
}

/// Every operation on `dir` (whose file system is `fs_name`), checking
/// each went the `path` way.
async fn every_operation(dir: PathBuf, fs_name: &str, path: OpPath) {
    let tmpfs = fs_name == "tmpfs";
    let file = dir.join("data.db");
    // Open: create, O_DIRECT where the file system takes it (tmpfs does
    // since Linux 6.6; before, the open says to open buffered).
    let direct = OpenOptions::new().create(true).open(&file).await;
    went(path, "open");
    let dev = match direct {
        Ok(dev) => dev,
        Err(e) => {
            assert!(tmpfs, "{fs_name}: {e}");
            assert_eq!(*e.kind(), ErrorKind::DirectIoRefused, "{e}");
            OpenOptions::new()
                .create(true)
                .direct(false)
                .open(&file)
                .await
                .expect("buffered open")
        }
    };
    // Write, sync_data, sync_all.
    let (r, _) = dev.write_all_at(vec![7u8; 8192], 0).await;
    r.expect("write");
    dev.sync_data().await.expect("sync_data");
    dev.sync_all().await.expect("sync_all");
    // metadata of the device and of the path.
    let meta = dev.metadata().await.expect("Device::metadata");
    went(path, "statx of the descriptor");
    assert!(meta.is_file());
    assert_eq!(meta.len_bytes, 8192);
    let by_path = fs::metadata(&file).await.expect("fs::metadata");
    went(path, "statx of the path");
    assert_eq!((by_path.ino, by_path.len_bytes), (meta.ino, 8192));
    // set_len: extend (a hole), then cut.
    dev.set_len(1 << 20).await.expect("set_len up");
    went(path, "ftruncate");
    assert_eq!(dev.metadata().await.expect("meta").len_bytes, 1 << 20);
    let (r, buf) = dev.read_exact_at(vec![1u8; 4096], 65536).await;
    r.expect("read the hole");
    assert!(buf.iter().all(|&b| b == 0), "a hole reads as zeroes");
    dev.set_len(4096).await.expect("set_len down");
    assert_eq!(dev.metadata().await.expect("meta").len_bytes, 4096);
    // fallocate: allocate (grows), keep size, zero range (tmpfs: written
    // zeroes), punch hole.
    dev.fallocate(0, 65536, FallocateMode::Allocate)
        .await
        .expect("allocate");
    let m = dev.metadata().await.expect("meta");
    assert_eq!(m.len_bytes, 65536);
    assert!(m.blocks_512 >= 128, "allocated: {} blocks", m.blocks_512);
    dev.fallocate(65536, 65536, FallocateMode::AllocateKeepSize)
        .await
        .expect("allocate, keep size");
    assert_eq!(dev.metadata().await.expect("meta").len_bytes, 65536);
    let (r, _) = dev.write_all_at(vec![9u8; 8192], 8192).await;
    r.expect("write");
    dev.fallocate(8192, 4096, FallocateMode::ZeroRange)
        .await
        .expect("zero range");
    dev.fallocate(12288, 4096, FallocateMode::PunchHole)
        .await
        .expect("punch hole");
    let (r, buf) = dev.read_exact_at(vec![1u8; 8192], 8192).await;
    r.expect("read back");
    assert!(buf.iter().all(|&b| b == 0), "zeroed and punched");
    // Truncate on open, read-only.
    drop(dev);
    let dev = OpenOptions::new()
        .truncate(true)
        .direct(false)
        .open(&file)
        .await
        .expect("truncate");
    assert_eq!(dev.metadata().await.expect("meta").len_bytes, 0);
    drop(dev);
    let ro = OpenOptions::new()
        .read_only(true)
        .direct(false)
        .open(&file)
        .await
        .expect("read-only");
    let (r, _) = ro.write_at(vec![1u8; 512], 0).await;
    assert_eq!(
        *r.expect_err("read-only").kind(),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        *ro.set_len(0).await.expect_err("read-only").kind(),
        ErrorKind::PermissionDenied
    );
    drop(ro);
    // Refused paths: missing without create, a directory.
    let missing = OpenOptions::new()
        .direct(false)
        .open(dir.join("missing"))
        .await;
    assert_eq!(*missing.expect_err("missing").kind(), ErrorKind::NotFound);
    let a_dir = OpenOptions::new().direct(false).open(&dir).await;
    assert!(matches!(
        a_dir.expect_err("a directory").kind(),
        ErrorKind::InvalidInput(InvalidInput::PathKind {
            found: "a directory"
        })
    ));
    // Directories.
    let deep = dir.join("a/b/c");
    fs::create_dir_all(&deep).await.expect("create_dir_all");
    went(path, "mkdir");
    fs::create_dir_all(&deep)
        .await
        .expect("again: already there");
    assert!(fs::metadata(&deep).await.expect("meta").is_dir());
    let blocked = fs::create_dir_all(file.join("sub")).await;
    assert!(blocked.is_err(), "a file in the way");
    // rename + sync_dir, remove_file, remove_dir.
    let moved = deep.join("moved.db");
    fs::rename(&file, &moved).await.expect("rename");
    went(path, "rename");
    fs::sync_dir(&deep).await.expect("sync_dir");
    went(path, "fsync of the directory");
    fs::sync_dir(&dir).await.expect("sync_dir");
    assert_eq!(
        *fs::metadata(&file).await.expect_err("moved away").kind(),
        ErrorKind::NotFound
    );
    fs::remove_file(&moved).await.expect("remove_file");
    went(path, "unlink");
    assert!(fs::metadata(&moved).await.is_err());
    fs::remove_dir(&deep).await.expect("remove_dir");
    assert!(fs::metadata(&deep).await.is_err());
    let err = fs::remove_file(&moved).await.expect_err("gone");
    assert_eq!(*err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("moved.db"), "{err}");
}

fn run_everywhere(ex: fn() -> LocalExecutor, path: OpPath) {
    for (name, dir) in common::fs_dirs() {
        let root: &Path = dir.path();
        ex().run(every_operation(root.to_path_buf(), name, path));
    }
}

#[test]
fn every_file_operation_through_io_uring_on_ext4_and_tmpfs() {
    run_everywhere(with_ring, OpPath::Ring);
}

#[test]
fn every_file_operation_through_the_blocking_pool_on_ext4_and_tmpfs() {
    run_everywhere(without_ring, OpPath::Blocking);
}

/// A file to create in a directory this user may not write says the
/// directory is the problem (it said only "permission denied" with the
/// file's path). Run as `nobody` in a forked child; skipped without root.
#[test]
fn creating_a_file_in_a_directory_that_refuses_it_says_so() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: switching to another user needs root");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let file = dir.path().join("new.db");
    let report = plugio_device::testing::in_forked_child(30, || {
        // SAFETY: setuid changes this (single-threaded) child's user only.
        if unsafe { libc::setuid(65534) } != 0 {
            return Err("setuid".into());
        }
        let e = with_ring()
            .run(OpenOptions::new().create(true).direct(false).open(&file))
            .map(drop)
            .expect_err("the directory is root's");
        let shown = e.to_string();
        if *e.kind() != ErrorKind::PermissionDenied
            || !shown.contains("the directory refuses a new file")
        {
            return Err(shown);
        }
        // The blocking open says it too (it gave only the file's path).
        let e = plugio_device::OpenOptions::new()
            .create(true)
            .direct(false)
            .open(&file)
            .map(drop)
            .expect_err("the directory is root's");
        let shown = e.to_string();
        if *e.kind() == ErrorKind::PermissionDenied
            && shown.contains("the directory refuses a new file")
        {
            Ok(())
        } else {
            Err(format!("blocking open: {shown}"))
        }
    });
    assert_eq!(report, Ok(()));
}

/// A rename into a directory that does not exist names the destination
/// (it named the source, which existed); a missing source is named as
/// before.
#[test]
fn a_rename_into_a_missing_directory_names_the_destination() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let from = dir.path().join("a");
    std::fs::write(&from, b"x").expect("fixture");
    with_ring().run(async {
        let to = dir.path().join("missing").join("b");
        let e = fs::rename(&from, &to).await.expect_err("no such directory");
        assert_eq!(*e.kind(), ErrorKind::NotFound, "{e}");
        assert_eq!(e.path(), Some(to.as_path()), "{e}");
        assert!(e
            .to_string()
            .contains("renaming into a directory that does not exist"));
        let gone = dir.path().join("gone");
        let e = fs::rename(&gone, dir.path().join("c"))
            .await
            .expect_err("no source");
        assert_eq!(e.path(), Some(gone.as_path()), "{e}");
        // A dangling symbolic link exists (a rename moves the link).
        let link = dir.path().join("dangling");
        std::os::unix::fs::symlink("/nonexistent-target", &link).expect("symlink");
        let e = fs::rename(&link, &to).await.expect_err("no such directory");
        assert_eq!(e.path(), Some(to.as_path()), "{e}");
    });
}

/// A file to create whose name has the form of an NVMe generic device's
/// (`ng0n1`) is created as a file: it was taken for a device and failed
/// with `NotFound` (found by a break-it helper). Without `create` it is
/// still `NotFound`.
#[test]
fn a_file_named_like_an_nvme_device_is_created_as_a_file() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    with_ring().run(async {
        let missing = OpenOptions::new()
            .direct(false)
            .open(dir.path().join("ng1n1"))
            .await
            .expect_err("no such file");
        assert_eq!(*missing.kind(), ErrorKind::NotFound, "{missing}");
        let file = dir.path().join("ng0n1");
        let dev = OpenOptions::new()
            .create(true)
            .direct(false)
            .open(&file)
            .await
            .expect("created");
        let (r, _) = dev.write_all_at(b"page".to_vec(), 0).await;
        r.expect("write");
        assert_eq!(dev.metadata().await.expect("metadata").len_bytes, 4);
        assert!(std::fs::metadata(&file).expect("stat").is_file());
    });
}

/// An open whose future is dropped while its SQE is in flight does not
/// leak the descriptor the kernel returns, and nothing is freed early.
#[test]
fn a_dropped_open_closes_its_descriptor() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let file = dir.path().join("f");
    std::fs::write(&file, b"x").expect("fixture");
    // Only descriptors of `file`: the other tests of this binary run in
    // parallel and open and close descriptors of their own.
    let fds = || {
        std::fs::read_dir("/proc/self/fd")
            .expect("fds")
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| *l == file)
            .count()
    };
    with_ring().run(async {
        let before = fds();
        for _ in 0..64 {
            let mut fut = Box::pin(plugio_device::fs_ops::open(&file, libc::O_RDONLY, 0));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(std::future::Future::poll(fut.as_mut(), &mut cx).is_pending());
            drop(fut);
        }
        // Let the CQEs come back.
        for _ in 0..100 {
            plugio_executor::sleep(std::time::Duration::from_millis(2)).await;
            if fds() <= before {
                break;
            }
        }
        assert!(fds() <= before, "descriptors leaked: {} > {before}", fds());
    });
}

/// Asserts `opts` refuses to open `file` (8 KiB) with an `InvalidInput`
/// error that `says` what, and leaves it whole.
async fn refused_and_uncut(opts: &OpenOptions, file: &Path, says: &str) {
    let e = opts.open(file).await.expect_err(says);
    assert!(matches!(e.kind(), ErrorKind::InvalidInput(_)), "{e:?}");
    assert!(e.to_string().contains(says), "{e}");
    let len = std::fs::metadata(file).expect("stat").len();
    assert_eq!(len, 8192, "the refused open cut the file: {e}");
}

/// `truncate` is refused with `read_only` (the kernel would cut the file
/// with O_RDONLY | O_TRUNC), and an open refused because the file is open
/// with other options leaves the file, and the live handle's data, as they
/// were (it was cut by O_TRUNC before the registry refused the open).
/// (`every_operation` checks that an accepted open cuts it.)
#[test]
fn truncate_cuts_only_an_accepted_writable_open() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let file = dir.path().join("t.db");
    with_ring().run(async {
        std::fs::write(&file, vec![7u8; 8192]).expect("fixture");
        let mut read_only = OpenOptions::new();
        read_only.read_only(true).truncate(true).direct(false);
        refused_and_uncut(&read_only, &file, "drop one of them").await;

        let dev = OpenOptions::new()
            .direct(false)
            .open(&file)
            .await
            .expect("open");
        let mut other = OpenOptions::new();
        other
            .truncate(true)
            .device_options(plugio_engine::DeviceOptions {
                queue_depth: 8,
                direct: false,
                ..Default::default()
            });
        refused_and_uncut(&other, &file, "already open").await;
        let (r, buf) = dev.read_exact_at(vec![0u8; 8192], 0).await;
        r.expect("the live handle's data");
        assert!(buf.iter().all(|&b| b == 7));
    });
}

/// On a core whose ring busy-polls (`RingConfig::iopoll`), file-level
/// operations go to the blocking pool: the kernel refuses them on such a
/// ring (an open failed with a bare EINVAL: found by a break-it helper);
/// an fsync or fallocate, which the engine orders with the device's IO
/// on the ring, fails with `Unsupported` saying why, and so does a write
/// with `PREFLUSH`, before it is sent.
#[test]
fn file_operations_on_an_iopoll_core_go_to_the_blocking_pool() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let file = dir.path().join("iopoll.db");
    std::fs::write(&file, vec![3u8; 8192]).expect("fixture");
    let ex = plugio_engine::runtime::local(RingConfig {
        iopoll: true,
        ..RingConfig::default()
    })
    .expect("runtime");
    ex.run(async {
        if !plugio_device::driver::uring_active() {
            println!("no io_uring here: nothing to check");
            return;
        }
        let m = fs::metadata(&file).await.expect("metadata");
        assert_eq!(m.len_bytes, 8192);
        went(OpPath::Blocking, "metadata");
        let dev = OpenOptions::new().open(&file).await.expect("open");
        went(OpPath::Blocking, "open");
        // The kernel takes no fsync or fallocate on such a ring: said so,
        // not as a bare EINVAL.
        let refusals = [
            dev.sync_all().await.expect_err("fsync on an iopoll ring"),
            dev.fallocate(0, 4096, FallocateMode::AllocateKeepSize)
                .await
                .expect_err("fallocate on an iopoll ring"),
        ];
        // A write's PREFLUSH (a linked fsync) too, before it is sent (it
        // came back as a bare EINVAL); the same write without it goes.
        let preflush = plugio_device::IoFlags::PREFLUSH;
        let (r, buf) = dev.write_at_with(dev.alloc_buf(4096), 0, preflush).await;
        let refused = r.expect_err("a PREFLUSH write on an iopoll ring");
        assert_eq!(dev.iostats().write.ios, 0, "refused before it was sent");
        dev.write_at_with(buf, 0, plugio_device::IoFlags::NONE)
            .await
            .0
            .expect("the write without PREFLUSH");
        // A read the device cannot poll (no poll queues: a virtio disk's
        // ext4 refused it while it took the write) names the ring's
        // iopoll, not a bare "operation not supported".
        if let Err(e) = dev.read_at(vec![0u8; 4096], 0).await.0 {
            assert_eq!(*e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(e.to_string().contains("poll queues"), "{e}");
        }
        for e in refusals.into_iter().chain([refused]) {
            assert_eq!(*e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(e.to_string().contains("busy-polls"), "{e}");
        }
        drop(dev);
        fs::rename(&file, dir.path().join("renamed.db"))
            .await
            .expect("rename");
        went(OpPath::Blocking, "rename");
    });
}

/// A `write_zeroes` on an iopoll core (the kernel refuses the zeroing op
/// on that ring, so it writes zeroes) leaves the device zeroing with one
/// op on a plain core later: it made every later call write zeroes
/// (found by a break-it helper).
#[test]
fn write_zeroes_on_an_iopoll_core_does_not_stop_zeroing_elsewhere() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let file = dir.path().join("zeroes.db");
    let ex = plugio_engine::runtime::local(RingConfig {
        iopoll: true,
        ..RingConfig::default()
    })
    .expect("runtime");
    let f = file.clone();
    let dev = ex.run(async move {
        let dev = OpenOptions::new()
            .create(true)
            .open(&f)
            .await
            .expect("open");
        dev.set_len(4 << 20).await.expect("set_len");
        let iopoll = plugio_device::driver::uring_active();
        // Done by writing where the ring refuses the zeroing op.
        dev.write_zeroes(0, 1 << 20)
            .await
            .expect("zeroes on iopoll");
        (dev, iopoll)
    });
    drop(ex);
    let (dev, iopoll) = dev;
    std::thread::spawn(move || {
        with_ring().run(async move {
            if !iopoll || !plugio_device::driver::uring_active() {
                println!("no io_uring here: nothing to check");
                return;
            }
            let before = dev.iostats().write.ios;
            dev.write_zeroes(1 << 20, 2 << 20).await.expect("zeroes");
            let ops = dev.iostats().write.ios - before;
            // One zeroing op where the file system has it; the writes
            // of the fallback otherwise (2 MiB in 1 MiB chunks or more).
            if dev.write_zeroes_no_fallback(1 << 20, 4096).await.is_ok() {
                assert_eq!(ops, 1, "zeroed by one op, not by writing");
            }
        });
    })
    .join()
    .expect("plain core");
}

/// `read_only(true)` and `direct(false)` hold whether `device_options`
/// comes before or after them (a later `device_options` opened the file
/// read-write: found by an API audit helper), and the truncate refusal
/// sees them.
#[test]
fn read_only_and_direct_win_over_device_options_in_either_order() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let file = dir.path().join("ro.db");
    std::fs::write(&file, vec![7u8; 8192]).expect("fixture");
    let queue_depth_8 = plugio_engine::DeviceOptions {
        queue_depth: 8,
        ..Default::default()
    };
    with_ring().run(async {
        let mut after = OpenOptions::new();
        after
            .read_only(true)
            .direct(false)
            .device_options(queue_depth_8.clone());
        let mut before = OpenOptions::new();
        before
            .device_options(queue_depth_8.clone())
            .read_only(true)
            .direct(false);
        // Equal as they open alike, however they were set.
        assert_eq!(after, before);
        assert_eq!(OpenOptions::new(), *OpenOptions::new().read_only(false));
        for opts in [after, before] {
            let o = opts.options();
            assert!(o.read_only && !o.direct && o.queue_depth == 8, "{o:?}");
            let dev = opts.open(&file).await.expect("open");
            assert!(dev.options().read_only);
            let (r, _) = dev.write_all_at(vec![1u8; 4096], 0).await;
            let e = r.expect_err("a read-only device refuses writes");
            assert_eq!(*e.kind(), ErrorKind::PermissionDenied, "{e}");
            drop(dev);
            let mut cut = opts.clone();
            cut.truncate(true).device_options(queue_depth_8.clone());
            refused_and_uncut(&cut, &file, "drop one of them").await;
        }
    });
    assert!(std::fs::read(&file).expect("read").iter().all(|&b| b == 7));
}

/// File-level operations awaited off a core, on a thread whose idle
/// runtime owns the ring (a plain block_on in `main` beside it), fail with
/// `NoDriver` at once: their SQE would wait for a reap that never comes
/// (they waited forever).
#[test]
fn file_operations_off_a_core_beside_an_idle_runtime_fail_at_once() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let file = dir.path().join("o.db");
    std::fs::write(&file, b"x").expect("fixture");
    let ex = with_ring();
    let dev = ex
        .run(OpenOptions::new().direct(false).open(&file))
        .expect("open");
    use futures::FutureExt;
    let got: [(&str, Option<Result<(), plugio_device::Error>>); 4] = [
        (
            "OpenOptions::open",
            OpenOptions::new()
                .direct(false)
                .open(&file)
                .now_or_never()
                .map(|r| r.map(drop)),
        ),
        (
            "fs::metadata",
            fs::metadata(&file).now_or_never().map(|r| r.map(drop)),
        ),
        (
            "Device::metadata",
            dev.metadata().now_or_never().map(|r| r.map(drop)),
        ),
        ("Device::set_len", dev.set_len(4096).now_or_never()),
    ];
    for (what, r) in got {
        match r {
            Some(Err(e)) if *e.kind() == ErrorKind::NoDriver => {
                assert!(e.to_string().contains("plugio core"), "{what}: {e}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // A driverless executor on that thread: the blocking pool does it.
    let m = LocalExecutor::new()
        .run(fs::metadata(&file))
        .expect("metadata on the pool");
    assert_eq!(m.len_bytes, 1);
    drop(dev);
    drop(ex);
}

/// Descriptors of this process open on `path` (a deleted file's link
/// reads "PATH (deleted)").
fn fds_on(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with(&*path.to_string_lossy()))
        .count()
}

/// A device used on one core and closed elsewhere (its last handle
/// dropped on another core, or on a thread of its own) lets go of its
/// file while that core is idle: the drop wakes the cores that held it.
/// A deleted file's space was not given back until the idle core next did
/// IO on another file.
#[test]
fn a_device_closed_elsewhere_closes_its_file_while_its_core_is_idle() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let rt = plugio_engine::runtime::builder(RingConfig::default())
        .cores(2)
        .build()
        .expect("runtime");
    for (n, drop_on_core_0) in [(0, true), (1, false)] {
        let path = dir.path().join(format!("seg{n}.db"));
        std::fs::write(&path, vec![1u8; 1 << 20]).expect("fixture");
        let p = path.clone();
        let dev = rt
            .block_on(rt.spawn_on(1, async move {
                let dev = plugio_engine::Device::open(&p, Default::default()).expect("open");
                let (r, _) = dev.read_at(dev.alloc_buf(4096), 0).await;
                r.expect("read");
                dev
            }))
            .expect("core 1");
        assert!(fds_on(&path) >= 1, "open while a handle lives");
        std::fs::remove_file(&path).expect("delete");
        if drop_on_core_0 {
            rt.block_on(rt.spawn_on(0, async move { drop(dev) }))
                .expect("core 0");
        } else {
            drop(dev);
        }
        let start = std::time::Instant::now();
        while fds_on(&path) > 0 {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(20),
                "the idle core closes the file (dropped on core 0: {drop_on_core_0})"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// Runs `body` with a loop device over a temporary file of `size_bytes`
/// (its path and the backing file's), and detaches it afterwards, also
/// when `body` panics. Skipped (with a message) without root or losetup.
fn with_loop_device(size_bytes: u64, body: impl FnOnce(&Path, &Path)) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: a loop device needs root");
        return;
    }
    let dir = common::tmpdir();
    let backing = dir.path().join("loop.img");
    std::fs::File::create(&backing)
        .and_then(|f| f.set_len(size_bytes))
        .expect("backing file");
    let out = std::process::Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&backing)
        .output();
    let path = match out {
        Ok(o) if o.status.success() => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
        other => {
            println!("SKIPPED: losetup failed: {other:?}");
            return;
        }
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&path, &backing)));
    let _ = std::process::Command::new("losetup")
        .arg("-d")
        .arg(&path)
        .status();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// `set_len` on a block device is refused before any call, typed and with
/// what to do instead (the kernel said only `EINVAL`; found by a break-it
/// helper); the device is unchanged and IO on it goes on.
#[test]
fn set_len_on_a_block_device_is_refused_before_any_call() {
    with_loop_device(4 << 20, |path, _| {
        common::local().run(async {
            let dev = plugio_engine::Device::open(path, Default::default()).expect("open loop");
            let err = dev
                .set_len(1 << 20)
                .await
                .expect_err("a block device is not resized");
            assert_eq!(*err.kind(), ErrorKind::Unsupported, "{err}");
            let msg = err.to_string();
            assert!(
                msg.contains("set_len resizes regular files only")
                    && msg.contains("metadata().len_bytes")
                    && msg.contains(&path.display().to_string()),
                "{msg}"
            );
            assert_eq!(dev.metadata().await.expect("metadata").len_bytes, 4 << 20);
            dev.read_alloc_at(0, 4096).await.expect("IO goes on");
            // Nor is space allocated on it: said, before any call (the
            // kernel's answer was a bare "operation not supported").
            for mode in [FallocateMode::Allocate, FallocateMode::AllocateKeepSize] {
                let err = dev
                    .fallocate(0, 4096, mode)
                    .await
                    .expect_err("no blocks to allocate");
                assert_eq!(*err.kind(), ErrorKind::Unsupported, "{err}");
                assert!(err.to_string().contains("no blocks to allocate"), "{err}");
            }
            dev.fallocate(0, 4096, FallocateMode::ZeroRange)
                .await
                .expect("zeroing goes on");
        })
    });
}

/// A block device that shrinks while open (`losetup -c` after its file
/// was cut) fails IO past its new end with the kernel's error (out of
/// space for a write, no data for a read) and says the device shrank and
/// to open it again, where it had said only "out of space" or "inside
/// the device" (found by a break-it helper). IO below the new end works;
/// a device opened again refuses the range before submission.
#[test]
fn io_past_the_end_of_a_shrunk_block_device_says_it_shrank() {
    with_loop_device(8 << 20, |path, backing| {
        common::local().run(async {
            let dev = plugio_engine::Device::open(path, Default::default()).expect("open loop");
            std::fs::OpenOptions::new()
                .write(true)
                .open(backing)
                .and_then(|f| f.set_len(1 << 20))
                .expect("cut the backing file");
            let c = std::process::Command::new("losetup")
                .arg("-c")
                .arg(path)
                .status();
            if !c.as_ref().is_ok_and(|s| s.success()) {
                println!("SKIPPED: losetup -c failed: {c:?}");
                return;
            }
            let (r, _) = dev.write_at(dev.alloc_buf(4096), 4 << 20).await;
            let w = r.expect_err("a write past the new end");
            assert!(
                w.to_string()
                    .contains("is now smaller than when it was opened"),
                "{w}"
            );
            // The out-of-space advice (free space) would contradict it.
            assert!(!w.to_string().contains("free space"), "{w}");
            let rd = dev
                .read_alloc_at(4 << 20, 4096)
                .await
                .expect_err("a read past the new end");
            assert!(
                rd.to_string()
                    .contains("is now smaller than when it was opened"),
                "{rd}"
            );
            dev.read_alloc_at(0, 4096)
                .await
                .expect("IO below the new end");
            drop(dev);
            let again = plugio_engine::Device::open(path, Default::default()).expect("open again");
            let (r, _) = again.read_at(again.alloc_buf(4096), 4 << 20).await;
            let refused = r.expect_err("refused before submission");
            assert!(
                matches!(refused.kind(), ErrorKind::InvalidInput(_)),
                "{refused}"
            );
        })
    });
}

/// Makes `path` refuse writing (an immutable file or directory, which
/// refuses root too; mode 0444 or 0555 for anyone else), or undoes it.
/// False where that cannot be done here.
fn lock(path: &Path, locked: bool) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let flag = if locked { "+i" } else { "-i" };
        return std::process::Command::new("chattr")
            .arg(flag)
            .arg(path)
            .status()
            .is_ok_and(|s| s.success());
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = match (locked, path.is_dir()) {
        (true, true) => 0o555,
        (true, false) => 0o444,
        (false, true) => 0o755,
        (false, false) => 0o644,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).is_ok()
}

/// An open for writing that the kernel refuses (an immutable file, which
/// refuses root too; a 0444 file for anyone else) says how to open it to
/// read only, and the read-only open works (a helper embedding plugio got
/// a bare "permission denied"); a file the open was to create in a
/// directory that refuses it is not told so (its directory refused, and a
/// read-only open finds no file: a break-it helper).
#[test]
fn a_refused_open_for_writing_says_how_to_open_read_only() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let file = dir.path().join("locked.db");
    std::fs::write(&file, vec![1u8; 4096]).expect("fixture");
    let sub = dir.path().join("locked_dir");
    std::fs::create_dir(&sub).expect("dir");
    if !lock(&file, true) || !lock(&sub, true) {
        lock(&file, false);
        println!("SKIPPED: the file could not be made unwritable here");
        return;
    }
    let new = sub.join("new.db");
    let outcome = with_ring().run(async {
        let refused = [
            OpenOptions::new().open(&file).await.map(drop),
            plugio_engine::Device::open(&file, plugio_engine::DeviceOptions::default()).map(drop),
        ];
        let create = OpenOptions::new().create(true).open(&new).await.map(drop);
        let read = OpenOptions::new().read_only(true).open(&file).await;
        let data = match read {
            Ok(dev) => dev.read_alloc_at(0, 4096).await.map(|b| b.as_slice()[0]),
            Err(e) => Err(e),
        };
        (refused, create, data)
    });
    lock(&file, false);
    lock(&sub, false);
    let (refused, create, data) = outcome;
    for r in refused {
        let e = r.expect_err("an open for writing of an unwritable file");
        assert_eq!(*e.kind(), ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("read_only(true)"), "{e}");
        assert_eq!(e.path(), Some(file.as_path()), "{e}");
    }
    let e = create.expect_err("a file created in a directory that refuses it");
    assert_eq!(*e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(!e.to_string().contains("read_only"), "{e}");
    assert_eq!(data.expect("the read-only open reads"), 1);
}
