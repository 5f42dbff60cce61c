//! The executor's [`Driver`] for a core: the ring (when io_uring is
//! available) plus the core's inbox and deadline heap.
//!
//! Invariants:
//! - One `DeviceDriver` per thread; it installs its ring in the thread's
//!   core context on creation and removes it on drop, after every op in
//!   flight has completed (buffers are never freed while the kernel owns
//!   them).
//! - `park` delivers every ready completion (inbox, expired timers, CQEs)
//!   on the calling thread and never blocks past the nearest simulated
//!   completion deadline, nor at all when something is already ready.

use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plugio_executor::{Driver, ThreadUnpark, Unpark};

use crate::buf::{current_arena, Arena};
use crate::core::{with_core, Core};
use crate::error::{Error, Result};
use crate::ring::{Ring, RingConfig, RingInfo, RingStats};

static FALLBACK_LOGGED: AtomicBool = AtomicBool::new(false);
static REGISTER_LOGGED: AtomicBool = AtomicBool::new(false);

/// A core's driver: submit + wait in one `io_uring_enter`, and deliver the
/// completions of every backend on this thread.
pub struct DeviceDriver {
    core: Rc<Core>,
    ring: Option<Rc<Ring>>,
    unparker: Arc<dyn Unpark>,
    arena: Option<Rc<Arena>>,
}

impl std::fmt::Debug for DeviceDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceDriver")
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").finish_non_exhaustive()
    }
}

/// True when the calling thread's IO goes through an io_uring: a driver
/// with a ring is installed here. False on a thread without a plugio
/// driver, and where io_uring was refused (`io_uring_disabled`, a seccomp
/// filter, an old kernel) and [`DeviceDriver::new`] fell back to the sync
/// thread pool; tools use it to say which path they measured.
///
/// ```
/// // Not on a plugio core: no ring.
/// assert!(!plugio::device::driver::uring_active());
/// ```
pub fn uring_active() -> bool {
    crate::ring::with_current(|_| ()).is_some()
}

