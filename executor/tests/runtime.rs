//! Multi-core Runtime: block_on, spawn_on, placement, shutdown, cross-core
//! channels, and the cross-thread lost-wakeup check.

mod common;

use common::{with_watchdog, DropCounter};
use futures::task::AtomicWaker;
use plugio_executor::blocking::BlockingPool;
use plugio_executor::{
    allowed_cpus, channel, core_id, spawn, yield_now, Builder, Handle, JoinError, Placement,
    Runtime, ShutdownMode,
};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

fn runtime(cores: usize) -> Runtime {
    Builder::new().cores(cores).build().expect("build runtime")
}

#[test]
fn block_on_100k_tasks_each_yielding_10_times() {
    with_watchdog(Duration::from_secs(120), || {
        let rt = runtime(1);
        let total = rt.block_on(async {
            let handles: Vec<_> = (0..100_000u64)
                .map(|i| {
                    spawn(async move {
                        for _ in 0..10 {
                            yield_now().await;
                        }
                        i
                    })
                })
                .collect();
            let mut sum = 0;
            for h in handles {
                sum += h.await.expect("join");
            }
            sum
        });
        assert_eq!(total, (0..100_000u64).sum());
        let stats = rt.tick_stats(0).expect("core 0");
        assert!(stats.tasks_polled >= 1_100_000, "{stats:?}");
    });
}

#[test]
fn spawn_on_places_tasks_on_the_named_core_and_names_threads() {
    let rt = Builder::new()
        .cores(3)
        .thread_name("shard")
        .build()
        .expect("build");
    for core in 0..3 {
        let (id, name) = futures::executor::block_on(rt.spawn_on(core, async {
            (core_id(), std::thread::current().name().map(str::to_owned))
        }))
        .expect("join");
        assert_eq!(id, Some(core));
        assert_eq!(name.as_deref(), Some(format!("shard-{core}").as_str()));
    }
    rt.shutdown(ShutdownMode::Cancel).expect("clean shutdown");
}

#[test]
fn cross_core_spawn_from_inside_a_task() {
    let rt = runtime(2);
    let got = rt.block_on(async {
        let handle = Handle::current().expect("runtime handle");
        handle.spawn_on(1, async { core_id() }).await.expect("join")
    });
    assert_eq!(got, Some(1));
}

#[test]
fn block_on_reraises_panics_and_runtime_survives() {
    let rt = runtime(1);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(async { panic!("inside block_on") })
    }));
    assert!(caught.is_err());
    assert_eq!(rt.block_on(async { 5 }), 5);
}

#[test]
fn pinned_placement_pins_each_core_to_its_cpu() {
    let cpus = allowed_cpus().expect("affinity");
    let cores = cpus.len().min(2);
    let rt = Builder::new()
        .cores(cores)
        .placement(Placement::Pinned)
        .build()
        .expect("build");
    for (core, cpu) in cpus.iter().take(cores).enumerate() {
        let mask = futures::executor::block_on(
            rt.spawn_on(core, async { allowed_cpus().expect("affinity in core") }),
        )
        .expect("join");
        assert_eq!(mask, vec![*cpu], "core {core}");
    }
    let explicit = Builder::new()
        .cores(1)
        .placement(Placement::Cpus(vec![cpus[cpus.len() - 1]]))
        .build()
        .expect("build");
    let mask = explicit.block_on(async { allowed_cpus().expect("affinity") });
    assert_eq!(mask, vec![cpus[cpus.len() - 1]]);
    // Unpinned keeps the whole set.
    let free = runtime(1);
    assert_eq!(
        free.block_on(async { allowed_cpus().expect("affinity") }),
        cpus
    );
}

