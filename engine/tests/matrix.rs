//! The engine's IO path in every ring configuration of the matrix
//! (`device/tests/common/matrix.rs`): plain, `DEFER_TASKRUN` +
//! `SINGLE_ISSUER`, `COOP_TASKRUN`, SQPOLL, registered buffers and files
//! off, the sync fallback (no io_uring) and the mem device. Each test is
//! written once inside `matrix!` and runs as `<config>::<test>`
//! (`cargo test -p plugio-engine --test matrix sqpoll::` runs one column).
//!
//! The tests cover the path broadly: bio -> plug -> merge -> tags -> ring
//! (or pool, or mem device) -> completion, with reads, writes, flushes,
//! splits, merges, overlap ordering, end-of-device reads, device errors,
//! dropped (cancelled) IO and shutdown with IO in flight. They moved here
//! from `core_path.rs` and `batching.rs`, which ran them on the default
//! ring only (now the `defer_taskrun` column).
//!
//! `ring_setup_matches_the_configuration` shows the matrix really varies
//! the configuration: it derives what to expect from its module's *name*
//! and checks it against the ring the core observes (`uring_active`,
//! `RingInfo` setup flags, registered files, fixed-buffer SQEs, the mem
//! device's written bytes), so a macro that ran one configuration
//! everywhere fails it.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use plugio_device::backend::mem::{Fault, FaultOn};
use plugio_device::{ErrorKind, InvalidInput, RingInfo};
use plugio_engine::{Device, DeviceOptions, Region};
use plugio_executor::ShutdownMode;

mod common;

#[path = "../../device/tests/common/matrix.rs"]
#[macro_use]
mod setup;

#[path = "common/matrix.rs"]
mod harness;

use harness::{Case, Fixture};
use setup::Setup;

fn pattern(off: u64, len: usize, seed: u8) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((off + i) as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// How many rounds or IOs a long test runs in `setup`: `full` in the
/// default configuration (`defer_taskrun`, what these tests ran on before
/// the matrix) and with `PLUGIO_MATRIX_FULL=1`, a quarter of it in the
/// other columns, which keeps the matrix's share of CI short.
fn scaled(setup: Setup, full: u64) -> u64 {
    if setup == Setup::DeferTaskrun || std::env::var_os("PLUGIO_MATRIX_FULL").is_some() {
        full
    } else {
        full / 4
    }
}

/// Polls `fut` once with a no-op waker.
fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    fut.poll(&mut cx)
}

/// What a core saw of its ring while it did a few IOs.
#[derive(Debug)]
struct Observed {
    uring_active: bool,
    info: Option<RingInfo>,
    /// `RingStats::fixed_buf_sqes` gained during the IOs.
    fixed_buf_sqes: u64,
    /// The device's `iostats().fixed_buf_requests`.
    fixed_buf_requests: u64,
    /// Whether the core's arena is registered; `None` without an arena.
    arena_registered: Option<bool>,
    /// Bytes the mem device took during the IOs (0 for a file).
    mem_written_bytes: u64,
}

/// Reads and writes on `fx` in `case`'s executor (three IOs on arena
/// buffers, one on a heap buffer) and reports what the core observed.
fn observe(case: &Case, fx: &Fixture) -> Observed {
    let mem_before = fx.mem().map_or(0, |m| m.written_bytes());
    let mut seen = case.local().run(async {
        let stats = || plugio_device::ring::current_stats().map_or(0, |s| s.fixed_buf_sqes);
        let before = stats();
        let dev = fx.open(DeviceOptions::default());
        let got = dev.read_alloc_at(8192, 4096).await.expect("read");
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
        dev.sync_data().await.expect("flush");
        Observed {
            uring_active: plugio_device::driver::uring_active(),
            info: plugio_device::ring::current_info(),
            fixed_buf_sqes: stats() - before,
            fixed_buf_requests: dev.iostats().fixed_buf_requests,
            arena_registered: plugio_device::buf::arena_stats().map(|s| s.registered),
            mem_written_bytes: 0,
        }
    });
    seen.mem_written_bytes = fx.mem().map_or(0, |m| m.written_bytes()) - mem_before;
    if let Fixture::File(path) = fx {
        let on_disk = std::fs::read(path).expect("read the file back");
        assert_eq!(
            on_disk[65536..73728],
            pattern(0, 8192, 9)[..],
            "the write reached the file"
        );
    }
    seen
}

