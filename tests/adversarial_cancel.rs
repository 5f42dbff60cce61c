//! Adversarial checks of cancellation: IO futures dropped at every point,
//! aborted tasks, runtime shutdown in every mode, executors run one after
//! another, executors without the device driver.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use plugio::device::backend::mem::{Latency, MemClock, MemConfig, MemDevice};
use plugio::{Device, DeviceOptions, ErrorKind, RingConfig, ShutdownMode};

mod common;
use common::{local, watchdog};

fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

fn pattern(off: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((off + i) as u8).wrapping_mul(31).wrapping_add(3))
        .collect()
}

fn file(dir: &tempfile::TempDir, name: &str, len: usize) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, pattern(0, len)).expect("fixture");
    path
}

fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    fut.poll(&mut cx)
}

fn mem(latency: Latency, clock: MemClock) -> MemDevice {
    MemDevice::new(MemConfig {
        capacity_bytes: 4 << 20,
        latency,
        clock,
        seed: 7,
        ..MemConfig::default()
    })
}

fn mem_device(m: &MemDevice, queue_depth: u32) -> Device {
    Device::with_backend(
        Arc::new(m.clone()),
        None,
        DeviceOptions {
            queue_depth,
            ..DeviceOptions::default()
        },
    )
    .expect("device")
}

/// Drops read and write futures at each point of their life (never
/// polled, plugged, waiting for a tag, in flight, completed but not read),
/// then reuses buffers at once: no tag leaks, no stray writes into reused
/// memory, later IO unaffected.
fn drop_everywhere(dev: Device, m: Option<MemDevice>) {
    let ex = local();
    ex.run(async move {
        for round in 0..20u64 {
            let mut futs = Vec::new();
            for i in 0..12u64 {
                let off = (round * 12 + i) % 64 * 4096;
                futs.push(Box::pin(dev.read_alloc_at(off, 4096)));
            }
            // Never polled: dropped at once.
            drop(Box::pin(dev.read_alloc_at(0, 4096)));
            // Polled once (plugged), then dropped before the tick ends.
            for f in futs.iter_mut().take(4) {
                assert!(poll_once(f.as_mut()).is_pending());
            }
            futs.drain(..2);
            // The rest are polled once, then a tick passes (they are in
            // flight or waiting for tags), and some are dropped.
            for f in futs.iter_mut() {
                let _ = poll_once(f.as_mut());
            }
            plugio::yield_now().await;
            futs.truncate(5);
            // Buffers freed right now are reused by fresh IO: whatever the
            // dropped reads still do must not land in them.
            let mut mine = Vec::new();
            for k in 0..8u8 {
                let mut b = dev.alloc_buf(4096);
                b.as_mut_slice().fill(0xA0 + k);
                mine.push(b);
            }
            // Let everything finish: the completed-but-unread futures are
            // then dropped.
            for _ in 0..20 {
                plugio::yield_now().await;
            }
            plugio::sleep(Duration::from_millis(2)).await;
            drop(futs);
            for (k, b) in mine.iter().enumerate() {
                assert!(
                    b.as_slice().iter().all(|&x| x == 0xA0 + k as u8),
                    "round {round}: a dropped read wrote into a reused buffer"
                );
            }
            // Writes dropped in flight still happen, fully.
            let mut w = dev.alloc_buf(8192);
            w.as_mut_slice().fill(round as u8 + 1);
            let mut wf = Box::pin(dev.write_at(w, 1 << 20));
            assert!(poll_once(wf.as_mut()).is_pending());
            plugio::yield_now().await;
            drop(wf);
            // Until the dropped write completes, however loaded the
            // machine (a bound here failed beside CPU hogs); a tag that is
            // never returned hangs, and the test's watchdog reports it.
            while dev.tags_in_use() != 0 {
                plugio::sleep(Duration::from_micros(200)).await;
            }
            let back = dev.read_alloc_at(1 << 20, 8192).await.expect("read back");
            assert!(
                back.as_slice().iter().all(|&x| x == round as u8 + 1),
                "round {round}: a dropped write did not fully happen"
            );
        }
        if let Some(m) = m {
            let _ = m.dirty_blocks();
        }
        assert_eq!(dev.tags_in_use(), 0);
    });
}

#[test]
fn dropping_io_futures_at_every_point_on_a_file() {
    watchdog(60, || {
        let dir = tmpdir();
        let path = file(&dir, "drop", 2 << 20);
        let dev = Device::open(
            &path,
            DeviceOptions {
                queue_depth: 4,
                ..DeviceOptions::default()
            },
        )
        .expect("open");
        drop_everywhere(dev, None);
    });
}

