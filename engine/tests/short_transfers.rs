//! Short transfers: `Ok(n < len)` only at end of file, and for a write
//! that filled the device part way. A read or write
//! that returns a partial count resumes at the last aligned byte it
//! reached; one that moves no data (where that is no end of file) is
//! issued once more, and a second time in a row it is an error naming the
//! offset and what was left (`ErrorKind::NoProgress`).

use std::sync::Arc;
use std::time::Duration;

use plugio_device::backend::mem::{Fault, FaultOn, Latency, MemClock, MemConfig, MemDevice};
use plugio_device::ErrorKind;
use plugio_engine::{Device, DeviceOptions};

mod common;
use common::{local, tmpdir, watchdog};

fn mem(faults: Vec<Fault>) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        latency: Latency::Uniform {
            min: Duration::from_micros(1),
            max: Duration::from_micros(50),
        },
        clock: MemClock::Virtual,
        faults,
        ..MemConfig::default()
    }))
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i / 512 * 7 + i % 251) as u8).collect()
}

/// The case: the mem device's short read at block 1 of a 2-block
/// read gave `Ok(512)`. Now the read resumes at byte 512, gets nothing
/// twice and fails naming byte 512 and the 512 bytes left; a read around
/// the bad block still works.
#[test]
fn a_short_read_inside_the_device_is_an_error_naming_offset_and_length() {
    watchdog(30, || {
        let m = mem(vec![Fault::ShortRead { lba: 1 }]);
        let dev = Device::with_backend(m, None, DeviceOptions::default()).unwrap();
        local().run(async move {
            let e = dev
                .read_alloc_at(0, 1024)
                .await
                .expect_err("no end of file inside the device");
            assert_eq!(
                e.kind(),
                &ErrorKind::NoProgress {
                    offset_bytes: 512,
                    len_bytes: 512
                }
            );
            assert!(e.to_string().contains("512 bytes at offset 512"), "{e}");
            // The first request, its resumption and the one retry.
            assert_eq!(dev.iostats().requests + dev.iostats().requeues, 3);
            assert_eq!(
                dev.read_alloc_at(0, 512)
                    .await
                    .expect("before the bad block")
                    .len(),
                512
            );
            assert_eq!(dev.tags_in_use(), 0);
        });
    });
}

/// A device that answers 1,000 bytes to every read (a partial count, not
/// aligned) still gives a 16 KiB read all its bytes: it resumes at byte
/// 512 of each answer, 32 requests in all.
#[test]
fn a_partial_count_resumes_at_the_last_aligned_byte_until_done() {
    watchdog(30, || {
        let m = mem(vec![]);
        let dev = Device::with_backend(m.clone(), None, DeviceOptions::default()).unwrap();
        local().run(async move {
            let data = pattern(16384);
            let mut b = dev.alloc_buf(16384);
            b.as_mut_slice().copy_from_slice(&data);
            dev.write_at(b, 4096).await.0.expect("write");
            m.inject(Fault::Partial {
                bytes: 1000,
                on: FaultOn::Read,
                ops: u64::MAX,
            });
            let before = dev.iostats().requeues;
            let r = dev.read_alloc_at(4096, 16384).await.expect("read");
            assert_eq!(r.as_slice(), &data[..]);
            assert_eq!(dev.iostats().requeues - before, 31);
        });
    });
}

/// Less than one block back, twice in a row: the read is an error naming
/// where it stopped, after exactly one more try (no spin).
#[test]
fn a_read_that_moves_less_than_a_block_twice_is_an_error() {
    watchdog(30, || {
        let m = mem(vec![Fault::Partial {
            bytes: 100,
            on: FaultOn::Read,
            ops: u64::MAX,
        }]);
        let dev = Device::with_backend(m, None, DeviceOptions::default()).unwrap();
        local().run(async move {
            let e = dev
                .read_alloc_at(8192, 16384)
                .await
                .expect_err("no progress");
            assert_eq!(
                e.kind(),
                &ErrorKind::NoProgress {
                    offset_bytes: 8192,
                    len_bytes: 16384
                }
            );
            assert_eq!(dev.iostats().requeues, 1, "issued once more, not again");
        });
    });
}

