//! IO on the caller's own memory (`IoBuf`/`IoBufMut`): every buffer type
//! round-trips with and without O_DIRECT; unaligned memory is bounced
//! (counted) or refused when bouncing is off; registered buffers go out as
//! READ_FIXED/WRITE_FIXED; a future dropped mid-IO keeps the buffer alive
//! until the kernel is done; the exact and vectored forms.

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use plugio_device::{ErrorKind, InvalidInput};
use plugio_engine::{Device, DeviceOptions, DmaBuf, IoBuf, IoBufMut, Region};

use common::{local, pattern, tmpdir};

/// A `BytesMut` whose address is `misalign` bytes past a
/// 4096 boundary, empty, with a capacity of exactly `len`.
fn bytes_mut_at(len: usize, misalign: usize) -> BytesMut {
    let mut whole = BytesMut::zeroed(len + 8192);
    let skip = (4096 - whole.as_ptr() as usize % 4096) % 4096 + misalign;
    let mut tail = whole.split_off(skip);
    let mut exact = tail.split_to(len);
    exact.clear();
    assert_eq!(
        (exact.as_ptr() as usize % 4096, exact.capacity()),
        (misalign, len)
    );
    exact
}

fn misaligned(b: &impl IoBuf, align: usize) -> bool {
    b.stable_ptr() as usize % align != 0
}

/// Writes `buf` at `off`, reads it back into `into`, checks the bytes, and
/// returns how many of the two IOs had memory off the device's alignment.
async fn round_trip<W: IoBuf, R: IoBufMut + AsRef<[u8]>>(
    dev: &Device,
    buf: W,
    into: R,
    off: u64,
) -> u64 {
    let align = dev.geometry().mem_align_bytes() as usize;
    let expect = {
        // SAFETY: the IoBuf contract (initialised bytes at stable_ptr).
        unsafe { std::slice::from_raw_parts(buf.stable_ptr(), buf.bytes_init()) }.to_vec()
    };
    let mut unaligned = u64::from(misaligned(&buf, align));
    let (r, _) = dev.write_at(buf, off).await;
    assert_eq!(r.expect("write"), expect.len());
    unaligned += u64::from(misaligned(&into, align));
    let (r, back) = dev.read_at(into, off).await;
    assert_eq!(r.expect("read"), expect.len());
    assert_eq!(back.as_ref(), &expect[..]);
    unaligned
}

#[test]
fn every_buffer_type_round_trips_with_and_without_o_direct() {
    let dir = tmpdir();
    for direct in [true, false] {
        let path = dir.path().join(format!("types-{direct}"));
        std::fs::write(&path, vec![0u8; 1 << 20]).expect("fixture");
        local().run(async {
            let dev = common::open_direct(&path, direct);
            let len = 8192;
            let mut expected = 0;
            // Vec<u8> (heap memory: 16-byte aligned, not 4096).
            expected += round_trip(&dev, pattern(len, 1), Vec::with_capacity(len), 0).await;
            // Box<[u8]>.
            let boxed = pattern(len, 2).into_boxed_slice();
            expected += round_trip(&dev, boxed, vec![0u8; len].into_boxed_slice(), 8192).await;
            // BytesMut on a 4096 boundary (no bounce even with O_DIRECT).
            let mut aligned = bytes_mut_at(len, 0);
            aligned.extend_from_slice(&pattern(len, 3));
            let n = round_trip(&dev, aligned, bytes_mut_at(len, 0), 16384).await;
            assert_eq!(n, 0, "aligned BytesMut");
            // BytesMut one byte past a boundary (bounced with O_DIRECT).
            let mut off_by_one = bytes_mut_at(len, 1);
            off_by_one.extend_from_slice(&pattern(len, 4));
            let n = round_trip(&dev, off_by_one, bytes_mut_at(len, 1), 24576).await;
            assert_eq!(n, if direct { 2 } else { 0 }, "misaligned BytesMut");
            expected += n;
            // DmaBuf (from alloc_buf) and a Region's page.
            let mut d = dev.alloc_buf(len);
            d.as_mut_slice().copy_from_slice(&pattern(len, 5));
            expected += round_trip(&dev, d, DmaBuf::heap(len, 4096), 32768).await;
            let mut pages = Region::new(2 * len, 4096).into_pages(len);
            let into = pages.pop().expect("page");
            let mut page = pages.pop().expect("page");
            page.as_mut_slice().copy_from_slice(&pattern(len, 6));
            let (r, page) = dev.write_at(page, 40960).await;
            assert_eq!(r.expect("page write"), len);
            let (r, into) = dev.read_at(into, 40960).await;
            assert_eq!(r.expect("page read"), len);
            assert_eq!(into.as_slice(), page.as_slice());
            let stats = dev.iostats();
            if direct {
                assert!(expected >= 2, "at least the off-by-one BytesMut bounced");
                assert_eq!(stats.bounce_ios, expected);
                assert!(stats.bounce_bytes >= expected * len as u64 / 2);
            } else {
                assert_eq!(stats.bounce_ios, 0, "buffered IO never bounces");
            }
        });
    }
}

