//! Executor safety: deadlines that saturate (`Duration::MAX` never panics,
//! it never fires) and cores that survive task outputs and panic payloads
//! whose `Drop` panics (issue 13, "Executor and device safety").

mod common;

use common::with_watchdog;
use futures::channel::oneshot;
use futures::future::{select, Either};
use plugio_executor::{
    interval, sleep, spawn_local, timeout, yield_now, Builder, LocalExecutor, Runtime, ShutdownMode,
};
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

const WATCHDOG: Duration = Duration::from_secs(120);

fn runtime() -> Runtime {
    Builder::new().cores(1).build().expect("build runtime")
}

// ---------------------------------------------------------------------
// Deadlines saturate.

#[test]
fn timeout_max_around_a_future_that_completes_is_ok() {
    let ex = LocalExecutor::new();
    ex.run(async {
        assert_eq!(timeout(Duration::MAX, async { 7 }).await, Ok(7));
        // One that has to wait (registers the far-future timer first).
        let waited = timeout(Duration::MAX, sleep(Duration::from_millis(1))).await;
        assert_eq!(waited, Ok(()));
    });
}

#[test]
fn sleep_max_never_fires_and_a_short_sleep_wins_the_select() {
    let ex = LocalExecutor::new();
    ex.run(async {
        let forever = sleep(Duration::MAX);
        assert!(forever.deadline() > Instant::now());
        assert!(!forever.is_elapsed());
        match select(forever, pin!(sleep(Duration::from_millis(1)))).await {
            Either::Left(_) => panic!("sleep(Duration::MAX) fired"),
            Either::Right(((), forever)) => assert!(!forever.is_elapsed()),
        }
    });
}

#[test]
fn interval_max_ticks_once_then_never() {
    let ex = LocalExecutor::new();
    ex.run(async {
        let mut every = interval(Duration::MAX);
        assert_eq!(every.period(), Duration::MAX);
        // The first tick is immediate; scheduling the next one saturates.
        every.tick().await;
        let next = pin!(every.tick());
        match select(next, pin!(sleep(Duration::from_millis(1)))).await {
            Either::Left(_) => panic!("interval(Duration::MAX) ticked twice"),
            Either::Right(((), _)) => {}
        }
    });
}

#[test]
fn shutdown_wait_timeout_max_returns_once_tasks_finish() {
    with_watchdog(WATCHDOG, || {
        let rt = runtime();
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        drop(rt.spawn_on(0, async move {
            sleep(Duration::from_millis(5)).await;
            // Relaxed: read after the core thread was joined.
            d.fetch_add(1, Ordering::Relaxed);
        }));
        rt.shutdown(ShutdownMode::WaitTimeout(Duration::MAX))
            .expect("shutdown");
        assert_eq!(done.load(Ordering::Relaxed), 1, "the task ran to the end");
    });
}

#[test]
fn a_core_parked_on_a_never_firing_timer_still_shuts_down() {
    with_watchdog(WATCHDOG, || {
        let rt = runtime();
        let sleeper = rt.spawn_on(0, sleep(Duration::MAX));
        let waiter = rt.spawn_on(0, timeout(Duration::MAX, std::future::pending::<()>()));
        // The core runs both to their first (far-future) park, and still
        // serves other work.
        assert_eq!(rt.block_on(async { 5 }), 5);
        assert!(!sleeper.is_finished() && !waiter.is_finished());
        rt.shutdown(ShutdownMode::Cancel).expect("shutdown");
        let cancelled = futures::executor::block_on(sleeper).expect_err("cancelled");
        assert!(cancelled.is_cancelled());
    });
}

// ---------------------------------------------------------------------
// Outputs and panic payloads whose drop panics.

/// Panics when dropped; counts its drops first.
#[derive(Debug)]
struct PanicOnDrop(Arc<AtomicUsize>);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        // Relaxed: read by the test after a join or a round trip through
        // the core, which orders it.
        self.0.fetch_add(1, Ordering::Relaxed);
        panic!("PanicOnDrop dropped");
    }
}

/// The core still serves `spawn_on(0)`: a fresh task runs and its output
/// comes back.
fn assert_core_serves(rt: &Runtime) {
    let out = futures::executor::block_on(rt.spawn_on(0, async {
        yield_now().await;
        41 + 1
    }));
    assert_eq!(out.expect("core 0 still runs tasks"), 42);
}