#[test]
fn dropping_io_futures_at_every_point_on_the_mem_device() {
    watchdog(60, || {
        let m = mem(
            Latency::Uniform {
                min: Duration::from_micros(10),
                max: Duration::from_micros(300),
            },
            MemClock::Real,
        );
        let dev = mem_device(&m, 3);
        drop_everywhere(dev, Some(m));
    });
}

/// Tasks with IO in flight and waiting for tags, aborted from another
/// task; then the device must be fully usable and every tag back.
#[test]
fn aborting_tasks_with_io_in_flight_on_two_cores() {
    watchdog(60, || {
        let dir = tmpdir();
        let path = file(&dir, "abort", 1 << 20);
        let dev = Device::open(
            &path,
            DeviceOptions {
                queue_depth: 2,
                ..DeviceOptions::default()
            },
        )
        .expect("open");
        let rt = plugio::runtime::builder(RingConfig::default())
            .cores(2)
            .build()
            .expect("runtime");
        let mut joins = Vec::new();
        for core in 0..2 {
            let dev = dev.clone();
            joins.push(rt.spawn_on(core, async move {
                for round in 0..30u64 {
                    let handles: Vec<_> = (0..16u64)
                        .map(|i| {
                            let dev = dev.clone();
                            plugio::spawn(async move {
                                let off = (i * 4096 + round * 8192) % (1 << 20);
                                let b = dev.read_alloc_at(off, 4096).await.expect("read");
                                assert_eq!(b.as_slice(), &pattern(off, 4096)[..]);
                            })
                        })
                        .collect();
                    plugio::yield_now().await;
                    for (i, h) in handles.iter().enumerate() {
                        if i % 3 != 0 {
                            h.abort();
                        }
                    }
                    for h in handles {
                        let _ = h.await;
                    }
                }
                let b = dev.read_alloc_at(0, 4096).await.expect("read after aborts");
                assert_eq!(b.as_slice(), &pattern(0, 4096)[..]);
            }));
        }
        for j in joins {
            futures::executor::block_on(j).expect("core task");
        }
        rt.shutdown(ShutdownMode::Wait).expect("shutdown");
        assert_eq!(dev.tags_in_use(), 0);
    });
}

/// Shutdown with IO plugged, waiting for tags and in flight, in each mode.
fn shutdown_with(mode: ShutdownMode, dev: Device) {
    let rt = plugio::runtime::builder(RingConfig::default())
        .cores(2)
        .build()
        .expect("runtime");
    for core in 0..2 {
        let dev = dev.clone();
        drop(rt.spawn_on(core, async move {
            for i in 0..64u64 {
                let dev = dev.clone();
                drop(plugio::spawn(async move {
                    let _ = dev.read_alloc_at((i % 32) * 4096, 4096).await;
                }));
            }
            let mut f = pin!(dev.read_alloc_at(0, 4096));
            let _ = poll_once(f.as_mut());
            // Stays plugged: this task never yields again before shutdown
            // cancels or waits it out.
            plugio::sleep(Duration::from_millis(50)).await;
        }));
    }
    std::thread::sleep(Duration::from_millis(1));
    rt.shutdown(mode).expect("shutdown");
    assert_eq!(dev.tags_in_use(), 0, "{mode:?}: tags left in use");
}

#[test]
fn shutdown_in_every_mode_with_io_everywhere_on_a_file() {
    watchdog(30, || {
        let dir = tmpdir();
        let path = file(&dir, "shut", 1 << 20);
        let dev = Device::open(
            &path,
            DeviceOptions {
                queue_depth: 2,
                ..DeviceOptions::default()
            },
        )
        .expect("open");
        for mode in [
            ShutdownMode::Cancel,
            ShutdownMode::Wait,
            ShutdownMode::WaitTimeout(Duration::from_millis(1)),
            ShutdownMode::WaitTimeout(Duration::from_secs(5)),
        ] {
            for _ in 0..3 {
                shutdown_with(mode, dev.clone());
            }
        }
    });
}

#[test]
fn shutdown_in_every_mode_with_io_everywhere_on_the_mem_device() {
    watchdog(30, || {
        let m = mem(Latency::Fixed(Duration::from_millis(2)), MemClock::Real);
        let dev = mem_device(&m, 2);
        for mode in [
            ShutdownMode::Cancel,
            ShutdownMode::Wait,
            ShutdownMode::WaitTimeout(Duration::from_millis(1)),
        ] {
            for _ in 0..2 {
                shutdown_with(mode, dev.clone());
            }
        }
    });
}

