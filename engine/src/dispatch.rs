//! Dispatch: waiting requests take tags in one batch and go to the backend
//! as one submission each (an SQE on the core's ring), with the token
//! `(device index << 32) | request slot`.
//!
//! Idea: blk-mq's batched tag allocation (`blk_mq_get_tags`,
//! `__sbitmap_queue_get_batch`) and `blk_mq_dispatch_rq_list`.
//!
//! Invariants:
//! - Requests leave the FIFO in order; every request in it may go
//!   (requests that must wait for earlier ones are held out of it, see
//!   [`crate::order`]).
//! - A tag taken for a request that is no longer there goes straight back
//!   to the tag set.
//! - The clock is read and the busy accounting done once per batch.
//! - A tag-waiter task runs for every device with dispatchable requests
//!   left, so they are retried when tags are freed on any core.
//! - No `RefCell` borrow of this core is held while a waker runs; the
//!   device list stays borrowed across `Backend::submit`, which never
//!   delivers a completion from inside.

use std::rc::Rc;

use plugio_device::{IoOp, SqSession, SqWriter};

use crate::bio::{Bio, BioTable};
use crate::clock;
use crate::core::EngineCore;
use crate::merge;
use crate::queue::{CoreDev, DevMask, FAST};
use crate::request::{Request, RqState};
use crate::shared::DeviceShared;
use crate::status::Status;
use crate::tag::Tag;

/// When the tags ran out with a fast-lane bio at the back of the FIFO (the
/// newest IO built), that bio becomes the request it would have been
/// without the fast lane, one that later bios may join (`last_built`):
/// else a bio built next to it while it waits for a tag could not merge,
/// and the device would get one more IO per bio (the kernel's plug too
/// merges into the newest request until it is issued). Only while no
/// write is live (as when the bio took the fast lane, so its request
/// orders before every write) and no request was built after it.
#[cold]
fn mergeable_when_left_waiting(d: &mut CoreDev, bios: &BioTable) {
    let Some(&back) = d.waiting.back() else {
        return;
    };
    if back & FAST == 0 || d.index_active || d.last_built != crate::interval::NIL {
        return;
    }
    let slot = d.request_of_fast(bios, back & !FAST, RqState::Waiting);
    let rq = d.rqs.get_mut(slot);
    rq.mergeable = merge::mergeable(rq.op, rq.flags) && rq.len_bytes <= d.max_merge_bytes;
    if let Some(entry) = d.waiting.back_mut() {
        *entry = slot;
    }
    d.last_built = slot;
}

/// The accounting of one dispatch batch: one clock read for the batch
/// with the cached clock (one per IO without it, the ablation of the
/// cached clock), the busy time's in-flight count, and the IOs the backend
/// sent on a registered buffer (the ring's count, read around the batch:
/// a request that names one in `fixed_buf` but goes to the mem device, the
/// sync pool or a refused submit is no fixed-buffer request); published
/// once at its end.
pub(crate) struct Batch {
    batch_clock: bool,
    /// Each IO reads the clock and counts its busy time itself (iostats
    /// on, the cached clock off): decided once per batch, not per IO.
    clock_per_io: bool,
    now: u64,
    fixed_before: u64,
    started: i64,
}

impl Batch {
    /// Opens a batch on `d`.
    #[inline]
    pub(crate) fn begin(d: &CoreDev) -> Batch {
        let batch_clock = d.iostats && d.cached_clock;
        Batch {
            batch_clock,
            clock_per_io: d.iostats && !batch_clock,
            now: if batch_clock { clock::now_ns(true) } else { 0 },
            fixed_before: if d.iostats {
                plugio_device::ring::current_fixed_buf_sqes()
            } else {
                0
            },
            started: 0,
        }
    }

    /// Whether each IO reads the clock itself ([`Batch::now`] differs per
    /// IO); else every IO of the batch starts at the batch's one reading.
    #[inline]
    pub(crate) fn clock_per_io(&self) -> bool {
        self.clock_per_io
    }

