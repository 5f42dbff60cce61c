//! The engine's per-core state and how an IO finds it: the bio table, the
//! plug, the per-device queues, the tick hook that flushes the plug and
//! the completion handler. The verbs live in their own modules, in the
//! order one IO meets them: [`flush`](crate::flush) (plug to requests),
//! [`order`](crate::order) (barriers), [`dispatch`](crate::dispatch) (tags
//! and submission), [`complete`](crate::complete).
//!
//! Invariants:
//! - One [`EngineCore`] per executor core (per thread, per `core_uid`),
//!   created on first IO; everything in it is touched only by that thread.
//!   Completions for requests dispatched here are delivered here (the
//!   device layer's handler contract).
//! - The tick hook flushes the plug before every park, so no bio waits in
//!   the plug while the core sleeps.
//! - An IO finds its core once per poll through a one-entry thread-local
//!   cache of the last core used (no scan, no lookup table), and its device
//!   through a one-entry cache of the last device used.
//! - No `RefCell` borrow is held while a waker is woken or a backend is
//!   called back into.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::Waker;

use plugio_device::{
    register_handler, unregister_handler, CompletionHandler, Error, ErrorKind, HandlerId,
};
use plugio_executor::TickHook;

use crate::bio::BioTable;
use crate::clock;
use crate::plug::{Plug, Plugged};
use crate::queue::{CoreDev, DevList, FAST};
use crate::request::RqState;
use crate::shared::DeviceShared;
use crate::status::Done;
use crate::tag::Tag;

/// The engine states of the executor cores a thread runs (usually one).
/// Dropping it (thread exit) forgets the [`LAST`] pointer first, and
/// leaks every state that has IO at the kernel (see `Drop`).
struct Cores(RefCell<Vec<Rc<EngineCore>>>);

impl Drop for Cores {
    /// A state whose requests still hold tags may have IO at the kernel:
    /// an executor kept in a thread-local that is destroyed after this one
    /// (a per-thread runtime in a `thread_local!`) drains its ring only
    /// when it drops, later. Dropping such a state would free the memory
    /// its orphaned bios keep while the kernel may still write into it
    /// (found by a break-it helper), so it is kept instead, for the rest
    /// of the process, in [`KEPT_AT_EXIT`]: its handler stays registered,
    /// and the driver's drain completes its requests (their tags go back
    /// to the device; their memory is dropped once the kernel is done).
    /// States with nothing at the kernel are dropped as before.
    fn drop(&mut self) {
        let _ = LAST.try_with(|l| l.set(std::ptr::null()));
        for core in self.0.get_mut().drain(..) {
            if core.holds_tags() {
                keep_at_exit(core);
            }
        }
    }
}

/// The engine states of exited threads that still had IO at the kernel
/// (see `Cores`' `Drop`), as pointers from `Rc::into_raw`: never freed,
/// and listed here rather than forgotten so that leak checkers (and a
/// debugger) see them as reachable.
static KEPT_AT_EXIT: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// Keeps `core` alive for the rest of the process (see [`KEPT_AT_EXIT`]).
#[cold]
fn keep_at_exit(core: Rc<EngineCore>) {
    let ptr = Rc::into_raw(core) as usize;
    if let Ok(mut kept) = KEPT_AT_EXIT.lock() {
        kept.push(ptr);
    }
}

thread_local! {
    /// See [`EngineCore::current`].
    static CORES: Cores = const { Cores(RefCell::new(Vec::new())) };
    /// The engine state used last on this thread: the per-IO lookup, one
    /// plain load, a null test and a compare of the state's `uid`. The
    /// pointer is null or names a state held by `CORES` (it is reset
    /// whenever a state leaves `CORES`, and when `CORES` is destroyed).
    /// (It held the uid beside the pointer, and each lookup tested both,
    /// with flag arithmetic, where now it tests the uid only behind the
    /// null test.)
    static LAST: Cell<*const EngineCore> = const { Cell::new(std::ptr::null()) };
}

/// [`EngineCore::fork_generation`] of a core made on a thread without a
/// device driver: no fork generation refuses its IO.
const NO_DRIVER_GENERATION: u64 = u64::MAX;

