//! Merging: contiguous bios of the same op and flags become one request.
//!
//! The kernel's rules (`blk_rq_merge_ok`, `blk_try_merge`,
//! `ll_back_merge_fn`/`ll_front_merge_fn`, `blk_attempt_plug_merge`), in
//! userspace:
//! - only reads and writes merge; flush, fsync, discard, write zeroes and
//!   any bio with FUA, PREFLUSH or NOMERGE never do;
//! - same op, same flag bits, same priority;
//! - back merge: the request ends where the bio starts; front merge: the
//!   bio ends where the request starts; never on overlap or a gap (the raw
//!   ranges are compared, so 30 small reads spread over 100 MiB stay 30
//!   requests);
//! - the merged request stays within `max_merge_bytes` and `max_segments`
//!   (segments counted raw, as the kernel does: a merge never coalesces
//!   across the seam for the count; memory-adjacent segments are joined
//!   only when the iovecs are built).
//!
//! `nomerges` as in sysfs: 0 sorts each conflict-free run of the plug by
//! (op, flags, offset) and back-merges neighbours; 1 tries only the one-hit
//! merge of each bio with the newest request (`blk_attempt_plug_merge`,
//! done here in the flush's single pass over the plug: same result); 2
//! never merges.
//!
//! Invariant: program order between overlapping IOs is kept. The plug is
//! cut into runs at every bio that overlaps an earlier bio of the run with
//! a write among the two (or is a flush); sorting happens only inside a
//! run, and later runs are ordered by the request barriers of the core.

use plugio_device::{IoFlags, OpKind};

use crate::bio::{Bio, BioTable};
use crate::plug::{Plugged, CLASS_DATA, CLASS_ORDERED};
use crate::request::Request;

/// Which end of a request a bio joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The bio follows the request.
    Back,
    /// The bio precedes the request.
    Front,
}

/// What the plug needs of `op`, from one test of its kind: its sort
/// group (bits 0 and 1, the group of [`sort_key`]), [`CLASS_DATA`] and
/// [`CLASS_ORDERED`]. (The plug tested the kind once per question, four
/// times per IO.)
#[inline(always)]
pub(crate) fn plug_class(op: OpKind) -> u8 {
    match op {
        OpKind::Read => CLASS_DATA,
        OpKind::Write => 1 | CLASS_DATA | CLASS_ORDERED,
        OpKind::Flush
        | OpKind::Fsync
        | OpKind::WriteZeroes
        | OpKind::Discard
        | OpKind::Fallocate { .. } => 2 | CLASS_ORDERED,
        _ => 2,
    }
}

/// Whether `flags` let a read or write merge (see [`mergeable`]).
#[inline(always)]
pub(crate) fn flags_mergeable(flags: IoFlags) -> bool {
    !flags.contains(IoFlags::FUA)
        && !flags.contains(IoFlags::PREFLUSH)
        && !flags.contains(IoFlags::NOMERGE)
}

/// [`sort_key`] of an op of sort group `group` (see [`plug_class`]).
#[inline(always)]
pub(crate) fn sort_key_of_group(group: u8, flags: IoFlags, offset_bytes: u64) -> u128 {
    (u128::from(group) << 96) | (u128::from(flags.bits()) << 64) | u128::from(offset_bytes)
}

/// Whether an IO (`op` with `flags`) may take part in merging at all.
pub(crate) fn mergeable(op: OpKind, flags: IoFlags) -> bool {
    matches!(op, OpKind::Read | OpKind::Write)
        && !flags.contains(IoFlags::FUA)
        && !flags.contains(IoFlags::PREFLUSH)
        && !flags.contains(IoFlags::NOMERGE)
}

/// Where `bio` can join `rq` within the limits, if it can, with the
/// bio's segment count (read once, for the limit and the join).
#[inline]
pub(crate) fn try_merge(
    rq: &Request,
    bio: &Bio,
    max_bytes: u64,
    max_segs: usize,
) -> Option<(Side, usize)> {
    // Adjacency first: random IO, the common case that does not merge,
    // fails here on two compares.
    let side = if rq.offset_bytes + rq.len_bytes == bio.offset_bytes {
        Side::Back
    } else if bio.offset_bytes + bio.len_bytes == rq.offset_bytes {
        Side::Front
    } else {
        return None;
    };
    if rq.op != bio.op || rq.flags != bio.flags || !rq.mergeable {
        return None;
    }
    let bio_segs = bio.buf.nr_segs();
    if rq.len_bytes + bio.len_bytes > max_bytes || rq.nr_segs + bio_segs > max_segs {
        return None;
    }
    Some((side, bio_segs))
}