/// Checks `seen` against what configuration `named` promises: the ring
/// ([`Setup::check_ring`]), then fixed buffers and where the bytes went.
/// A registration the kernel refused (memlock) is reported as a `SKIP` of
/// that check.
fn check_observed(named: Setup, seen: &Observed) {
    let name = named.name();
    named.check_ring(seen.info.as_ref(), seen.uring_active);
    match named {
        Setup::SyncFallback => {
            assert_ne!(
                seen.arena_registered,
                Some(true),
                "{name}: nothing registered"
            );
            assert_eq!(seen.fixed_buf_requests, 0, "{name}: no fixed-buffer IO");
        }
        Setup::Unregistered => {
            assert_eq!(seen.arena_registered, None, "{name}: the arena is off");
            assert_eq!(seen.fixed_buf_sqes, 0, "{name}: no READ_FIXED/WRITE_FIXED");
            assert_eq!(
                seen.fixed_buf_requests, 0,
                "{name}: no fixed-buffer request"
            );
        }
        Setup::Mem => {
            assert_eq!(
                seen.fixed_buf_sqes, 0,
                "{name}: mem IO never reaches the ring"
            );
            assert_eq!(
                seen.fixed_buf_requests, 0,
                "{name}: the mem device never uses a registered buffer, \
                 whatever the request names"
            );
            assert!(
                seen.mem_written_bytes >= 8192,
                "{name}: the write went to the mem device"
            );
        }
        _ if seen.info.is_none() => {}
        _ if seen.arena_registered == Some(true) => {
            assert_eq!(
                seen.fixed_buf_requests, 3,
                "{name}: the three arena-buffer IOs are fixed"
            );
            assert_eq!(
                seen.fixed_buf_sqes, 3,
                "{name}: ... and reach the ring as fixed opcodes"
            );
        }
        _ => {
            named.skip("buffer registration refused here (memlock): no fixed-buffer IO to check");
            assert_eq!(seen.fixed_buf_sqes, 0);
        }
    }
    if named != Setup::Mem {
        assert_eq!(seen.mem_written_bytes, 0);
    }
}

/// A fingerprint of what a core observed, for telling configurations
/// apart.
fn fingerprint(seen: &Observed) -> String {
    let flags = seen.info.as_ref().map(|i| {
        (
            i.defer_taskrun,
            i.coop_taskrun,
            i.sqpoll,
            i.registered_files,
        )
    });
    format!(
        "ring={} flags={flags:?} arena={:?} fixed_sqes={} mem={}",
        seen.uring_active,
        seen.arena_registered,
        seen.fixed_buf_sqes,
        seen.mem_written_bytes > 0
    )
}

/// Every configuration, each built on its own thread, leaves a different
/// fingerprint (ring or not, setup flags, registration, mem device).
#[test]
fn the_seven_configurations_observe_seven_different_setups() {
    let prints: Vec<(Setup, String)> = Setup::ALL
        .into_iter()
        .map(|setup| {
            let print = std::thread::spawn(move || {
                let case = Case::new(setup);
                let fx = case.fixture("fingerprint", &pattern(0, 1 << 20, 3));
                fingerprint(&observe(&case, &fx))
            })
            .join()
            .expect("observe");
            (setup, print)
        })
        .collect();
    let distinct: std::collections::HashSet<&String> = prints.iter().map(|(_, p)| p).collect();
    // A ring configuration the machine refused (io_uring refused; its
    // driver printed a SKIP) runs on the sync pool with the arena on, as
    // the sync fallback does, so its fingerprint is the fallback's;
    // unregistered (no arena) and mem still differ.
    let collapsed: Vec<Setup> = prints
        .iter()
        .filter(|(s, p)| {
            matches!(
                s,
                Setup::Plain | Setup::DeferTaskrun | Setup::CoopTaskrun | Setup::Sqpoll
            ) && p.starts_with("ring=false")
        })
        .map(|(s, _)| *s)
        .collect();
    for setup in &collapsed {
        setup.skip("no ring here: its fingerprint is the sync fallback's");
    }
    assert_eq!(
        distinct.len(),
        Setup::ALL.len() - collapsed.len(),
        "{prints:#?}"
    );
}

