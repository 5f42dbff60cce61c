//! Registered arena buffers under pressure: more buffers held than the
//! arena has chunks, buffers dropped on other threads, reads across the
//! end of a file into arena chunks, and a runtime whose registration the
//! kernel refused.

use std::future::Future;
use std::time::Duration;

use plugio_device::buf::{arena_stats, configure_arena, ArenaConfig};
use plugio_device::DmaBuf;
use plugio_engine::{Device, DeviceOptions};

mod common;
use common::{local, tmpdir, watchdog};

fn span(b: &DmaBuf) -> (usize, usize) {
    let p = b.as_slice().as_ptr() as usize;
    (p, p + b.len().max(1))
}

fn assert_disjoint(bufs: &[DmaBuf]) {
    let mut spans: Vec<_> = bufs.iter().map(span).collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "two live buffers share memory: {w:?}");
    }
}

/// 200 page buffers held at once from a 64-chunk arena: the rest come
/// from the cache; no two share memory; all written in one tick (merged
/// or not) and read back in one tick; then half are dropped on another
/// thread and new ones allocated: still disjoint and still correct.
#[test]
fn more_buffers_than_arena_chunks_held_at_once_and_dropped_remotely() {
    watchdog(120, || {
        let dir = tmpdir();
        let path = dir.path().join("arena");
        std::fs::write(&path, vec![0u8; 200 * 4096]).unwrap();
        for nomerges in [2u8, 0] {
            let path = path.clone();
            local().run(async move {
                let dev = Device::open(
                    &path,
                    DeviceOptions {
                        nomerges,
                        ..Default::default()
                    },
                )
                .expect("open");
                println!("arena: {:?}", arena_stats());
                let mut bufs: Vec<DmaBuf> = (0..200).map(|_| dev.alloc_buf(4096)).collect();
                assert_disjoint(&bufs);
                let from_arena = bufs.iter().filter(|b| b.is_from_arena()).count();
                assert!(
                    from_arena <= 64,
                    "{from_arena} arena buffers from 64 chunks"
                );
                for (i, b) in bufs.iter_mut().enumerate() {
                    b.as_mut_slice().fill(i as u8 ^ nomerges);
                }
                let writes = bufs
                    .into_iter()
                    .enumerate()
                    .map(|(i, b)| dev.write_at(b, i as u64 * 4096));
                let mut back: Vec<DmaBuf> = Vec::new();
                for (r, b) in futures::future::join_all(writes).await {
                    assert_eq!(r.expect("write"), 4096);
                    back.push(b);
                }
                // Half of them go to another thread and are dropped there.
                let second: Vec<DmaBuf> = back.split_off(100);
                std::thread::spawn(move || drop(second)).join().unwrap();
                // New buffers (some reuse remotely returned chunks) must not
                // alias the ones still held.
                let mut fresh: Vec<DmaBuf> = (0..150).map(|_| dev.alloc_buf(4096)).collect();
                let mut all: Vec<DmaBuf> = Vec::new();
                all.append(&mut back);
                all.append(&mut fresh);
                assert_disjoint(&all);
                let held = all.split_off(150);
                for (i, b) in all.iter().enumerate().take(100) {
                    assert!(
                        b.as_slice().iter().all(|&x| x == i as u8 ^ nomerges),
                        "buffer {i} changed after the others were reused"
                    );
                }
                drop(all);
                let reads = (0..200u64).map(|i| dev.read_alloc_at(i * 4096, 4096));
                for (i, r) in futures::future::join_all(reads)
                    .await
                    .into_iter()
                    .enumerate()
                {
                    let r = r.expect("read");
                    assert!(
                        r.as_slice().iter().all(|&x| x == i as u8 ^ nomerges),
                        "page {i} read back wrong"
                    );
                }
                drop(held);
                assert_eq!(dev.tags_in_use(), 0);
                let s = dev.iostats();
                println!(
                    "nomerges {nomerges}: fixed requests {}",
                    s.fixed_buf_requests
                );
            });
        }
    });
}

/// Reads across the end of a file into arena chunks that held other
/// bytes before: the buffer ends at the file's end (its stale tail is
/// not exposed), and a short read resumed at an aligned boundary inside
/// the chunk lands at the right place.
#[test]
fn reads_across_end_of_file_into_reused_arena_chunks() {
    watchdog(120, || {
        let dir = tmpdir();
        let path = dir.path().join("eof");
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        local().run(async move {
            let dev = Device::open(&path, DeviceOptions::default()).expect("open");
            for round in 0..20u64 {
                // Dirty every chunk first.
                let junk: Vec<DmaBuf> = (0..64)
                    .map(|_| {
                        let mut b = dev.alloc_buf(65536);
                        b.as_mut_slice().fill(0xAB);
                        b
                    })
                    .collect();
                drop(junk);
                let off = (round % 5) * 4096;
                let reads =
                    (0..4u64).map(|k| dev.read_alloc_at(off + k * 4096, 4096 * (1 + k as usize)));
                for (k, r) in futures::future::join_all(reads)
                    .await
                    .into_iter()
                    .enumerate()
                {
                    let r = r.expect("read");
                    let start = (off + k as u64 * 4096) as usize;
                    let want =
                        &data[start.min(data.len())..(start + 4096 * (1 + k)).min(data.len())];
                    assert_eq!(r.len(), want.len(), "round {round} read {k}");
                    assert!(r.as_slice() == want, "round {round} read {k}: bytes");
                }
            }
            assert_eq!(dev.tags_in_use(), 0);
        });
    });
}

