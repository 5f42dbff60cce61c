//! Adversarial checks of the "bad input is refused before submission with
//! a clear error, and nothing else in flight is affected" promise.

use std::sync::Arc;

use plugio::device::backend::mem::{MemConfig, MemDevice};
use plugio::{Device, DeviceOptions, DmaBuf, ErrorKind, InvalidInput};

mod common;
use common::{local, watchdog};

fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

fn file(dir: &tempfile::TempDir, name: &str, len: usize) -> std::path::PathBuf {
    let path = dir.path().join(name);
    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7)).collect();
    std::fs::write(&path, data).expect("fixture");
    path
}

fn mem_dev(capacity: u64) -> (MemDevice, Device) {
    let mem = MemDevice::new(MemConfig {
        capacity_bytes: capacity,
        ..MemConfig::default()
    });
    let dev = Device::with_backend(Arc::new(mem.clone()), None, DeviceOptions::default())
        .expect("device");
    (mem, dev)
}

fn is_invalid(e: &plugio::Error) -> bool {
    matches!(e.kind(), ErrorKind::InvalidInput(_))
}

/// The largest 4 KiB-aligned offset: `offset + len` overflows u64.
const TOP: u64 = u64::MAX - 4095;

#[plugio::test(timeout_s = 10)]
async fn offsets_near_u64_max_on_the_mem_device_are_range_errors() {
    let (_mem, dev) = mem_dev(1 << 20);
    for off in [TOP, 1 << 63, (1 << 20) - 512, 1 << 20] {
        let err = dev
            .read_alloc_at(off, 4096)
            .await
            .expect_err("beyond the end");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidInput(InvalidInput::Range { .. })
            ),
            "offset {off:#x}: {err}"
        );
        let err = dev
            .write_zeroes(off, 4096)
            .await
            .expect_err("zeroes beyond");
        assert!(is_invalid(&err), "{err}");
        let err = dev.discard(off, 4096).await.expect_err("discard beyond");
        assert!(is_invalid(&err), "{err}");
    }
    // Exactly at the end is fine.
    let b = dev
        .read_alloc_at((1 << 20) - 4096, 4096)
        .await
        .expect("last page");
    assert_eq!(b.len(), 4096);
    assert_eq!(dev.tags_in_use(), 0);
}

/// A single read far beyond any file size limit: the kernel answers
/// EINVAL (negative loff_t). The promise says out of range is refused
/// before submission; at the very least it must be a typed error.
#[plugio::test(timeout_s = 10)]
async fn a_read_at_an_offset_beyond_i64_max_on_a_file_is_a_typed_error() {
    let dir = tmpdir();
    let path = file(&dir, "huge1", 1 << 16);
    let dev = Device::open(&path, DeviceOptions::default()).expect("open");
    let res = dev.read_alloc_at(TOP, 4096).await;
    let err = res.expect_err("offset beyond i64::MAX cannot succeed");
    println!("read at {TOP:#x}: {err} ({:?})", err.kind());
    assert_eq!(dev.tags_in_use(), 0);
}

/// Two IOs at the top of the u64 offset space in one plug: the engine's
/// overlap and merge checks compute `offset + len`, which overflows.
#[plugio::test(timeout_s = 10)]
async fn two_writes_at_the_top_of_the_offset_space_do_not_panic_the_core() {
    let dir = tmpdir();
    let path = file(&dir, "huge2", 1 << 16);
    let dev = Device::open(&path, DeviceOptions::default()).expect("open");
    let a = dev.alloc_buf(4096);
    let b = dev.alloc_buf(4096);
    let (ra, rb) = futures::join!(dev.write_at(a, TOP), dev.write_at(b, TOP));
    let ea = ra.0.expect_err("write beyond i64::MAX");
    let eb = rb.0.expect_err("write beyond i64::MAX");
    assert!(
        is_invalid(&ea),
        "expected a refusal before submission: {ea}"
    );
    assert!(
        is_invalid(&eb),
        "expected a refusal before submission: {eb}"
    );
    assert_eq!(dev.tags_in_use(), 0);
}

