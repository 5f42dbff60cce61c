//! Ordering between the requests of one device on one core: a request
//! waits for exactly the earlier requests it must not overtake, and for
//! nothing else.
//!
//! The kernel leaves this to the file system (blk-mq reorders freely); a
//! database using plugio gets program order for overlapping IO instead, as
//! a file system's own IO path gives it. The cost must not grow with the
//! queue depth: the live requests of a device are kept in an interval
//! index ([`crate::interval`]), so finding what a new request overlaps is
//! `O(log n + k)`, and a completion releases only its own dependents.
//!
//! Invariants (recounted by `CoreDev::check_invariants` in debug builds):
//! - A request with a byte range depends on every earlier live request
//!   (waiting, blocked or in flight) of its device on this core that it
//!   overlaps, where one of the two changes the device; `deps` counts them
//!   and each lists it in its `dependents`. It is `Blocked` (in no queue)
//!   while `deps > 0`, and goes to the back of the FIFO when the last of
//!   them completes. Everything in the FIFO may be dispatched.
//! - The requests of a bio split at the request limit (and those issued
//!   again from one) are ordered and indexed by the whole bio's range
//!   (`Request::whole`): each depends on what the whole bio overlaps (but
//!   its other requests), and a later request that overlaps any part of
//!   the bio depends on all of them. The bio is one IO to its caller: a
//!   write issued after a read that overlaps it must not extend the file
//!   under that read through a request that does not overlap it, in
//!   either order.
//! - A flush (or fsync) depends on the live writes with a lower `seq` (the
//!   ones issued before it); pending flushes are listed in `flushes`.
//!   Reads never hold a flush back, and a flush holds nothing back.
//! - A request issued again after a short or failed completion keeps the
//!   `seq` of the request it comes from, and whatever waited for that
//!   request waits for each new piece.
//! - The interval index holds every live request with a byte range while
//!   `index_active`; it is switched on by the first write built while it is
//!   off (the live requests are indexed then, once) and off when it
//!   empties. While it is off no write is live, so reads cannot conflict
//!   and skip it: a read-only workload never touches it.
//! - A fast-lane read sent while the index is on overlaps no live write;
//!   a fast-lane write overlaps no live request at all, and is sent only
//!   while no fast-lane bio is live outside the index (`fast_live` 0).
//!   Each has a `Lane` slot linked in the index (its op and range, no
//!   request; a write's also its `seq`, and it counts in
//!   `writes_in_flight`), which requests built after it that conflict with
//!   it wait for like any request (and a flush built after a write), until
//!   its completion frees the slot (or the slot becomes its request, for a
//!   short or failed completion). Idea: the kernel's direct issue
//!   (`blk_mq_try_issue_directly`), with the program order of overlapping
//!   IO kept on top of it.
//! - A bio joins the newest request built only if it conflicts with no
//!   other live request (it would otherwise need a dependency the request
//!   lacks).
//! - With the device's `overlap_order` off, nothing is ordered: every
//!   request goes straight to the FIFO and the index stays off.

use plugio_device::OpKind;

use crate::bio::BioId;
use crate::interval::{Nodes, NIL};
use crate::queue::CoreDev;
use crate::request::RqState;

fn is_flush(op: OpKind) -> bool {
    matches!(op, OpKind::Flush | OpKind::Fsync)
}

