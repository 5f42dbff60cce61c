//! The per-core, per-device queue state: the request slab, the FIFO of
//! requests waiting for tags, and the counters the ordering rules read.
//!
//! Idea: the kernel's `static_rqs` (requests preallocated per hardware
//! queue and reused in place) and `blk_mq_end_request_batch`'s per-batch
//! accounting. A request is built once in a slab slot and named by its slot
//! index from then on: the waiting FIFO and the completion token carry the
//! index, never the request.
//!
//! Invariants (recounted from the slab by [`CoreDev::check_invariants`]
//! after every flush, dispatch and completion batch in debug builds):
//! - A slot is `Free` exactly when it is on the slab's free list.
//! - `waiting` holds each `Waiting` slot exactly once, in the order the
//!   flush built them (program order per device), and the fast-lane bios
//!   waiting for a tag (entries marked [`FAST`]).
//! - `tags_held` is the number of `InFlight` slots plus `fast_in_flight`,
//!   `blocked` the number of `Blocked` ones; `writes_in_flight` and
//!   `writes_waiting` the number of in-flight (lane slots included) and
//!   waiting-or-blocked requests whose op changes the device.
//! - `fast_live` counts the fast-lane bios in the FIFO or in flight without
//!   a lane slot and the live requests built from one (`fast_hold`); while
//!   it is not zero, every write built waits for it to reach zero
//!   (`fast_waiters`). A `Lane` slot stands for one fast-lane bio in flight
//!   (see [`crate::order`]).
//! - The ordering state (dependencies, pending flushes, the interval
//!   index) is as [`crate::order`] states it.
//! - The `pending` tallies hold only counts not yet added to `counters`;
//!   they are published at the end of each flush and completion batch.

use std::collections::VecDeque;
use std::sync::Arc;

use plugio_device::OpKind;

use crate::bio::{Bio, BioId, BioTable};
use crate::interval::{IntervalIndex, Node, Nodes, NIL};
use crate::plug::PlugCounts;
use crate::request::{Piece, Request, RqState};
use crate::shared::DeviceShared;
use crate::stats::{BusyClock, CoreCounters};

/// Marks a FIFO entry and a completion token's slot as a fast-lane bio
/// (the rest is its bio table index) rather than a request slot.
///
/// The fast lane (`DeviceOptions::fast_lane`): a bio that merges with
/// nothing, needs no split, is no flush (a flush holds nothing back) and
/// has nothing to wait for goes without a request. A read (or a NOP) has
/// nothing to wait for where no write is live (the interval index is off)
/// or where it overlaps no live write; a plain write, where it overlaps no
/// live request and no fast-lane bio is live outside the index. Its SQE
/// is written from the bio, by the flush itself when nothing waits in the
/// FIFO (`EngineCore::send_at_flush`); with the index on, the bio is
/// linked into it under a lane slot (see [`crate::order`]). Where a read
/// cannot be sent at once with the index off, it queues in the FIFO as
/// itself; a write that cannot be sent becomes a request. No request is
/// built, ordered, completed and released for a bio sent on the fast
/// lane. Idea: the kernel's direct issue of a bio that no merge or
/// scheduler needs to see (`blk_mq_try_issue_directly`).
/// Whatever the fast lane does not do (a backend without an SQ writer, a
/// short, failed or `EAGAIN` completion) turns the bio into a request on
/// the spot (`CoreDev::request_of_fast`), which then takes the general
/// path; so does a fast-lane bio left at the back of the FIFO when the
/// tags ran out, so that the next bio built may still merge with it
/// (`dispatch::mergeable_when_left_waiting`).
/// A write built while fast-lane bios without a lane slot are live waits
/// for all of them (`fast_waiters`): those keep no ranges to find the
/// overlapping ones.
pub(crate) const FAST: u32 = 1 << 31;

/// Requests of one device on one core, built in place and reused.
#[derive(Debug, Default)]
pub(crate) struct RqSlab {
    slots: Vec<Request>,
    free: Vec<u32>,
}

impl RqSlab {
    /// Takes a free slot (growing the slab when none is free); the slot is
    /// cleared and keeps its vectors' capacity.
    #[inline]
    pub fn alloc(&mut self) -> u32 {
        match self.free.pop() {
            Some(i) => i,
            None => self.grow(),
        }
    }

