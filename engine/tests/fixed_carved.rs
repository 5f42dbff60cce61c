//! Memory an embedder carves out of the core's registered arena (as the fio
//! engine lays its io_u buffers out in one arena chunk) goes to the ring as
//! `READ_FIXED`/`WRITE_FIXED`, and so does a request merged from adjacent
//! pieces of it; a merged request whose pieces are not one contiguous run
//! of memory goes out as a vectored read: `READV_FIXED` where the kernel
//! has it (6.15), else a plain `READV`.

use plugio_device::buf::{configure_arena, ArenaConfig};
use plugio_device::RingConfig;
use plugio_engine::{Device, DeviceOptions, DmaBuf, IoBuf, IoBufMut};

const BS: usize = 4096;

/// `len` bytes at `ptr`, inside a `DmaBuf` the test keeps alive until the
/// IO is done.
struct Carved {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a pointer into memory the test owns and lends to one IO at a time.
unsafe impl Send for Carved {}

// SAFETY: the memory outlives the IO (the test holds the DmaBuf), does not
// move with the handle, is initialised (the arena zeroes it), and each
// piece is lent to one IO at a time.
unsafe impl IoBuf for Carved {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
}

// SAFETY: as above; pieces do not overlap.
unsafe impl IoBufMut for Carved {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    unsafe fn set_init(&mut self, _len_bytes: usize) {}
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i / BS) as u8 ^ (i as u8)).collect()
}

#[test]
fn carved_registered_memory_goes_out_fixed_alone_and_merged() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let path = dir.path().join("carved");
    let data = pattern(1 << 20);
    std::fs::write(&path, &data).expect("fixture");
    // One 64 KiB chunk, registered with the ring the executor makes next.
    configure_arena(ArenaConfig {
        chunk_bytes: 16 * BS,
        nr_chunks: 1,
    });
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("local");
    ex.run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        // Where the kernel refuses the registration (RLIMIT_MEMLOCK) the
        // region is plain memory and nothing may go out fixed.
        let registered_region = DmaBuf::registered(16 * BS, BS);
        let registered = registered_region.is_some();
        let mut region = registered_region.unwrap_or_else(|| DmaBuf::heap(16 * BS, BS));
        let expect = |n: u64| if registered { n } else { 0 };
        let vectored = plugio_device::ring::current_info()
            .expect("a ring")
            .supported_ops
            .contains(&"READV_FIXED");
        let base = region.as_mut_slice().as_mut_ptr();
        let piece = |i: usize| Carved {
            // SAFETY: every piece (i < 16) is inside the 64 KiB region.
            ptr: unsafe { base.add(i * BS) },
            len: BS,
        };
        let fixed_sqes = || {
            plugio_device::ring::current_stats()
                .expect("a ring")
                .fixed_buf_sqes
        };

        // One piece alone.
        let before = fixed_sqes();
        let (r, _) = dev.read_at(piece(5), 0).await;
        assert_eq!(r.expect("read"), BS);
        assert_eq!(fixed_sqes() - before, expect(1), "a carved piece is fixed");

        // Four adjacent blocks into four adjacent pieces, in one tick: one
        // merged request over one contiguous run of the region.
        let before = fixed_sqes();
        let reads = (0..4).map(|i| dev.read_at(piece(i), (16 + i) as u64 * BS as u64));
        for (r, _) in futures::future::join_all(reads).await {
            assert_eq!(r.expect("read"), BS);
        }
        assert_eq!(
            fixed_sqes() - before,
            expect(1),
            "one fixed SQE for the merged run"
        );

        // The same blocks into the pieces in reverse order: merged, but the
        // memory is four runs, so a vectored read: on the registered
        // buffer (READV_FIXED) where the kernel has it.
        let before = fixed_sqes();
        let reads = (0..4).map(|i| dev.read_at(piece(11 - i), (32 + i) as u64 * BS as u64));
        for (r, _) in futures::future::join_all(reads).await {
            assert_eq!(r.expect("read"), BS);
        }
        assert_eq!(
            fixed_sqes() - before,
            expect(u64::from(vectored)),
            "scattered memory: READV_FIXED where the kernel has it"
        );

        let s = dev.iostats();
        assert_eq!(s.bios, 9);
        assert_eq!(s.requests, 3, "both batches merged: {s:?}");
        assert_eq!(s.fixed_buf_requests, expect(2 + u64::from(vectored)));
        // Every piece holds the blocks read into it.
        let got = region.as_slice();
        for i in 0..4 {
            let want = &data[(16 + i) * BS..(17 + i) * BS];
            assert_eq!(&got[i * BS..(i + 1) * BS], want, "merged run, piece {i}");
            let want = &data[(32 + i) * BS..(33 + i) * BS];
            assert_eq!(
                &got[(11 - i) * BS..(12 - i) * BS],
                want,
                "scattered, piece {}",
                11 - i
            );
        }
        assert_eq!(&got[5 * BS..6 * BS], &data[..BS]);
    });
}
