//! The local/remote waker split: wakers cloned on the owner core and used
//! elsewhere, long runs of local wakes, local and remote wakes of one task
//! in one tick, wakers that outlive their core.

mod common;

use common::{with_watchdog, DropCounter};
use plugio_executor::{spawn_local, yield_now, LocalExecutor, Runtime, ShutdownMode};
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// A task that counts its polls, stores a clone of its waker, and finishes
/// once `done` is set.
fn parked_task(
    polls: Rc<Cell<u32>>,
    slot: Rc<RefCell<Option<Waker>>>,
    done: Rc<Cell<bool>>,
) -> impl std::future::Future<Output = u32> {
    poll_fn(move |cx| {
        polls.set(polls.get() + 1);
        if done.get() {
            return Poll::Ready(polls.get());
        }
        *slot.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    })
}

async fn ticks(n: usize) {
    for _ in 0..n {
        yield_now().await;
    }
}

#[test]
fn owner_cloned_waker_woken_and_dropped_from_another_thread_while_pending() {
    with_watchdog(LIMIT, || {
        let ex = LocalExecutor::new();
        ex.run(async {
            let polls = Rc::new(Cell::new(0));
            let slot = Rc::new(RefCell::new(None));
            let done = Rc::new(Cell::new(false));
            let t = spawn_local(parked_task(polls.clone(), slot.clone(), done.clone()));
            ticks(2).await;
            assert_eq!(polls.get(), 1);
            let w = slot.borrow().clone().expect("stored waker");
            // Dropped elsewhere without a wake: no poll.
            let d = w.clone();
            std::thread::spawn(move || drop(d)).join().expect("dropper");
            ticks(3).await;
            assert_eq!(polls.get(), 1, "a drop must not wake");
            // Cloned, woken by reference and by value, dropped elsewhere.
            let r = w.clone();
            std::thread::spawn(move || {
                let r2 = r.clone();
                r.wake_by_ref();
                drop(r);
                r2.wake();
            })
            .join()
            .expect("waker");
            ticks(3).await;
            assert_eq!(polls.get(), 2, "remote wakes coalesce into one poll");
            // The owner's clone still works, and finishes the task.
            done.set(true);
            w.wake();
            assert_eq!(t.await.expect("join"), 3);
        });
    });
}

#[test]
fn owner_cloned_wakers_racing_a_remote_thread_never_lose_a_wake() {
    // The owner stores a fresh clone every round; another thread takes it,
    // clones it, wakes one copy and drops the other while the owner runs.
    const ROUNDS: usize = 20_000;
    with_watchdog(LIMIT, || {
        let slot: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let helper = {
            let (slot, stop) = (slot.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut wakes = 0usize;
                while !stop.load(SeqCst) {
                    let taken = slot.lock().expect("slot").take();
                    match taken {
                        Some(w) => {
                            let copy = w.clone();
                            if wakes % 2 == 0 {
                                w.wake();
                                drop(copy);
                            } else {
                                copy.wake_by_ref();
                                drop(w);
                                drop(copy);
                            }
                            wakes += 1;
                        }
                        None => std::thread::yield_now(),
                    }
                }
                wakes
            })
        };
        let ex = LocalExecutor::new();
        let rounds = ex.run({
            let slot = slot.clone();
            async move {
                let (s2, seen) = (slot.clone(), Rc::new(Cell::new(0usize)));
                let seen2 = seen.clone();
                let t = spawn_local(poll_fn(move |cx| {
                    if seen2.get() == ROUNDS {
                        return Poll::Ready(());
                    }
                    seen2.set(seen2.get() + 1);
                    // Keep an owner-side clone alive across the round too.
                    let mine = cx.waker().clone();
                    *s2.lock().expect("slot") = Some(mine.clone());
                    drop(mine);
                    Poll::Pending
                }));
                // A busy neighbour keeps the core ticking.
                let busy = spawn_local(async move {
                    for _ in 0..1000 {
                        yield_now().await;
                    }
                });
                t.await.expect("task");
                busy.await.expect("busy");
                seen.get()
            }
        });
        stop.store(true, SeqCst);
        let wakes = helper.join().expect("helper");
        assert_eq!(rounds, ROUNDS);
        assert_eq!(wakes, ROUNDS);
    });
}

