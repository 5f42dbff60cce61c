//! `LocalExecutor::run_once` / `run_once_timeout`: one tick per call for an
//! embedder's loop (a fio ioengine, a foreign event loop).

mod common;

use plugio_executor::{
    channel, register_tick_hook, sleep, yield_now, Driver, LocalExecutor, ThreadDriver, TickHook,
    Unpark,
};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// What happened, in order: a park with its timeout, or a hook call.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Event {
    Park(Option<Duration>),
    Hook,
    Task,
}

type Log = Rc<RefCell<Vec<Event>>>;

/// A driver that logs every park.
struct LoggingDriver {
    inner: ThreadDriver,
    log: Log,
}

impl Driver for LoggingDriver {
    fn park(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.log.borrow_mut().push(Event::Park(timeout));
        self.inner.park(timeout)
    }

    fn unparker(&self) -> Arc<dyn Unpark> {
        self.inner.unparker()
    }
}

struct LoggingHook(Log);

impl TickHook for LoggingHook {
    fn tick_end(&self) -> bool {
        self.0.borrow_mut().push(Event::Hook);
        false
    }
}

fn logging_executor() -> (LocalExecutor, Log) {
    let log: Log = Rc::new(RefCell::new(Vec::new()));
    let l2 = log.clone();
    let ex = LocalExecutor::builder()
        .driver(move |_| {
            Ok(Box::new(LoggingDriver {
                inner: ThreadDriver::new(),
                log: l2,
            }) as Box<dyn Driver>)
        })
        .build()
        .expect("build");
    (ex, log)
}

#[test]
fn run_once_ticks_then_submits_and_collects_in_one_park() {
    let (ex, log) = logging_executor();
    let l2 = log.clone();
    // The task registers the hook in the first tick and yields once.
    let task = ex.spawn_local(async move {
        register_tick_hook(Rc::new(LoggingHook(l2.clone())));
        l2.borrow_mut().push(Event::Task);
        yield_now().await;
        l2.borrow_mut().push(Event::Task);
    });
    assert!(ex.run_once(), "the task yielded, so work is ready");
    assert!(!ex.run_once(), "the task finished: nothing is ready");
    assert!(task.is_finished());
    let zero = Event::Park(Some(Duration::ZERO));
    assert_eq!(
        *log.borrow(),
        vec![
            // Call 1: the tick (task then hooks), then one park that
            // submits and collects (one io_uring_enter at most).
            Event::Task,
            Event::Hook,
            zero,
            // Call 2: the same, with the task's second poll.
            Event::Task,
            Event::Hook,
            zero,
        ]
    );
    assert_eq!(ex.tick_stats().ticks, 2);
    assert_eq!(ex.tick_stats().parks, 0, "run_once never blocks");
}

#[test]
fn run_once_on_an_idle_executor_returns_false_at_once() {
    let (ex, log) = logging_executor();
    for _ in 0..3 {
        assert!(!ex.run_once());
    }
    let parks = log.borrow();
    assert_eq!(parks.len(), 3, "one non-blocking park per call");
    assert!(parks
        .iter()
        .all(|e| *e == Event::Park(Some(Duration::ZERO))));
}

#[test]
fn run_once_timeout_waits_at_most_its_timeout_when_idle() {
    let (ex, log) = logging_executor();
    assert!(!ex.run_once_timeout(Some(Duration::from_millis(2))));
    assert_eq!(
        *log.borrow(),
        vec![
            Event::Park(Some(Duration::from_millis(2))),
            Event::Park(Some(Duration::ZERO)),
        ]
    );
    assert_eq!(ex.tick_stats().parks, 1, "the first park blocked");
}

#[test]
fn run_once_timeout_does_not_wait_while_a_task_is_ready() {
    let (ex, log) = logging_executor();
    let task = ex.spawn_local(async {});
    // A limit of an hour: if the park waited, the test would hang.
    ex.run_once_timeout(Some(Duration::from_secs(3600)));
    assert!(task.is_finished());
    assert_eq!(log.borrow()[0], Event::Park(Some(Duration::ZERO)));
}

#[test]
fn run_once_timeout_wakes_for_a_timer_before_its_timeout() {
    common::with_watchdog(Duration::from_secs(60), || {
        let (ex, log) = logging_executor();
        let fired = Rc::new(Cell::new(false));
        let f2 = fired.clone();
        ex.spawn_local(async move {
            sleep(Duration::from_millis(1)).await;
            f2.set(true);
        });
        ex.run_once(); // registers the timer
        let mut calls = 0;
        while !fired.get() {
            // An unbounded wait: only the timer can end it.
            ex.run_once_timeout(None);
            calls += 1;
        }
        assert!(calls >= 1);
        // Every blocking park of those calls was bounded by the timer.
        assert!(log.borrow().iter().all(|e| *e != Event::Park(None)));
    });
}

#[test]
fn run_once_timeout_without_limit_returns_on_a_wake_from_another_thread() {
    common::with_watchdog(Duration::from_secs(60), || {
        let ex = LocalExecutor::new();
        let (tx, mut rx) = channel::bounded::<u32>(1);
        let got = ex.spawn_local(async move { rx.recv().await });
        ex.run_once(); // the task waits on the channel
        assert!(!got.is_finished());
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            tx.try_send(7).expect("send");
        });
        // Waits without a limit: only the cross-thread wake ends it, and the
        // same call runs the woken task.
        ex.run_once_timeout(None);
        assert!(got.is_finished());
        assert_eq!(ex.run(got).expect("join"), Some(7));
        sender.join().expect("sender");
    });
}