/// Same overflow through the merge check: two reads at the top.
#[plugio::test(timeout_s = 10)]
async fn two_reads_at_the_top_of_the_offset_space_do_not_panic_the_core() {
    let dir = tmpdir();
    let path = file(&dir, "huge3", 1 << 16);
    let dev = Device::open(&path, DeviceOptions::default()).expect("open");
    let (ra, rb) = futures::join!(dev.read_alloc_at(TOP, 4096), dev.read_alloc_at(TOP, 4096));
    assert!(ra.is_err() && rb.is_err());
}

#[plugio::test(timeout_s = 10)]
async fn zero_length_and_empty_vectors_are_refused_and_empty_buffers_inside_readv_work() {
    let (_mem, dev) = mem_dev(1 << 20);
    let (r, _) = dev.read_at(DmaBuf::heap(0, 4096), 0).await;
    assert!(is_invalid(&r.expect_err("len 0 read")));
    let (r, _) = dev.write_at(DmaBuf::heap(0, 4096), 0).await;
    assert!(is_invalid(&r.expect_err("len 0 write")));
    let (r, v) = dev.readv_at(Vec::<DmaBuf>::new(), 0).await;
    assert!(is_invalid(&r.expect_err("readv of nothing")));
    assert!(v.is_empty());
    let (r, _) = dev.writev_at(Vec::<DmaBuf>::new(), 0).await;
    assert!(is_invalid(&r.expect_err("writev of nothing")));
    let (r, _) = dev
        .readv_at(vec![DmaBuf::heap(0, 4096), DmaBuf::heap(0, 4096)], 0)
        .await;
    assert!(is_invalid(&r.expect_err("readv of empty bufs")));
    let err = dev.write_zeroes(0, 0).await.expect_err("zeroes of 0");
    assert!(is_invalid(&err));
    let err = dev.discard(0, 0).await.expect_err("discard of 0");
    assert!(is_invalid(&err));

    // Empty buffers between full ones: legal, each gets its share.
    let mut w = vec![
        dev.alloc_buf(512),
        DmaBuf::heap(0, 512),
        dev.alloc_buf(1024),
    ];
    w[0].as_mut_slice().fill(1);
    w[2].as_mut_slice().fill(2);
    let (r, _) = dev.writev_at(w, 4096).await;
    assert_eq!(r.expect("writev with an empty buffer inside"), 1536);
    let bufs = vec![
        DmaBuf::heap(0, 512),
        dev.alloc_buf(1024),
        DmaBuf::heap(0, 512),
        dev.alloc_buf(512),
    ];
    let (r, bufs) = dev.readv_at(bufs, 4096).await;
    assert_eq!(r.expect("readv with empty buffers inside"), 1536);
    assert_eq!(
        bufs.iter().map(DmaBuf::len).collect::<Vec<_>>(),
        [0, 1024, 0, 512]
    );
    assert!(bufs[1].as_slice()[..512].iter().all(|&b| b == 1));
    assert!(bufs[1].as_slice()[512..].iter().all(|&b| b == 2));
    assert!(bufs[3].as_slice().iter().all(|&b| b == 2));
    assert_eq!(dev.tags_in_use(), 0);
}

#[plugio::test(timeout_s = 10)]
async fn unaligned_lengths_offsets_and_buffers_in_vectors_are_refused_and_others_complete() {
    // Bouncing off: memory the device cannot take as is is refused (with
    // it on, the default, it goes through an aligned copy: below).
    let mem = MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        ..MemConfig::default()
    });
    let strict = DeviceOptions {
        bounce_unaligned: false,
        ..DeviceOptions::default()
    };
    let dev = Device::with_backend(Arc::new(mem), None, strict).expect("device");
    let good = plugio::spawn_local({
        let dev = dev.clone();
        async move {
            for i in 0..32u64 {
                let (r, _) = dev.write_at(dev.alloc_buf(4096), i * 4096).await;
                r.expect("good write");
            }
        }
    });
    // A segment whose length is not a multiple of the block.
    let (r, _) = dev
        .readv_at(
            vec![dev.alloc_buf(512), dev.alloc_buf(100), dev.alloc_buf(412)],
            0,
        )
        .await;
    let err = r.expect_err("unaligned segment length");
    assert!(is_invalid(&err), "{err}");
    // Unaligned offset, length.
    assert!(is_invalid(
        &dev.read_alloc_at(1, 512).await.expect_err("offset")
    ));
    assert!(is_invalid(
        &dev.read_alloc_at(0, 513).await.expect_err("length")
    ));
    // A buffer at an odd address.
    let odd = DmaBuf::heap(8192, 1);
    if odd.as_ptr() as usize % 512 != 0 {
        let (r, _) = dev.write_at(odd, 0).await;
        assert!(is_invalid(&r.expect_err("odd buffer")));
    }
    // Too many segments for one op.
    let many: Vec<DmaBuf> = (0..1100).map(|_| DmaBuf::heap(512, 4096)).collect();
    let (r, back) = dev.readv_at(many, 0).await;
    assert!(is_invalid(&r.expect_err("1100 segments")));
    assert_eq!(back.len(), 1100, "the buffers come back");
    good.await.expect("good task");
    assert_eq!(dev.tags_in_use(), 0);
}