/// A write-only view of `fx` (file: a write-only descriptor, so every
/// read fails in the kernel or `pread` with `EBADF`; mem: an `EIO` fault on
/// every LBA on reads), and the errno its reads fail with.
fn read_failing(fx: &Fixture) -> (Device, i32) {
    match fx {
        Fixture::File(path) => {
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .expect("write-only open");
            let backend = plugio_device::FileBackend::from_fd(
                file.into(),
                path,
                true,
                plugio_device::BackendKind::Uring,
            )
            .expect("backend");
            let dev = Device::with_backend(Arc::new(backend), None, DeviceOptions::default())
                .expect("device");
            (dev, libc::EBADF)
        }
        Fixture::Mem(mem) => {
            mem.inject(Fault::Eio {
                lbas: 0..u64::MAX,
                on: FaultOn::Read,
            });
            (fx.open(DeviceOptions::default()), libc::EIO)
        }
    }
}

fn ten_thousand_ios(setup: Setup, tag_sharing: plugio_engine::TagSharing) {
    let case = Case::new(setup);
    let fx = case.fixture("many", &pattern(0, 1 << 20, 11));
    let cores = 2;
    let rt = case.runtime(cores);
    let dev = fx.open(DeviceOptions {
        queue_depth: 32,
        tag_sharing,
        ..Default::default()
    });
    let per_core = scaled(setup, 10_000) as usize / cores;
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
        "{}: {} IOs at queue depth 32 on {cores} cores ({tag_sharing:?}): maximum wait {worst:?}",
        setup.name(),
        per_core * cores
    );
    assert_eq!(dev.tags_in_use(), 0);
    rt.shutdown(ShutdownMode::Wait).expect("shutdown");
}

