//! The device layer's IO path (a `DeviceDriver` parked by `block_on`, IO
//! through `File`) in every ring configuration of the matrix
//! (`tests/common/matrix.rs`): plain, `DEFER_TASKRUN` + `SINGLE_ISSUER`,
//! `COOP_TASKRUN`, SQPOLL, registered buffers and files off, the sync
//! fallback (no io_uring) and the mem device. Each test is written once
//! inside `matrix!` and runs as `<config>::<test>`.
//!
//! The op suite, end-of-file reads and dropped-future tests moved here
//! from `file_ops.rs`, which ran them on the default ring (and the op
//! suite also on the sync backend, now the reference every column is
//! compared with).

use std::future::Future;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use plugio_device::backend::mem::{Latency, MemClock};
use plugio_device::backend::BackendKind;
use plugio_device::testing::block_on;
use plugio_device::{
    DeviceDriver, DmaBuf, ErrorKind, File, IoFlags, MemConfig, MemDevice, OpenOptions,
};
use plugio_executor::Driver;

mod common;

#[path = "common/matrix.rs"]
#[macro_use]
mod setup;

use common::{pattern, temp_file};
use setup::Setup;

/// The device a test of `setup` runs on: `tmp` opened through the ring
/// (`BackendKind::Uring`; on the sync fallback's ring-less driver its ops
/// go to the pool), or a fresh 1 MiB `MemDevice` with 1-50 µs of virtual
/// latency per op.
fn device(setup: Setup, tmp: &tempfile::NamedTempFile) -> File {
    if setup.mem_device() {
        File::from_backend(Arc::new(MemDevice::new(MemConfig {
            capacity_bytes: 1 << 20,
            latency: Latency::Uniform {
                min: Duration::from_micros(1),
                max: Duration::from_micros(50),
            },
            clock: MemClock::Virtual,
            ..MemConfig::default()
        })))
    } else {
        File::open_with(
            tmp.path(),
            OpenOptions::new().create(true).backend(BackendKind::Uring),
        )
        .expect("open O_DIRECT")
    }
}

fn filled(file: &File, len: usize, seed: u64) -> DmaBuf {
    let mut b = file.alloc_buf(len);
    b.as_mut_slice().copy_from_slice(&pattern(len, seed));
    b
}

/// Whether buffers from the thread's arena are registered with the
/// thread's ring (the mem device's too, though its IO never reaches the
/// ring).
fn fixed_buffers_expected(setup: Setup, driver: &DeviceDriver) -> bool {
    let registered = plugio_device::buf::arena_stats().is_some_and(|s| s.registered);
    match setup {
        Setup::Unregistered | Setup::SyncFallback => false,
        _ if driver.ring_info().is_none() => false,
        _ if !registered => {
            setup.skip("buffer registration refused here (memlock)");
            false
        }
        _ => true,
    }
}

