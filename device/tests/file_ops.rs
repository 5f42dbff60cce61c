//! Every op of the file backend on a real file, on io_uring and on the sync
//! pool, with data written and read back; results must be identical.

mod common;

use std::future::Future;
use std::os::unix::fs::FileExt;

use plugio_device::backend::BackendKind;
use plugio_device::testing::block_on;
use plugio_device::{DeviceDriver, DmaBuf, ErrorKind, File, IoFlags, OpenOptions, RingConfig};

use common::{pattern, temp_file};

fn open(path: &std::path::Path, kind: BackendKind) -> File {
    File::open_with(path, OpenOptions::new().create(true).backend(kind)).expect("open O_DIRECT")
}

fn filled(file: &File, len: usize, seed: u64) -> DmaBuf {
    let mut b = file.alloc_buf(len);
    b.as_mut_slice().copy_from_slice(&pattern(len, seed));
    b
}

/// Runs the whole op suite and returns a transcript of every result.
fn op_suite(kind: BackendKind) -> Vec<String> {
    let driver = DeviceDriver::with_ring(&RingConfig::default()).expect("ring");
    let tmp = temp_file();
    let file = open(tmp.path(), kind);
    let mut log = Vec::new();
    block_on(&driver, async {
        // write + read back
        let (r, _) = file.write_at(filled(&file, 16384, 1), 0).await;
        log.push(format!("write {:?}", r));
        let (r, buf) = file.read_at(file.alloc_buf(16384), 0).await;
        log.push(format!("read {:?}", r));
        assert_eq!(buf.as_slice(), &pattern(16384, 1)[..]);

        // fixed (arena) buffer
        let fixed = filled(&file, 4096, 2);
        if kind == BackendKind::Uring {
            assert!(fixed.fixed_index().is_some(), "arena buffer is registered");
        }
        let (r, _) = file.write_at(fixed, 4096).await;
        log.push(format!("write fixed {:?}", r));
        let (r, buf) = file.read_at(file.alloc_buf(4096), 4096).await;
        log.push(format!("read fixed {:?}", r));
        assert_eq!(buf.as_slice(), &pattern(4096, 2)[..]);

        // heap (unregistered) buffer
        let mut heap = DmaBuf::heap(8192, 4096);
        heap.as_mut_slice().copy_from_slice(&pattern(8192, 3));
        let (r, _) = file.write_at(heap, 8192).await;
        log.push(format!("write heap {:?}", r));

        // writev / readv
        let bufs = vec![filled(&file, 4096, 4), filled(&file, 8192, 5)];
        let (r, _) = file.writev_at(bufs, 16384).await;
        log.push(format!("writev {:?}", r));
        let (r, bufs) = file
            .readv_at(vec![file.alloc_buf(8192), file.alloc_buf(4096)], 16384)
            .await;
        log.push(format!("readv {:?}", r));
        let mut got = bufs[0].as_slice().to_vec();
        got.extend_from_slice(bufs[1].as_slice());
        let mut want = pattern(4096, 4);
        want.extend(pattern(8192, 5));
        assert_eq!(got, want);

        // FUA and PREFLUSH writes
        let (r, _) = file
            .write_at_with(filled(&file, 4096, 6), 28672, IoFlags::FUA)
            .await;
        log.push(format!("write fua {:?}", r));
        let (r, _) = file
            .write_at_with(
                filled(&file, 4096, 7),
                32768,
                IoFlags::PREFLUSH | IoFlags::FUA,
            )
            .await;
        log.push(format!("write preflush {:?}", r));
        log.push(format!("fsync {:?}", file.fsync().await));
        log.push(format!("fdatasync {:?}", file.fdatasync().await));

        // write zeroes, discard (punch hole), fallocate
        log.push(format!(
            "write_zeroes {:?}",
            file.write_zeroes(0, 4096).await
        ));
        let (_, buf) = file.read_at(file.alloc_buf(4096), 0).await;
        assert!(buf.as_slice().iter().all(|&b| b == 0), "zeroed");
        log.push(format!("discard {:?}", file.discard(4096, 4096).await));
        let (_, buf) = file.read_at(file.alloc_buf(4096), 4096).await;
        assert!(buf.as_slice().iter().all(|&b| b == 0), "punched");
        let (_, buf) = file.read_at(file.alloc_buf(4096), 8192).await;
        assert_eq!(buf.as_slice(), &pattern(4096, 3)[..], "neighbour untouched");
        log.push(format!(
            "fallocate {:?}",
            file.fallocate(65536, 65536, 0).await
        ));
        let (r, _) = file.read_at(file.alloc_buf(4096), 65536).await;
        log.push(format!("read fallocated {:?}", r));

        // bad input: refused before submission, buffer handed back
        let (r, buf) = file.read_at(file.alloc_buf(4096), 100).await;
        match r {
            Err(e) => {
                assert!(matches!(e.kind(), ErrorKind::InvalidInput(_)), "{e}");
                log.push(format!("unaligned {e}"));
            }
            Ok(n) => panic!("unaligned read succeeded with {n}"),
        }
        assert_eq!(buf.len(), 4096);
        let (r, _) = file.read_at(file.alloc_buf(0), 0).await;
        log.push(format!("zero length {:?}", r.map_err(|e| e.to_string())));
    });
    assert_eq!(driver.in_flight(), 0);
    log
}

