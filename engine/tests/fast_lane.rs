//! The fast lane (`DeviceOptions::fast_lane`) on a file through the ring,
//! where its SQEs are written from the bios themselves: results are the
//! same as with a request per IO, a write issued after fast-lane reads
//! waits for them, IO issued after a fast-lane write waits for it, a
//! fast-lane read does not take the last tag from a request built before
//! it, and what the fast lane does not do (a short read at the end of the
//! file, a future dropped mid-IO) still ends right.

mod common;

use common::{local, tmpdir, watchdog};
use plugio_engine::{Device, DeviceOptions};

const BLOCK: usize = 4096;

fn options(fast_lane: bool) -> DeviceOptions {
    DeviceOptions {
        fast_lane,
        ..DeviceOptions::default()
    }
}

#[test]
fn reads_issued_before_an_overlapping_write_see_the_old_data() {
    for fast_lane in [true, false] {
        watchdog(120, move || {
            let dir = tmpdir();
            let path = dir.path().join("data");
            std::fs::write(&path, vec![0u8; 16 * BLOCK]).unwrap();
            local().run(async move {
                let dev = Device::open(&path, options(fast_lane)).expect("open");
                let at = 3 * BLOCK as u64;
                for round in 0..40u8 {
                    // In one plug: reads of the block (fast-lane ones: no
                    // write is live), a write of it, then a read of it.
                    let before = futures::future::join_all((0..16).map(|_| dev.read_alloc_at(at, BLOCK)));
                    let mut buf = dev.alloc_buf(BLOCK);
                    buf.as_mut_slice().fill(round + 1);
                    let (before, (written, _), after) =
                        futures::join!(before, dev.write_at(buf, at), dev.read_alloc_at(at, BLOCK));
                    assert_eq!(written.expect("write"), BLOCK);
                    for r in before {
                        let r = r.expect("read before the write");
                        assert!(
                            r.as_slice().iter().all(|&b| b == round),
                            "fast_lane {fast_lane}, round {round}: a read issued before the write saw it"
                        );
                    }
                    let after = after.expect("read after the write");
                    assert!(
                        after.as_slice().iter().all(|&b| b == round + 1),
                        "fast_lane {fast_lane}, round {round}: a read issued after the write missed it"
                    );
                }
                assert_eq!(dev.tags_in_use(), 0);
            });
        });
    }
}

/// With a write live (the interval index on), a read that overlaps no live
/// write still takes the fast lane, linked into the index; a write issued
/// after it that overlaps it waits for it, and a read that overlaps a live
/// write waits for that write. In one plug, each round: a write of block 0
/// (the index goes on), reads of block 3 (no live write there), a write of
/// block 3, then a read of each block.
#[test]
fn with_a_write_live_reads_beside_it_keep_program_order() {
    for fast_lane in [true, false] {
        watchdog(120, move || {
            let dir = tmpdir();
            let path = dir.path().join("data");
            std::fs::write(&path, vec![0u8; 16 * BLOCK]).unwrap();
            local().run(async move {
                let dev = Device::open(&path, options(fast_lane)).expect("open");
                let (at0, at3) = (0, 3 * BLOCK as u64);
                let mut old3 = 0u8;
                for round in 0..40u8 {
                    let (new0, new3) = (round + 1, round + 101);
                    let mut w0 = dev.alloc_buf(BLOCK);
                    w0.as_mut_slice().fill(new0);
                    let mut w3 = dev.alloc_buf(BLOCK);
                    w3.as_mut_slice().fill(new3);
                    let before = futures::future::join_all((0..16).map(|_| dev.read_alloc_at(at3, BLOCK)));
                    let ((r0, _), before, (r3, _), after3, after0) = futures::join!(
                        dev.write_at(w0, at0),
                        before,
                        dev.write_at(w3, at3),
                        dev.read_alloc_at(at3, BLOCK),
                        dev.read_alloc_at(at0, BLOCK)
                    );
                    assert_eq!(r0.expect("write of block 0"), BLOCK);
                    assert_eq!(r3.expect("write of block 3"), BLOCK);
                    for r in before {
                        let r = r.expect("read before the write");
                        assert!(
                            r.as_slice().iter().all(|&b| b == old3),
                            "fast_lane {fast_lane}, round {round}: a read issued before the write saw it"
                        );
                    }
                    let (after3, after0) = (after3.expect("read 3"), after0.expect("read 0"));
                    assert!(
                        after3.as_slice().iter().all(|&b| b == new3),
                        "fast_lane {fast_lane}, round {round}: a read issued after the write of block 3 missed it"
                    );
                    assert!(
                        after0.as_slice().iter().all(|&b| b == new0),
                        "fast_lane {fast_lane}, round {round}: a read issued after the write of block 0 missed it"
                    );
                    old3 = new3;
                }
                assert_eq!(dev.tags_in_use(), 0);
            });
        });
    }
}

