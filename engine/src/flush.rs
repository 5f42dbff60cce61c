//! The plug flush: the bios of one tick become requests, built in place in
//! their device's request slab, merged where the rules allow, and queued
//! in the device's FIFO; then [`dispatch`](crate::dispatch) takes tags for
//! them in one batch.
//!
//! Idea: `blk_mq_flush_plug_list` (the plug drained at the end of a batch)
//! and `blk_attempt_plug_merge` (a bio joins the newest request when
//! contiguous).
//!
//! Invariants:
//! - A flush takes every bio of the plug; bios of one device keep their
//!   program order except inside the conflict-free runs that
//!   [`merge::order_for_merge`] sorts (nomerges 0).
//! - A bio becomes one request, joins the newest waiting request, or is
//!   split at the device's request limit into several; `parts_left` counts
//!   them. A fast-lane bio (see [`FAST`]) becomes none: the flush sends it
//!   itself while nothing waits in its device's FIFO, else it queues there
//!   behind what waits, so the FIFO's order is kept (a write never queues
//!   as itself: it becomes a request).
//! - A flush never runs inside another (the `flushing` flag), and it does
//!   not enter the kernel: the core's park submits the SQEs in one enter.

use std::rc::Rc;

use plugio_device::{IoFlags, OpKind};

use plugio_device::{SqSession, SqWriter};

use crate::bio::{Bio, BioBuf, BioId, BioInfo, BioTable};
use crate::core::EngineCore;
use crate::dispatch::{send_fast, send_fast_session, Batch};
use crate::interval::NIL;
use crate::merge;
use crate::plug::{self, Drained, Plug, Plugged};
use crate::queue::{group_index, CoreDev, DevMask, FAST};
use crate::request::{Piece, RqState};
use crate::shared::DeviceShared;
use crate::tag::{Tag, TagSet};

/// [`EngineCore::plug_bio`]'s flush of a full plug or without a plug:
/// only the SQEs' building (`true`) for a full plug with plugging on.
#[cold]
#[inline(never)]
fn full_only(full: bool, unplugged: bool) -> bool {
    full && !unplugged
}

impl EngineCore {
    /// Puts an issued bio into the plug (counting its bio allocation as a
    /// bio cache hit or miss); flushes at once when the plug is
    /// over its count or byte limit. A full plug only builds and prepares
    /// its requests: the SQEs go to the kernel in the park's one enter (or
    /// earlier when the SQ fills). With plugging off (`plug_max_count` 1)
    /// and for IO issued from a tick hook that runs after ours, the flush
    /// also enters the kernel at once.
    ///
    /// Takes the state by reference (the issue holds no `Rc` of it, see
    /// `device::current_core`), so it does not flush itself: it returns
    /// the flush to run before the tick ends, `Some(full_only)`, which
    /// the caller runs with [`EngineCore::flush_now`] once its reference
    /// is no longer used (a flush may reach what forgets a state, which
    /// must not happen while a reference to it is live).
    #[inline(always)]
    #[must_use]
    pub fn plug_bio(
        &self,
        dev: u32,
        id: BioId,
        bio: &BioInfo,
        bio_cache_hit: bool,
    ) -> Option<bool> {
        let (full, unplugged) = {
            let mut plug = self.plug.borrow_mut();
            // One test of the op's kind for the sort key, the merge rule
            // and the ordering (see `merge::plug_class`).
            let class = merge::plug_class(bio.op);
            let key = merge::sort_key_of_group(class & 3, bio.flags, bio.offset_bytes);
            debug_assert_eq!(key, merge::sort_key(bio.op, bio.flags, bio.offset_bytes));
            let mergeable = class & plug::CLASS_DATA != 0 && merge::flags_mergeable(bio.flags);
            debug_assert_eq!(mergeable, merge::mergeable(bio.op, bio.flags));
            debug_assert_eq!(
                class & plug::CLASS_ORDERED != 0,
                bio.op.is_write() || matches!(bio.op, OpKind::Flush | OpKind::Fsync)
            );
            plug.push(
                Plugged { dev, id, key },
                bio.offset_bytes,
                bio.len_bytes,
                mergeable,
                class,
            );
            // Each device's limits count its own bios (a device with
            // the byte trigger off is not flushed by another's bytes);
            // the flush that one triggers takes the whole plug, as the
            // kernel's does.
            let nr_ios = plug.nr_ios;
            let c = &mut plug.devs[dev as usize];
            c.bios += 1;
            c.bytes += bio.len_bytes;
            // The bio cache counts go to the iostats when the plug is
            // drained (`CoreDev::count_plugged_bios`).
            c.cache_misses += usize::from(!bio_cache_hit);
            // plug_max_count 1 is plugging off: each IO goes alone.
            let unplugged = c.max_count == 1;
            (Plug::should_flush(nr_ios, c), unplugged)
        };
        // The common case first, each test once: under the limits with
        // plugging on, only IO issued from a late tick hook flushes now.
        // (The other case's answer is made out of line: computed here, it
        // was computed on every IO, before the tests.)
        if full || unplugged {
            return Some(full_only(full, unplugged));
        }
        plugio_executor::in_tick_hooks().then_some(false)
    }