/// The engine's state on one core.
pub(crate) struct EngineCore {
    pub core: usize,
    /// The executor core this state belongs to (`core_uid`).
    pub uid: u64,
    pub handler: HandlerId,
    pub bios: RefCell<BioTable>,
    pub plug: RefCell<Plug>,
    pub devs: RefCell<DevList>,
    /// `(device id, index)` of the device used last (the per-IO lookup).
    last_dev: Cell<(u64, u32)>,
    pub scratch_bios: RefCell<Vec<Plugged>>,
    pub scratch_tags: RefCell<Vec<Tag>>,
    pub scratch_puts: RefCell<Vec<Tag>>,
    pub scratch_failed: RefCell<Vec<Done>>,
    pub wake_list: RefCell<Vec<Waker>>,
    pub flushing: Cell<bool>,
    /// The fork generation of this thread's device driver (see
    /// `plugio_device::fork`): IO is refused where it is not the current
    /// one (a forked child). [`NO_DRIVER_GENERATION`] where the thread had
    /// no driver (then no generation refuses IO here). (A plain `u64`, not
    /// an `Option`: the test is one compare with the fork counter
    /// where the core was made in the current generation, the common
    /// case, where the `Option` tested its tag first.)
    fork_generation: u64,
}

/// The hook and handler registered with the executor and the device layer
/// for one [`EngineCore`]; both forward to that core (not to whatever core
/// is current), so a late completion always reaches the bios it belongs
/// to.
struct CoreHooks {
    core: std::cell::OnceCell<Weak<EngineCore>>,
}

impl CoreHooks {
    fn core(&self) -> Option<Rc<EngineCore>> {
        self.core.get().and_then(Weak::upgrade)
    }
}

impl TickHook for CoreHooks {
    fn tick_end(&self) -> bool {
        if let Some(core) = self.core() {
            EngineCore::flush(&core);
            if core.forked() {
                core.wake_forked();
            }
        }
        // The core may park now: the next time read must be fresh.
        clock::invalidate();
        false
    }

    /// Bios wait in the plug (polled inside `LocalExecutor::enter`): only
    /// the next tick's end sends them. Or a device this core holds was
    /// closed (its last handle dropped) and is idle: the tick's end lets
    /// go of it, closing its file (a `run` whose future was ready at once
    /// has no tick, and the file stayed open; found by a break-it helper).
    fn has_pending(&self) -> bool {
        self.core().is_some_and(|c| {
            !c.plug.borrow().bios.is_empty() || c.devs.borrow().iter().any(|d| d.idle_closed())
        })
    }

    /// The executor closes: what it never sent (the plug, requests
    /// waiting for tags or for earlier ones) never will be. It ends now,
    /// freeing the buffers of the IO its cancelled tasks dropped; what is
    /// in flight completes as the driver drains (requests past the queue
    /// depth kept their buffers until the thread exited: found by a
    /// break-it helper).
    fn core_closing(&self) {
        let Some(core) = self.core() else { return };
        // Again while the buffers' drops (after `abandon`) plug more IO,
        // a few rounds at most; the thread's exit frees the rest.
        for _ in 0..8 {
            // Contained: a panic here (a debug check of a state a panic
            // broke) while a panic unwinds through the executor's drop
            // would abort the process.
            let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| core.abandon()));
            if ended.is_err() || core.plug.borrow().bios.is_empty() {
                break;
            }
        }
        // With nothing in flight or unfinished here, the state goes now,
        // and with it the devices it holds: their files close once no
        // handle holds them either (they stayed open until the thread made
        // another engine state or exited; found by a break-it helper). A
        // busy state stays for its completions and its futures' results.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if !core.busy() {
                EngineCore::forget(&core);
            }
        }));
    }
}

impl CompletionHandler for CoreHooks {
    fn complete(&self, token: u64, result: i32) {
        self.complete_batch(&[(token, result)]);
    }

    fn complete_batch(&self, completions: &[(u64, i32)]) {
        if let Some(core) = self.core() {
            core.complete_batch(completions);
        }
    }
}

/// The context of the `NoDriver` error of IO polled off a plugio core.
const OFF_CORE: &str = "a plugio Device future was polled outside a plugio core (a plain \
    block_on, another runtime's thread): await it inside plugio::runtime::local(RingConfig::default())?.run(..), \
    or hand it to a core with Handle::spawn_on(core, ..) of a runtime from plugio::runtime::builder";

/// The context of the `NoDriver` error of IO on an executor built without
/// the device driver.
const NO_DEVICE_DRIVER: &str =
    "this plugio executor has no DeviceDriver (built with LocalExecutor::new \
    or the bare plugio::Runtime::builder()), so nothing would reap the IO: build it with \
    plugio::runtime::local or plugio::runtime::builder(ring)";