/// With bouncing on (the default), the vector with an odd segment and the
/// buffer at an odd address of the test above go through one aligned copy
/// each, land byte for byte, and are counted; offsets and lengths are
/// still refused.
#[plugio::test(timeout_s = 10)]
async fn unaligned_memory_is_bounced_by_default() {
    let (_mem, dev) = mem_dev(1 << 20);
    let mut odd = DmaBuf::heap(8192 + 1, 4096);
    odd.as_mut_slice()[1..].fill(9);
    // An aligned allocation, viewed from its second byte: never aligned.
    let src: Vec<u8> = odd.as_slice()[1..].to_vec();
    let mut shifted = bytes::BytesMut::with_capacity(8192 + 4096);
    let skip = (4096 - shifted.as_ptr() as usize % 4096) % 4096 + 1;
    shifted.resize(skip, 0);
    let _ = shifted.split_to(skip);
    shifted.extend_from_slice(&src);
    assert_ne!(shifted.as_ptr() as usize % 512, 0);
    let (r, _) = dev.write_at(shifted, 0).await;
    assert_eq!(r.expect("bounced write"), 8192);
    let segs = vec![vec![0u8; 512], vec![0u8; 100], vec![0u8; 412]];
    let (r, segs) = dev.readv_at(segs, 0).await;
    assert_eq!(r.expect("bounced readv"), 1024);
    assert!(segs.concat().iter().all(|&b| b == 9));
    assert_eq!(dev.iostats().bounce_ios, 2);
    assert!(is_invalid(
        &dev.read_alloc_at(1, 512).await.expect_err("offset")
    ));
}

#[test]
fn device_used_outside_a_runtime_is_a_typed_error_not_a_panic() {
    watchdog(10, || {
        let (_mem, dev) = mem_dev(1 << 20);
        let err = futures::executor::block_on(dev.read_alloc_at(0, 4096)).expect_err("no runtime");
        assert!(matches!(err.kind(), ErrorKind::NoDriver), "{err}");
        let (r, _) = futures::executor::block_on(dev.write_at(dev.alloc_buf(4096), 0));
        assert!(matches!(
            r.expect_err("no runtime").kind(),
            ErrorKind::NoDriver
        ));
        let err = futures::executor::block_on(dev.sync_data()).expect_err("no runtime");
        assert!(matches!(err.kind(), ErrorKind::NoDriver), "{err}");
        let err = dev.plug(4).expect_err("no runtime");
        assert!(matches!(err.kind(), ErrorKind::NoDriver), "{err}");
    });
}

#[plugio::test(timeout_s = 10)]
async fn sync_data_sync_all_and_nop_on_the_mem_device_succeed() {
    let (mem, dev) = mem_dev(1 << 20);
    let (r, _) = dev.write_at(dev.alloc_buf(4096), 0).await;
    r.expect("write");
    assert!(mem.dirty_blocks() > 0);
    dev.sync_data().await.expect("flush");
    assert_eq!(mem.dirty_blocks(), 0);
    dev.sync_all().await.expect("sync");
    dev.nop().await.expect("nop");
}

/// `DeviceOptions::read_only` on a device built with `with_backend`: the
/// option is accepted and then ignored, so writes go through.
#[plugio::test(timeout_s = 10)]
async fn read_only_option_is_honoured_by_with_backend() {
    let mem = MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        ..MemConfig::default()
    });
    let dev = Device::with_backend(
        Arc::new(mem.clone()),
        None,
        DeviceOptions {
            read_only: true,
            ..DeviceOptions::default()
        },
    )
    .expect("device");
    let (r, _) = dev.write_at(dev.alloc_buf(4096), 0).await;
    assert!(r.is_err(), "a write to a read-only device succeeded");
}