#[test]
fn a_million_local_wake_cycles_poll_exactly_as_often() {
    const CYCLES: u64 = 1_000_000;
    with_watchdog(LIMIT, || {
        let ex = LocalExecutor::new();
        let polls = Rc::new(Cell::new(0u64));
        let p = polls.clone();
        ex.run(async move {
            let stored: Rc<RefCell<Option<Waker>>> = Rc::new(RefCell::new(None));
            let s = stored.clone();
            let mut left = CYCLES;
            // Alternates the engine's two patterns: a stored clone woken by
            // value, and a clone kept while `will_wake` holds, woken by
            // reference.
            let t = spawn_local(poll_fn(move |cx| {
                p.set(p.get() + 1);
                if left == 0 {
                    return Poll::Ready(());
                }
                left -= 1;
                if left % 2 == 0 {
                    let w = cx.waker().clone();
                    *s.borrow_mut() = None;
                    w.wake();
                } else {
                    let mut slot = s.borrow_mut();
                    if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        *slot = Some(cx.waker().clone());
                    }
                    if let Some(w) = slot.as_ref() {
                        w.wake_by_ref();
                    }
                }
                Poll::Pending
            }));
            t.await.expect("task");
            drop(stored);
        });
        assert_eq!(polls.get(), CYCLES + 1);
        let stats = ex.tick_stats();
        assert_eq!(stats.remote_wakes, 0, "{stats:?}");
    });
}

#[test]
fn wakers_of_one_task_made_on_its_core_will_wake_each_other() {
    let ex = LocalExecutor::new();
    ex.run(async {
        // Inside spawned tasks: the main future's waker is not a task's.
        let (a, b) = spawn_local(poll_fn(|cx| {
            let a = cx.waker().clone();
            let b = a.clone();
            assert!(a.will_wake(cx.waker()));
            assert!(b.will_wake(&a));
            Poll::Ready((a, b))
        }))
        .await
        .expect("task");
        let other = spawn_local(poll_fn(|cx| Poll::Ready(cx.waker().clone())))
            .await
            .expect("other");
        assert!(!other.will_wake(&a));
        assert!(a.will_wake(&b));
        drop((a, b, other));
    });
}

#[test]
fn a_task_woken_locally_and_remotely_in_one_tick_runs_once() {
    with_watchdog(LIMIT, || {
        let ex = LocalExecutor::new();
        ex.run(async {
            let polls = Rc::new(Cell::new(0));
            let slot = Rc::new(RefCell::new(None));
            let done = Rc::new(Cell::new(false));
            let t = spawn_local(parked_task(polls.clone(), slot.clone(), done.clone()));
            ticks(2).await;
            assert_eq!(polls.get(), 1);
            let w = slot.borrow().clone().expect("stored waker");

            // 1. Remote wake, then local wake, before the next tick: the
            //    tick finds the task queued locally already.
            let r = w.clone();
            std::thread::spawn(move || r.wake()).join().expect("remote");
            w.wake_by_ref();
            ticks(4).await;
            assert_eq!(polls.get(), 2, "remote then local");

            // 2. Local wake, then a remote wake that lands after the tick
            //    took its remote queue but before the task's poll (sent by
            //    a task queued just ahead of it): the poll serves both.
            let r = w.clone();
            let before = spawn_local(async move {
                std::thread::spawn(move || r.wake()).join().expect("remote");
            });
            w.wake_by_ref();
            ticks(4).await;
            before.await.expect("before");
            assert_eq!(polls.get(), 3, "local then remote in the same tick");

            // 3. Two local wakes around a remote one from a thread that
            //    was waiting for the first: still one poll.
            let (tx, rx) = mpsc::channel::<()>();
            let r = w.clone();
            let remote = std::thread::spawn(move || {
                rx.recv().expect("go");
                r.wake();
            });
            w.wake_by_ref();
            tx.send(()).expect("go");
            remote.join().expect("remote");
            w.wake_by_ref();
            ticks(4).await;
            assert_eq!(polls.get(), 4, "local, remote, local");

            done.set(true);
            w.wake();
            t.await.expect("join");
        });
    });
}