    /// The start time of the next IO (0 without iostats): the batch's
    /// one reading with the cached clock, else a fresh one.
    #[inline]
    pub(crate) fn now(&mut self) -> u64 {
        if self.clock_per_io {
            self.now = clock::now_ns(false);
        }
        self.now
    }

    /// Counts one IO started at `now` (from [`Batch::now`]).
    #[inline]
    pub(crate) fn count(&mut self, d: &mut CoreDev, now: u64) {
        self.started += 1;
        if self.clock_per_io {
            d.busy.event(now, 1, &d.counters);
        }
    }

    /// Counts `n` IOs started (with the batch's clock), whose busy time
    /// [`Batch::count_clock`] counted one by one where the clock is read
    /// per IO: [`Batch::count`] of each, in one addition (a loop that
    /// knows how many it sent from its own counts).
    #[inline]
    pub(crate) fn add_started(&mut self, n: usize) {
        self.started += n as i64;
    }

    /// The busy-time half of [`Batch::count`] (the count itself is added
    /// later, with [`Batch::add_started`]).
    #[inline]
    pub(crate) fn count_clock(&mut self, d: &mut CoreDev, now: u64) {
        if self.clock_per_io {
            d.busy.event(now, 1, &d.counters);
        }
    }

    /// Closes the batch.
    #[inline]
    pub(crate) fn end(self, d: &mut CoreDev) {
        if self.batch_clock && self.started > 0 {
            d.busy.event(self.now, self.started, &d.counters);
        }
        if d.iostats && self.started > 0 {
            let fixed =
                plugio_device::ring::current_fixed_buf_sqes().saturating_sub(self.fixed_before);
            if fixed > 0 {
                d.pending.fixed_buf_requests += fixed;
                d.pending.dirty = true;
            }
            d.publish();
        }
    }
}

/// Writes the SQE of fast-lane bio `index` (`bio`) of `d`, with `tag`,
/// through `sq` (see [`FAST`]): `false`, with nothing changed, when the
/// writer takes no such op or its SQ is full. `now` is its start time.
/// Its lane slot (`bio.lane`) is left as it is: `NIL` from its
/// allocation, or linked by the caller (a write's before its SQE, a
/// read's after).
#[inline(always)]
pub(crate) fn send_fast(
    d: &mut CoreDev,
    bio: &mut Bio,
    sq: &SqWriter<'_>,
    dev: u32,
    index: u32,
    tag: Tag,
    now: u64,
) -> bool {
    if !send_fast_uncounted(bio, sq, dev, index, tag, now) {
        return false;
    }
    d.tags_held += 1;
    d.fast_in_flight += 1;
    true
}

/// [`send_fast`] without its counts of `d`: the caller adds the IOs it
/// sent to `d.tags_held` and `d.fast_in_flight` itself, all at once,
/// before anything reads them (the flush's sending loop, which reads
/// neither).
#[inline(always)]
pub(crate) fn send_fast_uncounted(
    bio: &mut Bio,
    sq: &SqWriter<'_>,
    dev: u32,
    index: u32,
    tag: Tag,
    now: u64,
) -> bool {
    let (seg, fixed_buf) = bio.buf.one_iovec();
    // SAFETY: the bio's memory stays owned by its future (or the bio, once
    // orphaned) until this op's completion has been delivered to
    // `complete_batch`, and the bio keeps its slot until then. The writer
    // builds the SQE at once from the one segment's address (a
    // single-buffer op names no iovec array), so nothing points into the
    // segment after the call.
    let sent = unsafe {
        sq.try_submit_one(
            bio.op,
            bio.flags,
            bio.offset_bytes,
            bio.len_bytes,
            seg,
            fixed_buf,
            token(dev, FAST | index),
        )
    };
    if !sent {
        return false;
    }
    bio.tag = tag;
    bio.start_ns = now;
    true
}

