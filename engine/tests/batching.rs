//! The batching mechanisms' correctness rules: merging (and its limits and
//! ordering), errors and short reads of merged requests, the nomerges
//! switch, and iostats figures that show each mechanism at work.
//!
//! The merge of adjacent reads and the program order of overlapping IOs
//! on a file run in every ring configuration in `tests/matrix.rs`.

use std::sync::Arc;
use std::time::Duration;

use plugio_device::backend::mem::{Fault, FaultOn, Latency, MemClock, MemConfig, MemDevice};
use plugio_device::ErrorKind;
use plugio_engine::{Device, DeviceOptions};

mod common;

use common::{local, tmpdir};

fn pattern(off: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((off + i) / 7) as u8 ^ ((off + i) >> 12) as u8)
        .collect()
}

fn mem(latency_max_us: u64, faults: Vec<Fault>) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        latency: Latency::Uniform {
            min: Duration::from_micros(1),
            max: Duration::from_micros(latency_max_us.max(1)),
        },
        clock: MemClock::Virtual,
        faults,
        ..Default::default()
    }))
}

#[test]
fn small_reads_spread_over_100_mib_are_not_merged_into_a_giant_read() {
    let dir = tmpdir();
    let path = dir.path().join("sparse");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(100 << 20).unwrap();
    let offsets: Vec<u64> = (0..30u64).map(|i| i * (100 << 20) / 30 + i * 13).collect();
    for &o in &offsets {
        use std::os::unix::fs::FileExt;
        f.write_all_at(&pattern(o, 100), o).unwrap();
    }
    drop(f);
    local().run(async {
        let opts = DeviceOptions {
            direct: false,
            ..Default::default()
        };
        let dev = Device::open(&path, opts).expect("open buffered");
        let reads = offsets.iter().map(|&o| dev.read_alloc_at(o, 100));
        let results = futures::future::join_all(reads).await;
        for (o, r) in offsets.iter().zip(results) {
            assert_eq!(r.expect("read").as_slice(), &pattern(*o, 100)[..]);
        }
        let s = dev.iostats();
        assert_eq!(s.read.ios, 30, "{s:?}");
        assert_eq!(s.read.merges, 0);
        assert_eq!(s.read.sectors, 30, "a partial sector counts as one");
    });
}

#[test]
fn overlapping_ios_in_one_plug_keep_program_order_on_the_mem_device() {
    for seed in 0..50 {
        let m = Arc::new(MemDevice::new(MemConfig {
            capacity_bytes: 1 << 20,
            latency: Latency::Uniform {
                min: Duration::from_micros(1),
                max: Duration::from_micros(500),
            },
            seed,
            ..Default::default()
        }));
        let dev = Device::with_backend(m, None, DeviceOptions::default()).unwrap();
        local().run(common::overlapping_writes_then_read(dev));
    }
}

/// Merging never changes a result: when a merged request fails, each of
/// its bios is issued again alone, so only the bio on the bad block fails.
#[test]
fn a_failing_merged_request_reissues_its_bios_alone() {
    // EIO at LBA 9 (bytes 4608..5120), inside the second of three reads.
    let m = mem(
        50,
        vec![Fault::Eio {
            lbas: 9..10,
            on: FaultOn::Read,
        }],
    );
    let dev = Device::with_backend(m, None, DeviceOptions::default()).unwrap();
    local().run(async move {
        let (a, b, c) = futures::join!(
            dev.read_alloc_at(0, 4096),
            dev.read_alloc_at(4096, 4096),
            dev.read_alloc_at(8192, 4096)
        );
        assert_eq!(a.expect("read before the bad block").len(), 4096);
        let e = b.expect_err("the read of the bad block fails");
        assert_eq!(e.kind(), &ErrorKind::Io { errno: libc::EIO });
        assert_eq!(c.expect("read after the bad block").len(), 4096);
        let s = dev.iostats();
        assert_eq!(
            (s.bios, s.requests, s.requeues),
            (3, 1, 3),
            "the three reads were merged, then issued alone: {s:?}"
        );
        assert_eq!(dev.tags_in_use(), 0);
    });
}