#[test]
fn uring_and_sync_backends_give_identical_results() {
    let uring = op_suite(BackendKind::Uring);
    let sync = op_suite(BackendKind::Sync);
    assert_eq!(uring, sync);
    assert!(uring.iter().any(|l| l == "read Ok(16384)"), "{uring:?}");
}

/// A 4,864-byte file: an 8 KiB read at 0 returns 4,864; 4 KiB reads at 4 KiB
/// and 8 KiB return 768 and 0.
fn eof_reads(kind: BackendKind, direct: bool) -> Vec<usize> {
    let driver = DeviceDriver::with_ring(&RingConfig::default()).expect("ring");
    let tmp = temp_file();
    tmp.as_file()
        .write_all_at(&pattern(4864, 9), 0)
        .expect("seed file");
    let file =
        File::open_with(tmp.path(), OpenOptions::new().backend(kind).direct(direct)).expect("open");
    block_on(&driver, async {
        let mut out = Vec::new();
        for (len, off) in [(8192, 0), (4096, 4096), (4096, 8192)] {
            let (r, buf) = file.read_at(file.alloc_buf(len), off).await;
            let n = r.expect("read");
            assert_eq!(buf.len(), n);
            let start = (off as usize).min(4864);
            assert_eq!(buf.as_slice(), &pattern(4864, 9)[start..start + n]);
            out.push(n);
        }
        out
    })
}

#[test]
fn end_of_file_reads_return_short_counts_then_zero() {
    for kind in [BackendKind::Uring, BackendKind::Sync] {
        for direct in [true, false] {
            assert_eq!(
                eof_reads(kind, direct),
                vec![4864, 768, 0],
                "{kind:?} direct={direct}"
            );
        }
    }
}

#[test]
fn dropped_future_keeps_buffer_until_completion() {
    let driver = DeviceDriver::with_ring(&RingConfig::default()).expect("ring");
    let tmp = temp_file();
    let file = open(tmp.path(), BackendKind::Uring);
    block_on(&driver, async {
        let (r, _) = file.write_at(filled(&file, 65536, 11), 0).await;
        assert_eq!(r.expect("write"), 65536);
    });
    // Submit 64 reads, poll each once so they are in flight, drop them all.
    {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let mut futs: Vec<_> = (0..64)
            .map(|i| Box::pin(file.read_at(file.alloc_buf(4096), (i % 16) * 4096)))
            .collect();
        for f in &mut futs {
            assert!(f.as_mut().poll(&mut cx).is_pending());
        }
        plugio_device::submit_now().expect("submit");
    }
    assert!(
        driver.in_flight() >= 64,
        "dropped reads stay in flight until reaped"
    );
    // The driver drains them; a later read still sees correct data.
    block_on(&driver, async {
        let (r, buf) = file.read_at(file.alloc_buf(4096), 8192).await;
        assert_eq!(r.expect("read"), 4096);
        assert_eq!(buf.as_slice(), &pattern(65536, 11)[8192..12288]);
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while driver.in_flight() > 0 && std::time::Instant::now() < deadline {
        use plugio_executor::Driver;
        driver
            .park(Some(std::time::Duration::from_millis(10)))
            .expect("park");
    }
    assert_eq!(driver.in_flight(), 0, "every orphaned read completed");
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
