//! The simulated device: faults show up as typed errors, power cuts keep
//! only flushed or FUA writes, latency is deterministic for a seed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use plugio_device::backend::mem::{Fault, FaultOn, Latency, MemClock, PowerCutMode};
use plugio_device::testing::block_on;
use plugio_device::{DeviceDriver, ErrorKind, File, IoFlags, MemConfig, MemDevice};

fn device(config: MemConfig) -> (MemDevice, File) {
    let dev = MemDevice::new(config);
    let file = File::from_backend(Arc::new(dev.clone()));
    (dev, file)
}

fn buf(file: &File, len: usize, byte: u8) -> plugio_device::DmaBuf {
    let mut b = file.alloc_buf(len);
    b.as_mut_slice().fill(byte);
    b
}

#[test]
fn writes_read_back_and_bad_input_is_refused() {
    let driver = DeviceDriver::without_ring().expect("driver");
    let (_, file) = device(MemConfig::default());
    block_on(&driver, async {
        let (r, _) = file.write_at(buf(&file, 8192, 0x5a), 4096).await;
        assert_eq!(r.expect("write"), 8192);
        let (r, b) = file.read_at(file.alloc_buf(8192), 4096).await;
        assert_eq!(r.expect("read"), 8192);
        assert!(b.as_slice().iter().all(|&x| x == 0x5a));
        let (r, _) = file.read_at(file.alloc_buf(512), 100).await;
        assert!(matches!(
            r.map_err(|e| e.kind().clone()),
            Err(ErrorKind::InvalidInput(_))
        ));
        let end = 64 << 20;
        let (r, _) = file.read_at(file.alloc_buf(4096), end - 512).await;
        assert!(matches!(
            r.map_err(|e| e.kind().clone()),
            Err(ErrorKind::InvalidInput(_))
        ));
    });
}

#[test]
fn eio_at_chosen_lbas_is_a_typed_error_and_spares_the_rest() {
    let driver = DeviceDriver::without_ring().expect("driver");
    let (dev, file) = device(MemConfig::default());
    dev.inject(Fault::Eio {
        lbas: 16..17,
        on: FaultOn::Read,
    });
    block_on(&driver, async {
        let (r, _) = file.read_at(file.alloc_buf(4096), 12 * 512).await;
        assert_eq!(
            r.expect_err("EIO").kind(),
            &ErrorKind::Io { errno: libc::EIO }
        );
        let (r, _) = file.read_at(file.alloc_buf(4096), 0).await;
        assert_eq!(r.expect("other LBAs read"), 4096);
        let (r, _) = file.write_at(buf(&file, 512, 1), 16 * 512).await;
        assert_eq!(r.expect("writes allowed"), 512);
    });
}

#[test]
fn short_read_and_enospc_faults() {
    let driver = DeviceDriver::without_ring().expect("driver");
    let (dev, file) = device(MemConfig {
        faults: vec![
            Fault::ShortRead { lba: 10 },
            Fault::EnospcAfter { bytes: 8192 },
        ],
        ..MemConfig::default()
    });
    block_on(&driver, async {
        let (r, b) = file.read_at(file.alloc_buf(4096), 8 * 512).await;
        assert_eq!(r.expect("short read"), 1024);
        assert_eq!(b.len(), 1024);
        let (r, _) = file.write_at(buf(&file, 8192, 2), 0).await;
        assert_eq!(r.expect("within the space"), 8192);
        let (r, _) = file.write_at(buf(&file, 512, 2), 65536).await;
        assert_eq!(r.expect_err("full").kind(), &ErrorKind::OutOfSpace);
    });
    assert_eq!(dev.written_bytes(), 8192);
}

#[test]
fn power_cut_keeps_only_flushed_and_fua_writes() {
    let driver = DeviceDriver::without_ring().expect("driver");
    let (dev, file) = device(MemConfig::default());
    block_on(&driver, async {
        let (r, _) = file.write_at(buf(&file, 4096, 1), 0).await;
        r.expect("write");
        file.fdatasync().await.expect("flush");
        let (r, _) = file
            .write_at_with(buf(&file, 4096, 2), 4096, IoFlags::FUA)
            .await;
        r.expect("fua write");
        let (r, _) = file.write_at(buf(&file, 4096, 3), 8192).await;
        r.expect("volatile write");
        // Reads see the volatile contents before the cut.
        let (_, b) = file.read_at(file.alloc_buf(4096), 8192).await;
        assert!(b.as_slice().iter().all(|&x| x == 3));
    });
    assert_eq!(dev.dirty_blocks(), 8);
    dev.power_cut();
    block_on(&driver, async {
        for (off, want) in [(0u64, 1u8), (4096, 2), (8192, 0)] {
            let (r, b) = file.read_at(file.alloc_buf(4096), off).await;
            r.expect("read after cut");
            assert!(
                b.as_slice().iter().all(|&x| x == want),
                "offset {off} expects {want}"
            );
        }
    });
}

