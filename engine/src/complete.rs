//! Completion, one batch at a time: each token names a request slot; the
//! request's typed [`Status`] is split between its bios, their tasks are
//! woken, and the tags, the clock read and the iostats are handled once
//! per batch.
//!
//! Idea: `blk_mq_end_request_batch` (one clock read per batch, tags freed
//! in batches with `blk_mq_put_tags` / `sbitmap_queue_clear_batch`), and
//! `blk_update_request` (a partial completion ends the bios it covers and
//! the rest of the request is issued again).
//!
//! Invariants:
//! - Each request completes exactly once: its slot is released here and a
//!   token naming a free slot (which the device layer never delivers) is
//!   ignored with an error log.
//! - Merging never changes an IO's result: a short or failed completion of
//!   a request that holds several bios ends the bios it covers in full and
//!   issues every other bio (or the uncovered rest of one) again as a
//!   request of its own, which then completes as that bio alone would.
//!   An error of the whole device at one instant (`device_wide`: a device
//!   gone offline, such as the mem device's power cut) fails every bio of
//!   the request instead: each was in flight then and would have failed
//!   alone, while issued again after that instant it could succeed.
//! - A short read or write of one bio resumes at the last aligned boundary
//!   it reached (O_DIRECT cannot resume elsewhere) as a new request at the
//!   front of the device's FIFO. A result with no aligned progress (0
//!   bytes, or less than one alignment unit) ends a read short only where
//!   the device can have an end of file inside it (a regular file: no
//!   capacity in its geometry). Elsewhere, and for writes, it is a stall:
//!   the request is issued once more as it is, and a second stall in a row
//!   ends its bio with `ErrorKind::NoProgress` naming the range. So
//!   `Ok(n < len)` means end of file for a read, and for a write that an
//!   error (`ENOSPC`, `EDQUOT`, `EFBIG`) stopped after its first bytes: the
//!   count written, as `pwrite` returns it (`end_split`).
//! - A bio is finished when its last request completes; an orphaned bio
//!   (its future was dropped) is freed then, with its buffer.
//! - A per-op `-EAGAIN` (delivered for direct submissions) sends the same
//!   request back to the front of its FIFO, up to 64 times in a row.
//! - Wakers run after every borrow of this core is released, once per
//!   batch (or at the end of the flush that is running). The exception
//!   runs no code but the executor's: a waker of a task of this core that
//!   waking only queues on its run queue (`LocalWake::try_wake`) is woken
//!   as its bio ends, while no waker waits in the list before it, so the
//!   wakes keep their order.

use std::rc::Rc;
use std::task::Waker;

use plugio_device::{IoFlags, OpKind};
use plugio_executor::LocalWake;

use crate::bio::{BioState, BioTable};
use crate::clock;
use crate::core::EngineCore;
use crate::interval::NIL;
use crate::queue::{group_index, CoreDev, DevMask, FAST, FLUSH_GROUP};
use crate::request::{Piece, RqState};
use crate::status::{Completed, Status};
use crate::tag::TagPuts;

/// What one batch left to do once its borrows are released.
#[derive(Default)]
struct Outcome {
    /// Devices whose FIFO got requests issued again.
    requeued: DevMask,
}

impl EngineCore {
    /// Completes a batch of `(token, result)` pairs as the device layer
    /// delivers them (`result` as a CQE's `res`: bytes or a negative errno
    /// or encoded NVMe status).
    pub fn complete_batch(self: &Rc<Self>, completions: &[(u64, i32)]) {
        self.complete_statuses(completions);
    }

    /// Completes a batch of completions.
    pub(crate) fn complete_statuses<C: Completed>(self: &Rc<Self>, completions: &[C]) {
        let mut outcome = Outcome::default();
        {
            let mut devs = self.devs.borrow_mut();
            let mut bios = self.bios.borrow_mut();
            let mut wakes = self.wake_list.borrow_mut();
            let mut puts = self.scratch_puts.borrow_mut();
            let local = LocalWake::current();
            let mut rest = completions;
            while let Some(first) = rest.first() {
                let dev = device_of(first.token());
                let Some(d) = devs.get_mut(dev as usize) else {
                    rest = &rest[unknown_device(dev, rest)..];
                    continue;
                };
                let mut ctx = Ctx {
                    bios: &mut bios,
                    wakes: Wakes {
                        deferring: !wakes.is_empty(),
                        list: &mut wakes,
                        local,
                    },
                    requeued: false,
                    // The tags to free, gathered as bits of the set's words
                    // as they come.
                    puts: d.shared.tags_for(self.core).gather_puts(&mut puts),
                };
                d.shared.adopt_remote_orphans(self.uid, ctx.bios);
                // The device's run is found as it is completed.
                let run = complete_device(d, dev, self.core, rest, &mut ctx);
                rest = &rest[run..];
                if ctx.requeued {
                    outcome.requeued.insert(dev);
                }
            }
        }
        crate::bio::drop_buried();
        if !outcome.requeued.is_empty() && !self.flushing.get() {
            self.dispatch_devices(outcome.requeued, false);
        }
        if !self.flushing.get() {
            self.wake_pending();
        }
    }

