//! Requests: what goes to the device. One request is one submission (one
//! SQE), carries one tag, and covers one or more pieces of bios.
//!
//! Invariants:
//! - A request's pieces are contiguous on the device, in order, of one op
//!   and one flag set; `len_bytes` is their sum and never exceeds the
//!   device's request limit.
//! - A request is built in place in a slot of its core's per-device request
//!   slab (`queue::RqSlab`) and never moves until its completion frees the
//!   slot: waiting for a tag, in flight and completing, it is named by its
//!   slot index. The submission token is (device index, slot index), so a
//!   completion is one array lookup; the tag the request holds while in
//!   flight is recorded in it.
//! - `iovecs` point into the pieces' bio buffers, which stay owned by their
//!   bios (and so alive) until this request completes.

use plugio_device::{IoFlags, OpKind};

use smallvec::SmallVec;

use crate::bio::BioId;
use crate::interval::Node;
use crate::tag::Tag;

/// A request's pieces: one (an unmerged bio, the common case) is held in
/// the request's own slot, so building and completing it touch no heap
/// memory for it; more spill to the heap, whose capacity the slot keeps.
pub(crate) type Pieces = SmallVec<[Piece; 1]>;

/// Where a request is on its path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum RqState {
    /// The slot is on the slab's free list.
    #[default]
    Free,
    /// Built, waiting for earlier requests it must not overtake (`deps`
    /// of them): in no queue; the last of them to complete moves it to
    /// the FIFO.
    Blocked,
    /// Built, waiting in its device's FIFO for a tag.
    Waiting,
    /// Holds a tag; submitted to the backend.
    InFlight,
    /// No request: the interval index node of a fast-lane read in flight,
    /// sent while a write was live (see [`crate::order`]). Its op and
    /// range are the bio's; writes built after it that overlap it list
    /// themselves in its `dependents`. The bio holds the tag.
    Lane,
}

/// A piece of a bio inside a request: `len_bytes` from `bio_offset` of the
/// bio.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    pub bio: BioId,
    pub bio_offset: u64,
    pub len_bytes: u64,
}

/// One request.
#[derive(Debug, Default)]
pub(crate) struct Request {
    pub state: RqState,
    /// The tag held while in flight.
    pub tag: Tag,
    /// The op; `Nop` in a free slot (reset by [`Request::clear`]): only
    /// `state` says whether the slot is live, never the op.
    pub op: OpKind,
    pub flags: IoFlags,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub pieces: Pieces,
    pub iovecs: Vec<libc::iovec>,
    /// The registered buffer holding the whole request, if any.
    pub fixed_buf: Option<u16>,
    /// Monotonic ns at dispatch (iostats).
    pub start_ns: u64,
    /// Segments (iovecs) the pieces' buffers make, counted raw.
    pub nr_segs: usize,
    /// Whether more bios may join this request (false for split pieces
    /// and for ops or flags that never merge).
    pub mergeable: bool,
    /// Program order of the request on its device and core (pieces issued
    /// again keep the order of the request they come from).
    pub seq: u64,
    /// Earlier requests this one waits for (see [`crate::order`]): live
    /// requests it overlaps where one of the two writes, or, for a flush,
    /// the writes before it.
    pub deps: u32,
    /// Slots of the later requests that wait for this one.
    pub dependents: Vec<u32>,
    /// The request's node in its device's interval index.
    pub node: Node,
    /// A request of a bio split at the request limit (or issued again from
    /// one): the whole bio's byte range, `[start, end)`, by which it is
    /// ordered and indexed instead of its own (see [`crate::order`]).
    pub whole: Option<(u64, u64)>,
    /// Per-op `-EAGAIN` results in a row (see `complete::requeue_again`).
    pub eagain_retries: u8,
    /// Completions in a row that moved no data where the device has no end
    /// of file (see `complete::stalled`).
    pub stalls: u8,
    /// Built from a fast-lane bio (or issued again from one): counted in
    /// its device's `fast_live` until released, so that writes built
    /// meanwhile keep waiting for it (see [`crate::queue::FAST`]).
    pub fast_hold: bool,
}

impl Request {
    /// Empties the request for reuse, keeping its vectors' capacity.
    #[inline]
    pub fn clear(&mut self) {
        self.state = RqState::Free;
        self.op = OpKind::Nop;
        self.pieces.clear();
        self.iovecs.clear();
        self.len_bytes = 0;
        self.deps = 0;
        if !self.dependents.is_empty() {
            self.dependents.clear();
        }
        debug_assert!(
            !self.node.linked,
            "a request left the interval index linked"
        );
        self.nr_segs = 0;
        self.whole = None;
        self.mergeable = false;
        self.eagain_retries = 0;
        self.stalls = 0;
        self.fast_hold = false;
    }

    /// Splits `result` (bytes or -errno) between the pieces in order: each
    /// piece gets what remains up to its own length, so a short read at end
    /// of file gives each piece its own share. Calls `f(piece, share)`
    /// where `share` is bytes (`>= 0`) or the negative errno for every piece.
    pub fn split_result(&self, result: i64, mut f: impl FnMut(&Piece, i64)) {
        if result < 0 {
            self.pieces.iter().for_each(|p| f(p, result));
            return;
        }
        let mut left = result as u64;
        for p in &self.pieces {
            let share = left.min(p.len_bytes);
            left -= share;
            f(p, share as i64);
        }
    }
}

// SAFETY-free note: `Request` holds raw iovec pointers, so it is neither
// Send nor Sync; requests never leave their core.

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(i: u32, len: u64) -> Piece {
        Piece {
            bio: BioId {
                index: i,
                generation: 1,
            },
            bio_offset: 0,
            len_bytes: len,
        }
    }

    #[test]
    fn short_result_is_shared_in_order() {
        let rq = Request {
            pieces: smallvec::smallvec![piece(0, 4096), piece(1, 4096), piece(2, 4096)],
            len_bytes: 12288,
            ..Default::default()
        };
        let mut got = vec![];
        rq.split_result(4864, |p, s| got.push((p.bio.index, s)));
        assert_eq!(got, vec![(0, 4096), (1, 768), (2, 0)]);
        got.clear();
        rq.split_result(-5, |p, s| got.push((p.bio.index, s)));
        assert_eq!(got, vec![(0, -5), (1, -5), (2, -5)]);
    }
}