#[test]
fn power_cut_in_torn_mode_tears_at_block_granularity() {
    let driver = DeviceDriver::without_ring().expect("driver");
    let (dev, file) = device(MemConfig {
        power_cut_mode: PowerCutMode::Torn,
        seed: 7,
        ..MemConfig::default()
    });
    block_on(&driver, async {
        let (r, _) = file.write_at(buf(&file, 65536, 9), 0).await;
        r.expect("write");
    });
    dev.power_cut();
    let image = dev.durable_bytes(0..65536);
    let kept = image
        .chunks(512)
        .filter(|b| b.iter().all(|&x| x == 9))
        .count();
    let lost = image
        .chunks(512)
        .filter(|b| b.iter().all(|&x| x == 0))
        .count();
    assert_eq!(kept + lost, 128, "every block is whole: kept or lost");
    assert!(kept > 0 && lost > 0, "torn: {kept} kept, {lost} lost");
}

#[test]
fn in_flight_ops_fail_after_a_power_cut() {
    use plugio_executor::Driver;
    let driver = DeviceDriver::without_ring().expect("driver");
    let (dev, file) = device(MemConfig {
        latency: Latency::Fixed(Duration::from_millis(20)),
        ..MemConfig::default()
    });
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = Box::pin(file.write_at(buf(&file, 512, 4), 0));
    assert!(std::future::Future::poll(fut.as_mut(), &mut cx).is_pending());
    dev.power_cut();
    let out = loop {
        driver.park(Some(Duration::from_millis(50))).expect("park");
        if let std::task::Poll::Ready(out) = std::future::Future::poll(fut.as_mut(), &mut cx) {
            break out;
        }
    };
    assert_eq!(
        out.0.expect_err("lost").kind(),
        &ErrorKind::Io {
            errno: libc::ENODEV
        }
    );
    assert_eq!(dev.durable_bytes(0..512), vec![0; 512]);
}

fn latency_run(seed: u64, clock: MemClock, latency: Latency) -> (Vec<usize>, Duration) {
    let driver = DeviceDriver::without_ring().expect("driver");
    let (_, file) = device(MemConfig {
        latency,
        clock,
        queue_depth: 4,
        seed,
        ..MemConfig::default()
    });
    let order = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let start = Instant::now();
    block_on(&driver, async {
        let futs = (0..16usize).map(|i| {
            let file = file.clone();
            let order = order.clone();
            async move {
                // Each task does two dependent reads: the second is issued
                // at the (virtual) time the first completed.
                for round in 0..2u64 {
                    let (r, _) = file
                        .read_at(file.alloc_buf(512), (i as u64 + round * 16) * 512)
                        .await;
                    r.expect("read");
                    order.borrow_mut().push(i);
                }
            }
        });
        join_all(futs).await;
    });
    let order = order.borrow().clone();
    (order, start.elapsed())
}

const SPREAD: Latency = Latency::Uniform {
    min: Duration::from_micros(100),
    max: Duration::from_millis(3),
};

#[test]
fn virtual_latency_orders_completions_deterministically_for_a_seed() {
    let (a, _) = latency_run(42, MemClock::Virtual, SPREAD);
    let (b, _) = latency_run(42, MemClock::Virtual, SPREAD);
    let (c, _) = latency_run(43, MemClock::Virtual, SPREAD);
    assert_eq!(a.len(), 32);
    assert_eq!(a, b, "same seed, same completion order");
    assert_ne!(a, c, "another seed, another order");
    assert_ne!(
        a,
        (0..16).chain(0..16).collect::<Vec<_>>(),
        "latency reorders"
    );
}

#[test]
fn real_latency_respects_the_queue_depth() {
    // 32 ops of 2 ms on 4 channels: at least 8 waves, 16 ms.
    let (order, took) = latency_run(1, MemClock::Real, Latency::Fixed(Duration::from_millis(2)));
    assert_eq!(order.len(), 32);
    assert!(took >= Duration::from_millis(16), "{took:?}");
}