/// A write to a device opened read-only: refused (ideally before
/// submission), with a typed error, and reads in the same tick unaffected.
#[plugio::test(timeout_s = 10)]
async fn write_to_a_read_only_file_is_an_error_and_reads_still_work() {
    let dir = tmpdir();
    let path = file(&dir, "ro", 1 << 16);
    let dev = Device::open(
        &path,
        DeviceOptions {
            read_only: true,
            ..DeviceOptions::default()
        },
    )
    .expect("open read-only");
    let (w, r) = futures::join!(
        dev.write_at(dev.alloc_buf(4096), 0),
        dev.read_alloc_at(4096, 4096)
    );
    let err = w.0.expect_err("write to a read-only device");
    println!(
        "write to read-only: {err} ({:?}, errno {})",
        err.kind(),
        err.errno()
    );
    assert_eq!(r.expect("read").len(), 4096);
    assert_eq!(dev.tags_in_use(), 0);
}

/// Refusal before submission, strictly: the write to a read-only device
/// should never reach the kernel (it reaches it today and comes back as
/// EBADF).
#[plugio::test(timeout_s = 10)]
async fn write_to_a_read_only_file_is_refused_before_submission() {
    let dir = tmpdir();
    let path = file(&dir, "ro2", 1 << 16);
    let dev = Device::open(
        &path,
        DeviceOptions {
            read_only: true,
            ..DeviceOptions::default()
        },
    )
    .expect("open read-only");
    let (w, _) = dev.write_at(dev.alloc_buf(4096), 0).await;
    let err = w.expect_err("write to a read-only device");
    assert!(
        matches!(
            err.kind(),
            ErrorKind::InvalidInput(_) | ErrorKind::PermissionDenied | ErrorKind::Unsupported
        ),
        "{err} ({:?})",
        err.kind()
    );
    assert_eq!(
        dev.iostats().requests,
        0,
        "nothing should have been submitted"
    );
}

/// FUA and PREFLUSH are write flags (the kernel fails a read that carries
/// them): a read with either is refused before submission, on a file and
/// on the mem device, with a message that says what to do instead; a write
/// with both still goes through, and so does a read with `NOMERGE`.
#[plugio::test(timeout_s = 10)]
async fn fua_and_preflush_on_a_read_are_refused_before_submission() {
    use plugio::IoFlags;
    let dir = tmpdir();
    let path = file(&dir, "flags", 1 << 16);
    let on_file = Device::open(&path, DeviceOptions::default()).expect("open");
    let (_mem, on_mem) = mem_dev(1 << 20);
    for dev in [&on_file, &on_mem] {
        for flags in [
            IoFlags::FUA,
            IoFlags::PREFLUSH,
            IoFlags::PREFLUSH | IoFlags::FUA | IoFlags::NOMERGE,
        ] {
            let (r, buf) = dev.read_at_with(dev.alloc_buf(4096), 0, flags).await;
            let err = r.expect_err("a read with a write-only flag");
            assert!(
                matches!(
                    err.kind(),
                    ErrorKind::InvalidInput(InvalidInput::WriteOnlyFlags {
                        op: plugio::device::OpKind::Read,
                        flags: f,
                    })
                        if *f == flags
                ),
                "{err} ({:?})",
                err.kind()
            );
            let text = err.to_string();
            assert!(
                text.contains("are write flags")
                    && text.contains("remove them")
                    && text.contains("sync_data")
                    && !text.contains('{'),
                "{text}"
            );
            assert_eq!(buf.len(), 4096, "the buffer comes back whole");
        }
        assert_eq!(dev.iostats().requests, 0, "nothing was submitted");
        let flags = IoFlags::PREFLUSH | IoFlags::FUA;
        let (w, _) = dev.write_at_with(dev.alloc_buf(4096), 0, flags).await;
        assert_eq!(w.expect("a write takes both"), 4096);
        let (r, _) = dev
            .read_at_with(dev.alloc_buf(4096), 0, IoFlags::NOMERGE)
            .await;
        assert_eq!(r.expect("NOMERGE is for any op"), 4096);
    }
}