/// One executor after another on the same thread, each leaving IO in
/// flight and waiting for tags when it is dropped; the device is shared.
#[test]
fn executors_one_after_another_leave_no_tags_behind() {
    watchdog(60, || {
        let m = mem(Latency::Fixed(Duration::from_millis(1)), MemClock::Real);
        let dev = mem_device(&m, 1);
        for round in 0..10u64 {
            let ex = local();
            let d = dev.clone();
            ex.run(async move {
                for i in 0..8u64 {
                    let d = d.clone();
                    drop(plugio::spawn_local(async move {
                        let mut b = d.alloc_buf(4096);
                        b.as_mut_slice().fill(round as u8);
                        let _ = d.write_at(b, i * 4096).await;
                    }));
                }
                plugio::yield_now().await;
            });
            drop(ex);
            assert_eq!(dev.tags_in_use(), 0, "round {round}: tags leaked");
        }
        // The device still works at queue depth 1 on a fresh executor.
        let ex = local();
        ex.run(async move {
            let b = dev.read_alloc_at(0, 4096).await.expect("read");
            assert_eq!(b.len(), 4096);
        });
    });
}

/// A LocalExecutor whose run() returned with IO still in flight: the next
/// run() of the same executor picks it up.
#[test]
fn io_left_in_flight_between_two_runs_of_one_executor_completes() {
    watchdog(60, || {
        let dir = tmpdir();
        let path = file(&dir, "runs", 1 << 20);
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        let ex = local();
        let handles: Vec<_> = ex.run({
            let dev = dev.clone();
            async move {
                let hs: Vec<_> = (0..32u64)
                    .map(|i| {
                        let dev = dev.clone();
                        plugio::spawn_local(async move {
                            let b = dev.read_alloc_at(i * 4096, 4096).await.expect("read");
                            assert_eq!(b.as_slice(), &pattern(i * 4096, 4096)[..]);
                        })
                    })
                    .collect();
                plugio::yield_now().await;
                hs
            }
        });
        ex.run(async move {
            for h in handles {
                h.await.expect("task");
            }
        });
        assert_eq!(dev.tags_in_use(), 0);
    });
}

/// An executor built without the device driver (plugio::LocalExecutor::new,
/// plugio::Runtime::builder()) is still a "plugio runtime" to the engine:
/// IO on the mem device is queued on a deadline heap nobody runs.
/// Expected: a typed NoDriver error (or the IO completes); observed: a hang.
#[test]
fn mem_io_on_an_executor_without_the_device_driver_does_not_hang() {
    watchdog(5, || {
        let m = mem(Latency::Zero, MemClock::Virtual);
        let dev = mem_device(&m, 4);
        let ex = plugio::LocalExecutor::new();
        let r = ex.run(async move { dev.read_alloc_at(0, 4096).await });
        match r {
            Ok(b) => assert_eq!(b.len(), 4096),
            Err(e) => assert!(matches!(e.kind(), ErrorKind::NoDriver), "{e}"),
        }
    });
}

#[test]
fn mem_io_on_a_plain_runtime_does_not_hang() {
    watchdog(5, || {
        let m = mem(Latency::Zero, MemClock::Virtual);
        let dev = mem_device(&m, 4);
        let rt = plugio::Runtime::builder().cores(1).build().expect("rt");
        let r = rt.block_on(async move { dev.read_alloc_at(0, 4096).await });
        match r {
            Ok(b) => assert_eq!(b.len(), 4096),
            Err(e) => assert!(matches!(e.kind(), ErrorKind::NoDriver), "{e}"),
        }
        rt.shutdown(ShutdownMode::Cancel).expect("shutdown");
    });
}

/// File IO on an executor without the device driver goes to the sync
/// pool and completes.
#[test]
fn file_io_on_an_executor_without_the_device_driver_completes_or_fails_typed() {
    watchdog(10, || {
        let dir = tmpdir();
        let path = file(&dir, "plain", 1 << 16);
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        let ex = plugio::LocalExecutor::new();
        let r = ex.run(async move { dev.read_alloc_at(4096, 4096).await });
        match r {
            Ok(b) => assert_eq!(b.as_slice(), &pattern(4096, 4096)[..]),
            Err(e) => assert!(matches!(e.kind(), ErrorKind::NoDriver), "{e}"),
        }
    });
}