    /// The flush before the tick ends that [`EngineCore::plug_bio`]
    /// returned, of the state of core `uid`, with a count of it held
    /// through the flush (the flush may reach what forgets a state). The
    /// state is the thread's last-used one (the issue found it so), so
    /// `by_uid` finds it without a scan.
    #[cold]
    #[inline(never)]
    pub fn flush_now(uid: u64, full_only: bool) {
        let core = EngineCore::by_uid(uid);
        debug_assert!(core.is_some(), "the issuing core's state is the thread's");
        if let Some(core) = core {
            core.flush_early(full_only);
        }
    }

    /// [`EngineCore::plug_bio`]'s flush before the tick ends: of a full
    /// plug (`full_only`: the SQEs wait for the park's enter), or without
    /// a plug, or for IO issued from a tick hook after ours (it would sit
    /// in the SQ while the core parks): to the kernel now.
    #[cold]
    fn flush_early(self: &Rc<Self>, full_only: bool) {
        self.flush();
        if full_only {
            return;
        }
        if let Err(e) = plugio_device::submit_now() {
            tracing::warn!(error = %e, "submit after an unplugged flush failed; the park will retry");
        }
    }

    /// Flushes the plug: turns its bios into requests (split at the
    /// device's request limit), takes tags for them in one batch per device
    /// and dispatches them; the rest wait for tags.
    pub fn flush(self: &Rc<Self>) {
        if self.flushing.replace(true) {
            return;
        }
        // Cleared when the flush ends, or unwinds: a flush left marked as
        // running would make every later flush return at once, and the
        // core's IO would stay plugged (a break-it helper's re-entrant
        // plug from a buffer's `Drop` did that).
        let flushing = Flushing(&self.flushing);
        let mut bios = std::mem::take(&mut *self.scratch_bios.borrow_mut());
        // Stable: program order is kept within each device. (One device,
        // the common case, needs no sort.)
        let (drained, one_dev) = {
            let mut plug = self.plug.borrow_mut();
            let drained = plug.drain_into(&mut bios);
            let mut devs = self.devs.borrow_mut();
            // One device holds every plugged bio where its count of them
            // (`PlugCounts::bios`, kept with each push) is the list's
            // length: no pass over the list.
            let one_dev = bios.first().is_none_or(|b| {
                plug.devs
                    .get(b.dev as usize)
                    .is_some_and(|c| c.bios == bios.len())
            });
            // The plug counts of the devices whose bios were drained (no
            // other device has any) are emptied with the plug, here,
            // before anything of this flush can plug more or unwind, so
            // that they always count what the plug holds. A core with
            // many open devices pays for the ones it flushes, not for all.
            // (A device's second take in the loop finds its counts empty.)
            let firsts = if one_dev {
                &bios[..bios.len().min(1)]
            } else {
                &bios[..]
            };
            for b in firsts {
                let counts = plug.take_counts(b.dev as usize);
                if let Some(d) = devs.get_mut(b.dev as usize) {
                    d.count_plugged_bios(&counts);
                }
            }
            debug_assert!(
                plug.devs.iter().all(|c| c.bios == 0 && c.bytes == 0),
                "a device kept plug counts of bios not in the drained plug"
            );
            (drained, one_dev)
        };
        debug_assert_eq!(
            one_dev,
            !bios.windows(2).any(|w| w[0].dev != w[1].dev),
            "the plugged bios' device counts"
        );
        if !one_dev {
            bios.sort_by_key(|e| e.dev);
        }
        let mut touched = DevMask::default();
        let mut start = 0;
        while start < bios.len() {
            let dev = bios[start].dev;
            // One device: the whole list, without a second pass over it.
            let end = if one_dev {
                bios.len()
            } else {
                start + bios[start..].iter().take_while(|b| b.dev == dev).count()
            };
            self.build_device_requests(dev, &mut bios[start..end], drained);
            touched.insert(dev);
            start = end;
        }
        bios.clear();
        *self.scratch_bios.borrow_mut() = bios;
        self.complete_refused();
        self.dispatch_devices(touched, true);
        drop(flushing);
        crate::bio::drop_buried();
        self.wake_pending();
        self.release_closed_devices();
    }