/// Every error of an IO method on a device opened by path names that
/// path, also the ones the methods make themselves before or after the
/// IO (found by a break-it helper: short reads of `read_exact_at`, a zero
/// `read_alloc_at`, long range ops, `set_len` on a read-only device).
#[plugio::test(timeout_s = 10)]
async fn the_errors_of_io_methods_name_the_devices_path() {
    let dir = tmpdir();
    let path = file(&dir, "named", 1 << 16);
    let dev = Device::open(&path, DeviceOptions::default()).expect("open");
    let named = |what: &str, e: plugio::Error| {
        assert_eq!(e.path(), Some(path.as_path()), "{what}: {e}");
        assert!(
            e.to_string()
                .ends_with(&format!("(path {})", path.display())),
            "{what}: {e}"
        );
    };
    let (r, _) = dev.read_exact_at(dev.alloc_buf(4096), 1 << 16).await;
    named("read_exact_at at the end", r.expect_err("short"));
    let (r, _) = dev.write_at(dev.alloc_buf(4096), 100).await;
    named("write_at unaligned", r.expect_err("unaligned"));
    named(
        "read_alloc_at of 0 bytes",
        dev.read_alloc_at(0, 0).await.expect_err("zero"),
    );
    let long = 2 << 30;
    named(
        "discard",
        dev.discard(100, long).await.expect_err("unaligned"),
    );
    named(
        "write_zeroes",
        dev.write_zeroes(100, long).await.expect_err("unaligned"),
    );
    named(
        "fallocate",
        dev.fallocate(100, long, plugio::FallocateMode::Allocate)
            .await
            .expect_err("unaligned"),
    );
    // One file is one device state: its read-only handle comes after
    // the writable one is gone.
    drop(dev);
    let ro = Device::open(
        &path,
        DeviceOptions {
            read_only: true,
            ..DeviceOptions::default()
        },
    )
    .expect("read-only open");
    named(
        "discard read-only",
        ro.discard(0, long).await.expect_err("ro"),
    );
    named("set_len read-only", ro.set_len(0).await.expect_err("ro"));
}

/// A device's error names the IO that failed (op, offset, length), so a
/// database can tell which blocks are bad (found by a fresh user: an EIO
/// said only "Input/output error"); invalid input keeps its own text.
#[plugio::test(timeout_s = 10)]
async fn a_devices_error_names_the_failed_io() {
    use plugio::device::backend::mem::{Fault, FaultOn};
    use plugio::device::OpKind;
    let (mem, dev) = mem_dev(1 << 20);
    mem.inject(Fault::Eio {
        lbas: 16..24,
        on: FaultOn::Both,
    });
    let (r, _) = dev.read_at(dev.alloc_buf(4096), 8192).await;
    let e = r.expect_err("EIO");
    assert_eq!(e.io(), Some((OpKind::Read, 8192, 4096)), "{e}");
    assert!(
        e.to_string()
            .starts_with("read of 4096 bytes at offset 8192: "),
        "{e}"
    );
    let (r, _) = dev
        .writev_at(vec![dev.alloc_buf(512), dev.alloc_buf(512)], 8192)
        .await;
    let e = r.expect_err("EIO");
    assert_eq!(e.io(), Some((OpKind::Write, 8192, 1024)), "{e}");
    let e = dev.discard(8192, 4096).await.expect_err("EIO");
    assert_eq!(e.io(), Some((OpKind::Discard, 8192, 4096)), "{e}");
    let (r, _) = dev.read_at(dev.alloc_buf(4096), 100).await;
    let e = r.expect_err("unaligned");
    assert_eq!(e.io(), None, "invalid input names its values itself: {e}");
    let (r, _) = dev.read_at(dev.alloc_buf(4096), 0).await;
    assert_eq!(r.expect("the other blocks read"), 4096);
}