    /// A new slot at the end of the slab.
    #[cold]
    fn grow(&mut self) -> u32 {
        self.slots.push(Request::default());
        (self.slots.len() - 1) as u32
    }

    /// Clears slot `i` and puts it back on the free list.
    pub fn release(&mut self, i: u32) {
        let rq = &mut self.slots[i as usize];
        debug_assert!(rq.state != RqState::Free, "request slot {i} freed twice");
        rq.clear();
        self.free.push(i);
    }

    /// The request in slot `i`.
    #[inline]
    pub fn get(&self, i: u32) -> &Request {
        &self.slots[i as usize]
    }

    /// The request in slot `i`, mutably.
    #[inline]
    pub fn get_mut(&mut self, i: u32) -> &mut Request {
        &mut self.slots[i as usize]
    }

    /// The request in slot `i`, if the slot exists.
    #[inline]
    pub fn try_get_mut(&mut self, i: u32) -> Option<&mut Request> {
        self.slots.get_mut(i as usize)
    }

    /// Every slot, free ones included (their `op` is `Nop`).
    #[cfg(debug_assertions)]
    pub fn iter(&self) -> impl Iterator<Item = &Request> {
        self.slots.iter()
    }

    /// Number of slots (free ones included).
    pub fn len(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Empties every slot's dependents (an executor that is gone released
    /// every request that waited).
    pub fn clear_dependents(&mut self) {
        for rq in &mut self.slots {
            rq.dependents.clear();
        }
    }

    /// Every slot with its index.
    pub fn iter_slots(&self) -> impl Iterator<Item = (u32, &Request)> {
        self.slots.iter().enumerate().map(|(i, rq)| (i as u32, rq))
    }
}

impl Nodes for RqSlab {
    #[inline]
    fn node(&self, i: u32) -> &Node {
        &self.slots[i as usize].node
    }

    #[inline]
    fn node_mut(&mut self, i: u32) -> &mut Node {
        &mut self.slots[i as usize].node
    }

    /// A request's own range, or its whole bio's for a piece of a split
    /// bio (see [`crate::order`]).
    #[inline]
    fn range(&self, i: u32) -> (u64, u64) {
        let rq = &self.slots[i as usize];
        match rq.whole {
            None => (rq.offset_bytes, rq.offset_bytes + rq.len_bytes),
            Some(whole) => whole,
        }
    }
}

/// Makes `rq` the request of fast-lane bio `id` (`bio`), its one piece,
/// with the bio's tag and start time (those of a bio in flight).
fn take_bio(rq: &mut Request, bio: &Bio, id: BioId) {
    rq.op = bio.op;
    rq.flags = bio.flags;
    rq.offset_bytes = bio.offset_bytes;
    rq.len_bytes = bio.len_bytes;
    rq.pieces.push(Piece {
        bio: id,
        bio_offset: 0,
        len_bytes: bio.len_bytes,
    });
    rq.nr_segs = bio.buf.nr_segs();
    rq.mergeable = false;
    rq.tag = bio.tag;
    rq.start_ns = bio.start_ns;
}

/// Counts of one op group not yet published to the shared counters.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct OpTally {
    pub ios: u64,
    pub merges: u64,
    pub sectors: u64,
    pub ticks_ns: u64,
}

/// Counts not yet published to the device's [`CoreCounters`] (R10: the
/// shared counter lines are written once per batch, not once per IO).
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// Read, write, discard, flush (the diskstats groups).
    pub groups: [OpTally; 4],
    pub plug_flushes: u64,
    pub bios: u64,
    pub requests: u64,
    pub bio_cache_hits: u64,
    pub bio_cache_misses: u64,
    pub fixed_buf_requests: u64,
    pub requeues: u64,
    pub bounce_ios: u64,
    pub bounce_bytes: u64,
    pub fua_writes: u64,
    /// Something above is non-zero.
    pub dirty: bool,
}

/// The flush group's index in [`Pending::groups`].
pub(crate) const FLUSH_GROUP: usize = 3;

