//! The per-core (per-thread) completion context.
//!
//! Invariants:
//! - A [`CompletionHandler`] registered on a thread is only ever called on
//!   that thread, from inside the driver's `park` (or
//!   [`run_completions`]), never from inside a `submit`.
//! - Ring completions are handed over in batches: one
//!   [`CompletionHandler::complete_batch`] call per run of consecutive CQEs
//!   of the same handler in one reap (inbox and timer completions come one
//!   per call).
//! - Each completion is delivered at most once: it is removed from the
//!   ring slot, inbox or timer heap before its handler runs.
//! - Completions produced on other threads (sync pool) are pushed to the
//!   core's `Inbox` and the core is unparked; timed completions (mem
//!   device latency) live in the core's deadline heap, which shortens the
//!   park timeout.

use std::cell::{Cell, RefCell};
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use plugio_executor::{ThreadUnpark, Unpark};

pub(crate) use crate::completion::{Completion, DeliverBatch};
pub use crate::completion::{CompletionHandler, HandlerId};
use crate::ring::Ring;

/// The cross-thread side of a core: where other threads post completions.
pub(crate) struct Inbox {
    queue: Mutex<Vec<Completion>>,
    unpark: Mutex<Arc<dyn Unpark>>,
}

impl Inbox {
    /// Queues a completion for the owning core and wakes it.
    pub fn post(&self, completion: Completion) {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(completion);
        self.wake();
    }

    /// Wakes the owning core without a completion: its park returns and
    /// it runs a tick.
    fn wake(&self) {
        let unpark = self
            .unpark
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        unpark.unpark();
    }

    fn take(&self) -> Vec<Completion> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn is_empty(&self) -> bool {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }
}

/// An op whose effect and completion happen at a deadline (mem device).
pub(crate) type TimedAction = Box<dyn FnOnce() -> i32>;

struct Timed {
    deadline: Instant,
    seq: u64,
    handler: HandlerId,
    token: u64,
    action: TimedAction,
}

impl PartialEq for Timed {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timed {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

/// The per-thread context: handlers, inbox, deadline heap, and the ring when
/// a driver with a ring is installed.
pub(crate) struct Core {
    handlers: RefCell<Vec<Option<Rc<dyn CompletionHandler>>>>,
    inbox: Arc<Inbox>,
    timers: RefCell<BinaryHeap<Reverse<Timed>>>,
    // Only the simulated device (`test-util`) schedules timed completions.
    #[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
    timer_seq: Cell<u64>,
    /// Ops handed to other threads (pool) or to the deadline heap whose
    /// completions have not been delivered yet.
    external: Cell<usize>,
    ring: RefCell<Option<Rc<Ring>>>,
    /// `DeviceDriver`s alive on this thread (0 or 1).
    drivers: Cell<usize>,
    /// The executor core the driver was attached to (`Driver::attach`), if
    /// it was: only IO of that core is reaped by its parks.
    owner_uid: Cell<Option<u64>>,
    /// The fork generation the driver was installed in (see `fork`).
    fork_generation: Cell<u64>,
}

thread_local! {
    static CORE: Rc<Core> = Rc::new(Core::new());
}

/// Whether a [`DeviceDriver`](crate::DeviceDriver) is installed on the
/// calling thread: only then are ring completions, sync-pool completions
/// and simulated (mem device) completions delivered, by its `park`. IO
/// submitted on a thread without one would never complete.
pub fn driver_installed() -> bool {
    CORE.try_with(|c| c.drivers.get() > 0).unwrap_or(false)
}

/// Whether the [`DeviceDriver`](crate::DeviceDriver) installed on the
/// calling thread serves executor core `core_uid`: it is installed and was
/// attached to that core, or to none (a driver used without an executor,
/// or wrapped by a driver that does not forward
/// [`Driver::attach`](plugio_executor::Driver::attach)). IO of another
/// executor on the same thread would wait for parks of its own, which do
/// not reap this thread's ring: it must be refused.
///
/// ```
/// let ex = plugio::LocalExecutor::new(); // no DeviceDriver
/// let uid = ex.run(async { plugio::executor::core_uid() }).unwrap();
/// assert!(!plugio::device::driver_serves(uid));
/// ```
pub fn driver_serves(core_uid: u64) -> bool {
    CORE.try_with(|c| c.drivers.get() > 0 && c.owner_uid.get().is_none_or(|o| o == core_uid))
        .unwrap_or(false)
}

/// True when the calling code may put ops on this thread's ring: a
/// driver is installed, and the caller is the executor core it reaps for
/// ([`driver_serves`]), or the driver is attached to no core (a driver
/// driven without an executor, as `testing::block_on` does). False off a
/// core while the thread's driver belongs to one (a plain `block_on` in
/// `main` beside an idle runtime): nothing would reap the op there, and
/// its future would wait forever.
pub(crate) fn ring_serves_caller() -> bool {
    CORE.try_with(|c| {
        c.drivers.get() > 0
            && match (c.owner_uid.get(), plugio_executor::core_uid()) {
                (None, _) => true,
                (Some(owner), Some(uid)) => owner == uid,
                (Some(_), None) => false,
            }
    })
    .unwrap_or(false)
}

/// A way for any thread to wake the calling thread's core: its park
/// returns and it runs a tick (and the tick's end hooks), as when a
/// completion is posted to it. The engine wakes the cores that hold a
/// device when its last handle is dropped elsewhere, so that an idle core
/// lets go of the file.
///
/// ```
/// let ex = plugio::runtime::local(plugio::RingConfig::default()).unwrap();
/// let waker = ex.run(async { plugio::device::core_waker() });
/// waker.unpark(); // wakes that executor's core when it parks next
/// ```
pub fn core_waker() -> Arc<dyn Unpark> {
    Arc::new(CoreWaker(CORE.with(|c| c.inbox())))
}

/// [`core_waker`]'s waker: the core's inbox, whose unparker is the
/// driver's current one.
struct CoreWaker(Arc<Inbox>);

impl Unpark for CoreWaker {
    fn unpark(&self) {
        self.0.wake();
    }
}

/// Runs `f` with the current thread's core context.
pub(crate) fn with_core<R>(f: impl FnOnce(&Rc<Core>) -> R) -> R {
    CORE.with(f)
}

/// The ring of the current thread, if a driver with a ring is installed.
pub(crate) fn current_ring() -> Option<Rc<Ring>> {
    with_core(|core| core.ring())
}

impl Drop for Core {
    fn drop(&mut self) {
        // The ring goes with the core: forget the fast pointer to it.
        crate::ring::set_current(None);
    }
}

impl Core {
    fn new() -> Self {
        Self {
            handlers: RefCell::new(Vec::new()),
            inbox: Arc::new(Inbox {
                queue: Mutex::new(Vec::new()),
                unpark: Mutex::new(Arc::new(ThreadUnpark::current())),
            }),
            timers: RefCell::new(BinaryHeap::new()),
            timer_seq: Cell::new(0),
            external: Cell::new(0),
            ring: RefCell::new(None),
            drivers: Cell::new(0),
            owner_uid: Cell::new(None),
            fork_generation: Cell::new(0),
        }
    }