/// Two executors alive on one thread: A (with the device driver) leaves a
/// read in flight; B (a plain executor) tries the engine. Once, that
/// replaced the thread's engine state and so dropped A's bio table,
/// buffers of in-flight reads included, and A's read landed in freed
/// memory that a new buffer already reused; later, B's state ended A's
/// IO. Now B is refused (`NoDriver`: the thread's driver serves A) and
/// A's read is untouched.
#[test]
fn a_second_executor_on_the_thread_does_not_free_in_flight_buffers() {
    watchdog(10, || {
        let m = mem(Latency::Fixed(Duration::from_millis(20)), MemClock::Real);
        let dev = mem_device(&m, 4);
        // Non-zero device contents, so a stray read is visible.
        let a = local();
        a.run({
            let dev = dev.clone();
            async move {
                let mut b = dev.alloc_buf(4096);
                b.as_mut_slice().fill(0x11);
                dev.write_at(b, 0).await.0.expect("write");
            }
        });
        let reader = a.spawn_local({
            let dev = dev.clone();
            async move { dev.read_alloc_at(0, 4096).await }
        });
        a.run(async {
            plugio::yield_now().await;
            plugio::yield_now().await;
        });
        let b = plugio::LocalExecutor::new();
        b.run({
            let dev = dev.clone();
            async move {
                // B has no DeviceDriver of its own (A's is the thread's):
                // it is refused before it touches the engine.
                let err = dev.plug(1).expect_err("no driver for B");
                assert_eq!(*err.kind(), ErrorKind::NoDriver, "{err}");
            }
        });
        // Memory freed by the swap is handed out again.
        let mut mine: Vec<plugio::DmaBuf> = (0..16).map(|_| plugio::DmaBuf::cached(4096)).collect();
        for x in &mut mine {
            x.as_mut_slice().fill(0x55);
        }
        let (corrupted, r) = a.run(async move {
            plugio::sleep(Duration::from_millis(60)).await;
            let corrupted = mine.iter().any(|x| x.as_slice().iter().any(|&v| v != 0x55));
            (
                corrupted,
                plugio::timeout(Duration::from_secs(1), reader).await,
            )
        });
        assert!(
            !corrupted,
            "an in-flight read of the first executor wrote into a reused buffer"
        );
        let r = r.expect("the first executor's read never completed (hang)");
        let r = r.expect("reader task must not panic");
        assert_eq!(r.expect("read").as_slice()[0], 0x11);
    });
}