/// Whether `a` and `b` must keep their order: they overlap and one of them
/// writes, or one is a flush.
fn ordered(a: &Bio, b: &Bio) -> bool {
    if is_flush(a.op) || is_flush(b.op) {
        return true;
    }
    if !a.op.is_write() && !b.op.is_write() {
        return false;
    }
    let (s1, e1) = (a.offset_bytes, a.offset_bytes + a.len_bytes);
    let (s2, e2) = (b.offset_bytes, b.offset_bytes + b.len_bytes);
    s1 < e2 && s2 < e1
}

fn is_flush(op: OpKind) -> bool {
    matches!(op, OpKind::Flush | OpKind::Fsync)
}

/// The sort key of an IO: (op group, flags, offset) packed in one
/// `u128`, so the sort compares integers and never reads the bio table.
pub(crate) fn sort_key(op: OpKind, flags: IoFlags, offset_bytes: u64) -> u128 {
    let group: u128 = match op {
        OpKind::Read => 0,
        OpKind::Write => 1,
        _ => 2,
    };
    (group << 96) | (u128::from(flags.bits()) << 64) | u128::from(offset_bytes)
}

/// Reorders one device's plugged bios for merging (nomerges 0): cuts them
/// into runs where no bio must stay behind an earlier one of the same run,
/// and sorts each run by its key (op, flags, offset). The sort need not be
/// stable: two bios of one run with equal keys are reads of the same range
/// (order does not matter), since two such writes would overlap and so be
/// in different runs. A run already in order (sequential IO) is not
/// sorted. Without a write or flush among them (`writes_or_flush` false),
/// the whole list is one run and the bio table is not read.
pub(crate) fn order_for_merge(bios: &BioTable, list: &mut [Plugged], writes_or_flush: bool) {
    let mut start = 0;
    while start < list.len() {
        let end = if writes_or_flush {
            run_end(bios, list, start)
        } else {
            list.len()
        };
        let run = &mut list[start..end];
        if run.windows(2).any(|w| w[0].key > w[1].key) {
            run.sort_unstable_by_key(|e| e.key);
        }
        start = end;
    }
}

/// The end of the conflict-free run that begins at `start`.
fn run_end(bios: &BioTable, list: &[Plugged], start: usize) -> usize {
    for end in start + 1..list.len() {
        let Some(b) = bios.get(list[end].id) else {
            continue;
        };
        let conflict = list[start..end]
            .iter()
            .filter_map(|e| bios.get(e.id))
            .any(|a| ordered(a, b));
        if conflict {
            return end;
        }
    }
    list.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bio::BioBuf;

    fn add(t: &mut BioTable, op: OpKind, off: u64, len: u64) -> Plugged {
        let (id, _, b) = t.alloc(true);
        b.op = op;
        b.offset_bytes = off;
        b.len_bytes = len;
        b.buf = BioBuf::None;
        Plugged {
            dev: 0,
            id,
            key: sort_key(op, IoFlags::NONE, off),
        }
    }

    fn offsets(t: &BioTable, list: &[Plugged]) -> Vec<u64> {
        list.iter()
            .map(|e| t.get(e.id).unwrap().offset_bytes)
            .collect()
    }

    #[test]
    fn reads_sort_freely() {
        let mut t = BioTable::default();
        let mut list = vec![
            add(&mut t, OpKind::Read, 8192, 4096),
            add(&mut t, OpKind::Read, 0, 4096),
            add(&mut t, OpKind::Read, 4096, 4096),
        ];
        order_for_merge(&t, &mut list, true);
        assert_eq!(offsets(&t, &list), vec![0, 4096, 8192]);
    }

    #[test]
    fn overlapping_write_then_read_keep_order() {
        let mut t = BioTable::default();
        let mut list = vec![
            add(&mut t, OpKind::Write, 0, 8192),
            add(&mut t, OpKind::Write, 2048, 4096),
            add(&mut t, OpKind::Read, 0, 10240),
        ];
        order_for_merge(&t, &mut list, true);
        assert_eq!(offsets(&t, &list), vec![0, 2048, 0]);
    }

    #[test]
    fn a_run_is_cut_at_the_first_conflict_only() {
        let mut t = BioTable::default();
        let mut list = vec![
            add(&mut t, OpKind::Write, 8192, 4096),
            add(&mut t, OpKind::Write, 0, 4096),
            add(&mut t, OpKind::Read, 8192, 4096), // conflicts: new run
            add(&mut t, OpKind::Read, 4096, 4096),
        ];
        order_for_merge(&t, &mut list, true);
        assert_eq!(offsets(&t, &list), vec![0, 8192, 4096, 8192]);
    }
}
