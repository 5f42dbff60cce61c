//! The blocking pools' implementation: lazy threads, an idle keep-alive
//! and one FIFO queue per pool. What they are for, their bounds and
//! defaults are in the public module, [`crate::blocking`], which
//! re-exports this module's public items beside `spawn_blocking` (which
//! lives with `spawn` in `crate::core`, since it spawns on the current
//! core; the core holds the pools, so this module never names it).
//!
//! # Invariants
//!
//! - `threads <= max_threads` at all times; `idle <= threads`.
//! - A job is run at most once, by one pool thread; a job queued when the
//!   pool shuts down is dropped without running, never lost silently in a
//!   running pool.
//! - `notified` counts idle threads claimed by a submitter (taken out of
//!   `idle` by it): a woken thread that finds `notified > 0` takes one
//!   claim and goes back to the queue, so two submits that race with one
//!   idle thread start a second thread instead of both waiting on it.
//! - A pool thread serves the generation it started in: one whose job
//!   forked leaves the pool in the child once the job returns.
//! - The queue and counts are of this process's threads: a child made by
//!   `fork()` (a newer [`crate::fork`] generation) gets its own, empty
//!   ([`ForkLocal`]), at its first use of the pool, which starts the
//!   child's own threads. Jobs the parent had queued at the fork are
//!   dropped in the child without running (they are the parent's work;
//!   run again there they would repeat its side effects), or left alone
//!   when the parent's lock was held at the fork.
//! - The owner (runtime or local executor) shuts its pools down only after
//!   its cores (and their drivers, which wait for their in-flight IO) are
//!   gone: no sync IO job is queued then.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread;
use std::time::Duration;

use crate::fork::ForkLocal;

/// Default bound of a runtime's blocking pool (threads), as tokio's.
///
/// ```
/// use plugio::executor::blocking::{BlockingPool, DEFAULT_MAX_BLOCKING_THREADS};
///
/// let max = plugio::LocalExecutor::new()
///     .run(async { BlockingPool::current().unwrap().max_threads() });
/// assert_eq!(max, DEFAULT_MAX_BLOCKING_THREADS);
/// ```
pub const DEFAULT_MAX_BLOCKING_THREADS: usize = 512;
/// Default size of a runtime's sync IO pool (threads).
///
/// ```
/// use plugio::executor::blocking::{BlockingPool, DEFAULT_SYNC_IO_THREADS};
///
/// let max = plugio::LocalExecutor::new()
///     .run(async { BlockingPool::current_sync_io().unwrap().max_threads() });
/// assert_eq!(max, DEFAULT_SYNC_IO_THREADS);
/// ```
pub const DEFAULT_SYNC_IO_THREADS: usize = 4;
/// Default time an idle pool thread waits for a job before it exits.
///
/// ```
/// assert_eq!(plugio::executor::blocking::DEFAULT_BLOCKING_KEEP_ALIVE.as_secs(), 10);
/// ```
pub const DEFAULT_BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A bounded pool of threads for blocking calls (see the module docs).
///
/// A cloneable handle: clones name the same pool. The pools of the current
/// runtime are [`BlockingPool::current`] and
/// [`BlockingPool::current_sync_io`]; a pool made with [`BlockingPool::new`]
/// belongs to whoever made it (the device crate keeps one for threads that
/// drive IO without an executor).
///
/// ```
/// use plugio::executor::blocking::BlockingPool;
/// use std::sync::mpsc;
///
/// let pool = BlockingPool::new("doc-pool", 2);
/// let (tx, rx) = mpsc::channel();
/// pool.execute(move || tx.send(6 * 7).unwrap())?;
/// assert_eq!(rx.recv()?, 42);
/// assert!(pool.threads() <= pool.max_threads());
/// pool.shutdown();
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct BlockingPool {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    max_threads: usize,
    keep_alive: Duration,
    /// The CPUs of the thread that made the pool (`sched_getaffinity`):
    /// each pool thread runs on these, not on the one CPU of the pinned
    /// core that happened to start it (a blocking job there took that
    /// core's CPU from its IO). `None` where the mask could not be read.
    cpus: Option<nix::sched::CpuSet>,
    /// This fork generation's queue and counts (see the module docs).
    shared: ForkLocal<Shared>,
    /// Set by `shutdown`, under the current generation's lock, and read
    /// under it (Relaxed: the lock orders it); outside [`Shared`] so a
    /// forked child's fresh state sees a pool shut down before the fork.
    shutdown: AtomicBool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    condvar: Condvar,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Threads alive.
    threads: usize,
    /// Threads waiting for a job and not claimed by a submitter.
    idle: usize,
    /// Idle threads claimed by a submitter and not yet awake.
    notified: usize,
    /// Names the next thread (`{name}-{n}`).
    spawned: u64,
}