/// The diskstats group of `op`, as an index into [`Pending::groups`].
pub(crate) fn group_index(op: OpKind) -> Option<usize> {
    match op {
        OpKind::Read => Some(0),
        OpKind::Write | OpKind::WriteZeroes => Some(1),
        OpKind::Discard | OpKind::Fallocate { .. } => Some(2),
        OpKind::Flush | OpKind::Fsync => Some(FLUSH_GROUP),
        _ => None,
    }
}

/// Per-device state on one core.
pub(crate) struct CoreDev {
    pub shared: Arc<DeviceShared>,
    /// The device's requests on this core, by slot.
    pub rqs: RqSlab,
    /// Slots of requests waiting for tags (FIFO): every one may go.
    pub waiting: VecDeque<u32>,
    /// Requests waiting for earlier ones they must not overtake (in no
    /// queue; see [`crate::order`]).
    pub blocked: u32,
    /// The program order of the next request built.
    pub next_seq: u64,
    /// Live requests with a byte range, by range, while `index_active`.
    pub index: IntervalIndex,
    /// The interval index is kept: a write was built since the device was
    /// last idle here (until then no two live requests can conflict, and
    /// reads skip the index).
    pub index_active: bool,
    /// Flushes still waiting for the writes before them.
    pub flushes: Vec<u32>,
    /// The device's `overlap_order` option (off: nothing is ordered).
    pub overlap_order: bool,
    /// The newest request built by a flush (`NIL`: none, or dispatched):
    /// the one a bio may join.
    pub last_built: u32,
    /// Scratch list of conflicting slots (kept for its capacity).
    pub scratch_conflicts: Vec<u32>,
    /// Scratch counts of `check_invariants` (kept for its capacity, so the
    /// debug checks allocate nothing per IO either).
    #[cfg(debug_assertions)]
    pub check_scratch: std::cell::RefCell<(Vec<u32>, Vec<u64>)>,
    /// Checks run (debug builds), to space out the costly ones.
    #[cfg(debug_assertions)]
    pub checks: std::cell::Cell<u64>,
    /// A task waits on the tag set for this device.
    pub waiter_running: bool,
    /// Tags held by requests and fast-lane bios in flight from this core.
    pub tags_held: u32,
    /// Fast-lane bios in flight (holding a tag; see [`FAST`]).
    pub fast_in_flight: u32,
    /// Fast-lane bios waiting or in flight, and live requests built from
    /// one (see [`FAST`]).
    pub fast_live: u32,
    /// Writes blocked until `fast_live` is zero.
    pub fast_waiters: Vec<u32>,
    /// Bio indices of the fast-lane writes a flush has linked and sends
    /// after its loop (empty outside a flush).
    pub lane_writes: Vec<u32>,
    /// Requests in flight from this core that change the device.
    pub writes_in_flight: u32,
    /// Waiting or blocked requests that change the device.
    pub writes_waiting: u32,
    /// This core's iostats counters for the device.
    pub counters: Arc<CoreCounters>,
    /// Counts of this batch, published once at its end.
    pub pending: Pending,
    /// `in_flight` / `io_ticks` bookkeeping.
    pub busy: BusyClock,
    /// The device's `iostats` option.
    pub iostats: bool,
    /// The device's `cached_clock` option.
    pub cached_clock: bool,
    /// The device's `fast_lane` option (see [`FAST`]).
    pub fast_lane: bool,
    /// Hot copies of the device's limits and options.
    pub max_request_bytes: u64,
    pub max_merge_bytes: u64,
    pub max_range_request_bytes: u64,
    pub max_segs: usize,
    pub nomerges: u8,
    /// Where a short transfer may resume (the device's offset alignment
    /// for direct IO, 1 otherwise).
    pub offset_align_bytes: u64,
    /// A read that moves no data has reached the end of the file: true
    /// where the device has no capacity of its own (a regular file, whose
    /// size moves); a device with one has no end of file inside it (reads
    /// past it are refused before submission).
    pub short_read_is_eof: bool,
    /// Scratch list of request slots (kept for its capacity).
    pub scratch_slots: Vec<u32>,
}