/// Runs every op on `file` under `driver` and returns a transcript of the
/// results (the same ops and checks on every device).
fn op_suite(driver: &DeviceDriver, file: &File) -> Vec<String> {
    let mut log = Vec::new();
    block_on(driver, async {
        // write + read back
        let (r, _) = file.write_at(filled(file, 16384, 1), 0).await;
        log.push(format!("write {r:?}"));
        let (r, buf) = file.read_at(file.alloc_buf(16384), 0).await;
        log.push(format!("read {r:?}"));
        assert_eq!(buf.as_slice(), &pattern(16384, 1)[..]);

        // arena buffer
        let (r, _) = file.write_at(filled(file, 4096, 2), 4096).await;
        log.push(format!("write arena {r:?}"));
        let (r, buf) = file.read_at(file.alloc_buf(4096), 4096).await;
        log.push(format!("read arena {r:?}"));
        assert_eq!(buf.as_slice(), &pattern(4096, 2)[..]);

        // heap (never registered) buffer
        let mut heap = DmaBuf::heap(8192, 4096);
        heap.as_mut_slice().copy_from_slice(&pattern(8192, 3));
        let (r, _) = file.write_at(heap, 8192).await;
        log.push(format!("write heap {r:?}"));

        // writev / readv
        let bufs = vec![filled(file, 4096, 4), filled(file, 8192, 5)];
        let (r, _) = file.writev_at(bufs, 16384).await;
        log.push(format!("writev {r:?}"));
        let (r, bufs) = file
            .readv_at(vec![file.alloc_buf(8192), file.alloc_buf(4096)], 16384)
            .await;
        log.push(format!("readv {r:?}"));
        let mut got = bufs[0].as_slice().to_vec();
        got.extend_from_slice(bufs[1].as_slice());
        let mut want = pattern(4096, 4);
        want.extend(pattern(8192, 5));
        assert_eq!(got, want);

        // FUA and PREFLUSH writes, fsync, fdatasync
        let (r, _) = file
            .write_at_with(filled(file, 4096, 6), 28672, IoFlags::FUA)
            .await;
        log.push(format!("write fua {r:?}"));
        let flags = IoFlags::PREFLUSH | IoFlags::FUA;
        let (r, _) = file
            .write_at_with(filled(file, 4096, 7), 32768, flags)
            .await;
        log.push(format!("write preflush {r:?}"));
        log.push(format!("fsync {:?}", file.fsync().await));
        log.push(format!("fdatasync {:?}", file.fdatasync().await));

        // write zeroes, discard, fallocate
        log.push(format!(
            "write_zeroes {:?}",
            file.write_zeroes(0, 4096).await
        ));
        let (_, buf) = file.read_at(file.alloc_buf(4096), 0).await;
        assert!(buf.as_slice().iter().all(|&b| b == 0), "zeroed");
        log.push(format!("discard {:?}", file.discard(4096, 4096).await));
        let (_, buf) = file.read_at(file.alloc_buf(4096), 4096).await;
        assert!(buf.as_slice().iter().all(|&b| b == 0), "discarded");
        let (_, buf) = file.read_at(file.alloc_buf(4096), 8192).await;
        assert_eq!(buf.as_slice(), &pattern(4096, 3)[..], "neighbour untouched");
        log.push(format!(
            "fallocate {:?}",
            file.fallocate(65536, 65536, 0).await
        ));
        let (r, _) = file.read_at(file.alloc_buf(4096), 65536).await;
        log.push(format!("read fallocated {r:?}"));

        // bad input: refused before submission, buffer handed back
        let (r, buf) = file.read_at(file.alloc_buf(4096), 100).await;
        let e = r.expect_err("unaligned read");
        assert!(matches!(e.kind(), ErrorKind::InvalidInput(_)), "{e}");
        log.push(format!("unaligned {:?}", e.kind()));
        assert_eq!(buf.len(), 4096);
        let (r, _) = file.read_at(file.alloc_buf(0), 0).await;
        log.push(format!("zero length {:?}", r.map_err(|e| e.kind().clone())));
    });
    assert_eq!(driver.in_flight(), 0);
    log
}

/// The op suite on the sync backend over a ring-less driver, on its own
/// thread: what every configuration's transcript must equal.
fn reference_transcript() -> Vec<String> {
    std::thread::spawn(|| {
        let driver = DeviceDriver::without_ring().expect("driver");
        let tmp = temp_file();
        let file = File::open_with(
            tmp.path(),
            OpenOptions::new().create(true).backend(BackendKind::Sync),
        )
        .expect("open");
        op_suite(&driver, &file)
    })
    .join()
    .expect("reference run")
}