    /// Notes that a `DeviceDriver` was installed (+1, in the current fork
    /// generation) or dropped (-1).
    pub fn driver_count_add(&self, delta: isize) {
        if delta > 0 {
            self.fork_generation.set(crate::fork::generation());
        }
        // A new driver is attached anew; a dropped one's owner is gone.
        self.owner_uid.set(None);
        self.drivers
            .set(self.drivers.get().saturating_add_signed(delta));
        debug_assert!(self.drivers.get() <= 1, "one DeviceDriver per thread");
    }

    /// `DeviceDriver`s alive on this thread (0 or 1).
    pub fn drivers(&self) -> usize {
        self.drivers.get()
    }

    /// Records the executor core that owns this thread's driver.
    pub fn set_owner(&self, core_uid: u64) {
        self.owner_uid.set(Some(core_uid));
    }

    /// This thread's driver was installed before a fork of the process:
    /// IO through it is refused (see `fork`).
    #[inline]
    pub fn stale(&self) -> bool {
        self.drivers.get() > 0 && self.fork_generation.get() != crate::fork::generation()
    }

    /// The fork generation of this thread's driver, if one is installed.
    pub fn driver_generation(&self) -> Option<u64> {
        (self.drivers.get() > 0).then(|| self.fork_generation.get())
    }

    /// The inbox other threads post to.
    pub fn inbox(&self) -> Arc<Inbox> {
        self.inbox.clone()
    }

    /// Sets how other threads wake this core (the driver's unparker).
    pub fn set_unpark(&self, unpark: Arc<dyn Unpark>) {
        *self
            .inbox
            .unpark
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = unpark;
    }

    /// Records an op whose completion will come through the inbox.
    pub fn add_external(&self) {
        self.external.set(self.external.get() + 1);
    }

    /// Ops whose completion will come through the inbox or the deadline
    /// heap and has not been delivered yet.
    pub fn external(&self) -> usize {
        self.external.get()
    }

    fn delivered_external(&self, n: usize) {
        self.external.set(self.external.get().saturating_sub(n));
    }

    /// The installed ring, if any.
    pub fn ring(&self) -> Option<Rc<Ring>> {
        self.ring.borrow().clone()
    }

    /// Installs or removes the ring; returns the previous one.
    pub fn set_ring(&self, ring: Option<Rc<Ring>>) -> Option<Rc<Ring>> {
        crate::ring::set_current(ring.as_ref());
        std::mem::replace(&mut *self.ring.borrow_mut(), ring)
    }

    fn register(&self, handler: Rc<dyn CompletionHandler>) -> HandlerId {
        let mut handlers = self.handlers.borrow_mut();
        let index = match handlers.iter().position(Option::is_none) {
            Some(free) => {
                handlers[free] = Some(handler);
                free
            }
            None => {
                handlers.push(Some(handler));
                handlers.len() - 1
            }
        };
        HandlerId(index as u32)
    }

