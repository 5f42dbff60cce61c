//! Adversarial API misuse: IO issued from a tick hook or a Drop, IO
//! futures moved between threads, devices opened and closed in a loop.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use plugio::device::backend::mem::{MemConfig, MemDevice};
use plugio::{Device, DeviceOptions, DmaBuf, Error, RingConfig, ShutdownMode};

mod common;
use common::{local, watchdog};

fn mem_dev() -> Device {
    let m = MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        ..MemConfig::default()
    });
    Device::with_backend(Arc::new(m), None, DeviceOptions::default()).expect("device")
}

type IoFut = Pin<Box<dyn Future<Output = Result<DmaBuf, Error>>>>;

/// A tick hook that issues (polls) an IO future at the end of a tick.
struct IoHook {
    fut: RefCell<Option<IoFut>>,
    result: RefCell<Option<Result<DmaBuf, Error>>>,
    main: RefCell<Option<Waker>>,
}

impl plugio::executor::TickHook for IoHook {
    fn tick_end(&self) -> bool {
        let Some(waker) = self.main.borrow().clone() else {
            return false;
        };
        let mut slot = self.fut.borrow_mut();
        if let Some(f) = slot.as_mut() {
            let mut cx = Context::from_waker(&waker);
            if let Poll::Ready(r) = f.as_mut().poll(&mut cx) {
                *self.result.borrow_mut() = Some(r);
                *slot = None;
                waker.wake();
            }
        }
        false
    }
}

/// A hook registered after the engine's issues an IO: the bio lands in the
/// plug after the engine's flush of this tick, and the core then parks
/// with it plugged (the executor never parks with IO plugged, says the
/// design).
#[plugio::test(timeout_s = 5)]
async fn io_issued_from_a_tick_hook_completes() {
    let dev = mem_dev();
    // The engine registers its hook on the first IO.
    dev.read_alloc_at(0, 4096).await.expect("first read");
    let hook = Rc::new(IoHook {
        fut: RefCell::new(Some(Box::pin({
            let dev = dev.clone();
            async move { dev.read_alloc_at(4096, 4096).await }
        }))),
        result: RefCell::new(None),
        main: RefCell::new(None),
    });
    plugio::executor::register_tick_hook(hook.clone());
    let r = std::future::poll_fn(|cx| {
        *hook.main.borrow_mut() = Some(cx.waker().clone());
        match hook.result.borrow_mut().take() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    })
    .await;
    assert_eq!(r.expect("read from a hook").len(), 4096);
    let h: Rc<dyn plugio::executor::TickHook> = hook;
    plugio::executor::unregister_tick_hook(&h);
}

/// IO started from a Drop impl: of a task cancelled by abort, and of tasks
/// cancelled by runtime shutdown.
struct IoOnDrop(Device, Rc<RefCell<u32>>);

impl Drop for IoOnDrop {
    fn drop(&mut self) {
        let dev = self.0.clone();
        let count = self.1.clone();
        // Fire-and-forget IO from a destructor, as a buffer pool's page
        // guard might write back a dirty page.
        let mut b = dev.alloc_buf(4096);
        b.as_mut_slice().fill(0xD0);
        plugio::spawn_local(async move {
            dev.write_at(b, 8192).await.0.expect("write from Drop");
            *count.borrow_mut() += 1;
        });
    }
}

