//! Every op on a loop block device (created here with `losetup` when running
//! as root; skipped with a message otherwise), on io_uring and the sync
//! pool. The loop device is detached at the end even on failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use plugio_device::backend::BackendKind;
use plugio_device::testing::block_on;
use plugio_device::{
    DeviceDriver, DeviceKind, DmaBuf, ErrorKind, File, InvalidInput, IoFlags, OpenOptions,
    RingConfig,
};

use common::pattern;

const SIZE: u64 = 16 << 20;

/// Detaches the loop device when dropped.
struct LoopDevice {
    path: PathBuf,
    _backing: tempfile::NamedTempFile,
}

impl LoopDevice {
    fn create() -> Option<Self> {
        Self::create_with(SIZE, None)
    }

    /// A loop device over a file of `size` bytes, with `block` bytes as
    /// its logical block where given (`losetup -b`).
    fn create_with(size: u64, block: Option<u32>) -> Option<Self> {
        let block = block.map(|b| b.to_string());
        let args: Vec<&str> = match &block {
            Some(b) => vec!["-b", b],
            None => vec![],
        };
        Self::create_args(size, &args)
    }

    /// A loop device over a file of `size` bytes, made with `losetup`'s
    /// extra `args` (`-b 4096`, `-r`).
    fn create_args(size: u64, args: &[&str]) -> Option<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIPPED: loop device tests need root");
            return None;
        }
        let backing = common::temp_file();
        backing.as_file().set_len(size).ok()?;
        let mut cmd = Command::new("losetup");
        cmd.args(["--find", "--show"]).args(args);
        let out = cmd.arg(backing.path()).output();
        match out {
            Ok(o) if o.status.success() => {
                let path = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
                Some(Self {
                    path,
                    _backing: backing,
                })
            }
            Ok(o) => {
                println!(
                    "SKIPPED: losetup failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                None
            }
            Err(e) => {
                println!("SKIPPED: losetup unavailable: {e}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

fn filled(file: &File, len: usize, seed: u64) -> DmaBuf {
    let mut b = file.alloc_buf(len);
    b.as_mut_slice().copy_from_slice(&pattern(len, seed));
    b
}

fn suite(dev: &Path, kind: BackendKind) -> Vec<String> {
    let driver = DeviceDriver::with_ring(&RingConfig::default()).expect("ring");
    let file = File::open_with(dev, OpenOptions::new().backend(kind)).expect("open loop device");
    let g = file.geometry().clone();
    assert_eq!(g.kind, DeviceKind::BlockDevice);
    assert_eq!(g.capacity_bytes, Some(SIZE));
    assert!(g.logical_block_bytes >= 512 && g.max_sectors_kb > 0 && g.max_segments > 0);
    assert!(
        g.source.as_ref().is_some_and(|s| s.ends_with("queue")),
        "{g}"
    );
    let mut log = Vec::new();
    block_on(&driver, async {
        let (r, _) = file.write_at(filled(&file, 65536, 1), 0).await;
        log.push(format!("write {r:?}"));
        let (r, b) = file.read_at(file.alloc_buf(65536), 0).await;
        log.push(format!("read {r:?}"));
        assert_eq!(b.as_slice(), &pattern(65536, 1)[..]);

        let (r, _) = file
            .writev_at(vec![filled(&file, 512, 2), filled(&file, 4096, 3)], 65536)
            .await;
        log.push(format!("writev {r:?}"));
        let (r, bufs) = file
            .readv_at(vec![file.alloc_buf(4096), file.alloc_buf(512)], 65536)
            .await;
        log.push(format!("readv {r:?}"));
        let mut got = bufs[0].as_slice().to_vec();
        got.extend_from_slice(bufs[1].as_slice());
        let mut want = pattern(512, 2);
        want.extend(pattern(4096, 3));
        assert_eq!(got, want);

        let (r, _) = file
            .write_at_with(filled(&file, 4096, 4), 1 << 20, IoFlags::FUA)
            .await;
        log.push(format!("fua {r:?}"));
        let (r, _) = file
            .write_at_with(filled(&file, 4096, 5), 2 << 20, IoFlags::PREFLUSH)
            .await;
        log.push(format!("preflush {r:?}"));
        log.push(format!("fsync {:?}", file.fsync().await));
        log.push(format!("fdatasync {:?}", file.fdatasync().await));

        log.push(format!(
            "write_zeroes {:?}",
            file.write_zeroes(0, 8192).await
        ));
        let (_, b) = file.read_at(file.alloc_buf(8192), 0).await;
        assert!(b.as_slice().iter().all(|&x| x == 0), "zeroed");
        log.push(format!("discard {:?}", file.discard(8192, 8192).await));
        // A loop device discards by punching the backing file: zeroes.
        let (_, b) = file.read_at(file.alloc_buf(8192), 8192).await;
        assert!(b.as_slice().iter().all(|&x| x == 0), "discarded");
        let (_, b) = file.read_at(file.alloc_buf(4096), 16384).await;
        assert_eq!(
            b.as_slice(),
            &pattern(65536, 1)[16384..20480],
            "neighbour kept"
        );

        let (r, _) = file.read_at(file.alloc_buf(4096), SIZE - 512).await;
        match r {
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    ErrorKind::InvalidInput(InvalidInput::Range { .. })
                ),
                "{e}"
            ),
            Ok(n) => panic!("read past the end returned {n}"),
        }
        let (r, _) = file.read_at(file.alloc_buf(512), SIZE - 512).await;
        log.push(format!("last block {r:?}"));
    });
    assert_eq!(driver.in_flight(), 0);
    log
}

#[test]
fn every_op_on_a_loop_device() {
    let Some(dev) = LoopDevice::create() else {
        return;
    };
    let uring = suite(dev.path(), BackendKind::Uring);
    let sync = suite(dev.path(), BackendKind::Sync);
    assert_eq!(uring, sync);
    assert!(uring.iter().all(|l| !l.contains("Err")), "{uring:?}");
}

/// Through the engine on a real block device: `Device::metadata` gives
/// its capacity as `len_bytes` (statx says 0), and a `DeviceCursor` reads
/// and writes in its last window (found by a break-it helper: both
/// failed with a range error there).
#[test]
fn the_engine_sees_a_loop_devices_size_and_its_cursor_reaches_the_end() {
    use futures::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt, SeekFrom};
    on_engine_device(|_, dev| async move {
        assert_eq!(dev.metadata().await.expect("metadata").len_bytes, SIZE);
        let mut c = plugio::DeviceCursor::new(dev).await.expect("cursor");
        c.seek(SeekFrom::Start(SIZE - 4096)).await.expect("seek");
        c.write_all(&[5u8; 100])
            .await
            .expect("write in the last window");
        c.flush().await.expect("flush");
        c.seek(SeekFrom::Start(SIZE - 4096)).await.expect("seek");
        let mut got = [0u8; 100];
        c.read_exact(&mut got)
            .await
            .expect("read in the last window");
        assert_eq!(got, [5u8; 100]);
        c.seek(SeekFrom::End(0)).await.expect("seek");
        let e = c.write_all(&[1u8]).await.expect_err("past the end");
        assert_eq!(e.kind(), std::io::ErrorKind::WriteZero, "{e}");
    });
}

/// Runs `f` on a fresh loop device of [`SIZE`] bytes (its path, and the
/// engine's `Device` on it, opened writable) on a local runtime; skipped
/// where no loop device can be made.
fn on_engine_device<F, Fut>(f: F)
where
    F: FnOnce(PathBuf, plugio::Device) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(lo) = LoopDevice::create() else {
        return;
    };
    let path = lo.path.clone();
    let ex = plugio::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async move {
        let dev = plugio::Device::open(&path, plugio::DeviceOptions::default()).expect("open");
        f(path, dev).await;
    });
    drop(lo);
}

