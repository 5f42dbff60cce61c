//! A fixed number of local wake + poll cycles, for instruction counting
//! (the executor's share of one IO, without any IO).
//!
//! `T` tasks each run `N` cycles of the engine's pattern: the task stores
//! a waker and returns `Pending`; the tick-end hook (where the engine
//! flushes and reaps) wakes the stored waker; the task is polled again in
//! the next tick. Modes:
//!
//! - `clone` (default): every poll stores `cx.waker().clone()`, the hook
//!   wakes it by value (clone + wake + drop of the clone per cycle);
//! - `reuse`: the poll clones only when `!stored.will_wake(cx.waker())`,
//!   the hook wakes by reference (the clone lives for the whole task);
//! - `self`: the poll clones its waker and wakes the clone at once.
//!
//! Count instructions with two values of `N` and difference them, so the
//! setup cancels out; `cglock.py` (next to this file) also counts the
//! locked instructions per cycle, by matching callgrind's per-address
//! counts against `objdump -d`:
//!
//! ```text
//! cargo build --release -p plugio-executor --example wake_cycles
//! B=target/release/examples/wake_cycles
//! for n in 2000 4000; do valgrind --tool=callgrind --dump-instr=yes \
//!     --compress-pos=no --compress-strings=no --callgrind-out-file=cg.$n \
//!     $B $n clone 64; done
//! python3 executor/examples/cglock.py $B cg.2000 cg.4000 128000   # 64 * 2000 cycles
//! ```
//!
//! Per cycle, 64 tasks (callgrind 3.19, rustc 1.95, x86-64):
//!
//! | mode  | before R9: instr | locked | after: instr | locked |
//! |-------|------------------|--------|--------------|--------|
//! | clone | 247.2            | 4.03   | 236.1        | 0      |
//! | reuse | 245.2            | 4.03   | 219.1        | 0      |
//! | self  | 198.1            | 4.03   | 187.0        | 0      |
//!
//! With one task (every cycle is a tick) the per-tick RMWs show too:
//! 6.0 locked instructions per cycle before, 0 after.
//!
//! Wall clock on the 2-vCPU EPYC VM of the hot-path analysis (noisy, shared;
//! ratios only): `wake_cycles 156250 clone 64` took 0.49–0.64 s of user time
//! before and 0.21 s after; `wake_cycles 1000000 self 10` 0.69 s and 0.37 s.

use plugio_executor::{register_tick_hook, spawn_local, LocalExecutor, TickHook};
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Clone,
    Reuse,
    SelfWake,
}

/// Stored wakers; `Some` while the task waits for the hook.
type Slots = Rc<RefCell<Vec<Option<Waker>>>>;

struct Hook {
    slots: Slots,
    /// Which slots the hook must wake this tick.
    pending: Rc<RefCell<Vec<usize>>>,
    mode: Mode,
}

impl TickHook for Hook {
    fn tick_end(&self) -> bool {
        let mut pending = self.pending.borrow_mut();
        let mut slots = self.slots.borrow_mut();
        for i in pending.drain(..) {
            match self.mode {
                Mode::Reuse => {
                    if let Some(w) = slots[i].as_ref() {
                        w.wake_by_ref();
                    }
                }
                _ => {
                    if let Some(w) = slots[i].take() {
                        w.wake();
                    }
                }
            }
        }
        false
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let cycles: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let mode = match args.next().as_deref() {
        None | Some("clone") => Mode::Clone,
        Some("reuse") => Mode::Reuse,
        Some("self") => Mode::SelfWake,
        Some(other) => panic!("unknown mode {other}: clone | reuse | self"),
    };
    let tasks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let ex = LocalExecutor::new();
    let polls = Rc::new(Cell::new(0u64));
    let p = polls.clone();
    ex.run(async move {
        let slots: Slots = Rc::new(RefCell::new(vec![None; tasks]));
        let pending = Rc::new(RefCell::new(Vec::with_capacity(tasks)));
        register_tick_hook(Rc::new(Hook {
            slots: slots.clone(),
            pending: pending.clone(),
            mode,
        }));
        let handles: Vec<_> = (0..tasks)
            .map(|i| {
                let (slots, pending, polls) = (slots.clone(), pending.clone(), p.clone());
                spawn_local(async move {
                    let mut left = cycles;
                    poll_fn(|cx| {
                        polls.set(polls.get() + 1);
                        if left == 0 {
                            slots.borrow_mut()[i] = None;
                            return Poll::Ready(());
                        }
                        left -= 1;
                        match mode {
                            // The clone is the point: it is what is counted.
                            #[allow(clippy::waker_clone_wake)]
                            Mode::SelfWake => cx.waker().clone().wake(),
                            Mode::Clone => {
                                slots.borrow_mut()[i] = Some(cx.waker().clone());
                                pending.borrow_mut().push(i);
                            }
                            Mode::Reuse => {
                                let mut slots = slots.borrow_mut();
                                let keep =
                                    slots[i].as_ref().is_some_and(|w| w.will_wake(cx.waker()));
                                if !keep {
                                    slots[i] = Some(cx.waker().clone());
                                }
                                pending.borrow_mut().push(i);
                            }
                        }
                        Poll::Pending
                    })
                    .await
                })
            })
            .collect();
        for h in handles {
            h.await.expect("task");
        }
    });
    let expected = (cycles + 1) * tasks as u64;
    assert_eq!(polls.get(), expected, "polls");
    println!("tasks={tasks} cycles={cycles} polls={}", polls.get());
}