thread_local! {
    /// The pool whose thread this is (its `Inner`'s address; 0 on other
    /// threads). Set once by [`Inner::worker`], whose `Arc` keeps that
    /// `Inner` alive as long as the thread runs, so the address is never
    /// another pool's.
    static WORKER_OF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl BlockingPool {
    /// True on one of this pool's threads (inside one of its jobs).
    pub(crate) fn runs_current_thread(&self) -> bool {
        WORKER_OF.with(|w| w.get() == Arc::as_ptr(&self.inner) as usize)
    }

    /// A pool of at most `max_threads` threads (at least 1) named
    /// `{name}-{n}`, idle keep-alive [`DEFAULT_BLOCKING_KEEP_ALIVE`].
    /// No thread starts before the first job.
    pub fn new(name: impl Into<String>, max_threads: usize) -> Self {
        Self::with_keep_alive(name, max_threads, DEFAULT_BLOCKING_KEEP_ALIVE)
    }

    /// [`BlockingPool::new`] with the idle keep-alive `keep_alive`.
    ///
    /// ```
    /// use plugio::executor::blocking::BlockingPool;
    /// use std::time::Duration;
    ///
    /// let pool = BlockingPool::with_keep_alive("short", 1, Duration::from_millis(10));
    /// assert_eq!(pool.max_threads(), 1);
    /// assert_eq!(pool.threads(), 0, "threads start with the first job");
    /// ```
    pub fn with_keep_alive(
        name: impl Into<String>,
        max_threads: usize,
        keep_alive: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: name.into(),
                max_threads: max_threads.max(1),
                keep_alive,
                cpus: nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok(),
                shared: ForkLocal::new(Shared::default),
                shutdown: AtomicBool::new(false),
            }),
        }
    }

    /// Runs `job` on a pool thread: an idle one, a new one while the pool
    /// is under its bound, or else the first one that finishes its job
    /// (the job waits in the FIFO queue). Never blocks the caller. A panic
    /// in `job` is caught and logged; the thread keeps serving.
    ///
    /// ```
    /// use plugio::executor::blocking::BlockingPool;
    /// use std::sync::mpsc;
    ///
    /// let pool = BlockingPool::new("doc-execute", 1);
    /// let (tx, rx) = mpsc::channel();
    /// for i in 0..3 {
    ///     let tx = tx.clone();
    ///     pool.execute(move || tx.send(i).unwrap())?; // one thread, run in turn
    /// }
    /// let got: Vec<i32> = (0..3).map(|_| rx.recv().unwrap()).collect();
    /// assert_eq!(got, [0, 1, 2]);
    /// # Ok::<_, std::io::Error>(())
    /// ```
    ///
    /// # Errors
    /// `Other` when the pool was shut down (the job is dropped), or when the
    /// pool has no thread and the OS refused to start one (the job is
    /// dropped; with threads alive it waits for them instead).
    pub fn execute<F>(&self, job: F) -> io::Result<()>
    where
        F: FnOnce() + Send + 'static,
    {
        let mut state = self.lock();
        if self.inner.is_shut_down() {
            return Err(io::Error::other(format!(
                "blocking pool {} is shut down (its runtime stopped)",
                self.inner.name
            )));
        }
        state.queue.push_back(Box::new(job));
        if state.idle > 0 {
            state.idle -= 1;
            state.notified += 1;
            self.inner.shared().condvar.notify_one();
            return Ok(());
        }
        if state.threads >= self.inner.max_threads {
            // Full: the job waits for the first thread that frees.
            return Ok(());
        }
        state.threads += 1;
        state.spawned += 1;
        let name = format!("{}-{}", self.inner.name, state.spawned);
        drop(state);
        let inner = self.inner.clone();
        match thread::Builder::new()
            .name(name)
            .spawn(move || inner.worker())
        {
            Ok(_detached) => Ok(()),
            Err(e) => {
                let mut state = self.lock();
                state.threads -= 1;
                if state.threads > 0 {
                    tracing::warn!(pool = %self.inner.name, error = %e, "cannot start a blocking thread; the job waits for a busy one");
                    return Ok(());
                }
                let job = state.queue.pop_back();
                drop(state);
                drop(job);
                Err(io::Error::new(
                    e.kind(),
                    format!(
                        "blocking pool {}: cannot start a thread: {e}",
                        self.inner.name
                    ),
                ))
            }
        }
    }

    /// The pool's bound on threads (at least 1).
    ///
    /// ```
    /// use plugio::executor::blocking::BlockingPool;
    ///
    /// assert_eq!(BlockingPool::new("doc-max", 0).max_threads(), 1);
    /// ```
    pub fn max_threads(&self) -> usize {
        self.inner.max_threads
    }

    /// Threads alive now (busy or idle).
    ///
    /// ```
    /// use plugio::executor::blocking::BlockingPool;
    /// use std::sync::mpsc;
    /// use std::time::Duration;
    ///
    /// let pool = BlockingPool::with_keep_alive("doc-threads", 2, Duration::from_secs(3600));
    /// assert_eq!(pool.threads(), 0);
    /// let (tx, rx) = mpsc::channel();
    /// pool.execute(move || tx.send(()).unwrap())?;
    /// rx.recv().unwrap();
    /// assert_eq!(pool.threads(), 1, "idle, kept alive for the next job");
    /// # Ok::<_, std::io::Error>(())
    /// ```
    pub fn threads(&self) -> usize {
        self.lock().threads
    }

    /// Jobs waiting for a thread now.
    ///
    /// ```
    /// use plugio::executor::blocking::BlockingPool;
    /// use std::sync::mpsc;
    ///
    /// let pool = BlockingPool::new("doc-queued", 1);
    /// let (release, wait) = mpsc::channel::<()>();
    /// let (started_tx, started) = mpsc::channel();
    /// pool.execute(move || { started_tx.send(()).unwrap(); wait.recv().unwrap() })?;
    /// started.recv().unwrap(); // the one thread is busy
    /// pool.execute(|| ())?;
    /// assert_eq!(pool.queued(), 1, "the second job waits for the thread");
    /// release.send(()).unwrap();
    /// # Ok::<_, std::io::Error>(())
    /// ```
    pub fn queued(&self) -> usize {
        self.lock().queue.len()
    }

    /// Stops the pool: jobs still queued are dropped without running, idle
    /// threads exit at once, busy ones when their job returns (they are
    /// not joined: a blocking call may never return), and later
    /// [`BlockingPool::execute`] calls fail. A runtime does this to its
    /// pools after its cores stopped.
    ///
    /// ```
    /// use plugio::executor::blocking::BlockingPool;
    ///
    /// let pool = BlockingPool::new("doc-shutdown", 1);
    /// pool.shutdown();
    /// assert!(pool.execute(|| ()).is_err());
    /// ```
    pub fn shutdown(&self) {
        let queued = {
            let mut state = self.lock();
            // Relaxed: under the lock (see `Inner::shutdown`).
            self.inner.shutdown.store(true, Ordering::Relaxed);
            std::mem::take(&mut state.queue)
        };
        self.inner.shared().condvar.notify_all();
        // Dropped outside the lock: a job's captures may do anything.
        drop(queued);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock()
    }
}