    /// Completes what a flush's own dispatch could not submit (left in
    /// `scratch_failed` by [`EngineCore::send_each`]), once no borrow of
    /// the core's tables is held.
    #[inline]
    fn complete_refused(self: &Rc<Self>) {
        if self.scratch_failed.borrow().is_empty() {
            return;
        }
        let mut failed = std::mem::take(&mut *self.scratch_failed.borrow_mut());
        self.complete_statuses(&failed);
        failed.clear();
        *self.scratch_failed.borrow_mut() = failed;
    }

    /// Turns one device's flushed bios into requests, merging as the
    /// device's `nomerges` allows (see [`crate::merge`]).
    fn build_device_requests(&self, dev: u32, list: &mut [Plugged], drained: Drained) {
        let mut bios = self.bios.borrow_mut();
        let mut devs = self.devs.borrow_mut();
        let d = &mut devs[dev as usize];
        d.shared.adopt_remote_orphans(self.uid, &mut bios);
        if d.nomerges == 0 && list.len() > 1 && drained.mergeable > 1 && drained.adjacent {
            merge::order_for_merge(&bios, list, drained.writes_or_flush);
        }
        let allow_merge = d.nomerges < 2;
        let mut built = 0;
        // Where two of the bios touch (sequential IO), most of them merge:
        // the merge is inlined into that loop. Elsewhere a merge is rare
        // (only with the newest request), and the loop stays small.
        if allow_merge && drained.adjacent {
            for e in list.iter() {
                if let Some(bio) = bios.get_mut(e.id) {
                    built += build_requests::<true>(d, e.id, bio, allow_merge);
                }
            }
        } else if d.fast_lane && d.waiting.is_empty() {
            built = self.send_at_flush(d, &mut bios, dev, list, allow_merge);
        } else {
            built = build_each(d, &mut bios, list, allow_merge);
        }
        if d.iostats {
            let p = &mut d.pending;
            p.plug_flushes += 1;
            p.bios += list.len() as u64;
            p.requests += built;
            p.dirty = true;
            d.publish();
        }
        #[cfg(debug_assertions)]
        d.check_invariants();
    }

    /// The flush's loop over bios that do not touch, on a device with
    /// nothing waiting in its FIFO: a fast-lane bio (see [`FAST`]) is sent
    /// at once, its SQE written from it through the ring's SQ writer with
    /// a tag of the batch taken for the rest of the list, instead of
    /// queuing in the FIFO for the dispatch that follows the flush. The
    /// others are built into requests as in [`build_each`]; once something
    /// waits in the FIFO (a request, or a bio that found no tag or no room
    /// in the SQ), the fast-lane bios after it queue behind it, so the
    /// FIFO's order is kept. Tags left over go to what waits in the FIFO
    /// (the rest back to the tag set, in one batch). Returns
    /// the number of requests and fast-lane bios.
    fn send_at_flush(
        &self,
        d: &mut CoreDev,
        bios: &mut BioTable,
        dev: u32,
        list: &[Plugged],
        allow_merge: bool,
    ) -> u64 {
        let shared = d.shared.clone();
        let mut tags = std::mem::take(&mut *self.scratch_tags.borrow_mut());
        let mut built = 0;
        shared.backend.with_sq_writer(self.handler, &mut |sq| {
            built = match sq {
                Some(sq) => self.send_each(d, bios, sq, &shared, dev, list, allow_merge, &mut tags),
                None => build_each(d, bios, list, allow_merge),
            };
        });
        tags.clear();
        *self.scratch_tags.borrow_mut() = tags;
        built
    }

