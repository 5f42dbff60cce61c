//! `DeviceCursor`: the futures-io adapters over a Device, with
//! `futures::io::copy` in and out, odd lengths and offsets with O_DIRECT
//! (read-modify-write of partial blocks, no padding left in the file),
//! seeks, and a model check of mixed reads, writes and seeks.

use futures::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt, SeekFrom};
use plugio_device::RingConfig;
use plugio_engine::{Device, DeviceCursor, DeviceOptions};

fn data(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn dirs() -> Vec<tempfile::TempDir> {
    let mut v = vec![tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("disk dir")];
    if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
        v.push(d);
    }
    v
}

fn open(path: &std::path::Path, direct: bool) -> Device {
    let opts = DeviceOptions {
        direct,
        ..DeviceOptions::default()
    };
    match Device::open(path, opts.clone()) {
        Err(e) if *e.kind() == plugio_device::ErrorKind::DirectIoRefused => Device::open(
            path,
            DeviceOptions {
                direct: false,
                ..opts
            },
        ),
        r => r,
    }
    .expect("open")
}

#[test]
fn copy_in_and_out_with_futures_io_copy() {
    for dir in dirs() {
        for direct in [true, false] {
            let path = dir.path().join(format!("copy-{direct}"));
            std::fs::write(&path, b"").expect("fixture");
            let src = data(1_000_003, 7); // not a multiple of any block
            let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
            ex.run(async {
                let dev = open(&path, direct);
                let mut cur = DeviceCursor::new(dev.clone()).await.expect("cursor");
                let n = futures::io::copy(futures::io::Cursor::new(src.clone()), &mut cur)
                    .await
                    .expect("copy in");
                assert_eq!(n, src.len() as u64);
                cur.close().await.expect("close");
                dev.sync_data().await.expect("sync");
                assert_eq!(
                    dev.metadata().await.expect("meta").len_bytes,
                    src.len() as u64,
                    "no padding left past the end"
                );
                cur.seek(SeekFrom::Start(0)).await.expect("seek");
                let mut out = futures::io::Cursor::new(Vec::new());
                let n = futures::io::copy(&mut cur, &mut out)
                    .await
                    .expect("copy out");
                assert_eq!(n, src.len() as u64);
                assert!(out.into_inner() == src, "bytes differ (direct {direct})");
            });
            assert_eq!(std::fs::read(&path).expect("read file"), src);
        }
    }
}

#[test]
fn overwrites_at_odd_offsets_keep_the_bytes_around_them() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let path = dir.path().join("rmw");
    let mut model = data(20_000, 3);
    std::fs::write(&path, &model).expect("fixture");
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async {
        let dev = open(&path, true);
        let mut cur = DeviceCursor::with_window(dev.clone(), 4096)
            .await
            .expect("cursor");
        assert_eq!(cur.len_bytes(), 20_000);
        cur.seek(SeekFrom::Start(5_001)).await.expect("seek");
        cur.write_all(b"in the middle").await.expect("write");
        model[5_001..5_014].copy_from_slice(b"in the middle");
        let end = cur.seek(SeekFrom::End(-3)).await.expect("seek end");
        assert_eq!(end, 19_997);
        cur.write_all(b"tail grows").await.expect("append");
        model.truncate(19_997);
        model.extend_from_slice(b"tail grows");
        cur.flush().await.expect("flush");
        assert_eq!(cur.len_bytes(), model.len() as u64);
        assert_eq!(
            dev.metadata().await.expect("meta").len_bytes,
            model.len() as u64
        );
        let mut back = Vec::new();
        cur.seek(SeekFrom::Start(0)).await.expect("rewind");
        cur.read_to_end(&mut back).await.expect("read all");
        assert!(back == model, "file differs from the model");
        let err = cur.seek(SeekFrom::Current(-1_000_000)).await;
        assert!(err.is_err(), "before the start");
    });
    assert_eq!(std::fs::read(&path).expect("read"), model);
}

/// Mixed reads, writes and seeks over a small window against a `Vec`
/// model, with O_DIRECT: every window switch, partial block and hole.
#[test]
fn mixed_operations_match_a_model() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let path = dir.path().join("model");
    let mut model = data(9_000, 11);
    std::fs::write(&path, &model).expect("fixture");
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async {
        let dev = open(&path, true);
        let mut cur = DeviceCursor::with_window(dev, 1024).await.expect("cursor");
        let steps = data(600, 5);
        let mut pos = 0usize;
        for (i, w) in steps.chunks(3).enumerate() {
            let (kind, a, b) = (w[0] % 3, w[1] as usize, w[2] as usize);
            match kind {
                0 => {
                    pos = (a * 61 + b) % (model.len() + 700);
                    cur.seek(SeekFrom::Start(pos as u64)).await.expect("seek");
                }
                1 => {
                    let bytes = data(1 + a * 9, i as u32);
                    cur.write_all(&bytes).await.expect("write");
                    if model.len() < pos {
                        model.resize(pos, 0); // a hole
                    }
                    let end = (pos + bytes.len()).min(model.len());
                    model.splice(pos..end, bytes.iter().copied());
                    pos += bytes.len();
                }
                _ => {
                    let mut got = vec![0u8; 1 + b * 7];
                    let mut filled = 0;
                    loop {
                        let n = cur.read(&mut got[filled..]).await.expect("read");
                        if n == 0 || filled + n == got.len() {
                            filled += n;
                            break;
                        }
                        filled += n;
                    }
                    let want = &model[pos.min(model.len())..(pos + got.len()).min(model.len())];
                    assert_eq!(&got[..filled], want, "step {i}: read at {pos}");
                    pos += filled;
                }
            }
        }
        cur.close().await.expect("close");
        assert_eq!(cur.len_bytes(), model.len() as u64);
    });
    assert!(std::fs::read(&path).expect("read") == model, "file differs");
}

