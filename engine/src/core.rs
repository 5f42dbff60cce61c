//! The engine's per-core state: bio table, plug, per-device request arrays
//! and the queues of requests waiting for tags; the tick hook that flushes
//! the plug; the completion handler.
//!
//! Invariants:
//! - One [`EngineCore`] per thread, created on first IO; everything in it is
//!   touched only by that thread. Completions for requests dispatched here
//!   are delivered here (the device layer's handler contract).
//! - The tick hook flushes the plug before every park, so no bio waits in
//!   the plug while the core sleeps.
//! - Requests waiting for tags are dispatched in FIFO order per device; a
//!   tag-waiter task is running for every device with waiting requests, so
//!   they are retried when tags are freed on any core.
//! - No `RefCell` borrow is held while a waker is woken or a backend is
//!   called back into.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::Waker;

use plugio_device::{
    register_handler, unregister_handler, CompletionHandler, Error, ErrorKind, HandlerId, IoOp,
    OpKind,
};
use plugio_executor::TickHook;

use crate::bio::{Bio, BioId, BioTable};
use crate::clock;
use crate::merge;
use crate::plug::Plug;
use crate::request::{Piece, Request};
use crate::shared::DeviceShared;
use crate::stats::{BusyClock, CoreCounters};
use crate::tag::Tag;

thread_local! {
    /// The engine states of the executor cores this thread runs (usually
    /// one), see [`EngineCore::current`].
    static CORES: RefCell<Vec<Rc<EngineCore>>> = const { RefCell::new(Vec::new()) };
}

/// Per-device state on one core.
pub(crate) struct CoreDev {
    pub shared: Arc<DeviceShared>,
    /// Requests in flight, indexed by tag.
    pub inflight: Vec<Request>,
    /// Requests built from flushed bios, waiting for tags (FIFO).
    pub waiting: VecDeque<Request>,
    /// A task waits on the tag set for this device.
    pub waiter_running: bool,
    /// Tags held by requests in flight from this core.
    pub tags_held: u32,
    /// Requests in flight from this core that change the device.
    pub writes_in_flight: u32,
    /// Waiting requests that change the device.
    pub writes_waiting: u32,
    /// Waiting requests marked as barriers.
    pub barriers_waiting: u32,
    /// This core's iostats counters for the device.
    pub counters: Arc<CoreCounters>,
    /// `in_flight` / `io_ticks` bookkeeping.
    pub busy: BusyClock,
    /// The device's `iostats` option.
    pub iostats: bool,
    /// The device's `cached_clock` option.
    pub cached_clock: bool,
}

impl CoreDev {
    /// Whether `rq` must wait for earlier requests to complete: a flush
    /// waits for the writes before it (it covers them; reads in flight do
    /// not hold it back: `writes_only` is set), an overlap with an earlier
    /// request in flight or waiting where one of the two writes waits for
    /// everything before it. Reads with no write in flight or waiting take
    /// the fast path.
    fn needs_barrier(&self, rq: &mut Request) -> bool {
        let Some(op) = rq.op else {
            return false;
        };
        if matches!(op, OpKind::Flush | OpKind::Fsync) {
            rq.writes_only = true;
            return self.writes_in_flight > 0 || self.writes_waiting > 0;
        }
        if !op.is_write() && self.writes_in_flight == 0 && self.writes_waiting == 0 {
            return false;
        }
        self.waiting.iter().any(|w| w.conflicts_with(rq))
            || self.inflight.iter().any(|w| w.conflicts_with(rq))
    }

