//! The multi-core runtime: `Builder`, `Runtime`, `Handle`, placement and
//! shutdown.
//!
//! # Invariants
//!
//! - One OS thread per core, started by `Builder::build`, each running one
//!   `Core` for its whole life; the driver is created on that thread.
//! - `build` returns only when every core has started (or failed: then the
//!   started ones are stopped and joined, and the first error is returned).
//! - `shutdown`/`Drop` joins every core thread; afterwards every task of
//!   the runtime has completed or been cancelled, and spawns through a
//!   leftover `Handle` are cancelled at once.

use crate::core::{Core, CoreConfig};
use crate::driver::{Driver, ThreadDriver};
use crate::pools::{PoolConfig, Pools};
use crate::stats::TickStats;
use crate::task::{new_task, JoinError, JoinHandle};
use crate::task::{CoreShared, SHUTDOWN_CANCEL, SHUTDOWN_DRAIN};
use std::fmt;
use std::future::Future;
use std::io;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Makes a core's driver; called on the core's own thread with its index.
pub type DriverFactory = Arc<dyn Fn(usize) -> io::Result<Box<dyn Driver>> + Send + Sync + 'static>;

/// Called on each core's thread, with its index, before its driver is made.
pub type ThreadStartHook = Arc<dyn Fn(usize) + Send + Sync + 'static>;

/// Where core threads run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// No affinity: the OS scheduler places the threads (the default).
    #[default]
    Unpinned,
    /// Core `i` is pinned (`sched_setaffinity`) to the `i`-th CPU of the
    /// building thread's allowed set at build time ([`allowed_cpus`]:
    /// `sched_getaffinity`, which a `taskset` narrows), wrapping around
    /// when there are more cores than CPUs.
    Pinned,
    /// Core `i` is pinned to CPU `cpus[i]`. Must name one CPU per core,
    /// each one the process may run on (its cgroup's cpuset).
    Cpus(Vec<usize>),
}

/// Configures and starts a [`Runtime`].
///
/// Defaults: one core per available CPU, [`Placement::Unpinned`], task
/// budget 256 polls per tick, coop budget 128, threads named
/// `plugio-core-{index}`, [`ThreadDriver`]; a blocking pool of at most 512
/// threads and a sync IO pool of 4 (see [`crate::blocking`]).
pub struct Builder {
    cores: usize,
    placement: Placement,
    config: CoreConfig,
    pools: PoolConfig,
    thread_name: String,
    driver: DriverFactory,
    on_thread_start: Option<ThreadStartHook>,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

pub use crate::core::{DEFAULT_COOP_BUDGET, DEFAULT_TASK_BUDGET};

impl Builder {
    /// A builder with the defaults.
    pub fn new() -> Self {
        Self {
            cores: thread::available_parallelism().map_or(1, |n| n.get()),
            placement: Placement::Unpinned,
            config: CoreConfig::default(),
            pools: PoolConfig::default(),
            thread_name: "plugio-core".to_owned(),
            driver: Arc::new(|_| Ok(Box::new(ThreadDriver::new()) as Box<dyn Driver>)),
            on_thread_start: None,
        }
    }

    /// Number of cores (threads). Must be at least 1.
    pub fn cores(mut self, cores: usize) -> Self {
        self.cores = cores;
        self
    }

    /// Where the core threads run.
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Most task polls per tick: after that many, the core calls its
    /// tick-end hooks and polls its driver even if more tasks are ready.
    /// Default [`DEFAULT_TASK_BUDGET`]; 0 is taken as 1 (a tick polls at
    /// least one task).
    pub fn task_budget(mut self, polls_per_tick: usize) -> Self {
        self.config.task_budget = polls_per_tick.max(1);
        self
    }

    /// Ready resource polls a task may make per poll before it is made to
    /// yield (see [`crate::coop`]): `units` counts one per poll of a
    /// resource that returned `Ready` (a channel's send or receive, an
    /// elapsed sleep, a finished `JoinHandle`; not an IO, whose first poll
    /// is always `Pending`). Default [`DEFAULT_COOP_BUDGET`]; 0 is taken as
    /// 1.
    pub fn coop_budget(mut self, units: u32) -> Self {
        self.config.coop_budget = units.max(1);
        self
    }

