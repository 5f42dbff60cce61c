//! The engine's core path on real files: bio -> plug -> tags -> io_uring ->
//! completion, with the correctness rules of the core-path issue.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use plugio_device::{ErrorKind, InvalidInput, RingConfig};
use plugio_engine::device::Device;
use plugio_engine::options::DeviceOptions;
use plugio_executor::ShutdownMode;

/// A temporary directory on a file system that takes O_DIRECT (the target
/// dir, not a tmpfs /tmp).
fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

fn pattern(off: u64, len: usize, seed: u8) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((off + i) as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn file_with(dir: &tempfile::TempDir, name: &str, data: &[u8]) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, data).expect("write fixture");
    path
}

fn local() -> plugio_executor::LocalExecutor {
    plugio_engine::runtime::local(RingConfig::default()).expect("local executor")
}

#[test]
fn write_then_read_back_through_the_whole_path() {
    let dir = tmpdir();
    let path = file_with(&dir, "a", &vec![0u8; 1 << 20]);
    let ex = local();
    ex.run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        let mut buf = dev.alloc_buf(64 * 1024);
        buf.as_mut_slice()
            .copy_from_slice(&pattern(4096, 64 * 1024, 7));
        let (res, _) = dev.write_at(buf, 4096).await;
        assert_eq!(res.expect("write"), 64 * 1024);
        dev.sync_data().await.expect("flush");
        let got = dev.read_alloc_at(4096, 64 * 1024).await.expect("read");
        assert_eq!(got.as_slice(), &pattern(4096, 64 * 1024, 7)[..]);
        assert_eq!(dev.tags_in_use(), 0);
    });
}

#[test]
fn short_reads_at_end_of_file() {
    let dir = tmpdir();
    let path = file_with(&dir, "eof", &pattern(0, 4864, 1));
    let ex = local();
    ex.run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        let a = dev.read_alloc_at(0, 8192).await.expect("read 0");
        assert_eq!(a.len(), 4864);
        assert_eq!(a.as_slice(), &pattern(0, 4864, 1)[..]);
        let b = dev.read_alloc_at(4096, 4096).await.expect("read 4k");
        assert_eq!(b.len(), 768);
        let c = dev.read_alloc_at(8192, 4096).await.expect("read 8k");
        assert_eq!(c.len(), 0);
    });
}

/// Polls `fut` once with a no-op waker.
fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    fut.poll(&mut cx)
}

#[test]
fn dropped_in_flight_reads_never_corrupt_memory_or_leak_tags() {
    let dir = tmpdir();
    let size = 1 << 20;
    let path = file_with(&dir, "drop", &pattern(0, size, 3));
    let ex = local();
    ex.run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        for round in 0..1000u64 {
            // 64 reads issued, then dropped while plugged or in flight.
            {
                let mut futs: Vec<_> = (0..64u64)
                    .map(|i| Box::pin(dev.read_alloc_at(((round * 64 + i) % 256) * 4096, 4096)))
                    .collect();
                for f in futs.iter_mut() {
                    assert!(poll_once(f.as_mut()).is_pending());
                }
                if round % 2 == 0 {
                    plugio_executor::yield_now().await; // let some reach the kernel
                }
            }
            // Reuse memory right away: these buffers may land where the
            // dropped futures' buffers would have been.
            let mut junk: Vec<Vec<u8>> = (0..64).map(|_| vec![0xAB; 4096]).collect();
            let check = dev
                .read_alloc_at((round % 256) * 4096, 4096)
                .await
                .expect("read");
            let off = (round % 256) * 4096;
            assert_eq!(
                check.as_slice(),
                &pattern(off, 4096, 3)[..],
                "round {round}"
            );
            for j in &mut junk {
                assert!(j.iter().all(|&b| b == 0xAB), "junk memory was overwritten");
                j[0] = 0;
            }
        }
        // Everything dropped has completed by now or will on the next park.
        for _ in 0..100 {
            if dev.tags_in_use() == 0 {
                break;
            }
            plugio_executor::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(dev.tags_in_use(), 0);
    });
}