#[test]
fn unaligned_memory_is_refused_when_bouncing_is_off() {
    let dir = tmpdir();
    let path = dir.path().join("strict");
    std::fs::write(&path, vec![0u8; 65536]).expect("fixture");
    local().run(async {
        let dev = Device::open(
            &path,
            DeviceOptions {
                bounce_unaligned: false,
                ..DeviceOptions::default()
            },
        )
        .expect("open");
        let buf = bytes_mut_at(4096, 1);
        let (r, buf) = dev.read_at(buf, 0).await;
        let err = r.expect_err("unaligned read refused");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidInput(InvalidInput::Alignment {
                    what: "buffer address",
                    ..
                })
            ),
            "{err}"
        );
        assert!(buf.capacity() >= 4096, "the buffer comes back");
        let vec = vec![1u8; 4096];
        let off = misaligned(&vec, dev.geometry().mem_align_bytes() as usize);
        let (r, _) = dev.write_at(vec, 0).await;
        assert_eq!(r.is_err(), off, "a Vec is refused exactly when it is off");
        assert_eq!(dev.iostats().bounce_ios, 0);
        // An aligned buffer still goes.
        let (r, _) = dev.read_at(bytes_mut_at(4096, 0), 0).await;
        assert_eq!(r.expect("aligned read"), 4096);
    });
}

/// A read fills a Vec up to its capacity (5,000 bytes here, whatever its
/// len): refused with O_DIRECT, and the message says the length is the
/// capacity (bounced or not, the one segment is the whole IO).
#[test]
fn a_reads_length_is_its_vecs_capacity() {
    let dir = tmpdir();
    let path = dir.path().join("spare");
    std::fs::write(&path, vec![0u8; 65536]).expect("fixture");
    local().run(async {
        let dev = common::open_direct(&path, true);
        let mut spare = Vec::with_capacity(5000);
        spare.resize(4096, 0u8);
        let (r, spare) = dev.read_at(spare, 0).await;
        let err = r.expect_err("5,000-byte read");
        assert!(
            err.to_string().contains("a Vec's capacity")
                && err.to_string().contains("is 5000 bytes"),
            "{err}"
        );
        assert_eq!(spare.len(), 4096, "the buffer comes back as it was");
    });
}

/// Buffers of the core's registered arena go to the ring with the
/// registered-buffer opcodes, counted where the SQE is built
/// (`RingStats::fixed_buf_sqes`): `alloc_buf`, `read_alloc_at`, a
/// `DmaBuf::new` the arena served, and the bounce buffer of unaligned
/// memory; a heap `DmaBuf` does not.
#[test]
fn registered_buffers_reach_the_ring_as_fixed_opcodes() {
    let dir = tmpdir();
    let path = dir.path().join("fixed");
    std::fs::write(&path, pattern(1 << 20, 9)).expect("fixture");
    local().run(async {
        let registered = plugio_device::buf::arena_stats().is_some_and(|s| s.registered);
        let fixed = || {
            plugio_device::ring::current_stats()
                .expect("a ring")
                .fixed_buf_sqes
        };
        let dev = common::open_direct(&path, true);
        let before = fixed();
        let got = dev.read_alloc_at(4096, 4096).await.expect("read_alloc_at");
        assert_eq!(got.as_slice(), &pattern(1 << 20, 9)[4096..8192]);
        let mut buf = dev.alloc_buf(8192);
        buf.as_mut_slice().fill(3);
        let (r, buf) = dev.write_at(buf, 65536).await;
        r.expect("write");
        let (r, _) = dev.read_at(DmaBuf::new(4096), 0).await;
        r.expect("DmaBuf::new read");
        // (A heap Vec may be aligned by chance; this one never is.)
        let (r, _) = dev.read_at(bytes_mut_at(4096, 1), 0).await;
        r.expect("bounced read");
        let n_fixed = fixed() - before;
        let (r, _) = dev.read_at(DmaBuf::heap(4096, 4096), 0).await;
        r.expect("heap read");
        assert_eq!(fixed() - before, n_fixed, "a heap buffer is not fixed");
        drop(buf);
        if registered {
            assert_eq!(n_fixed, 4, "four IOs on arena memory");
            assert_eq!(dev.iostats().fixed_buf_requests, 4);
        } else {
            eprintln!("buffer registration refused here (memlock): nothing is fixed");
            assert_eq!(n_fixed, 0);
        }
    });
}