/// A runtime whose arena the kernel refuses to register (larger than the
/// 1 GiB a registered buffer may be): `alloc_buf` and `read_at` fall back
/// to unregistered buffers and IO is correct.
#[test]
fn read_at_on_a_runtime_whose_registration_failed() {
    watchdog(120, || {
        // Runs on the watchdog's fresh thread: the arena is not yet made.
        assert!(configure_arena(ArenaConfig {
            chunk_bytes: 1 << 20,
            nr_chunks: 1100,
        }));
        let dir = tmpdir();
        let path = dir.path().join("noreg");
        let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i / 4096) as u8 ^ 0x3c).collect();
        std::fs::write(&path, &data).unwrap();
        local().run(async move {
            let st = arena_stats();
            println!("arena: {st:?}");
            let dev = Device::open(&path, DeviceOptions::default()).expect("open");
            let reads = (0..64u64).map(|i| dev.read_alloc_at(i * 16384, 16384));
            for (i, r) in futures::future::join_all(reads)
                .await
                .into_iter()
                .enumerate()
            {
                let r = r.expect("read");
                let s = i * 16384;
                assert!(r.as_slice() == &data[s..s + 16384], "read {i}");
            }
            let mut b = dev.alloc_buf(8192);
            b.as_mut_slice().fill(0x42);
            dev.write_at(b, 8192).await.0.expect("write");
            let r = dev.read_alloc_at(8192, 8192).await.expect("read back");
            assert!(r.as_slice().iter().all(|&x| x == 0x42));
            if let Some(st) = st {
                assert!(!st.registered, "a 1.1 GiB buffer was registered?");
                assert_eq!(dev.iostats().fixed_buf_requests, 0);
            }
        });
    });
}

/// IO futures are `Send`: one first polled on its core and then dropped on
/// another thread must not leak its bio and buffer for good. 64 reads
/// into arena chunks, each future dropped on a helper thread (after its
/// read completed, or while in flight): afterwards the arena's chunks are
/// all free again.
#[test]
fn io_futures_dropped_on_another_thread_give_their_buffers_back() {
    watchdog(120, || {
        let dir = tmpdir();
        let path = dir.path().join("remote_drop");
        std::fs::write(&path, vec![9u8; 64 * 4096]).unwrap();
        local().run(async move {
            if !arena_stats().is_some_and(|s| s.registered) {
                println!("arena not registered here: nothing to check");
                return;
            }
            let dev = Device::open(&path, DeviceOptions::default()).expect("open");
            for i in 0..64u64 {
                let b = dev.alloc_buf(4096);
                assert!(b.is_from_arena());
                let mut f = Box::pin(dev.read_at(b, i * 4096));
                let waker = futures::task::noop_waker();
                let mut cx = std::task::Context::from_waker(&waker);
                assert!(f.as_mut().poll(&mut cx).is_pending());
                if i % 2 == 0 {
                    // Let it complete first.
                    plugio_executor::sleep(Duration::from_millis(1)).await;
                }
                // SAFETY-free: the future borrows `dev`, which outlives
                // the helper thread (joined at once).
                std::thread::scope(|s| {
                    s.spawn(move || drop(f));
                });
            }
            // The last read, dropped in the plug, holds no tag until the
            // tick ends: without this yield the wait below could pass at
            // once and the check run while that read was still in flight
            // (seen on a busy machine: 63 of 64 chunks).
            plugio_executor::sleep(Duration::from_millis(1)).await;
            // Until every dropped read has completed (each holds its tag
            // until then), however long a busy machine takes.
            let t0 = std::time::Instant::now();
            while dev.tags_in_use() > 0 {
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "reads never completed"
                );
                plugio_executor::sleep(Duration::from_millis(1)).await;
            }
            // The core learns of remote drops at the device's next IO.
            drop(dev.read_alloc_at(0, 4096).await.expect("read"));
            let bufs: Vec<DmaBuf> = (0..64).map(|_| dev.alloc_buf(4096)).collect();
            let from_arena = bufs.iter().filter(|b| b.is_from_arena()).count();
            assert_eq!(
                from_arena, 64,
                "arena chunks leaked by IO futures dropped on another thread"
            );
        });
    });
}
