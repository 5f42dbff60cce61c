//! LocalExecutor: tasks, join handles, panics, abort, yield, coop, hooks.

mod common;

use common::DropCounter;
use plugio_executor::{
    channel, core_id, register_tick_hook, spawn, spawn_local, tick_stats, yield_now, Driver,
    JoinError, LocalExecutor, ThreadDriver, TickHook, Unpark,
};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn run_returns_output_and_spawn_local_accepts_non_send() {
    let ex = LocalExecutor::builder().build().expect("build");
    let out = ex.run(async {
        let shared = Rc::new(Cell::new(1));
        let s2 = shared.clone();
        let h = spawn_local(async move {
            s2.set(s2.get() + 41);
            s2.get()
        });
        let v = h.await.expect("join");
        assert_eq!(shared.get(), 42);
        v * 2
    });
    assert_eq!(out, 84);
}

#[test]
fn core_id_is_zero_inside_and_none_outside() {
    assert_eq!(core_id(), None);
    assert!(tick_stats().is_none());
    let ex = LocalExecutor::new();
    let (outer, inner) = ex.run(async { (core_id(), spawn(async { core_id() }).await) });
    assert_eq!(outer, Some(0));
    assert_eq!(inner.expect("join"), Some(0));
    assert_eq!(core_id(), None);
}

#[test]
fn panicking_task_reports_through_join_handle_and_executor_survives() {
    let ex = LocalExecutor::new();
    ex.run(async {
        let bad = spawn_local(async {
            yield_now().await;
            panic!("boom in task");
        });
        let good = spawn_local(async { 7 });
        match bad.await {
            Err(JoinError::Panic(p)) => {
                assert_eq!(p.message(), Some("boom in task"));
                let payload = p.into_payload();
                assert_eq!(
                    payload.downcast_ref::<&str>().copied(),
                    Some("boom in task")
                );
            }
            other => panic!("expected a panic, got {other:?}"),
        }
        assert_eq!(good.await.expect("join"), 7);
    });
    // Still usable afterwards.
    assert_eq!(
        ex.run(async { spawn_local(async { 3 }).await.expect("join") }),
        3
    );
}

#[test]
fn abort_cancels_pending_task_and_drops_its_future() {
    let drops = Arc::new(AtomicUsize::new(0));
    let ex = LocalExecutor::new();
    let d = drops.clone();
    ex.run(async move {
        let guard = DropCounter(d.clone());
        let h = spawn_local(async move {
            let _g = guard;
            std::future::pending::<()>().await;
        });
        yield_now().await;
        assert!(!h.is_finished());
        h.abort();
        let err = h.await.expect_err("aborted");
        assert!(err.is_cancelled());
        assert_eq!(d.load(Ordering::SeqCst), 1);
        // Aborting a finished task changes nothing.
        let done = spawn_local(async { 5 });
        yield_now().await;
        yield_now().await;
        assert!(done.is_finished());
        done.abort();
        assert_eq!(done.await.expect("finished before abort"), 5);
    });
}

#[test]
fn abort_from_another_thread() {
    let ex = LocalExecutor::new();
    let r = ex.run(async {
        let h = spawn(async { std::future::pending::<u32>().await });
        let (tx, mut rx) = channel::bounded::<()>(1);
        let h = Arc::new(h);
        let h2 = h.clone();
        let t = std::thread::spawn(move || {
            h2.abort();
            tx.try_send(()).expect("send");
        });
        rx.recv().await;
        t.join().expect("thread");
        match Arc::try_unwrap(h) {
            Ok(h) => h.await,
            Err(_) => panic!("handle still shared"),
        }
    });
    assert!(r.expect_err("aborted").is_cancelled());
}

#[test]
fn dropping_join_handle_detaches() {
    let ex = LocalExecutor::new();
    let hit = Rc::new(Cell::new(false));
    let h2 = hit.clone();
    ex.run(async move {
        drop(spawn_local(async move {
            yield_now().await;
            h2.set(true);
        }));
        yield_now().await;
        yield_now().await;
    });
    assert!(hit.get());
}