    /// Wakes the tasks whose bios completed.
    pub(crate) fn wake_pending(&self) {
        // Most calls (each flush's end, batches whose wakes were all done
        // at once) find the list empty: nothing to take and put back.
        if self.wake_list.borrow().is_empty() {
            return;
        }
        let mut list = std::mem::take(&mut *self.wake_list.borrow_mut());
        // In order, as `wake` on each; this core's own tasks inline.
        plugio_executor::wake_all(&mut list);
        // Keep the list's capacity, unless a waker queued more wakes
        // meanwhile: those stay for the next call.
        let mut slot = self.wake_list.borrow_mut();
        if slot.is_empty() {
            *slot = list;
        }
    }
}

/// The core's tables a completion touches.
struct Ctx<'a> {
    bios: &'a mut BioTable,
    wakes: Wakes<'a>,
    /// Requests were issued again (the FIFO needs a dispatch).
    requeued: bool,
    /// The device's tags to free at the end of its run.
    puts: TagPuts<'a>,
}

/// The wakes of the tasks whose bios ended.
struct Wakes<'a> {
    /// The wakers to wake once the borrows are released, in order.
    list: &'a mut Vec<Waker>,
    /// The current core, for the wakes that run no other code.
    local: LocalWake,
    /// `list` is not empty: every later waker waits in it too, behind
    /// those (a flag in the context, not a load of the list's length).
    deferring: bool,
}

impl Wakes<'_> {
    /// Wakes `waker` now if that only queues a task of this core and no
    /// waker waits before it; otherwise queues it in the list.
    #[inline(always)]
    fn wake(&mut self, waker: Waker) {
        debug_assert_eq!(self.deferring, !self.list.is_empty());
        if !self.deferring {
            if let Err(waker) = self.local.try_wake(waker) {
                self.deferring = true;
                self.list.push(waker);
            }
        } else {
            self.list.push(waker);
        }
    }
}

/// The device a completion's token names.
#[inline(always)]
fn device_of(token: u64) -> u32 {
    (token >> 32) as u32
}

/// Logs and skips the run of completions at the start of `batch` for
/// `dev`, which this core does not have; returns its length.
#[cold]
#[inline(never)]
fn unknown_device<C: Completed>(dev: u32, batch: &[C]) -> usize {
    tracing::error!(dev, "completions for an unknown device ignored");
    batch
        .iter()
        .take_while(|c| device_of(c.token()) == dev)
        .count()
}

/// Completes device `dev`'s run at the start of `batch` (its completions
/// up to the first of another device) and returns its length: per
/// request, the status split into its bios; per run, one clock read, one
/// tag batch free and the iostats. The device's accounting mode is tested
/// once per run, not per request: each mode has its own copy of the loop.
fn complete_device<C: Completed>(
    d: &mut CoreDev,
    dev: u32,
    core: usize,
    batch: &[C],
    ctx: &mut Ctx<'_>,
) -> usize {
    match (d.iostats, d.cached_clock) {
        (false, _) => complete_run::<C, false, false>(d, dev, core, batch, ctx),
        (true, true) => complete_run::<C, true, false>(d, dev, core, batch, ctx),
        (true, false) => complete_run::<C, true, true>(d, dev, core, batch, ctx),
    }
}

