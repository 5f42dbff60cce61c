//! `LocalExecutor`: one core on the calling thread, no threads started.
//!
//! Invariants: the executor is core 0 of no runtime; its tasks only run
//! inside [`LocalExecutor::run`]; dropping it cancels the tasks it still
//! owns (on this thread).

use crate::core::{Core, CoreConfig};
use crate::driver::{Driver, ThreadDriver};
use crate::stats::TickStats;
use crate::task::JoinHandle;
use std::fmt;
use std::future::Future;
use std::io;

type LocalDriverFactory = Box<dyn FnOnce(usize) -> io::Result<Box<dyn Driver>>>;

/// Configures a [`LocalExecutor`] (same seams as [`crate::Builder`]).
pub struct LocalBuilder {
    config: CoreConfig,
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
        Ok(LocalExecutor {
            core: Box::new(Core::new(0, driver, self.config)),
        })
    }
}

impl fmt::Debug for LocalBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A single-core executor on the calling thread, for tests and simple
/// programs: `LocalExecutor::builder().build()?.run(future)`.
///
/// It is `!Send`. Tasks spawned on it (with [`crate::spawn_local`] inside
/// `run`, or [`LocalExecutor::spawn_local`]) stay queued between calls to
/// `run` and are cancelled when the executor drops.
pub struct LocalExecutor {
    core: Box<Core>,
}

impl LocalExecutor {
    /// A builder with the defaults.
    pub fn builder() -> LocalBuilder {
        LocalBuilder {
            config: CoreConfig::default(),
            driver: None,
            on_thread_start: None,
        }
    }

    /// An executor with the defaults and the [`ThreadDriver`].
    pub fn new() -> Self {
        LocalExecutor {
            core: Box::new(Core::new(
                0,
                Box::new(ThreadDriver::new()),
                CoreConfig::default(),
            )),
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

    /// Queues a `!Send` future; it runs during the next [`LocalExecutor::run`].
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