    /// [`EngineCore::send_at_flush`]'s loop, with the SQ writer. A
    /// fast-lane write is linked into the interval index (a lane slot)
    /// where the loop meets it, so that the bios after it see it, but its
    /// SQE is written after the loop, behind the reads': file systems that
    /// hand buffered writes to io_uring's workers (ext4 here: every one)
    /// then get them together, not one wake of a worker per write between
    /// the reads (four times the context switches, +12 % kernel time per
    /// IO in a buffered randrw run). The SQ's order is no IO order: only
    /// the index orders IO. `tags`: the batch's tags (empty); the lane
    /// writes wait in the device's `lane_writes`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn send_each(
        &self,
        d: &mut CoreDev,
        bios: &mut BioTable,
        sq: &SqWriter<'_>,
        shared: &DeviceShared,
        dev: u32,
        list: &[Plugged],
        allow_merge: bool,
        tags: &mut Vec<Tag>,
    ) -> u64 {
        let mut lt = LoopTags {
            set: shared.tags_for(self.core),
            core: self.core,
            // Moved in (and back after the loop): the loop then reaches the
            // tags without going through a reference first.
            tags: std::mem::take(tags),
            used: 0,
        };
        // Begun before the loop, not at its first send: the loop tests no
        // Option per bio. A flush that sends nothing reads the clock once
        // for nothing, and its batch's end does nothing (nothing started).
        let mut batch = Batch::begin(d);
        debug_assert!(d.lane_writes.is_empty());
        // The clock is read per IO only in its ablation (the cached clock
        // off with iostats): decided once per flush, so that the loop
        // tests nothing for it per IO.
        // The loop's SQEs go through one SQ session (the SQ found once,
        // its tail published once, when the loop ends): nothing in the
        // loop pushes to the ring otherwise, and the session is over
        // before the lane writes and the FIFO's dispatch below push
        // through the writer or the backend.
        let mut built = sq.session(|sq| {
            if batch.clock_per_io() {
                send_list::<true>(d, bios, sq, dev, list, allow_merge, &mut lt, &mut batch)
            } else {
                send_list::<false>(d, bios, sq, dev, list, allow_merge, &mut lt, &mut batch)
            }
        });
        let LoopTags {
            tags: taken, used, ..
        } = lt;
        *tags = taken;
        // Each tag used went to a fast-lane read sent in the loop or to a
        // lane write listed in `lane_writes` (empty before the loop,
        // counted in `built` by `lane_write_or_build`): the reads sent
        // are the rest, one request and one IO started each.
        debug_assert!(d.lane_writes.len() <= used);
        let sent = used - d.lane_writes.len();
        batch.add_started(sent);
        built += sent as u64;
        // `send_fast`'s counts of the reads sent (the loop read neither).
        d.tags_held += sent as u32;
        d.fast_in_flight += sent as u32;
        if !d.lane_writes.is_empty() {
            send_lane_writes(d, bios, sq, dev, &mut batch, tags);
        }
        batch.end(d);
        if used < tags.len() {
            // Tags left over: the requests built after the last bio sent
            // take them at once (dispatch puts back what none takes), so
            // a mixed flush takes its tags once.
            let mut failed = self.scratch_failed.borrow_mut();
            self.dispatch_batch(d, bios, Some(sq), dev, &tags[used..], &mut failed);
        }
        built
    }
}