    /// Merges bio `id` into the newest waiting request if the merge rules
    /// allow it and the bio needs no ordering that the request lacks.
    fn try_merge(&mut self, id: BioId, bio: &mut Bio) -> bool {
        let max_bytes = self.shared.max_merge_bytes;
        let max_segs = self.shared.geometry.max_segments.max(1);
        let Some(side) = self
            .waiting
            .back()
            .and_then(|rq| merge::try_merge(rq, bio, max_bytes, max_segs))
        else {
            return false;
        };
        let mut probe = Request {
            op: Some(bio.op),
            offset_bytes: bio.offset_bytes,
            len_bytes: bio.len_bytes,
            ..Request::default()
        };
        let rq_barrier = self.waiting.back().is_some_and(|rq| rq.barrier);
        if !rq_barrier && self.needs_barrier(&mut probe) {
            return false;
        }
        let Some(rq) = self.waiting.back_mut() else {
            return false;
        };
        let piece = Piece {
            bio: id,
            bio_offset: 0,
            len_bytes: bio.len_bytes,
        };
        match side {
            merge::Side::Back => rq.pieces.push(piece),
            merge::Side::Front => {
                rq.pieces.insert(0, piece);
                rq.offset_bytes = bio.offset_bytes;
            }
        }
        rq.len_bytes += bio.len_bytes;
        rq.nr_segs += bio.buf.nr_segs();
        bio.parts_left = 1;
        bio.split = false;
        true
    }

    /// How many requests at the front of the queue may be dispatched now:
    /// up to the first barrier, which itself may go only from the front of
    /// the queue and when what it waits for is done (every request of this
    /// device from this core, or only the writes for a flush).
    fn dispatchable(&self) -> usize {
        if self.barriers_waiting == 0 {
            return self.waiting.len();
        }
        let mut n = 0;
        for rq in &self.waiting {
            if rq.barrier {
                let busy = if rq.writes_only {
                    self.writes_in_flight > 0
                } else {
                    self.tags_held > 0
                };
                if n > 0 || busy {
                    break;
                }
            }
            n += 1;
        }
        n
    }
}

/// This core's devices, by index; a released device leaves a vacant slot
/// that the next device reuses, so indices in flight stay valid.
#[derive(Default)]
pub(crate) struct DevList {
    slots: Vec<Option<CoreDev>>,
}

impl DevList {
    /// Number of slots (live or vacant).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The slot of device `id`, if this core uses it.
    fn position(&self, id: u64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|d| d.shared.id == id))
    }

    /// Adds a device in the first vacant slot; returns its index.
    fn insert(&mut self, dev: CoreDev) -> usize {
        match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = Some(dev);
                i
            }
            None => {
                self.slots.push(Some(dev));
                self.slots.len() - 1
            }
        }
    }

    /// The live devices.
    pub fn iter(&self) -> impl Iterator<Item = &CoreDev> {
        self.slots.iter().flatten()
    }

    /// Device `i`, if live.
    pub fn get(&self, i: usize) -> Option<&CoreDev> {
        self.slots.get(i).and_then(Option::as_ref)
    }

    /// Device `i`, if live.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut CoreDev> {
        self.slots.get_mut(i).and_then(Option::as_mut)
    }

    /// Vacates the slots of closed, idle devices.
    fn release_closed(&mut self) {
        for slot in &mut self.slots {
            let idle_closed = slot.as_ref().is_some_and(|d| {
                d.shared.is_closed()
                    && d.tags_held == 0
                    && d.waiting.is_empty()
                    && !d.waiter_running
            });
            if idle_closed {
                *slot = None;
            }
        }
    }
}

impl std::ops::Index<usize> for DevList {
    type Output = CoreDev;
    fn index(&self, i: usize) -> &CoreDev {
        self.get(i).expect("a live device index")
    }
}

impl std::ops::IndexMut<usize> for DevList {
    fn index_mut(&mut self, i: usize) -> &mut CoreDev {
        self.get_mut(i).expect("a live device index")
    }
}

/// The engine's state on one core.
pub(crate) struct EngineCore {
    pub core: usize,
    /// The executor core this state belongs to (`core_uid`).
    pub uid: u64,
    pub handler: HandlerId,
    pub bios: RefCell<BioTable>,
    pub plug: RefCell<Plug>,
    pub devs: RefCell<DevList>,
    /// Spare requests, cleared, with their vectors' capacity.
    spare: RefCell<Vec<Request>>,
    scratch_bios: RefCell<Vec<(u32, BioId)>>,
    scratch_tags: RefCell<Vec<Tag>>,
    wake_list: RefCell<Vec<Waker>>,
    flushing: Cell<bool>,
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
        }
        // The core may park now: the next time read must be fresh.
        clock::invalidate();
        false
    }
}