/// Runs the test `name` of this binary in a child process (for calls that
/// may abort the process) and returns whether it passed.
fn child_passes(name: &str) -> (bool, String) {
    let out = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args(["--ignored", "--exact", name, "--test-threads=1"])
        .env("PLUGIO_ADVERSARIAL_CHILD", "1")
        .output()
        .expect("spawn child");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// `read_at` with a length far above MAX_IO_BYTES: refused with a Length
/// error, as a length of 2^31 is. Today the buffer is allocated before the
/// check: 2^50 bytes abort the process (handle_alloc_error), usize::MAX
/// overflows the capacity rounding in DmaBuf::heap.
#[test]
fn read_at_with_an_absurd_length_is_refused_not_aborted() {
    for name in ["child_read_at_2_pow_50", "child_read_at_usize_max"] {
        let (ok, text) = child_passes(name);
        assert!(ok, "{name} did not pass in a child process:\n{text}");
    }
}

#[test]
#[ignore = "child process of read_at_with_an_absurd_length_is_refused_not_aborted"]
fn child_read_at_2_pow_50() {
    if std::env::var_os("PLUGIO_ADVERSARIAL_CHILD").is_none() {
        return;
    }
    let ex = local();
    ex.run(async {
        let (_mem, dev) = mem_dev(1 << 20);
        let err = dev.read_alloc_at(0, 1 << 50).await.expect_err("2^50 bytes");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidInput(InvalidInput::Length { .. })
            ),
            "{err}"
        );
    });
}

#[test]
#[ignore = "child process of read_at_with_an_absurd_length_is_refused_not_aborted"]
fn child_read_at_usize_max() {
    if std::env::var_os("PLUGIO_ADVERSARIAL_CHILD").is_none() {
        return;
    }
    let ex = local();
    ex.run(async {
        let (_mem, dev) = mem_dev(1 << 20);
        let err = dev
            .read_alloc_at(0, usize::MAX)
            .await
            .expect_err("usize::MAX bytes");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidInput(InvalidInput::Length { .. })
            ),
            "{err}"
        );
    });
}

/// Strict form of the EINVAL case above: an offset no file can have is
/// out of range and should be refused before submission.
#[plugio::test(timeout_s = 10)]
async fn a_file_offset_above_i64_max_is_refused_before_submission() {
    let dir = tmpdir();
    let path = file(&dir, "huge4", 1 << 16);
    let dev = Device::open(&path, DeviceOptions::default()).expect("open");
    let err = dev
        .read_alloc_at(TOP, 4096)
        .await
        .expect_err("beyond i64::MAX");
    assert!(is_invalid(&err), "{err} ({:?})", err.kind());
    assert_eq!(dev.iostats().requests, 0, "it was submitted");
}

/// A split bio that crosses the end of a file, with its parts completing
/// out of order at a high queue depth: the result is the prefix up to
/// EOF, exactly.
#[plugio::test(timeout_s = 10)]
async fn a_split_read_across_end_of_file_returns_exactly_the_prefix() {
    let dir = tmpdir();
    let len = (1 << 20) + 4096 + 512 * 3;
    let path = file(&dir, "eofsplit", len);
    let dev = Device::open(
        &path,
        DeviceOptions {
            max_request_bytes: Some(16384),
            queue_depth: 64,
            direct: true,
            ..DeviceOptions::default()
        },
    )
    .expect("open");
    let b = dev
        .read_alloc_at(0, 2 << 20)
        .await
        .expect("read across EOF");
    assert_eq!(b.len(), len);
    let want: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7)).collect();
    assert!(b.as_slice() == &want[..]);
    let b = dev
        .read_alloc_at(2 << 20, 65536)
        .await
        .expect("read past EOF");
    assert_eq!(b.len(), 0);
    assert_eq!(dev.tags_in_use(), 0);
}

/// `max_request_bytes` far above what one read/write call can move: the
/// engine keeps it, so merging may build requests above MAX_IO_BYTES
/// (0x7fff_f000), whose byte count no longer fits the i32 completion
/// result (the kernel caps them at MAX_RW_COUNT: a silent short count).
#[test]
fn the_request_limit_never_exceeds_max_io_bytes() {
    let m = MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        ..MemConfig::default()
    });
    let dev = Device::with_backend(
        Arc::new(m),
        None,
        DeviceOptions {
            max_request_bytes: Some(u64::MAX),
            ..DeviceOptions::default()
        },
    );
    if let Ok(dev) = dev {
        assert!(
            dev.max_request_bytes() <= plugio::engine::MAX_IO_BYTES,
            "request limit {:#x}",
            dev.max_request_bytes()
        );
    }
}