    /// Most threads of the runtime's blocking pool, the one
    /// [`spawn_blocking`](crate::spawn_blocking) runs on (at least 1;
    /// default [`DEFAULT_MAX_BLOCKING_THREADS`](crate::blocking::DEFAULT_MAX_BLOCKING_THREADS),
    /// 512). Threads start on demand; when all are busy, new calls wait in
    /// the pool's queue for the first to free.
    ///
    /// ```
    /// use plugio::{spawn_blocking, Runtime};
    ///
    /// let rt = Runtime::builder().cores(1).max_blocking_threads(2).build()?;
    /// let n = rt.block_on(async { spawn_blocking(|| 2 + 2).await.unwrap() });
    /// assert_eq!(n, 4);
    /// # Ok::<_, std::io::Error>(())
    /// ```
    pub fn max_blocking_threads(mut self, threads: usize) -> Self {
        self.pools.max_blocking_threads = threads.max(1);
        self
    }

    /// Threads of the runtime's sync IO pool, where the device crate's
    /// sync backend runs its blocking reads and writes (file IO on a core
    /// whose io_uring was refused). At least 1; default
    /// [`DEFAULT_SYNC_IO_THREADS`](crate::blocking::DEFAULT_SYNC_IO_THREADS), 4.
    ///
    /// ```
    /// use plugio::executor::{blocking::BlockingPool, Runtime};
    ///
    /// let rt = Runtime::builder().cores(1).sync_io_threads(8).build()?;
    /// let max = rt.block_on(async { BlockingPool::current_sync_io().unwrap().max_threads() });
    /// assert_eq!(max, 8);
    /// # Ok::<_, std::io::Error>(())
    /// ```
    pub fn sync_io_threads(mut self, threads: usize) -> Self {
        self.pools.sync_io_threads = threads.max(1);
        self
    }

    /// How long an idle thread of either pool waits for a job before it
    /// exits (default [`DEFAULT_BLOCKING_KEEP_ALIVE`](crate::blocking::DEFAULT_BLOCKING_KEEP_ALIVE), 10 s).
    ///
    /// ```
    /// use plugio::Runtime;
    /// use std::time::Duration;
    ///
    /// let rt = Runtime::builder().cores(1).blocking_keep_alive(Duration::from_secs(1)).build()?;
    /// # drop(rt);
    /// # Ok::<_, std::io::Error>(())
    /// ```
    pub fn blocking_keep_alive(mut self, keep_alive: Duration) -> Self {
        self.pools.keep_alive = keep_alive;
        self
    }

    /// Thread name prefix; threads are named `{prefix}-{index}`.
    pub fn thread_name(mut self, prefix: impl Into<String>) -> Self {
        self.thread_name = prefix.into();
        self
    }

    /// How each core makes its driver. `f` is called on the core's thread
    /// at start, with the core index; an error fails `build`.
    pub fn driver<F>(mut self, f: F) -> Self
    where
        F: Fn(usize) -> io::Result<Box<dyn Driver>> + Send + Sync + 'static,
    {
        self.driver = Arc::new(f);
        self
    }

    /// Called on each core's thread at start (after pinning, before the
    /// driver is made), with the core index.
    pub fn on_thread_start<F>(mut self, f: F) -> Self
    where
        F: Fn(usize) + Send + Sync + 'static,
    {
        self.on_thread_start = Some(Arc::new(f));
        self
    }

