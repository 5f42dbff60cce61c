//! IO started while an executor closes: buffers whose `Drop` issues new IO
//! run their drops inside the close (a cancelled task's plugged write is
//! ended by the close's abandon; an orphaned write's buffer goes when its
//! completion is reaped by the driver's drain). That IO must end (with
//! `ECANCELED`, or done if it reached its device), the device must work
//! under the thread's next executor, and once every such IO has ended no
//! tag may stay taken.
//!
//! Written for a hang a break-it helper reported on 2026-12-07 (plugging
//! off, IO from such drops in the close, then a device whose IO never
//! completed under the next executor, every tag in use); these tests do
//! not reproduce it, in debug or release, and its sequence was not kept.
//! They stay as regression tests of the close.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use plugio_device::backend::mem::{Latency, MemClock, MemConfig, MemDevice};
use plugio_engine::{Device, DeviceOptions, IoBuf, IoBufMut};

mod common;

use common::{local, watchdog};

type Kept = Vec<Pin<Box<dyn Future<Output = Result<(), plugio_device::Error>>>>>;

thread_local! {
    /// The futures of the IO the buffers' drops started, still pending.
    static KEPT: RefCell<Kept> = const { RefCell::new(Vec::new()) };
}

/// A buffer whose drop starts a NOP and a write on `dev` (each polled
/// once, so issued) and keeps the NOP's future in `KEPT`; the write's
/// buffer is an `IoOnDrop` again, `chain` generations deep, and its future
/// is kept in every other generation and dropped (its IO orphaned) in the
/// others.
struct IoOnDrop {
    bytes: Vec<u8>,
    dev: Option<Device>,
    off: u64,
    /// How many more generations of drops start IO.
    chain: u32,
    /// Every write's future is dropped (never kept).
    orphan: bool,
}

impl Drop for IoOnDrop {
    fn drop(&mut self) {
        let Some(dev) = self.dev.take() else { return };
        let off = self.off;
        let nop: Pin<Box<dyn Future<Output = _>>> = Box::pin({
            let dev = dev.clone();
            async move { dev.nop().await }
        });
        let (chain, orphan) = (self.chain, self.orphan);
        let write: Pin<Box<dyn Future<Output = _>>> = Box::pin(async move {
            let b = IoOnDrop {
                bytes: vec![0x77; 4096],
                dev: (chain > 0).then(|| dev.clone()),
                off: (off + 4096) % (1 << 20),
                chain: chain.saturating_sub(1),
                orphan,
            };
            dev.write_at(b, off).await.0.map(|_| ())
        });
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        for (mut f, keep) in [(nop, true), (write, !orphan && chain % 2 == 0)] {
            if f.as_mut().poll(&mut cx).is_pending() && keep {
                KEPT.with(|k| k.borrow_mut().push(f));
            }
        }
    }
}

// SAFETY: delegates to the Vec, whose heap memory does not move.
unsafe impl IoBuf for IoOnDrop {
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
unsafe impl IoBufMut for IoOnDrop {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
    unsafe fn set_init(&mut self, len_bytes: usize) {
        // SAFETY: forwarded contract.
        unsafe { self.bytes.set_len(len_bytes) }
    }
}

fn mem(clock: MemClock) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        latency: Latency::Uniform {
            min: Duration::from_micros(1),
            max: Duration::from_micros(20),
        },
        clock,
        ..Default::default()
    }))
}

/// One round: an executor whose tasks write with `IoOnDrop` buffers on
/// every device, dropped while they are plugged, waiting and in flight.
fn close_with_io_in_drops(devs: &[Device], round: u64) {
    let ex = local();
    let held = ex.run(async {
        let mut held = Vec::new();
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        for (i, d) in devs.iter().enumerate() {
            for k in 0..4u64 {
                let target = match (i + k as usize) % 3 {
                    0 => devs[0].clone(),
                    1 => d.clone(),
                    _ => devs[devs.len() - 1].clone(),
                };
                let buf = IoOnDrop {
                    bytes: vec![i as u8; 4096],
                    dev: Some(target),
                    off: (64 + round * 256 + i as u64 * 4 + k) * 4096 % (1 << 20),
                    chain: 6,
                    orphan: false,
                };
                let d = d.clone();
                let mut f: Pin<Box<dyn Future<Output = _>>> =
                    Box::pin(async move { d.write_at(buf, k * 4096).await.0.map(|_| ()) });
                if k % 2 == 0 {
                    // Issued here, kept past the executor.
                    if f.as_mut().poll(&mut cx).is_pending() {
                        held.push(f);
                    }
                } else {
                    plugio_executor::spawn_local(f);
                }
            }
        }
        // Let the tasks issue their writes (one tick), then return with
        // them plugged, waiting for tags and in flight.
        plugio_executor::yield_now().await;
        held
    });
    drop(ex);
    KEPT.with(|k| k.borrow_mut().extend(held));
}