/// [`complete_device`] in one accounting mode: `IOSTATS` is the device's
/// `iostats`; `CLOCK_EACH`, with it, reads the clock per request (the
/// cached clock off, its ablation) instead of once for the run.
#[inline(never)]
fn complete_run<C: Completed, const IOSTATS: bool, const CLOCK_EACH: bool>(
    d: &mut CoreDev,
    dev: u32,
    core: usize,
    batch: &[C],
    ctx: &mut Ctx<'_>,
) -> usize {
    debug_assert_eq!(IOSTATS, d.iostats);
    debug_assert!(!CLOCK_EACH || IOSTATS);
    debug_assert_eq!(CLOCK_EACH, IOSTATS && !d.cached_clock);
    // One clock read for the batch with the cached clock; one per request
    // without it (the ablation of the cached clock).
    let batch_clock = IOSTATS && !CLOCK_EACH;
    let clock_each = CLOCK_EACH;
    let mut now = if batch_clock { clock::now_ns(true) } else { 0 };
    // The run's length, from the iterator where it ends (no count kept).
    let mut run = batch.len();
    let mut iter = batch.iter();
    while let Some(&c) = iter.next() {
        let token = c.token();
        if device_of(token) != dev {
            run = batch.len() - iter.len() - 1;
            break;
        }
        let mut slot = token as u32;
        if slot & FAST != 0 {
            let index = slot & !FAST;
            // Only a byte count can end a fast-lane bio there: the status
            // is decoded past that test.
            if let Some(n) = c.bytes() {
                if try_complete_fast::<IOSTATS, CLOCK_EACH>(d, index, n, &mut now, ctx) {
                    continue;
                }
            }
            // Short, failed or to be sent again: as the request it would
            // have been, on the general path below.
            d.fast_in_flight -= 1;
            slot = d.request_of_fast(ctx.bios, index, RqState::InFlight);
        }
        let status = c.status();
        let in_flight = d
            .rqs
            .try_get_mut(slot)
            .is_some_and(|rq| rq.state == RqState::InFlight);
        if !in_flight {
            tracing::error!(token, "completion for a request not in flight ignored");
            continue;
        }
        if clock_each {
            now = clock::now_ns(false);
            d.busy.event(now, -1, &d.counters);
        }
        let rq = d.rqs.get(slot);
        ctx.puts.add(rq.tag);
        d.writes_in_flight -= u32::from(rq.op.is_write());
        // A completion that moved every byte (the common case) is neither
        // a per-op EAGAIN nor a stall: both tests are skipped.
        let whole = matches!(status, Status::Bytes(n) if n >= rq.len_bytes);
        if !whole
            && ((status == Status::Errno(libc::EAGAIN) && requeue_again(d, slot))
                || stalled_once(d, slot, status))
        {
            ctx.requeued = true;
            continue;
        }
        complete_request::<IOSTATS>(d, slot, status, now, ctx);
        if d.order_done(slot) {
            // Requests that waited for this one may go now.
            ctx.requeued = true;
        }
        let fast_hold = d.rqs.get(slot).fast_hold;
        d.rqs.release(slot);
        if fast_hold && d.fast_done() {
            ctx.requeued = true;
        }
    }
    if ctx.puts.is_empty() {
        return run;
    }
    // Each tag added is one held (`tags_held` drops by them all at once).
    let freed = ctx.puts.len();
    d.tags_held -= freed as u32;
    if batch_clock {
        d.busy.event(now, -(freed as i64), &d.counters);
    }
    if IOSTATS {
        d.publish();
    }
    d.shared.tags_for(core).put_gathered(core, &ctx.puts, freed);
    #[cfg(debug_assertions)]
    d.check_invariants();
    run
}

/// Completes fast-lane bio `index` on the fast lane when its completion,
/// `n` bytes, ends it there: every byte moved, or an op without data
/// (what [`complete_request`] ends without issuing anything again).
/// Otherwise returns false having done nothing. When it does: the clock
/// is read for it where `CLOCK_EACH`, its tag goes back with the batch,
/// its share is its bytes, its task is woken (or its slot freed, if its
/// future is gone), and writes waiting for the fast lane may go once it
/// is empty. The bio is looked up once, for the test and the completion.
#[inline(always)]
fn try_complete_fast<const IOSTATS: bool, const CLOCK_EACH: bool>(
    d: &mut CoreDev,
    index: u32,
    n: u64,
    now: &mut u64,
    ctx: &mut Ctx<'_>,
) -> bool {
    let bio = ctx.bios.fast_mut(index);
    let len = bio.len_bytes;
    if n < len && matches!(bio.op, OpKind::Read | OpKind::Write) {
        return false;
    }
    if CLOCK_EACH {
        *now = clock::now_ns(false);
        d.busy.event(*now, -1, &d.counters);
    }
    ctx.puts.add(bio.tag);
    let lane = bio.lane;
    d.fast_in_flight -= 1;
    if IOSTATS {
        if let Some(g) = group_index(bio.op) {
            let t = &mut d.pending.groups[g];
            t.ios += 1;
            t.sectors += len.div_ceil(512);
            t.ticks_ns += now.saturating_sub(bio.start_ns);
            d.pending.dirty = true;
        }
    }
    // A fast-lane bio is its own one part, never split (`flush::lane_part`)
    // and its share is its bytes, not an error: what `complete_part` does
    // with it, without its tests of the result and the split (it ends the
    // bio).
    debug_assert!(
        bio.parts_left == 1 && !bio.split,
        "fast-lane bio {index} is one part"
    );
    bio.done_bytes = n.min(len);
    bio.parts_left = 0;
    bio.state = BioState::Done;
    if bio.orphaned {
        let id = ctx.bios.id_at(index);
        ctx.bios.free(id);
    } else if let Some(w) = bio.waker.take() {
        ctx.wakes.wake(w);
    }
    // Sent while a write was live (its node in the index, see
    // `crate::order`), or counted in `fast_live`.
    let moved = if lane == NIL {
        d.fast_done()
    } else {
        d.lane_done(lane)
    };
    if moved {
        ctx.requeued = true;
    }
    true
}

