//! The error messages that the book's troubleshooting page
//! (`book/src/troubleshooting.md`) quotes, produced for real: if one of
//! these changes, the page must change with it. (The tutorial programs in
//! `examples/` are built by `cargo test` and run to completion by the
//! `book` block of `.ci/run`.)

use plugio::{Device, DeviceOptions, ErrorKind, InvalidInput, RingConfig, TagSharing};

fn temp_file(len_bytes: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let path = dir.path().join("data.db");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(len_bytes))
        .expect("create the file");
    (dir, path)
}

#[test]
fn a_missing_path_is_not_found_and_names_the_path() {
    let err = Device::open("/nonexistent-plugio-book/data.db", DeviceOptions::default())
        .expect_err("a missing path cannot be opened");
    assert_eq!(*err.kind(), ErrorKind::NotFound);
    assert_eq!(
        err.to_string(),
        "not found (path /nonexistent-plugio-book/data.db)"
    );
}

#[test]
fn an_out_of_range_option_names_the_field_and_the_range() {
    let options = DeviceOptions {
        queue_depth: 0,
        ..DeviceOptions::default()
    };
    let (_dir, path) = temp_file(4096);
    let err = Device::open(&path, options).expect_err("queue_depth 0 is refused");
    assert!(matches!(
        err.kind(),
        ErrorKind::InvalidInput(InvalidInput::Config { .. })
    ));
    assert_eq!(
        err.to_string(),
        "invalid input: bad option: queue_depth 0 is out of range: use 1..=65536"
    );
}

#[test]
fn misaligned_direct_io_is_refused_with_the_value_and_the_alignment() {
    let (_dir, path) = temp_file(1 << 20);
    let ex = plugio::runtime::local(RingConfig::default()).expect("executor");
    ex.run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        let align = dev.geometry().offset_align_bytes();
        assert!(align > 1, "the file is opened with O_DIRECT");

        let buf = dev.alloc_buf(4096);
        let (res, _) = dev.write_at(buf, 100).await;
        let err = res.expect_err("offset 100 is not aligned");
        assert_eq!(
            err.to_string(),
            format!(
                "invalid input: offset 0x64 is not aligned to {align} bytes: use a multiple of \
                 {align} (the device's Geometry::offset_align_bytes) (path {})",
                path.display()
            )
        );

        let buf = dev.alloc_buf(100);
        let (res, _) = dev.write_at(buf, 0).await;
        let err = res.expect_err("a 100-byte length is not aligned");
        println!("misaligned length: {err}");
        assert!(matches!(
            err.kind(),
            ErrorKind::InvalidInput(InvalidInput::Alignment { .. })
        ));
        assert!(err.to_string().contains(&format!("{align} bytes")), "{err}");
        // The one segment is the whole IO: the message says where its
        // length comes from, in decimal.
        assert_eq!(
            err.to_string(),
            format!(
                "invalid input: the write's length (what its buffers hold: bytes_init, \
                 a Vec's len) is 100 bytes, not a multiple of {align} bytes: round it up to \
                 one (the device's Geometry::offset_align_bytes) (path {})",
                path.display()
            )
        );

        let err = dev.read_alloc_at(0, 0).await.expect_err("zero length");
        println!("zero length: {err}");
        assert!(matches!(
            err.kind(),
            ErrorKind::InvalidInput(InvalidInput::ZeroLength)
        ));
        assert_eq!(dev.iostats().bios, 0, "refused IOs never become bios");
    });
}

#[test]
fn the_handles_the_kv_tutorial_shares_between_cores_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Device>();
    send_sync::<plugio::executor::channel::Sender<Vec<u8>>>();
    send_sync::<plugio::DmaBuf>();
}

/// The kv tutorial's way to keep `Rc` state on a core of a multi-core
/// runtime: `spawn_on` a `Send` future that makes the state's future on
/// the core and hands it to `spawn_local` (a fresh user found no way in
/// the book).
#[test]
fn per_core_rc_state_goes_through_spawn_local_inside_spawn_on() {
    async fn shard(core: usize) -> usize {
        let state = std::rc::Rc::new(std::cell::RefCell::new(core));
        plugio::yield_now().await;
        let v = *state.borrow();
        v * 10
    }
    let rt = plugio::runtime::builder(RingConfig::default())
        .cores(2)
        .build()
        .expect("runtime");
    let handle = rt.spawn_on(1, async move { plugio::spawn_local(shard(1)).await });
    let inner = rt.block_on(handle).expect("the outer task");
    assert_eq!(inner.expect("the inner task"), 10);
}

