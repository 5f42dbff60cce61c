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

use crate::bio::{Bio, BioId, BioTable};
use crate::request::Request;

/// Which end of a request a bio joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The bio follows the request.
    Back,
    /// The bio precedes the request.
    Front,
}

/// Whether a bio may take part in merging at all.
pub(crate) fn bio_mergeable(bio: &Bio) -> bool {
    matches!(bio.op, OpKind::Read | OpKind::Write)
        && !bio.flags.contains(IoFlags::FUA)
        && !bio.flags.contains(IoFlags::PREFLUSH)
        && !bio.flags.contains(IoFlags::NOMERGE)
}

/// Where `bio` can join `rq` within the limits, if it can.
pub(crate) fn try_merge(rq: &Request, bio: &Bio, max_bytes: u64, max_segs: usize) -> Option<Side> {
    if rq.op != Some(bio.op) || rq.flags != bio.flags || !rq.mergeable {
        return None;
    }
    if rq.len_bytes + bio.len_bytes > max_bytes || rq.nr_segs + bio.buf.nr_segs() > max_segs {
        return None;
    }
    if rq.offset_bytes + rq.len_bytes == bio.offset_bytes {
        Some(Side::Back)
    } else if bio.offset_bytes + bio.len_bytes == rq.offset_bytes {
        Some(Side::Front)
    } else {
        None
    }
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

/// The sort key of a bio: (op group, flags, offset) packed in one `u128`,
/// so the sort compares integers and reads the bio table once per bio.
fn sort_key(bio: &Bio) -> u128 {
    let op: u128 = match bio.op {
        OpKind::Read => 0,
        OpKind::Write => 1,
        _ => 2,
    };
    (op << 96) | (u128::from(bio.flags.bits()) << 64) | u128::from(bio.offset_bytes)
}

/// A bio of the plug with its sort key (scratch space of the flush).
pub(crate) type Keyed = (u128, (u32, BioId));

/// Reorders one device's plugged bios for merging (nomerges 0): cuts them
/// into runs where no bio must stay behind an earlier one of the same run,
/// and sorts each run by (op, flags, offset). The sort need not be stable:
/// two bios of one run with equal keys are reads of the same range (order
/// does not matter), since two such writes would overlap and so be in
/// different runs. A run already in order (sequential IO) is not sorted;
/// the keys are computed once per bio (`keys` is scratch space).
pub(crate) fn order_for_merge(bios: &BioTable, list: &mut [(u32, BioId)], keys: &mut Vec<Keyed>) {
    let mut start = 0;
    while start < list.len() {
        let end = run_end(bios, list, start);
        keys.clear();
        keys.extend(
            list[start..end]
                .iter()
                .map(|&e| (bios.get(e.1).map(sort_key).unwrap_or_default(), e)),
        );
        if keys.windows(2).any(|w| w[0].0 > w[1].0) {
            keys.sort_unstable_by_key(|k| k.0);
            for (dst, k) in list[start..end].iter_mut().zip(keys.iter()) {
                *dst = k.1;
            }
        }
        start = end;
    }
    keys.clear();
}

/// The end of the conflict-free run that begins at `start`.
fn run_end(bios: &BioTable, list: &[(u32, BioId)], start: usize) -> usize {
    let has_writes_or_flush = list[start..].iter().any(|&(_, id)| {
        bios.get(id)
            .is_some_and(|b| b.op.is_write() || is_flush(b.op))
    });
    if !has_writes_or_flush {
        return list.len(); // reads only: nothing to keep in order
    }
    for end in start + 1..list.len() {
        let Some(b) = bios.get(list[end].1) else {
            continue;
        };
        let conflict = list[start..end]
            .iter()
            .filter_map(|&(_, id)| bios.get(id))
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

    fn add(t: &mut BioTable, op: OpKind, off: u64, len: u64) -> (u32, BioId) {
        let (id, _) = t.alloc(true);
        let b = t.get_mut(id).unwrap();
        b.op = op;
        b.offset_bytes = off;
        b.len_bytes = len;
        b.buf = BioBuf::None;
        (0, id)
    }

    fn offsets(t: &BioTable, list: &[(u32, BioId)]) -> Vec<u64> {
        list.iter()
            .map(|&(_, id)| t.get(id).unwrap().offset_bytes)
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
        order_for_merge(&t, &mut list, &mut Vec::new());
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
        order_for_merge(&t, &mut list, &mut Vec::new());
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
        order_for_merge(&t, &mut list, &mut Vec::new());
        assert_eq!(offsets(&t, &list), vec![0, 8192, 4096, 8192]);
    }
}