/// A write that overlaps nothing live takes the fast lane too (a lane
/// slot in the index); what is issued after it and overlaps it waits for
/// it, and it waits for what it overlaps. In one plug, each round: a write
/// of block 0 on odd rounds (the index goes on, so the reads after it get
/// lane slots; on even rounds they go with the index off and hold every
/// write back), reads of block 5, a write of block 5, a second write of
/// it, a read of it and an fsync; with O_DIRECT and without.
#[test]
fn writes_on_the_fast_lane_keep_program_order() {
    for (fast_lane, direct) in [(true, false), (true, true), (false, true)] {
        watchdog(120, move || {
            let dir = tmpdir();
            let path = dir.path().join("data");
            std::fs::write(&path, vec![0u8; 16 * BLOCK]).unwrap();
            local().run(async move {
                let opts = DeviceOptions {
                    direct,
                    ..options(fast_lane)
                };
                let dev = Device::open(&path, opts).expect("open");
                let at = 5 * BLOCK as u64;
                let mut old = 0u8;
                let case = format!("fast_lane {fast_lane}, direct {direct}");
                for round in 0..40u8 {
                    let (first, second) = (round + 1, round + 101);
                    let mut a = dev.alloc_buf(BLOCK);
                    a.as_mut_slice().fill(first);
                    let mut b = dev.alloc_buf(BLOCK);
                    b.as_mut_slice().fill(second);
                    let w0 = async {
                        if round % 2 == 1 {
                            let mut z = dev.alloc_buf(BLOCK);
                            z.as_mut_slice().fill(round);
                            dev.write_at(z, 0).await.0.expect("write of block 0");
                        }
                    };
                    let before =
                        futures::future::join_all((0..8).map(|_| dev.read_alloc_at(at, BLOCK)));
                    let (_, before, (ra, _), (rb, _), after, synced) = futures::join!(
                        w0,
                        before,
                        dev.write_at(a, at),
                        dev.write_at(b, at),
                        dev.read_alloc_at(at, BLOCK),
                        dev.sync_all()
                    );
                    assert_eq!(ra.expect("first write"), BLOCK);
                    assert_eq!(rb.expect("second write"), BLOCK);
                    synced.expect("fsync");
                    for r in before {
                        assert!(
                            r.expect("read before").as_slice().iter().all(|&x| x == old),
                            "{case}, round {round}: a read issued before the writes saw one"
                        );
                    }
                    assert!(
                        after
                            .expect("read after")
                            .as_slice()
                            .iter()
                            .all(|&x| x == second),
                        "{case}, round {round}: a read issued after both writes saw another value"
                    );
                    old = second;
                }
                assert_eq!(dev.tags_in_use(), 0);
                let file = std::fs::read(&path).expect("read the file back");
                assert!(
                    file[at as usize..at as usize + BLOCK]
                        .iter()
                        .all(|&x| x == old),
                    "{case}: the file holds another value than the last write's"
                );
            });
        });
    }
}

#[test]
fn a_short_read_at_the_end_of_the_file_ends_right() {
    for fast_lane in [true, false] {
        watchdog(60, move || {
            let dir = tmpdir();
            let path = dir.path().join("data");
            std::fs::write(&path, vec![7u8; 3 * BLOCK]).unwrap();
            local().run(async move {
                let dev = Device::open(&path, options(fast_lane)).expect("open");
                // Half of it lies past the end: a short completion, which
                // a fast-lane bio hands to the general path (the rest is
                // read again, and its 0 bytes are the end of the file).
                let tail = dev
                    .read_alloc_at(2 * BLOCK as u64, 2 * BLOCK)
                    .await
                    .expect("read");
                assert_eq!(tail.len(), BLOCK, "fast_lane {fast_lane}");
                assert!(tail.as_slice().iter().all(|&b| b == 7));
                let past = dev
                    .read_alloc_at(3 * BLOCK as u64, BLOCK)
                    .await
                    .expect("read");
                assert_eq!(
                    past.len(),
                    0,
                    "fast_lane {fast_lane}: at the end of the file"
                );
                // A NOP takes the fast lane too; an fsync keeps its request.
                dev.nop().await.expect("nop");
                dev.sync_all().await.expect("fsync");
                assert_eq!(dev.tags_in_use(), 0);
            });
        });
    }
}

