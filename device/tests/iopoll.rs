//! A ring set up with `IORING_SETUP_IOPOLL` (`RingConfig { iopoll: true }`)
//! and a device that cannot be polled (a file whose disk has no poll
//! queues): the op is refused at once with `ErrorKind::Unsupported`, the
//! kernel's answer, instead of the core spinning forever; and the ring
//! still serves cross-thread wakes without its eventfd read, which an
//! IOPOLL ring cannot take (issue 13, "Executor and device safety").

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use common::{pattern, temp_file};
use plugio_device::testing::block_on;
use plugio_device::{DeviceDriver, ErrorKind, File, OpenOptions, RingConfig};

fn iopoll_driver() -> DeviceDriver {
    DeviceDriver::with_ring(&RingConfig {
        iopoll: true,
        ..Default::default()
    })
    .expect("IOPOLL ring")
}

/// Runs `f` on its own thread; a hang (the bug: the core spun forever)
/// fails the test instead of blocking the suite.
fn watchdog(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(_) => panic!("hang: an IOPOLL ring never completed the op"),
    }
}

#[test]
fn direct_read_of_a_file_that_cannot_be_polled_is_refused_at_once() {
    watchdog(|| {
        let driver = iopoll_driver();
        let info = driver.ring_info().expect("a ring").clone();
        let tmp = temp_file();
        std::fs::write(tmp.path(), pattern(65536, 3)).expect("fill");
        let file = File::open_with(tmp.path(), &OpenOptions::new()).expect("open O_DIRECT");
        block_on(&driver, async {
            for _ in 0..2 {
                let (r, _) = file.read_at(file.alloc_buf(4096), 0).await;
                if !info.iopoll {
                    // The kernel refused IOPOLL: a plain ring reads.
                    assert_eq!(r.expect("read"), 4096);
                    continue;
                }
                let err = r.expect_err("a file on a disk without poll queues");
                assert_eq!(err.kind(), &ErrorKind::Unsupported, "{err}");
            }
        });
        assert_eq!(driver.in_flight(), 0);
    });
}

#[test]
fn iopoll_ring_serves_cross_thread_wakes_without_its_eventfd_read() {
    watchdog(|| {
        let driver = iopoll_driver();
        let woken = Arc::new(AtomicBool::new(false));
        let w = woken.clone();
        let mut waker_sent = false;
        let (tx, rx) = std::sync::mpsc::channel::<std::task::Waker>();
        let waker_thread = std::thread::spawn(move || {
            let waker = rx.recv().expect("waker");
            // Release: pairs with the Acquire load in the polled future.
            w.store(true, Ordering::Release);
            waker.wake();
        });
        block_on(
            &driver,
            std::future::poll_fn(|cx| {
                // Acquire: pairs with the Release store above.
                if woken.load(Ordering::Acquire) {
                    return Poll::Ready(());
                }
                if !waker_sent {
                    waker_sent = true;
                    tx.send(cx.waker().clone()).expect("send waker");
                }
                Poll::Pending
            }),
        );
        waker_thread.join().expect("waker thread");
    });
}