/// Merged bios whose arena buffers lie apart make a request of several
/// segments in one registered buffer: where the kernel has
/// `READV_FIXED`/`WRITEV_FIXED` (6.15) it goes with them (counted in
/// `RingStats::fixed_buf_sqes` and `fixed_buf_requests`), else as a plain
/// `READV`/`WRITEV` (counted in neither); the data is right either way.
#[test]
fn merged_requests_on_arena_buffers_apart_use_vectored_fixed_opcodes() {
    let dir = tmpdir();
    let path = dir.path().join("vectored-fixed");
    std::fs::write(&path, vec![0u8; 1 << 16]).expect("fixture");
    local().run(async {
        let registered = plugio_device::buf::arena_stats().is_some_and(|s| s.registered);
        let info = plugio_device::ring::current_info().expect("a ring");
        let vectored = ["READV_FIXED", "WRITEV_FIXED"]
            .iter()
            .all(|op| info.supported_ops.contains(op));
        let fixed = || {
            plugio_device::ring::current_stats()
                .expect("a ring")
                .fixed_buf_sqes
        };
        let dev = common::open_direct(&path, true);
        // Three buffers in an order whose memory is not one run: the
        // third buffer first, then the first two.
        let mut bufs: Vec<DmaBuf> = (0..3).map(|_| dev.alloc_buf(4096)).collect();
        bufs.sort_by_key(|b| b.as_slice().as_ptr() as usize);
        bufs.rotate_right(1);
        let apart = bufs
            .windows(2)
            .any(|w| w[0].as_slice().as_ptr_range().end != w[1].as_slice().as_ptr());
        assert!(
            apart,
            "test setup: the buffers must not be one run of memory"
        );
        for (i, b) in bufs.iter_mut().enumerate() {
            b.as_mut_slice()
                .copy_from_slice(&pattern(4096, 40 + i as u8));
        }
        let before = fixed();
        let mut writes = Vec::new();
        for (i, b) in bufs.into_iter().enumerate() {
            writes.push(dev.write_at(b, 4096 * i as u64));
        }
        let mut bufs = Vec::new();
        for (r, b) in futures::future::join_all(writes).await {
            assert_eq!(r.expect("write"), 4096);
            bufs.push(b);
        }
        for b in &mut bufs {
            b.as_mut_slice().fill(0);
        }
        let mut reads = Vec::new();
        for (i, b) in bufs.into_iter().enumerate() {
            reads.push(dev.read_at(b, 4096 * i as u64));
        }
        for (i, (r, b)) in futures::future::join_all(reads)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(r.expect("read"), 4096);
            assert_eq!(b.as_slice(), &pattern(4096, 40 + i as u8)[..], "buffer {i}");
        }
        let on_disk = std::fs::read(&path).expect("read back");
        for i in 0..3 {
            assert_eq!(
                on_disk[4096 * i..4096 * (i + 1)],
                pattern(4096, 40 + i as u8)[..]
            );
        }
        let s = dev.iostats();
        assert_eq!((s.bios, s.requests), (6, 2), "each batch of three merged");
        match (registered, vectored) {
            (true, true) => {
                assert_eq!(fixed() - before, 2, "READV_FIXED and WRITEV_FIXED");
                assert_eq!(s.fixed_buf_requests, 2);
            }
            (true, false) => {
                eprintln!("no READV_FIXED/WRITEV_FIXED in this kernel: plain READV/WRITEV");
                assert_eq!(fixed() - before, 0);
                assert_eq!(s.fixed_buf_requests, 0);
            }
            (false, _) => {
                eprintln!("buffer registration refused here (memlock): nothing is fixed");
                assert_eq!(fixed() - before, 0);
            }
        }
    });
}