#[test]
fn run_queue_is_fifo_and_yield_round_robins() {
    let ex = LocalExecutor::new();
    let log = Rc::new(RefCell::new(Vec::new()));
    ex.run({
        let log = log.clone();
        async move {
            let handles: Vec<_> = (0..3)
                .map(|t| {
                    let log = log.clone();
                    spawn_local(async move {
                        for round in 0..3 {
                            log.borrow_mut().push((round, t));
                            yield_now().await;
                        }
                    })
                })
                .collect();
            for h in handles {
                h.await.expect("join");
            }
        }
    });
    let expected: Vec<_> = (0..3).flat_map(|r| (0..3).map(move |t| (r, t))).collect();
    assert_eq!(*log.borrow(), expected);
}

#[test]
fn coop_budget_makes_a_busy_receiver_yield() {
    let ex = LocalExecutor::builder()
        .coop_budget(16)
        .build()
        .expect("build");
    ex.run(async {
        let (tx, mut rx) = channel::bounded::<u32>(1000);
        for i in 0..1000 {
            tx.try_send(i).expect("room");
        }
        drop(tx);
        let ticks_seen = Rc::new(Cell::new(0u32));
        let t2 = ticks_seen.clone();
        let stop = Rc::new(Cell::new(false));
        let s2 = stop.clone();
        let ticker = spawn_local(async move {
            while !s2.get() {
                t2.set(t2.get() + 1);
                yield_now().await;
            }
        });
        let consumer = spawn_local(async move {
            let mut n = 0;
            while rx.recv().await.is_some() {
                n += 1;
            }
            n
        });
        assert_eq!(consumer.await.expect("join"), 1000);
        stop.set(true);
        ticker.await.expect("join");
        // 1000 ready receives with 16 per poll: the ticker ran in between.
        assert!(
            ticks_seen.get() >= 1000 / 16 - 2,
            "ticker ran {} times",
            ticks_seen.get()
        );
    });
}

/// Only ready polls spend the coop budget: receives and sends that find
/// the channel empty or full give their unit back, so a task polling many
/// idle channels is not made to yield at once, tick after tick (200
/// empty receivers made a core spin instead of parking: found by an API
/// audit helper).
#[test]
fn pending_channel_polls_spend_no_coop_budget() {
    let ex = LocalExecutor::builder()
        .coop_budget(2)
        .build()
        .expect("build");
    ex.run(async {
        let (_idle_tx, mut idle) = channel::bounded::<u32>(1);
        let (full_tx, mut full) = channel::bounded::<u32>(1);
        full_tx.try_send(7).expect("room");
        let got = std::future::poll_fn(|cx| {
            for _ in 0..10 {
                assert!(idle.poll_recv(cx).is_pending());
                let mut send = std::pin::pin!(full_tx.send(8));
                assert!(send.as_mut().poll(cx).is_pending(), "full");
            }
            // The budget of 2 is whole: the ready receive goes (in this
            // same poll).
            std::task::Poll::Ready(full.poll_recv(cx))
        })
        .await;
        assert_eq!(got, std::task::Poll::Ready(Some(7)));
    });
}

#[test]
fn task_budget_caps_polls_per_tick() {
    let ex = LocalExecutor::builder()
        .task_budget(4)
        .build()
        .expect("build");
    ex.run(async {
        let hs: Vec<_> = (0..20)
            .map(|_| spawn_local(async { yield_now().await }))
            .collect();
        for h in hs {
            h.await.expect("join");
        }
    });
    let s = ex.tick_stats();
    assert!(s.max_tick_tasks_polled <= 4, "{s:?}");
    assert!(s.tasks_polled >= 40, "{s:?}");
}

/// A driver that records every park timeout.
struct RecordingDriver {
    inner: ThreadDriver,
    parks: Rc<RefCell<Vec<Option<Duration>>>>,
}

impl Driver for RecordingDriver {
    fn park(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.parks.borrow_mut().push(timeout);
        self.inner.park(timeout)
    }

    fn unparker(&self) -> Arc<dyn Unpark> {
        self.inner.unparker()
    }
}

