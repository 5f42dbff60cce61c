//! `LocalExecutor`: one core on the calling thread, no threads started.
//!
//! Invariants: the executor is core 0 of no runtime; its tasks only run
//! inside [`LocalExecutor::run`] or [`LocalExecutor::run_once`] (one tick
//! per call, for embedders); dropping it cancels the tasks it still owns
//! (on this thread), then shuts its blocking pools down.

use crate::core::{Core, CoreConfig};
use crate::driver::{Driver, ThreadDriver};
use crate::pools::{PoolConfig, Pools};
use crate::stats::TickStats;
use crate::task::JoinHandle;
use std::fmt;
use std::future::Future;
use std::io;
use std::time::Duration;

type LocalDriverFactory = Box<dyn FnOnce(usize) -> io::Result<Box<dyn Driver>>>;

/// Configures a [`LocalExecutor`] (same seams as [`crate::Builder`]).
pub struct LocalBuilder {
    config: CoreConfig,
    pools: PoolConfig,
    driver: Option<LocalDriverFactory>,
    on_thread_start: Option<Box<dyn FnOnce(usize)>>,
}

impl LocalBuilder {
    /// Most task polls per tick (see [`crate::Builder::task_budget`]).
    pub fn task_budget(mut self, polls_per_tick: usize) -> Self {
        self.config.task_budget = polls_per_tick.max(1);
        self
    }

    /// Coop budget (see [`crate::Builder::coop_budget`]).
    pub fn coop_budget(mut self, units: u32) -> Self {
        self.config.coop_budget = units.max(1);
        self
    }

    /// Most threads of the executor's blocking pool (see
    /// [`crate::Builder::max_blocking_threads`]; default 512).
    ///
    /// ```
    /// use plugio::{spawn_blocking, LocalExecutor};
    ///
    /// let ex = LocalExecutor::builder().max_blocking_threads(1).build()?;
    /// let n = ex.run(async { spawn_blocking(|| 7).await.unwrap() });
    /// assert_eq!(n, 7);
    /// # Ok::<_, std::io::Error>(())
    /// ```
    pub fn max_blocking_threads(mut self, threads: usize) -> Self {
        self.pools.max_blocking_threads = threads.max(1);
        self
    }

    /// Threads of the executor's sync IO pool (see
    /// [`crate::Builder::sync_io_threads`]; default 4).
    ///
    /// ```
    /// use plugio::executor::{blocking::BlockingPool, LocalExecutor};
    ///
    /// let ex = LocalExecutor::builder().sync_io_threads(2).build()?;
    /// assert_eq!(ex.run(async { BlockingPool::current_sync_io().unwrap().max_threads() }), 2);
    /// # Ok::<_, std::io::Error>(())
    /// ```
    pub fn sync_io_threads(mut self, threads: usize) -> Self {
        self.pools.sync_io_threads = threads.max(1);
        self
    }

    /// Idle keep-alive of the pools' threads (see
    /// [`crate::Builder::blocking_keep_alive`]; default 10 s).
    ///
    /// ```
    /// use plugio::LocalExecutor;
    /// use std::time::Duration;
    ///
    /// let ex = LocalExecutor::builder().blocking_keep_alive(Duration::from_millis(50)).build()?;
    /// # drop(ex);
    /// # Ok::<_, std::io::Error>(())
    /// ```
    pub fn blocking_keep_alive(mut self, keep_alive: Duration) -> Self {
        self.pools.keep_alive = keep_alive;
        self
    }

    /// How to make the driver: called once, on the calling thread, with
    /// core index 0, by `build`. Default: [`ThreadDriver::new`].
    pub fn driver<F>(mut self, f: F) -> Self
    where
        F: FnOnce(usize) -> io::Result<Box<dyn Driver>> + 'static,
    {
        self.driver = Some(Box::new(f));
        self
    }

    /// Called once by `build`, before the driver is made, with index 0.
    pub fn on_thread_start<F: FnOnce(usize) + 'static>(mut self, f: F) -> Self {
        self.on_thread_start = Some(Box::new(f));
        self
    }

    /// Makes the executor on the calling thread.
    ///
    /// # Errors
    /// The driver factory's error.
    pub fn build(self) -> io::Result<LocalExecutor> {
        if let Some(hook) = self.on_thread_start {
            hook(0);
        }
        let driver = match self.driver {
            Some(f) => f(0)?,
            None => Box::new(ThreadDriver::new()),
        };
        let pools = Pools::new(&self.pools, "plugio-local");
        Ok(LocalExecutor {
            core: Box::new(Core::with_pools(0, driver, self.config, pools.clone())),
            _pools: PoolsOwner(pools),
        })
    }
}