/// A buffer that counts its drops.
struct Tracked {
    bytes: Vec<u8>,
    dropped: Arc<AtomicUsize>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

// SAFETY: delegates to the Vec, whose heap memory does not move.
unsafe impl IoBuf for Tracked {
    fn stable_ptr(&self) -> *const u8 {
        self.bytes.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.bytes.len()
    }
    fn bytes_total(&self) -> usize {
        self.bytes.capacity()
    }
}

// SAFETY: as the Vec's impl.
unsafe impl IoBufMut for Tracked {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
    unsafe fn set_init(&mut self, len_bytes: usize) {
        // SAFETY: forwarded contract.
        unsafe { self.bytes.set_len(len_bytes) }
    }
}

/// A memory device with a read into `buf` sent to it and its future
/// dropped while the read is in flight (the explicit plug's guard sends
/// the read at once; completions come only in the core's park). Call it
/// on a core.
fn orphan_a_read<B: IoBufMut + 'static>(buf: B) -> Device {
    use plugio_device::backend::mem::{MemConfig, MemDevice};
    let mem = MemDevice::new(MemConfig {
        mem_align_bytes: 1,
        ..MemConfig::default()
    });
    let dev = Device::with_backend(Arc::new(mem), None, DeviceOptions::default()).expect("device");
    let mut fut = Box::pin(dev.read_at(buf, 0));
    let plug = dev.plug(1).expect("plug");
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    drop(plug); // flushes: the read goes to the device
    assert_eq!(dev.tags_in_use(), 1, "the read is in flight");
    drop(fut);
    dev
}

/// A read future dropped while its IO is in flight hands the caller's
/// buffer to the engine, which drops it only after the IO completed. (The
/// explicit plug's guard sends the read to the device at once; completions
/// come only in the core's park, so the read is still in flight when the
/// future is dropped right after.)
#[test]
fn a_dropped_read_keeps_the_buffer_until_the_io_completes() {
    local().run(async {
        let dropped = Arc::new(AtomicUsize::new(0));
        let dev = orphan_a_read(Tracked {
            bytes: Vec::with_capacity(4096),
            dropped: dropped.clone(),
        });
        assert!(
            dropped.load(Ordering::SeqCst) == 0,
            "dropped with its future while the IO was in flight"
        );
        for _ in 0..1000 {
            if dropped.load(Ordering::SeqCst) > 0 {
                break;
            }
            plugio_executor::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            dropped.load(Ordering::SeqCst) > 0,
            "freed once the IO completed"
        );
        assert_eq!(dev.tags_in_use(), 0);
    });
}