/// Timeouts that expire while reads are in flight (a common database
/// pattern): futures dropped in flight, buffers reused, tags back.
#[plugio::test(timeout_s = 60)]
async fn timeouts_expiring_on_in_flight_reads() {
    let m = mem(
        Latency::Uniform {
            min: Duration::from_micros(100),
            max: Duration::from_millis(3),
        },
        MemClock::Real,
    );
    let dev = mem_device(&m, 4);
    let mut expired = 0;
    for round in 0..10u64 {
        let hs: Vec<_> = (0..16u64)
            .map(|i| {
                let dev = dev.clone();
                plugio::spawn_local(async move {
                    plugio::timeout(
                        Duration::from_micros(500 + i * 100),
                        dev.read_alloc_at((i + round) * 4096, 4096),
                    )
                    .await
                    .is_err()
                })
            })
            .collect();
        for h in hs {
            expired += usize::from(h.await.expect("task"));
        }
    }
    assert!(expired > 0, "no timeout expired: the test proves nothing");
    for _ in 0..100 {
        if dev.tags_in_use() == 0 {
            break;
        }
        plugio::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(dev.tags_in_use(), 0);
    dev.read_alloc_at(0, 4096).await.expect("still works");
}

/// JoinHandle::abort called from a thread outside the runtime on tasks
/// with IO in flight on its cores.
#[test]
fn abort_from_outside_the_runtime_with_io_in_flight() {
    watchdog(60, || {
        let m = mem(Latency::Fixed(Duration::from_micros(300)), MemClock::Real);
        let dev = mem_device(&m, 2);
        let rt = plugio::runtime::builder(RingConfig::default())
            .cores(2)
            .build()
            .expect("runtime");
        for round in 0..20u64 {
            let hs: Vec<_> = (0..16u64)
                .map(|i| {
                    let dev = dev.clone();
                    rt.spawn_on((i % 2) as usize, async move {
                        loop {
                            let _ = dev.read_alloc_at((i + round) % 64 * 4096, 4096).await;
                        }
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(1));
            for h in &hs {
                h.abort();
            }
            for h in hs {
                let e = futures::executor::block_on(h).expect_err("aborted");
                assert!(e.is_cancelled());
            }
        }
        rt.shutdown(ShutdownMode::Wait).expect("shutdown");
        assert_eq!(dev.tags_in_use(), 0);
    });
}

#[test]
fn dropping_io_futures_at_every_point_on_the_sync_backend() {
    watchdog(60, || {
        let dir = tmpdir();
        let path = file(&dir, "drop_sync", 2 << 20);
        let dev = Device::open(
            &path,
            DeviceOptions {
                queue_depth: 3,
                backend: plugio::device::BackendKind::Sync,
                ..DeviceOptions::default()
            },
        )
        .expect("open");
        drop_everywhere(dev, None);
    });
}

/// Tasks holding explicit plug guards, with requests waiting for tags at
/// queue depth 1, cancelled by shutdown: the guards' drop flushes during
/// the core's close.
#[test]
fn shutdown_cancels_tasks_holding_plug_guards_with_requests_waiting_for_tags() {
    watchdog(60, || {
        let m = mem(Latency::Fixed(Duration::from_millis(1)), MemClock::Real);
        let dev = mem_device(&m, 1);
        for mode in [
            ShutdownMode::Cancel,
            ShutdownMode::WaitTimeout(Duration::from_millis(3)),
        ] {
            let rt = plugio::runtime::builder(RingConfig::default())
                .cores(2)
                .build()
                .expect("runtime");
            for core in 0..2 {
                let dev = dev.clone();
                drop(rt.spawn_on(core, async move {
                    for t in 0..8u64 {
                        let dev = dev.clone();
                        drop(plugio::spawn_local(async move {
                            let _g = dev.plug(64).expect("plug");
                            let hs: Vec<_> = (0..8u64)
                                .map(|i| {
                                    let dev = dev.clone();
                                    plugio::spawn_local(async move {
                                        let _ = dev.read_alloc_at((t * 8 + i) * 4096, 4096).await;
                                    })
                                })
                                .collect();
                            plugio::yield_now().await;
                            for h in hs {
                                let _ = h.await;
                            }
                            std::future::pending::<()>().await;
                        }));
                    }
                    std::future::pending::<()>().await;
                }));
            }
            std::thread::sleep(Duration::from_millis(2));
            rt.shutdown(mode).expect("shutdown");
            assert_eq!(dev.tags_in_use(), 0, "{mode:?}");
        }
    });
}

/// A caller's buffer whose `Drop` uses the device: takes a plug, issues
/// an IO and polls it, or spawns a task that reads (modes 0 to 2); or
/// only counts its drop (3), then panics (4).
struct ReentrantBuf {
    buf: plugio::DmaBuf,
    dev: Device,
    mode: u8,
    drops: Arc<std::sync::atomic::AtomicUsize>,
}

// SAFETY: the memory is the `DmaBuf`'s, which stays put while it lives.
unsafe impl plugio::IoBuf for ReentrantBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.buf.as_slice().as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.buf.len()
    }
    fn bytes_total(&self) -> usize {
        self.buf.len()
    }
}

// SAFETY: as above; `set_init` has nothing to record (a `DmaBuf` is
// initialised whole).
unsafe impl plugio::IoBufMut for ReentrantBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_slice().as_mut_ptr()
    }
    unsafe fn set_init(&mut self, _init_bytes: usize) {}
}

impl Drop for ReentrantBuf {
    fn drop(&mut self) {
        self.drops
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dev = self.dev.clone();
        match self.mode {
            0 => drop(dev.plug(4)),
            3 => {}
            4 => panic!("a buffer's drop panics"),
            1 => {
                let mut read = pin!(dev.read_at(dev.alloc_buf(4096), 4096));
                let _ = poll_once(read.as_mut());
            }
            2 => {
                plugio::spawn_local(async move {
                    let (r, _) = dev.read_at(dev.alloc_buf(4096), 0).await;
                    r.expect("a read spawned from a buffer's drop");
                });
            }
            _ => unreachable!("no such mode"),
        }
    }
}