impl CoreDev {
    /// The state of `shared` on a core that starts using it.
    pub fn new(shared: &Arc<DeviceShared>) -> Self {
        let o = &shared.opts;
        CoreDev {
            shared: shared.clone(),
            rqs: RqSlab::default(),
            waiting: VecDeque::new(),
            blocked: 0,
            next_seq: 0,
            index: IntervalIndex::default(),
            index_active: false,
            flushes: Vec::new(),
            overlap_order: o.overlap_order,
            last_built: NIL,
            scratch_conflicts: Vec::new(),
            #[cfg(debug_assertions)]
            check_scratch: Default::default(),
            #[cfg(debug_assertions)]
            checks: Default::default(),
            waiter_running: false,
            tags_held: 0,
            writes_in_flight: 0,
            writes_waiting: 0,
            fast_in_flight: 0,
            fast_live: 0,
            fast_waiters: Vec::new(),
            lane_writes: Vec::new(),
            counters: shared.register_core(),
            pending: Pending::default(),
            busy: BusyClock::default(),
            iostats: o.iostats,
            cached_clock: o.cached_clock,
            fast_lane: o.fast_lane,
            max_request_bytes: shared.max_request_bytes,
            max_merge_bytes: shared.max_merge_bytes,
            max_range_request_bytes: shared.max_range_request_bytes,
            max_segs: shared.geometry.max_segments.max(1) as usize,
            nomerges: o.nomerges,
            offset_align_bytes: u64::from(shared.geometry.offset_align_bytes().max(1)),
            short_read_is_eof: shared.geometry.capacity_bytes.is_none(),
            scratch_slots: Vec::new(),
        }
    }

    /// Builds the request of fast-lane bio `index` (see [`FAST`]), in state
    /// `state` (`Waiting`: about to be dispatched; `InFlight`: its tag and
    /// start time are the bio's), for what the fast lane does not do. It holds
    /// the device's `fast_live` count until released (`fast_hold`).
    pub(crate) fn request_of_fast(&mut self, bios: &BioTable, index: u32, state: RqState) -> u32 {
        let d = self;
        let id = bios.id_at(index);
        let bio = bios
            .get(id)
            .expect("a fast-lane bio lives until it completes");
        if state == RqState::InFlight && bio.lane != NIL {
            return d.request_of_lane(bio, id);
        }
        let slot = d.rqs.alloc();
        let rq = d.rqs.get_mut(slot);
        take_bio(rq, bio, id);
        // Program order: before every live write. The bio took the fast
        // lane when no write was live, so each live write was built after
        // it (a flush among them must not wait for those writes).
        rq.seq = 0;
        rq.deps = 0;
        rq.state = state;
        rq.fast_hold = true;
        if d.index_active && rq.op.has_range() && rq.len_bytes > 0 {
            d.index.insert(&mut d.rqs, slot);
        }
        slot
    }

    /// [`CoreDev::request_of_fast`] of a bio in flight that was sent while
    /// a write was live: its lane slot (see [`crate::order`]) becomes its
    /// request, in flight, in the same place in the interval index and
    /// with the same dependents; it holds no `fast_live` count (it had
    /// none).
    #[cold]
    fn request_of_lane(&mut self, bio: &Bio, id: BioId) -> u32 {
        let slot = bio.lane;
        let rq = self.rqs.get_mut(slot);
        debug_assert_eq!(rq.state, RqState::Lane);
        debug_assert_eq!(
            (rq.offset_bytes, rq.len_bytes),
            (bio.offset_bytes, bio.len_bytes)
        );
        take_bio(rq, bio, id);
        rq.state = RqState::InFlight;
        rq.fast_hold = false;
        slot
    }

    /// A fast-lane write of bio `index`, linked under its lane slot, that
    /// the SQ writer refused (see `flush::send_lane_writes`): the slot
    /// becomes its request, waiting at the back of the FIFO, with its
    /// `seq`, its place in the index and what waits for it. Returns the
    /// slot.
    #[cold]
    pub(crate) fn lane_to_waiting(&mut self, bios: &mut BioTable, index: u32) -> u32 {
        let id = bios.id_at(index);
        let bio = bios.fast_mut(index);
        let slot = std::mem::replace(&mut bio.lane, NIL);
        let rq = self.rqs.get_mut(slot);
        debug_assert!(rq.state == RqState::Lane && rq.op.is_write());
        take_bio(rq, bio, id);
        rq.state = RqState::Waiting;
        self.writes_in_flight -= 1;
        self.writes_waiting += 1;
        self.waiting.push_back(slot);
        slot
    }