/// A blocking job spawned from a pinned core runs on the CPUs of the
/// thread that built the runtime, not on the core's one CPU (the pool
/// thread inherited it, and took that CPU from the core's IO), for both
/// pools: `spawn_blocking`'s and the sync IO pool.
#[test]
fn blocking_threads_of_a_pinned_core_run_on_the_builders_cpus() {
    let cpus = allowed_cpus().expect("affinity");
    let rt = Builder::new()
        .cores(1)
        .placement(Placement::Cpus(vec![cpus[cpus.len() - 1]]))
        .build()
        .expect("build");
    let (core, blocking, sync_io) = rt.block_on(async {
        let core = allowed_cpus().expect("affinity in core");
        let blocking =
            plugio_executor::blocking::spawn_blocking(|| allowed_cpus().expect("affinity"))
                .await
                .expect("join");
        let (tx, rx) = std::sync::mpsc::channel();
        plugio_executor::blocking::BlockingPool::current_sync_io()
            .expect("a runtime's sync IO pool")
            .execute(move || tx.send(allowed_cpus().expect("affinity")).expect("send"))
            .expect("execute");
        (core, blocking, rx.recv().expect("recv"))
    });
    assert_eq!(core, vec![cpus[cpus.len() - 1]]);
    assert_eq!(blocking, cpus, "spawn_blocking's thread");
    assert_eq!(sync_io, cpus, "the sync IO pool's thread");
}

#[test]
fn bad_placement_and_zero_cores_are_errors() {
    let e = Builder::new().cores(0).build().expect_err("zero cores");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    let e = Builder::new()
        .cores(2)
        .placement(Placement::Cpus(vec![0]))
        .build()
        .expect_err("wrong cpu count");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    // A CPU past the machine's, or the second core's: the message names
    // the core and the CPU (it was a bare EINVAL).
    let allowed = allowed_cpus().expect("affinity");
    for (cpus, core, cpu) in [
        (vec![100_000], 0, 100_000),
        (vec![allowed[0], 99_999], 1, 99_999),
    ] {
        let e = Builder::new()
            .cores(cpus.len())
            .placement(Placement::Cpus(cpus))
            .build()
            .expect_err("no such cpu");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        let says = format!("pins core {core} to CPU {cpu}, which could not be set");
        assert!(e.to_string().contains(&says), "{e}");
    }
    // The kernel judges, not the building thread's own mask: a thread
    // pinned to one CPU builds a runtime whose core runs on another (a
    // check of that mask refused it).
    if allowed.len() >= 2 {
        let (first, last) = (allowed[0], allowed[allowed.len() - 1]);
        let on = std::thread::spawn(move || {
            let mut one = nix::sched::CpuSet::new();
            one.set(first).expect("cpu");
            nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one).expect("pin");
            let rt = Builder::new()
                .cores(1)
                .placement(Placement::Cpus(vec![last]))
                .build()
                .expect("a CPU outside the builder's mask");
            let on = rt.block_on(async { allowed_cpus().expect("affinity") });
            rt.shutdown(ShutdownMode::Cancel).expect("shutdown");
            on
        })
        .join()
        .expect("thread");
        assert_eq!(on, vec![last]);
    }
}

