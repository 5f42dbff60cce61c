//! One core: its run queues, owned tasks, timers, hooks, driver, and the
//! tick loop; plus the free functions that reach the current core.
//!
//! # Invariants
//!
//! - A `Core` lives on one thread and never moves while it is entered
//!   (`CURRENT` points at it only through an [`EnterGuard`] that borrows it).
//! - The local run queue is FIFO; one tick polls at most the tasks that were
//!   queued when the batch started (capped by the task budget), so a task
//!   that wakes itself runs again in the next tick, after the others.
//! - The local run queue lives in `CoreShared` (so that a waker reaches it
//!   from the task header, without a thread-local lookup) but only the
//!   core's thread touches it, and never while a reference into it is held
//!   across a call: push, pop, length and take are single short calls
//!   (`LocalQueue`, in `task/raw.rs`). The thread-local current core uid
//!   (`sync::current_uid`) equals `CoreShared::uid` exactly while the core
//!   is entered on its thread, which is what makes a wake "local".
//! - The core never blocks in `Driver::park` while its run queue is
//!   non-empty, a tick-end hook reported pending work, the main future was
//!   woken, or its remote queue is non-empty (checked after
//!   `ParkGate::prepare_park`'s fence, see `remote`).
//! - After `close`, nothing runs on the core again; tasks that still reach
//!   its remote queue are cancelled by whoever pushed them.

use crate::coop::{Budget, BudgetGuard};
use crate::driver::Driver;
use crate::owned::OwnedTasks;
#[cfg(test)]
use crate::pools::PoolConfig;
use crate::pools::{BlockingPool, Pools};
use crate::stats::TickStats;
use crate::sync::{fence, set_current_uid, AtomicBool};
use crate::task::{
    adopt_remote, detach_all, new_local_task, CoreShared, JoinHandle, LocalRef, Snapshot,
    SHUTDOWN_DRAIN, SHUTDOWN_NONE, UNREGISTERED,
};
use crate::timers::TimerQueue;
use std::cell::{Cell, OnceCell, RefCell};
use std::future::Future;
use std::pin::pin;
use std::ptr;
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// Work a core does at the end of every tick, after the batch of ready
/// tasks and before it parks (the engine flushes its plug here).
pub trait TickHook {
    /// Called once per tick on the core's thread. Return `true` when work
    /// is still pending (e.g. queued SQEs or a non-empty plug): the core
    /// then does not block in its next park (it only polls the driver with a
    /// zero timeout) and ticks again. The hook may wake or spawn tasks; the
    /// core re-checks its run queue afterwards.
    fn tick_end(&self) -> bool;

    /// Whether the hook holds work that only its next
    /// [`tick_end`](TickHook::tick_end) moves on (the engine's non-empty
    /// plug). Asked after an embedder's `LocalExecutor::enter`: when a hook
    /// says so, the next `run_once_timeout` ticks before it waits, since no
    /// event would end that wait. The default is `false`.
    fn has_pending(&self) -> bool {
        false
    }

    /// Called once as the core closes (its executor dropped or shut
    /// down), on its thread, after every task was cancelled and before
    /// the driver is dropped: work the hook still holds will never be
    /// moved on by a tick (the engine ends the IO it never sent, so the
    /// buffers of the cancelled tasks' IO are freed now rather than at
    /// the thread's exit). The default does nothing.
    fn core_closing(&self) {}
}

/// Tuning of one core.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CoreConfig {
    pub(crate) task_budget: usize,
    pub(crate) coop_budget: u32,
}

/// The default task budget (task polls per tick).
pub const DEFAULT_TASK_BUDGET: usize = 256;
/// The default coop budget (ready resource polls per task poll).
pub const DEFAULT_COOP_BUDGET: u32 = 128;

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            task_budget: DEFAULT_TASK_BUDGET,
            coop_budget: DEFAULT_COOP_BUDGET,
        }
    }
}

static NEXT_CORE_UID: AtomicU64 = AtomicU64::new(1);

/// The main future's waker: a flag plus the park handshake.
pub(crate) struct MainWake {
    woken: AtomicBool,
    shared: Arc<CoreShared>,
}

impl Wake for MainWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // AcqRel: Release publishes what the waker did to the main future's
        // AcqRel swap back to false.
        if !self.woken.swap(true, AcqRel) && self.shared.gate.needs_unpark() {
            self.shared.unparker.unpark();
        }
    }
}

thread_local! {
    static CURRENT: Cell<*const Core> = const { Cell::new(ptr::null()) };
}

/// Runs `f` with the current core, or returns `None` off a core.
#[inline]
pub(crate) fn try_with_current<R>(f: impl FnOnce(&Core) -> R) -> Option<R> {
    let core = CURRENT.try_with(Cell::get).ok()?;
    if core.is_null() {
        return None;
    }
    // SAFETY: `CURRENT` is non-null only while an `EnterGuard` borrows the
    // core on this thread, so the pointer is valid and the core unmoved.
    Some(f(unsafe { &*core }))
}

fn with_current<R>(what: &str, f: impl FnOnce(&Core) -> R) -> R {
    match try_with_current(f) {
        Some(r) => r,
        None => panic!("{what} must be called on a plugio core (inside Runtime or LocalExecutor)"),
    }
}