impl Inner {
    /// This fork generation's state; in a forked child's first call, the
    /// jobs the parent had queued are dropped (see the module docs).
    fn shared(&self) -> &Shared {
        self.shared.get_or_renew(|parent| {
            let queued = match parent.state.try_lock() {
                Ok(mut state) => std::mem::take(&mut state.queue),
                Err(TryLockError::Poisoned(p)) => std::mem::take(&mut p.into_inner().queue),
                // Held by a thread the child does not have: left alone.
                Err(TryLockError::WouldBlock) => VecDeque::new(),
            };
            // Dropped outside the lock: a job's captures may do anything.
            drop(queued);
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No job runs under the lock, so a poisoned lock means a panic in
        // this module's own short sections; the state is still consistent.
        self.shared()
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `shutdown` ran; call with the lock held.
    fn is_shut_down(&self) -> bool {
        // Relaxed: written and read under the lock.
        self.shutdown.load(Ordering::Relaxed)
    }

    /// A pool thread: runs queued jobs, waits up to the keep-alive for
    /// more, exits when idle that long or at shutdown.
    fn worker(&self) {
        WORKER_OF.with(|w| w.set(std::ptr::from_ref(self) as usize));
        crate::signals::block_file_size_signal();
        if let Some(cpus) = &self.cpus {
            // Best effort: a CPU taken away since (a cpuset change) leaves
            // the inherited mask, which still runs the job.
            if let Err(e) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), cpus) {
                tracing::debug!(pool = %self.name, error = %e, "pool thread keeps its inherited CPUs");
            }
        }
        let generation = crate::fork::generation();
        let mut state = self.lock();
        loop {
            while let Some(job) = state.queue.pop_front() {
                drop(state);
                if catch_unwind(AssertUnwindSafe(job)).is_err() {
                    tracing::error!(pool = %self.name, "a blocking job panicked");
                }
                if crate::fork::generation() != generation {
                    // The job forked and this is the child: the thread is
                    // not one of the child's pool (its state never counted
                    // it), so it leaves without touching that state (it
                    // once marked itself idle there and took one off a
                    // count of 0; found by a break-it helper).
                    return;
                }
                state = self.lock();
            }
            if self.is_shut_down() {
                break;
            }
            state.idle += 1;
            let exit = loop {
                let (guard, waited) = self
                    .shared()
                    .condvar
                    .wait_timeout(state, self.keep_alive)
                    .unwrap_or_else(PoisonError::into_inner);
                state = guard;
                if state.notified > 0 {
                    // Claimed by a submitter, which took us out of `idle`.
                    state.notified -= 1;
                    break false;
                }
                if self.is_shut_down() || waited.timed_out() {
                    state.idle -= 1;
                    break true;
                }
                // Spurious wake-up: still idle.
            };
            if exit && !self.is_shut_down() && !state.queue.is_empty() {
                // A job queued by a submit that found us busy just before
                // we went idle: serve it rather than leave it waiting.
                continue;
            }
            if exit {
                break;
            }
        }
        state.threads -= 1;
        debug_assert!(state.idle <= state.threads);
    }
}

impl fmt::Debug for BlockingPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("BlockingPool")
            .field("name", &self.inner.name)
            .field("max_threads", &self.inner.max_threads)
            .field("threads", &state.threads)
            .field("idle", &state.idle)
            .field("queued", &state.queue.len())
            .finish()
    }
}

/// The two pools a runtime owns (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct Pools {
    pub(crate) blocking: BlockingPool,
    pub(crate) sync_io: BlockingPool,
}

/// The pool settings of a builder.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolConfig {
    pub(crate) max_blocking_threads: usize,
    pub(crate) sync_io_threads: usize,
    pub(crate) keep_alive: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_blocking_threads: DEFAULT_MAX_BLOCKING_THREADS,
            sync_io_threads: DEFAULT_SYNC_IO_THREADS,
            keep_alive: DEFAULT_BLOCKING_KEEP_ALIVE,
        }
    }
}

impl Pools {
    pub(crate) fn new(config: &PoolConfig, prefix: &str) -> Self {
        Self {
            blocking: BlockingPool::with_keep_alive(
                format!("{prefix}-blocking"),
                config.max_blocking_threads,
                config.keep_alive,
            ),
            sync_io: BlockingPool::with_keep_alive(
                format!("{prefix}-sync-io"),
                config.sync_io_threads,
                config.keep_alive,
            ),
        }
    }

    pub(crate) fn shutdown(&self) {
        self.blocking.shutdown();
        self.sync_io.shutdown();
    }
}