/// A short transfer of a single bio in the middle of the device resumes
/// at the last aligned boundary instead of returning a short count: a
/// backend that moves at most 1 KiB per request still reads all 16 KiB.
#[test]
fn a_short_transfer_mid_device_resumes_until_done() {
    let m = mem(0, Vec::new());
    let wrapped: Arc<dyn plugio_device::Backend> = Arc::new(AtMost {
        inner: m.clone(),
        max_bytes: 1024,
    });
    let dev = Device::with_backend(wrapped, None, DeviceOptions::default()).unwrap();
    local().run(async move {
        let mut b = dev.alloc_buf(16384);
        for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
            *x = (i / 512) as u8 ^ 0x5a;
        }
        let want = b.as_slice().to_vec();
        let (w, _) = dev.write_at(b, 65536).await;
        assert_eq!(w.expect("write"), 16384, "a short write resumes too");
        let got = dev.read_alloc_at(65536, 16384).await.expect("read");
        assert_eq!(got.len(), 16384);
        assert_eq!(got.as_slice(), &want[..]);
        let s = dev.iostats();
        assert_eq!(
            s.requeues,
            2 * 15,
            "15 resumes for the write and for the read: {s:?}"
        );
        assert_eq!(dev.tags_in_use(), 0);
    });
}

/// A backend that moves at most `max_bytes` of each read or write (the
/// first segment cut short), as a device may return a partial count.
#[derive(Debug)]
struct AtMost {
    inner: Arc<MemDevice>,
    max_bytes: u64,
}

impl plugio_device::Backend for AtMost {
    fn geometry(&self) -> &plugio_device::Geometry {
        self.inner.geometry()
    }

    fn kind(&self) -> plugio_device::backend::BackendKind {
        self.inner.kind()
    }

    unsafe fn submit(
        &self,
        op: &plugio_device::IoOp<'_>,
        handler: plugio_device::HandlerId,
        token: u64,
    ) -> plugio_device::Result<()> {
        let mut seg = op.segments.first().copied();
        let short = op.kind.has_data() && op.len_bytes > self.max_bytes;
        let one;
        let mut cut = *op;
        if short {
            let s = seg.as_mut().expect("a data op has a segment");
            s.iov_len = self.max_bytes as usize;
            one = [*s];
            cut.segments = &one;
            cut.len_bytes = self.max_bytes;
            cut.fixed_buf = None;
        }
        // SAFETY: forwarded from the caller; `cut` names a prefix of the
        // caller's memory, which stays valid as long as the caller's.
        unsafe { self.inner.submit(&cut, handler, token) }
    }
}

#[test]
fn a_short_read_of_a_merged_request_gives_each_bio_its_share() {
    let dir = tmpdir();
    let path = dir.path().join("eof");
    std::fs::write(&path, pattern(0, 4864)).unwrap();
    local().run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        let (a, b, c) = futures::join!(
            dev.read_alloc_at(0, 4096),
            dev.read_alloc_at(4096, 4096),
            dev.read_alloc_at(8192, 4096)
        );
        let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
        assert_eq!((a.len(), b.len(), c.len()), (4096, 768, 0));
        assert_eq!(a.as_slice(), &pattern(0, 4096)[..]);
        assert_eq!(b.as_slice(), &pattern(4096, 768)[..]);
        assert_eq!(dev.iostats().requests, 1);
    });
}

/// 32 reads of 4 KiB, covering 128 KiB contiguously, issued in a shuffled
/// order in one tick; returns (bios, requests).
fn shuffled_sequential_reads(nomerges: u8) -> (u64, u64) {
    let m = mem(20, Vec::new());
    let opts = DeviceOptions {
        nomerges,
        ..Default::default()
    };
    let dev = Device::with_backend(m, None, opts).unwrap();
    local().run(async move {
        let order = [
            5u64, 4, 6, 7, 0, 1, 3, 2, 12, 13, 14, 15, 11, 10, 9, 8, 16, 17, 18, 19, 31, 30, 29,
            28, 20, 21, 22, 23, 27, 26, 25, 24,
        ];
        let reads = order.iter().map(|&i| dev.read_alloc_at(i * 4096, 4096));
        for r in futures::future::join_all(reads).await {
            assert_eq!(r.expect("read").len(), 4096);
        }
        let s = dev.iostats();
        (s.bios, s.requests)
    })
}