/// On a device with a capacity (here the simulated one, 1 MiB and 1536
/// bytes, so the last window is short and not a whole window), reads and
/// writes work up to the end, `read_to_end` stops there, and a write
/// past it fails at the `write` call, not later at `flush` (found by a
/// break-it helper on loop devices: every IO in the last window failed
/// with a range error, and a write past the end was accepted and lost).
#[test]
fn a_cursor_on_a_device_works_up_to_its_capacity() {
    use plugio_device::backend::mem::{MemConfig, MemDevice};
    let cap = (1u64 << 20) + 1536;
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async move {
        let mem = std::sync::Arc::new(MemDevice::new(MemConfig {
            capacity_bytes: cap,
            ..Default::default()
        }));
        let dev = Device::with_backend(mem, None, DeviceOptions::default()).expect("device");
        let mut c = DeviceCursor::new(dev.clone()).await.expect("cursor");
        assert_eq!(c.len_bytes(), cap);
        for back in [4096u64, 65536, 100] {
            c.seek(SeekFrom::Start(cap - back)).await.expect("seek");
            let mut got = vec![0u8; 100];
            c.read_exact(&mut got).await.expect("read near the end");
            c.seek(SeekFrom::Start(cap - back)).await.expect("seek");
            let want = data(100, back as u32);
            c.write_all(&want).await.expect("write near the end");
            c.flush().await.expect("flush");
            let (r, buf) = dev.read_exact_at(dev.alloc_buf(cap as usize), 0).await;
            r.expect("read back");
            let at = (cap - back) as usize;
            assert_eq!(
                &buf.as_slice()[at..at + 100],
                &want[..],
                "{back} bytes before the end"
            );
        }
        c.seek(SeekFrom::End(-100)).await.expect("seek");
        let e = c
            .write_all(&[7u8; 200])
            .await
            .expect_err("a write past the end");
        assert_eq!(e.kind(), std::io::ErrorKind::WriteZero, "{e}");
        c.flush().await.expect("the 100 bytes before the end flush");
        c.seek(SeekFrom::Start(0)).await.expect("seek");
        let mut all = Vec::new();
        c.read_to_end(&mut all).await.expect("read to end");
        assert_eq!(all.len() as u64, cap);
        assert!(all[all.len() - 100..].iter().all(|&b| b == 7));
    });
}

/// A simulated 1 MiB device that is full once `bytes` were written, and a
/// `Device` on it.
fn full_after(
    bytes: u64,
) -> (
    std::sync::Arc<plugio_device::backend::mem::MemDevice>,
    Device,
) {
    use plugio_device::backend::mem::{Fault, MemConfig, MemDevice};
    let m = std::sync::Arc::new(MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        faults: vec![Fault::FullAfter { bytes }],
        ..MemConfig::default()
    }));
    let dev = Device::with_backend(m.clone(), None, DeviceOptions::default()).expect("device");
    (m, dev)
}

/// A flush that fails (the device is full) keeps the window dirty: a
/// second flush fails again instead of returning Ok with the bytes
/// `write_all` took thrown away, and once there is room a flush writes
/// them all (found by a break-it helper on a full tmpfs: flush 1 failed,
/// flush 2 and close returned Ok, 36 KiB lost).
#[test]
fn a_failed_flush_keeps_the_unwritten_bytes_for_the_next_one() {
    let (m, dev) = full_after(65536);
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async move {
        let want = data(102_400, 7);
        let mut c = DeviceCursor::new(dev.clone()).await.expect("cursor");
        c.write_all(&want).await.expect("the window takes it");
        c.flush().await.expect_err("only 64 KiB fit");
        c.flush()
            .await
            .expect_err("still full: the bytes are still unwritten");
        m.clear_faults();
        c.flush().await.expect("room now");
        c.close().await.expect("close");
        let got = dev.read_alloc_at(0, want.len()).await.expect("read back");
        assert_eq!(got.as_slice(), &want[..]);
    });
}

