//! Timers: sleep order, timeout, interval, Send-ness, off-core use.

use plugio_executor::{
    interval, sleep, sleep_until, spawn_local, tick_stats, timeout, Builder, Elapsed, LocalExecutor,
};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

#[test]
fn sleeps_wake_in_deadline_order_and_not_early() {
    let ex = LocalExecutor::new();
    let order = Rc::new(RefCell::new(Vec::new()));
    let o2 = order.clone();
    ex.run(async move {
        // One base for every deadline, 100 ms ahead: a sleeper polled a
        // little later than the others (a busy machine) keeps its place,
        // and equal deadlines fire in the order they were armed.
        let start = Instant::now() + Duration::from_millis(100);
        let hs: Vec<_> = [30u64, 10, 50, 20, 40, 10]
            .into_iter()
            .enumerate()
            .map(|(i, ms)| {
                let o = o2.clone();
                spawn_local(async move {
                    let deadline = start + Duration::from_millis(ms);
                    sleep_until(deadline).await;
                    assert!(Instant::now() >= deadline, "woke early");
                    o.borrow_mut().push(i);
                })
            })
            .collect();
        for h in hs {
            h.await.expect("sleeper");
        }
    });
    // Both 10 ms sleepers (indexes 1 and 5) keep their creation order.
    assert_eq!(*order.borrow(), vec![1, 5, 3, 0, 4, 2]);
    assert_eq!(ex.tick_stats().timers_fired, 6);
}

#[test]
fn past_deadline_completes_at_once() {
    let ex = LocalExecutor::new();
    ex.run(async {
        sleep_until(Instant::now() - Duration::from_secs(1)).await;
        sleep(Duration::ZERO).await;
    });
    assert_eq!(ex.tick_stats().timers_fired, 0);
}

#[test]
fn timeout_returns_output_or_elapsed_and_drops_the_future() {
    let ex = LocalExecutor::new();
    ex.run(async {
        let ok = timeout(Duration::from_millis(200), async { 7 }).await;
        assert_eq!(ok, Ok(7));
        let dropped = Rc::new(RefCell::new(false));
        struct Flag(Rc<RefCell<bool>>);
        impl Drop for Flag {
            fn drop(&mut self) {
                *self.0.borrow_mut() = true;
            }
        }
        let flag = Flag(dropped.clone());
        let t0 = Instant::now();
        let late = timeout(Duration::from_millis(20), async move {
            let _f = flag;
            std::future::pending::<u32>().await
        })
        .await;
        assert!(matches!(late, Err(Elapsed { .. })));
        assert!(t0.elapsed() >= Duration::from_millis(20));
        assert!(*dropped.borrow());
        assert_eq!(
            late.expect_err("elapsed").to_string(),
            "deadline has elapsed"
        );
    });
}

#[test]
fn interval_ticks_at_its_period() {
    let ex = LocalExecutor::new();
    ex.run(async {
        let period = Duration::from_millis(10);
        let mut iv = interval(period);
        let t0 = Instant::now();
        let mut ticks = Vec::new();
        for _ in 0..5 {
            ticks.push(iv.tick().await);
        }
        assert!(t0.elapsed() >= period * 4);
        for w in ticks.windows(2) {
            assert!(w[1] - w[0] >= period, "{:?}", w[1] - w[0]);
        }
        assert!(tick_stats().expect("on core").timers_fired >= 4);
    });
}

#[test]
fn sleep_is_send_and_works_on_runtime_cores() {
    let rt = Builder::new().cores(2).build().expect("build");
    let t0 = Instant::now();
    let h = rt.spawn_on(1, async {
        sleep(Duration::from_millis(15)).await;
        plugio_executor::core_id()
    });
    assert_eq!(futures::executor::block_on(h).expect("join"), Some(1));
    assert!(t0.elapsed() >= Duration::from_millis(15));
}

#[test]
fn sleep_off_core_panics_with_a_clear_message() {
    let r = std::panic::catch_unwind(|| {
        futures::executor::block_on(sleep(Duration::from_millis(5)));
    });
    let payload = r.expect_err("must panic");
    let msg = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(msg.contains("outside a plugio core"), "{msg}");
}

#[test]
fn dropping_a_sleep_cancels_its_timer() {
    let ex = LocalExecutor::new();
    ex.run(async {
        for _ in 0..1000 {
            let _ = timeout(Duration::from_secs(60), async {}).await;
        }
        // None of the 1000 one-minute timers keeps the core from parking
        // or fires.
        sleep(Duration::from_millis(5)).await;
    });
    assert_eq!(ex.tick_stats().timers_fired, 1);
}