#[test]
fn owner_cloned_wakers_outlive_their_core() {
    with_watchdog(LIMIT, || {
        let drops = Arc::new(AtomicUsize::new(0));
        let kept: Rc<RefCell<Vec<Waker>>> = Rc::new(RefCell::new(Vec::new()));
        {
            let ex = LocalExecutor::new();
            let (k, d) = (kept.clone(), drops.clone());
            ex.run(async move {
                for _ in 0..4 {
                    let (k, guard) = (k.clone(), DropCounter(d.clone()));
                    drop(spawn_local(poll_fn(move |cx| {
                        let _g = &guard;
                        k.borrow_mut().push(cx.waker().clone());
                        k.borrow_mut().push(cx.waker().clone());
                        Poll::<()>::Pending
                    })));
                }
                ticks(2).await;
            });
            assert_eq!(kept.borrow().len(), 8);
            // The executor drops here: the pending tasks are cancelled.
        }
        assert_eq!(drops.load(SeqCst), 4);
        let mut wakers: Vec<Waker> = kept.borrow_mut().drain(..).collect();
        // On the old owner thread, off the core: clone, wake, drop.
        let extra: Vec<Waker> = wakers.iter().map(Waker::clone).collect();
        for w in &extra {
            w.wake_by_ref();
        }
        drop(extra);
        let half = wakers.split_off(4);
        if let Some(w) = wakers.pop() {
            w.wake();
        }
        // On other threads: all four kinds of use.
        let t = std::thread::spawn(move || {
            for w in half {
                let c = w.clone();
                c.wake_by_ref();
                w.wake();
                drop(c);
            }
        });
        drop(wakers);
        t.join().expect("remote user");
    });
}

#[test]
fn owner_cloned_wakers_dropped_elsewhere_while_a_runtime_core_shuts_down() {
    with_watchdog(LIMIT, || {
        for _ in 0..20 {
            let rt = Runtime::builder().cores(1).build().expect("runtime");
            let (tx, rx) = mpsc::channel::<Waker>();
            let (started_tx, started) = mpsc::channel::<()>();
            let handle = rt.handle().clone();
            let remote = std::thread::spawn(move || {
                let mut n = 0;
                for w in rx {
                    let c = w.clone();
                    c.wake();
                    drop(w);
                    n += 1;
                }
                n
            });
            let h = handle.spawn_on(0, async move {
                let tx = tx;
                for i in 0..100 {
                    let w = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
                    tx.send(w.clone()).expect("send");
                    if i == 0 {
                        started_tx.send(()).expect("started");
                    }
                    yield_now().await;
                    drop(w);
                }
                poll_fn(|cx| {
                    let _ = tx.send(cx.waker().clone());
                    Poll::<()>::Pending
                })
                .await;
            });
            started.recv().expect("task started");
            rt.shutdown(ShutdownMode::Cancel).expect("shutdown");
            let _ = futures::executor::block_on(h);
            assert!(remote.join().expect("remote") >= 1);
        }
    });
}

#[test]
fn hooks_that_wake_and_spawn_when_dropped_at_close_are_handled() {
    struct WakeOnDrop(RefCell<Option<Waker>>, Arc<AtomicUsize>);
    impl plugio_executor::TickHook for WakeOnDrop {
        fn tick_end(&self) -> bool {
            false
        }
    }
    impl Drop for WakeOnDrop {
        fn drop(&mut self) {
            if let Some(w) = self.0.borrow_mut().take() {
                w.wake();
            }
            // A task spawned while the core closes is cancelled at once.
            let d = DropCounter(self.1.clone());
            drop(spawn_local(async move {
                let _d = d;
                std::future::pending::<()>().await;
            }));
        }
    }
    with_watchdog(LIMIT, || {
        let drops = Arc::new(AtomicUsize::new(0));
        {
            let ex = LocalExecutor::new();
            let d = drops.clone();
            ex.run(async move {
                let hook = Rc::new(WakeOnDrop(RefCell::new(None), d.clone()));
                plugio_executor::register_tick_hook(hook.clone());
                let (h2, d2) = (hook.clone(), DropCounter(d));
                drop(spawn_local(poll_fn(move |cx| {
                    let _d = &d2;
                    *h2.0.borrow_mut() = Some(cx.waker().clone());
                    Poll::<()>::Pending
                })));
                ticks(2).await;
            });
        }
        assert_eq!(drops.load(SeqCst), 2);
    });
}