/// A buffer whose `Drop` takes a plug, issues IO or spawns a task that
/// does, dropped by the completion of the read its future left in flight:
/// the core goes on completing IO (the drop ran inside the completion,
/// with the core's tables borrowed: its panic was caught, but a plug's
/// flush left the core's flush marked as running and no later IO was
/// sent; found by a break-it helper). Every IO ends, every tag comes back.
#[test]
fn a_buffer_whose_drop_uses_the_device_does_not_stop_the_core() {
    watchdog(60, || {
        let dir = tmpdir();
        let path = file(&dir, "reentrant", 2 << 20);
        local().run(async move {
            let dev = Device::open(&path, DeviceOptions::default()).expect("open");
            for mode in 0..3 {
                for i in 0..8u64 {
                    let buf = ReentrantBuf {
                        buf: dev.alloc_buf(65536),
                        dev: dev.clone(),
                        mode,
                        drops: Arc::default(),
                    };
                    let mut read = Box::pin(dev.read_at(buf, i * 65536));
                    let _ = poll_once(read.as_mut());
                    plugio::yield_now().await;
                    // In flight: the buffer is dropped by its completion.
                    drop(read);
                    for _ in 0..2 {
                        let next = dev.read_at(vec![0u8; 4096], i * 4096);
                        let (r, buf) = plugio::timeout(Duration::from_secs(10), next)
                            .await
                            .expect("an IO after the drop completes");
                        assert_eq!(r.expect("read"), 4096, "mode {mode}");
                        assert_eq!(buf, pattern(i * 4096, 4096), "mode {mode}");
                    }
                }
            }
            for _ in 0..100 {
                if dev.iostats().in_flight == 0 && dev.tags_in_use() == 0 {
                    break;
                }
                plugio::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(dev.iostats().in_flight, 0);
            assert_eq!(dev.tags_in_use(), 0);
        });
    });
}

/// Reads issued by the main future's last poll and dropped there (still
/// in the plug when `run` returns, and past the queue depth) free their
/// buffers by the time the executor is dropped, once each; one whose
/// `Drop` panics is contained, also when the thread exits (the buffers
/// sat in the plug or waited for tags until the thread's exit, and a
/// panic there, in a thread-local destructor, aborted the process: found
/// by two break-it helpers).
#[test]
fn reads_dropped_in_the_last_poll_free_their_buffers_with_the_executor() {
    for mode in [3u8, 4] {
        let drops = watchdog(60, move || {
            let dir = tmpdir();
            let path = file(&dir, "last-poll", 1 << 20);
            let drops: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
            let counted = drops.clone();
            let ex = local();
            ex.run(async move {
                let options = DeviceOptions {
                    queue_depth: 2,
                    ..DeviceOptions::default()
                };
                let dev = Device::open(&path, options).expect("open");
                // Apart (not merged): two get tags, six wait for them.
                for i in 0..8 {
                    let buf = ReentrantBuf {
                        buf: dev.alloc_buf(4096),
                        dev: dev.clone(),
                        mode,
                        drops: counted.clone(),
                    };
                    let mut read = pin!(dev.read_at(buf, i * 65536));
                    let _ = poll_once(read.as_mut());
                }
            });
            drop(ex);
            drops.load(std::sync::atomic::Ordering::Relaxed)
        });
        assert_eq!(drops, 8, "mode {mode}");
    }
}

/// A panic that unwinds out of `run` while requests wait for tags behind
/// one in flight: the executor's drop ends them, and the panic reaches
/// the caller (the drain's completion tried to spawn a tag waiter on the
/// closed core, and that second panic aborted the process: found by a
/// break-it helper). The device works afterwards.
#[test]
fn a_panic_out_of_run_with_requests_waiting_for_tags_does_not_abort() {
    watchdog(60, || {
        let dir = tmpdir();
        let path = file(&dir, "panic-waiting", 1 << 20);
        let options = DeviceOptions {
            queue_depth: 1,
            ..DeviceOptions::default()
        };
        let dev = Device::open(&path, options).expect("open");
        let d = dev.clone();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            local().run(async move {
                let mut writes = Vec::new();
                for i in 0..6u64 {
                    let mut w = Box::pin(d.write_at(vec![i as u8; 4096], (i % 2) * 4096));
                    let _ = poll_once(w.as_mut());
                    writes.push(w);
                }
                plugio::yield_now().await;
                panic!("a task's panic with IO waiting");
            })
        }));
        assert!(caught.is_err(), "the panic reaches the caller");
        local().run(async move {
            let (r, _) = dev.write_at(vec![9u8; 4096], 8192).await;
            assert_eq!(r.expect("a write after the panic"), 4096);
            assert_eq!(dev.iostats().in_flight, 0);
            assert_eq!(dev.tags_in_use(), 0);
        });
    });
}
