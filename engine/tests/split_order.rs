//! A bio split at the device's request limit is one IO to the ordering
//! rules, in both orders: a write issued after a read that overlaps only
//! some of the write's requests, or only some of the read's, still waits
//! for the whole read, so none of its requests extends the file under the
//! read (which would then see the file's new size: the zeroes of the hole,
//! past the end it was issued before). Both found by break-it passes.

mod common;

use common::{local, tmpdir, watchdog};
use plugio_device::BackendKind;
use plugio_engine::{Device, DeviceOptions};

const SIZE: usize = 101_376;

#[test]
fn a_split_write_does_not_extend_the_file_under_an_earlier_read() {
    for fast_lane in [false, true] {
        watchdog(60, move || {
            let dir = tmpdir();
            let path = dir.path().join("data");
            std::fs::write(&path, vec![7u8; SIZE]).unwrap();
            local().run(async move {
                let opts = DeviceOptions {
                    max_request_bytes: Some(8192),
                    fast_lane,
                    ..DeviceOptions::default()
                };
                let dev = Device::open(&path, opts).expect("open");
                // The read covers the last 6,656 bytes and 1,536 past the
                // end; the 64 KiB write starts 4 KiB before it, so its
                // first two requests (8 KiB each) overlap the read and
                // the others lie past it, extending the file.
                let read_at = (SIZE - 6656) as u64;
                for round in 0..50 {
                    let mut w = dev.alloc_buf(65536);
                    w.as_mut_slice().fill(0xff);
                    let (r, (written, _)) = futures::join!(
                        dev.read_alloc_at(read_at, 8192),
                        dev.write_at(w, read_at - 4096)
                    );
                    assert_eq!(written.expect("write"), 65536);
                    let r = r.expect("read");
                    assert_eq!(
                        r.len(),
                        6656,
                        "fast_lane {fast_lane}, round {round}: the read saw the file grow under it"
                    );
                    assert!(
                        r.as_slice().iter().all(|&b| b == 7),
                        "fast_lane {fast_lane}, round {round}: the read saw the write"
                    );
                    // Back to the old file.
                    dev.set_len(SIZE as u64).await.expect("set_len");
                    let mut old = dev.alloc_buf(8192);
                    old.as_mut_slice().fill(7);
                    let (r, _) = dev.write_at(old, (SIZE - 8192) as u64).await;
                    r.expect("restore");
                }
                assert_eq!(dev.tags_in_use(), 0);
            });
        });
    }
}

/// The other order: the read is split, and the later write overlaps only
/// its fourth request, past the end of the file (leaving a hole). On the
/// ring and on the sync pool, buffered and O_DIRECT (before the fix, 70
/// and 147 of 200 rounds saw the file grow with O_DIRECT).
#[test]
fn a_later_write_does_not_extend_the_file_under_an_earlier_split_read() {
    const SIZE: usize = 100 * 1024;
    for backend in [BackendKind::Uring, BackendKind::Sync] {
        for direct in [false, true] {
            watchdog(120, move || {
                let dir = tmpdir();
                let path = dir.path().join("data");
                std::fs::write(&path, vec![7u8; SIZE]).unwrap();
                local().run(async move {
                    let opts = DeviceOptions {
                        max_request_bytes: Some(8192),
                        backend,
                        direct,
                        ..DeviceOptions::default()
                    };
                    let dev = Device::open(&path, opts).expect("open");
                    // The read's requests start at S-4K, S+4K, S+12K,
                    // S+20K, ...; the write covers [S+20K, S+24K).
                    let read_at = (SIZE - 4096) as u64;
                    for round in 0..200 {
                        let mut w = dev.alloc_buf(4096);
                        w.as_mut_slice().fill(0xff);
                        let (r, (written, _)) = futures::join!(
                            dev.read_alloc_at(read_at, 65536),
                            dev.write_at(w, (SIZE + 20 * 1024) as u64)
                        );
                        assert_eq!(written.expect("write"), 4096);
                        let r = r.expect("read");
                        assert_eq!(
                            r.len(),
                            4096,
                            "{backend:?}, direct {direct}, round {round}: the read saw the file grow under it"
                        );
                        assert!(r.as_slice().iter().all(|&b| b == 7));
                        dev.set_len(SIZE as u64).await.expect("set_len");
                    }
                    assert_eq!(dev.tags_in_use(), 0);
                });
            });
        }
    }
}