#[test]
fn driver_and_start_hooks_run_on_each_core_thread() {
    let starts = Arc::new(AtomicUsize::new(0));
    let s2 = starts.clone();
    let rt = Builder::new()
        .cores(2)
        .thread_name("hooked")
        .on_thread_start(move |i| {
            assert_eq!(
                std::thread::current().name(),
                Some(format!("hooked-{i}").as_str())
            );
            s2.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .expect("build");
    assert_eq!(starts.load(Ordering::SeqCst), 2);
    drop(rt);
    let err = Builder::new()
        .cores(2)
        .driver(|i| {
            if i == 1 {
                Err(std::io::Error::other("core 1 has no ring"))
            } else {
                Ok(Box::new(plugio_executor::ThreadDriver::new())
                    as Box<dyn plugio_executor::Driver>)
            }
        })
        .build()
        .expect_err("driver failure");
    assert_eq!(err.to_string(), "core 1 has no ring");
}

#[test]
fn shutdown_cancel_drops_pending_tasks() {
    with_watchdog(Duration::from_secs(30), || {
        let rt = runtime(2);
        let drops = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..10)
            .map(|i| {
                let g = DropCounter(drops.clone());
                rt.spawn_on(i % 2, async move {
                    let _g = g;
                    std::future::pending::<()>().await;
                })
            })
            .collect();
        // Let them start.
        rt.block_on(async { yield_now().await });
        rt.shutdown(ShutdownMode::Cancel).expect("clean");
        assert_eq!(drops.load(Ordering::SeqCst), 10);
        for h in handles {
            let r = futures::executor::block_on(h);
            assert!(matches!(r, Err(JoinError::Cancelled)));
        }
    });
}

#[test]
fn shutdown_wait_lets_tasks_finish_and_timeout_cancels_the_rest() {
    with_watchdog(Duration::from_secs(30), || {
        let rt = runtime(2);
        let finished = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let f = finished.clone();
                rt.spawn_on(i % 2, async move {
                    plugio_executor::sleep(Duration::from_millis(20)).await;
                    f.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        rt.shutdown(ShutdownMode::Wait).expect("clean");
        assert_eq!(finished.load(Ordering::SeqCst), 8);
        for h in handles {
            futures::executor::block_on(h).expect("finished");
        }

        let rt = runtime(1);
        let stuck = rt.spawn_on(0, std::future::pending::<()>());
        let quick = rt.spawn_on(0, async { 1 });
        let t0 = Instant::now();
        // Long enough for the core to run `quick` on a busy machine.
        rt.shutdown(ShutdownMode::WaitTimeout(Duration::from_millis(500)))
            .expect("clean");
        assert!(t0.elapsed() >= Duration::from_millis(500));
        assert_eq!(futures::executor::block_on(quick).expect("quick"), 1);
        assert!(futures::executor::block_on(stuck)
            .expect_err("cancelled")
            .is_cancelled());
    });
}

#[test]
fn spawn_through_a_handle_after_shutdown_is_cancelled() {
    let rt = runtime(1);
    let handle = rt.handle().clone();
    drop(rt);
    let drops = Arc::new(AtomicUsize::new(0));
    let g = DropCounter(drops.clone());
    let h = handle.spawn_on(0, async move {
        let _g = g;
    });
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    assert!(futures::executor::block_on(h)
        .expect_err("cancelled")
        .is_cancelled());
}

#[test]
fn cross_core_channel_delivers_in_order_and_closes() {
    with_watchdog(Duration::from_secs(60), || {
        let rt = runtime(2);
        let (tx, mut rx) = channel::bounded::<u64>(64);
        let producer = rt.spawn_on(0, async move {
            for i in 0..100_000 {
                tx.send(i).await.expect("receiver alive");
            }
        });
        let consumer = rt.spawn_on(1, async move {
            let mut next = 0;
            while let Some(v) = rx.recv().await {
                assert_eq!(v, next);
                next += 1;
            }
            next
        });
        futures::executor::block_on(producer).expect("producer");
        assert_eq!(
            futures::executor::block_on(consumer).expect("consumer"),
            100_000
        );
        let s0 = rt.tick_stats(0).expect("stats");
        let s1 = rt.tick_stats(1).expect("stats");
        assert!(s0.remote_wakes + s1.remote_wakes > 0);
    });
}

#[test]
fn channel_send_fails_after_receiver_drops() {
    let rt = runtime(2);
    let (tx, rx) = channel::bounded::<u32>(1);
    let r = rt.block_on(async move {
        tx.send(1).await.expect("room");
        // Full now: this send waits until the receiver (on core 1) drops.
        let waiter = async { tx.send(2).await };
        let dropper = Handle::current()
            .expect("handle")
            .spawn_on(1, async move { drop(rx) });
        let (r, _) = futures::join!(waiter, dropper);
        r
    });
    assert_eq!(r.expect_err("closed").0, 2);
}

/// The lost-wakeup check: one task is woken only by another thread, 10
/// million times. The waker may run at most `WINDOW` wakes ahead of what
/// the task has seen, so any lost wakeup stalls both sides and the
/// watchdog fails the test.
#[test]
fn ten_million_remote_wakes_never_stall() {
    const WAKES: u64 = 10_000_000;
    const WINDOW: u64 = 256;
    with_watchdog(Duration::from_secs(240), || {
        let rt = runtime(1);
        let produced = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(AtomicU64::new(0));
        let slot = Arc::new(AtomicWaker::new());
        let task = {
            let (produced, seen, slot) = (produced.clone(), seen.clone(), slot.clone());
            rt.spawn_on(0, async move {
                let mut polls = 0u64;
                std::future::poll_fn(|cx| {
                    polls += 1;
                    slot.register(cx.waker());
                    // Acquire: pairs with the producer's Release store.
                    let p = produced.load(Ordering::Acquire);
                    // Release: pairs with the producer's Acquire load.
                    seen.store(p, Ordering::Release);
                    if p >= WAKES {
                        Poll::Ready(())
                    } else {
                        Poll::Pending
                    }
                })
                .await;
                polls
            })
        };
        let deadline = Instant::now() + Duration::from_secs(200);
        let mut spins = 0u64;
        for i in 1..=WAKES {
            while i - seen.load(Ordering::Acquire) > WINDOW {
                spins += 1;
                if spins % 4096 == 0 {
                    assert!(Instant::now() < deadline, "stalled at wake {i}");
                    std::thread::yield_now();
                }
                std::hint::spin_loop();
            }
            produced.store(i, Ordering::Release);
            slot.wake();
        }
        let polls = futures::executor::block_on(task).expect("task");
        assert!(polls >= WAKES / WINDOW, "polls {polls}");
        let stats = rt.tick_stats(0).expect("stats");
        // Many polls come from local wakes (AtomicWaker::register wakes
        // directly when it races a wake) and the published figures lag a
        // tick, so only check that the remote path was used.
        assert!(stats.remote_wakes > 0, "{stats:?}");
    });
}

/// Several threads wake tasks on one core at once (MPSC contention on the
/// remote queue); every wake is eventually seen.
#[test]
fn concurrent_remote_wakers_never_stall() {
    const PER_THREAD: u64 = 200_000;
    with_watchdog(Duration::from_secs(120), || {
        let rt = runtime(1);
        let mut tasks = Vec::new();
        let mut wakers = Vec::new();
        for _ in 0..3 {
            let produced = Arc::new(AtomicU64::new(0));
            let seen = Arc::new(AtomicU64::new(0));
            let slot = Arc::new(AtomicWaker::new());
            {
                let (produced, seen, slot) = (produced.clone(), seen.clone(), slot.clone());
                tasks.push(rt.spawn_on(0, async move {
                    std::future::poll_fn(|cx| {
                        slot.register(cx.waker());
                        // Acquire/Release: as in the 10 million test.
                        let p = produced.load(Ordering::Acquire);
                        seen.store(p, Ordering::Release);
                        if p >= PER_THREAD {
                            Poll::Ready(())
                        } else {
                            Poll::Pending
                        }
                    })
                    .await
                }));
            }
            wakers.push(std::thread::spawn(move || {
                for i in 1..=PER_THREAD {
                    while i - seen.load(Ordering::Acquire) > 64 {
                        std::thread::yield_now();
                    }
                    produced.store(i, Ordering::Release);
                    slot.wake();
                }
            }));
        }
        for w in wakers {
            w.join().expect("waker thread");
        }
        for t in tasks {
            futures::executor::block_on(t).expect("task");
        }
    });
}

/// Names of this process's threads that start with `prefix`.
fn threads_named(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim_end().to_owned())
        .filter(|c| c.starts_with(prefix))
        .collect()
}

/// The last handle of a runtime, dropped in a task on one of its own
/// cores, stops the runtime without waiting for its own thread: the drop
/// returns, the task goes on, and every core's thread ends. The drop
/// panicked with std's "failed to join thread: Resource deadlock
/// avoided", leaving the stop half done.
#[test]
fn dropping_the_last_handle_on_its_own_core_stops_the_runtime() {
    with_watchdog(Duration::from_secs(60), || {
        let rt = Runtime::builder()
            .cores(2)
            .thread_name("selfdrop")
            .build()
            .expect("runtime");
        assert_eq!(threads_named("selfdrop-").len(), 2);
        let handle = rt.handle().clone();
        let slot = Arc::new(std::sync::Mutex::new(Some(rt)));
        let (tx, rx) = std::sync::mpsc::channel();
        drop(handle.spawn_on(1, {
            let slot = slot.clone();
            async move {
                let rt = slot.lock().expect("slot").take();
                drop(rt);
                tx.send("the drop returned").expect("send");
            }
        }));
        drop(slot);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(20)),
            Ok("the drop returned")
        );
        let start = Instant::now();
        while !threads_named("selfdrop-").is_empty() {
            assert!(start.elapsed() < Duration::from_secs(20), "the cores end");
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// `shutdown(Wait)` called in a task on one of the runtime's own cores
/// lets every task finish, the caller included: the drop that follows the
/// call sent a cancel over the wait, and every task was cancelled.
#[test]
fn shutdown_wait_on_its_own_core_lets_every_task_finish() {
    with_watchdog(Duration::from_secs(60), || {
        let rt = Runtime::builder()
            .cores(2)
            .thread_name("selfwait")
            .build()
            .expect("runtime");
        let (tx, rx) = std::sync::mpsc::channel();
        for core in 0..2 {
            let tx = tx.clone();
            drop(rt.spawn_on(core, async move {
                plugio_executor::sleep(Duration::from_millis(200)).await;
                tx.send("a task").expect("send");
            }));
        }
        let handle = rt.handle().clone();
        let slot = Arc::new(std::sync::Mutex::new(Some(rt)));
        drop(handle.spawn_on(1, {
            let (slot, tx) = (slot.clone(), tx.clone());
            async move {
                let rt = slot.lock().expect("slot").take().expect("runtime");
                rt.shutdown(ShutdownMode::Wait).expect("shutdown");
                plugio_executor::sleep(Duration::from_millis(10)).await;
                tx.send("the caller").expect("send");
            }
        }));
        drop((slot, tx));
        // Ends when every sender is gone: sent, or dropped with a
        // cancelled task.
        let got: Vec<&str> = rx.iter().collect();
        assert_eq!(got.iter().filter(|m| **m == "a task").count(), 2, "{got:?}");
        assert!(got.contains(&"the caller"), "{got:?}");
        let start = Instant::now();
        while !threads_named("selfwait-").is_empty() {
            assert!(start.elapsed() < Duration::from_secs(20), "the cores end");
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// `shutdown(Wait)` called in a detached job of one of the runtime's pools
/// (`spawn_blocking`'s, the sync-IO pool) returns, and the cores end: a
/// draining core waited for that job, which waited in the call for the
/// core, forever (found by break-it helpers).
#[test]
fn shutdown_wait_in_its_own_pool_jobs_returns() {
    for sync_io in [false, true] {
        with_watchdog(Duration::from_secs(60), move || {
            let rt = Runtime::builder()
                .cores(2)
                .thread_name("blockwait")
                .build()
                .expect("runtime");
            let handle = rt.handle().clone();
            let (tx, rx) = std::sync::mpsc::channel();
            drop(handle.spawn_on(0, async move {
                let job = move || {
                    tx.send(rt.shutdown(ShutdownMode::Wait).is_ok())
                        .expect("send");
                };
                if sync_io {
                    let pool = BlockingPool::current_sync_io().expect("sync-IO pool");
                    pool.execute(job).expect("queued");
                } else {
                    drop(plugio_executor::spawn_blocking(job));
                }
            }));
            assert_eq!(
                rx.recv(),
                Ok(true),
                "sync_io {sync_io}: the call returns Ok"
            );
            let start = Instant::now();
            while !threads_named("blockwait-").is_empty() {
                assert!(start.elapsed() < Duration::from_secs(20), "the cores end");
                std::thread::sleep(Duration::from_millis(10));
            }
        });
    }
}

/// A runtime built before `fork()`, used in the child: `block_on` and
/// `spawn_on` panic saying to build a new runtime (before, they waited
/// forever for core threads the child does not have), and dropping it
/// neither hangs nor panics (before, joining the parent's threads panicked
/// in std); the parent's runtime is unaffected. Found by a break-it helper.
#[test]
fn a_runtime_built_before_fork_refuses_work_in_the_child_and_drops_quietly() {
    with_watchdog(Duration::from_secs(60), || {
        let rt = runtime(2);
        assert_eq!(rt.block_on(async { 1 }), 1);
        // SAFETY: the child only runs the checks below and ends in _exit.
        let pid = unsafe { nix::libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: a plain syscall (kills a hung child).
            unsafe { nix::libc::alarm(30) };
            let refused = |r: std::thread::Result<()>| {
                r.err()
                    .and_then(|p| p.downcast_ref::<String>().cloned())
                    .is_some_and(|m| m.contains("built before fork()"))
            };
            let block_on = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                rt.block_on(async { 2 });
            }));
            let spawn_on = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                drop(rt.handle().spawn_on(1, async { 3 }));
            }));
            let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(rt)));
            let code = match (refused(block_on), refused(spawn_on), dropped.is_ok()) {
                (true, true, true) => 0,
                (false, _, _) => 1,
                (_, false, _) => 2,
                (_, _, false) => 3,
            };
            // SAFETY: ends the child at once (no destructors, no atexit).
            unsafe { nix::libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { nix::libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            nix::libc::WIFEXITED(status) && nix::libc::WEXITSTATUS(status) == 0,
            "child: status {status:#x} (exit 1: block_on, 2: spawn_on not refused, \
             3: drop panicked; signalled: hung)"
        );
        assert_eq!(rt.block_on(async { 4 }), 4);
        rt.shutdown(ShutdownMode::Wait).expect("parent's shutdown");
    });
}

/// A fork from inside a task of a 2-core runtime that used
/// `spawn_blocking`: in the child the forking core lives on, so
/// `spawn_blocking` starts the child's own pool thread (before, the job
/// waited forever for the parent's idle thread), and spawning on that
/// core works while spawning on the other core panics (before, the panic
/// also refused the live core). Found by a break-it helper.
#[test]
fn a_child_forked_from_a_task_keeps_its_core_and_blocking_pool() {
    with_watchdog(Duration::from_secs(60), || {
        let rt = runtime(2);
        let status = rt.block_on(async {
            assert_eq!(
                plugio_executor::spawn_blocking(|| 1).await.expect("join"),
                1
            );
            // Time for the pool thread to go idle, the case that hung (on
            // a slow machine it may not have yet: then the child starts a
            // thread anyway, and the test passes without showing it).
            plugio_executor::sleep(Duration::from_millis(100)).await;
            // SAFETY: the child only runs the checks below and ends in _exit.
            let pid = unsafe { nix::libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                // SAFETY: a plain syscall (kills a hung child).
                unsafe { nix::libc::alarm(30) };
                let blocking = plugio_executor::timeout(
                    Duration::from_secs(10),
                    plugio_executor::spawn_blocking(|| 9),
                )
                .await;
                let handle = Handle::current().expect("on a core");
                let me = core_id().expect("on a core");
                let own = plugio_executor::timeout(
                    Duration::from_secs(10),
                    handle.spawn_on(me, async { 3 }),
                )
                .await;
                let other = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    drop(handle.spawn_on(1 - me, async { 4 }));
                }));
                let code = match (blocking, own, other.is_err()) {
                    (Ok(Ok(9)), Ok(Ok(3)), true) => 0,
                    (b, _, _) if !matches!(b, Ok(Ok(9))) => 1,
                    (_, o, _) if !matches!(o, Ok(Ok(3))) => 2,
                    _ => 3,
                };
                // SAFETY: ends the child at once (no destructors, no atexit).
                unsafe { nix::libc::_exit(code) };
            }
            let mut status = 0;
            // SAFETY: waits for our own child (blocks this core briefly).
            assert_eq!(unsafe { nix::libc::waitpid(pid, &mut status, 0) }, pid);
            status
        });
        assert!(
            nix::libc::WIFEXITED(status) && nix::libc::WEXITSTATUS(status) == 0,
            "child: status {status:#x} (exit 1: spawn_blocking hung or failed, 2: spawn_on \
             its own core failed, 3: spawn_on the other core was not refused; signalled: hung)"
        );
        assert_eq!(rt.block_on(async { 5 }), 5);
        rt.shutdown(ShutdownMode::Wait).expect("parent's shutdown");
    });
}