/// One stall is forgiven: a read that gets nothing once and everything
/// the next time returns all its bytes.
#[test]
fn a_single_stall_is_issued_again_and_completes() {
    watchdog(30, || {
        let m = mem(vec![]);
        let dev = Device::with_backend(m.clone(), None, DeviceOptions::default()).unwrap();
        local().run(async move {
            let data = pattern(4096);
            let mut b = dev.alloc_buf(4096);
            b.as_mut_slice().copy_from_slice(&data);
            dev.write_at(b, 0).await.0.expect("write");
            m.inject(Fault::Partial {
                bytes: 0,
                on: FaultOn::Read,
                ops: 1,
            });
            let r = dev
                .read_alloc_at(0, 4096)
                .await
                .expect("read after one stall");
            assert_eq!(r.as_slice(), &data[..]);
            assert_eq!(dev.iostats().requeues, 1);
        });
    });
}

/// A write that moves no data twice is an error too (a write has no end
/// of file); one that moves part of its blocks resumes after them.
#[test]
fn writes_resume_after_a_partial_count_and_fail_after_two_stalls() {
    watchdog(30, || {
        let m = mem(vec![]);
        let dev = Device::with_backend(m.clone(), None, DeviceOptions::default()).unwrap();
        local().run(async move {
            let data = pattern(8192);
            m.inject(Fault::Partial {
                bytes: 3000,
                on: FaultOn::Write,
                ops: u64::MAX,
            });
            let mut b = dev.alloc_buf(8192);
            b.as_mut_slice().copy_from_slice(&data);
            assert_eq!(
                dev.write_at(b, 0).await.0.expect("partial writes resume"),
                8192
            );
            m.clear_faults();
            assert_eq!(
                dev.read_alloc_at(0, 8192).await.expect("read").as_slice(),
                &data[..]
            );
            m.inject(Fault::Partial {
                bytes: 0,
                on: FaultOn::Write,
                ops: u64::MAX,
            });
            let e = dev
                .write_at(dev.alloc_buf(4096), 65536)
                .await
                .0
                .expect_err("stalled write");
            assert_eq!(
                e.kind(),
                &ErrorKind::NoProgress {
                    offset_bytes: 65536,
                    len_bytes: 4096
                }
            );
        });
    });
}

/// A regular file has an end of file: a read across it is short at once
/// (no retry), and a read at it returns 0 bytes.
#[test]
fn a_file_read_across_its_end_is_short_without_a_retry() {
    watchdog(30, || {
        let dir = tmpdir();
        let path = dir.path().join("eof");
        std::fs::write(&path, pattern(12288)).unwrap();
        local().run(async move {
            let dev = Device::open(&path, DeviceOptions::default()).expect("open");
            let r = dev
                .read_alloc_at(8192, 16384)
                .await
                .expect("short read at end of file");
            assert_eq!(r.as_slice(), &pattern(12288)[8192..]);
            let r = dev
                .read_alloc_at(12288, 4096)
                .await
                .expect("read at end of file");
            assert_eq!(r.len(), 0);
            assert_eq!(
                dev.iostats().requeues,
                1,
                "only the resumption of the first"
            );
        });
    });
}