    /// Whether the device may be forgotten on this core: every handle is
    /// gone and nothing of it waits or is in flight here.
    pub fn idle_closed(&self) -> bool {
        self.shared.is_closed()
            && self.tags_held == 0
            && self.waiting.is_empty()
            && self.blocked == 0
            && !self.waiter_running
    }

    /// Adds the bio cache hits and misses of the device's plug counts
    /// (`counts`, taken from the plug as its bios leave it: a flush, or an
    /// abandoned core) to the pending iostats: once per flush, where
    /// counting at each issue cost about 10 instructions per IO.
    #[inline]
    pub fn count_plugged_bios(&mut self, counts: &PlugCounts) {
        if self.iostats && counts.bios > 0 {
            let p = &mut self.pending;
            let misses = counts.cache_misses as u64;
            p.bio_cache_hits += counts.bios as u64 - misses;
            p.bio_cache_misses += misses;
            p.dirty = true;
        }
    }

    /// Adds the batch's tallies to the shared counters and clears them.
    pub fn publish(&mut self) {
        let p = &mut self.pending;
        if !p.dirty {
            return;
        }
        let c = &self.counters;
        let groups = [&c.read, &c.write, &c.discard, &c.flush];
        for (g, t) in groups.iter().zip(p.groups.iter_mut()) {
            if t.ios | t.merges != 0 {
                g.ios.add(t.ios);
                g.merges.add(t.merges);
                g.sectors.add(t.sectors);
                g.ticks_ns.add(t.ticks_ns);
                *t = OpTally::default();
            }
        }
        for (counter, v) in [
            (&c.plug_flushes, &mut p.plug_flushes),
            (&c.bios, &mut p.bios),
            (&c.requests, &mut p.requests),
            (&c.bio_cache_hits, &mut p.bio_cache_hits),
            (&c.bio_cache_misses, &mut p.bio_cache_misses),
            (&c.fixed_buf_requests, &mut p.fixed_buf_requests),
            (&c.requeues, &mut p.requeues),
            (&c.bounce_ios, &mut p.bounce_ios),
            (&c.bounce_bytes, &mut p.bounce_bytes),
            (&c.fua_writes, &mut p.fua_writes),
        ] {
            if *v != 0 {
                counter.add(*v);
                *v = 0;
            }
        }
        p.dirty = false;
    }

    /// Recounts the counters from the slab and the FIFO, and checks the
    /// ordering state (see [`crate::order`]); panics on a mismatch. Debug
    /// builds run it after every flush, dispatch and completion batch; the
    /// ordering part, which walks every dependency, runs every time while
    /// the slab is small and every 16th time past 64 slots (a broken
    /// dependency persists until it is seen).
    #[cfg(debug_assertions)]
    pub fn check_invariants(&self) {
        self.check_counts();
        let n = self.checks.get().wrapping_add(1);
        self.checks.set(n);
        if self.rqs.len() <= 64 || n % 16 == 0 {
            self.check_order();
        }
    }