/// [`EngineCore::send_each`]'s loop over the flushed bios, with the SQ
/// session `sq`: sends each fast-lane read it can (the tags from `lt`, the
/// start times from `batch`), builds the others into requests. The reads
/// sent are counted by the caller, from `lt.used`. `CLOCK_PER_IO`:
/// `batch.clock_per_io()`, known per flush. Returns the number of
/// requests and fast-lane bios other than the reads sent.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn send_list<const CLOCK_PER_IO: bool>(
    d: &mut CoreDev,
    bios: &mut BioTable,
    sq: &mut SqSession<'_, '_>,
    dev: u32,
    list: &[Plugged],
    allow_merge: bool,
    lt: &mut LoopTags<'_>,
    batch: &mut Batch,
) -> u64 {
    debug_assert_eq!(CLOCK_PER_IO, batch.clock_per_io());
    let mut built = 0;
    // Without the per-IO clock, every IO of the batch starts at its one
    // reading (`Batch::now` returns the same each time).
    let batch_now = if CLOCK_PER_IO { 0 } else { batch.now() };
    for (i, e) in list.iter().enumerate() {
        let Some(bio) = bios.get_mut(e.id) else {
            continue;
        };
        let rest = list.len() - i;
        // `send_at_flush` is called only with the device's fast lane on.
        debug_assert!(d.fast_lane);
        if !fast_lane_bio(d, bio, allow_merge) {
            built += lane_write_or_build(d, e.id, bio, allow_merge, lt, rest);
            continue;
        }
        if d.index_active && !lane_clear(d, bio) {
            built += build_requests::<false>(d, e.id, bio, allow_merge);
            continue;
        }
        if let Some(tag) = lt.spare(d, rest) {
            let now = if CLOCK_PER_IO { batch.now() } else { batch_now };
            if send_fast_session(bio, sq, dev, e.id.index, tag, now) {
                // Counted as started and built after the loop, from
                // `used` (see there).
                if CLOCK_PER_IO {
                    batch.count_clock(d, now);
                }
                lt.used += 1;
                if d.index_active {
                    link_lane(d, bio);
                } else {
                    take_fast(d, bio);
                }
                continue;
            }
        }
        built += if d.index_active {
            // Not sent: a request, ordered as any.
            build_requests::<false>(d, e.id, bio, allow_merge)
        } else {
            queue_fast(d, e.id, bio);
            1
        };
    }
    built
}

/// Whether fast-lane bio `bio` may go while a write is live (the interval
/// index on): it overlaps no live write (see [`crate::order`]).
#[inline(never)]
fn lane_clear(d: &CoreDev, bio: &Bio) -> bool {
    !bio.op.has_range() || bio.len_bytes == 0 || d.lane_clear(bio.offset_bytes, bio.len_bytes)
}

/// The tags of one flush's sending loop ([`EngineCore::send_each`]),
/// taken from the device's tag set in batches as the loop needs them and
/// handed out in order: `tags[..used]` went to fast-lane bios; the rest go
/// to the requests waiting in the FIFO after the loop (and back to the
/// tag set, what none takes).
struct LoopTags<'a> {
    set: &'a TagSet,
    core: usize,
    tags: Vec<Tag>,
    used: usize,
}

impl LoopTags<'_> {
    /// The next tag, where one is to spare for a fast-lane bio beyond what
    /// waits in `d`'s FIFO: those take the tags left over at the end, in
    /// their order, so a fast-lane bio passes them only when they lose
    /// nothing by it. Takes more from the tag set when short, for the
    /// `rest` of the list (this bio included) and what waits. `None` when
    /// the set has none to spare. The caller that uses the tag counts it
    /// in `used`.
    #[inline(always)]
    fn spare(&mut self, d: &CoreDev, rest: usize) -> Option<Tag> {
        let waiting = d.waiting.len();
        let left = self.tags.len() - self.used;
        if left <= waiting {
            self.set
                .get_tags(self.core, rest + waiting - left, &mut self.tags);
        }
        if self.tags.len() - self.used > waiting {
            debug_assert!(self.used < self.tags.len());
            // SAFETY: `used` never passes the tags taken (`tags[..used]`
            // went out, one per tag), so `tags.len() - used` does not
            // wrap, and it is over `waiting` (>= 0): `used < tags.len()`.
            Some(unsafe { *self.tags.get_unchecked(self.used) })
        } else {
            None
        }
    }
}

/// [`EngineCore::send_each`] of a bio that is no fast-lane read: a
/// fast-lane write where [`lane_write`] and [`defer_lane_write`] take it,
/// else its requests ([`build_requests`]). Out of line, so that the
/// loop's read path keeps its registers. `rest`: the bios left in the
/// list, this one included. Returns the number of requests and fast-lane
/// bios.
#[inline(never)]
fn lane_write_or_build(
    d: &mut CoreDev,
    id: BioId,
    bio: &mut Bio,
    allow_merge: bool,
    lt: &mut LoopTags<'_>,
    rest: usize,
) -> u64 {
    if lane_write(d, bio, allow_merge) && defer_lane_write(d, bio, id.index, lt, rest) {
        return 1;
    }
    build_requests::<false>(d, id, bio, allow_merge)
}