#[test]
fn nomerges_switch_behaves_as_in_sysfs() {
    let (bios, all) = shuffled_sequential_reads(0);
    let (_, one_hit) = shuffled_sequential_reads(1);
    let (_, none) = shuffled_sequential_reads(2);
    assert_eq!(bios, 32);
    assert_eq!(all, 1, "sorted merging makes one 128 KiB request");
    assert!(
        one_hit > 1 && one_hit < 32,
        "one-hit merging only: {one_hit}"
    );
    assert_eq!(none, 32, "nomerges=2 never merges");
}

/// Each device's plug limits count its own bios: a device whose byte
/// trigger is off keeps merging while another device's bios sit in the
/// same core's plug (found by a fresh user: the plug's total bytes were
/// compared with the limit of whichever device issued last, so a device
/// with `plug_flush_bytes: 0` was flushed by its neighbour's bytes).
#[test]
fn a_devices_plug_limits_count_only_its_own_bios() {
    let a = Device::with_backend(
        mem(20, Vec::new()),
        None,
        DeviceOptions {
            plug_flush_bytes: 0,
            plug_max_count: 256,
            ..Default::default()
        },
    )
    .unwrap();
    let b = Device::with_backend(
        mem(20, Vec::new()),
        None,
        DeviceOptions {
            plug_flush_bytes: 8192,
            ..Default::default()
        },
    )
    .unwrap();
    local().run(async move {
        // One tick: 8 adjacent reads on `a`, one read on `b` (its plug
        // bytes: 4 KiB, under its 8 KiB), 8 more adjacent reads on `a`.
        let mut reads: Vec<_> = (0..8u64).map(|i| a.read_alloc_at(i * 4096, 4096)).collect();
        reads.push(b.read_alloc_at(0, 4096));
        reads.extend((8..16u64).map(|i| a.read_alloc_at(i * 4096, 4096)));
        for r in futures::future::join_all(reads).await {
            r.expect("read");
        }
        let (sa, sb) = (a.iostats(), b.iostats());
        assert_eq!((sa.bios, sa.requests), (16, 1), "one 64 KiB read: {sa:?}");
        assert_eq!((sb.bios, sb.requests), (1, 1), "{sb:?}");
        // `b`'s own bytes still trigger its flush: two reads of 4 KiB.
        let before = b.iostats();
        let reads = (0..4u64).map(|i| b.read_alloc_at(i * 8192, 4096));
        for r in futures::future::join_all(reads).await {
            r.expect("read");
        }
        let d = b.iostats().delta(&before);
        assert_eq!((d.bios, d.plug_flushes), (4, 2), "{d:?}");
    });
}

#[test]
fn merges_stay_within_max_merge_bytes() {
    let m = mem(20, Vec::new());
    let opts = DeviceOptions {
        max_merge_bytes: Some(16 * 1024),
        ..Default::default()
    };
    let dev = Device::with_backend(m, None, opts).unwrap();
    local().run(async move {
        let reads = (0..32u64).map(|i| dev.read_alloc_at(i * 4096, 4096));
        for r in futures::future::join_all(reads).await {
            r.expect("read");
        }
        let s = dev.iostats();
        assert_eq!(s.requests, 8, "128 KiB in 16 KiB requests: {s:?}");
    });
}

#[test]
fn fua_and_nomerge_bios_are_never_merged() {
    let m = mem(20, Vec::new());
    let dev = Device::with_backend(m, None, DeviceOptions::default()).unwrap();
    local().run(async move {
        let writes = (0..4u64).map(|i| {
            let dev = dev.clone();
            async move {
                let buf = dev.alloc_buf(4096);
                dev.write_at_with(buf, i * 4096, plugio_device::IoFlags::FUA)
                    .await
                    .0
                    .expect("fua write");
            }
        });
        futures::future::join_all(writes).await;
        assert_eq!(dev.iostats().requests, 4);
    });
}