impl fmt::Debug for LocalBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBuilder")
            .field("config", &self.config)
            .field("pools", &self.pools)
            .finish_non_exhaustive()
    }
}

/// A single-core executor on the calling thread, for tests and simple
/// programs: `LocalExecutor::builder().build()?.run(future)`.
///
/// It is `!Send`. Tasks spawned on it (with [`crate::spawn_local`] inside
/// `run`, or [`LocalExecutor::spawn_local`]) stay queued between calls to
/// `run` and are cancelled when the executor drops. It owns its blocking
/// and sync IO pools (see [`crate::blocking`]) and shuts them down when it
/// drops, after its core.
pub struct LocalExecutor {
    core: Box<Core>,
    /// Declared after `core`: dropped (pools shut down) after it.
    _pools: PoolsOwner,
}

/// Shuts the pools down when dropped.
struct PoolsOwner(Pools);

impl Drop for PoolsOwner {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

impl LocalExecutor {
    /// A builder with the defaults.
    pub fn builder() -> LocalBuilder {
        LocalBuilder {
            config: CoreConfig::default(),
            pools: PoolConfig::default(),
            driver: None,
            on_thread_start: None,
        }
    }

    /// An executor with the defaults and the [`ThreadDriver`].
    pub fn new() -> Self {
        let pools = Pools::new(&PoolConfig::default(), "plugio-local");
        LocalExecutor {
            core: Box::new(Core::with_pools(
                0,
                Box::new(ThreadDriver::new()),
                CoreConfig::default(),
                pools.clone(),
            )),
            _pools: PoolsOwner(pools),
        }
    }

    /// Runs ticks on the calling thread until `future` completes, and
    /// returns its output. Spawned tasks run meanwhile.
    ///
    /// # Panics
    /// When called on a plugio core (including from inside this executor's
    /// own tasks). Re-raises a panic of `future` itself (task panics go to
    /// their `JoinHandle`s).
    pub fn run<F: Future>(&self, future: F) -> F::Output {
        assert!(
            !Core::is_inside_core(),
            "LocalExecutor::run called on a plugio core; await the future instead"
        );
        match self.core.block_on(future, &|_| false) {
            Some(out) => out,
            None => unreachable!("the stop condition of LocalExecutor::run is never true"),
        }
    }

    /// One tick, then return: for embedders that drive plugio from their
    /// own loop (a C plug-in such as a fio ioengine, a foreign event loop)
    /// instead of handing the thread to [`LocalExecutor::run`].
    ///
    /// It runs one tick (remote wakes, expired timers, one batch of ready
    /// tasks, the tick-end hooks: the engine's plug flush), then parks the
    /// driver without blocking: what the tick queued (the engine's SQEs) is
    /// submitted, and the events already there are collected (for the
    /// io_uring driver, the completions in the CQ, which wake their tasks
    /// for the next call), in one `io_uring_enter` at most. So an event
    /// that arrives between two calls runs its task in the call after the
    /// next one (the first collects it after its tick). It never waits;
    /// [`LocalExecutor::run_once_timeout`] waits for an event first.
    ///
    /// Returns `true` when more work is ready at once (a task is queued, a
    /// remote wake arrived, or a tick-end hook reported pending work), so
    /// calling again would make progress without waiting; `false` when the
    /// executor would now wait for an event (an IO completion, a timer, a
    /// wake from another thread).
    ///
    /// Tasks spawned with [`LocalExecutor::spawn_local`] before the call run
    /// in its tick; tasks spawned inside it (and tasks woken by the tick's
    /// own hooks) run in the next call.
    ///
    /// ```
    /// use std::cell::Cell;
    /// use std::rc::Rc;
    /// use plugio::{yield_now, LocalExecutor};
    ///
    /// let ex = LocalExecutor::new();
    /// let steps = Rc::new(Cell::new(0));
    /// let s = steps.clone();
    /// let task = ex.spawn_local(async move {
    ///     for _ in 0..3 {
    ///         s.set(s.get() + 1);
    ///         yield_now().await;
    ///     }
    /// });
    /// // The embedder's loop: one tick per call, until the task is done.
    /// assert!(ex.run_once(), "the task yielded: it is ready again");
    /// assert_eq!(steps.get(), 1);
    /// while ex.run_once() {}
    /// assert_eq!(steps.get(), 3);
    /// assert!(task.is_finished());
    /// ```
    ///
    /// # Panics
    /// When called on a plugio core (from inside a task of this or another
    /// executor). A panic of a task goes to its `JoinHandle`, as in `run`.
    pub fn run_once(&self) -> bool {
        self.run_once_timeout(Some(Duration::ZERO))
    }