struct PendingHook {
    calls: Cell<u64>,
    pending_left: Cell<u32>,
    parks: Rc<RefCell<Vec<Option<Duration>>>>,
    parks_while_pending: RefCell<Vec<usize>>,
}

impl TickHook for PendingHook {
    fn tick_end(&self) -> bool {
        self.calls.set(self.calls.get() + 1);
        let left = self.pending_left.get();
        if left > 0 {
            self.pending_left.set(left - 1);
            // Remember which park call follows this pending report.
            self.parks_while_pending
                .borrow_mut()
                .push(self.parks.borrow().len());
            true
        } else {
            false
        }
    }
}

#[test]
fn hooks_run_every_tick_and_pending_work_forbids_blocking_park() {
    let parks = Rc::new(RefCell::new(Vec::new()));
    let p2 = parks.clone();
    let ex = LocalExecutor::builder()
        .driver(move |_| {
            Ok(Box::new(RecordingDriver {
                inner: ThreadDriver::new(),
                parks: p2,
            }) as Box<dyn Driver>)
        })
        .build()
        .expect("build");
    let hook = Rc::new(PendingHook {
        calls: Cell::new(0),
        pending_left: Cell::new(50),
        parks: parks.clone(),
        parks_while_pending: RefCell::new(Vec::new()),
    });
    let h2 = hook.clone();
    ex.run(async move {
        register_tick_hook(h2.clone());
        // Idle until the hook has no more pending work: nothing else wakes
        // us, so progress only comes from zero-timeout parks.
        // (Until it has none, however long a busy machine takes.)
        while h2.pending_left.get() > 0 {
            plugio_executor::sleep(Duration::from_millis(30)).await;
        }
    });
    let parks = parks.borrow();
    let pending = hook.parks_while_pending.borrow();
    assert_eq!(pending.len(), 50);
    for &i in pending.iter() {
        assert_eq!(
            parks[i],
            Some(Duration::ZERO),
            "blocking park while hook pending"
        );
    }
    // Called once per tick (the first run of the main future happens
    // before the first tick; registration was in that poll).
    assert_eq!(hook.calls.get(), ex.tick_stats().ticks);
    assert!(ex.tick_stats().hook_pending_ticks >= 50);
    assert!(
        ex.tick_stats().parks >= 1,
        "the sleep should have blocked once pending work was done"
    );
}

#[test]
fn hook_waking_a_task_is_seen_before_parking() {
    struct WakeHook(RefCell<Option<std::task::Waker>>);
    impl TickHook for WakeHook {
        fn tick_end(&self) -> bool {
            if let Some(w) = self.0.borrow_mut().take() {
                w.wake();
            }
            false
        }
    }
    let ex = LocalExecutor::new();
    let hook = Rc::new(WakeHook(RefCell::new(None)));
    let h2 = hook.clone();
    ex.run(async move {
        register_tick_hook(h2.clone());
        let mut first = true;
        std::future::poll_fn(|cx| {
            if first {
                first = false;
                *h2.0.borrow_mut() = Some(cx.waker().clone());
                std::task::Poll::Pending
            } else {
                std::task::Poll::Ready(())
            }
        })
        .await;
    });
    // If the wake from the hook were missed the run would hang; and it
    // must not have needed a blocking park.
    assert_eq!(ex.tick_stats().parks, 0);
}

#[test]
fn dropping_the_executor_cancels_its_tasks() {
    let drops = Arc::new(AtomicUsize::new(0));
    let ex = LocalExecutor::new();
    let d = drops.clone();
    let g = DropCounter(d);
    let h = ex.spawn_local(async move {
        let _g = g;
        std::future::pending::<()>().await;
    });
    ex.run(yield_now());
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    drop(ex);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    assert!(h.is_finished());
    let r = futures::executor::block_on(h);
    assert!(r.expect_err("cancelled").is_cancelled());
}

#[test]
fn driver_factory_error_fails_build() {
    let err = LocalExecutor::builder()
        .driver(|_| Err(std::io::Error::other("no ring")))
        .build()
        .expect_err("must fail");
    assert_eq!(err.to_string(), "no ring");
}