/// Restores the previous `CURRENT` on drop.
pub(crate) struct EnterGuard<'a> {
    prev: *const Core,
    prev_uid: u64,
    /// The core's coop budget, current while the core is (restored after
    /// `CURRENT` by field order: fields drop after `drop`).
    _budget: BudgetGuard<'a>,
    _core: &'a Core,
}

impl Drop for EnterGuard<'_> {
    fn drop(&mut self) {
        let prev = self.prev;
        let _ = CURRENT.try_with(|c| c.set(prev));
        set_current_uid(self.prev_uid);
    }
}

/// One core's thread-local state. See the module invariants.
pub(crate) struct Core {
    /// True while the tick-end hooks run (see [`in_tick_hooks`]).
    in_hooks: Cell<bool>,
    /// An embedder's `enter` left work that only a tick-end hook moves on
    /// (an IO in the engine's plug; `TickHook::has_pending`), so the next
    /// `run_once` ticks before it waits.
    hook_work_after_enter: Cell<bool>,
    /// Unique for the life of the process (a new executor on the same
    /// thread gets a new one).
    uid: u64,
    pub(crate) shared: Arc<CoreShared>,
    owned: RefCell<OwnedTasks>,
    pub(crate) timers: RefCell<TimerQueue>,
    fired: RefCell<Vec<Waker>>,
    hooks: RefCell<Vec<Rc<dyn TickHook>>>,
    driver: Box<dyn Driver>,
    config: CoreConfig,
    budget: Budget,
    stats: Cell<TickStats>,
    main_wake: Arc<MainWake>,
    drain_deadline: Cell<Option<Instant>>,
    /// Every core of the runtime this one belongs to, set once when the
    /// runtime has started them all (unset in a `LocalExecutor`): what
    /// `Handle::current` is made of.
    pub(crate) runtime_cores: OnceCell<Arc<[Arc<CoreShared>]>>,
    /// The blocking and sync IO pools of the runtime (or local executor)
    /// this core belongs to; their owner shuts them down.
    pub(crate) pools: Pools,
    #[cfg(test)]
    pub(crate) timer_checks: RefCell<Vec<(u64, Instant)>>,
}

impl Core {
    /// Creates core `index` around `driver`, on the thread that will run
    /// it, with pools of its own (default sizes; threads start on use).
    #[cfg(test)]
    pub(crate) fn new(index: usize, driver: Box<dyn Driver>, config: CoreConfig) -> Core {
        let pools = Pools::new(&PoolConfig::default(), "plugio-test");
        Self::with_pools(index, driver, config, pools)
    }

    /// Creates core `index` around `driver`, on the thread that will run
    /// it, sharing its owner's `pools`.
    pub(crate) fn with_pools(
        index: usize,
        driver: Box<dyn Driver>,
        config: CoreConfig,
        pools: Pools,
    ) -> Core {
        // Relaxed: a unique id, no data hangs on it.
        let core_uid = NEXT_CORE_UID.fetch_add(1, Relaxed);
        driver.attach(core_uid);
        let shared = Arc::new(CoreShared::new(index, core_uid, driver.unparker()));
        Core {
            in_hooks: Cell::new(false),
            hook_work_after_enter: Cell::new(false),
            uid: core_uid,
            main_wake: Arc::new(MainWake {
                woken: AtomicBool::new(false),
                shared: shared.clone(),
            }),
            shared,
            owned: RefCell::new(OwnedTasks::default()),
            timers: RefCell::new(TimerQueue::new(core_uid)),
            fired: RefCell::new(Vec::new()),
            hooks: RefCell::new(Vec::new()),
            driver,
            config,
            budget: Budget::new(config.coop_budget),
            stats: Cell::new(TickStats::default()),
            drain_deadline: Cell::new(None),
            runtime_cores: OnceCell::new(),
            pools,
            #[cfg(test)]
            timer_checks: RefCell::new(Vec::new()),
        }
    }