impl DeviceDriver {
    /// Creates the driver for the calling thread with an io_uring built from
    /// `config`. Where io_uring is refused (`io_uring_disabled`, seccomp
    /// `EPERM`/`ENOSYS`, an old kernel) it logs once and runs without a
    /// ring: file backends then use the sync pool on this thread.
    ///
    /// # Errors
    /// A driver is already installed on this thread; `config` is out of
    /// range ([`RingConfig::validate`]: checked first, so a bad size is
    /// not taken for a kernel without io_uring); the process or the
    /// system is out of file descriptors (`EMFILE`, `ENFILE`: not a
    /// reason to fall back, the message says which limit to raise).
    pub fn new(config: &RingConfig) -> Result<Self> {
        config.validate()?;
        match Ring::new(config) {
            Ok(ring) => Self::install(Some(Rc::new(ring))),
            // Out of descriptors is not io_uring refused: falling back
            // made a core several times slower per IO, silently, next to
            // cores that had rings (found by a break-it helper).
            Err(e) if matches!(e.errno(), libc::EMFILE | libc::ENFILE) => Err(
                e.with_context("the core's io_uring could not be set up (no file descriptor left)")
            ),
            Err(e) => {
                // Relaxed: a log-once flag; nothing else is published.
                if !FALLBACK_LOGGED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "io_uring unavailable; using the sync thread pool");
                }
                Self::install(None)
            }
        }
    }

    /// Like [`DeviceDriver::new`] but fails instead of falling back.
    ///
    /// # Errors
    /// io_uring setup failed, or a driver is already installed.
    pub fn with_ring(config: &RingConfig) -> Result<Self> {
        Self::install(Some(Rc::new(Ring::new(config)?)))
    }

    /// A driver without a ring (sync pool and mem device only).
    ///
    /// # Errors
    /// A driver is already installed on this thread.
    pub fn without_ring() -> Result<Self> {
        Self::install(None)
    }

    fn install(ring: Option<Rc<Ring>>) -> Result<Self> {
        crate::fork::install();
        let core = with_core(Rc::clone);
        if core.stale() {
            return Err(Error::from_errno(libc::EBUSY).with_context(
                "this thread's DeviceDriver was built before fork(): build the child's \
                 runtime on new threads (plugio_engine::runtime::builder), not this one",
            ));
        }
        // One driver per thread, with a ring or without: a second one
        // would replace the first's ring, and its drop would leave the
        // first unattached (`driver_serves`).
        if core.drivers() > 0 {
            return Err(Error::from_errno(libc::EBUSY)
                .with_context("a DeviceDriver is already installed on this thread"));
        }
        let unparker: Arc<dyn Unpark> = match &ring {
            Some(r) => r.unparker(),
            None => Arc::new(ThreadUnpark::current()),
        };
        core.set_ring(ring.clone());
        core.set_unpark(unparker.clone());
        core.driver_count_add(1);
        let arena = ring.as_ref().and_then(|r| register_arena(r));
        Ok(Self {
            core,
            ring,
            unparker,
            arena,
        })
    }

    /// The ring's setup and probed features; `None` without a ring.
    pub fn ring_info(&self) -> Option<&RingInfo> {
        self.ring.as_ref().map(|r| r.info())
    }

    /// The ring's push-back counters; `None` without a ring.
    pub fn ring_stats(&self) -> Option<RingStats> {
        self.ring.as_ref().map(|r| r.stats())
    }

    /// Ops in flight on this core's ring (none of the parent's are this
    /// process's in a forked child).
    pub fn in_flight(&self) -> usize {
        self.live_ring().map_or(0, |r| r.in_flight())
    }

    /// The ring, unless it is a forked child's copy of its parent's.
    fn live_ring(&self) -> Option<&Rc<Ring>> {
        self.ring.as_ref().filter(|r| !r.stale())
    }

    #[cfg(test)]
    pub(crate) fn ring(&self) -> Option<&Rc<Ring>> {
        self.ring.as_ref()
    }

    fn park_inner(&self, timeout: Option<Duration>) -> Result<()> {
        // The file size limit is read again in the next tick (a limit
        // lowered meanwhile is seen there).
        crate::file_size_limit::forget_cached_limit();
        let delivered = self.core.run_ready();
        let mut timeout = if delivered > 0 {
            Some(Duration::ZERO)
        } else {
            timeout
        };
        let now = Instant::now();
        if let Some(deadline) = self.core.next_deadline() {
            let until = deadline.saturating_duration_since(now);
            timeout = Some(timeout.map_or(until, |t| t.min(until)));
        }
        // In a forked child the parent's ring is left alone: the core
        // parks as one without a ring (its IO is refused; timers still
        // run), for at most 10 ms at a time, since a wake from another
        // thread still goes to the ring's eventfd.
        if self.ring.is_some() && self.live_ring().is_none() {
            let cap = Duration::from_millis(10);
            timeout = Some(timeout.map_or(cap, |t| t.min(cap)));
        }
        match self.live_ring() {
            Some(ring) => {
                ring.park(&*self.core, timeout)?;
            }
            None if self.core.has_ready(now) => {}
            None => match timeout {
                Some(t) if t.is_zero() => {}
                Some(t) => std::thread::park_timeout(t),
                None => std::thread::park(),
            },
        }
        if delivered == 0 {
            self.core.run_ready();
        }
        Ok(())
    }
}

/// Registers the thread's buffer arena with `ring` as fixed buffer 0;
/// where the kernel refuses (`RLIMIT_MEMLOCK`, `ENOMEM`; `EFAULT` for an
/// arena over 1 GiB, io_uring's limit for one registered buffer) logs once
/// and leaves buffers unregistered (same results, no `READ_FIXED`).
fn register_arena(ring: &Ring) -> Option<Rc<Arena>> {
    let arena = current_arena()?;
    let iov = arena.iovec();
    // SAFETY: the driver keeps the arena (and so its memory) alive while the
    // ring exists; the ring is dropped with the driver.
    match unsafe { ring.register_buffers(&[iov]) } {
        Ok(()) => {
            arena.set_fixed_index(Some(0));
            Some(arena)
        }
        Err(e) => {
            // Relaxed: a log-once flag; nothing else is published.
            if !REGISTER_LOGGED.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, bytes = iov.iov_len, "buffer registration refused; using unregistered buffers");
            }
            Some(arena)
        }
    }
}

/// How long a driver's drain at shutdown waits for the ring's ops in
/// flight before it cancels them (see `DeviceDriver::drain`): far longer
/// than a device takes, so only an op that would never end is cut short.
const CANCEL_AFTER: Duration = Duration::from_secs(1);