/// The IO future drops the caller's buffers (and a bounce buffer) by
/// hand, to spare the finished future's drop glue: each way a future
/// ends drops the buffer exactly once. A future never polled, one that
/// finished (the buffer handed back, then dropped by the caller), one
/// refused at its first poll (out of range: handed back with the error),
/// one that bounced, and one dropped while its read was in flight (kept
/// by the engine until the read completes).
#[test]
fn every_way_an_io_future_ends_drops_the_buffer_once() {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    file.as_file().set_len(8192).expect("size");
    local().run(async {
        let dev = Device::open(
            file.path(),
            DeviceOptions {
                direct: false,
                ..DeviceOptions::default()
            },
        )
        .expect("open");
        let buf = |dropped: &Arc<AtomicUsize>| Tracked {
            bytes: Vec::with_capacity(4096),
            dropped: dropped.clone(),
        };
        let never = Arc::new(AtomicUsize::new(0));
        drop(dev.read_at(buf(&never), 0));
        assert_eq!(never.load(Ordering::SeqCst), 1, "never polled");

        let finished = Arc::new(AtomicUsize::new(0));
        let (n, b) = dev.read_at(buf(&finished), 0).await;
        assert_eq!(n.expect("read"), 4096);
        assert_eq!(
            finished.load(Ordering::SeqCst),
            0,
            "handed back, not dropped"
        );
        drop(b);
        assert_eq!(finished.load(Ordering::SeqCst), 1, "finished");

        let refused = Arc::new(AtomicUsize::new(0));
        let empty = Tracked {
            bytes: Vec::new(),
            dropped: refused.clone(),
        };
        let (r, b) = dev.read_at(empty, 0).await;
        assert!(r.is_err(), "a zero length is refused");
        assert_eq!(
            refused.load(Ordering::SeqCst),
            0,
            "handed back with the error"
        );
        drop(b);
        assert_eq!(refused.load(Ordering::SeqCst), 1, "refused");

        let bounced = Arc::new(AtomicUsize::new(0));
        let aligned = {
            use plugio_device::backend::mem::{MemConfig, MemDevice};
            let mem = MemDevice::new(MemConfig {
                mem_align_bytes: 4096,
                ..MemConfig::default()
            });
            Device::with_backend(Arc::new(mem), None, DeviceOptions::default()).expect("device")
        };
        let mut b = buf(&bounced);
        // Off the alignment on purpose: the read must bounce. A vector the
        // allocator placed on a 4096 boundary is kept aside (so the next
        // one lands elsewhere) and replaced by another of the same 4096
        // bytes; a capacity of 4097 was tried once and made the read's
        // length unaligned (a refusal, not a bounce).
        let mut aside = Vec::new();
        while b.bytes.as_ptr() as usize % 4096 == 0 {
            assert!(
                aside.len() < 64,
                "the allocator page-aligns every 4096-byte vector"
            );
            aside.push(std::mem::replace(&mut b.bytes, Vec::with_capacity(4096)));
        }
        let (n, b) = aligned.read_at(b, 0).await;
        assert!(n.expect("bounced read") >= 4096);
        assert_eq!(aligned.iostats().bounce_ios, 1, "it bounced");
        assert_eq!(
            bounced.load(Ordering::SeqCst),
            0,
            "handed back, not dropped"
        );
        drop(b);
        assert_eq!(bounced.load(Ordering::SeqCst), 1, "bounced");

        let orphaned = Arc::new(AtomicUsize::new(0));
        let odev = orphan_a_read(buf(&orphaned));
        for _ in 0..1000 {
            if orphaned.load(Ordering::SeqCst) > 0 {
                break;
            }
            plugio_executor::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(odev.tags_in_use(), 0);
        assert_eq!(orphaned.load(Ordering::SeqCst), 1, "orphaned");
    });
}

/// A caller's buffer whose `Drop` panics after its `Tracked` is dropped
/// (a pool frame returning itself to a pool that is gone).
struct PanicsOnDrop(Tracked);

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("the frame's pool is gone");
    }
}

// SAFETY: delegates to the Tracked, whose memory does not move.
unsafe impl IoBuf for PanicsOnDrop {
    fn stable_ptr(&self) -> *const u8 {
        self.0.stable_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.0.bytes_init()
    }
    fn bytes_total(&self) -> usize {
        self.0.bytes_total()
    }
}

// SAFETY: as the Tracked's impl.
unsafe impl IoBufMut for PanicsOnDrop {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.stable_mut_ptr()
    }
    unsafe fn set_init(&mut self, len_bytes: usize) {
        // SAFETY: forwarded contract.
        unsafe { self.0.set_init(len_bytes) }
    }
}

/// The `Drop` of an orphaned buffer runs where its IO completes, in the
/// core's park. A panic there is caught: the core goes on and the device
/// serves the next IO. It unwound through the completion path, which
/// stopped the core (every task on it cancelled) or, in a debug build,
/// tripped an invariant check during the unwind and aborted the process.
#[test]
fn a_panic_in_an_orphaned_buffers_drop_is_caught_and_the_core_goes_on() {
    local().run(async {
        let dropped = Arc::new(AtomicUsize::new(0));
        let dev = orphan_a_read(PanicsOnDrop(Tracked {
            bytes: Vec::with_capacity(4096),
            dropped: dropped.clone(),
        }));
        for _ in 0..1000 {
            if dropped.load(Ordering::SeqCst) > 0 {
                break;
            }
            plugio_executor::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            dropped.load(Ordering::SeqCst) > 0,
            "dropped at its completion"
        );
        assert_eq!(dev.tags_in_use(), 0);
        let (r, b) = dev.read_at(Vec::with_capacity(4096), 0).await;
        assert_eq!(r.expect("the next read"), 4096);
        assert_eq!(b.len(), 4096);
    });
}