/// Takes fast-lane write bio `index` (`bio`, which [`lane_write`]
/// accepted) where a tag is to spare ([`LoopTags::spare`], as for a
/// fast-lane read): gives it the tag, links it under a lane slot, and
/// lists it in the device's `lane_writes` for [`send_lane_writes`].
/// Returns false, with nothing taken, when no tag is to spare (the bio
/// then becomes a request).
#[inline(never)]
fn defer_lane_write(
    d: &mut CoreDev,
    bio: &mut Bio,
    index: u32,
    lt: &mut LoopTags<'_>,
    rest: usize,
) -> bool {
    let Some(tag) = lt.spare(d, rest) else {
        return false;
    };
    lt.used += 1;
    bio.tag = tag;
    link_lane(d, bio);
    d.lane_writes.push(index);
    true
}

/// Writes the SQEs of the fast-lane writes listed in the device's
/// `lane_writes` (bio indices, each with its tag and its lane slot
/// linked) after the flush's loop (see [`EngineCore::send_each`]), and
/// empties the list. A write the SQ
/// writer refuses (not expected: it takes every plain one-buffer write)
/// becomes its request in its lane slot, waiting in the FIFO, and its tag
/// joins `tags` (the leftover tags the loop's FIFO dispatch takes).
#[inline(never)]
fn send_lane_writes(
    d: &mut CoreDev,
    bios: &mut BioTable,
    sq: &SqWriter<'_>,
    dev: u32,
    b: &mut Batch,
    tags: &mut Vec<Tag>,
) {
    let mut writes = std::mem::take(&mut d.lane_writes);
    for &index in &writes {
        let now = b.now();
        let bio = bios.fast_mut(index);
        let tag = bio.tag;
        if send_fast(d, bio, sq, dev, index, tag, now) {
            b.count(d, now);
        } else {
            d.lane_to_waiting(bios, index);
            tags.push(tag);
        }
    }
    writes.clear();
    d.lane_writes = writes;
}

/// Whether write bio `bio` may be sent at once on the fast lane, with a
/// lane slot (see [`crate::order`]): the device's `fast_lane` and
/// `overlap_order` options are on, it is a plain write of one buffer that
/// needs no split, no preflush and no merge with the newest request, no
/// fast-lane bio is live outside the interval index, and it overlaps no
/// live request. Switches the index on when it is off (the write is about
/// to be live either way). Only the flush's sending loop asks: a write
/// never queues in the FIFO as a fast-lane bio.
#[inline(never)]
fn lane_write(d: &mut CoreDev, bio: &Bio, allow_merge: bool) -> bool {
    d.fast_lane
        && bio.op == OpKind::Write
        && bio.len_bytes > 0
        && bio.len_bytes <= d.max_request_bytes
        // FUA and PREFLUSH writes go as requests, whose completion
        // counts them (`fua_writes`, the preflush's flush).
        && bio.flags.bits() & (IoFlags::PREFLUSH.bits() | IoFlags::FUA.bits()) == 0
        && matches!(bio.buf, BioBuf::One { .. })
        && !(allow_merge
            && merge::mergeable(bio.op, bio.flags)
            && bio.len_bytes <= d.max_merge_bytes
            && touches_last(d, bio))
        && d.lane_clear_write(bio.offset_bytes, bio.len_bytes)
}

/// Counts fast-lane bio `bio`, sent while a write is live (or a write
/// itself), as live: a ranged bio is linked into the interval index under
/// a lane slot, so that the requests built after it that conflict with it
/// wait for it (see [`crate::order`]); a bio without a range overlaps
/// nothing and is counted with those the writes built meanwhile wait for
/// all together.
#[inline(never)]
fn link_lane(d: &mut CoreDev, bio: &mut Bio) {
    if bio.op.has_range() && bio.len_bytes > 0 {
        bio.lane = d.link_lane(bio.op, bio.offset_bytes, bio.len_bytes);
        lane_part(d, bio);
    } else {
        take_fast(d, bio);
    }
}

