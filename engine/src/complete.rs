//! Completion, one batch at a time: each token names a request slot; the
//! request's result is split between its bios, their tasks are woken, and
//! the tags, the clock read and the iostats are handled once per batch.
//!
//! Idea: `blk_mq_end_request_batch` (one clock read per batch, tags freed
//! in batches with `blk_mq_put_tags` / `sbitmap_queue_clear_batch`).
//!
//! Invariants:
//! - Each request completes exactly once: its slot is released here and a
//!   token naming a free slot (which the device layer never delivers) is
//!   ignored with an error log.
//! - A bio is finished when its last request completes; an orphaned bio
//!   (its future was dropped) is freed then, with its buffer.
//! - Wakers run after every borrow of this core is released, once per
//!   batch (or at the end of the flush that is running).

use std::task::Waker;

use plugio_device::OpKind;

use crate::bio::BioTable;
use crate::clock;
use crate::core::EngineCore;
use crate::queue::{group_index, CoreDev};
use crate::request::{Piece, RqState};
use crate::tag::Tag;

impl EngineCore {
    /// Completes a batch of `(token, result)` pairs (`result` as a CQE's
    /// `res`: bytes or a negative errno).
    pub fn complete_batch(&self, completions: &[(u64, i32)]) {
        {
            let mut devs = self.devs.borrow_mut();
            let mut bios = self.bios.borrow_mut();
            let mut wakes = self.wake_list.borrow_mut();
            let mut puts = self.scratch_puts.borrow_mut();
            let mut i = 0;
            while i < completions.len() {
                let dev = (completions[i].0 >> 32) as u32;
                let run = completions[i..]
                    .iter()
                    .take_while(|c| (c.0 >> 32) as u32 == dev)
                    .count();
                let batch = &completions[i..i + run];
                i += run;
                let Some(d) = devs.get_mut(dev as usize) else {
                    tracing::error!(dev, "completions for an unknown device ignored");
                    continue;
                };
                complete_device(d, self.core, batch, &mut bios, &mut wakes, &mut puts);
            }
        }
        if !self.flushing.get() {
            self.wake_pending();
        }
    }

    /// Wakes the tasks whose bios completed.
    pub(crate) fn wake_pending(&self) {
        let mut list = std::mem::take(&mut *self.wake_list.borrow_mut());
        for w in list.drain(..) {
            w.wake();
        }
        // Keep the list's capacity, unless a waker queued more wakes
        // meanwhile: those stay for the next call.
        let mut slot = self.wake_list.borrow_mut();
        if slot.is_empty() {
            *slot = list;
        }
    }
}

/// Completes one device's run of a batch: per request, the result split
/// into its bios; per run, one clock read, one tag batch free and the
/// iostats.
fn complete_device(
    d: &mut CoreDev,
    core: usize,
    batch: &[(u64, i32)],
    bios: &mut BioTable,
    wakes: &mut Vec<Waker>,
    puts: &mut Vec<Tag>,
) {
    // One clock read for the batch with the cached clock; one per request
    // without it (the ablation of the cached clock).
    let batch_clock = d.iostats && d.cached_clock;
    let mut now = if batch_clock { clock::now_ns(true) } else { 0 };
    puts.clear();
    for &(token, result) in batch {
        let slot = token as u32;
        let Some(rq) = d.rqs.try_get_mut(slot) else {
            tracing::error!(token, "completion for an unknown request ignored");
            continue;
        };
        if rq.state != RqState::InFlight {
            tracing::error!(token, "completion for a request not in flight ignored");
            continue;
        }
        let op = rq.op.unwrap_or(OpKind::Nop);
        puts.push(rq.tag);
        if d.iostats && !batch_clock {
            now = clock::now_ns(false);
            d.busy.event(now, -1, &d.counters);
        }
        if d.iostats {
            if let Some(g) = group_index(op) {
                let t = &mut d.pending.groups[g];
                t.ios += 1;
                t.sectors += rq.len_bytes.div_ceil(512);
                t.ticks_ns += now.saturating_sub(rq.start_ns);
                d.pending.dirty = true;
            }
        }
        rq.split_result(i64::from(result), |p, share| {
            finish_piece(bios, p, share, wakes)
        });
        d.writes_in_flight -= u32::from(op.is_write());
        d.tags_held -= 1;
        d.rqs.release(slot);
    }
    if puts.is_empty() {
        return;
    }
    if batch_clock {
        d.busy.event(now, -(puts.len() as i64), &d.counters);
    }
    if d.iostats {
        d.publish();
    }
    puts.sort_unstable();
    d.shared.tags_for(core).put_batch(core, puts);
    #[cfg(debug_assertions)]
    d.check_invariants();
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
