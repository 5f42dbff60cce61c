//! A `Device` future polled outside a plugio core fails at once with
//! `NoDriver` and a message that says what to do, instead of hanging.

mod common;

use common::{tmpdir, watchdog};
use plugio_device::ErrorKind;
use plugio_engine::device::Device;
use plugio_engine::options::DeviceOptions;

fn file_device(dir: &tempfile::TempDir) -> Device {
    let path = dir.path().join("f");
    std::fs::write(&path, vec![1u8; 8192]).expect("fixture");
    Device::open(&path, DeviceOptions::default()).expect("open")
}

#[test]
fn io_polled_by_a_plain_block_on_is_no_driver_and_names_the_fix() {
    watchdog(30, || {
        let dir = tmpdir();
        let dev = file_device(&dir);
        let err = futures::executor::block_on(dev.read_alloc_at(0, 4096)).expect_err("off a core");
        assert_eq!(*err.kind(), ErrorKind::NoDriver);
        let msg = err.to_string();
        assert!(msg.contains("outside a plugio core"), "{msg}");
        assert!(msg.contains("plugio::runtime::local"), "{msg}");
        assert!(msg.contains("Handle::spawn_on"), "{msg}");
        // The same from another thread, and for a write.
        let t = std::thread::spawn(move || {
            let buf = dev.alloc_buf(4096);
            let (r, _) = futures::executor::block_on(dev.write_at(buf, 0));
            r.expect_err("off a core")
        });
        let err = t.join().expect("thread");
        assert_eq!(*err.kind(), ErrorKind::NoDriver);
        assert!(err.to_string().contains("Handle::spawn_on"), "{err}");
    });
}

#[test]
fn io_on_an_executor_without_the_driver_is_no_driver_and_names_the_fix() {
    watchdog(30, || {
        let dir = tmpdir();
        let dev = file_device(&dir);
        let ex = plugio_executor::LocalExecutor::new();
        let err = ex
            .run(async move { dev.read_alloc_at(0, 4096).await })
            .expect_err("no driver");
        assert_eq!(*err.kind(), ErrorKind::NoDriver);
        let msg = err.to_string();
        assert!(msg.contains("no DeviceDriver"), "{msg}");
        assert!(msg.contains("plugio::runtime::local"), "{msg}");
    });
}

#[test]
fn io_on_a_second_executor_of_the_thread_is_no_driver_and_leaves_the_first_alone() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    watchdog(30, || {
        let dir = tmpdir();
        let dev = file_device(&dir);
        let ex = plugio_engine::runtime::local(plugio_device::RingConfig::default()).expect("ex");
        // The driver's own executor has an IO in its plug (polled by an
        // embedder inside `enter`, not yet flushed).
        let mut first = std::pin::pin!(dev.read_alloc_at(0, 4096));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(ex.enter(|| first.as_mut().poll(&mut cx)).is_pending());
        // Another executor on the same thread, without the driver: its IO
        // is refused at once (nothing of it would ever be reaped) ...
        let plain = plugio_executor::LocalExecutor::new();
        let err = plain
            .run(dev.read_alloc_at(4096, 4096))
            .expect_err("no driver");
        assert_eq!(*err.kind(), ErrorKind::NoDriver);
        assert!(err.to_string().contains("no DeviceDriver"), "{err}");
        // ... and the first executor's IO is left alone: it completes.
        let data = loop {
            if let Poll::Ready(r) = ex.enter(|| first.as_mut().poll(&mut cx)) {
                break r.expect("the first executor's read");
            }
            ex.run_once_timeout(Some(std::time::Duration::from_millis(100)));
        };
        assert_eq!(data.as_slice(), &[1u8; 4096][..]);
    });
}

#[test]
fn io_polled_again_after_its_executor_dropped_is_cancelled() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    watchdog(30, || {
        let dir = tmpdir();
        let dev = file_device(&dir);
        let ex = plugio_engine::runtime::local(plugio_device::RingConfig::default()).expect("ex");
        // Polled by an embedder inside `enter`: the read waits in the plug.
        let mut read = std::pin::pin!(dev.read_alloc_at(0, 4096));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(ex.enter(|| read.as_mut().poll(&mut cx)).is_pending());
        drop(ex);
        // Nothing will send it now: polled again, it fails, it does not
        // wait forever (or blame a move to another core).
        let Poll::Ready(r) = read.as_mut().poll(&mut cx) else {
            panic!("an IO of a dropped executor stays pending");
        };
        let err = r.expect_err("cancelled");
        assert_eq!(err.errno(), libc::ECANCELED, "{err}");
        // The thread can run a new executor and do IO with the device.
        let ex = plugio_engine::runtime::local(plugio_device::RingConfig::default()).expect("ex");
        let data = ex.run(dev.read_alloc_at(0, 4096)).expect("read");
        assert_eq!(data.as_slice(), &[1u8; 4096][..]);
    });
}