impl CoreDev {
    /// Orders new request `slot` (its op and range set, state `Free`):
    /// gives it the next `seq`, finds what it waits for, and puts it in the
    /// FIFO or marks it blocked.
    #[inline]
    pub(crate) fn order_new(&mut self, slot: u32) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let rq = self.rqs.get_mut(slot);
        rq.seq = seq;
        rq.deps = 0;
        let op = rq.op;
        if (!self.index_active && !op.is_write()) || !self.overlap_order {
            // No write is live (nothing to wait for, a flush included), or
            // nothing is ordered.
            rq.state = RqState::Waiting;
            self.writes_waiting += u32::from(op.is_write());
            self.waiting.push_back(slot);
            return;
        }
        self.order_new_slow(slot, op);
    }

    /// [`CoreDev::order_new`] where a write is live or this is one.
    fn order_new_slow(&mut self, slot: u32, op: OpKind) {
        let rq = self.rqs.get(slot);
        let len = rq.len_bytes;
        // A piece of a split bio is ordered by the whole bio's range, and
        // does not wait for its bio's other pieces.
        let (offset, end) = self.rqs.range(slot);
        let siblings_of = rq.whole.and(rq.pieces.first().map(|p| p.bio));
        let mut deps = 0;
        if is_flush(op) {
            // Every live write was issued before this flush.
            deps = self.writes_waiting + self.writes_in_flight;
            if deps > 0 {
                self.flushes.push(slot);
            }
        } else if op.has_range() && len > 0 {
            if op.is_write() && !self.index_active {
                self.activate_index();
            }
            if self.index_active {
                deps = self.add_dependent(slot, op, offset, end - offset, siblings_of);
                self.index.insert(&mut self.rqs, slot);
            }
        }
        if op.is_write() && self.fast_live > 0 {
            // Fast-lane bios live (reads issued before it): it waits for
            // all of them, overlapping or not (see `queue::FAST`).
            deps += 1;
            self.fast_waiters.push(slot);
        }
        self.writes_waiting += u32::from(op.is_write());
        let rq = self.rqs.get_mut(slot);
        rq.deps = deps;
        if deps > 0 {
            rq.state = RqState::Blocked;
            self.blocked += 1;
        } else {
            rq.state = RqState::Waiting;
            self.waiting.push_back(slot);
        }
    }

    /// Registers `slot` as a dependent of every live request that conflicts
    /// with `op` on `[offset, offset + len)` (but the other requests of
    /// split bio `siblings_of`); returns how many.
    fn add_dependent(
        &mut self,
        slot: u32,
        op: OpKind,
        offset: u64,
        len: u64,
        siblings_of: Option<BioId>,
    ) -> u32 {
        let mut found = std::mem::take(&mut self.scratch_conflicts);
        self.conflicts(op, offset, len, slot, &mut found);
        if let Some(bio) = siblings_of {
            // A split bio's requests are never merged: each has one piece.
            found.retain(|&c| self.rqs.get(c).pieces.first().map(|p| p.bio) != Some(bio));
        }
        for &c in &found {
            self.rqs.get_mut(c).dependents.push(slot);
        }
        let n = found.len() as u32;
        found.clear();
        self.scratch_conflicts = found;
        n
    }

    /// Collects into `out` the live requests (but `except`) that overlap
    /// `[offset, offset + len)` where `op` or theirs changes the device.
    /// Nothing while the index is off (no write is live then).
    fn conflicts(&self, op: OpKind, offset: u64, len: u64, except: u32, out: &mut Vec<u32>) {
        if !self.index_active {
            debug_assert!(!op.is_write(), "a write looked up with the index off");
            return;
        }
        let rqs = &self.rqs;
        self.index
            .for_overlaps(rqs, offset, offset.saturating_add(len), &mut |c| {
                if c != except && (op.is_write() || rqs.get(c).op.is_write()) {
                    out.push(c);
                }
            });
    }

    /// Whether any live request but `except` overlaps `[offset, offset +
    /// len)` where an op that changes the device (`WRITE`) or theirs
    /// does: the test of [`CoreDev::conflicts`], without the list. False
    /// while the index is off (it is empty then). Generic over `WRITE`, so
    /// that each kind has its own walk of the index (a read's fast-lane
    /// test is on the hot path).
    #[inline]
    fn conflicts_any<const WRITE: bool>(&self, offset: u64, len: u64, except: u32) -> bool {
        let mut any = false;
        let rqs = &self.rqs;
        self.index
            .for_overlaps(rqs, offset, offset.saturating_add(len), &mut |c| {
                any |= c != except && (WRITE || rqs.get(c).op.is_write());
            });
        any
    }

    /// Whether a bio `op` on `[offset, offset + len)` may join request
    /// `slot`: it conflicts with no other live request.
    #[inline]
    pub(crate) fn may_join(&mut self, slot: u32, op: OpKind, offset: u64, len: u64) -> bool {
        if !self.overlap_order || (!self.index_active && !op.is_write()) {
            // Nothing is ordered, or no write is live (the index is off):
            // a read conflicts with nothing.
            return true;
        }
        self.may_join_slow(slot, op, offset, len)
    }

    /// [`CoreDev::may_join`] where a write is live or this is one.
    fn may_join_slow(&mut self, slot: u32, op: OpKind, offset: u64, len: u64) -> bool {
        if op.is_write() && !self.index_active {
            self.activate_index();
        }
        if op.is_write() {
            !self.conflicts_any::<true>(offset, len, slot)
        } else {
            !self.conflicts_any::<false>(offset, len, slot)
        }
    }

    /// Changes the range of request `slot` (a bio joined it), keeping the
    /// interval index right.
    #[inline]
    pub(crate) fn set_range(&mut self, slot: u32, offset: u64, len: u64) {
        let rq = self.rqs.get_mut(slot);
        rq.offset_bytes = offset;
        rq.len_bytes = len;
        if rq.node.linked {
            self.index.update_range(&mut self.rqs, slot);
        }
    }

    /// Request `slot` is done (completed, or ended without dispatch): what
    /// waited for it may go, and it leaves the index. Call before the slot
    /// is released. Returns whether a request moved to the FIFO (it then
    /// needs a dispatch).
    #[inline]
    pub(crate) fn order_done(&mut self, slot: u32) -> bool {
        let rq = self.rqs.get(slot);
        if rq.dependents.is_empty() && !rq.node.linked && self.flushes.is_empty() {
            // Nothing waits for it and it is in no index (the read-only
            // and no-op path).
            if self.last_built == slot {
                self.last_built = NIL;
            }
            return false;
        }
        self.order_done_slow(slot)
    }

    /// [`CoreDev::order_done`] for a request something may wait for.
    fn order_done_slow(&mut self, slot: u32) -> bool {
        let fifo = self.waiting.len();
        let rq = self.rqs.get(slot);
        let (seq, write, linked) = (rq.seq, rq.op.is_write(), rq.node.linked);
        if !rq.dependents.is_empty() {
            self.release_dependents(slot);
        }
        if linked {
            self.index.remove(&mut self.rqs, slot);
            if self.index.len() == 0 {
                // Nothing ranged is live: no write either, so reads may
                // skip the index until the next write.
                self.index_active = false;
            }
        }
        if write && !self.flushes.is_empty() {
            let mut i = 0;
            while i < self.flushes.len() {
                let f = self.flushes[i];
                if self.rqs.get(f).seq > seq {
                    self.dependency_done(f);
                }
                if self.rqs.get(f).state == RqState::Blocked {
                    i += 1;
                } else {
                    self.flushes.swap_remove(i);
                }
            }
        }
        if self.last_built == slot {
            self.last_built = NIL;
        }
        self.waiting.len() > fifo
    }

    /// What waited for `slot` (done) no longer waits for it.
    fn release_dependents(&mut self, slot: u32) {
        let mut dependents = std::mem::take(&mut self.rqs.get_mut(slot).dependents);
        for &d in &dependents {
            self.dependency_done(d);
        }
        dependents.clear();
        self.rqs.get_mut(slot).dependents = dependents;
    }

    /// One fast-lane bio (or a request built from one) is done. Returns
    /// whether writes that waited for the fast lane moved to the FIFO
    /// (they then need a dispatch).
    #[inline]
    pub(crate) fn fast_done(&mut self) -> bool {
        self.fast_live -= 1;
        if self.fast_live > 0 || self.fast_waiters.is_empty() {
            return false;
        }
        self.release_fast_waiters()
    }

    /// [`CoreDev::fast_done`] of the last fast-lane bio with writes
    /// waiting for it.
    #[cold]
    fn release_fast_waiters(&mut self) -> bool {
        let fifo = self.waiting.len();
        let mut waiters = std::mem::take(&mut self.fast_waiters);
        for &w in &waiters {
            self.dependency_done(w);
        }
        waiters.clear();
        self.fast_waiters = waiters;
        self.waiting.len() > fifo
    }

    /// Whether a read of `[offset, offset + len)` overlaps no live write,
    /// so that it may take the fast lane while the index is on.
    #[inline]
    pub(crate) fn lane_clear(&self, offset: u64, len: u64) -> bool {
        !self.conflicts_any::<false>(offset, len, NIL)
    }

    /// Whether a write of `[offset, offset + len)` has nothing to wait
    /// for, so that it may take the fast lane: no fast-lane bio is live
    /// outside the index (`fast_live`), and it overlaps no live request.
    /// Switches the index on first (a write is about to be live).
    pub(crate) fn lane_clear_write(&mut self, offset: u64, len: u64) -> bool {
        if self.fast_live > 0 || !self.overlap_order {
            return false;
        }
        if !self.index_active {
            self.activate_index();
        }
        !self.conflicts_any::<true>(offset, len, NIL)
    }

    /// Takes a slot for the node of a fast-lane bio `op` of `[offset,
    /// offset + len)`, just sent with the index on, and links it (state
    /// `Lane`): requests built from now on that conflict with it wait for
    /// it. A write's slot takes the next `seq` and counts in
    /// `writes_in_flight`, so that a flush built after it waits for it.
    /// Returns the slot.
    #[inline]
    pub(crate) fn link_lane(&mut self, op: OpKind, offset: u64, len: u64) -> u32 {
        debug_assert!(self.index_active && len > 0);
        let write = op.is_write();
        let slot = self.rqs.alloc();
        let rq = self.rqs.get_mut(slot);
        rq.op = op;
        rq.offset_bytes = offset;
        rq.len_bytes = len;
        rq.seq = if write { self.next_seq } else { 0 };
        rq.deps = 0;
        rq.state = RqState::Lane;
        self.next_seq += u64::from(write);
        self.writes_in_flight += u32::from(write);
        self.index.insert(&mut self.rqs, slot);
        slot
    }

    /// The fast-lane bio of lane slot `slot` completed: what waited for it
    /// may go (a flush built after a write, too), and the slot leaves the
    /// index and is freed. Returns whether a request moved to the FIFO (it
    /// then needs a dispatch).
    #[inline]
    pub(crate) fn lane_done(&mut self, slot: u32) -> bool {
        let rq = self.rqs.get(slot);
        debug_assert_eq!(rq.state, RqState::Lane);
        self.writes_in_flight -= u32::from(rq.op.is_write());
        let moved = self.order_done(slot);
        self.rqs.release(slot);
        moved
    }

    /// One request that `d` waited for is done.
    fn dependency_done(&mut self, d: u32) {
        let rq = self.rqs.get_mut(d);
        debug_assert!(
            rq.state == RqState::Blocked && rq.deps > 0,
            "slot {d} not blocked"
        );
        rq.deps -= 1;
        if rq.deps == 0 {
            rq.state = RqState::Waiting;
            self.blocked -= 1;
            self.waiting.push_back(d);
        }
    }

    /// Request `orig` (in flight, completing) is issued again as the
    /// requests `pieces` (built, `Waiting`, about to go to the front of the
    /// FIFO): they take its place in the order. Call before
    /// [`CoreDev::order_done`] of `orig`.
    pub(crate) fn order_reissued(&mut self, orig: u32, pieces: &[u32]) {
        let (seq, write) = {
            let rq = self.rqs.get(orig);
            (rq.seq, rq.op.is_write())
        };
        let dependents = std::mem::take(&mut self.rqs.get_mut(orig).dependents);
        let extra = pieces.len() as u32;
        for &d in &dependents {
            self.rqs.get_mut(d).deps += extra;
        }
        let whole = self.rqs.get(orig).whole;
        for &p in pieces {
            let rq = self.rqs.get_mut(p);
            rq.whole = whole;
            rq.seq = seq;
            rq.deps = 0;
            rq.dependents.extend_from_slice(&dependents);
            let ranged = rq.op.has_range() && rq.len_bytes > 0;
            if ranged && self.index_active {
                self.index.insert(&mut self.rqs, p);
            }
        }
        self.rqs.get_mut(orig).dependents = dependents;
        if write {
            for i in 0..self.flushes.len() {
                let f = self.flushes[i];
                if self.rqs.get(f).seq > seq {
                    self.rqs.get_mut(f).deps += extra;
                }
            }
        }
    }

    /// Builds the interval index from the live requests (the first write
    /// since the device was idle on this core).
    fn activate_index(&mut self) {
        debug_assert_eq!(self.index.len(), 0);
        self.index_active = true;
        for i in 0..self.rqs.len() {
            let rq = self.rqs.get(i);
            if rq.state != RqState::Free && rq.op.has_range() && rq.len_bytes > 0 {
                self.index.insert(&mut self.rqs, i);
            }
        }
    }

    /// How many requests at the front of the FIFO may be dispatched now:
    /// all of them (blocked requests are not in it).
    pub(crate) fn dispatchable(&self) -> usize {
        self.waiting.len()
    }
}