    /// Makes this core the thread's current one until the guard drops.
    pub(crate) fn enter(&self) -> EnterGuard<'_> {
        let prev = CURRENT.with(|c| c.replace(self));
        let prev_uid = set_current_uid(self.uid);
        EnterGuard {
            prev,
            prev_uid,
            _budget: self.budget.enter(),
            _core: self,
        }
    }

    /// [`Core::enter`] with the coop budget refilled (as before a task
    /// poll): for an embedder's own polls (`LocalExecutor::enter`), which
    /// would otherwise inherit what the last task left of it.
    pub(crate) fn enter_fresh(&self) -> EnterGuard<'_> {
        self.budget.reset(self.config.coop_budget);
        self.enter()
    }

    /// After an embedder's `enter`: notes whether a tick-end hook now
    /// holds work (see `hook_work_after_enter`).
    pub(crate) fn note_hook_work(&self) {
        if self.hooks.borrow().iter().any(|h| h.has_pending()) {
            self.hook_work_after_enter.set(true);
        }
    }

    /// Whether some core is current on this thread.
    pub(crate) fn is_inside_core() -> bool {
        try_with_current(|_| ()).is_some()
    }

    pub(crate) fn stats(&self) -> TickStats {
        self.stats.get()
    }

    /// Spawns `future` on this core (the caller is on its thread).
    pub(crate) fn spawn_local<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        // Relaxed: `closed` is only set by this thread.
        debug_assert!(!self.shared.closed.load(Relaxed));
        // SAFETY: we are the core's thread (`Core` is `!Send`) and the core
        // is not closed (it only closes when dropped).
        let (task, join) = unsafe { new_local_task(future, self.shared.clone()) };
        // SAFETY: we are the owner thread; the task is new.
        unsafe { self.owned.borrow_mut().insert(task.clone()) };
        // SAFETY: core thread.
        unsafe { self.shared.run_queue.push(task) };
        JoinHandle::new(join)
    }

    /// Runs ticks until `main` completes (returns its output) or `stop`
    /// says so (returns `None`).
    pub(crate) fn block_on<F: Future>(
        &self,
        main: F,
        stop: &dyn Fn(&Core) -> bool,
    ) -> Option<F::Output> {
        let _enter = self.enter();
        let mut main = pin!(main);
        let waker = Waker::from(self.main_wake.clone());
        let mut cx = Context::from_waker(&waker);
        // Relaxed: same thread.
        self.main_wake.woken.store(true, Relaxed);
        loop {
            // Relaxed load first, so that a tick with no main wake costs no
            // RMW; AcqRel swap: pairs with the waker's AcqRel swap. A wake
            // the load misses is seen by the next iteration or by `park`.
            if self.main_wake.woken.load(Relaxed) && self.main_wake.woken.swap(false, AcqRel) {
                self.budget.reset(self.config.coop_budget);
                if let Poll::Ready(out) = main.as_mut().poll(&mut cx) {
                    self.send_last_poll();
                    return Some(out);
                }
            }
            if stop(self) {
                return None;
            }
            let hook_pending = self.tick();
            // Checked again before blocking: the batch may have finished
            // the last task a draining shutdown waits for.
            if stop(self) {
                return None;
            }
            self.park_and_count(hook_pending, None);
        }
    }

    /// What the main future's last poll left for the hooks (the engine's
    /// plug: IO it issued and then dropped or left to a task) goes to the
    /// driver before `block_on` returns, as at the end of any tick: it sat
    /// in the plug, its buffers held, until another executor on the thread
    /// or the thread's exit (found by a break-it helper).
    fn send_last_poll(&self) {
        if self.hooks.borrow().iter().any(|h| h.has_pending()) {
            self.run_hooks();
            // Not blocking: submits what the hooks queued.
            self.park(true, Some(Duration::ZERO));
        }
    }

    /// One tick for an embedder that drives the core from its own loop
    /// (`LocalExecutor::run_once`): a park that waits at most `wait` (and
    /// not at all while work is ready; skipped when `wait` is zero), the
    /// tick, then a park that does not block, so that what the tick queued for the driver (the
    /// engine's SQEs) is submitted before returning. Returns whether work
    /// is ready at once: a task in the run queue, a remote wake, or a hook
    /// that reported pending work.
    pub(crate) fn run_once(&self, wait: Option<Duration>) -> bool {
        let _enter = self.enter();
        // No main future here: a wake of the last `block_on`'s main future
        // must not keep every later park from waiting.
        // Relaxed: same-thread flag; the waker's wake is seen by `park`.
        self.main_wake.woken.store(false, Relaxed);
        // The first park only waits: the last call's second park submitted
        // what its tick queued and collected what was there. A call that
        // does not wait skips it, so that one call is one enter (an embedder
        // such as the fio engine commits a batch with one `run_once`); what
        // completed since is collected by the park after the tick. So does
        // the first call after an `enter` that left work for a hook: what
        // the embedder started there (an IO in the engine's plug) goes out
        // at this tick's end, and nothing would end a wait for it before.
        let hook_work = self.hook_work_after_enter.replace(false);
        if wait != Some(Duration::ZERO) && !hook_work {
            self.park_and_count(false, wait);
        }
        let hook_pending = self.tick();
        self.park_and_count(hook_pending, Some(Duration::ZERO));
        // SAFETY: core thread.
        let queued = unsafe { self.shared.run_queue.len() };
        hook_pending || queued != 0 || !self.shared.remote.is_empty()
    }

    /// One tick up to the park: remote wakes, timers, the ready batch,
    /// hooks. Returns whether a hook reported pending work.
    fn tick(&self) -> bool {
        self.hook_work_after_enter.set(false);
        let mut stats = self.stats.get();
        stats.ticks += 1;
        // Published early so tasks see the number of the tick they run in.
        self.stats.set(stats);
        stats.remote_wakes += self.adopt_remote();
        stats.timers_fired += self.fire_timers(stats.ticks);
        // SAFETY: core thread.
        let batch = unsafe { self.shared.run_queue.len() }.min(self.config.task_budget);
        for _ in 0..batch {
            // SAFETY: core thread.
            let Some(task) = (unsafe { self.shared.run_queue.pop() }) else {
                break;
            };
            self.run_task(task);
        }
        stats.tasks_polled += batch as u64;
        stats.last_tick_tasks_polled = batch as u64;
        stats.max_tick_tasks_polled = stats.max_tick_tasks_polled.max(batch as u64);
        let hook_pending = self.run_hooks();
        if hook_pending {
            stats.hook_pending_ticks += 1;
        }
        self.stats.set(stats);
        hook_pending
    }

    /// Parks (see `park`; `cap` bounds the wait, `None` leaves it to the
    /// timers), counts it, and publishes the tick's statistics.
    fn park_and_count(&self, hook_pending: bool, cap: Option<Duration>) {
        // Published before the park, so other threads see the tick that
        // just ran while this core sleeps (they saw it only once the next
        // park ended, never for an idle core: found by an API audit
        // helper); a blocking park publishes its count again after.
        self.shared.stats.store(&self.stats.get());
        if self.park(hook_pending, cap) {
            let mut stats = self.stats.get();
            stats.parks += 1;
            self.stats.set(stats);
            self.shared.stats.store(&stats);
        }
    }

    fn fire_timers(&self, tick: u64) -> u64 {
        let now = Instant::now();
        #[cfg(test)]
        self.timer_checks.borrow_mut().push((tick, now));
        let _ = tick;
        let mut fired = self.fired.take();
        let count = self.timers.borrow_mut().fire_expired(now, &mut fired);
        for waker in fired.drain(..) {
            waker.wake();
        }
        self.fired.replace(fired);
        count
    }

    /// Moves the tasks other threads woke (or spawned) into the local run
    /// queue; returns how many wakes that was.
    fn adopt_remote(&self) -> u64 {
        let mut woken = 0;
        for node in self.shared.remote.take_all() {
            // SAFETY: core thread, not closed (a closed core never ticks);
            // the node came out of our remote queue.
            woken += u64::from(unsafe { adopt_remote(node) });
        }
        woken
    }

    #[inline]
    fn run_task(&self, task: LocalRef) {
        // SAFETY: core thread; just popped from the local queue.
        let state = unsafe { task.load_for_run() };
        // The common case, tested at once: a registered task, with no
        // remote wake to serve, neither complete nor cancelled, is polled
        // (`start_run` would have returned `state` unchanged).
        if state.is_notified_complete_or_cancel_requested() || task.owned_slot() == UNREGISTERED {
            return self.run_task_slow(task, state);
        }
        self.budget.reset(self.config.coop_budget);
        // SAFETY: owner thread; `state` shows `COMPLETE` clear.
        if unsafe { task.poll() } {
            let slot = task.owned_slot();
            // SAFETY: owner thread.
            let removed = unsafe { self.owned.borrow_mut().remove(slot) };
            drop(removed);
        }
    }

    /// `run_task` of a task with a remote wake to serve, complete,
    /// cancelled or not yet registered (`state`: what `load_for_run`
    /// returned).
    #[inline(never)]
    fn run_task_slow(&self, task: LocalRef, state: Snapshot) {
        // The rest of `start_run`.
        let state = if state.is_notified() {
            task.serve_remote_wake()
        } else {
            state
        };
        if state.is_complete() {
            return;
        }
        if task.owned_slot() == UNREGISTERED {
            // SAFETY: owner thread; unregistered.
            unsafe { self.owned.borrow_mut().insert(task.clone()) };
        }
        let done = if state.is_cancel_requested() {
            // SAFETY: owner thread.
            unsafe { task.cancel() };
            true
        } else {
            self.budget.reset(self.config.coop_budget);
            // SAFETY: owner thread; `state` shows `COMPLETE` clear.
            unsafe { task.poll() }
        };
        if done {
            let slot = task.owned_slot();
            // SAFETY: owner thread.
            let removed = unsafe { self.owned.borrow_mut().remove(slot) };
            drop(removed);
        }
    }

    fn run_hooks(&self) -> bool {
        /// Clears `in_hooks` on the way out, an unwind included (a hook
        /// that panicked left it set: found by a break-it helper).
        struct InHooks<'a>(&'a Cell<bool>);
        impl Drop for InHooks<'_> {
            fn drop(&mut self) {
                self.0.set(false);
            }
        }
        let mut pending = false;
        let mut i = 0;
        self.in_hooks.set(true);
        let _in_hooks = InHooks(&self.in_hooks);
        loop {
            let hook = match self.hooks.borrow().get(i) {
                Some(h) => h.clone(),
                None => break,
            };
            pending |= hook.tick_end();
            i += 1;
        }
        pending
    }

    /// Parks the driver, for at most `cap` when given (`None`: until the
    /// nearest timer, or an event); returns true when it was a blocking
    /// park.
    fn park(&self, hook_pending: bool, cap: Option<Duration>) -> bool {
        // Relaxed: same-thread flag (remote wakers are handled below).
        let must_poll = hook_pending
            // SAFETY: core thread.
            || unsafe { self.shared.run_queue.len() } != 0
            || self.main_wake.woken.load(Relaxed)
            || !self.shared.remote.is_empty();
        let mut timeout = if must_poll {
            Some(Duration::ZERO)
        } else {
            let next = self.timers.borrow_mut().next_deadline();
            let next = match (next, self.drain_deadline.get()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let until_timer = next.map(|d| d.saturating_duration_since(Instant::now()));
            match (until_timer, cap) {
                (Some(t), Some(c)) => Some(t.min(c)),
                (t, c) => t.or(c),
            }
        };
        let blocking = timeout != Some(Duration::ZERO);
        if blocking {
            self.shared.gate.prepare_park();
            // Relaxed: ordered by prepare_park's SeqCst fence (Dekker with
            // the wakers' fences).
            if self.main_wake.woken.load(Relaxed) || !self.shared.remote.is_empty() {
                timeout = Some(Duration::ZERO);
            }
        }
        tracing::trace!(core = self.shared.index, ?timeout, "park");
        if let Err(err) = self.driver.park(timeout) {
            tracing::error!(core = self.shared.index, %err, "driver park failed");
        }
        if blocking {
            self.shared.gate.finish_park();
        }
        blocking && timeout != Some(Duration::ZERO)
    }

    /// The runtime's stop condition, checked once per tick.
    pub(crate) fn should_stop(&self) -> bool {
        // Acquire: pairs with the Release in `request_shutdown`.
        match self.shared.shutdown.load(Acquire) {
            SHUTDOWN_NONE => false,
            SHUTDOWN_DRAIN => {
                let deadline = self.shared.drain_deadline.lock().ok().and_then(|d| *d);
                self.drain_deadline.set(deadline);
                let idle = self.owned.borrow().len() == 0
                    // SAFETY: core thread.
                    && unsafe { self.shared.run_queue.len() } == 0
                    && self.shared.remote.is_empty();
                idle || deadline.is_some_and(|d| Instant::now() >= d)
            }
            _ => true,
        }
    }

    /// Registers a tick-end hook.
    pub(crate) fn register_hook(&self, hook: Rc<dyn TickHook>) {
        self.hooks.borrow_mut().push(hook);
    }

    /// Removes a hook (by pointer identity); true if it was registered.
    pub(crate) fn unregister_hook(&self, hook: &Rc<dyn TickHook>) -> bool {
        let mut hooks = self.hooks.borrow_mut();
        let before = hooks.len();
        hooks.retain(|h| !ptr::addr_eq(Rc::as_ptr(h), Rc::as_ptr(hook)));
        hooks.len() != before
    }

    /// Cancels every task the core still has, then closes it: later remote
    /// wakes and spawns cancel their task themselves.
    pub(crate) fn close(&self) {
        if self.shared.closed.load(Relaxed) {
            return;
        }
        let enter = self.enter();
        debug_assert!(!ptr::eq(enter.prev, self), "close of an entered core");
        loop {
            // SAFETY: owner thread.
            let owned = unsafe { self.owned.borrow_mut().drain() };
            self.adopt_remote();
            // SAFETY: core thread.
            let queued = unsafe { self.shared.run_queue.take() };
            if owned.is_empty() && queued.is_empty() {
                // The hooks and the fired timers' wakers go last, still on
                // the entered core: dropping them may wake or spawn tasks,
                // which the next round cancels (no local reference may be
                // left in the run queue once the tasks are detached).
                let hooks = self.hooks.take();
                let fired = self.fired.take();
                if hooks.is_empty() && fired.is_empty() {
                    break;
                }
                for hook in &hooks {
                    hook.core_closing();
                }
                drop((hooks, fired));
                continue;
            }
            tracing::debug!(
                core = self.shared.index,
                owned = owned.len(),
                queued = queued.len(),
                "cancelling tasks"
            );
            for task in &queued {
                // The state read does not matter: every task is cancelled
                // below (a no-op on completed ones).
                // SAFETY: core thread; out of the local queue, so its local
                // wake flag goes (keeps the flag's invariant).
                let _ = unsafe { task.start_run() };
            }
            for task in owned.iter().chain(queued.iter()) {
                // SAFETY: owner thread; cancel is a no-op on completed tasks.
                unsafe { task.cancel() };
            }
        }
        self.shared.stats.store(&self.stats.get());
        // SAFETY: core thread.
        debug_assert!(unsafe { self.shared.run_queue.len() } == 0);
        // SAFETY: core thread; the run queue and the slab are empty, and
        // leaving the core right after means this thread never touches the
        // local state of these tasks again (the uid is never current again).
        unsafe { detach_all(&self.shared.groups) };
        debug_assert!(self.shared.groups.is_empty());
        drop(enter);
        // SeqCst store and fence: pair with the fence in `push_remote`.
        self.shared.closed.store(true, SeqCst);
        fence(SeqCst);
        self.shared.cancel_remote();
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        self.close();
    }
}