    #[cfg(debug_assertions)]
    fn check_counts(&self) {
        let (mut held, mut wr_fl, mut wr_wait, mut blocked, mut waiting) = (0, 0, 0, 0, 0);
        let mut indexed = 0;
        let mut holds = 0;
        let mut lanes = 0;
        for (i, rq) in self.rqs.iter_slots() {
            holds += u32::from(rq.fast_hold && rq.state != RqState::Free);
            let writes = rq.op.is_write();
            match rq.state {
                RqState::Free => {
                    assert!(rq.op == OpKind::Nop, "a free request keeps its op");
                    assert!(!rq.node.linked, "free slot {i} in the interval index");
                    continue;
                }
                RqState::Blocked => {
                    blocked += 1;
                    wr_wait += u32::from(writes);
                    assert!(rq.deps > 0, "slot {i} blocked on nothing");
                }
                RqState::Waiting => {
                    waiting += 1;
                    wr_wait += u32::from(writes);
                    assert_eq!(rq.deps, 0, "slot {i} in the FIFO while blocked");
                }
                RqState::InFlight => {
                    held += 1;
                    wr_fl += u32::from(writes);
                    assert_eq!(rq.deps, 0, "slot {i} dispatched while blocked");
                }
                RqState::Lane => {
                    lanes += 1;
                    wr_fl += u32::from(writes);
                    assert!(!rq.fast_hold, "lane slot {i} holds the fast lane");
                    assert_eq!(rq.deps, 0, "lane slot {i} waits");
                    assert!(rq.node.linked, "lane slot {i} not in the index");
                }
            }
            let ranged = rq.op.has_range() && rq.len_bytes > 0;
            assert_eq!(
                rq.node.linked,
                ranged && self.index_active,
                "slot {i}: indexed iff ranged and the index is kept"
            );
            indexed += u32::from(rq.node.linked);
            assert!(
                self.index_active || !writes || !self.overlap_order,
                "a live write while the interval index is off"
            );
        }
        assert_eq!(self.index.len(), indexed, "interval index size");
        assert_eq!(held + self.fast_in_flight, self.tags_held, "tags_held");
        assert_eq!(wr_fl, self.writes_in_flight, "writes_in_flight");
        assert_eq!(wr_wait, self.writes_waiting, "writes_waiting");
        assert_eq!(blocked, self.blocked, "blocked");
        let fast_waiting = self.waiting.iter().filter(|&&i| i & FAST != 0).count();
        assert_eq!(
            waiting + fast_waiting,
            self.waiting.len(),
            "waiting FIFO length"
        );
        for &i in self.waiting.iter().filter(|&&i| i & FAST == 0) {
            assert_eq!(self.rqs.get(i).state, RqState::Waiting, "slot {i} in FIFO");
        }
        assert!(
            lanes <= self.fast_in_flight,
            "more lane slots than fast-lane bios in flight"
        );
        assert_eq!(
            fast_waiting as u32 + self.fast_in_flight + holds,
            self.fast_live + lanes,
            "fast_live (not counting the bios with a lane slot)"
        );
        for &w in &self.fast_waiters {
            assert_eq!(self.rqs.get(w).state, RqState::Blocked, "fast waiter {w}");
        }
        assert!(
            self.fast_live > 0 || self.fast_waiters.is_empty(),
            "writes wait for a fast lane that is empty"
        );
    }

    /// Every request's `deps` equals what lists it as a dependent (plus,
    /// for a flush, the live writes issued before it); the pending flush
    /// list names the blocked flushes; the index tree is well formed.
    #[cfg(debug_assertions)]
    fn check_order(&self) {
        let is_flush = |rq: &Request| matches!(rq.op, OpKind::Flush | OpKind::Fsync);
        let mut scratch = self.check_scratch.borrow_mut();
        let (waited_on, write_seqs) = &mut *scratch;
        waited_on.clear();
        waited_on.resize(self.rqs.len() as usize, 0);
        write_seqs.clear();
        for rq in self.rqs.iter().filter(|rq| rq.state != RqState::Free) {
            for &d in &rq.dependents {
                waited_on[d as usize] += 1;
            }
            if rq.op.is_write() {
                write_seqs.push(rq.seq);
            }
        }
        let min_write_seq = write_seqs.iter().copied().min().unwrap_or(u64::MAX);
        let mut blocked_flushes = 0;
        for (i, rq) in self.rqs.iter_slots() {
            if rq.state == RqState::Free {
                assert_eq!(waited_on[i as usize], 0, "free slot {i} still waited for");
                continue;
            }
            let mut want = waited_on[i as usize];
            // A write built while fast-lane bios were live waits for them.
            want += u32::from(self.fast_waiters.contains(&i));
            if self.overlap_order && is_flush(rq) && rq.seq > min_write_seq {
                // Live writes issued before the flush.
                want += write_seqs.iter().filter(|&&s| s < rq.seq).count() as u32;
            }
            assert_eq!(rq.deps, want, "deps of slot {i}");
            blocked_flushes += usize::from(is_flush(rq) && rq.state == RqState::Blocked);
        }
        assert_eq!(blocked_flushes, self.flushes.len(), "pending flush list");
        self.index.check(&self.rqs);
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
    pub fn position(&self, id: u64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|d| d.shared.id == id))
    }

    /// Adds a device in the first vacant slot; returns its index.
    pub fn insert(&mut self, dev: CoreDev) -> usize {
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

    /// Vacates the slots of closed, idle devices; returns whether any was.
    pub fn release_closed(&mut self) -> bool {
        let mut any = false;
        for slot in &mut self.slots {
            if slot.as_ref().is_some_and(CoreDev::idle_closed) {
                *slot = None;
                any = true;
            }
        }
        any
    }
}