#[test]
fn output_that_panics_on_drop_with_the_handle_gone_leaves_the_core_alive() {
    with_watchdog(WATCHDOG, || {
        let rt = runtime();
        let drops = Arc::new(AtomicUsize::new(0));
        let (go, wait) = oneshot::channel::<()>();
        let d = drops.clone();
        // The handle is gone before the task completes: the core drops the
        // output.
        drop(rt.spawn_on(0, async move {
            let _ = wait.await;
            PanicOnDrop(d)
        }));
        go.send(()).expect("task waiting");
        wait_dropped(&drops, 1);
        assert_core_serves(&rt);
        rt.shutdown(ShutdownMode::Cancel).expect("no core panicked");
    });
}

#[test]
fn panic_payload_that_panics_on_drop_with_the_handle_gone_leaves_the_core_alive() {
    with_watchdog(WATCHDOG, || {
        let rt = runtime();
        let drops = Arc::new(AtomicUsize::new(0));
        let (go, wait) = oneshot::channel::<()>();
        let d = drops.clone();
        drop(rt.spawn_on(0, async move {
            let _ = wait.await;
            std::panic::panic_any(PanicOnDrop(d));
        }));
        go.send(()).expect("task waiting");
        wait_dropped(&drops, 1);
        assert_core_serves(&rt);
        rt.shutdown(ShutdownMode::Cancel).expect("no core panicked");
    });
}

/// Waits (without a time limit; the watchdog guards) until the core dropped
/// `n` values.
fn wait_dropped(drops: &AtomicUsize, n: usize) {
    while drops.load(Ordering::Relaxed) < n {
        std::thread::yield_now();
    }
    assert_eq!(drops.load(Ordering::Relaxed), n, "dropped exactly once");
}

/// Waits (without a time limit; the watchdog guards) until `h` finished.
fn wait_finished<T>(h: &plugio_executor::JoinHandle<T>) {
    while !h.is_finished() {
        std::thread::yield_now();
    }
}

#[test]
fn dropping_a_kept_handle_after_completion_does_not_panic_the_caller() {
    with_watchdog(WATCHDOG, || {
        let rt = runtime();
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let output = rt.spawn_on(0, async move { PanicOnDrop(d) });
        let d = drops.clone();
        let payload = rt.spawn_on(0, async move {
            std::panic::panic_any(PanicOnDrop(d));
        });
        wait_finished(&output);
        wait_finished(&payload);
        // Each drop would panic here, in the caller, without containment.
        drop(output);
        drop(payload);
        assert_eq!(drops.load(Ordering::Relaxed), 2);
        assert_core_serves(&rt);
        rt.shutdown(ShutdownMode::Cancel).expect("no core panicked");
    });
}

/// A future that is ready with a `PanicOnDrop` output and whose own drop
/// panics: the core drops the output it replaces with the drop's panic.
struct ReadyThenPanicOnDrop {
    output: Option<PanicOnDrop>,
    _guard: PanicOnDrop,
}

impl Future for ReadyThenPanicOnDrop {
    type Output = PanicOnDrop;

    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<PanicOnDrop> {
        Poll::Ready(self.output.take().expect("polled once"))
    }
}

#[test]
fn a_future_whose_drop_panics_after_a_panicking_output_leaves_the_core_alive() {
    with_watchdog(WATCHDOG, || {
        let rt = runtime();
        let drops = Arc::new(AtomicUsize::new(0));
        let h = rt.spawn_on(
            0,
            ReadyThenPanicOnDrop {
                output: Some(PanicOnDrop(drops.clone())),
                _guard: PanicOnDrop(drops.clone()),
            },
        );
        // The future's drop panicked, so the task reports that panic (its
        // output was dropped on the core, contained).
        let err = futures::executor::block_on(h).expect_err("the drop panicked");
        assert_eq!(err.panic_message(), Some("PanicOnDrop dropped"));
        assert_eq!(drops.load(Ordering::Relaxed), 2);
        assert_core_serves(&rt);
        rt.shutdown(ShutdownMode::Cancel).expect("no core panicked");
    });
}

#[test]
fn local_executor_survives_a_detached_output_that_panics_on_drop() {
    let ex = LocalExecutor::new();
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    let out = ex.run(async move {
        drop(spawn_local(async move {
            yield_now().await;
            PanicOnDrop(d)
        }));
        for _ in 0..4 {
            yield_now().await;
        }
        spawn_local(async { 3 }).await.expect("still runs tasks")
    });
    assert_eq!(out, 3);
    assert_eq!(drops.load(Ordering::Relaxed), 1);
}