/// [`send_fast_uncounted`] within an SQ session (the flush's sending
/// loop): the same SQE, pushed into the session's SQ.
#[inline(always)]
pub(crate) fn send_fast_session(
    bio: &mut Bio,
    sq: &mut SqSession<'_, '_>,
    dev: u32,
    index: u32,
    tag: Tag,
    now: u64,
) -> bool {
    let (seg, fixed_buf) = bio.buf.one_iovec();
    // SAFETY: as in `send_fast_uncounted`: the bio's memory stays owned
    // until its completion is delivered, and the SQE is built at once from
    // the one segment's address.
    let sent = unsafe {
        sq.try_submit_one(
            bio.op,
            bio.flags,
            bio.offset_bytes,
            bio.len_bytes,
            seg,
            fixed_buf,
            token(dev, FAST | index),
        )
    };
    if !sent {
        return false;
    }
    bio.tag = tag;
    bio.start_ns = now;
    true
}

impl EngineCore {
    /// [`EngineCore::dispatch_waiting`] of every live device in `marked`
    /// and, with `any_waiting`, of every live device with requests waiting.
    /// Vacant slots (devices released since) are skipped.
    pub(crate) fn dispatch_devices(self: &Rc<Self>, marked: DevMask, any_waiting: bool) {
        let nr_devs = self.devs.borrow().len();
        for dev in 0..nr_devs {
            let Some(waiting) = self.devs.borrow().get(dev).map(|d| !d.waiting.is_empty()) else {
                continue;
            };
            if marked.may_contain(dev) || (any_waiting && waiting) {
                self.dispatch_waiting(dev as u32);
            }
        }
    }

    /// Takes tags for the device's waiting requests and dispatches as many
    /// as got one; starts a tag-waiter task if some are left.
    pub fn dispatch_waiting(self: &Rc<Self>, dev: u32) {
        // Nothing to send (the common case after a flush that sent its
        // bios itself): no reference to the device taken.
        let (shared, nr) = {
            let devs = self.devs.borrow();
            let d = &devs[dev as usize];
            let nr = d.dispatchable();
            if nr == 0 {
                return;
            }
            (d.shared.clone(), nr)
        };
        let mut tags = std::mem::take(&mut *self.scratch_tags.borrow_mut());
        shared
            .tags_for(self.core)
            .get_tags(self.core, nr, &mut tags);
        self.dispatch_tags(dev, &shared, &tags);
        tags.clear();
        *self.scratch_tags.borrow_mut() = tags;
        self.ensure_tag_waiter(dev);
    }

    /// Dispatches the oldest waiting requests of `dev`, one per tag; tags
    /// left over (nothing dispatchable any more) are put back. The
    /// backend's SQ writer is found once for the batch
    /// ([`Backend::with_sq_writer`](plugio_device::Backend::with_sq_writer)).
    pub fn dispatch_tags(self: &Rc<Self>, dev: u32, shared: &DeviceShared, tags: &[Tag]) {
        let mut failed = std::mem::take(&mut *self.scratch_failed.borrow_mut());
        {
            let mut devs = self.devs.borrow_mut();
            let d = &mut devs[dev as usize];
            let mut bios = self.bios.borrow_mut();
            shared.backend.with_sq_writer(self.handler, &mut |sq| {
                self.dispatch_batch(d, &mut bios, sq, dev, tags, &mut failed);
            });
            if !d.waiting.is_empty() {
                mergeable_when_left_waiting(d, &bios);
            }
            #[cfg(debug_assertions)]
            d.check_invariants();
        }
        if !failed.is_empty() {
            self.complete_statuses(&failed);
            failed.clear();
        }
        *self.scratch_failed.borrow_mut() = failed;
    }