/// A NOP and a write on every device (their tags must be free).
async fn fresh_io(devs: &[Device]) {
    for d in devs {
        d.nop().await.expect("nop under the next executor");
        let mut b = d.alloc_buf(4096);
        b.as_mut_slice().fill(0x11);
        let (r, _) = d.write_at(b, 0).await;
        r.expect("write under the next executor");
    }
}

/// Every kept future ends under a new executor, with `ECANCELED` or done,
/// and fresh IO on the devices works, before the kept futures are polled
/// (`fresh_first`: the old state's requests must not hold the tags) and
/// after. Returns how many futures were kept.
fn next_executor_finishes_everything(devs: &[Device], fresh_first: bool) -> usize {
    let ex = local();
    let kept = ex.run(async {
        if fresh_first {
            fresh_io(devs).await;
        }
        let futures = KEPT.with(|k| std::mem::take(&mut *k.borrow_mut()));
        let kept = futures.len();
        for f in futures {
            match f.await {
                Ok(()) => {}
                Err(e) => assert_eq!(
                    e.errno(),
                    libc::ECANCELED,
                    "IO started while its executor closed: {e}"
                ),
            }
        }
        fresh_io(devs).await;
        kept
    });
    drop(ex);
    kept
}

/// Runs executors until no kept future is left (the drops of one round's
/// buffers may keep more), then checks that no tag of any device is
/// taken: every IO has ended and the last executor's driver drained.
fn drain_and_check_tags(devs: &[Device]) {
    for _ in 0..50 {
        if KEPT.with(|k| k.borrow().is_empty()) {
            break;
        }
        next_executor_finishes_everything(devs, false);
    }
    assert!(KEPT.with(|k| k.borrow().is_empty()), "kept futures left");
    for (i, d) in devs.iter().enumerate() {
        assert_eq!(d.tags_in_use(), 0, "device {i}: tags left taken");
    }
}

#[test]
fn io_started_by_drops_during_close_ends_and_leaves_the_device_usable() {
    for clock in [MemClock::Virtual, MemClock::Real] {
        for queue_depth in [4, 16] {
            for plug_max_count in [1usize, 2, 32] {
                watchdog(120, move || {
                    let options = DeviceOptions {
                        plug_max_count,
                        queue_depth,
                        ..DeviceOptions::default()
                    };
                    let devs: Vec<Device> = (0..70)
                        .map(|_| Device::with_backend(mem(clock), None, options.clone()).unwrap())
                        .collect();
                    let mut kept = 0;
                    for round in 0..3 {
                        close_with_io_in_drops(&devs, round);
                        kept += next_executor_finishes_everything(&devs, round % 2 == 0);
                    }
                    // The drops did start IO that outlived its executor.
                    assert!(kept > 0, "{clock:?} qd {queue_depth} plug {plug_max_count}");
                    drain_and_check_tags(&devs);
                });
            }
        }
    }
}

/// Writes plugged when their executor's `run` returns, their futures
/// dropped, whose buffers' drops plug orphaned writes again, 20
/// generations deep: more than the close's rounds of abandoning. What is
/// left goes when the thread's next executor makes its engine state (or
/// with the thread), and the devices work under that executor.
#[test]
fn orphaned_chains_plugged_at_close_end_under_the_next_executor() {
    watchdog(120, || {
        let options = DeviceOptions {
            plug_max_count: 32,
            ..DeviceOptions::default()
        };
        let devs: Vec<Device> = (0..4)
            .map(|_| Device::with_backend(mem(MemClock::Virtual), None, options.clone()).unwrap())
            .collect();
        for round in 0..3u64 {
            let ex = local();
            ex.run(async {
                let waker = futures::task::noop_waker();
                let mut cx = Context::from_waker(&waker);
                for (i, d) in devs.iter().enumerate() {
                    let buf = IoOnDrop {
                        bytes: vec![i as u8; 4096],
                        dev: Some(d.clone()),
                        off: (round * 64 + i as u64) * 4096,
                        chain: 20,
                        orphan: true,
                    };
                    let mut f = Box::pin(d.write_at(buf, 0));
                    assert!(f.as_mut().poll(&mut cx).is_pending(), "plugged");
                }
            });
            drop(ex);
            next_executor_finishes_everything(&devs, round % 2 == 0);
        }
        drain_and_check_tags(&devs);
    });
}