impl CompletionHandler for CoreHooks {
    fn complete(&self, token: u64, result: i32) {
        if let Some(core) = self.core() {
            core.complete(token, result);
        }
    }
}

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
    pub fn current() -> Result<Rc<EngineCore>, Error> {
        let no_runtime = |why: &'static str| Error::new(ErrorKind::NoDriver).with_context(why);
        let uid = plugio_executor::core_uid().ok_or_else(|| {
            no_runtime(
                "plugio IO must run inside a plugio runtime (plugio::runtime::local or builder)",
            )
        })?;
        if let Some(c) = Self::by_uid(uid) {
            return Ok(c);
        }
        if !plugio_device::driver_installed() {
            return Err(no_runtime(
                "this executor has no plugio DeviceDriver: build it with plugio::runtime::local or plugio::runtime::builder",
            ));
        }
        let core = plugio_executor::core_id().ok_or_else(|| no_runtime("not on a plugio core"))?;
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
            spare: RefCell::default(),
            scratch_bios: RefCell::default(),
            scratch_tags: RefCell::default(),
            wake_list: RefCell::default(),
            flushing: Cell::new(false),
        });
        let _ = hooks.core.set(Rc::downgrade(&c));
        CORES.with(|cores| {
            let mut cores = cores.borrow_mut();
            cores.retain(|old| {
                let keep = old.busy();
                if !keep {
                    unregister_handler(old.handler);
                }
                keep
            });
            cores.push(c.clone());
        });
        Ok(c)
    }

    /// The engine state of executor core `uid` on this thread, if any.
    pub fn by_uid(uid: u64) -> Option<Rc<EngineCore>> {
        CORES.with(|cores| cores.borrow().iter().find(|c| c.uid == uid).cloned())
    }

    /// This core's `Rc`.
    fn rc(&self) -> Rc<EngineCore> {
        Self::by_uid(self.uid).expect("an EngineCore is only used on its own thread")
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
    pub fn dev_index(&self, shared: &Arc<DeviceShared>) -> u32 {
        let mut devs = self.devs.borrow_mut();
        if let Some(i) = devs.position(shared.id) {
            return i as u32;
        }
        let depth = shared.tags_for(self.core).depth() as usize;
        devs.insert(CoreDev {
            shared: shared.clone(),
            inflight: (0..depth).map(|_| Request::default()).collect(),
            waiting: VecDeque::new(),
            waiter_running: false,
            tags_held: 0,
            writes_in_flight: 0,
            writes_waiting: 0,
            barriers_waiting: 0,
            counters: shared.register_core(),
            busy: BusyClock::default(),
            iostats: shared.opts.iostats,
            cached_clock: shared.opts.cached_clock,
        }) as u32
    }

    /// Forgets devices whose every handle was dropped and that have
    /// nothing waiting or in flight here, closing their files once no core
    /// holds them (done at the end of each tick).
    fn release_closed_devices(&self) {
        let plug_empty = self.plug.borrow().bios.is_empty();
        if plug_empty {
            self.devs.borrow_mut().release_closed();
        }
    }

    /// Counts a bio allocation as a bio cache hit or miss.
    pub fn count_bio_alloc(&self, dev: u32, hit: bool) {
        let devs = self.devs.borrow();
        let d = &devs[dev as usize];
        if d.iostats {
            if hit {
                d.counters.bio_cache_hits.add(1);
            } else {
                d.counters.bio_cache_misses.add(1);
            }
        }
    }

    /// Puts an issued bio into the plug; flushes at once when the plug is
    /// over its count or byte limit (the flush then submits to the kernel
    /// right away, as a full plug does in the kernel).
    pub fn plug_bio(&self, dev: u32, id: BioId, len_bytes: u64) {
        let (max_count, flush_bytes) = {
            let devs = self.devs.borrow();
            let o = &devs[dev as usize].shared.opts;
            (o.plug_max_count, o.plug_flush_bytes)
        };
        let full = {
            let mut plug = self.plug.borrow_mut();
            plug.push(dev, id, len_bytes);
            plug.should_flush(max_count, flush_bytes)
        };
        // IO issued from a tick hook that runs after ours would otherwise
        // sit in the plug while the core parks: send it at once.
        if full || plugio_executor::in_tick_hooks() {
            EngineCore::flush(&self.rc());
            if let Err(e) = plugio_device::submit_now() {
                tracing::warn!(error = %e, "submit after an early plug flush failed; the park will retry");
            }
        }
    }

    /// Flushes the plug: turns its bios into requests (split at the
    /// device's request limit), takes tags for them in one batch per device
    /// and dispatches them; the rest wait for tags.
    pub fn flush(self: &Rc<Self>) {
        if self.flushing.replace(true) {
            return;
        }
        let mut bios = std::mem::take(&mut *self.scratch_bios.borrow_mut());
        self.plug.borrow_mut().drain_into(&mut bios);
        // Stable: program order is kept within each device. (One device,
        // the common case, needs no sort.)
        if bios.windows(2).any(|w| w[0].0 != w[1].0) {
            bios.sort_by_key(|&(dev, _)| dev);
        }
        let mut touched = 0u64;
        let mut start = 0;
        while start < bios.len() {
            let dev = bios[start].0;
            let end = start + bios[start..].iter().take_while(|b| b.0 == dev).count();
            self.build_device_requests(dev, &mut bios[start..end]);
            touched |= 1 << dev.min(63);
            start = end;
        }
        bios.clear();
        *self.scratch_bios.borrow_mut() = bios;
        let nr_devs = self.devs.borrow().len();
        for dev in 0..nr_devs {
            let has_waiting = self
                .devs
                .borrow()
                .get(dev)
                .is_some_and(|d| !d.waiting.is_empty());
            if has_waiting || (dev < 64 && touched & (1 << dev) != 0) {
                self.dispatch_waiting(dev as u32);
            }
        }
        self.flushing.set(false);
        self.wake_pending();
        self.release_closed_devices();
    }

    /// Turns one device's flushed bios into requests, merging as the
    /// device's `nomerges` allows (see [`crate::merge`]).
    fn build_device_requests(&self, dev: u32, list: &mut [(u32, BioId)]) {
        let nomerges = self.devs.borrow()[dev as usize].shared.opts.nomerges;
        if nomerges == 0 {
            merge::order_for_merge(&self.bios.borrow(), list);
        }
        let mut built = 0;
        for &(_, id) in list.iter() {
            built += self.build_requests(dev, id, nomerges < 2);
        }
        let devs = self.devs.borrow();
        let d = &devs[dev as usize];
        if d.iostats {
            d.counters.plug_flushes.add(1);
            d.counters.bios.add(list.len() as u64);
            d.counters.requests.add(built);
        }
    }

    /// Adds bio `id` to the newest waiting request of the device when it
    /// merges (and `allow_merge`), else splits it into requests no larger
    /// than the device's limit and appends them to the waiting queue.
    /// Returns the number of new requests.
    fn build_requests(&self, dev: u32, id: BioId, allow_merge: bool) -> u64 {
        let mut bios = self.bios.borrow_mut();
        let Some(bio) = bios.get_mut(id) else {
            return 0;
        };
        let mut devs = self.devs.borrow_mut();
        let d = &mut devs[dev as usize];
        let max = d.shared.max_request_bytes;
        let mergeable = merge::bio_mergeable(bio) && bio.len_bytes <= d.shared.max_merge_bytes;
        if allow_merge && mergeable && d.try_merge(id, bio) {
            if d.iostats {
                if let Some(g) = d.counters.group(bio.op) {
                    g.merges.add(1);
                }
            }
            return 0;
        }
        let len = bio.len_bytes;
        let mut parts = 0;
        let mut off = 0;
        loop {
            let piece_len = if len == 0 { 0 } else { (len - off).min(max) };
            let mut rq = self.spare.borrow_mut().pop().unwrap_or_default();
            rq.op = Some(bio.op);
            rq.flags = bio.flags;
            rq.offset_bytes = bio.offset_bytes + off;
            rq.len_bytes = piece_len;
            rq.pieces.push(Piece {
                bio: id,
                bio_offset: off,
                len_bytes: piece_len,
            });
            rq.nr_segs = bio.buf.nr_segs();
            rq.mergeable = mergeable && piece_len == len;
            rq.barrier = d.needs_barrier(&mut rq);
            if rq.barrier {
                d.barriers_waiting += 1;
            }
            if bio.op.is_write() {
                d.writes_waiting += 1;
            }
            d.waiting.push_back(rq);
            parts += 1;
            off += piece_len;
            if off >= len {
                break;
            }
        }
        bio.parts_left = parts;
        bio.split = parts > 1;
        u64::from(parts)
    }

    /// Takes tags for the device's waiting requests and dispatches as many
    /// as got one; starts a tag-waiter task if some are left.
    pub fn dispatch_waiting(self: &Rc<Self>, dev: u32) {
        let (shared, nr) = {
            let devs = self.devs.borrow();
            let d = &devs[dev as usize];
            (d.shared.clone(), d.dispatchable())
        };
        if nr == 0 {
            return;
        }
        let mut tags = std::mem::take(&mut *self.scratch_tags.borrow_mut());
        shared
            .tags_for(self.core)
            .get_tags(self.core, nr, &mut tags);
        for &tag in &tags {
            self.dispatch_one(dev, tag);
        }
        tags.clear();
        *self.scratch_tags.borrow_mut() = tags;
        self.ensure_tag_waiter(dev);
    }

    /// Dispatches the oldest waiting request of `dev` with `tag`, or puts
    /// the tag back when nothing waits.
    pub fn dispatch_one(&self, dev: u32, tag: Tag) {
        let mut devs = self.devs.borrow_mut();
        let d = &mut devs[dev as usize];
        if d.dispatchable() == 0 {
            d.shared.tags_for(self.core).put(self.core, tag);
            return;
        }
        let Some(mut rq) = d.waiting.pop_front() else {
            return;
        };
        if rq.op.is_some_and(OpKind::is_write) {
            d.writes_waiting -= 1;
            d.writes_in_flight += 1;
        }
        {
            let bios = self.bios.borrow();
            build_iovecs(&bios, &mut rq);
        }
        if d.iostats {
            let now = clock::now_ns(d.cached_clock);
            rq.start_ns = now;
            d.busy.event(now, 1, &d.counters);
        }
        let slot = &mut d.inflight[tag.index()];
        std::mem::swap(slot, &mut rq);
        self.spare.borrow_mut().push(rq);
        d.tags_held += 1;
        if rq_is_barrier(&d.inflight[tag.index()]) {
            d.barriers_waiting -= 1;
        }
        let slot = &d.inflight[tag.index()];
        let op = IoOp {
            kind: slot.op.unwrap_or(plugio_device::OpKind::Nop),
            offset_bytes: slot.offset_bytes,
            len_bytes: slot.len_bytes,
            segments: &slot.iovecs,
            fixed_buf: slot.fixed_buf,
            flags: slot.flags,
        };
        let token = (u64::from(dev) << 32) | u64::from(tag.as_u32());
        // SAFETY: the iovecs point into the buffers of the request's bios,
        // which the bio table keeps (even for orphaned bios) until this
        // request's completion has been delivered to `complete`.
        // The device list stays borrowed across the submit: a backend
        // never delivers a completion from inside `submit`.
        let submitted = unsafe { d.shared.backend.submit(&op, self.handler, token) };
        drop(devs);
        if let Err(e) = submitted {
            self.complete(token, -e.errno());
        }
    }

    /// Spawns a task that waits on the tag set for `dev` when requests wait
    /// and no such task runs yet.
    fn ensure_tag_waiter(self: &Rc<Self>, dev: u32) {
        let shared = {
            let mut devs = self.devs.borrow_mut();
            let d = &mut devs[dev as usize];
            if d.dispatchable() == 0 || d.waiter_running {
                return;
            }
            d.waiter_running = true;
            d.shared.clone()
        };
        let core = self.clone();
        plugio_executor::spawn_local(async move {
            loop {
                let nr = core.devs.borrow()[dev as usize].dispatchable();
                if nr == 0 {
                    break;
                }
                let batch = shared.tags_for(core.core).acquire(core.core, nr).await;
                for &tag in batch.iter() {
                    core.dispatch_one(dev, tag);
                }
                core.wake_pending();
            }
            core.devs.borrow_mut()[dev as usize].waiter_running = false;
        });
    }

    /// Handles one completion: splits the result between the request's
    /// bios, frees the tag, wakes the bios' tasks.
    pub fn complete(&self, token: u64, result: i32) {
        let dev = (token >> 32) as u32;
        let tag = Tag::new(token as u32);
        let mut devs = self.devs.borrow_mut();
        let Some(d) = devs.get_mut(dev as usize) else {
            tracing::error!(token, "completion for an unknown device ignored");
            return;
        };
        let mut rq = std::mem::take(&mut d.inflight[tag.index()]);
        if d.iostats {
            account_completion(d, &rq);
        }
        d.tags_held -= 1;
        if rq.op.is_some_and(OpKind::is_write) {
            d.writes_in_flight -= 1;
        }
        d.shared.tags_for(self.core).put(self.core, tag);
        drop(devs);
        {
            let mut bios = self.bios.borrow_mut();
            let mut wakes = self.wake_list.borrow_mut();
            rq.split_result(i64::from(result), |p, share| {
                finish_piece(&mut bios, p, share, &mut wakes)
            });
        }
        // Back into its slot, cleared, with its vectors' capacity: the next
        // dispatch on this tag swaps it out to the spare list. (Pushing it
        // to the spare list here would grow that list by one per IO.)
        rq.clear();
        if let Some(d) = self.devs.borrow_mut().get_mut(dev as usize) {
            d.inflight[tag.index()] = rq;
        }
        if !self.flushing.get() {
            self.wake_pending();
        }
    }

    /// Wakes the tasks whose bios completed.
    fn wake_pending(&self) {
        let mut list = std::mem::take(&mut *self.wake_list.borrow_mut());
        for w in list.drain(..) {
            w.wake();
        }
        *self.wake_list.borrow_mut() = list;
    }
}