/// A pool whose one thread is busy at the fork, with a job queued behind
/// it: in the child the queued job (the parent's work) is dropped, never
/// run (before, the child's first thread ran it: its side effects twice),
/// and the child's own job runs on the child's own thread.
#[test]
fn a_job_queued_at_the_fork_does_not_run_in_the_child() {
    use std::sync::atomic::AtomicBool;
    static RAN: AtomicBool = AtomicBool::new(false);
    static DROPPED: AtomicBool = AtomicBool::new(false);
    struct Dropped;
    impl Drop for Dropped {
        fn drop(&mut self) {
            DROPPED.store(true, Ordering::SeqCst);
        }
    }
    with_watchdog(Duration::from_secs(60), || {
        let pool = BlockingPool::new("fork-queued", 1);
        let (started_tx, started) = std::sync::mpsc::channel();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        pool.execute(move || {
            started_tx.send(()).unwrap();
            wait.recv().unwrap();
        })
        .expect("busy job");
        started.recv().unwrap();
        let marker = Dropped;
        pool.execute(move || {
            let _marker = marker;
            RAN.store(true, Ordering::SeqCst);
        })
        .expect("queued job");
        assert_eq!(pool.queued(), 1);
        // SAFETY: the child only runs the checks below and ends in _exit.
        let pid = unsafe { nix::libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: a plain syscall (kills a hung child).
            unsafe { nix::libc::alarm(30) };
            let (tx, rx) = std::sync::mpsc::channel();
            let own = pool.execute(move || tx.send(7).unwrap());
            let got = rx.recv_timeout(Duration::from_secs(10));
            let code = match (own.is_ok() && got == Ok(7), RAN.load(Ordering::SeqCst)) {
                (true, false) if DROPPED.load(Ordering::SeqCst) && pool.queued() == 0 => 0,
                (false, _) => 1,
                (_, true) => 2,
                _ => 3,
            };
            // SAFETY: ends the child at once (no destructors, no atexit).
            unsafe { nix::libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { nix::libc::waitpid(pid, &mut status, 0) }, pid);
        release.send(()).unwrap();
        assert!(
            nix::libc::WIFEXITED(status) && nix::libc::WEXITSTATUS(status) == 0,
            "child: status {status:#x} (exit 1: its own job did not run, 2: the parent's \
             queued job ran in the child, 3: it was not dropped; signalled: hung)"
        );
        // The parent runs its queued job once its thread frees.
        while !RAN.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        pool.shutdown();
    });
}

/// A pool job that forks: in the child, the thread that ran it (the
/// child's only thread) leaves the pool when the job returns, and the
/// child's pool starts its own thread for the next job (before, that
/// thread counted itself idle in the child's empty state and, at its
/// keep-alive, took one off a thread count of 0: in release builds the
/// count wrapped and no job ever ran again; found by a break-it helper).
#[test]
fn a_pool_job_that_forks_leaves_the_childs_pool_working() {
    with_watchdog(Duration::from_secs(60), || {
        let pool = BlockingPool::with_keep_alive("fork-in-job", 2, Duration::from_millis(50));
        let (pid_tx, pid_rx) = std::sync::mpsc::channel();
        let in_child = pool.clone();
        pool.execute(move || {
            // SAFETY: the child starts one checker thread, returns from
            // this job (back into the pool's loop) and ends in _exit.
            let pid = unsafe { nix::libc::fork() };
            if pid != 0 {
                pid_tx.send(pid).unwrap();
                return;
            }
            // SAFETY: a plain syscall (kills a hung child).
            unsafe { nix::libc::alarm(30) };
            std::thread::spawn(move || {
                // Past the keep-alive of the thread that forked.
                std::thread::sleep(Duration::from_millis(300));
                let counted = in_child.threads();
                let (tx, rx) = std::sync::mpsc::channel();
                let sent = in_child.execute(move || tx.send(()).unwrap());
                let ran = rx.recv_timeout(Duration::from_secs(10)).is_ok();
                let code = match (counted, sent.is_ok() && ran) {
                    (0, true) => 0,
                    (_, true) => 1,
                    _ => 2,
                };
                // SAFETY: ends the child at once (no destructors, no atexit).
                unsafe { nix::libc::_exit(code) };
            });
        })
        .expect("the forking job");
        let pid = pid_rx.recv().unwrap();
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { nix::libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            nix::libc::WIFEXITED(status) && nix::libc::WEXITSTATUS(status) == 0,
            "child: status {status:#x} (exit 1: the child's pool counted a thread it does \
             not have, 2: its job never ran; signalled: hung)"
        );
        pool.shutdown();
    });
}

/// Whether the calling thread blocks SIGXFSZ.
fn blocks_sigxfsz() -> bool {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
    let mut mask = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, None, Some(&mut mask)).expect("read the mask");
    mask.contains(Signal::SIGXFSZ)
}