/// The same for a future polled on its core and dropped on another
/// thread after its IO completed: the core adopts the orphan at its next
/// flush and drops the buffer there, where the panic was not caught (the
/// core's thread died and every task on it with it).
#[test]
fn a_panic_in_the_drop_of_a_buffer_dropped_on_another_thread_is_caught() {
    use plugio_device::backend::mem::{MemConfig, MemDevice};
    local().run(async {
        let mem = MemDevice::new(MemConfig {
            mem_align_bytes: 1,
            ..MemConfig::default()
        });
        let dev =
            Device::with_backend(Arc::new(mem), None, DeviceOptions::default()).expect("device");
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut fut = Box::pin(dev.read_at(
            PanicsOnDrop(Tracked {
                bytes: Vec::with_capacity(4096),
                dropped: dropped.clone(),
            }),
            0,
        ));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        // The read goes out at this tick's end and completes in a park.
        plugio_executor::sleep(Duration::from_millis(20)).await;
        std::thread::scope(|s| {
            s.spawn(move || drop(fut));
        });
        assert_eq!(dropped.load(Ordering::SeqCst), 0, "kept for its core");
        // The next IO's flush adopts the orphan and drops its buffer.
        let (r, _) = dev.read_at(Vec::with_capacity(4096), 0).await;
        assert_eq!(r.expect("the next read"), 4096);
        assert!(dropped.load(Ordering::SeqCst) > 0, "dropped by its core");
        assert_eq!(dev.tags_in_use(), 0);
    });
}

#[test]
fn exact_forms_name_the_offset_and_length_at_end_of_file() {
    let dir = tmpdir();
    let path = dir.path().join("eof");
    std::fs::write(&path, pattern(6000, 1)).expect("fixture");
    local().run(async {
        let dev = common::open_direct(&path, false);
        let (r, buf) = dev.read_exact_at(vec![0u8; 4096], 0).await;
        r.expect("the first 4096 bytes are there");
        assert_eq!(buf, pattern(6000, 1)[..4096]);
        let (r, buf) = dev.read_exact_at(vec![0u8; 4096], 4096).await;
        let err = r.expect_err("only 1904 bytes left");
        assert_eq!(
            *err.kind(),
            ErrorKind::UnexpectedEof {
                offset_bytes: 4096,
                len_bytes: 4096,
                done_bytes: 1904
            }
        );
        let text = err.to_string();
        assert!(text.contains("4096") && text.contains("1904"), "{text}");
        assert_eq!(
            std::io::Error::from(err).kind(),
            std::io::ErrorKind::UnexpectedEof
        );
        assert_eq!(buf, pattern(6000, 1)[4096..], "the bytes before the end");
        // Vectored: all of both buffers, or the same error.
        let (r, _) = dev
            .writev_all_at(vec![pattern(3000, 2), pattern(5192, 3)], 8192)
            .await;
        r.expect("writev_all_at");
        let (r, bufs) = dev
            .readv_exact_at(vec![vec![0u8; 3000], vec![0u8; 5192]], 8192)
            .await;
        r.expect("readv_exact_at");
        assert_eq!(
            (&bufs[0][..], &bufs[1][..]),
            (&pattern(3000, 2)[..], &pattern(5192, 3)[..])
        );
        let (r, _) = dev
            .readv_exact_at(vec![vec![0u8; 4096], vec![0u8; 4096]], 12288)
            .await;
        assert!(matches!(
            r.expect_err("past the end").kind(),
            ErrorKind::UnexpectedEof {
                offset_bytes: 12288,
                len_bytes: 8192,
                done_bytes: 4096
            }
        ));
    });
}

/// Vectored IO with O_DIRECT over segments that are not block multiples
/// goes through one bounce buffer and still lands byte for byte.
#[test]
fn vectored_io_over_odd_segments_bounces_as_one() {
    let dir = tmpdir();
    let path = dir.path().join("vec");
    std::fs::write(&path, vec![0u8; 65536]).expect("fixture");
    local().run(async {
        let dev = common::open_direct(&path, true);
        let parts = vec![pattern(1000, 1), pattern(3096, 2), pattern(4096, 3)];
        let all: Vec<u8> = parts.concat();
        let (r, _) = dev.writev_at(parts, 4096).await;
        assert_eq!(r.expect("writev"), 8192);
        let (r, bufs) = dev
            .readv_at(
                vec![
                    Vec::with_capacity(100),
                    Vec::with_capacity(7992),
                    Vec::with_capacity(100),
                ],
                4096,
            )
            .await;
        assert_eq!(r.expect("readv"), 8192);
        assert_eq!(bufs.concat(), all);
        let lens: Vec<usize> = bufs.iter().map(Vec::len).collect();
        assert_eq!(lens, [100, 7992, 100], "each buffer filled to its capacity");
        assert_eq!(dev.iostats().bounce_ios, 2);
    });
}