/// A set of device indices of one core as one word: exact for indices
/// below 63; bit 63 stands for every index from 63 up, so a core with more
/// devices visits all of those (a visit of a device with nothing to do is
/// a borrow and a count). Only live devices may be visited:
/// [`DevMask::may_contain`] says nothing of whether a slot is vacant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DevMask(u64);

impl DevMask {
    /// Adds device `dev`.
    #[inline]
    pub fn insert(&mut self, dev: u32) {
        self.0 |= 1 << dev.min(63);
    }

    /// Whether device `dev` may be in the set: exactly below 63, and for
    /// every index from 63 up once one of those is in it.
    #[inline]
    pub fn may_contain(self, dev: usize) -> bool {
        self.0 & (1 << dev.min(63)) != 0
    }

    /// Whether no device is in the set.
    #[inline]
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::Index<usize> for DevList {
    type Output = CoreDev;
    #[inline]
    fn index(&self, i: usize) -> &CoreDev {
        self.get(i)
            .expect("a device index in use names a live device")
    }
}

impl std::ops::IndexMut<usize> for DevList {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut CoreDev {
        self.get_mut(i)
            .expect("a device index in use names a live device")
    }
}

/// The recount catches each counter a bug could break: every test breaks
/// one the way a missed increment or decrement would (on a real core,
/// after real IO), and the check that debug builds run after each flush,
/// dispatch and completion batch fails, naming it.
#[cfg(all(test, debug_assertions))]
mod invariant_tests {
    use super::*;
    use crate::core::EngineCore;
    use crate::{Device, DeviceOptions};
    use plugio_device::backend::mem::{MemConfig, MemDevice};
    use plugio_device::RingConfig;

    /// Runs some IO on a mem device, breaks this core's state of it with
    /// `mutate`, and runs the check.
    fn break_and_check(mutate: impl FnOnce(&mut CoreDev)) {
        let ex = crate::runtime::local(RingConfig::default()).expect("runtime");
        ex.run(async move {
            let mem = Arc::new(MemDevice::new(MemConfig::default()));
            let dev = Device::with_backend(mem, None, DeviceOptions::default()).expect("device");
            let buf = dev.alloc_buf(4096);
            let (r, _buf) = dev.write_at(buf, 0).await;
            r.expect("write");
            dev.nop().await.expect("nop");
            let core = EngineCore::current().expect("core");
            let index = core.dev_index(dev.shared()) as usize;
            let mut devs = core.devs.borrow_mut();
            let d = &mut devs[index];
            d.check_invariants(); // whole before the break
            mutate(d);
            d.check_invariants();
        });
    }

    #[test]
    #[should_panic(expected = "tags_held")]
    fn a_tag_counted_twice_is_caught() {
        break_and_check(|d| d.tags_held += 1);
    }

    #[test]
    #[should_panic(expected = "writes_in_flight")]
    fn a_write_never_uncounted_is_caught() {
        break_and_check(|d| d.writes_in_flight += 1);
    }

    #[test]
    #[should_panic(expected = "writes_waiting")]
    fn a_waiting_write_miscounted_is_caught() {
        break_and_check(|d| d.writes_waiting += 1);
    }

    #[test]
    #[should_panic(expected = "blocked")]
    fn a_blocked_count_left_behind_is_caught() {
        break_and_check(|d| d.blocked += 1);
    }

    #[test]
    #[should_panic(expected = "waiting FIFO length")]
    fn a_free_slot_left_in_the_fifo_is_caught() {
        break_and_check(|d| d.waiting.push_back(0));
    }

    #[test]
    #[should_panic(expected = "a free request keeps its op")]
    fn a_free_slot_that_kept_its_op_is_caught() {
        break_and_check(|d| d.rqs.slots[0].op = OpKind::Write);
    }
}