#[test]
fn on_thread_start_runs_before_driver() {
    let order = Rc::new(RefCell::new(Vec::new()));
    let (o1, o2) = (order.clone(), order.clone());
    let _ex = LocalExecutor::builder()
        .on_thread_start(move |i| o1.borrow_mut().push(("start", i)))
        .driver(move |i| {
            o2.borrow_mut().push(("driver", i));
            Ok(Box::new(ThreadDriver::new()) as Box<dyn Driver>)
        })
        .build()
        .expect("build");
    assert_eq!(*order.borrow(), vec![("start", 0), ("driver", 0)]);
}

#[test]
fn spawn_before_run_runs_during_run() {
    let ex = LocalExecutor::new();
    let h = ex.spawn_local(async { 11 });
    assert_eq!(ex.run(h).expect("join"), 11);
}

#[test]
fn tick_stats_count_ticks_and_polls() {
    let ex = LocalExecutor::new();
    ex.run(async {
        for _ in 0..10 {
            spawn_local(async {}).await.expect("join");
        }
        let s = tick_stats().expect("on core");
        assert!(s.ticks >= 10);
        assert!(s.tasks_polled >= 10);
    });
}

#[test]
fn unregistered_hook_is_no_longer_called() {
    struct Count(Cell<u32>);
    impl TickHook for Count {
        fn tick_end(&self) -> bool {
            self.0.set(self.0.get() + 1);
            false
        }
    }
    let ex = LocalExecutor::new();
    let hook = Rc::new(Count(Cell::new(0)));
    let dyn_hook: Rc<dyn TickHook> = hook.clone();
    ex.run(async {
        register_tick_hook(dyn_hook.clone());
        yield_now().await;
        yield_now().await;
        let calls = hook.0.get();
        assert!(calls >= 2);
        assert!(plugio_executor::unregister_tick_hook(&dyn_hook));
        assert!(!plugio_executor::unregister_tick_hook(&dyn_hook));
        yield_now().await;
        yield_now().await;
        assert_eq!(hook.0.get(), calls);
    });
    assert!(!plugio_executor::unregister_tick_hook(&dyn_hook));
    assert_eq!(Rc::strong_count(&hook), 2);
}

/// A tick hook that panics leaves `in_tick_hooks` false once the panic
/// is caught (it stayed true, and the engine then sent each IO on its
/// own submit: found by a break-it helper).
#[test]
fn a_panicking_tick_hook_does_not_leave_the_core_in_its_hooks() {
    struct PanicOnce(Cell<bool>);
    impl TickHook for PanicOnce {
        fn tick_end(&self) -> bool {
            if !self.0.replace(true) {
                panic!("a tick hook panics");
            }
            false
        }
    }
    let ex = LocalExecutor::new();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ex.run(async {
            register_tick_hook(Rc::new(PanicOnce(Cell::new(false))));
            yield_now().await;
        })
    }));
    assert!(caught.is_err(), "the hook's panic reaches run");
    assert!(!ex.run(async { plugio_executor::in_tick_hooks() }));
}

#[test]
fn the_run_queue_keeps_spawn_order_past_its_first_capacity() {
    // 1,000 tasks queued at once: the run queue grows (from 256 slots)
    // with tasks in it, and each round still runs them in queue order.
    let ex = LocalExecutor::builder()
        .task_budget(10_000)
        .build()
        .expect("build");
    let order = ex.run(async {
        let order = Rc::new(RefCell::new(Vec::new()));
        let handles: Vec<_> = (0..1000u32)
            .map(|i| {
                let order = order.clone();
                spawn_local(async move {
                    order.borrow_mut().push(i);
                    yield_now().await;
                    order.borrow_mut().push(i);
                })
            })
            .collect();
        for h in handles {
            h.await.expect("join");
        }
        Rc::try_unwrap(order).expect("tasks done").into_inner()
    });
    let want: Vec<u32> = (0..1000).chain(0..1000).collect();
    assert_eq!(order, want);
}