/// Accounts request `slot` and hands its status to its bios, issuing
/// again what a short or failed completion left undone (see the module
/// invariants).
#[inline(always)]
fn complete_request<const IOSTATS: bool>(
    d: &mut CoreDev,
    slot: u32,
    status: Status,
    now: u64,
    ctx: &mut Ctx<'_>,
) {
    let rq = d.rqs.get(slot);
    let op = rq.op;
    if IOSTATS {
        let ticks_ns = now.saturating_sub(rq.start_ns);
        if let Some(g) = group_index(op) {
            let t = &mut d.pending.groups[g];
            t.ios += 1;
            t.sectors += rq.len_bytes.div_ceil(512);
            t.ticks_ns += ticks_ns;
            d.pending.dirty = true;
        }
        if rq.flags.bits() & DURABILITY_FLAGS != 0 {
            count_durability(&mut d.pending, rq.flags, ticks_ns);
        }
    }
    // The common case: every byte moved (or an op without data whose
    // result is not an error). Its pieces take their shares; nothing goes
    // again.
    if let Status::Bytes(n) = status {
        if n >= rq.len_bytes || !matches!(op, OpKind::Read | OpKind::Write) {
            if let [p] = rq.pieces.as_slice() {
                // One bio piece (no merge): its share, as `split_result`
                // gives it, without the per-piece call.
                finish_piece(ctx.bios, p, n.min(p.len_bytes) as i64, &mut ctx.wakes);
                return;
            }
            if n >= rq.len_bytes {
                // Every piece moved in full (a merged request that
                // completed): each takes its own length, in one loop.
                for p in &rq.pieces {
                    finish_piece(ctx.bios, p, p.len_bytes as i64, &mut ctx.wakes);
                }
                return;
            }
            rq.split_result(status.as_share(), |p, share| {
                finish_piece(ctx.bios, p, share, &mut ctx.wakes)
            });
            return;
        }
    }
    complete_request_rest(d, slot, status, ctx);
}

/// The flags a request's durability is counted by (writes only: a FUA or
/// PREFLUSH write is never on the fast lane, see `flush::lane_write`).
const DURABILITY_FLAGS: u32 = IoFlags::FUA.bits() | IoFlags::PREFLUSH.bits();

/// Counts a completed FUA write, and the preflush of a PREFLUSH write as a
/// flush of its own, as the kernel's flush machinery accounts it
/// (`blk_account_io_flush`); linked to the write, it is timed with it.
#[cold]
#[inline(never)]
fn count_durability(pending: &mut crate::queue::Pending, flags: IoFlags, ticks_ns: u64) {
    if flags.contains(IoFlags::PREFLUSH) {
        let t = &mut pending.groups[FLUSH_GROUP];
        t.ios += 1;
        t.ticks_ns += ticks_ns;
    }
    if flags.contains(IoFlags::FUA) {
        pending.fua_writes += 1;
    }
    pending.dirty = true;
}