/// Spawns a `!Send` future on the current core. It runs only on this core's
/// thread; the returned handle yields its output.
///
/// # Panics
/// Off a plugio core.
pub fn spawn_local<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    with_current("spawn_local", |core| core.spawn_local(future))
}

/// Spawns a `Send` future on the current core (it stays on this core; use
/// [`plugio::executor::Handle::spawn_on`](crate::Handle::spawn_on) to
/// place work on another core).
///
/// # Panics
/// Off a plugio core.
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    with_current("spawn", |core| core.spawn_local(future))
}

/// The current core's index (0-based), or `None` off a plugio core. A
/// [`crate::LocalExecutor`] is core 0. Each core is one OS thread for its
/// whole life, so per-core state can live in a `thread_local!` (or in a
/// map keyed by this index).
pub fn core_id() -> Option<usize> {
    try_with_current(|core| core.shared.index)
}

/// Whether the current core is running its tick-end hooks right now. A
/// hook that batches work until the end of the tick (the engine's plug)
/// uses it to act at once on work queued by a hook that runs after it:
/// nothing else would flush that work before the core parks.
#[inline]
pub fn in_tick_hooks() -> bool {
    try_with_current(|core| core.in_hooks.get()).unwrap_or(false)
}

/// A process-unique id of the current core, or `None` off a plugio core.
/// Unlike [`core_id`], it differs between two executors run one after the
/// other on the same thread, so per-core state kept in a `thread_local!`
/// can tell that it belongs to an executor that is gone (its hooks
/// went with it) and must be rebuilt. (Inline: the engine reads it once or
/// twice per IO, from another crate.)
#[inline]
pub fn core_uid() -> Option<u64> {
    try_with_current(|core| core.uid)
}