    fn unregister(&self, id: HandlerId) -> Option<Rc<dyn CompletionHandler>> {
        self.handlers
            .borrow_mut()
            .get_mut(id.0 as usize)
            .and_then(Option::take)
    }

    /// Calls the handler of `c` (if it is still registered).
    pub fn deliver(&self, c: Completion) {
        self.deliver_batch(c.handler, &[(c.token, c.result)]);
    }

    /// Hands `completions` to `id`'s handler in one call (if it is still
    /// registered). The handler is cloned out first, so it may register or
    /// unregister handlers while it runs.
    pub fn deliver_batch(&self, id: HandlerId, completions: &[(u64, i32)]) {
        let handler = self
            .handlers
            .borrow()
            .get(id.0 as usize)
            .and_then(Clone::clone);
        match handler {
            Some(h) => h.complete_batch(completions),
            None => tracing::debug!(
                n = completions.len(),
                "completions for an unregistered handler dropped"
            ),
        }
    }

    /// Schedules `action` to run at `deadline`; its return value is the
    /// completion result delivered to `handler` with `token`.
    #[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
    pub fn schedule(&self, deadline: Instant, handler: HandlerId, token: u64, action: TimedAction) {
        let seq = self.timer_seq.get();
        self.timer_seq.set(seq + 1);
        self.add_external();
        self.timers.borrow_mut().push(Reverse(Timed {
            deadline,
            seq,
            handler,
            token,
            action,
        }));
    }

    /// The earliest timed completion.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.borrow().peek().map(|t| t.0.deadline)
    }

    /// True when the inbox holds completions or a timer has expired.
    pub fn has_ready(&self, now: Instant) -> bool {
        !self.inbox.is_empty() || self.next_deadline().is_some_and(|d| d <= now)
    }

    /// Delivers the inbox and the expired timed completions of the earliest
    /// deadline (one deadline per call, so tasks react to each simulated
    /// instant before the next; this keeps simulated runs deterministic).
    /// Returns how many were delivered.
    pub fn run_ready(&self) -> usize {
        let mut delivered = 0;
        for c in self.inbox.take() {
            self.deliver(c);
            delivered += 1;
        }
        let now = Instant::now();
        let mut group: Option<Instant> = None;
        loop {
            let timed = {
                let mut timers = self.timers.borrow_mut();
                match timers.peek() {
                    Some(t)
                        if t.0.deadline <= now
                            && (group.is_none() || group == Some(t.0.deadline)) =>
                    {
                        timers.pop().map(|t| t.0)
                    }
                    _ => None,
                }
            };
            let Some(timed) = timed else { break };
            group = Some(timed.deadline);
            let result = (timed.action)();
            self.deliver(Completion {
                handler: timed.handler,
                token: timed.token,
                result,
            });
            delivered += 1;
        }
        self.delivered_external(delivered);
        delivered
    }
}

impl DeliverBatch for Core {
    #[inline]
    fn deliver_batch(&self, id: HandlerId, completions: &[(u64, i32)]) {
        Core::deliver_batch(self, id, completions);
    }
}

/// Registers `handler` on the current thread's core and returns its id.
/// Ops submitted with this id complete on this thread, inside the driver's
/// `park`. Ids of unregistered handlers are reused.
pub fn register_handler(handler: Rc<dyn CompletionHandler>) -> HandlerId {
    with_core(|core| core.register(handler))
}

/// Removes a handler registered on the current thread. Completions that
/// arrive for it later are dropped (logged at debug level), so only
/// unregister a handler with nothing in flight.
pub fn unregister_handler(id: HandlerId) -> Option<Rc<dyn CompletionHandler>> {
    with_core(|core| core.unregister(id))
}

/// Delivers the completions already available on this thread without
/// blocking: reaps the ring (after submitting what is queued), the inbox and
/// expired timers. Returns how many were delivered. The driver's `park`
/// does this too; this is for callers that poll without parking.
///
/// # Errors
/// An unrecoverable `io_uring_enter` error.
pub fn run_completions() -> crate::Result<usize> {
    let core = with_core(Rc::clone);
    let mut delivered = 0;
    if let Some(ring) = core.ring() {
        delivered += ring.poll_completions(&*core)?;
    }
    delivered += core.run_ready();
    Ok(delivered)
}

/// Submits what is queued on this thread's ring now, in one
/// `io_uring_enter`, without waiting. Optional: the next `park` submits
/// and waits in one enter, and a full SQ is submitted by the ring itself,
/// so callers only need this to start IO early (say, before a long
/// computation). Costs no syscall when nothing is queued. A no-op without
/// a ring.
///
/// # Errors
/// An unrecoverable `io_uring_enter` error (transient ones are retried at the
/// next park).
pub fn submit_now() -> crate::Result<()> {
    crate::ring::with_current(|ring| ring.submit_pending()).unwrap_or(Ok(()))
}