    /// Starts the cores.
    ///
    /// # Errors
    /// `InvalidInput` for zero cores or a [`Placement::Cpus`] list of the
    /// wrong length, or naming a CPU the kernel does not let the core's
    /// thread run on (the message names the core and the CPU); the OS error of `sched_getaffinity`/`sched_setaffinity`
    /// or of thread creation; the driver factory's error; `Other` if a
    /// core's start hook panicked.
    pub fn build(self) -> io::Result<Runtime> {
        if self.cores == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a runtime needs at least one core",
            ));
        }
        let cpus = cpus_for(&self.placement, self.cores)?;
        let pools = Pools::new(&self.pools, &self.thread_name);
        let mut threads = Vec::with_capacity(self.cores);
        let mut starts = Vec::with_capacity(self.cores);
        let mut first_error = None;
        for index in 0..self.cores {
            match self.spawn_core(index, cpus.as_ref().map(|c| c[index]), &pools) {
                Ok((thread, start)) => {
                    threads.push(thread);
                    starts.push(start);
                }
                Err(e) => {
                    first_error = Some(e);
                    break;
                }
            }
        }
        let mut cores = Vec::with_capacity(self.cores);
        for (index, (start_rx, _)) in starts.iter().enumerate() {
            match start_rx.recv() {
                Ok(Ok(shared)) => cores.push(shared),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(io::Error::other(format!(
                        "core {index} panicked while starting"
                    )));
                }
            }
        }
        if let Some(err) = first_error {
            drop(starts);
            for t in threads {
                let _ = t.join();
            }
            pools.shutdown();
            return Err(err);
        }
        let handle = Handle {
            cores: Arc::from(cores),
        };
        for (_, handle_tx) in &starts {
            let _ = handle_tx.send(handle.clone());
        }
        tracing::debug!(cores = self.cores, "runtime started");
        Ok(Runtime {
            handle,
            threads,
            pools,
            stopped: false,
        })
    }
}

/// A starting core's report channel and the channel its handle goes to.
type CoreStart = (
    mpsc::Receiver<io::Result<Arc<CoreShared>>>,
    mpsc::Sender<Handle>,
);

impl Builder {
    /// Starts core `index`'s thread.
    fn spawn_core(
        &self,
        index: usize,
        cpu: Option<usize>,
        pools: &Pools,
    ) -> io::Result<(thread::JoinHandle<()>, CoreStart)> {
        let (start_tx, start_rx) = mpsc::channel();
        let (handle_tx, handle_rx) = mpsc::channel();
        let ctx = CoreThread {
            index,
            cpu,
            config: self.config,
            pools: pools.clone(),
            driver: self.driver.clone(),
            on_thread_start: self.on_thread_start.clone(),
            start_tx,
            handle_rx,
        };
        let thread = thread::Builder::new()
            .name(format!("{}-{index}", self.thread_name))
            .spawn(move || {
                crate::signals::block_file_size_signal();
                ctx.run()
            })?;
        Ok((thread, (start_rx, handle_tx)))
    }
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("cores", &self.cores)
            .field("placement", &self.placement)
            .field("config", &self.config)
            .field("pools", &self.pools)
            .field("thread_name", &self.thread_name)
            .finish_non_exhaustive()
    }
}

fn cpus_for(placement: &Placement, cores: usize) -> io::Result<Option<Vec<usize>>> {
    match placement {
        Placement::Unpinned => Ok(None),
        Placement::Cpus(cpus) if cpus.len() == cores => Ok(Some(cpus.clone())),
        Placement::Cpus(cpus) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "Placement::Cpus names {} CPUs for {cores} cores",
                cpus.len()
            ),
        )),
        Placement::Pinned => {
            let allowed = allowed_cpus()?;
            if allowed.is_empty() {
                return Err(io::Error::other("the process may run on no CPU"));
            }
            Ok(Some(
                (0..cores).map(|i| allowed[i % allowed.len()]).collect(),
            ))
        }
    }
}

/// The CPUs the calling thread may run on (`sched_getaffinity`).
///
/// # Errors
/// The OS error of `sched_getaffinity`.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    use nix::sched::{sched_getaffinity, CpuSet};
    use nix::unistd::Pid;
    let set = sched_getaffinity(Pid::from_raw(0)).map_err(io::Error::from)?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