#[plugio::test(timeout_s = 10)]
async fn io_spawned_from_drop_of_an_aborted_task_completes() {
    let dev = mem_dev();
    let count = Rc::new(RefCell::new(0));
    let guard = IoOnDrop(dev.clone(), count.clone());
    let d = dev.clone();
    let h = plugio::spawn_local(async move {
        let _g = guard;
        let _ = d.read_alloc_at(0, 4096).await;
        std::future::pending::<()>().await;
    });
    plugio::yield_now().await;
    h.abort();
    let _ = h.await;
    for _ in 0..50 {
        if *count.borrow() == 1 {
            break;
        }
        plugio::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(*count.borrow(), 1, "the write from Drop did not complete");
    let b = dev.read_alloc_at(8192, 4096).await.expect("read");
    assert!(b.as_slice().iter().all(|&x| x == 0xD0));
    assert_eq!(dev.tags_in_use(), 0);
}

struct SendIoOnDrop(Device);

impl Drop for SendIoOnDrop {
    fn drop(&mut self) {
        // Issue an IO and poll it once: it is plugged while the core is
        // shutting down.
        let dev = self.0.clone();
        let mut f = Box::pin(async move { dev.read_alloc_at(0, 4096).await });
        let mut cx = Context::from_waker(Waker::noop());
        let _ = f.as_mut().poll(&mut cx);
        drop(f);
    }
}

#[test]
fn io_from_drop_during_runtime_shutdown_neither_hangs_nor_leaks_tags() {
    watchdog(20, || {
        let dev = mem_dev();
        for mode in [
            ShutdownMode::Cancel,
            ShutdownMode::WaitTimeout(Duration::from_millis(5)),
        ] {
            let rt = plugio::runtime::builder(RingConfig::default())
                .cores(2)
                .build()
                .expect("runtime");
            for core in 0..2 {
                let dev = dev.clone();
                drop(rt.spawn_on(core, async move {
                    let g = SendIoOnDrop(dev.clone());
                    for i in 0..16u64 {
                        let dev = dev.clone();
                        drop(plugio::spawn(async move {
                            let _g = SendIoOnDrop(dev.clone());
                            let _ = dev.read_alloc_at(i * 4096, 4096).await;
                            std::future::pending::<()>().await;
                        }));
                    }
                    let _g = g;
                    std::future::pending::<()>().await;
                }));
            }
            std::thread::sleep(Duration::from_millis(5));
            rt.shutdown(mode).expect("shutdown");
            assert_eq!(dev.tags_in_use(), 0, "{mode:?}");
        }
    });
}

/// An IO future polled once on one core, then sent to another thread and
/// polled there: a clear panic naming the misuse (documented), never a
/// silent wrong result.
#[test]
fn an_io_future_polled_on_another_thread_panics_clearly() {
    watchdog(10, || {
        let dev = mem_dev();
        let ex = local();
        let mut fut = Box::pin(async move { dev.read_alloc_at(0, 4096).await });
        ex.run(async {
            let mut cx = Context::from_waker(Waker::noop());
            assert!(fut.as_mut().poll(&mut cx).is_pending());
        });
        let r = std::thread::spawn(move || {
            let mut f = fut;
            let mut cx = Context::from_waker(Waker::noop());
            let _ = f.as_mut().poll(&mut cx);
        })
        .join();
        let p = r.expect_err("polling on another thread must panic");
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        assert!(msg.contains("another core"), "{msg}");
    });
}

/// This process's descriptors open on `path`.
fn open_fds(path: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("proc")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l == path)
        .count()
}

/// Dropping a device closes its file, even after IO went through a core
/// that keeps running (a database opens and closes many table files): at
/// the end of the tick in which its last handle was dropped.
#[test]
fn dropping_a_device_closes_its_file_while_the_core_lives() {
    watchdog(10, || {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
        let path = dir.path().join("closeme");
        std::fs::write(&path, vec![7u8; 1 << 16]).expect("fixture");
        let ex = local();
        let p = path.clone();
        let left = ex.run(async move {
            for _ in 0..50 {
                let dev = Device::open(&p, DeviceOptions::default()).expect("open");
                dev.read_alloc_at(0, 4096).await.expect("read");
                drop(dev);
            }
            plugio::yield_now().await; // one tick end
            open_fds(&p)
        });
        assert_eq!(left, 0, "{left} descriptors of a dropped device still open");
    });
}

/// A device that two cores used closes its file when its last handle is
/// dropped while both cores sit idle: the core that let go of it first
/// had parked before the file's backend was gone, and its ring kept the
/// file registered (open) until it next ran (found by a break-it helper:
/// still open after 20 s). Bounded by the watchdog, not by a time limit.
#[test]
fn a_device_two_idle_cores_used_closes_its_file() {
    watchdog(60, || {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
        let path = dir.path().join("two-cores");
        std::fs::write(&path, vec![7u8; 1 << 16]).expect("fixture");
        let rt = plugio::runtime::builder(RingConfig::default())
            .cores(2)
            .build()
            .expect("runtime");
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        for core in [0, 1] {
            let dev = dev.clone();
            let join = rt.spawn_on(core, async move {
                dev.read_alloc_at(0, 4096).await.expect("read");
            });
            futures::executor::block_on(join).expect("core task");
        }
        assert!(open_fds(&path) > 0, "the device holds its file");
        drop(dev);
        // Nothing else runs on either core from here on.
        while open_fds(&path) > 0 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        rt.shutdown(ShutdownMode::Wait).expect("shutdown");
    });
}

