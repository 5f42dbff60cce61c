//! `spawn_blocking` and the per-runtime blocking pools: results, panics,
//! the bound (jobs past it wait in the queue), cores that keep running
//! while the pool is full, per-runtime ownership, shutdown.

mod common;

use common::with_watchdog;
use plugio_executor::blocking::BlockingPool;
use plugio_executor::{
    sleep, spawn, spawn_blocking, yield_now, JoinError, LocalExecutor, Runtime, ShutdownMode,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A gate blocking jobs wait on until it is opened.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn wait(&self) {
        let (open, cv) = &*self.0;
        let mut g = open.lock().unwrap();
        while !*g {
            g = cv.wait(g).unwrap();
        }
    }

    fn open(&self) {
        let (open, cv) = &*self.0;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }
}

/// Counts jobs running at once and remembers the most seen.
#[derive(Clone, Default)]
struct Concurrency {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    ran: Arc<AtomicUsize>,
}

impl Concurrency {
    fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        self.ran.fetch_add(1, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Yields (letting the core tick) until `cond` holds.
async fn until(mut cond: impl FnMut() -> bool) {
    while !cond() {
        sleep(Duration::from_millis(1)).await;
    }
}

#[test]
fn spawn_blocking_returns_the_result_and_reports_a_panic() {
    with_watchdog(Duration::from_secs(30), || {
        let ex = LocalExecutor::new();
        ex.run(async {
            let on_core = std::thread::current().id();
            let off = spawn_blocking(move || std::thread::current().id() != on_core)
                .await
                .expect("join");
            assert!(off, "the closure runs on a pool thread, not the core");
            let err = spawn_blocking(|| -> u32 { panic!("boom in the pool") })
                .await
                .expect_err("panic");
            assert!(err.is_panic());
            assert_eq!(err.panic_message(), Some("boom in the pool"));
            // The pool thread survived the panic and serves the next job.
            assert_eq!(spawn_blocking(|| 5).await.expect("join"), 5);
        });
    });
}

#[test]
fn the_pool_is_bounded_and_jobs_past_the_bound_wait_in_its_queue() {
    with_watchdog(Duration::from_secs(60), || {
        let ex = LocalExecutor::builder()
            .max_blocking_threads(2)
            .build()
            .expect("executor");
        let gate = Gate::default();
        let seen = Concurrency::default();
        ex.run(async {
            let pool = BlockingPool::current().expect("on a core");
            assert_eq!(pool.max_threads(), 2);
            let handles: Vec<_> = (0..6)
                .map(|i| {
                    let (gate, seen) = (gate.clone(), seen.clone());
                    spawn_blocking(move || {
                        seen.enter();
                        gate.wait();
                        seen.leave();
                        i
                    })
                })
                .collect();
            // Two run, four wait in the queue: no third thread starts.
            until(|| seen.now.load(Ordering::SeqCst) == 2 && pool.queued() == 4).await;
            assert_eq!(pool.threads(), 2);
            gate.open();
            let mut sum = 0;
            for h in handles {
                sum += h.await.expect("join");
            }
            assert_eq!(sum, 15);
        });
        assert_eq!(seen.ran.load(Ordering::SeqCst), 6);
        assert_eq!(
            seen.max.load(Ordering::SeqCst),
            2,
            "never more than the bound"
        );
    });
}

/// A core whose blocking pool is full of stuck calls keeps running its
/// tasks and timers: the calls run on pool threads, never on the core.
#[test]
fn a_full_blocking_pool_does_not_stall_the_core() {
    with_watchdog(Duration::from_secs(60), || {
        let rt = Runtime::builder()
            .cores(1)
            .max_blocking_threads(2)
            .build()
            .expect("runtime");
        let gate = Gate::default();
        let g2 = gate.clone();
        let ticks_while_full = rt.block_on(async move {
            let pool = BlockingPool::current().expect("on a core");
            let stuck: Vec<_> = (0..8)
                .map(|_| {
                    let g = g2.clone();
                    spawn_blocking(move || g.wait())
                })
                .collect();
            until(|| pool.threads() == 2 && pool.queued() == 6).await;
            // 200 timer sleeps and 1000 yields on the core while every pool
            // thread is stuck.
            let timers = spawn(async {
                for _ in 0..200 {
                    sleep(Duration::from_micros(100)).await;
                }
            });
            for _ in 0..1000 {
                yield_now().await;
            }
            timers.await.expect("timers");
            let still_full = pool.queued();
            g2.open();
            for h in stuck {
                h.await.expect("stuck job");
            }
            still_full
        });
        assert_eq!(ticks_while_full, 6, "the pool stayed full meanwhile");
        drop(gate);
        rt.shutdown(ShutdownMode::Cancel).expect("shutdown");
    });
}

#[test]
fn each_runtime_owns_its_pool() {
    with_watchdog(Duration::from_secs(30), || {
        let a = Runtime::builder()
            .cores(2)
            .max_blocking_threads(3)
            .build()
            .expect("a");
        let b = LocalExecutor::builder()
            .max_blocking_threads(5)
            .build()
            .expect("b");
        // Both cores of `a` see the same pool (same bound, same threads).
        let on = |core| {
            a.handle().spawn_on(core, async {
                let pool = BlockingPool::current().expect("core");
                spawn_blocking(|| ()).await.expect("job");
                (
                    pool.max_threads(),
                    format!("{pool:?}").contains("plugio-core-blocking"),
                )
            })
        };
        let (h0, h1) = (on(0), on(1));
        let r0 = futures::executor::block_on(h0).expect("core 0");
        let r1 = futures::executor::block_on(h1).expect("core 1");
        assert_eq!(r0, (3, true));
        assert_eq!(r1, (3, true));
        let max_b = b.run(async { BlockingPool::current().expect("core").max_threads() });
        assert_eq!(max_b, 5);
    });
}

#[test]
fn shutdown_drops_queued_jobs_and_does_not_wait_for_stuck_ones() {
    with_watchdog(Duration::from_secs(30), || {
        let rt = Runtime::builder()
            .cores(1)
            .max_blocking_threads(1)
            .build()
            .expect("runtime");
        let gate = Gate::default();
        let seen = Concurrency::default();
        let (g2, s2) = (gate.clone(), seen.clone());
        let (queued_handle, pool) = rt.block_on(async move {
            let pool = BlockingPool::current().expect("core");
            let g3 = g2.clone();
            let s3 = s2.clone();
            let stuck = spawn_blocking(move || {
                s3.enter();
                g3.wait();
            });
            let queued = spawn_blocking(move || s2.enter());
            until(|| pool.queued() == 1 && pool.threads() == 1).await;
            drop(stuck);
            (queued, pool)
        });
        // Returns although a pool thread is stuck in its job.
        rt.shutdown(ShutdownMode::Cancel).expect("shutdown");
        let r = futures::executor::block_on(queued_handle);
        assert!(matches!(r, Err(JoinError::Cancelled)), "{r:?}");
        assert_eq!(pool.queued(), 0, "the queued job was dropped");
        assert!(pool.execute(|| ()).is_err(), "a stopped pool refuses jobs");
        gate.open();
        // The stuck thread finishes its job and exits; the queued job never ran.
        while pool.threads() > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(seen.ran.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn idle_pool_threads_exit_after_the_keep_alive() {
    with_watchdog(Duration::from_secs(30), || {
        let pool = BlockingPool::with_keep_alive("keep-alive", 4, Duration::from_millis(20));
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..4 {
            let tx = tx.clone();
            pool.execute(move || tx.send(i).expect("send"))
                .expect("execute");
        }
        let mut got: Vec<i32> = (0..4).map(|_| rx.recv().expect("result")).collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3]);
        assert!(pool.threads() <= 4);
        while pool.threads() > 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // A job after they all exited starts a thread again.
        pool.execute(move || tx.send(9).expect("send"))
            .expect("execute");
        assert_eq!(rx.recv().expect("result"), 9);
    });
}

#[test]
fn spawn_blocking_off_a_core_panics_with_what_to_do() {
    let err = std::panic::catch_unwind(|| spawn_blocking(|| 1)).expect_err("off a core");
    let msg = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(msg.contains("plugio core"), "{msg}");
    assert!(msg.contains("Handle::spawn_on"), "{msg}");
}