/// The flush's loop over bios that do not touch (the merge, rare there, is
/// called only for a bio that touches the newest request): each fast-lane
/// bio queues in the FIFO as itself, the others are built into requests.
/// Returns the number of both.
fn build_each(d: &mut CoreDev, bios: &mut BioTable, list: &[Plugged], allow_merge: bool) -> u64 {
    let mut built = 0;
    for e in list.iter() {
        if let Some(bio) = bios.get_mut(e.id) {
            if !d.index_active && fast_lane(d, bio, allow_merge) {
                queue_fast(d, e.id, bio);
                built += 1;
                continue;
            }
            built += build_requests::<false>(d, e.id, bio, allow_merge);
        }
    }
    built
}

/// Whether `bio` may skip its request (see [`FAST`]): the device's
/// `fast_lane` option is on, the bio changes nothing on the device (a
/// write has its own test, [`lane_write`]) and is
/// no flush (a flush holds nothing back, while writes built during a
/// fast-lane bio wait for it), it needs no split, its memory is one buffer
/// (or none), and it does not merge with the newest request. Where a write
/// is live (the interval index is on), the caller also checks that it
/// overlaps none (see [`crate::order`]).
#[inline(always)]
fn fast_lane(d: &CoreDev, bio: &Bio, allow_merge: bool) -> bool {
    d.fast_lane && fast_lane_bio(d, bio, allow_merge)
}

/// [`fast_lane`] on a device whose `fast_lane` option is known to be on
/// ([`EngineCore::send_each`]'s). The merge test looks at the newest
/// request first: after a fast-lane bio there is none to join
/// (`lane_part` clears it), so most bios end the test there, before the
/// op's and the flags' tests ([`touches_last`] is false without one).
#[inline(always)]
fn fast_lane_bio(d: &CoreDev, bio: &Bio, allow_merge: bool) -> bool {
    !bio.op.is_write()
        && !matches!(bio.op, OpKind::Flush | OpKind::Fsync)
        && bio.len_bytes <= d.max_request_bytes
        && matches!(bio.buf, BioBuf::None | BioBuf::One { .. })
        && !(d.last_built != NIL
            && allow_merge
            && merge::mergeable(bio.op, bio.flags)
            && bio.len_bytes <= d.max_merge_bytes
            && touches_last(d, bio))
}

/// Queues bio `id` in the FIFO as itself (its one part).
#[inline(always)]
fn queue_fast(d: &mut CoreDev, id: BioId, bio: &mut Bio) {
    debug_assert!(id.index & FAST == 0, "bio index {} too large", id.index);
    d.waiting.push_back(FAST | id.index);
    take_fast(d, bio);
}

/// Counts `bio` as a live fast-lane bio of `d` that writes built later
/// wait for all together (`fast_live`), its own one part (queued or sent).
#[inline(always)]
fn take_fast(d: &mut CoreDev, bio: &mut Bio) {
    d.fast_live += 1;
    lane_part(d, bio);
}

/// Makes `bio` its own one part, on the fast lane.
#[inline(always)]
fn lane_part(d: &mut CoreDev, bio: &mut Bio) {
    bio.parts_left = 1;
    bio.split = false;
    // Nothing joins a request built before it any more (the newest built
    // is the one a bio may join).
    d.last_built = NIL;
}