/// Registers `hook` on the current core; it is called at the end of every
/// tick (see [`TickHook`]) until the core stops.
///
/// # Panics
/// Off a plugio core.
pub fn register_tick_hook(hook: Rc<dyn TickHook>) {
    with_current("register_tick_hook", |core| core.register_hook(hook))
}

/// Removes `hook` (the same `Rc`, compared by address) from the current
/// core's tick-end hooks, so the core drops its reference. Returns whether
/// it was registered; `false` off a plugio core. Removing a hook while the
/// hooks of a tick run may skip the next hook for that one tick.
pub fn unregister_tick_hook(hook: &Rc<dyn TickHook>) -> bool {
    try_with_current(|core| core.unregister_hook(hook)).unwrap_or(false)
}

/// The current core's tick statistics, or `None` off a plugio core.
pub fn tick_stats() -> Option<TickStats> {
    try_with_current(Core::stats)
}

/// Yields once: the task goes to the back of the run queue and runs again
/// in the next tick, after every other task that is ready.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Runs `f` on the current runtime's blocking pool and returns a handle
/// that yields its result; await it on any core (or block on it from any
/// thread). Use it for calls that would stall the core: `std::fs` walks,
/// DNS, compression of a large block, a C library that blocks.
///
/// The pool is bounded (default [`DEFAULT_MAX_BLOCKING_THREADS`](crate::blocking::DEFAULT_MAX_BLOCKING_THREADS), set with
/// [`Builder::max_blocking_threads`](crate::Builder::max_blocking_threads)
/// or [`LocalBuilder::max_blocking_threads`](crate::LocalBuilder::max_blocking_threads));
/// when all its threads are busy, `f` waits in the pool's queue for the
/// first to free. The runtime's IO never waits behind it: the sync IO
/// backend has its own pool (see [`crate::blocking`]).
///
/// The handle gives `Err(JoinError::Panic(_))` if `f` panicked, and
/// `Err(JoinError::Cancelled)` if it was aborted or the runtime shut down
/// first. Aborting the handle does not stop `f` once it started (a thread
/// cannot be interrupted); its result is then dropped.
///
/// Off a plugio core there is no runtime to own the thread, so this
/// panics, like [`crate::spawn`]: call it from a task, or from outside
/// through [`Handle::spawn_on`](crate::Handle::spawn_on):
/// `handle.spawn_on(0, async { spawn_blocking(f).await })`.
///
/// Idea: tokio's `spawn_blocking`.
///
/// ```
/// use plugio::{spawn_blocking, LocalExecutor};
///
/// let ex = LocalExecutor::new();
/// let sum = ex.run(async {
///     spawn_blocking(|| (1..=100u64).sum::<u64>()).await
/// })?;
/// assert_eq!(sum, 5050);
/// # Ok::<_, plugio::executor::JoinError>(())
/// ```
///
/// # Panics
/// Off a plugio core (see above), or when the OS refuses to start the
/// pool's first thread.
pub fn spawn_blocking<F, R>(f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let Some(pool) = BlockingPool::current() else {
        panic!(
            "spawn_blocking must be called on a plugio core (inside Runtime or LocalExecutor); \
             from another thread use Handle::spawn_on(core, async {{ spawn_blocking(f).await }})"
        );
    };
    let (tx, rx) = futures::channel::oneshot::channel();
    let job = move || {
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        // The receiver is gone when the handle was aborted or the runtime
        // stopped: the result is dropped here, on the pool thread.
        let _ = tx.send(out);
    };
    if let Err(e) = pool.execute(job) {
        panic!("spawn_blocking: {e}");
    }
    spawn(async move {
        match rx.await {
            Ok(Ok(out)) => out,
            Ok(Err(payload)) => std::panic::resume_unwind(payload),
            // The pool dropped the job without running it. At shutdown the
            // core cancelled this task before (the owner stops its cores
            // first), so only a pool that lost its last thread gets here.
            Err(_) => {
                panic!("spawn_blocking: the blocking pool dropped the job (no thread to run it)")
            }
        }
    })
}

