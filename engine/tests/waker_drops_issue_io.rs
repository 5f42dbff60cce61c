//! A caller's waker is the caller's code when it is dropped, and its drop
//! may issue IO (or drop another pending IO future, as a task handle that
//! owns its future does). The engine drops wakers it holds in four places:
//! when a future is polled again with another waker, when a pending
//! future is dropped (its bio orphaned), when a forked child's future
//! gives up, and when a new executor's engine state ends the plug of a
//! gone one. None of them may hold the core's tables, or `CORES`, then:
//! such IO panicked with "already borrowed" and, a chain deep, aborted
//! the process (found by a break-it helper).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};

use plugio_device::backend::mem::{MemConfig, MemDevice};
use plugio_engine::{Device, DeviceOptions};

mod common;
use common::{local, watchdog};

type Kept = Vec<Pin<Box<dyn Future<Output = Result<(), plugio_device::Error>>>>>;

thread_local! {
    /// The NOP futures the wakers' drops issued and left pending.
    static KEPT: RefCell<Kept> = const { RefCell::new(Vec::new()) };
}

/// A waker whose drop issues a NOP on `dev`, polled with a waker of the
/// same kind `depth - 1` deep (a no-op waker at depth 1), and keeps its
/// future when it is pending.
struct IoWaker {
    dev: Mutex<Option<Device>>,
    depth: u32,
}

impl Wake for IoWaker {
    fn wake(self: Arc<Self>) {}
}

impl Drop for IoWaker {
    fn drop(&mut self) {
        let Some(dev) = self.dev.lock().unwrap().take() else {
            return;
        };
        let waker = if self.depth > 1 {
            io_waker(&dev, self.depth - 1)
        } else {
            futures::task::noop_waker()
        };
        let mut cx = Context::from_waker(&waker);
        let mut f: Pin<Box<dyn Future<Output = _>>> = Box::pin(async move { dev.nop().await });
        if f.as_mut().poll(&mut cx).is_pending() {
            KEPT.with(|k| k.borrow_mut().push(f));
        }
    }
}

fn io_waker(dev: &Device, depth: u32) -> Waker {
    Waker::from(Arc::new(IoWaker {
        dev: Mutex::new(Some(dev.clone())),
        depth,
    }))
}

/// A waker that owns another pending IO future: its last drop drops it.
struct OwningWaker {
    _owned: Mutex<Option<Pin<Box<dyn Future<Output = ()> + Send>>>>,
}

impl Wake for OwningWaker {
    fn wake(self: Arc<Self>) {}
}

fn device() -> Device {
    let opts = DeviceOptions {
        plug_max_count: 32,
        ..DeviceOptions::default()
    };
    Device::with_backend(Arc::new(MemDevice::new(MemConfig::default())), None, opts).unwrap()
}

fn nop_future(dev: &Device) -> Pin<Box<dyn Future<Output = Result<(), plugio_device::Error>>>> {
    let dev = dev.clone();
    Box::pin(async move { dev.nop().await })
}

/// Awaits what the wakers' drops left, on a fresh executor: each ends
/// done or cancelled (its executor gone), and no tag stays taken.
fn finish_kept(dev: &Device) {
    let kept = KEPT.with(|k| std::mem::take(&mut *k.borrow_mut()));
    let ex = local();
    ex.run(async {
        for f in kept {
            if let Err(e) = f.await {
                assert_eq!(e.errno(), libc::ECANCELED, "{e}");
            }
        }
        dev.nop().await.unwrap();
    });
    drop(ex);
    assert_eq!(dev.tags_in_use(), 0);
}

#[test]
fn a_waker_replaced_by_a_second_poll_issues_io() {
    watchdog(30, || {
        let dev = device();
        local().run(async {
            let mut f = nop_future(&dev);
            let w1 = io_waker(&dev, 1);
            assert!(f.as_mut().poll(&mut Context::from_waker(&w1)).is_pending());
            drop(w1);
            let w2 = futures::task::noop_waker();
            assert!(f.as_mut().poll(&mut Context::from_waker(&w2)).is_pending());
            f.await.unwrap();
        });
        finish_kept(&dev);
    });
}

#[test]
fn the_waker_of_a_dropped_pending_future_issues_io() {
    watchdog(30, || {
        let dev = device();
        local().run(async {
            let mut f = nop_future(&dev);
            let w1 = io_waker(&dev, 3);
            assert!(f.as_mut().poll(&mut Context::from_waker(&w1)).is_pending());
            drop(w1);
            drop(f);
            dev.nop().await.unwrap();
        });
        finish_kept(&dev);
    });
}

#[test]
fn a_replaced_waker_drops_a_pending_io_future() {
    watchdog(30, || {
        let dev = device();
        local().run(async {
            let mut read: Pin<Box<dyn Future<Output = ()> + Send>> = {
                let dev = dev.clone();
                Box::pin(async move {
                    let _ = dev.read_at(vec![0u8; 4096], 0).await;
                })
            };
            let noop = futures::task::noop_waker();
            assert!(read
                .as_mut()
                .poll(&mut Context::from_waker(&noop))
                .is_pending());
            let owning = Waker::from(Arc::new(OwningWaker {
                _owned: Mutex::new(Some(read)),
            }));
            let mut f = nop_future(&dev);
            assert!(f
                .as_mut()
                .poll(&mut Context::from_waker(&owning))
                .is_pending());
            drop(owning);
            assert!(f
                .as_mut()
                .poll(&mut Context::from_waker(&noop))
                .is_pending());
            f.await.unwrap();
            dev.nop().await.unwrap();
        });
        finish_kept(&dev);
    });
}

/// The waker of a NOP left plugged as its executor closes, a chain of
/// such wakers 20 deep: the next executor's first IO makes its engine
/// state, which ends the old state's plug and drops those wakers.
#[test]
fn wakers_of_a_gone_executors_plug_issue_io() {
    watchdog(60, || {
        let dev = device();
        let a = local();
        a.run(async {
            let waker = io_waker(&dev, 20);
            let mut f = nop_future(&dev);
            assert!(f
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
            KEPT.with(|k| k.borrow_mut().push(f));
        });
        drop(a);
        let b = local();
        b.run(async { dev.nop().await }).unwrap();
        b.run(async { dev.nop().await }).unwrap();
        drop(b);
        finish_kept(&dev);
    });
}
