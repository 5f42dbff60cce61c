//! plugio-executor: a thread-per-core async runtime.
//!
//! Each core is one OS thread (optionally pinned to a CPU) that owns its
//! tasks, timers, tick-end hooks and a [`Driver`]. Tasks never move between
//! cores. A [`Runtime`] starts N cores; a [`LocalExecutor`] runs one core on
//! the calling thread, either until a future completes
//! ([`LocalExecutor::run`]) or one tick per call
//! ([`LocalExecutor::run_once`], [`LocalExecutor::run_once_timeout`]) for
//! an embedder that owns the loop (a C plug-in such as the fio engine in
//! `benches/fio-engine`, a foreign event loop), which may also poll
//! futures itself between ticks with the core entered
//! ([`LocalExecutor::enter`]). An embedder with several
//! threads makes one `LocalExecutor` per thread; a [`Runtime`]'s cores
//! run their own loops.
//!
//! # The tick
//!
//! A core loops over ticks. One tick:
//! 1. takes every task queued by other threads (the remote wake queue, a
//!    lock-free intrusive `llist`, see below);
//! 2. fires every expired timer, in deadline order;
//! 3. polls the ready batch: the tasks in the FIFO local run queue at that
//!    moment, at most `task_budget` of them (default 256). A task woken
//!    during the batch runs in the next tick, after the others;
//! 4. calls every [`TickHook`] (the engine flushes its plug here);
//! 5. parks the driver: `driver.park(Some(ZERO))` (poll only) if a task is
//!    ready, a hook reported pending work, or a remote wake is queued;
//!    otherwise `driver.park(timeout)` until the nearest timer (`None` when
//!    there is none).
//!
//! # The contract with the engine (the seams)
//!
//! - **Driver** ([`Driver`], [`Unpark`], in `driver.rs`): see its module
//!   documentation. The executor calls `park` only on the core's thread and
//!   never with a blocking timeout while a task is ready, a hook has work
//!   pending, or a remote wake is queued (invariant kept with a
//!   fence-separated "parked" flag, see below).
//! - **Tick-end hooks** ([`TickHook`], [`register_tick_hook`],
//!   [`unregister_tick_hook`]): called after
//!   each batch and before parking; returning `true` forbids blocking.
//!   Hooks may wake or spawn tasks; the core re-checks its run queue.
//! - **Where am I** ([`core_id`]): the current core's index, `None` off a
//!   core. Per-core state may live in `thread_local!`: a core is one thread
//!   for its whole life and tasks never migrate.
//! - **Cooperative budget** ([`coop`]): a future that can be ready at its
//!   first poll should call [`coop::poll_proceed`] before returning
//!   `Ready`, like plugio's own timers, channels and join handles. The
//!   engine's IO future does not: its first poll always returns `Pending`.
//! - **Statistics** ([`TickStats`], [`tick_stats`], [`Runtime::tick_stats`]).
//! - **Blocking pools** ([`blocking`], [`spawn_blocking`]): each runtime
//!   and local executor owns a bounded pool for blocking calls and a
//!   separate one for the device crate's sync IO backend, found from the
//!   current core and shut down after its cores.
//! - **Wakers**: a task's waker used on the task's own core (cloned, woken
//!   by value or by reference, dropped), and the re-poll it causes, do no
//!   locked atomic operation: the task's wake flag and the references held
//!   on its core are plain thread-local state. Wakers stay `Send + Sync`;
//!   from another thread (or after the core stopped) they take an atomic
//!   path. All the clones of a task's waker made on its core are
//!   bit-identical, so [`std::task::Waker::will_wake`] holds between them
//!   and an IO future can keep its stored waker across IOs instead of
//!   cloning one per IO:
//!   `if !stored.will_wake(cx.waker()) { stored = cx.waker().clone() }`.
//!
//! # Invariants
//!
//! - A task's future is polled and dropped only on its core's thread (an
//!   unregistered `Send` task found in a closed core's queue is the one
//!   exception: it is dropped by whoever found it).
//! - A task is at most once in the local run queue (a plain flag in its
//!   header, owner thread only) and at most once in the remote queue (its
//!   atomic `QUEUED` bit); a task in both is polled once for both wakes.
//! - "On the owner thread" is one thread-local read: the uid of the core
//!   entered on this thread, compared with the uid in the task header.
//! - Remote wakes: the waker pushes the task onto the core's remote queue
//!   (`llist_add`: one CAS, no allocation), and only when that push made
//!   the queue non-empty does it run the park handshake: `SeqCst` fence,
//!   then read the core's `parked` flag, unparking the driver if set. The
//!   core stores `parked`, fences, and re-checks the queue before it
//!   blocks. Checked with loom (preemption bound 3):
//!   `RUSTFLAGS="--cfg loom -C debug-assertions" CARGO_TARGET_DIR=target/loom cargo test --release -p plugio-executor -p plugio-device -p plugio-engine --lib loom`.
//!   The same command checks the local/remote split of task references
//!   and wakes on the real core (`core::loom_tests`): a remote wake racing
//!   the owner's wake and poll, a remote waker drop racing the owner's last
//!   drop, and a remote waker racing the core's close; and the task state
//!   transitions (`core::loom_task_models`): a wake while the task runs, a
//!   wake after it completed, an abort racing completion, a `JoinHandle`
//!   drop racing the output write, and a cross-core spawn racing the
//!   `closed` flag of a closing core.
//! - Every atomic ordering in the crate has a comment naming its pair.

#![cfg_attr(not(test), warn(missing_docs))]

pub mod blocking;
pub mod channel;
pub mod coop;
mod core;
pub mod driver;
pub mod fork;
mod local;
mod owned;
mod pools;
mod remote;
mod runtime;
mod signals;
mod stats;
mod sync;
mod task;
pub mod time;
mod timers;

pub use crate::core::{
    core_id, core_uid, in_tick_hooks, register_tick_hook, spawn, spawn_blocking, spawn_local,
    tick_stats, unregister_tick_hook, yield_now, TickHook,
};
pub use driver::{Driver, ThreadDriver, ThreadUnpark, Unpark};
pub use local::{LocalBuilder, LocalExecutor};
pub use runtime::{
    allowed_cpus, Builder, DriverFactory, Handle, Placement, Runtime, ShutdownError, ShutdownMode,
    ThreadStartHook, DEFAULT_COOP_BUDGET, DEFAULT_TASK_BUDGET,
};
pub use signals::block_file_size_signal;
pub use stats::TickStats;
pub use task::{
    clone_waker, drop_contained, wake_all, JoinError, JoinHandle, LocalWake, TaskPanic,
};
pub use time::{interval, sleep, sleep_until, timeout, Elapsed, Interval, Sleep};