/// The pools of the calling core's runtime. Defined here, beside the
/// core that holds them, so that the pools' module does not import the
/// core (the core starts and stops the pools).
impl BlockingPool {
    /// The blocking pool of the runtime the calling core belongs to (what
    /// [`spawn_blocking`] uses); `None` off a plugio core.
    ///
    /// ```
    /// use plugio::executor::blocking::{BlockingPool, DEFAULT_MAX_BLOCKING_THREADS};
    /// use plugio::LocalExecutor;
    ///
    /// assert!(BlockingPool::current().is_none());
    /// let ex = LocalExecutor::new();
    /// let max = ex.run(async { BlockingPool::current().map(|p| p.max_threads()) });
    /// assert_eq!(max, Some(DEFAULT_MAX_BLOCKING_THREADS));
    /// ```
    pub fn current() -> Option<BlockingPool> {
        try_with_current(|core| core.pools.blocking.clone())
    }

    /// The sync IO pool of the runtime the calling core belongs to (where
    /// the device crate's sync backend runs its calls); `None` off a plugio
    /// core.
    ///
    /// ```
    /// use plugio::executor::blocking::{BlockingPool, DEFAULT_SYNC_IO_THREADS};
    /// use plugio::LocalExecutor;
    ///
    /// let ex = LocalExecutor::new();
    /// let max = ex.run(async { BlockingPool::current_sync_io().map(|p| p.max_threads()) });
    /// assert_eq!(max, Some(DEFAULT_SYNC_IO_THREADS));
    /// ```
    pub fn current_sync_io() -> Option<BlockingPool> {
        try_with_current(|core| core.pools.sync_io.clone())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::driver::ThreadDriver;
    use std::sync::Mutex;

    fn core() -> Core {
        Core::new(0, Box::new(ThreadDriver::new()), CoreConfig::default())
    }

    /// Each timer fires in the first tick whose timer check happens at or
    /// after its deadline: never earlier, never a tick later.
    #[test]
    fn timers_fire_in_order_in_the_tick_after_their_deadline() {
        let core = core();
        let fired = Rc::new(RefCell::new(Vec::new()));
        let f2 = fired.clone();
        core.block_on(
            async move {
                // Deadlines 50 ms ahead, so that every sleeper is polled
                // (and its timer armed) before its deadline even when the
                // machine is busy; one that is not (a stall of 50 ms)
                // completes without a timer and is left out of the checks.
                let start = Instant::now() + Duration::from_millis(50);
                let delays_ms = [40u64, 5, 25, 15, 35, 10, 30, 20, 45, 1];
                let handles: Vec<_> = delays_ms
                    .iter()
                    .map(|&ms| {
                        let fired = f2.clone();
                        spawn_local(async move {
                            let deadline = start + Duration::from_millis(ms);
                            let late = Instant::now() >= deadline;
                            crate::time::sleep_until(deadline).await;
                            let tick = tick_stats().map(|s| s.ticks).unwrap_or(0);
                            fired.borrow_mut().push((deadline, tick, late));
                        })
                    })
                    .collect();
                // A busy neighbour keeps ticks short and frequent until
                // past the last deadline.
                let busy = spawn_local(async {
                    for _ in 0..1000 {
                        crate::yield_now().await;
                        std::thread::sleep(Duration::from_micros(100));
                    }
                });
                for h in handles {
                    h.await.expect("sleeper");
                }
                busy.await.expect("busy");
            },
            &|_| false,
        );
        let fired = fired.borrow();
        let checks = core.timer_checks.borrow();
        assert_eq!(fired.len(), 10);
        let timed: Vec<_> = fired.iter().filter(|f| !f.2).collect();
        assert!(timed.windows(2).all(|w| w[0].0 <= w[1].0), "deadline order");
        for &&(deadline, tick, _) in &timed {
            let at = |t: u64| checks.iter().find(|(n, _)| *n == t).map(|(_, i)| *i);
            let this = at(tick).expect("check of the firing tick");
            assert!(this >= deadline, "fired before its deadline");
            if let Some(prev) = at(tick - 1) {
                assert!(prev < deadline, "fired a tick late");
            }
        }
        assert_eq!(core.stats().timers_fired, timed.len() as u64);
    }

    #[test]
    fn a_remote_wake_while_parked_unparks_the_core() {
        let core = core();
        let waker_slot: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
        let w2 = waker_slot.clone();
        let t = std::thread::spawn(move || loop {
            let taken = w2.lock().map(|mut w| w.take()).unwrap_or(None);
            if let Some(w) = taken {
                // Long enough for the core to reach its park on a busy
                // machine (the test counts that park).
                std::thread::sleep(Duration::from_millis(200));
                w.wake();
                return;
            }
            std::thread::yield_now();
        });
        core.block_on(
            async {
                let h = spawn_local(async move {
                    let mut first = true;
                    std::future::poll_fn(|cx| {
                        if first {
                            first = false;
                            if let Ok(mut slot) = waker_slot.lock() {
                                *slot = Some(cx.waker().clone());
                            }
                            Poll::Pending
                        } else {
                            Poll::Ready(())
                        }
                    })
                    .await
                });
                h.await.expect("woken");
            },
            &|_| false,
        );
        t.join().expect("waker thread");
        let s = core.stats();
        assert!(s.parks >= 1, "{s:?}");
        assert_eq!(s.remote_wakes, 1, "{s:?}");
    }
}

#[cfg(all(test, loom))]
mod loom_task_models;

#[cfg(all(test, loom))]
mod loom_tests {
    //! The local/remote split of task references and wakes, on the real
    //! core (ticks driven by hand, no parking). A lost wake shows as a
    //! loop that never ends (loom stops it at its branch limit); a double
    //! or missing free shows in `DEALLOCS`.