/// A capacity off the device's block (4 KiB blocks over a file of
/// 1 MiB and 1536 bytes): a `DeviceCursor` ends at the last whole block, where
/// aligned IO ends (found by a break-it helper: the last window's load was
/// refused as unaligned).
#[test]
fn a_cursor_ends_at_a_loop_devices_last_whole_block() {
    use futures::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt, SeekFrom};
    let Some(lo) = LoopDevice::create_with((1 << 20) + 1536, Some(4096)) else {
        return;
    };
    let path = lo.path.clone();
    let ex = plugio::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async move {
        let dev = plugio::Device::open(&path, plugio::DeviceOptions::default()).expect("open");
        let mut c = plugio::DeviceCursor::new(dev).await.expect("cursor");
        assert_eq!(c.len_bytes(), 1 << 20);
        let data = pattern(1 << 20, 9);
        c.write_all(&data).await.expect("write to the end");
        c.flush().await.expect("flush");
        let e = c.write_all(&[1u8]).await.expect_err("past the last block");
        assert_eq!(e.kind(), std::io::ErrorKind::WriteZero, "{e}");
        c.seek(SeekFrom::Start(0)).await.expect("seek");
        let mut all = Vec::new();
        c.read_to_end(&mut all).await.expect("read to end");
        assert!(all == data, "read back what was written");
    });
    drop(lo);
}