    /// The loop of [`EngineCore::dispatch_tags`], with the batch's SQ
    /// writer (`None`: each request through `Backend::submit_direct`).
    /// Requests the backend refused go to `failed`.
    #[inline]
    pub(crate) fn dispatch_batch(
        &self,
        d: &mut CoreDev,
        bios: &mut BioTable,
        sq: Option<&SqWriter<'_>>,
        dev: u32,
        tags: &[Tag],
        failed: &mut Vec<(u64, Status)>,
    ) {
        let mut batch = Batch::begin(d);
        for (i, &tag) in tags.iter().enumerate() {
            if d.dispatchable() == 0 {
                d.shared
                    .tags_for(self.core)
                    .put_batch(self.core, &tags[i..]);
                break;
            }
            let Some(slot) = d.waiting.pop_front() else {
                break;
            };
            // Counted as started whether the backend takes it or not.
            let now = batch.now();
            batch.count(d, now);
            let (slot, sent) = if slot & FAST != 0 {
                self.dispatch_fast(d, bios, sq, dev, slot & !FAST, tag, now)
            } else {
                (slot, self.dispatch_one(d, bios, sq, dev, slot, tag, now))
            };
            if let Err(e) = sent {
                failed.push((token(dev, slot), Status::Submit(e.errno())));
            }
        }
        batch.end(d);
    }

    /// Starts request `slot` of `d` with `tag`: builds its iovecs in place
    /// and submits it, through the batch's SQ writer when there is one.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn dispatch_one(
        &self,
        d: &mut CoreDev,
        bios: &BioTable,
        sq: Option<&SqWriter<'_>>,
        dev: u32,
        slot: u32,
        tag: Tag,
        now: u64,
    ) -> Result<(), plugio_device::Error> {
        let rq = d.rqs.get_mut(slot);
        debug_assert_eq!(rq.state, RqState::Waiting);
        rq.state = RqState::InFlight;
        rq.tag = tag;
        rq.start_ns = now;
        let writes = rq.op.is_write();
        build_iovecs(bios, rq, sq);
        d.writes_waiting -= u32::from(writes);
        d.writes_in_flight += u32::from(writes);
        d.tags_held += 1;
        if d.last_built == slot {
            // No bio joins a request once it is on its way.
            d.last_built = crate::interval::NIL;
        }
        let rq = d.rqs.get(slot);
        let op = IoOp {
            kind: rq.op,
            offset_bytes: rq.offset_bytes,
            len_bytes: rq.len_bytes,
            segments: &rq.iovecs,
            fixed_buf: rq.fixed_buf,
            flags: rq.flags,
        };
        // SAFETY: the iovecs point into the buffers of the request's bios,
        // which the bio table keeps (even for orphaned bios) until this
        // request's completion has been delivered to `complete_batch`; the
        // request itself stays in its slab slot (never moved) until then.
        // Direct: the request stays in its slot until its completion, so
        // the ring keeps no copy (a per-op EAGAIN comes back here and the
        // request goes again, see `complete::requeue_again`).
        unsafe {
            if sq.is_some_and(|sq| sq.try_submit_direct(&op, token(dev, slot))) {
                return Ok(());
            }
            d.shared
                .backend
                .submit_direct(&op, self.handler, token(dev, slot))
        }
    }

    /// Starts fast-lane bio `index` of `d` with `tag` (see
    /// [`FAST`](crate::queue::FAST)): its SQE written from the bio by the
    /// batch's SQ writer, with no request. Where the writer takes no such
    /// op (or there is none: a backend without a ring), the bio becomes a
    /// request first and goes as one. Returns the token's slot and the
    /// submission's result.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn dispatch_fast(
        &self,
        d: &mut CoreDev,
        bios: &mut BioTable,
        sq: Option<&SqWriter<'_>>,
        dev: u32,
        index: u32,
        tag: Tag,
        now: u64,
    ) -> (u32, Result<(), plugio_device::Error>) {
        if let Some(sq) = sq {
            if send_fast(d, bios.fast_mut(index), sq, dev, index, tag, now) {
                return (FAST | index, Ok(()));
            }
        }
        let slot = d.request_of_fast(bios, index, RqState::Waiting);
        (slot, self.dispatch_one(d, bios, sq, dev, slot, tag, now))
    }

    /// Spawns a task that waits on the tag set for `dev` when requests wait
    /// and no such task runs yet.
    fn ensure_tag_waiter(self: &Rc<Self>, dev: u32) {
        if plugio_executor::core_uid() != Some(self.uid) {
            // Not on this core's live executor (its driver draining as it
            // drops): no task can be spawned; what waits is ended with
            // the core's state (`abandon`). Spawning there panicked, and
            // during an unwind aborted (found by a break-it helper).
            return;
        }
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
                core.dispatch_tags(dev, &shared, &batch);
                core.wake_pending();
            }
            core.devs.borrow_mut()[dev as usize].waiter_running = false;
        });
    }
}