/// The defaults the book's tuning page shows (it includes this block), so
/// the page changes when a default does.
#[test]
// `..RingConfig::default()` keeps this compiling when a field is added.
#[allow(clippy::needless_update)]
fn the_defaults_on_the_tuning_page_are_the_defaults() {
    // ANCHOR: defaults
    // The defaults, spelled out (DeviceOptions also has bio_cache,
    // buffer_cache, bounce_unaligned, iostats, max_merge_bytes, read_only,
    // overlap_order, fast_lane and backend; RingConfig also has
    // defer_taskrun, batch_wait and batch_wait_timer).
    let options = DeviceOptions {
        queue_depth: 256,             // tags: requests in flight, all cores together
        plug_max_count: 32,           // BLK_MAX_REQUEST_COUNT
        plug_flush_bytes: 128 * 1024, // BLK_PLUG_FLUSH_SIZE; 0: no byte trigger
        tag_sharing: TagSharing::Shared,
        tag_batch: true,
        tag_batch_retry: true,
        max_request_bytes: None, // the device's max_sectors (files: 1 MiB)
        nomerges: 0,
        cached_clock: true,
        direct: true, // O_DIRECT
        ..DeviceOptions::default()
    };
    let ring = RingConfig {
        sq_entries: 256,
        cq_entries: None,    // 2 x SQ
        taskrun_flags: true, // SINGLE_ISSUER|DEFER_TASKRUN, else COOP_TASKRUN
        sqpoll_idle_ms: None,
        iopoll: false,
        registered_files: 64,
        ..RingConfig::default()
    };
    // ANCHOR_END: defaults
    assert_eq!(
        format!("{options:?}"),
        format!("{:?}", DeviceOptions::default())
    );
    assert_eq!(format!("{ring:?}"), format!("{:?}", RingConfig::default()));
}

// ANCHOR: passthrough
/// Opens an NVMe namespace's generic character device (`/dev/ngXnY`) for
/// passthrough: NVMe commands through `IORING_OP_URING_CMD`.
fn open_passthrough(path: &str, iopoll: bool) -> Result<Device, plugio::Error> {
    use plugio::device::{NvmeBackend, NvmeOptions};
    let nvme = NvmeOptions {
        iopoll, // a polled ring, when the namespace has poll queues
        ..NvmeOptions::default()
    };
    let backend = NvmeBackend::open_with(path, &nvme)?;
    Device::with_backend(
        std::sync::Arc::new(backend),
        Some(path.into()),
        DeviceOptions::default(),
    )
}
// ANCHOR_END: passthrough

/// The tuning page's passthrough snippet compiles (above) and, on a machine
/// without that namespace, fails with a typed error instead of panicking.
#[test]
fn the_passthrough_snippet_reports_a_missing_namespace() {
    let path = "/dev/ng-plugio-book-missing-n1";
    let err = open_passthrough(path, false).expect_err("no such namespace");
    println!("passthrough on a missing node: {err}");
    assert_eq!(*err.kind(), ErrorKind::NotFound, "{err}");
}

// ANCHOR: power_cut
/// A crash test on the simulated device (`plugio-device`'s `test-util`
/// feature): what a power cut keeps is what was made durable, and
/// nothing else.
#[test]
fn a_power_cut_keeps_what_was_made_durable_and_nothing_else() {
    use plugio::device::{MemConfig, MemDevice, PowerCutMode};
    use plugio::{Device, DeviceOptions, IoFlags, RingConfig};
    use std::sync::Arc;

    let ex = plugio::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async {
        let mem = MemDevice::new(MemConfig {
            power_cut_mode: PowerCutMode::LoseUnflushed, // or Torn: half the blocks survive
            ..MemConfig::default()
        });
        let dev = Device::with_backend(Arc::new(mem.clone()), None, DeviceOptions::default())
            .expect("device");
        // A FUA write is durable when it completes; a plain write only
        // after a flush (sync_data).
        let mut fua = dev.alloc_buf(4096);
        fua.as_mut_slice().fill(1);
        dev.write_at_with(fua, 0, IoFlags::FUA)
            .await
            .0
            .expect("FUA write");
        let mut plain = dev.alloc_buf(4096);
        plain.as_mut_slice().fill(2);
        dev.write_at(plain, 4096).await.0.expect("plain write");

        mem.power_cut();
        // Take the image right at the cut: the device serves IO again
        // after it (as a disk that came back), so IO issued later would
        // be in a later image.
        let image = mem.durable_bytes(0..8192);
        assert!(
            image[..4096].iter().all(|&b| b == 1),
            "the FUA write survived"
        );
        assert!(
            image[4096..].iter().all(|&b| b == 0),
            "the unflushed write was lost"
        );
        // Reads now see the durable image, as after a reboot.
        let back = dev.read_alloc_at(4096, 4096).await.expect("read");
        assert!(back.as_slice().iter().all(|&b| b == 0));
    });
}
// ANCHOR_END: power_cut