/// A local executor lets go of a device whose last handle was dropped
/// outside its `run`: at its next `run`, even one whose future is ready at
/// once (no tick came, and the file stayed open), and when the executor is
/// dropped (the file stayed open until the thread exited; found by a
/// break-it helper).
#[test]
fn a_local_executor_closes_a_device_dropped_outside_its_run() {
    watchdog(30, || {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
        let path = dir.path().join("local");
        std::fs::write(&path, vec![7u8; 8192]).expect("fixture");
        let ex = local();
        let read_once = |ex: &plugio::LocalExecutor| {
            let dev = Device::open(&path, DeviceOptions::default()).expect("open");
            ex.run(async { dev.read_alloc_at(0, 4096).await.expect("read") });
            assert_eq!(open_fds(&path), 1, "open while a handle lives");
            dev
        };
        drop(read_once(&ex));
        ex.run(async {});
        assert_eq!(open_fds(&path), 0, "closed at the next run");
        drop(read_once(&ex));
        drop(ex);
        assert_eq!(open_fds(&path), 0, "closed with the executor");
        // The executor first, then the device.
        let ex = local();
        let dev = read_once(&ex);
        drop(ex);
        assert_eq!(open_fds(&path), 1, "the handle still holds it");
        drop(dev);
        assert_eq!(open_fds(&path), 0, "closed with its last handle");
    });
}

/// Buffers allocated on a runtime core outlive the runtime and are
/// dropped on the test thread; buffers from the test thread are used and
/// dropped on runtime cores; both directions, many times.
#[test]
fn buffers_crossing_threads_and_outliving_their_runtime() {
    watchdog(20, || {
        let dev = mem_dev();
        let mut kept = Vec::new();
        for round in 0..5 {
            let rt = plugio::runtime::builder(RingConfig::default())
                .cores(2)
                .build()
                .expect("runtime");
            let mine: Vec<DmaBuf> = (0..32).map(|_| DmaBuf::cached(4096)).collect();
            let mut joins = Vec::new();
            for (core, chunk) in mine.chunks(16).map(|c| c.len()).enumerate() {
                let dev = dev.clone();
                let bufs: Vec<DmaBuf> = (0..chunk).map(|_| DmaBuf::cached(4096)).collect();
                joins.push(rt.spawn_on(core, async move {
                    let mut out = Vec::new();
                    for (i, b) in bufs.into_iter().enumerate() {
                        let (r, b) = dev.read_at(b, i as u64 * 4096).await;
                        r.expect("read into a foreign buffer");
                        drop(b);
                        out.push(
                            dev.read_alloc_at(i as u64 * 4096, 4096)
                                .await
                                .expect("read"),
                        );
                    }
                    out
                }));
            }
            for j in joins {
                kept.extend(futures::executor::block_on(j).expect("core task"));
            }
            drop(mine);
            rt.shutdown(ShutdownMode::Wait).expect("shutdown");
            // Half of them dropped now, after their owner core is gone.
            let n = kept.len() / 2;
            kept.truncate(n);
            let fresh: Vec<DmaBuf> = (0..64).map(|_| DmaBuf::cached(4096)).collect();
            assert!(fresh.iter().all(|b| b.len() == 4096), "round {round}");
        }
        // Each kept buffer still holds what was read (zeros on this device).
        for b in &kept {
            assert!(b.as_slice().iter().all(|&x| x == 0));
        }
    });
}

/// Misconfiguration that the engine accepts: a request limit that is a
/// multiple of the logical block but not of the buffer alignment. A write
/// the up-front check accepted is then split into segments at unaligned
/// addresses and fails after submission.
#[plugio::test(timeout_s = 10)]
async fn a_split_never_produces_unaligned_segments() {
    let m = MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        logical_block_bytes: 512,
        mem_align_bytes: 4096,
        ..MemConfig::default()
    });
    let opts = DeviceOptions {
        max_request_bytes: Some(2048),
        ..DeviceOptions::default()
    };
    // Either the options are refused when the device is built...
    let Ok(dev) = Device::with_backend(Arc::new(m), None, opts) else {
        return;
    };
    // ...or the IO they accept works.
    let mut b = dev.alloc_buf(8192);
    b.as_mut_slice().fill(3);
    let (r, _) = dev.write_at(b, 0).await;
    assert_eq!(r.expect("an accepted write"), 8192);
}

/// `Device::open` of a FIFO (read-only or not), a directory or /dev/null
/// is refused at once, naming what the path is: an open of the FIFO would
/// block until a writer came, so the check is a `stat`.
#[test]
fn device_open_refuses_a_fifo_a_directory_and_dev_null_without_blocking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let paths = [
        (fifo, "a FIFO"),
        (dir.path().to_path_buf(), "a directory"),
        ("/dev/null".into(), "a character device"),
    ];
    watchdog(30, move || {
        for (path, what) in paths {
            for read_only in [true, false] {
                let opts = DeviceOptions {
                    read_only,
                    direct: false,
                    ..DeviceOptions::default()
                };
                let e = Device::open(&path, opts).expect_err("refused");
                assert!(
                    matches!(
                        e.kind(),
                        plugio::ErrorKind::InvalidInput(plugio::InvalidInput::PathKind { .. })
                    ),
                    "{}: {e}",
                    path.display()
                );
                assert!(e.to_string().contains(what), "{e}");
            }
        }
    });
}