matrix! {
    /// The module's name, not its `SETUP`, says what to expect; the core's
    /// observed ring must match it.
    #[test]
    fn ring_setup_matches_the_configuration() {
        let named = Setup::from_module_path(module_path!());
        assert_eq!(SETUP, named, "matrix! wired {} to {SETUP:?}", module_path!());
        let case = Case::new(SETUP);
        let fx = case.fixture("observe", &pattern(0, 1 << 20, 3));
        check_observed(named, &observe(&case, &fx));
    }

    #[test]
    fn write_then_read_back_through_the_whole_path() {
        let case = Case::new(SETUP);
        let fx = case.fixture("a", &vec![0u8; 1 << 20]);
        case.local().run(async {
            let dev = fx.open(DeviceOptions::default());
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

    /// A file's end gives short counts, then 0; the mem device has no
    /// end of file: a read across its capacity is refused, and reads
    /// inside it return the exact bytes.
    #[test]
    fn reads_at_the_end_of_the_device() {
        let case = Case::new(SETUP);
        let fx = case.fixture("eof", &pattern(0, 4864, 1));
        case.local().run(async {
            let dev = fx.open(DeviceOptions::default());
            if fx.mem().is_some() {
                // Capacity 5120: 4864 bytes of pattern, then zeroes.
                let err = dev.read_alloc_at(0, 8192).await.expect_err("past the end");
                assert!(matches!(err.kind(), ErrorKind::InvalidInput(_)), "{err}");
                let a = dev.read_alloc_at(4096, 1024).await.expect("last block");
                let mut want = pattern(0, 4864, 1)[4096..].to_vec();
                want.resize(1024, 0);
                assert_eq!(a.as_slice(), &want[..]);
            } else {
                let a = dev.read_alloc_at(0, 8192).await.expect("read 0");
                assert_eq!(a.len(), 4864);
                assert_eq!(a.as_slice(), &pattern(0, 4864, 1)[..]);
                let b = dev.read_alloc_at(4096, 4096).await.expect("read 4k");
                assert_eq!(b.len(), 768);
                let c = dev.read_alloc_at(8192, 4096).await.expect("read 8k");
                assert_eq!(c.len(), 0);
            }
            assert_eq!(dev.tags_in_use(), 0);
        });
    }

    /// 1,000 rounds (250 outside the default column: `scaled`) of 64
    /// reads dropped while plugged or in flight, with memory reused at
    /// once.
    #[test]
    fn dropped_in_flight_reads_never_corrupt_memory_or_leak_tags() {
        let case = Case::new(SETUP);
        let fx = case.fixture("drop", &pattern(0, 1 << 20, 3));
        case.local().run(async {
            let dev = fx.open(DeviceOptions::default());
            for round in 0..scaled(SETUP, 1000) {
                // 64 reads issued, then dropped while plugged or in flight.
                {
                    let mut futs: Vec<_> = (0..64u64)
                        .map(|i| Box::pin(dev.read_alloc_at(((round * 64 + i) % 256) * 4096, 4096)))
                        .collect();
                    for f in futs.iter_mut() {
                        assert!(poll_once(f.as_mut()).is_pending());
                    }
                    if round % 2 == 0 {
                        plugio_executor::yield_now().await; // let some reach the device
                    }
                }
                // Reuse memory right away: these buffers may land where the
                // dropped futures' buffers would have been.
                let mut junk: Vec<Vec<u8>> = (0..64).map(|_| vec![0xAB; 4096]).collect();
                let off = (round % 256) * 4096;
                let check = dev.read_alloc_at(off, 4096).await.expect("read");
                assert_eq!(check.as_slice(), &pattern(off, 4096, 3)[..], "round {round}");
                for j in &mut junk {
                    assert!(j.iter().all(|&b| b == 0xAB), "junk memory was overwritten");
                    j[0] = 0;
                }
            }
            // Everything dropped has completed by now or will on the next park.
            for _ in 0..1000 {
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
        let case = Case::new(SETUP);
        let size = 1 << 20;
        let fx = case.fixture("split", &vec![0u8; size]);
        case.local().run(async {
            let dev = fx.open(DeviceOptions {
                queue_depth: 4,
                max_request_bytes: Some(4096),
                ..Default::default()
            });
            assert_eq!(dev.max_request_bytes(), 4096);
            let mut buf = dev.alloc_buf(256 * 1024);
            buf.as_mut_slice()
                .copy_from_slice(&pattern(0, 256 * 1024, 9));
            // 64 requests through 4 tags.
            let (res, _) = dev.write_at(buf, 0).await;
            assert_eq!(res.expect("split write"), 256 * 1024);
            let got = dev.read_alloc_at(0, 256 * 1024).await.expect("split read");
            assert_eq!(got.as_slice(), &pattern(0, 256 * 1024, 9)[..]);
            let tail = dev.read_alloc_at(size as u64 - 8192, 8192).await.expect("tail read");
            assert_eq!(tail.as_slice(), &vec![0u8; 8192][..]);
            if fx.mem().is_none() {
                // A split read across end of file: the prefix before EOF.
                let short = dev
                    .read_alloc_at(size as u64 - 8192, 64 * 1024)
                    .await
                    .expect("eof read");
                assert_eq!(short.len(), 8192);
            }
            assert_eq!(dev.tags_in_use(), 0);
        });
    }

    #[test]
    fn bad_input_is_refused_before_submission_and_others_are_unaffected() {
        let case = Case::new(SETUP);
        let fx = case.fixture("bad", &pattern(0, 1 << 20, 5));
        case.local().run(async {
            let dev = fx.open(DeviceOptions::default());
            let good = plugio_executor::spawn_local({
                let dev = dev.clone();
                async move {
                    for i in 0..64u64 {
                        let b = dev.read_alloc_at(i * 4096, 4096).await.expect("good read");
                        assert_eq!(b.as_slice(), &pattern(i * 4096, 4096, 5)[..]);
                    }
                }
            });
            let align = u64::from(dev.geometry().offset_align_bytes());
            let err = dev
                .read_alloc_at(align / 2, 4096)
                .await
                .expect_err("unaligned offset");
            assert!(matches!(
                err.kind(),
                ErrorKind::InvalidInput(InvalidInput::Alignment { what: "offset", .. })
            ), "{err}");
            assert!(err.to_string().contains("offset"), "{err}");
            let err = dev
                .read_alloc_at(0, align as usize + 1)
                .await
                .expect_err("unaligned length");
            assert!(matches!(err.kind(), ErrorKind::InvalidInput(_)), "{err}");
            let err = dev.read_alloc_at(0, 0).await.expect_err("zero length");
            assert!(matches!(
                err.kind(),
                ErrorKind::InvalidInput(InvalidInput::ZeroLength)
            ));
            let err = dev.read_alloc_at(0, 1 << 31).await.expect_err("too large");
            assert!(matches!(err.kind(), ErrorKind::InvalidInput(_)), "{err}");
            // A buffer not aligned in memory (1-byte alignment; refused
            // when its address happens to miss the device's alignment).
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

    /// 10,000 reads from 2 cores through 32 shared tags (2,500 outside
    /// the default column: `scaled`).
    #[test]
    fn ten_thousand_ios_against_depth_32_from_every_core_all_complete() {
        ten_thousand_ios(SETUP, plugio_engine::TagSharing::Shared);
    }

    /// As above with the tags split per core.
    #[test]
    fn ten_thousand_ios_with_tags_split_per_core_all_complete() {
        ten_thousand_ios(SETUP, plugio_engine::TagSharing::PerCore { cores: 2 });
    }

    #[test]
    fn shutdown_with_io_plugged_and_in_flight_ends_with_no_tags_in_use() {
        let case = Case::new(SETUP);
        let fx = case.fixture("shutdown", &pattern(0, 1 << 20, 2));
        let dev = Arc::new(fx.open(DeviceOptions {
            queue_depth: 16,
            ..Default::default()
        }));
        for _ in 0..20 {
            let rt = case.runtime(2);
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

    #[test]
    fn adjacent_reads_into_adjacent_pages_merge_into_one_request_with_exact_bytes() {
        let case = Case::new(SETUP);
        let fx = case.fixture("pages", &pattern(0, 64 * 1024, 4));
        case.local().run(async {
            let dev = fx.open(DeviceOptions::default());
            let mut pages = Region::new(16 * 1024, 4096).into_pages(4096);
            let p3 = pages.pop().unwrap();
            let p2 = pages.pop().unwrap();
            let p1 = pages.pop().unwrap();
            // Device offsets 0, 4 KiB, 8 KiB into region offsets 4, 8,
            // 12 KiB, issued in one tick.
            let (a, b, c) = futures::join!(
                dev.read_at(p1, 0),
                dev.read_at(p2, 4096),
                dev.read_at(p3, 8192)
            );
            for (i, (res, page)) in [a, b, c].into_iter().enumerate() {
                assert_eq!(res.expect("read"), 4096);
                let off = i as u64 * 4096;
                assert_eq!(page.as_slice(), &pattern(off, 4096, 4)[..], "page {i}");
            }
            let s = dev.iostats();
            assert_eq!((s.bios, s.requests), (3, 1), "{s:?}");
            assert_eq!(s.read.merges, 2);
            assert_eq!(s.read.ios, 1);
            assert_eq!(s.read.sectors, 24);
        });
    }

    /// Write A [0, 8 KiB), write B [2 KiB, 6 KiB), read [0, 10 KiB) in one
    /// plug: B lands on top of A and the read sees both.
    #[test]
    fn overlapping_ios_in_one_plug_keep_program_order() {
        let case = Case::new(SETUP);
        let fx = case.fixture("order", &vec![0u8; 64 * 1024]);
        for _ in 0..10 {
            case.local()
                .run(common::overlapping_writes_then_read(fx.open(DeviceOptions::default())));
        }
    }

    /// Reads the device fails (a write-only file: `EBADF`; the mem device:
    /// an `EIO` fault) end with that errno, merged or not, while writes on
    /// the same device succeed, and no tag stays held.
    #[test]
    fn device_errors_end_each_io_with_the_errno_and_release_tags() {
        let case = Case::new(SETUP);
        let fx = case.fixture("faults", &pattern(0, 1 << 20, 6));
        let (dev, errno) = read_failing(&fx);
        case.local().run(async {
            let reads = (0..16u64).map(|i| dev.read_alloc_at(i * 4096, 4096));
            for r in futures::future::join_all(reads).await {
                let err = r.expect_err("a read of a device that fails reads");
                assert_eq!(err.errno(), errno, "{err}");
            }
            let mut buf = dev.alloc_buf(4096);
            buf.as_mut_slice().copy_from_slice(&pattern(0, 4096, 8));
            let (res, _) = dev.write_at(buf, 4096).await;
            assert_eq!(res.expect("write"), 4096);
            dev.sync_data().await.expect("flush");
            assert_eq!(dev.tags_in_use(), 0);
        });
        if let Some(mem) = fx.mem() {
            mem.clear_faults();
        }
        case.local().run(async {
            let dev = fx.open(DeviceOptions::default());
            let got = dev.read_alloc_at(4096, 4096).await.expect("read after the faults");
            assert_eq!(got.as_slice(), &pattern(0, 4096, 8)[..]);
        });
    }
}