/// [`complete_request`] of a short transfer or an error: what to issue
/// again, or how the bios fail.
#[cold]
fn complete_request_rest(d: &mut CoreDev, slot: u32, status: Status, ctx: &mut Ctx<'_>) {
    let rq = d.rqs.get(slot);
    let op = rq.op;
    let several = rq.pieces.len() > 1;
    let reissue_from = match status {
        Status::Bytes(n) if n < rq.len_bytes && matches!(op, OpKind::Read | OpKind::Write) => {
            if several {
                Some(n)
            } else {
                let align = d.offset_align_bytes;
                let aligned = n - n % align;
                if aligned == 0 && !(op == OpKind::Read && d.short_read_is_eof) {
                    // The second stall in a row (`stalled_once` let the
                    // first one go again).
                    fail_stalled(d, slot, ctx);
                    return;
                }
                (aligned > 0).then_some(aligned)
            }
        }
        Status::Errno(e) if several && !device_wide(e) => Some(0),
        Status::Nvme(_) if several => Some(0),
        _ => None,
    };
    match reissue_from {
        None if matches!(status, Status::Submit(_)) && plugio_device::fork::check().is_err() => {
            // Plugged before a fork, dispatched in the child: the backend
            // refused it as `Forked`, which the errno alone does not say.
            fail_with(d, slot, ctx, |_, _| plugio_device::ErrorKind::Forked);
        }
        None => {
            let rq = d.rqs.get(slot);
            rq.split_result(status.as_share(), |p, share| {
                finish_piece(ctx.bios, p, share, &mut ctx.wakes)
            });
        }
        Some(covered) => {
            reissue(d, slot, covered, ctx);
            ctx.requeued = true;
        }
    }
}

/// An errno that fails the whole device at one instant rather than some
/// of its blocks, as the kernel's `blk_status_to_errno` reports a device
/// gone offline (`BLK_STS_OFFLINE`: `ENODEV`), a transport or nexus
/// failure (`ENOLINK`, `EBADE`), or a removed device (`ENXIO`,
/// `ESHUTDOWN`). Every bio of a request failed by one was in flight at
/// that instant and would have failed alone too: the request's bios all
/// get it, none is issued again (issued after the instant, it could
/// succeed where it would have failed unmerged).
fn device_wide(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENODEV | libc::ENXIO | libc::ESHUTDOWN | libc::ENOLINK | libc::EBADE
    )
}

/// A per-op `-EAGAIN` (the device layer delivers it for direct
/// submissions instead of resubmitting): request `slot` goes back, as it
/// is, to the front of its FIFO (it was the oldest of what came after it)
/// and is dispatched again with a new tag. False after
/// [`MAX_EAGAIN_RETRIES`] tries in a row: the error then ends it.
fn requeue_again(d: &mut CoreDev, slot: u32) -> bool {
    let rq = d.rqs.get_mut(slot);
    if rq.eagain_retries >= MAX_EAGAIN_RETRIES {
        return false;
    }
    rq.eagain_retries += 1;
    requeue_front(d, slot);
    true
}

/// A stall: a single-piece read or write that moved no aligned data (0
/// bytes, or less than one alignment unit) where that is no end of file
/// (see the module invariants). The first stall in a row sends request
/// `slot` back, as it is, to the front of its FIFO and returns true; the
/// second returns false, and `complete_request` ends the bio with
/// `ErrorKind::NoProgress`.
fn stalled_once(d: &mut CoreDev, slot: u32, status: Status) -> bool {
    let Status::Bytes(n) = status else {
        return false;
    };
    let eof = d.short_read_is_eof;
    let rq = d.rqs.get_mut(slot);
    let stall = n < rq.len_bytes
        && n < d.offset_align_bytes
        && rq.pieces.len() == 1
        && match rq.op {
            OpKind::Read => !eof,
            OpKind::Write => true,
            _ => false,
        };
    if !stall || rq.stalls > 0 {
        return false;
    }
    rq.stalls += 1;
    requeue_front(d, slot);
    true
}

/// Ends the one bio piece of stalled request `slot` with
/// `ErrorKind::NoProgress` naming where the IO stopped and what was left
/// of it from there (the bio's range, whatever the requests it was cut
/// into or merged with).
fn fail_stalled(d: &mut CoreDev, slot: u32, ctx: &mut Ctx<'_>) {
    let offset_bytes = d.rqs.get(slot).offset_bytes;
    fail_with(d, slot, ctx, |bio, p| {
        plugio_device::ErrorKind::NoProgress {
            offset_bytes,
            len_bytes: bio.len_bytes - p.bio_offset,
        }
    });
}