#[test]
fn fast_lane_reads_dropped_mid_io_give_every_tag_back() {
    watchdog(60, || {
        let dir = tmpdir();
        let path = dir.path().join("data");
        // Written and synced, so that no O_DIRECT read waits for writeback.
        let file = std::fs::File::create(&path).unwrap();
        std::io::Write::write_all(&mut &file, &vec![1u8; 64 * BLOCK]).unwrap();
        file.sync_all().unwrap();
        local().run(async move {
            let dev = Device::open(&path, options(true)).expect("open");
            for round in 0..20u64 {
                // Every other block: no two reads touch, so the plug does
                // not merge them and each takes the fast lane. Issued
                // (first poll), then dropped before they complete: their
                // bios are orphaned and freed by their completions.
                let mut reads: Vec<_> = (0..32)
                    .map(|i| {
                        let block = (2 * i + round % 2) % 64;
                        Box::pin(dev.read_alloc_at(block * BLOCK as u64, BLOCK))
                    })
                    .collect();
                for r in &mut reads {
                    assert!(futures::poll!(r.as_mut()).is_pending());
                }
                drop(reads);
                let kept = dev.read_alloc_at(0, BLOCK).await.expect("read");
                assert!(kept.as_slice().iter().all(|&b| b == 1));
            }
            // Every dropped read completes and gives its tag back (the
            // watchdog bounds the wait).
            while dev.tags_in_use() > 0 {
                dev.nop().await.expect("nop");
            }
        });
    });
}

/// A fast-lane read left waiting for a tag still takes the merge of a read
/// built next to it later, as its request would without the fast lane: on
/// a device of one tag whose IO takes 100 ms, read A holds the tag, read B
/// waits, and read C (a tick later, long before A is done) starts where B
/// ends: B and C go as one IO. (A round whose second tick came 100 ms late,
/// on a very busy machine, would find B gone and not merge: the test asks
/// for most rounds to merge, not all; without the merge none does.)
#[test]
fn a_read_waiting_for_a_tag_is_still_joined_by_the_next_one() {
    use plugio_device::backend::mem::{Latency, MemClock, MemConfig, MemDevice};
    use std::sync::Arc;
    for fast_lane in [true, false] {
        watchdog(120, move || {
            let mem = Arc::new(MemDevice::new(MemConfig {
                capacity_bytes: 1 << 20,
                queue_depth: 1,
                latency: Latency::Fixed(std::time::Duration::from_millis(100)),
                clock: MemClock::Real,
                ..Default::default()
            }));
            local().run(async move {
                let opts = DeviceOptions {
                    queue_depth: 1,
                    ..options(fast_lane)
                };
                let dev = Device::with_backend(mem, None, opts).expect("open");
                let rounds = 8u64;
                for round in 0..rounds {
                    let base = (round % 4) * 16 * BLOCK as u64;
                    let a = dev.read_alloc_at(base, BLOCK);
                    let b = dev.read_alloc_at(base + 2 * BLOCK as u64, BLOCK);
                    let c = async {
                        plugio_executor::yield_now().await;
                        dev.read_alloc_at(base + 3 * BLOCK as u64, BLOCK).await
                    };
                    let (a, b, c) = futures::join!(a, b, c);
                    for r in [a, b, c] {
                        assert_eq!(r.expect("read").len(), BLOCK);
                    }
                }
                let s = dev.iostats();
                assert_eq!(s.read.ios + s.read.merges, 3 * rounds);
                assert!(
                    s.read.merges >= rounds / 2,
                    "fast_lane {fast_lane}: B and C of most rounds go as one IO: {} merges in {rounds} rounds",
                    s.read.merges
                );
                assert_eq!(dev.tags_in_use(), 0);
            });
        });
    }
}

/// A fast-lane bio takes a tag only where one is to spare beyond the
/// requests built before it in the same flush (they wait in the FIFO): it
/// passes them only when they lose nothing by it. With one tag, a flush
/// of `sync_data` (a request) and then a read (fast lane) gives the tag
/// to the sync; the read waits for it, so the sync completes first.
#[test]
fn a_fast_lane_read_leaves_the_last_tag_to_a_request_built_before_it() {
    watchdog(120, || {
        let dir = tmpdir();
        let path = dir.path().join("data");
        std::fs::write(&path, vec![7u8; 4 * BLOCK]).unwrap();
        local().run(async move {
            let o = DeviceOptions {
                queue_depth: 1,
                ..options(true)
            };
            let dev = Device::open(&path, o).expect("open");
            for round in 0..20 {
                let order = std::cell::RefCell::new(Vec::new());
                let sync = async {
                    dev.sync_data().await.expect("sync_data");
                    order.borrow_mut().push("sync");
                };
                let read = async {
                    let r = dev
                        .read_alloc_at(2 * BLOCK as u64, BLOCK)
                        .await
                        .expect("read");
                    assert!(r.as_slice().iter().all(|&b| b == 7));
                    order.borrow_mut().push("read");
                };
                futures::join!(sync, read);
                assert_eq!(
                    *order.borrow(),
                    ["sync", "read"],
                    "round {round}: the read took the one tag ahead of the sync built before it"
                );
            }
            assert_eq!(dev.tags_in_use(), 0);
        });
    });
}