    use super::*;
    use crate::driver::ThreadDriver;
    use crate::task::DEALLOCS;
    use loom::sync::atomic::AtomicBool as LoomBool;
    use loom::sync::Arc as LoomArc;
    use std::sync::atomic::Ordering::Release;

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(f);
    }

    fn deallocs() -> usize {
        // Relaxed: read after the model's other threads joined.
        DEALLOCS.load(Relaxed)
    }

    /// Pending until `go` is set; every pending poll stores a clone of its
    /// waker (a local one: polls run on the owner thread).
    struct Waiter {
        go: LoomArc<LoomBool>,
        slot: Rc<RefCell<Option<Waker>>>,
    }

    impl Future for Waiter {
        type Output = ();

        fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            // Acquire: pairs with the Release store of the remote thread.
            if self.go.load(Acquire) {
                return Poll::Ready(());
            }
            *self.slot.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    fn setup() -> (Core, LoomArc<LoomBool>, Rc<RefCell<Option<Waker>>>) {
        let core = Core::new(0, Box::new(ThreadDriver::new()), CoreConfig::default());
        (core, LoomArc::new(LoomBool::new(false)), Rc::default())
    }

    #[test]
    fn loom_remote_wake_races_local_wake_and_poll() {
        model(|| {
            let (core, go, slot) = setup();
            let enter = core.enter();
            let h = core.spawn_local(Waiter {
                go: go.clone(),
                slot: slot.clone(),
            });
            core.tick();
            let w = slot.borrow_mut().take().expect("first poll stored a waker");
            let remote = w.clone();
            let th = loom::thread::spawn(move || {
                go.store(true, Release);
                // By value: a remote wake plus a remote drop of a local
                // reference.
                remote.wake();
            });
            w.wake_by_ref();
            while !h.is_finished() {
                core.tick();
                loom::thread::yield_now();
            }
            th.join().expect("remote");
            drop((w, h, slot.borrow_mut().take()));
            // Freed here, or in this tick if the remote drop's unit was
            // still pending.
            core.tick();
            assert_eq!(deallocs(), 1, "freed once the core folded the remote drop");
            drop(enter);
            drop(core);
            assert_eq!(deallocs(), 1);
        });
    }