#[test]
fn the_cached_clock_reads_once_per_batch() {
    let dir = tmpdir();
    let path = dir.path().join("clock");
    std::fs::write(&path, pattern(0, 1 << 20)).unwrap();
    let reads_for = |cached_clock: bool| {
        let opts = DeviceOptions {
            cached_clock,
            nomerges: 2,
            ..Default::default()
        };
        let dev = Device::open(&path, opts).expect("open");
        local().run(async move {
            let before = plugio_engine::clock::reads();
            for round in 0..10u64 {
                let reads =
                    (0..32u64).map(|i| dev.read_alloc_at((round * 32 + i) % 200 * 4096, 4096));
                futures::future::join_all(reads).await;
            }
            plugio_engine::clock::reads() - before
        })
    };
    let cached = reads_for(true);
    let uncached = reads_for(false);
    println!("clock reads for 320 IOs: cached {cached}, uncached {uncached}");
    // Without the cache: two reads per IO (dispatch and completion). With
    // it: one per plug flush and one per completion batch.
    assert_eq!(uncached, 2 * 320);
    assert!(
        cached * 2 < uncached,
        "cached {cached} vs uncached {uncached}"
    );
}

#[test]
fn iostats_off_counts_nothing_and_changes_no_result() {
    let m = mem(20, Vec::new());
    let opts = DeviceOptions {
        iostats: false,
        ..Default::default()
    };
    let dev = Device::with_backend(m, None, opts).unwrap();
    local().run(async move {
        let mut b = dev.alloc_buf(4096);
        b.as_mut_slice().fill(3);
        dev.write_at(b, 0).await.0.expect("write");
        assert!(dev
            .read_alloc_at(0, 4096)
            .await
            .unwrap()
            .as_slice()
            .iter()
            .all(|&x| x == 3));
        let s = dev.iostats();
        assert_eq!((s.bios, s.requests, s.read.ios, s.write.ios), (0, 0, 0, 0));
    });
}

#[test]
fn iostats_look_like_diskstats() {
    let m = mem(20, Vec::new());
    let dev = Device::with_backend(m, None, DeviceOptions::default()).unwrap();
    local().run(async move {
        let b = dev.alloc_buf(8192);
        dev.write_at(b, 0).await.0.expect("write");
        dev.sync_data().await.expect("flush");
        dev.read_alloc_at(0, 4096).await.expect("read");
        let s = dev.iostats();
        assert_eq!((s.read.ios, s.read.sectors), (1, 8));
        assert_eq!((s.write.ios, s.write.sectors), (1, 16));
        assert_eq!(s.flush.ios, 1);
        assert_eq!(s.in_flight, 0);
        // A PREFLUSH write's preflush is a flush too (the kernel's
        // `blk_account_io_flush`), and its write a write (found by a
        // fresh user: only `sync_data` counted).
        let flags = plugio::IoFlags::PREFLUSH | plugio::IoFlags::FUA;
        dev.write_at_with(dev.alloc_buf(4096), 0, flags)
            .await
            .0
            .expect("preflush write");
        let s = dev.iostats();
        assert_eq!((s.write.ios, s.flush.ios), (2, 2));
        assert_eq!(s.flush.sectors, 0);
        // FUA writes are counted as such (a fresh user's WAL could not
        // tell a FUA commit from a plain write): the plain write above
        // did not count, this PREFLUSH|FUA one did, and so does a FUA
        // write alone, whether or not a write is live beside it.
        assert_eq!(s.fua_writes, 1);
        let fua = plugio::IoFlags::FUA;
        let (a, b) = futures::join!(
            dev.write_at_with(dev.alloc_buf(4096), 8192, fua),
            dev.write_at(dev.alloc_buf(4096), 16384)
        );
        a.0.expect("FUA write");
        b.0.expect("write");
        dev.write_at_with(dev.alloc_buf(4096), 24576, fua)
            .await
            .0
            .expect("FUA write alone");
        let s = dev.iostats();
        assert_eq!((s.write.ios, s.flush.ios, s.fua_writes), (5, 2, 3));
        assert!(s.io_ticks_ns > 0 && s.time_in_queue_ns >= s.io_ticks_ns);
        let line = s.diskstats_line("mem0");
        assert_eq!(line.split_whitespace().count(), 3 + 17, "{line}");
    });
}