fn pin_current_thread(cpu: usize) -> io::Result<()> {
    use nix::sched::{sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let mut set = CpuSet::new();
    set.set(cpu).map_err(io::Error::from)?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(io::Error::from)
}

/// The error of pinning core `core` to `cpu`, which the kernel refused
/// (`error`): it names the core and the CPU (`sched_setaffinity` says only
/// EINVAL; found by a break-it helper). The kernel is the judge of which
/// CPUs a thread may take (its cgroup's cpuset), not the calling thread's
/// own mask, which may be narrower (a second helper found a CPU the
/// process may use refused when the builder checked that mask).
fn pin_refusal(core: usize, cpu: usize, error: &io::Error) -> io::Error {
    let kind = if error.raw_os_error() == Some(nix::libc::EINVAL) {
        io::ErrorKind::InvalidInput
    } else {
        error.kind()
    };
    io::Error::new(
        kind,
        format!(
            "Placement::Cpus pins core {core} to CPU {cpu}, which could not be set \
             ({error}; sched_setaffinity, or a CPU number past the 1024 a CPU set holds): \
             name CPUs this process may run on (its cgroup's cpuset; `taskset -pc $$` or \
             allowed_cpus() lists the calling thread's)"
        ),
    )
}

/// What a core thread needs to start.
struct CoreThread {
    index: usize,
    cpu: Option<usize>,
    config: CoreConfig,
    pools: Pools,
    driver: DriverFactory,
    on_thread_start: Option<ThreadStartHook>,
    start_tx: mpsc::Sender<io::Result<Arc<CoreShared>>>,
    handle_rx: mpsc::Receiver<Handle>,
}

impl CoreThread {
    fn run(self) {
        let _span = tracing::debug_span!("plugio_core", core = self.index).entered();
        if let Some(cpu) = self.cpu {
            if let Err(e) = pin_current_thread(cpu) {
                let _ = self.start_tx.send(Err(pin_refusal(self.index, cpu, &e)));
                return;
            }
        }
        if let Some(hook) = &self.on_thread_start {
            hook(self.index);
        }
        let driver = match (self.driver)(self.index) {
            Ok(d) => d,
            Err(e) => {
                let _ = self.start_tx.send(Err(e));
                return;
            }
        };
        let core = Core::with_pools(self.index, driver, self.config, self.pools);
        if self.start_tx.send(Ok(core.shared.clone())).is_err() {
            return;
        }
        let Ok(handle) = self.handle_rx.recv() else {
            return;
        };
        let _ = core.runtime_cores.set(handle.cores);
        tracing::debug!(cpu = ?self.cpu, "core started");
        core.block_on(std::future::pending::<()>(), &Core::should_stop);
        core.close();
        tracing::debug!(stats = ?core.stats(), "core stopped");
    }
}

/// The panic of [`Handle::spawn_on`] (and so [`Runtime::block_on`]) in a
/// forked child on a runtime built before the fork.
const FORKED: &str = "this runtime was built before fork(): a child process has none of its \
                      core threads (but the one that forked), so a task spawned on another \
                      core would never run; build a new runtime in the child, on a new thread";

/// A cloneable, `Send` handle to a runtime's cores: spawn on any core from
/// any thread.
#[derive(Clone)]
pub struct Handle {
    cores: Arc<[Arc<CoreShared>]>,
}

impl Handle {
    /// The handle of the runtime the calling core belongs to (`None` off a
    /// runtime core, including inside a [`crate::LocalExecutor`]).
    pub fn current() -> Option<Handle> {
        crate::core::try_with_current(|core| core.runtime_cores.get().cloned())
            .flatten()
            .map(|cores| Handle { cores })
    }

    /// Number of cores.
    pub fn cores(&self) -> usize {
        self.cores.len()
    }

    /// Spawns a `Send` future on core `core` from any thread (the
    /// cross-core spawn: it arrives through the core's remote queue). If the
    /// runtime has shut down, the task is cancelled at once.
    ///
    /// # Panics
    /// If `core >= self.cores()`; in a forked child, if the runtime was
    /// built before the fork (the child has none of its core threads),
    /// unless `core` is the calling one (a fork from one of its tasks:
    /// that core is the child's thread).
    pub fn spawn_on<F>(&self, core: usize, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let Some(shared) = self.cores.get(core) else {
            panic!(
                "spawn_on: core {core} out of range (runtime has {} cores)",
                self.cores.len()
            );
        };
        // In a child forked from one of this runtime's tasks, the forking
        // core lives on (it is the calling thread): spawning on it works.
        assert!(
            !shared.forked() || crate::core::core_uid() == Some(shared.uid),
            "{FORKED}"
        );
        let (task, join) = new_task(future, shared.clone());
        shared.push_remote(task);
        JoinHandle::new(join)
    }

    /// Core `core`'s published tick statistics (`None` if out of range).
    pub fn tick_stats(&self, core: usize) -> Option<TickStats> {
        self.cores.get(core).map(|c| c.stats.load())
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("cores", &self.cores.len())
            .finish()
    }
}

/// How [`Runtime::shutdown`] treats tasks that have not finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Cancel them at once: their futures are dropped on their cores and
    /// their handles yield `JoinError::Cancelled`. What `Drop` does. Each
    /// core then waits for the IO still in flight (the kernel owns its
    /// memory); with plugio's device driver, what has not completed after
    /// a second is cancelled in the kernel where it can be.
    Cancel,
    /// Keep running until every task has completed (forever if one never
    /// does).
    Wait,
    /// Keep running until every task has completed or the timeout passed,
    /// then cancel the rest.
    WaitTimeout(Duration),
}