/// Ends every piece of request `slot` with the error `kind(bio, piece)`
/// (kept unless the bio already has one).
fn fail_with(
    d: &mut CoreDev,
    slot: u32,
    ctx: &mut Ctx<'_>,
    kind: impl Fn(&crate::bio::Bio, &Piece) -> plugio_device::ErrorKind,
) {
    for p in &d.rqs.get(slot).pieces {
        if let Some(bio) = ctx.bios.get_mut(p.bio) {
            let k = kind(bio, p);
            bio.error
                .get_or_insert_with(|| plugio_device::Error::new(k));
        }
        finish_piece(ctx.bios, p, -i64::from(libc::EIO), &mut ctx.wakes);
    }
}

/// Sends request `slot`, as it is, back to the front of its FIFO (it was
/// the oldest of what came after it), to be dispatched again with a new
/// tag.
fn requeue_front(d: &mut CoreDev, slot: u32) {
    let rq = d.rqs.get_mut(slot);
    rq.state = RqState::Waiting;
    let writes = rq.op.is_write();
    d.writes_waiting += u32::from(writes);
    d.waiting.push_front(slot);
    if d.iostats {
        d.pending.requeues += 1;
        d.pending.dirty = true;
    }
}

/// How many per-op `-EAGAIN` results in a row a request is issued again
/// after (the ring's own resubmission of slot ops has no limit; this one
/// stops a backend that answers `EAGAIN` for good, such as a pool read of
/// a non-blocking descriptor, from spinning).
const MAX_EAGAIN_RETRIES: u8 = 64;

/// Ends the pieces of request `slot` that its first `covered` bytes
/// transferred in full, and queues the rest at the front of the FIFO, one
/// request per piece (the uncovered part of a partly covered piece, from
/// the last aligned boundary; `covered` is aligned for a single piece).
fn reissue(d: &mut CoreDev, slot: u32, covered: u64, ctx: &mut Ctx<'_>) {
    let align = d.offset_align_bytes;
    let mut pieces = std::mem::take(&mut d.rqs.get_mut(slot).pieces);
    let (op, flags, start, fast_hold) = {
        let rq = d.rqs.get(slot);
        (rq.op, rq.flags, rq.offset_bytes, rq.fast_hold)
    };
    let mut new_slots = std::mem::take(&mut d.scratch_slots);
    let mut at = start;
    let mut left = covered;
    for p in &pieces {
        let done = left.min(p.len_bytes);
        left -= done;
        let done = if done == p.len_bytes {
            done
        } else {
            done - done % align
        };
        if done == p.len_bytes {
            finish_piece(ctx.bios, p, done as i64, &mut ctx.wakes);
            at += p.len_bytes;
            continue;
        }
        let Some(bio) = ctx.bios.get_mut(p.bio) else {
            at += p.len_bytes;
            continue;
        };
        if done > 0 {
            // The covered part ends as a part of its own; the rest follows.
            bio.split = true;
            bio.parts_left += 1;
            bio.complete_part(p.bio_offset, done, done as i64);
        }
        let nr_segs = bio.buf.nr_segs();
        let new = d.rqs.alloc();
        let rq = d.rqs.get_mut(new);
        rq.state = RqState::Waiting;
        rq.op = op;
        rq.flags = flags;
        rq.offset_bytes = at + done;
        rq.len_bytes = p.len_bytes - done;
        rq.pieces.push(Piece {
            bio: p.bio,
            bio_offset: p.bio_offset + done,
            len_bytes: p.len_bytes - done,
        });
        rq.nr_segs = nr_segs;
        rq.fast_hold = fast_hold;
        d.fast_live += u32::from(fast_hold);
        d.writes_waiting += u32::from(op.is_write());
        new_slots.push(new);
        at += p.len_bytes;
    }
    d.order_reissued(slot, &new_slots);
    for &s in new_slots.iter().rev() {
        d.waiting.push_front(s);
    }
    if d.iostats {
        d.pending.requeues += new_slots.len() as u64;
        d.pending.dirty = true;
    }
    new_slots.clear();
    d.scratch_slots = new_slots;
    pieces.clear();
    d.rqs.get_mut(slot).pieces = pieces;
}

/// Records a piece's share of a request's result in its bio; when the bio
/// is finished, queues its waker, or frees it if its future is gone.
#[inline(always)]
fn finish_piece(bios: &mut BioTable, p: &Piece, share: i64, wakes: &mut Wakes<'_>) {
    let Some(bio) = bios.get_mut(p.bio) else {
        return;
    };
    if !bio.complete_part(p.bio_offset, p.len_bytes, share) {
        return;
    }
    if bio.orphaned {
        bios.free(p.bio);
    } else if let Some(w) = bio.waker.take() {
        wakes.wake(w);
    }
}