    #[test]
    fn loom_remote_waker_drop_races_the_local_last_drop() {
        model(|| {
            let (core, go, slot) = setup();
            let enter = core.enter();
            let h = core.spawn_local(Waiter {
                go: go.clone(),
                slot: slot.clone(),
            });
            core.tick();
            let w = slot.borrow_mut().take().expect("first poll stored a waker");
            let remote = w.clone();
            let th = loom::thread::spawn(move || drop(remote));
            go.store(true, Release);
            w.wake();
            // Completes the task and drops every local reference but the
            // one the remote thread is dropping; may take its node too.
            core.tick();
            assert!(h.is_finished());
            drop(h);
            th.join().expect("remote");
            core.tick();
            assert_eq!(deallocs(), 1);
            drop(enter);
            drop(core);
            assert_eq!(deallocs(), 1);
        });
    }

    #[test]
    fn loom_two_remote_threads_wake_and_drop_while_the_owner_ticks() {
        model(|| {
            let (core, go, slot) = setup();
            let enter = core.enter();
            let h = core.spawn_local(Waiter {
                go: go.clone(),
                slot: slot.clone(),
            });
            core.tick();
            let w = slot.borrow_mut().take().expect("first poll stored a waker");
            let (a, b) = (w.clone(), w.clone());
            drop(w);
            let waker = loom::thread::spawn(move || {
                go.store(true, Release);
                a.wake_by_ref();
                drop(a);
            });
            let dropper = loom::thread::spawn(move || drop(b));
            while !h.is_finished() {
                core.tick();
                loom::thread::yield_now();
            }
            waker.join().expect("waker");
            dropper.join().expect("dropper");
            drop((h, slot.borrow_mut().take()));
            core.tick();
            assert_eq!(deallocs(), 1);
            drop(enter);
            drop(core);
            assert_eq!(deallocs(), 1);
        });
    }

    #[test]
    fn loom_remote_waker_races_the_core_closing() {
        model(|| {
            let (core, go, slot) = setup();
            let enter = core.enter();
            let h = core.spawn_local(Waiter {
                go,
                slot: slot.clone(),
            });
            core.tick();
            let w = slot.borrow_mut().take().expect("first poll stored a waker");
            let remote = w.clone();
            let th = loom::thread::spawn(move || {
                remote.wake_by_ref();
                drop(remote);
            });
            drop(w);
            drop(enter);
            // Close: cancels the pending task, detaches, closes.
            drop(core);
            th.join().expect("remote");
            assert!(h.is_finished());
            assert_eq!(deallocs(), 0, "the JoinHandle still holds it");
            drop(h);
            assert_eq!(deallocs(), 1);
        });
    }
}