impl EngineCore {
    /// The engine state of the calling thread's current executor core,
    /// created (and its hook and handler registered) on first use.
    ///
    /// A thread may run several executors, one after another or
    /// interleaved: each gets its own engine state, found by the executor
    /// core's `core_uid`. A state whose executor moved on is kept while it
    /// still has IO in flight or plugged (its buffers belong to the kernel;
    /// its handler stays registered so the completions reach it), and
    /// dropped, with its handler, once idle.
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`] when the thread is not a plugio executor
    /// core, or its executor has no `DeviceDriver` (nothing would reap the
    /// completions).
    #[inline]
    pub fn current() -> Result<Rc<EngineCore>, Error> {
        if let Some(c) = plugio_executor::core_uid().and_then(Self::by_uid) {
            return Ok(c);
        }
        Self::current_slow()
    }

    /// [`EngineCore::current`] where the last-used state is not this
    /// core's: found in `CORES`, or created.
    #[cold]
    fn current_slow() -> Result<Rc<EngineCore>, Error> {
        let no_runtime = |why: &'static str| Error::new(ErrorKind::NoDriver).with_context(why);
        let uid = plugio_executor::core_uid().ok_or_else(|| no_runtime(OFF_CORE))?;
        if let Some(c) = Self::by_uid(uid) {
            return Ok(c);
        }
        // The thread's DeviceDriver must be this executor's: another
        // executor on the thread (one without the driver) would never
        // reap the IO, and its state would end the live one's (`create`).
        if !plugio_device::driver_serves(uid) {
            return Err(no_runtime(NO_DEVICE_DRIVER));
        }
        let core = plugio_executor::core_id().ok_or_else(|| no_runtime(OFF_CORE))?;
        Ok(Self::create(core, uid))
    }

    /// This core was built before a fork of the process (we are in the
    /// child): its IO is refused with `ErrorKind::Forked`.
    #[inline]
    pub fn forked(&self) -> bool {
        self.fork_generation != NO_DRIVER_GENERATION
            && self.fork_generation != plugio_device::fork::generation()
    }

    /// Whether IO on a device opened in fork generation
    /// `device_generation` may go through this core: neither the core nor
    /// the device was made before a fork of this process (one load of the
    /// fork counter for both tests, on every IO's issue).
    #[inline]
    pub fn serves_generation(&self, device_generation: u64) -> bool {
        let now = plugio_device::fork::generation();
        // The common case, two compares: the device and the core were
        // made in this generation. The rest (a core made without a
        // driver, or a refusal) out of line.
        if device_generation == now && self.fork_generation == now {
            return true;
        }
        self.serves_generation_slow(device_generation, now)
    }

    /// [`EngineCore::serves_generation`] past its common case: a core
    /// made on a thread without a driver serves the current generation's
    /// devices too.
    #[cold]
    #[inline(never)]
    fn serves_generation_slow(&self, device_generation: u64, now: u64) -> bool {
        device_generation == now && self.fork_generation == NO_DRIVER_GENERATION
    }

    /// In a forked child, wakes every task waiting on a bio of this core:
    /// what was in flight at the fork completes in the parent only (the
    /// ring is the parent's), so no completion would ever wake it. Polled
    /// again, each such IO ends with `ErrorKind::Forked` (see
    /// `Issued::poll`). Cold: once per tick of an inherited core in a
    /// child, and a woken bio has no waker left to take.
    #[cold]
    pub(crate) fn wake_forked(&self) {
        let mut wakers = Vec::new();
        self.bios.borrow_mut().take_wakers(&mut wakers);
        for w in wakers {
            w.wake();
        }
    }

    /// Builds and registers the engine state of executor core `uid`.
    fn create(core: usize, uid: u64) -> Rc<EngineCore> {
        let hooks = Rc::new(CoreHooks {
            core: std::cell::OnceCell::new(),
        });
        plugio_executor::register_tick_hook(hooks.clone());
        let handler = register_handler(hooks.clone());
        let c = Rc::new(EngineCore {
            core,
            uid,
            handler,
            bios: RefCell::default(),
            plug: RefCell::default(),
            devs: RefCell::default(),
            last_dev: Cell::new((0, 0)),
            scratch_bios: RefCell::default(),
            scratch_tags: RefCell::default(),
            scratch_puts: RefCell::default(),
            scratch_failed: RefCell::default(),
            wake_list: RefCell::default(),
            flushing: Cell::new(false),
            fork_generation: {
                let g = plugio_device::fork::driver_generation();
                // A fork count never gets there (one per fork).
                debug_assert_ne!(g, Some(NO_DRIVER_GENERATION));
                g.unwrap_or(NO_DRIVER_GENERATION)
            },
        });
        let _ = hooks.core.set(Rc::downgrade(&c));
        // What leaves with the old states (their wakers, the buffers they
        // kept, the states themselves) is the caller's code when dropped,
        // which may issue IO: dropped below, after `CORES` is released
        // and the new state is the last-used one.
        let mut wakers = Vec::new();
        let mut gone = Vec::new();
        CORES.with(|cores| {
            let mut cores = cores.0.borrow_mut();
            // The states about to leave: forget the last-used pointer
            // first (it may name one of them).
            LAST.with(|l| l.set(std::ptr::null()));
            for old in std::mem::take(&mut *cores) {
                // Only one plugio executor (one DeviceDriver) lives on a
                // thread at a time, and a state is made only for the
                // executor the driver serves (`current_slow`), so every
                // other state here belongs to an executor that is gone;
                // its driver drained what was in flight. What is still in
                // its plug or its FIFOs will never be dispatched: end it,
                // so the state (and the devices it holds) can go.
                old.abandon_into(&mut wakers);
                if old.busy() {
                    cores.push(old);
                } else {
                    unregister_handler(old.handler);
                    gone.push(old);
                }
            }
            cores.push(c.clone());
        });
        LAST.with(|l| l.set(Rc::as_ptr(&c)));
        for waker in wakers {
            plugio_executor::drop_contained(waker, "the waker of IO a gone executor never sent");
        }
        for old in gone {
            plugio_executor::drop_contained(old, "the engine state of a gone executor");
        }
        crate::bio::drop_buried();
        c
    }

    /// Runs `f` with the engine state of executor core `uid` on this
    /// thread, if any, without taking a reference count (the IO future's
    /// second poll). `f` must not create an engine state (only `current`
    /// does, for a new executor core; nothing an IO result does calls it).
    #[inline]
    pub fn with_uid<R>(uid: u64, f: impl FnOnce(&EngineCore) -> R) -> Option<R> {
        let ptr = match Self::last_of(uid) {
            Some(ptr) => ptr,
            // `by_uid_slow` makes the state it finds the last-used one.
            None => Rc::as_ptr(&Self::by_uid_slow(uid)?),
        };
        // SAFETY: `ptr` is a non-null LAST pointer, or the state
        // `by_uid_slow` just found in `CORES` (the `Rc` it returned is
        // dropped, `CORES` still holds the state). Either names a state
        // that `CORES` holds (see LAST); states leave `CORES` only in
        // `create`, in `forget` (a closing executor's hook) and when the
        // thread exits, which `f` does not reach, so the state outlives
        // the call. (One call site of `f`, so the compiler inlines it.)
        Some(f(unsafe { &*ptr }))
    }

    /// [`EngineCore::with_uid`] where the state of `uid` is the thread's
    /// last-used one, else `None` (no scan of `CORES`: nothing here calls
    /// out of line).
    #[inline(always)]
    pub fn with_last<R>(uid: u64, f: impl FnOnce(&EngineCore) -> R) -> Option<R> {
        let ptr = Self::last_of(uid)?;
        // SAFETY: a non-null LAST pointer names a state that `CORES` holds
        // (see LAST); states leave `CORES` only in `create`, in `forget`
        // (a closing executor's hook) and when the thread exits, which
        // `f` does not reach, so the state outlives the call.
        Some(f(unsafe { &*ptr }))
    }

    /// The LAST pointer when it is not null and names the state of
    /// executor core `uid`.
    #[inline(always)]
    fn last_of(uid: u64) -> Option<*const EngineCore> {
        let ptr = LAST.try_with(Cell::get).ok()?;
        if ptr.is_null() {
            return None;
        }
        #[cfg(debug_assertions)]
        Self::debug_check_last(ptr);
        // SAFETY: a non-null LAST pointer names a state that `CORES` holds
        // (see LAST): a live `EngineCore`, read here before anything could
        // take it out of `CORES`.
        let last_uid = unsafe { (*ptr).uid };
        (last_uid == uid).then_some(ptr)
    }

    /// Debug builds: checks LAST's invariant, which [`EngineCore::last_of`]'s
    /// dereference relies on: a non-null `ptr` names a state that `CORES`
    /// holds. (Skipped while `CORES` is borrowed mutably or destroyed:
    /// LAST is null then, see `create`, `forget` and `Cores::drop`.)
    #[cfg(debug_assertions)]
    #[cold]
    fn debug_check_last(ptr: *const EngineCore) {
        let _ = CORES.try_with(|cores| {
            if let Ok(cores) = cores.0.try_borrow() {
                debug_assert!(
                    cores.iter().any(|c| std::ptr::eq(Rc::as_ptr(c), ptr)),
                    "LAST names an engine state that CORES no longer holds"
                );
            }
        });
    }

    /// The engine state of executor core `uid` on this thread, if any.
    #[inline]
    pub fn by_uid(uid: u64) -> Option<Rc<EngineCore>> {
        if let Some(ptr) = Self::last_of(uid) {
            // SAFETY: a non-null LAST pointer names a state that `CORES`
            // holds (see LAST); taking one more strong count of it and an
            // `Rc` for that count is what `Rc::clone` does.
            return Some(unsafe {
                Rc::increment_strong_count(ptr);
                Rc::from_raw(ptr)
            });
        }
        Self::by_uid_slow(uid)
    }

    /// Takes `core` out of `CORES` and unregisters its handler (its
    /// executor closed and it is idle).
    fn forget(core: &Rc<EngineCore>) {
        let _ = CORES.try_with(|cores| {
            LAST.with(|l| l.set(std::ptr::null()));
            cores.0.borrow_mut().retain(|c| !Rc::ptr_eq(c, core));
        });
        unregister_handler(core.handler);
    }

    /// [`EngineCore::by_uid`] past the last-used state: a scan of `CORES`.
    #[cold]
    fn by_uid_slow(uid: u64) -> Option<Rc<EngineCore>> {
        let found = CORES
            .try_with(|cores| cores.0.borrow().iter().find(|c| c.uid == uid).cloned())
            .ok()
            .flatten()?;
        LAST.with(|l| l.set(Rc::as_ptr(&found)));
        Some(found)
    }

    /// Ends what the state of a gone executor can never dispatch: bios
    /// still in its plug and requests waiting in its FIFOs. A bio whose
    /// future was dropped is freed (its IO never reached the device); any
    /// other fails with `ECANCELED` (its future, polled again, gets that).
    /// Called for states whose executor is gone (see `create`, and
    /// `Issued::poll` of an IO polled again after its executor dropped),
    /// and as the executor closes (`CoreHooks::core_closing`: its tasks
    /// were cancelled, and what is in flight completes as its driver
    /// drains).
    pub(crate) fn abandon(&self) {
        let mut wakers = Vec::new();
        self.abandon_into(&mut wakers);
        // Wakers of a gone executor, and the buffers of the bios freed:
        // dropped after every borrow is released.
        drop(wakers);
        crate::bio::drop_buried();
    }

    /// [`EngineCore::abandon`] with the wakers of the bios it ends pushed
    /// on `wakers`, and the buffers it frees buried: the caller drops both
    /// once it holds no borrow (`create` holds `CORES`' while it abandons:
    /// a waker or buffer whose drop issued IO found it borrowed, found by
    /// a break-it helper).
    fn abandon_into(&self, wakers: &mut Vec<Waker>) {
        let cancelled = -i64::from(libc::ECANCELED);
        {
            let mut plug = self.plug.borrow_mut();
            let mut bios = self.bios.borrow_mut();
            let mut devs = self.devs.borrow_mut();
            let mut plugged = Vec::new();
            let _ = plug.drain_into(&mut plugged);
            for i in 0..devs.len() {
                let counts = plug.take_counts(i);
                if let Some(d) = devs.get_mut(i) {
                    d.count_plugged_bios(&counts);
                }
            }
            // `plugged`: the bio never became requests, so its one part
            // is this ending; else one of its requests ends.
            let mut end = |bios: &mut BioTable, id: crate::bio::BioId, plugged: bool| {
                let Some(bio) = bios.get_mut(id) else {
                    return;
                };
                if plugged {
                    bio.parts_left = 1;
                }
                let done = bio.complete_part(0, 0, cancelled);
                if done {
                    if bio.orphaned {
                        bios.free(id);
                    } else if let Some(w) = bio.waker.take() {
                        wakers.push(w);
                    }
                }
            };
            for e in plugged {
                end(&mut bios, e.id, true);
            }
            for i in 0..devs.len() {
                let Some(d) = devs.get_mut(i) else {
                    continue;
                };
                d.shared.adopt_remote_orphans(self.uid, &mut bios);
                // Fast-lane bios waiting for a tag (see `queue::FAST`).
                for &e in d.waiting.iter().filter(|&&e| e & FAST != 0) {
                    let id = bios.id_at(e & !FAST);
                    end(&mut bios, id, false);
                    d.fast_live -= 1;
                }
                // Waiting and blocked requests, oldest first (a blocked one
                // is released by what it waits for as that ends).
                let mut unstarted: Vec<(u64, u32)> = d
                    .rqs
                    .iter_slots()
                    .filter(|(_, rq)| matches!(rq.state, RqState::Waiting | RqState::Blocked))
                    .map(|(i, rq)| (rq.seq, i))
                    .collect();
                unstarted.sort_unstable();
                for (_, slot) in unstarted {
                    let rq = d.rqs.get_mut(slot);
                    let pieces = std::mem::take(&mut rq.pieces);
                    let writes = rq.op.is_write();
                    let blocked = rq.state == RqState::Blocked;
                    rq.deps = 0;
                    d.writes_waiting -= u32::from(writes);
                    d.blocked -= u32::from(blocked);
                    for p in &pieces {
                        end(&mut bios, p.bio, false);
                    }
                    let _ = d.order_done(slot);
                    d.fast_live -= u32::from(d.rqs.get(slot).fast_hold);
                    d.rqs.release(slot);
                }
                // What waited for a request or fast-lane bio in flight was
                // released above.
                d.rqs.clear_dependents();
                d.waiting.clear();
                d.flushes.clear();
                // Every write that waited for the fast lane was released
                // above.
                d.fast_waiters.clear();
                #[cfg(debug_assertions)]
                d.check_invariants();
            }
        }
    }

    /// Whether a request of this core holds a tag: sent to the kernel, or
    /// built and about to be (true when the device list is borrowed, which
    /// cannot be told).
    fn holds_tags(&self) -> bool {
        self.devs
            .try_borrow()
            .map_or(true, |devs| devs.iter().any(|d| d.tags_held > 0))
    }

    /// Whether anything of this core is plugged or in flight.
    fn busy(&self) -> bool {
        self.bios.borrow().in_use() > 0
            || self
                .devs
                .borrow()
                .iter()
                .any(|d| d.tags_held > 0 || !d.waiting.is_empty())
    }

    /// This core's index for `shared`, adding the device on first use.
    #[inline]
    pub fn dev_index(&self, shared: &Arc<DeviceShared>) -> u32 {
        let (id, index) = self.last_dev.get();
        if id == shared.id {
            return index;
        }
        self.dev_index_slow(shared)
    }

    /// [`EngineCore::dev_index`] of another device than the last one used.
    #[cold]
    fn dev_index_slow(&self, shared: &Arc<DeviceShared>) -> u32 {
        let mut devs = self.devs.borrow_mut();
        let index = match devs.position(shared.id) {
            Some(i) => i as u32,
            None => {
                let i = devs.insert(CoreDev::new(shared));
                let o = &shared.opts;
                self.plug
                    .borrow_mut()
                    .set_limits(i, o.plug_max_count, o.plug_flush_bytes);
                i as u32
            }
        };
        self.last_dev.set((shared.id, index));
        index
    }

    /// Counts one bounced IO of `len_bytes` on device `dev` (published with
    /// the device's other counters).
    #[cold]
    pub(crate) fn count_bounce(&self, dev: u32, len_bytes: u64) {
        let mut devs = self.devs.borrow_mut();
        let d = &mut devs[dev as usize];
        if d.iostats {
            d.pending.bounce_ios += 1;
            d.pending.bounce_bytes += len_bytes;
            d.pending.dirty = true;
        }
    }

    /// Forgets devices whose every handle was dropped and that have
    /// nothing waiting or in flight here, closing their files once no core
    /// holds them (done at the end of each flush).
    pub(crate) fn release_closed_devices(&self) {
        let plug_empty = self.plug.borrow().bios.is_empty();
        if plug_empty && self.devs.borrow_mut().release_closed() {
            self.last_dev.set((0, 0));
        }
    }
}