/// After a flush that failed, `discard_buffered` drops the window's
/// unwritten bytes: flush and close then succeed with nothing to write,
/// where every later flush, read, write and close had failed with the
/// first error (found by a break-it helper on a write past ext4's largest
/// file).
#[test]
fn discard_buffered_drops_a_window_that_cannot_be_written() {
    let (_m, dev) = full_after(0);
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async move {
        let mut c = DeviceCursor::new(dev.clone()).await.expect("cursor");
        c.write_all(b"cannot land")
            .await
            .expect("the window takes it");
        c.flush().await.expect_err("the device is full");
        c.flush().await.expect_err("still dirty");
        assert!(c.discard_buffered().await.expect("discard"));
        assert!(!c.discard_buffered().await.expect("nothing left"));
        c.flush().await.expect("nothing to write");
        c.seek(SeekFrom::Start(0)).await.expect("seek");
        let mut first = [9u8; 4];
        c.read_exact(&mut first).await.expect("the device's bytes");
        assert_eq!(first, [0; 4], "the dropped bytes never reached the device");
        c.close().await.expect("close");
    });
}

/// A write whose end would pass the largest file offset (`i64::MAX`) is
/// refused at the `write` call, typed, and the cursor goes on working
/// (a write near `u64::MAX` wrapped the window's end and spun the core
/// forever; found by a break-it helper). A window larger than
/// `MAX_WINDOW_BYTES` is refused (`usize::MAX` wrapped to 0).
#[test]
fn writes_past_the_largest_offset_and_huge_windows_are_refused() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("disk dir");
    let path = dir.path().join("far");
    std::fs::write(&path, b"").expect("fixture");
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async {
        let dev = open(&path, true);
        let err = DeviceCursor::with_window(dev.clone(), usize::MAX)
            .await
            .expect_err("a window larger than memory");
        assert!(
            matches!(err.kind(), plugio_device::ErrorKind::InvalidInput(_)),
            "{err}"
        );
        let mut c = DeviceCursor::new(dev.clone()).await.expect("cursor");
        for at in [u64::MAX - 10, i64::MAX as u64 - 1, i64::MAX as u64 + 1] {
            c.seek(SeekFrom::Start(at)).await.expect("seek");
            let e = c.write(b"x").await.expect_err("past the largest offset");
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains("largest file offset"), "{e}");
        }
        c.seek(SeekFrom::Start(0)).await.expect("seek");
        c.write_all(b"still works").await.expect("write");
        c.close().await.expect("close");
        let back = dev.read_alloc_at(0, 512).await.expect("read");
        assert_eq!(&back.as_slice()[..11], b"still works");
    });
}

/// After `discard_buffered` of a window that started past the file's
/// end, the cursor's length is the file's again: `SeekFrom::End` and an
/// append land at the true end (the length stayed at the dropped
/// window's start, and an append wrote 1 MiB of zeros; found by a
/// break-it helper).
#[test]
fn after_a_discard_appends_land_at_the_files_true_end() {
    for dir in dirs() {
        for direct in [true, false] {
            let path = dir.path().join(format!("discard-{direct}"));
            std::fs::write(&path, b"0123456789").expect("fixture");
            let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
            ex.run(async {
                let dev = open(&path, direct);
                let mut c = DeviceCursor::new(dev).await.expect("cursor");
                c.seek(SeekFrom::Start(1 << 20)).await.expect("seek");
                c.write_all(b"x").await.expect("into the window");
                assert!(c.discard_buffered().await.expect("discard"));
                assert_eq!(c.len_bytes(), 10);
                assert_eq!(c.seek(SeekFrom::End(0)).await.expect("end"), 10);
                c.write_all(b"APP").await.expect("append");
                c.close().await.expect("close");
            });
            assert_eq!(std::fs::read(&path).expect("read"), b"0123456789APP");
        }
    }
}

/// Near the largest file offset (`i64::MAX`) on a file system that takes
/// such a file (tmpfs), the cursor reads the last bytes and writes where
/// the write's end fits: its loads stop at the largest offset instead of
/// asking for a whole window past it (refused; found by a break-it
/// helper). Skipped where the file system refuses the size.
#[test]
fn reads_and_writes_work_up_to_the_largest_file_offset() {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        println!("SKIPPED: no /dev/shm");
        return;
    };
    let path = dir.path().join("huge");
    let len = i64::MAX as u64 - 807;
    let f = std::fs::File::create(&path).expect("create");
    if let Err(e) = f.set_len(len) {
        println!("SKIPPED: the file system refuses a file of {len} bytes: {e}");
        return;
    }
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async {
        let dev = open(&path, false);
        let mut c = DeviceCursor::new(dev).await.expect("cursor");
        assert_eq!(c.seek(SeekFrom::End(-5)).await.expect("seek"), len - 5);
        c.write_all(b"tail!")
            .await
            .expect("a write that ends inside the file");
        c.flush().await.expect("flush");
        c.seek(SeekFrom::End(-5)).await.expect("seek");
        let mut got = Vec::new();
        c.read_to_end(&mut got).await.expect("the last bytes");
        assert_eq!(got, b"tail!");
        c.close().await.expect("close");
    });
}
