//! With the bio and buffer caches on, the steady state of an IO loop does
//! no heap allocation per IO: a counting global allocator counts the
//! allocations made on the test's thread while IO runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use plugio_device::RingConfig;
use plugio_engine::{Device, DeviceOptions};

struct Counting;

thread_local! {
    /// Allocations counted on this thread (tests run on several threads
    /// at once: each counts only its own).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static COUNT_HERE: Cell<bool> = const { Cell::new(false) };
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

/// With `PLUGIO_ALLOC_TRACE=N`, prints where the first N counted
/// allocations come from (a debugging aid for this test).
fn trace_alloc() {
    static TRACED: AtomicU64 = AtomicU64::new(0);
    if IN_TRACE.with(|t| t.replace(true)) {
        return;
    }
    let limit: u64 = std::env::var("PLUGIO_ALLOC_TRACE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // Relaxed: a debugging counter.
    if TRACED.fetch_add(1, Ordering::Relaxed) < limit {
        eprintln!(
            "allocation at:\n{}",
            std::backtrace::Backtrace::force_capture()
        );
    }
    IN_TRACE.with(|t| t.set(false));
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNT_HERE.try_with(Cell::get).unwrap_or(false) {
            let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
            if !IN_TRACE.try_with(Cell::get).unwrap_or(true) {
                trace_alloc();
            }
        }
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNT_HERE.try_with(Cell::get).unwrap_or(false) {
            let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
            if !IN_TRACE.try_with(Cell::get).unwrap_or(true) {
                trace_alloc();
            }
        }
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations on this thread while `f` runs.
async fn count<F: std::future::Future<Output = ()>>(f: F) -> u64 {
    let before = ALLOCS.with(Cell::get);
    COUNT_HERE.with(|c| c.set(true));
    f.await;
    COUNT_HERE.with(|c| c.set(false));
    ALLOCS.with(Cell::get) - before
}

fn file(len: usize) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let path = dir.path().join("data");
    std::fs::write(&path, vec![7u8; len]).expect("fixture");
    (dir, path)
}

const IOS: u64 = 20_000;

/// Capacity growths of scratch vectors tolerated in a measured run (each
/// happens once, not per IO): far below one per thousand IOs.
const ONE_OFF_GROWTHS: u64 = 8;

#[test]
fn steady_state_read_into_loop_allocates_nothing_per_io() {
    let (_dir, path) = file(4 << 20);
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("executor");
    ex.run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        async fn pass(dev: &Device, mut b: plugio_device::DmaBuf, n: u64) -> plugio_device::DmaBuf {
            for i in 0..n {
                let (r, back) = dev.read_at(b, i * 4096 % (4 << 20)).await;
                assert_eq!(r.expect("read"), 4096);
                b = back;
            }
            b
        }
        let buf = dev.alloc_buf(4096);
        let buf = pass(&dev, buf, 2_000).await; // warm up: caches, ring slots, vectors
        let mut slot = Some(buf);
        let allocs = count(async {
            let b = slot.take().expect("buffer");
            slot = Some(pass(&dev, b, IOS).await);
        })
        .await;
        println!("read_into loop: {allocs} allocations for {IOS} IOs");
        // 0 per IO; a scratch vector may still grow once or twice when a
        // reap sees a larger batch than the warm-up did (a loaded machine).
        assert!(
            allocs <= ONE_OFF_GROWTHS,
            "{allocs} allocations in the steady state"
        );
    });
}

#[test]
fn steady_state_read_at_16_in_flight_allocates_nothing_per_io() {
    let (_dir, path) = file(4 << 20);
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("executor");
    ex.run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        let round = |n: u64| {
            let dev = dev.clone();
            async move {
                // 16 reads in flight at once, buffers from the cache.
                // (join_all of up to 30 futures makes exactly two vectors.)
                for r in 0..n / 16 {
                    let reads = (0..16u64).map(|i| dev.read_alloc_at((r * 16 + i) % 1024 * 4096, 4096));
                    for b in futures::future::join_all(reads).await {
                        assert_eq!(b.expect("read").len(), 4096);
                    }
                }
            }
        };
        round(2_048).await;
        // join_all allocates its own vectors: count them apart.
        let overhead = count(async {
            let v = (0..16u64).map(std::future::ready);
            futures::future::join_all(v).await;
        })
        .await;
        let allocs = count(round(IOS)).await;
        let rounds = IOS / 16;
        println!(
            "read_at x16: {allocs} allocations for {IOS} IOs in {rounds} rounds (join_all alone: {overhead} a round)"
        );
        assert!(
            allocs <= overhead * rounds + ONE_OFF_GROWTHS,
            "{} allocations beyond the test's own join_all",
            allocs - overhead * rounds
        );
    });
}

/// Reads of 16 KiB split in four 4 KiB requests (`max_request_bytes`):
/// a split bio's per-part results live in the bio's cold part, so with the
/// caches on the loop allocates nothing per IO, and with the bio cache off
/// each IO allocates exactly its bio and that cold part (none for the
/// parts themselves: up to four are held inline).
#[test]
fn split_reads_allocate_nothing_per_io_and_two_without_the_bio_cache() {
    let (_dir, path) = file(4 << 20);
    for bio_cache in [true, false] {
        let ex = plugio_engine::runtime::local(RingConfig::default()).expect("executor");
        ex.run(async {
            let opts = DeviceOptions {
                bio_cache,
                max_request_bytes: Some(4096),
                ..DeviceOptions::default()
            };
            let dev = Device::open(&path, opts).expect("open");
            async fn pass(dev: &Device, mut b: plugio_device::DmaBuf, n: u64) -> plugio_device::DmaBuf {
                for i in 0..n {
                    let (r, back) = dev.read_at(b, i * 16384 % (4 << 20)).await;
                    assert_eq!(r.expect("read"), 16384);
                    b = back;
                }
                b
            }
            let buf = pass(&dev, dev.alloc_buf(16384), 500).await; // warm up
            let mut slot = Some(buf);
            let ios = IOS / 4;
            let allocs = count(async {
                let b = slot.take().expect("buffer");
                slot = Some(pass(&dev, b, ios).await);
            })
            .await;
            println!("split reads, bio cache {bio_cache}: {allocs} allocations for {ios} IOs");
            let per_io = if bio_cache { 0 } else { 2 };
            assert!(
                (per_io * ios..=per_io * ios + ONE_OFF_GROWTHS).contains(&allocs),
                "{allocs} allocations for {ios} split IOs, bio cache {bio_cache}: want {per_io} per IO"
            );
        });
    }
}