/// A file system that fills up part way through a write (the kernel
/// writes what fits and returns a short count; the resumed rest gets
/// `ENOSPC`): `write_at` returns the bytes that landed, as `pwrite(2)`
/// does, and the next write fails with `OutOfSpace`; merged (nomerges 0)
/// the two writes get what one device write of both would give;
/// a write split into requests returns those that landed before the
/// first refused one; `write_all_at` names the bytes written. Before, the write failed as a
/// whole though 40 KiB of it had landed and grown the file (found by a
/// break-it helper on a full tmpfs).
#[test]
fn a_write_that_fills_the_device_returns_the_bytes_that_landed() {
    watchdog(30, || {
        for nomerges in [0, 2] {
            let m = mem(vec![Fault::FullAfter { bytes: 40960 }]);
            let opts = DeviceOptions {
                nomerges,
                ..DeviceOptions::default()
            };
            let dev = Device::with_backend(m.clone(), None, opts).unwrap();
            local().run(async move {
                let data = pattern(65536);
                // Two 32 KiB writes in one tick (one request when merged):
                // the first fits, 8 KiB of the second does.
                let mut a = dev.alloc_buf(32768);
                a.as_mut_slice().copy_from_slice(&data[..32768]);
                let mut b = dev.alloc_buf(32768);
                b.as_mut_slice().copy_from_slice(&data[32768..]);
                let (ra, rb) = futures::join!(dev.write_at(a, 0), dev.write_at(b, 32768));
                let (na, nb) = (ra.0.expect("first write"), rb.0.expect("second write"));
                if nomerges == 0 {
                    // One request, written in order.
                    assert_eq!((na, nb), (32768, 8192));
                } else {
                    // Two requests run in either order: one fits whole.
                    assert_eq!(na + nb, 40960, "{na} + {nb}");
                    assert!(na == 32768 || nb == 32768, "{na} + {nb}");
                }
                assert_eq!(m.written_bytes(), 40960);
                for (at, n) in [(0, na), (32768, nb)] {
                    let r = dev.read_alloc_at(at as u64, n).await.expect("read back");
                    assert_eq!(r.as_slice(), &data[at..at + n], "what landed is the data");
                }
                let (e, _) = dev.write_at(dev.alloc_buf(4096), 65536).await;
                let e = e.expect_err("the device is full");
                assert_eq!(e.kind(), &ErrorKind::OutOfSpace, "{e}");
                assert_eq!(dev.tags_in_use(), 0);
            });
        }
        // A write split into 8 KiB requests (sent one at a time) on a
        // device that refuses a whole request once full: the first two
        // land, and the write returns them.
        let m = mem(vec![Fault::EnospcAfter { bytes: 16384 }]);
        let opts = DeviceOptions {
            max_request_bytes: Some(8192),
            queue_depth: 1,
            ..DeviceOptions::default()
        };
        let dev = Device::with_backend(m, None, opts.clone()).unwrap();
        local().run(async move {
            let (r, _) = dev.write_at(dev.alloc_buf(32768), 0).await;
            assert_eq!(r.expect("two requests landed"), 16384);
        });
        // Requests of 8, 8 and 4 KiB on a device that takes 12 KiB: the
        // second is refused and the third lands after it, so no count is
        // true: the write fails (found by a break-it helper: a count of
        // 8 KiB while 4 KiB past it had landed).
        let m = mem(vec![Fault::EnospcAfter { bytes: 12288 }]);
        let dev = Device::with_backend(m.clone(), None, opts.clone()).unwrap();
        local().run(async move {
            let (r, _) = dev.write_at(dev.alloc_buf(20480), 0).await;
            let e = r.expect_err("a part past the refused one landed");
            assert_eq!(e.kind(), &ErrorKind::OutOfSpace, "{e}");
        });
        assert_eq!(m.written_bytes(), 12288);
        let m = mem(vec![Fault::FullAfter { bytes: 40960 }]);
        let dev = Device::with_backend(m, None, DeviceOptions::default()).unwrap();
        local().run(async move {
            let (r, _) = dev.write_all_at(dev.alloc_buf(65536), 0).await;
            let e = r.expect_err("only 40 KiB fit");
            assert_eq!(
                e.kind(),
                &ErrorKind::WriteZero {
                    offset_bytes: 0,
                    len_bytes: 65536,
                    done_bytes: 40960
                }
            );
            assert!(e.to_string().contains("out of space"), "{e}");
        });
    });
}