/// A read-only block device (`losetup -r`) is refused at a writable open,
/// naming the path and what to change, where Linux would let the open
/// through and fail every write with `EPERM` (found by a break-it helper:
/// `plugio replay` failed at its first write, exit 1). A read-only open
/// still reads it, through this crate and through the engine.
#[test]
fn a_read_only_block_device_is_refused_at_a_writable_open() {
    let Some(lo) = LoopDevice::create_args(SIZE, &["-r"]) else {
        return;
    };
    let driver = DeviceDriver::with_ring(&RingConfig::default()).expect("ring");
    for kind in [BackendKind::Uring, BackendKind::Sync] {
        let e = File::open_with(lo.path(), OpenOptions::new().backend(kind))
            .expect_err("a writable open of a read-only device");
        assert_eq!(*e.kind(), ErrorKind::PermissionDenied, "{e}");
        let text = e.to_string();
        assert!(text.contains(&lo.path().display().to_string()), "{text}");
        // How each way of making it read-only is undone: `--setrw` does
        // not undo `losetup -r` (found by a break-it helper).
        for part in [
            "read-only",
            "`blockdev --setrw` undoes",
            "losetup -r",
            "read_only(true)",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        let f = File::open_with(lo.path(), OpenOptions::new().backend(kind).write(false))
            .expect("a read-only open");
        // `plugio info` says so.
        let text = plugio_device::describe(lo.path()).expect("describe");
        assert!(
            text.contains("writable:            no: the block device is read-only"),
            "{text}"
        );
        let (r, _) = block_on(&driver, f.read_at(f.alloc_buf(4096), 0));
        assert_eq!(r.expect("read"), 4096);
    }
    // One driver per thread: the engine's runtime installs its own.
    drop(driver);
    let path = lo.path.clone();
    let ex = plugio::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async move {
        let e = plugio::Device::open(&path, plugio::DeviceOptions::default())
            .expect_err("the engine's default open is writable");
        assert_eq!(*e.kind(), ErrorKind::PermissionDenied, "{e}");
        let ro = plugio::DeviceOptions {
            read_only: true,
            ..Default::default()
        };
        let dev = plugio::Device::open(&path, ro).expect("read-only open");
        let (r, _) = dev.read_at(dev.alloc_buf(4096), 0).await;
        assert_eq!(r.expect("read"), 4096);
    });
}

/// An IO error names the device's path, also one the kernel returns at
/// completion: a loop device made read-only (`blockdev --setro`) after a
/// writable open fails the next write with EPERM, and the error says
/// which device it was (found by a break-it helper: "permission denied",
/// with no device named).
#[test]
fn an_io_error_at_completion_names_the_devices_path() {
    on_engine_device(|path, dev| async move {
        let (w, _) = dev.write_at(dev.alloc_buf(4096), 0).await;
        assert_eq!(w.expect("a write before --setro"), 4096);
        let setro = Command::new("blockdev").arg("--setro").arg(&path).status();
        if !setro.is_ok_and(|s| s.success()) {
            println!("SKIPPED: blockdev --setro failed");
            return;
        }
        let (w, _) = dev.write_at(dev.alloc_buf(4096), 4096).await;
        let _ = Command::new("blockdev").arg("--setrw").arg(&path).status();
        let e = w.expect_err("a write to a device made read-only");
        assert_eq!(*e.kind(), ErrorKind::PermissionDenied, "{e}");
        assert_eq!(e.path(), Some(path.as_path()), "{e}");
        // Which IO failed, and why: the device became read-only (a
        // fresh user's scan engine got a bare "permission denied").
        assert_eq!(
            e.io(),
            Some((plugio_device::OpKind::Write, 4096, 4096)),
            "{e}"
        );
        let text = e.to_string();
        assert!(
            text.contains("write of 4096 bytes at offset 4096")
                && text.contains("became read-only after it was opened")
                && text.contains("blockdev --setrw"),
            "{text}"
        );
        assert!(
            e.to_string()
                .ends_with(&format!("(path {})", path.display())),
            "{e}"
        );
        // Reads still work, and a refused read names the path too.
        let (r, _) = dev.read_at(dev.alloc_buf(4096), 0).await;
        assert_eq!(r.expect("read"), 4096);
        let e = dev
            .read_alloc_at(SIZE, 4096)
            .await
            .expect_err("a read past the end");
        assert_eq!(e.path(), Some(path.as_path()), "{e}");
    });
}