/// The submission token of request `slot` of device `dev`.
#[inline]
pub(crate) fn token(dev: u32, slot: u32) -> u64 {
    (u64::from(dev) << 32) | u64::from(slot)
}

/// Fills `rq.iovecs` from its pieces' bio buffers, and names the
/// registered buffer when every piece lies in the same one of the core's
/// registered arena: `READ_FIXED`/`WRITE_FIXED` for one contiguous run of
/// memory, and `READV_FIXED`/`WRITEV_FIXED` for several (merged bios whose
/// buffers are apart) where the batch's SQ writer `sq` has them, so that
/// the kernel pins no page for the request.
#[inline]
fn build_iovecs(bios: &BioTable, rq: &mut Request, sq: Option<&SqWriter<'_>>) {
    rq.iovecs.clear();
    rq.fixed_buf = None;
    if !rq.op.has_data() {
        return;
    }
    if let [p] = rq.pieces.as_slice() {
        // The common case: one bio, one buffer, all of it.
        if let Some(bio) = bios.get(p.bio) {
            let whole = bio.buf.first_iovec();
            if p.bio_offset == 0 && whole.iov_len as u64 == p.len_bytes && whole.iov_len > 0 {
                rq.iovecs.push(whole);
                rq.fixed_buf = bio.buf.fixed();
                return;
            }
        }
    }
    build_iovecs_of_pieces(bios, rq, sq.is_some_and(SqWriter::vectored_fixed));
}

/// [`build_iovecs`] of a request of several pieces, or of part of a
/// buffer (out of line: the one-buffer case above is the hot one). One
/// pass over the pieces builds the iovecs and finds the registered buffer
/// they share, if any.
#[inline(never)]
fn build_iovecs_of_pieces(bios: &BioTable, rq: &mut Request, vectored_fixed: bool) {
    // The registered buffer of the first piece, and whether every piece
    // lies in that same one (a piece whose bio is gone shares none).
    let mut fixed = None;
    let mut shared = true;
    for (i, p) in rq.pieces.iter().enumerate() {
        let Some(bio) = bios.get(p.bio) else {
            shared = false;
            continue;
        };
        let f = match bio
            .buf
            .push_whole_one(p.bio_offset, p.len_bytes, &mut rq.iovecs)
        {
            Some(f) => f,
            None => {
                bio.buf
                    .push_iovecs(p.bio_offset, p.len_bytes, &mut rq.iovecs);
                bio.buf.fixed()
            }
        };
        if i == 0 {
            fixed = f;
        } else if f != fixed {
            shared = false;
        }
    }
    // One contiguous run of memory (one piece, or merged bios whose
    // buffers are adjacent, as fio's io_u buffers often are), or several
    // where the ring has the vectored fixed opcodes: registered when every
    // piece lies in the same registered buffer.
    if shared && (rq.iovecs.len() == 1 || vectored_fixed) {
        rq.fixed_buf = fixed;
    }
}