/// Counts a completed request in the device's iostats.
fn account_completion(d: &mut CoreDev, rq: &Request) {
    let now = clock::now_ns(d.cached_clock);
    d.busy.event(now, -1, &d.counters);
    if let Some(g) = rq.op.and_then(|op| d.counters.group(op)) {
        g.ios.add(1);
        g.sectors.add(rq.len_bytes.div_ceil(512));
        g.ticks_ns.add(now.saturating_sub(rq.start_ns));
    }
}

/// Records a piece's share of a request's result in its bio; when the bio
/// is finished, queues its waker, or frees it if its future is gone.
fn finish_piece(bios: &mut BioTable, p: &Piece, share: i64, wakes: &mut Vec<Waker>) {
    let Some(bio) = bios.get_mut(p.bio) else {
        return;
    };
    if !bio.complete_part(p.bio_offset, p.len_bytes, share) {
        return;
    }
    if bio.orphaned {
        bios.free(p.bio);
    } else if let Some(w) = bio.waker.take() {
        wakes.push(w);
    }
}

/// Whether a request just swapped into its slot was a barrier.
fn rq_is_barrier(rq: &Request) -> bool {
    rq.barrier
}

/// Fills `rq.iovecs` from its pieces' bio buffers, and names the
/// registered buffer when the request is one whole buffer of the core's
/// registered arena (`READ_FIXED`/`WRITE_FIXED`).
fn build_iovecs(bios: &BioTable, rq: &mut Request) {
    rq.iovecs.clear();
    rq.fixed_buf = None;
    for p in &rq.pieces {
        if let Some(bio) = bios.get(p.bio) {
            bio_iovecs(bio, p, &mut rq.iovecs);
        }
    }
    if let [p] = rq.pieces.as_slice() {
        if let Some(crate::bio::BioBuf::One(b)) = bios.get(p.bio).map(|b| &b.buf) {
            rq.fixed_buf = b.fixed_index();
        }
    }
}

fn bio_iovecs(bio: &Bio, p: &Piece, out: &mut Vec<libc::iovec>) {
    if bio.op.has_data() {
        bio.buf.push_iovecs(p.bio_offset, p.len_bytes, out);
    }
}