#[test]
fn run_once_and_run_can_be_mixed() {
    let ex = LocalExecutor::new();
    let counter = Rc::new(Cell::new(0u32));
    let c2 = counter.clone();
    ex.spawn_local(async move {
        loop {
            c2.set(c2.get() + 1);
            yield_now().await;
        }
    });
    ex.run_once();
    ex.run_once();
    assert_eq!(counter.get(), 2);
    ex.run(async {
        for _ in 0..5 {
            yield_now().await;
        }
    });
    assert!(counter.get() > 2);
}

#[test]
#[should_panic(expected = "run_once called on a plugio core")]
fn run_once_inside_a_task_panics() {
    let ex = LocalExecutor::new();
    ex.run(async {
        let inner = LocalExecutor::new();
        inner.run_once();
    });
}

#[test]
fn enter_makes_the_core_current_without_a_tick() {
    let (ex, log) = logging_executor();
    let ran = Rc::new(Cell::new(false));
    let r = ran.clone();
    ex.enter(|| {
        assert!(plugio_executor::core_uid().is_some());
        // Spawned onto the entered core; it runs in the next tick, not now.
        drop(plugio_executor::spawn_local(async move { r.set(true) }));
    });
    assert!(!ran.get());
    assert!(log.borrow().is_empty(), "entering parks nothing");
    assert_eq!(plugio_executor::core_uid(), None, "no core after enter");
    assert!(!ex.run_once());
    assert!(ran.get());
}

/// A hook that holds work until its tick end (as the engine's plug does).
struct PendingHook(Log, Rc<Cell<bool>>);

impl TickHook for PendingHook {
    fn tick_end(&self) -> bool {
        self.0.borrow_mut().push(Event::Hook);
        self.1.set(false);
        false
    }

    fn has_pending(&self) -> bool {
        self.1.get()
    }
}

#[test]
fn run_once_after_enter_ticks_before_it_waits_only_when_a_hook_holds_work() {
    // What an embedder starts inside `enter` may wait for a tick-end hook
    // (an IO in the engine's plug): a wait before that tick would never
    // end (`None`) or last its whole timeout.
    let (ex, log) = logging_executor();
    let pending = Rc::new(Cell::new(false));
    let (l2, p2) = (log.clone(), pending.clone());
    ex.enter(|| {
        register_tick_hook(Rc::new(PendingHook(l2, p2.clone())));
        p2.set(true);
    });
    assert!(!ex.run_once_timeout(Some(Duration::from_secs(5))));
    let zero = Event::Park(Some(Duration::ZERO));
    assert_eq!(
        *log.borrow(),
        vec![Event::Hook, zero],
        "no wait before the tick"
    );
    // An `enter` that leaves no hook work: the call waits first, as an
    // idle one does (an embedder's loop of enter and run_once_timeout
    // sleeps, it does not spin).
    log.borrow_mut().clear();
    ex.enter(|| ());
    let short = Duration::from_millis(1);
    assert!(!ex.run_once_timeout(Some(short)));
    let waited = vec![Event::Park(Some(short)), Event::Hook, zero];
    assert_eq!(*log.borrow(), waited, "an idle call waits, then ticks");
    // Hook work that a `run` tick already moved on is not waited for again.
    log.borrow_mut().clear();
    ex.enter(|| pending.set(true));
    // (A main future that is ready at its first poll returns before any
    // tick: then the work would still be there. This one yields once.)
    ex.run(yield_now());
    log.borrow_mut().clear();
    assert!(!ex.run_once_timeout(Some(short)));
    assert_eq!(*log.borrow(), waited, "run's tick took the hook's work");
}

#[test]
fn run_once_and_a_second_enter_refuse_an_entered_core() {
    let ex = LocalExecutor::new();
    let other = LocalExecutor::new();
    ex.enter(|| {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ex.run_once()));
        assert!(run.is_err(), "run_once inside enter panics");
        let enter = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| other.enter(|| ())));
        assert!(enter.is_err(), "a second enter on the thread panics");
        assert!(
            plugio_executor::core_uid().is_some(),
            "the first enter still holds"
        );
    });
    // A panic inside `f` leaves no core current.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ex.enter(|| panic!("inside enter"))
    }));
    assert!(panicked.is_err());
    assert_eq!(plugio_executor::core_uid(), None);
}

#[test]
fn enter_gives_a_fresh_coop_budget() {
    // With one unit per poll, the last task of a tick spends it; the
    // embedder's poll inside `enter` must not inherit the empty budget (a
    // finished JoinHandle would stay pending, waking itself forever).
    let ex = LocalExecutor::builder()
        .coop_budget(1)
        .build()
        .expect("build");
    let first = ex.spawn_local(async {});
    let finished = ex.spawn_local(async { 7 });
    // Polled last: awaiting the finished `first` spends its one unit.
    let spender = ex.spawn_local(async move { first.await.expect("joined") });
    while ex.run_once() {}
    assert!(spender.is_finished() && finished.is_finished());
    let mut finished = std::pin::pin!(finished);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let got = ex.enter(|| std::future::Future::poll(finished.as_mut(), &mut cx));
    assert!(
        matches!(got, std::task::Poll::Ready(Ok(7))),
        "a finished JoinHandle is ready inside enter: {got:?}"
    );
}