#[test]
fn a_request_above_the_limit_is_split_and_parts_wait_for_tags() {
    let dir = tmpdir();
    let size = 1 << 20;
    let path = file_with(&dir, "split", &vec![0u8; size]);
    let ex = local();
    ex.run(async {
        let opts = DeviceOptions {
            queue_depth: 4,
            max_request_bytes: Some(4096),
            ..Default::default()
        };
        let dev = Device::open(&path, opts).expect("open");
        assert_eq!(dev.max_request_bytes(), 4096);
        let mut buf = dev.alloc_buf(256 * 1024);
        buf.as_mut_slice()
            .copy_from_slice(&pattern(0, 256 * 1024, 9));
        // 64 requests through 4 tags.
        let (res, _) = dev.write_at(buf, 0).await;
        assert_eq!(res.expect("split write"), 256 * 1024);
        let got = dev.read_alloc_at(0, 256 * 1024).await.expect("split read");
        assert_eq!(got.as_slice(), &pattern(0, 256 * 1024, 9)[..]);
        // A split read across end of file: the prefix before EOF.
        let short = dev
            .read_alloc_at(size as u64 - 8192, 64 * 1024)
            .await
            .expect("eof read");
        assert_eq!(short.len(), 8192);
        assert_eq!(dev.tags_in_use(), 0);
    });
}

#[test]
fn bad_input_is_refused_before_submission_and_others_are_unaffected() {
    let dir = tmpdir();
    let path = file_with(&dir, "bad", &pattern(0, 1 << 20, 5));
    let ex = local();
    ex.run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        let good = plugio_executor::spawn_local({
            let dev = dev.clone();
            async move {
                for i in 0..64u64 {
                    let b = dev.read_alloc_at(i * 4096, 4096).await.expect("good read");
                    assert_eq!(b.as_slice(), &pattern(i * 4096, 4096, 5)[..]);
                }
            }
        });
        let err = dev
            .read_alloc_at(100, 4096)
            .await
            .expect_err("unaligned offset");
        assert!(matches!(
            err.kind(),
            ErrorKind::InvalidInput(InvalidInput::Alignment { what: "offset", .. })
        ));
        assert!(err.to_string().contains("offset"), "{err}");
        let err = dev
            .read_alloc_at(0, 1000)
            .await
            .expect_err("unaligned length");
        assert!(matches!(err.kind(), ErrorKind::InvalidInput(_)), "{err}");
        let err = dev.read_alloc_at(0, 0).await.expect_err("zero length");
        assert!(matches!(
            err.kind(),
            ErrorKind::InvalidInput(InvalidInput::Length { len_bytes: 0, .. })
        ));
        let err = dev.read_alloc_at(0, 1 << 31).await.expect_err("too large");
        assert!(matches!(
            err.kind(),
            ErrorKind::InvalidInput(InvalidInput::Length { .. })
        ));
        // A buffer that is not aligned in memory: a heap buffer aligned to
        // 512 whose address is offset by 512 from a 4 KiB boundary would be
        // refused; build one with 1-byte alignment by slicing a larger one.
        let misaligned = plugio_device::DmaBuf::heap(4096 + 1, 1);
        if misaligned.as_ptr() as usize % dev.geometry().mem_align_bytes() as usize != 0 {
            let (res, _) = dev.write_at(misaligned, 0).await;
            assert!(matches!(
                res.expect_err("unaligned buffer").kind(),
                ErrorKind::InvalidInput(_)
            ));
        }
        good.await.expect("good task");
        assert_eq!(dev.tags_in_use(), 0);
    });
}

#[test]
fn ten_thousand_ios_against_depth_32_from_every_core_all_complete() {
    ten_thousand_ios(plugio_engine::TagSharing::Shared);
}

#[test]
fn ten_thousand_ios_with_tags_split_per_core_all_complete() {
    ten_thousand_ios(plugio_engine::TagSharing::PerCore { cores: 2 });
}