/// The error of [`Runtime::shutdown`]: some core threads panicked (a
/// tick-end hook or the driver panicked; task panics never do this).
#[derive(Debug)]
pub struct ShutdownError {
    /// Indexes of the cores whose thread panicked.
    pub panicked_cores: Vec<usize>,
}

impl fmt::Display for ShutdownError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "core threads panicked: {:?}", self.panicked_cores)
    }
}

impl std::error::Error for ShutdownError {}

/// A started thread-per-core runtime. Dropping it shuts it down with
/// [`ShutdownMode::Cancel`]. In a child made by `fork()` a runtime built
/// before the fork is dead: the child has none of its core threads, so
/// [`Runtime::spawn_on`] and [`Runtime::block_on`] panic saying so, and
/// dropping or shutting it down only frees the child's copy of its memory.
pub struct Runtime {
    handle: Handle,
    threads: Vec<thread::JoinHandle<()>>,
    /// Shut down in `stop`, after the cores (see [`crate::blocking`]).
    pools: Pools,
    /// `stop` ran: the drop after `shutdown` must not send its own (cancel)
    /// request over the one `shutdown` sent, which the cores may still be
    /// carrying out when `shutdown` ran on one of them.
    stopped: bool,
}

impl Runtime {
    /// A builder (same as [`Builder::new`]).
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// The runtime's handle.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Number of cores.
    pub fn cores(&self) -> usize {
        self.handle.cores()
    }

    /// Spawns `future` on core `core` (see [`Handle::spawn_on`]).
    ///
    /// # Panics
    /// If `core >= self.cores()`.
    pub fn spawn_on<F>(&self, core: usize, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn_on(core, future)
    }

    /// Runs `future` on core 0 and blocks the calling thread until it
    /// completes; returns its output.
    ///
    /// # Panics
    /// Re-raises the future's panic. Panics when called on a plugio core
    /// (it would block that core), and in a forked child on a runtime
    /// built before the fork (see [`Handle::spawn_on`]).
    pub fn block_on<F>(&self, future: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        assert!(
            !Core::is_inside_core(),
            "Runtime::block_on called on a plugio core; await the future instead"
        );
        match futures::executor::block_on(self.spawn_on(0, future)) {
            Ok(out) => out,
            Err(JoinError::Panic(p)) => std::panic::resume_unwind(p.into_payload()),
            Err(JoinError::Cancelled) => {
                panic!("Runtime::block_on: core 0 stopped before the future completed")
            }
        }
    }

    /// Core `core`'s tick statistics (`None` if out of range).
    pub fn tick_stats(&self, core: usize) -> Option<TickStats> {
        self.handle.tick_stats(core)
    }