/// The threads plugio starts block SIGXFSZ (a write past a file size
/// limit lowered after plugio read it fails with EFBIG there instead of
/// ending the process); the caller's own thread keeps its mask.
#[test]
fn core_and_blocking_threads_block_the_file_size_signal() {
    let rt = runtime(2);
    for core in 0..2 {
        let (on_core, in_pool) = futures::executor::block_on(rt.spawn_on(core, async {
            let in_pool = plugio_executor::spawn_blocking(blocks_sigxfsz).await;
            (blocks_sigxfsz(), in_pool)
        }))
        .expect("join");
        assert!(on_core, "core {core} thread");
        assert!(
            in_pool.expect("pool job"),
            "core {core}'s blocking pool thread"
        );
    }
    rt.shutdown(ShutdownMode::Cancel).expect("clean shutdown");
    assert!(!blocks_sigxfsz(), "the test's own thread keeps its mask");
}

/// Another thread sees the tick that polled a task on a core that then
/// went idle (the copy was published only after the next park ended,
/// never for an idle core: found by an API audit helper).
#[test]
fn tick_stats_show_the_last_tick_of_an_idle_core() {
    let rt = runtime(2);
    for n in 1..=3u64 {
        let out = futures::executor::block_on(rt.spawn_on(1, async { 5 })).expect("join");
        assert_eq!(out, 5);
        // Bounded wait for the core to publish (it does before it parks);
        // no timing is asserted.
        let deadline = Instant::now() + Duration::from_secs(20);
        let polled = loop {
            let polled = rt.tick_stats(1).expect("core 1").tasks_polled;
            if polled >= n || Instant::now() > deadline {
                break polled;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(
            polled >= n,
            "core 1 polled {n} tasks, its stats say {polled}"
        );
    }
}