/// Adds bio `id` to the newest waiting request of the device when it
/// merges (and `allow_merge`), else splits it into requests no larger than
/// the device's limit, built in place in the slab and appended to the
/// FIFO. Returns the number of new requests. `MERGES_LIKELY`: the merge
/// is inlined (else it is called, only for a bio that touches the newest
/// request).
#[inline]
fn build_requests<const MERGES_LIKELY: bool>(
    d: &mut CoreDev,
    id: BioId,
    bio: &mut Bio,
    allow_merge: bool,
) -> u64 {
    let mergeable = merge::mergeable(bio.op, bio.flags) && bio.len_bytes <= d.max_merge_bytes;
    let merged = allow_merge
        && mergeable
        && if MERGES_LIKELY {
            merge_into_last(d, id, bio)
        } else {
            touches_last(d, bio) && try_merge(d, id, bio)
        };
    if merged {
        if d.iostats {
            if let Some(g) = group_index(bio.op) {
                d.pending.groups[g].merges += 1;
                d.pending.dirty = true;
            }
        }
        return 0;
    }
    let len = bio.len_bytes;
    let max = if bio.op.has_data() {
        d.max_request_bytes
    } else {
        d.max_range_request_bytes
    };
    let nr_segs = bio.buf.nr_segs();
    let mut parts = 0;
    let mut off = 0;
    loop {
        let piece_len = if len == 0 { 0 } else { (len - off).min(max) };
        let slot = d.rqs.alloc();
        let rq = d.rqs.get_mut(slot);
        rq.op = bio.op;
        rq.flags = bio.flags;
        rq.offset_bytes = bio.offset_bytes + off;
        rq.len_bytes = piece_len;
        rq.pieces.push(Piece {
            bio: id,
            bio_offset: off,
            len_bytes: piece_len,
        });
        rq.nr_segs = nr_segs;
        rq.mergeable = mergeable && piece_len == len;
        if piece_len < len {
            // Split: ordered as the whole bio (see `crate::order`).
            rq.whole = Some((bio.offset_bytes, bio.offset_bytes + len));
        }
        d.order_new(slot);
        d.last_built = slot;
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

/// Whether the bio starts where the newest request built ends, or ends
/// where it starts: the only case [`try_merge`] can join them. Kept inline,
/// so that IO that does not merge (random IO, the common case) makes no
/// call; the merge itself is out of line.
#[inline(always)]
fn touches_last(d: &CoreDev, bio: &Bio) -> bool {
    let slot = d.last_built;
    if slot == NIL {
        return false;
    }
    let rq = d.rqs.get(slot);
    let (rq_end, bio_end) = (
        rq.offset_bytes + rq.len_bytes,
        bio.offset_bytes + bio.len_bytes,
    );
    rq_end == bio.offset_bytes || bio_end == rq.offset_bytes
}

/// [`merge_into_last`], out of line.
#[inline(never)]
fn try_merge(d: &mut CoreDev, id: BioId, bio: &mut Bio) -> bool {
    merge_into_last(d, id, bio)
}

/// Merges bio `id` into the newest waiting request if the merge rules
/// allow it and the bio needs no ordering that the request lacks.
#[inline(always)]
fn merge_into_last(d: &mut CoreDev, id: BioId, bio: &mut Bio) -> bool {
    let slot = d.last_built;
    if slot == NIL {
        return false;
    }
    let rq = d.rqs.get(slot);
    if !matches!(rq.state, RqState::Waiting | RqState::Blocked) {
        return false;
    }
    let Some((side, bio_segs)) = merge::try_merge(rq, bio, d.max_merge_bytes, d.max_segs) else {
        return false;
    };
    join(d, slot, side, id, bio, bio_segs)
}

/// Joins bio `id` to request `slot` on `side` where the ordering allows
/// it (the rest of [`try_merge`], once the merge rules said yes).
/// `bio_segs`: the bio's segment count, as the merge rules read it.
#[inline]
fn join(
    d: &mut CoreDev,
    slot: u32,
    side: merge::Side,
    id: BioId,
    bio: &mut Bio,
    bio_segs: usize,
) -> bool {
    debug_assert_eq!(bio_segs, bio.buf.nr_segs());
    if !d.may_join(slot, bio.op, bio.offset_bytes, bio.len_bytes) {
        return false;
    }
    let rq = d.rqs.get(slot);
    let offset = match side {
        merge::Side::Back => rq.offset_bytes,
        merge::Side::Front => bio.offset_bytes,
    };
    let len = rq.len_bytes + bio.len_bytes;
    d.set_range(slot, offset, len);
    let rq = d.rqs.get_mut(slot);
    let piece = Piece {
        bio: id,
        bio_offset: 0,
        len_bytes: bio.len_bytes,
    };
    match side {
        merge::Side::Back => rq.pieces.push(piece),
        merge::Side::Front => rq.pieces.insert(0, piece),
    }
    rq.nr_segs += bio_segs;
    bio.parts_left = 1;
    bio.split = false;
    true
}

/// Marks a flush as running ([`EngineCore::flush`]) until dropped, on the
/// way out or on an unwind.
struct Flushing<'a>(&'a std::cell::Cell<bool>);

impl Drop for Flushing<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}