matrix! {
    /// The module's name, not its `SETUP`, says what to expect; the
    /// driver's ring, and the fixed-buffer SQEs of IO on arena buffers,
    /// must match it.
    #[test]
    fn driver_matches_the_configuration() {
        let named = Setup::from_module_path(module_path!());
        assert_eq!(SETUP, named, "matrix! wired {} to {SETUP:?}", module_path!());
        let driver = SETUP.driver();
        named.check_ring(driver.ring_info(), plugio_device::driver::uring_active());
        let tmp = temp_file();
        let file = device(SETUP, &tmp);
        assert_eq!(file.backend().kind() == BackendKind::Mem, named == Setup::Mem);
        let fixed = fixed_buffers_expected(named, &driver);
        let before = driver.ring_stats().map_or(0, |s| s.fixed_buf_sqes);
        block_on(&driver, async {
            let buf = filled(&file, 4096, 1);
            assert_eq!(buf.fixed_index().is_some(), fixed, "{}", named.name());
            let (r, _) = file.write_at(buf, 0).await;
            assert_eq!(r.expect("write"), 4096);
            let (r, buf) = file.read_at(file.alloc_buf(4096), 0).await;
            assert_eq!(r.expect("read"), 4096);
            assert_eq!(buf.as_slice(), &pattern(4096, 1)[..]);
        });
        let sqes = driver.ring_stats().map_or(0, |s| s.fixed_buf_sqes) - before;
        let want = if fixed && !named.mem_device() { 2 } else { 0 };
        assert_eq!(sqes, want, "{}: fixed-buffer SQEs", named.name());
        if !named.mem_device() {
            let mut on_disk = vec![0u8; 4096];
            tmp.as_file().read_exact_at(&mut on_disk, 0).expect("read the file");
            assert_eq!(on_disk, pattern(4096, 1), "the write reached the file");
        }
    }

    /// Every op gives the same results as on the sync backend; arena
    /// buffers are registered exactly where the configuration registers
    /// them.
    #[test]
    fn every_op_gives_the_sync_backends_results() {
        let reference = reference_transcript();
        let driver = SETUP.driver();
        let tmp = temp_file();
        let file = device(SETUP, &tmp);
        let fixed = fixed_buffers_expected(SETUP, &driver);
        assert_eq!(file.alloc_buf(4096).fixed_index().is_some(), fixed);
        let got = op_suite(&driver, &file);
        assert_eq!(got, reference, "{}", SETUP.name());
        assert!(got.iter().any(|l| l == "read Ok(16384)"), "{got:?}");
    }

    /// A 4,864-byte file: an 8 KiB read at 0 returns 4,864; 4 KiB reads at
    /// 4 KiB and 8 KiB return 768 and 0, with and without `O_DIRECT`. The
    /// mem device has no end of file: a read across its capacity is
    /// refused as bad input, and the last block reads back whole.
    #[test]
    fn end_of_file_reads_return_short_counts_then_zero() {
        let driver = SETUP.driver();
        let tmp = temp_file();
        tmp.as_file().write_all_at(&pattern(4864, 9), 0).expect("seed file");
        if SETUP.mem_device() {
            let file = device(SETUP, &tmp);
            let cap = 1u64 << 20;
            block_on(&driver, async {
                let (r, _) = file.write_at(filled(&file, 4096, 9), cap - 4096).await;
                assert_eq!(r.expect("write"), 4096);
                let (r, buf) = file.read_at(file.alloc_buf(8192), cap - 4096).await;
                let e = r.expect_err("a read across the capacity");
                assert!(matches!(e.kind(), ErrorKind::InvalidInput(_)), "{e}");
                assert_eq!(buf.len(), 8192, "the buffer comes back");
                let (r, buf) = file.read_at(file.alloc_buf(4096), cap - 4096).await;
                assert_eq!(r.expect("last block"), 4096);
                assert_eq!(buf.as_slice(), &pattern(4096, 9)[..]);
            });
            return;
        }
        for direct in [true, false] {
            let file = File::open_with(
                tmp.path(),
                OpenOptions::new().backend(BackendKind::Uring).direct(direct),
            )
            .expect("open");
            let counts = block_on(&driver, async {
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
            });
            assert_eq!(counts, vec![4864, 768, 0], "direct={direct}");
        }
    }

    /// 64 reads polled once and dropped stay in flight (on a ring, counted
    /// by `in_flight`) with their buffers kept until they complete: memory
    /// allocated right after is never written by them, and a later read
    /// sees the right data.
    #[test]
    fn dropped_futures_keep_their_buffers_until_completion() {
        let driver = SETUP.driver();
        let tmp = temp_file();
        let file = device(SETUP, &tmp);
        block_on(&driver, async {
            let (r, _) = file.write_at(filled(&file, 65536, 11), 0).await;
            assert_eq!(r.expect("write"), 65536);
        });
        {
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let mut futs: Vec<_> = (0..64)
                .map(|i| Box::pin(file.read_at(file.alloc_buf(4096), (i % 16) * 4096)))
                .collect();
            for f in &mut futs {
                assert!(f.as_mut().poll(&mut cx).is_pending());
            }
            plugio_device::submit_now().expect("submit");
        }
        let on_ring = driver.ring_info().is_some() && !SETUP.mem_device();
        if on_ring {
            assert!(driver.in_flight() >= 64, "dropped reads stay in flight until reaped");
        } else {
            assert_eq!(driver.in_flight(), 0, "{}: nothing on a ring", SETUP.name());
        }
        let junk: Vec<Vec<u8>> = (0..64).map(|_| vec![0xAB; 4096]).collect();
        block_on(&driver, async {
            let (r, buf) = file.read_at(file.alloc_buf(4096), 8192).await;
            assert_eq!(r.expect("read"), 4096);
            assert_eq!(buf.as_slice(), &pattern(65536, 11)[8192..12288]);
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while driver.in_flight() > 0 && std::time::Instant::now() < deadline {
            driver.park(Some(Duration::from_millis(10))).expect("park");
        }
        assert_eq!(driver.in_flight(), 0, "every orphaned read completed");
        // Dropping the driver waits for what the pool or mem device still
        // holds; only then is the junk checked.
        drop(driver);
        for j in &junk {
            assert!(j.iter().all(|&b| b == 0xAB), "junk memory was overwritten");
        }
    }
}