fn ten_thousand_ios(tag_sharing: plugio_engine::TagSharing) {
    let dir = tmpdir();
    let path = file_with(&dir, "many", &pattern(0, 1 << 20, 11));
    let cores = 2;
    let rt = plugio_engine::runtime::builder(RingConfig::default())
        .cores(cores)
        .build()
        .expect("runtime");
    let dev = Device::open(
        &path,
        DeviceOptions {
            queue_depth: 32,
            tag_sharing,
            ..Default::default()
        },
    )
    .expect("open");
    let per_core = 10_000 / cores;
    let mut joins = Vec::new();
    for core in 0..cores {
        let dev = dev.clone();
        joins.push(rt.spawn_on(core, async move {
            let tasks: Vec<_> = (0..per_core)
                .map(|i| {
                    let dev = dev.clone();
                    plugio_executor::spawn(async move {
                        let off = ((i * 7 + core) % 256) as u64 * 4096;
                        let t0 = Instant::now();
                        let b = dev.read_alloc_at(off, 4096).await.expect("read");
                        assert_eq!(b.as_slice(), &pattern(off, 4096, 11)[..]);
                        t0.elapsed()
                    })
                })
                .collect();
            let mut max = Duration::ZERO;
            for t in tasks {
                max = max.max(t.await.expect("io task"));
            }
            max
        }));
    }
    let mut worst = Duration::ZERO;
    for j in joins {
        worst = worst.max(rt.block_on(j).expect("core task"));
    }
    println!(
        "10,000 IOs at queue depth 32 on {cores} cores ({tag_sharing:?}): maximum wait {worst:?}"
    );
    assert!(worst < Duration::from_secs(20), "a task waited {worst:?}");
    assert_eq!(dev.tags_in_use(), 0);
    rt.shutdown(ShutdownMode::Wait).expect("shutdown");
}

#[test]
fn shutdown_with_io_plugged_and_in_flight_ends_with_no_tags_in_use() {
    let dir = tmpdir();
    let path = file_with(&dir, "shutdown", &pattern(0, 1 << 20, 2));
    let dev = Device::open(
        &path,
        DeviceOptions {
            queue_depth: 16,
            ..Default::default()
        },
    )
    .expect("open");
    let dev = Arc::new(dev);
    for _ in 0..20 {
        let rt = plugio_engine::runtime::builder(RingConfig::default())
            .cores(2)
            .build()
            .expect("runtime");
        for core in 0..2 {
            let dev = dev.clone();
            drop(rt.spawn_on(core, async move {
                for i in 0..256u64 {
                    let dev = dev.clone();
                    drop(plugio_executor::spawn(async move {
                        let _ = dev.read_alloc_at(i * 4096, 4096).await;
                    }));
                }
                // Issue more and never finish: shutdown finds them plugged.
                let mut f = pin!(dev.read_alloc_at(0, 4096));
                let _ = poll_once(f.as_mut());
                std::future::pending::<()>().await;
            }));
        }
        std::thread::sleep(Duration::from_millis(2));
        rt.shutdown(ShutdownMode::Cancel).expect("shutdown");
        assert_eq!(dev.tags_in_use(), 0, "tags left in use after shutdown");
    }
}

/// Buffers the runtime hands out come from the core's registered arena, so
/// their IO goes out as READ_FIXED/WRITE_FIXED (counted in iostats as
/// `fixed_buf_requests`) and still moves the right bytes; a plain heap
/// buffer does not. Where the kernel refused the registration (memlock),
/// nothing is fixed and the test says so.
#[test]
fn runtime_buffers_use_the_registered_arena() {
    let dir = tmpdir();
    let path = file_with(&dir, "fixed", &pattern(0, 1 << 20, 3));
    let ex = local();
    ex.run(async {
        let registered = plugio_device::buf::arena_stats().is_some_and(|s| s.registered);
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        let got = dev.read_alloc_at(8192, 4096).await.expect("read_at");
        assert_eq!(got.as_slice(), &pattern(8192, 4096, 3)[..]);
        let mut buf = dev.alloc_buf(8192);
        buf.as_mut_slice().copy_from_slice(&pattern(0, 8192, 9));
        let (res, _) = dev.write_at(buf, 65536).await;
        assert_eq!(res.expect("write"), 8192);
        let heap = plugio_device::DmaBuf::heap(4096, 4096);
        let (res, _) = dev.read_at(heap, 65536).await;
        assert_eq!(res.expect("heap read"), 4096);
        let back = dev.read_alloc_at(65536, 8192).await.expect("read back");
        assert_eq!(back.as_slice(), &pattern(0, 8192, 9)[..]);
        let fixed = dev.iostats().fixed_buf_requests;
        if registered {
            assert_eq!(
                fixed, 3,
                "read_at, alloc_buf write and read_at are fixed; the heap read is not"
            );
        } else {
            eprintln!("buffer registration refused here (memlock): no fixed-buffer IO to check");
            assert_eq!(fixed, 0);
        }
    });
}