impl DeviceDriver {
    /// Waits until every op submitted on this thread (ring, pool, mem) has
    /// completed and been delivered, so no buffer the kernel or a pool
    /// thread still uses is freed when the thread's state goes away.
    /// Every future is gone by now, so what is in flight is orphaned: after
    /// [`CANCEL_AFTER`] of waiting, and every [`CANCEL_AFTER`] again, the
    /// ring's ops are cancelled, so that an op that never completes on its
    /// own (a pipe with no writer) does not hold the shutdown forever.
    /// A pool thread's blocking call cannot be cancelled.
    fn drain(&self) {
        if self.core.stale() {
            // A forked child: what was in flight is the parent's (its
            // ring, its pool threads), and completes there.
            return;
        }
        let mut waited = Duration::ZERO;
        let step = Duration::from_millis(100);
        let start = Instant::now();
        let mut next_cancel = CANCEL_AFTER;
        while self.in_flight() > 0 || self.core.external() > 0 {
            if self.in_flight() > 0 && start.elapsed() >= next_cancel {
                if let Some(ring) = self.live_ring() {
                    tracing::warn!(
                        ring = self.in_flight(),
                        "IO still in flight at shutdown: cancelling it"
                    );
                    ring.cancel_in_flight();
                }
                next_cancel += CANCEL_AFTER;
            }
            if let Err(e) = self.park_inner(Some(step)) {
                tracing::error!(error = %e, "park failed while draining at shutdown");
                if self.ring.is_some() && self.in_flight() > 0 {
                    // The ring is broken: its ops will never be reaped. Keep
                    // their memory alive rather than risk a use after free.
                    if let Some(ring) = &self.ring {
                        std::mem::forget(ring.clone());
                    }
                    return;
                }
            }
            waited += step;
            if waited.as_secs() % 10 == 0 && waited.subsec_millis() == 0 {
                tracing::warn!(
                    ring = self.in_flight(),
                    other = self.core.external(),
                    "still waiting for in-flight IO at shutdown"
                );
            }
        }
    }
}

impl Driver for DeviceDriver {
    fn park(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.park_inner(timeout).map_err(io::Error::from)
    }

    fn unparker(&self) -> Arc<dyn Unpark> {
        self.unparker.clone()
    }

    /// Records `core_uid` as the one executor core whose IO this driver
    /// reaps (see [`driver_serves`](crate::driver_serves)).
    fn attach(&self, core_uid: u64) {
        self.core.set_owner(core_uid);
    }
}

impl Drop for DeviceDriver {
    fn drop(&mut self) {
        self.drain();
        if let Some(arena) = &self.arena {
            arena.set_fixed_index(None);
        }
        self.core.set_ring(None);
        self.core.set_unpark(Arc::new(ThreadUnpark::current()));
        self.core.driver_count_add(-1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::file::OpenOptions;
    use crate::backend::BackendKind;
    use crate::fs::File;
    use std::future::Future;

    #[test]
    fn a_second_driver_on_the_thread_is_refused_with_or_without_a_ring() {
        let first = DeviceDriver::without_ring().expect("first");
        let second = DeviceDriver::without_ring().map(|_| ());
        assert_eq!(second.expect_err("second").errno(), libc::EBUSY);
        drop(first);
        // The thread takes a driver again once the first is gone.
        drop(DeviceDriver::without_ring().expect("after the first"));
    }

    /// Out of file descriptors, a driver is refused with the limit to
    /// raise instead of running on the sync pool (which it did silently:
    /// 5 descriptors gave a runtime one core with a ring and one without).
    #[test]
    fn a_driver_out_of_descriptors_is_refused_not_run_without_a_ring() {
        let report = crate::testing::in_forked_child(20, || {
            // The child's lowest free descriptor is at least 3: a limit
            // of 3 leaves none.
            let limit = libc::rlimit {
                rlim_cur: 3,
                rlim_max: 3,
            };
            // SAFETY: setrlimit reads the struct, which lives on the stack.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
                return Err("setrlimit".into());
            }
            match DeviceDriver::new(&RingConfig::default()) {
                Ok(_) => Err("a driver without descriptors was built".into()),
                Err(e) if e.errno() == libc::EMFILE && e.to_string().contains("ulimit -n") => {
                    Ok(())
                }
                Err(e) => Err(format!("another error: {e}")),
            }
        });
        assert_eq!(report, Ok(()));
    }

    #[test]
    fn drop_waits_for_pool_ops_of_dropped_futures() {
        let tmp = tempfile::NamedTempFile::new_in(crate::testing::direct_io_dir()).expect("tmp");
        tmp.as_file().set_len(1 << 20).expect("size");
        let driver = DeviceDriver::without_ring().expect("driver");
        let file = File::open_with(tmp.path(), OpenOptions::new().backend(BackendKind::Sync))
            .expect("open");
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        for i in 0..16u64 {
            let mut fut = Box::pin(file.read_at(file.alloc_buf(65536), i * 65536));
            assert!(fut.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(with_core(|c| c.external()), 16);
        drop(driver);
        assert_eq!(
            with_core(|c| c.external()),
            0,
            "drained before drop returned"
        );
    }
}