    /// Stops every core as `mode` says and joins the threads.
    ///
    /// Called on one of the runtime's own cores (a task that holds the
    /// runtime), it cannot wait for its own thread: it asks every core to
    /// stop and returns `Ok(())` at once; a thread of its own joins the
    /// cores (logging any that panicked), and the calling core stops when
    /// the task returns. Dropping the last handle there does the same.
    /// So does a call from a job of one of the runtime's pools
    /// ([`spawn_blocking`](crate::spawn_blocking), or its sync-IO pool): a
    /// core that drains waits for that job, which would wait for the core.
    ///
    /// # Errors
    /// [`ShutdownError`] lists cores whose thread panicked.
    pub fn shutdown(mut self, mode: ShutdownMode) -> Result<(), ShutdownError> {
        self.stop(mode)
    }

    fn stop(&mut self, mode: ShutdownMode) -> Result<(), ShutdownError> {
        if std::mem::replace(&mut self.stopped, true) {
            return Ok(());
        }
        if self.handle.cores.iter().any(|c| c.forked()) {
            self.stop_forked();
            return Ok(());
        }
        let (code, deadline) = match mode {
            ShutdownMode::Cancel => (SHUTDOWN_CANCEL, None),
            ShutdownMode::Wait => (SHUTDOWN_DRAIN, None),
            ShutdownMode::WaitTimeout(t) => (
                SHUTDOWN_DRAIN,
                Some(crate::time::deadline_after(Instant::now(), t)),
            ),
        };
        for core in self.handle.cores.iter() {
            core.request_shutdown(code, deadline);
        }
        let me = thread::current().id();
        // A job of one of the runtime's pools cannot wait either: a
        // draining core waits for the job (a `Wait` from there hung).
        if self.threads.iter().any(|t| t.thread().id() == me)
            || self.pools.blocking.runs_current_thread()
            || self.pools.sync_io.runs_current_thread()
        {
            self.stop_detached(mode);
            return Ok(());
        }
        let panicked_cores = join_cores(std::mem::take(&mut self.threads));
        // After the cores: their drivers waited for their sync IO jobs.
        self.pools.shutdown();
        tracing::debug!(?mode, "runtime stopped");
        if panicked_cores.is_empty() {
            Ok(())
        } else {
            Err(ShutdownError { panicked_cores })
        }
    }

    /// [`Runtime::stop`] in a forked child: the cores' threads and the
    /// pools' workers are the parent's (the child has none of them), so
    /// nothing is asked, joined or waited for; the threads' handles are
    /// forgotten (joining or detaching a thread the child does not have
    /// panics or is undefined).
    #[cold]
    fn stop_forked(&mut self) {
        std::mem::forget(std::mem::take(&mut self.threads));
        tracing::debug!("runtime dropped in a forked child: its threads are the parent's");
    }

    /// The end of [`Runtime::stop`] on one of the runtime's own cores (a
    /// task held its last handle): a thread cannot join itself, so a thread
    /// of its own joins the cores, logs any that panicked and shuts the
    /// pools down. The cores were asked to stop; this one stops when the
    /// calling task returns.
    #[cold]
    fn stop_detached(&mut self, mode: ShutdownMode) {
        let threads = std::mem::take(&mut self.threads);
        let pools = self.pools.clone();
        let joined = thread::Builder::new()
            .name("plugio-stop".to_owned())
            .spawn(move || {
                let panicked_cores = join_cores(threads);
                pools.shutdown();
                if panicked_cores.is_empty() {
                    tracing::debug!(?mode, "runtime stopped (from one of its cores)");
                } else {
                    tracing::error!(?panicked_cores, "runtime stopped: cores panicked");
                }
            });
        if let Err(e) = joined {
            // The cores still stop; their threads end unjoined.
            tracing::error!(%e, "no thread to join the runtime's cores");
        }
    }
}

/// Joins the cores' threads; the indices of those that panicked.
fn join_cores(threads: Vec<thread::JoinHandle<()>>) -> Vec<usize> {
    let mut panicked_cores = Vec::new();
    for (index, thread) in threads.into_iter().enumerate() {
        if thread.join().is_err() {
            panicked_cores.push(index);
        }
    }
    panicked_cores
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Err(e) = self.stop(ShutdownMode::Cancel) {
            tracing::error!(%e, "runtime dropped");
        }
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("cores", &self.cores())
            .finish()
    }
}
