//! Blocking pools: where a runtime runs blocking calls (`spawn_blocking`)
//! and the sync IO backend's `preadv`/`pwritev`, off its cores.
//!
//! Each [`Runtime`](crate::Runtime) and [`LocalExecutor`](crate::LocalExecutor)
//! owns two [`BlockingPool`]s, shared by its cores:
//! - the **blocking pool**, for [`spawn_blocking`]: at most
//!   [`DEFAULT_MAX_BLOCKING_THREADS`] (512, tokio's default) threads,
//!   changed with [`Builder::max_blocking_threads`](crate::Builder::max_blocking_threads);
//! - the **sync IO pool**, for the device crate's sync backend (file IO on a
//!   core without io_uring): [`DEFAULT_SYNC_IO_THREADS`] (4) threads,
//!   changed with [`Builder::sync_io_threads`](crate::Builder::sync_io_threads).
//!   It is separate so that user calls that block for long (a DNS lookup, a
//!   `std::fs` walk) filling the blocking pool never starve the runtime's
//!   IO.
//!
//! A pool thread runs on the CPUs of the thread that made the pool (the
//! runtime's builder, before its cores were pinned), not only on the CPU
//! of the pinned core whose job started it: blocking work does not take a
//! pinned core's CPU from its IO.
//!
//! Both start no thread until the first job; a thread that stays idle for
//! the keep-alive time ([`DEFAULT_BLOCKING_KEEP_ALIVE`], 10 s, changed with
//! [`Builder::blocking_keep_alive`](crate::Builder::blocking_keep_alive))
//! exits. When every thread of a pool is busy and the pool is at its bound,
//! new jobs wait in the pool's FIFO queue (unbounded, like tokio's) until a
//! thread finishes its job: submitting never blocks and never fails for
//! lack of threads. [`BlockingPool::queued`] shows the wait.
//!
//! Why not the `blocking` crate: its pool is one per process, sized by an
//! environment variable, so it can be neither bounded per runtime nor shut
//! down with one; this module is that crate's design (lazy threads, idle
//! keep-alive, one queue) made per runtime. Idea: tokio's
//! `runtime/blocking/pool.rs`.
//!
//! The pools themselves are in the crate's private `pools` module; this
//! module is their public face with [`spawn_blocking`] (defined with
//! `spawn` in the core, which holds the pools: so neither imports the
//! other in a cycle).
//!
//! ```
//! use plugio::executor::blocking::{spawn_blocking, BlockingPool};
//! use plugio::LocalExecutor;
//!
//! let ex = LocalExecutor::new();
//! let (sum, bounded) = ex.run(async {
//!     let sum = spawn_blocking(|| (1..=10u64).sum::<u64>()).await;
//!     (sum, BlockingPool::current().map(|p| p.max_threads() > 0))
//! });
//! assert_eq!(sum?, 55);
//! assert_eq!(bounded, Some(true));
//! # Ok::<_, plugio::executor::JoinError>(())
//! ```

pub use crate::core::spawn_blocking;
pub use crate::pools::{
    BlockingPool, DEFAULT_BLOCKING_KEEP_ALIVE, DEFAULT_MAX_BLOCKING_THREADS,
    DEFAULT_SYNC_IO_THREADS,
};