    /// Like [`LocalExecutor::run_once`], but first waits up to `timeout`
    /// for an event when nothing is ready (`None`: without limit, as `run`
    /// does; the nearest timer still ends the wait). The wait is the
    /// driver's park (for the io_uring driver, one `io_uring_enter` that
    /// submits and waits for completions); it returns early on an event, a
    /// wake from another thread, or a timer, and does not wait at all while
    /// a task is ready (it still collects the events already there). Then
    /// one tick runs and what it queued is submitted, as in `run_once`. A
    /// zero `timeout` is `run_once`: no park before the tick. Nor does the
    /// first call after an [`enter`](LocalExecutor::enter) that left work
    /// for a tick-end hook ([`TickHook::has_pending`](crate::TickHook::has_pending)) wait before its
    /// tick: an IO polled inside `enter` sits in the core's plug until a
    /// tick ends, and no event could end a wait for it.
    ///
    /// A loop that needs `n` completions calls this until it has them, with
    /// the time it has left:
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use plugio::{sleep, LocalExecutor};
    ///
    /// let ex = LocalExecutor::new();
    /// let timer = ex.spawn_local(sleep(Duration::from_millis(5)));
    /// let deadline = Instant::now() + Duration::from_secs(10);
    /// while !timer.is_finished() {
    ///     let left = deadline.saturating_duration_since(Instant::now());
    ///     assert!(!left.is_zero(), "the timer did not fire");
    ///     // Sleeps until the timer (not a busy loop), then runs its task.
    ///     ex.run_once_timeout(Some(left));
    /// }
    /// ```
    ///
    /// # Panics
    /// As [`LocalExecutor::run_once`].
    pub fn run_once_timeout(&self, timeout: Option<Duration>) -> bool {
        assert!(
            !Core::is_inside_core(),
            "LocalExecutor::run_once called on a plugio core; await the future instead"
        );
        self.core.run_once(timeout)
    }

    /// Runs `f` with this executor's core current on the calling thread,
    /// without running a tick: for embedders that poll plugio futures
    /// themselves between [`LocalExecutor::run_once`] calls (the fio
    /// ioengine starts the IOs of a batch this way in its `commit` hook,
    /// with no task to hand them to). Inside `f`, IO futures can be polled
    /// (an IO joins the core's plug; the next tick's end flushes it, and
    /// the next `run_once_timeout` runs that tick before it waits) and
    /// [`spawn_local`](crate::spawn_local) spawns onto this core. Nothing
    /// runs by itself: wakes queue tasks for the next tick. `f` gets a
    /// fresh coop budget, as a task poll does. The idea is tokio's
    /// `Runtime::enter`, for one core; it takes a closure rather than
    /// returning a guard, so the core cannot stay current after the
    /// executor is gone (a guard could be leaked with `mem::forget`).
    ///
    /// ```
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::task::{Context, Poll, Waker};
    /// use plugio::executor::{core_uid, yield_now, LocalExecutor};
    ///
    /// let ex = LocalExecutor::new();
    /// assert_eq!(core_uid(), None);
    /// let mut fut = pin!(yield_now());
    /// let mut cx = Context::from_waker(Waker::noop());
    /// let first = ex.enter(|| {
    ///     assert!(core_uid().is_some());
    ///     // Polled by the embedder, not by a task.
    ///     fut.as_mut().poll(&mut cx)
    /// });
    /// assert!(first.is_pending());
    /// assert_eq!(core_uid(), None);
    /// assert!(fut.as_mut().poll(&mut cx).is_ready());
    /// ```
    ///
    /// # Panics
    /// When called on a plugio core (inside a task, inside `run`, or inside
    /// another `enter`); `run`, `run_once` and `run_once_timeout` panic
    /// inside `f`. A panic of `f` leaves the thread with no core current,
    /// and goes on.
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        assert!(
            !Core::is_inside_core(),
            "LocalExecutor::enter called on a plugio core (inside a task, `run`, or another `enter`)"
        );
        let _core = self.core.enter_fresh();
        let out = f();
        self.core.note_hook_work();
        out
    }

    /// Queues a `!Send` future; it runs during the next [`LocalExecutor::run`]
    /// or [`LocalExecutor::run_once`].
    pub fn spawn_local<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        self.core.spawn_local(future)
    }

    /// The executor's tick statistics.
    pub fn tick_stats(&self) -> TickStats {
        self.core.stats()
    }
}

impl Default for LocalExecutor {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LocalExecutor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalExecutor")
            .field("stats", &self.tick_stats())
            .finish()
    }
}
