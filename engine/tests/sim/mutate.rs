//! The mutation switch: corrupts one run's history the way a broken
//! device or engine would, so that the tests can show the checker
//! catches it. Each mutation picks its victim by a rule of its own (not
//! by asking the checker), and applies only where that rule finds one.

use crate::config::{Mutation, BLOCK_BYTES};
use crate::history::{History, Kind, Rec};

const BLOCK: usize = BLOCK_BYTES as usize;

/// Applies `m` to `h`; false when the run has nothing it applies to.
/// (`Unordered` changes the run, not its history: see `SimConfig::mutated`.)
pub fn apply(m: Mutation, h: &mut History, seed: u64) -> bool {
    match m {
        Mutation::Unordered => true,
        Mutation::LostFua => lost_fua(h),
        Mutation::StaleRead => stale_read(h),
        Mutation::Garbage => {
            let at = (seed as usize).wrapping_mul(7919) % h.image.len();
            h.image[at] ^= 0x5a;
            h.durable[at] ^= 0x5a;
            true
        }
    }
}

/// The contents block `lba` had before `w`: the last write acknowledged
/// before `w` was issued that wrote it (zeroes if none; a write that
/// filled the device part way wrote only the blocks its count covers).
fn before(h: &History, w: &Rec, lba: u64) -> [u8; BLOCK] {
    h.recs
        .iter()
        .filter(|x| x.kind.is_write() && x.wrote(lba) && x.acked_before(w.issue))
        .max_by_key(|x| x.ack)
        .map_or([0; BLOCK], |x| x.block_bytes(lba))
}

/// Every other write of block `lba` issued before `until` was
/// acknowledged before `w` was issued: `w` is the block's one latest write.
fn only_latest(h: &History, w: &Rec, lba: u64, until: u64) -> bool {
    h.recs.iter().all(|x| {
        x.id == w.id
            || !x.kind.is_write()
            || !x.covers(lba)
            || x.issue >= until
            || x.acked_before(w.issue)
    })
}

/// An acknowledged FUA write that is its block's last write is replaced,
/// after the cut, by what the block held before it.
fn lost_fua(h: &mut History) -> bool {
    let victim = h.recs.iter().find_map(|w| {
        let fua = w.kind == Kind::FuaWrite && w.ok() && w.acked_before(h.cut_start);
        (fua && only_latest(h, w, w.lba, u64::MAX)).then(|| (w.lba, before(h, w, w.lba)))
    });
    let Some((lba, old)) = victim else {
        return false;
    };
    let r = lba as usize * BLOCK..(lba as usize + 1) * BLOCK;
    h.image[r.clone()].copy_from_slice(&old);
    h.durable[r].copy_from_slice(&old);
    true
}

/// One block of an acknowledged read whose last write (one that wrote the
/// block: see `Rec::wrote`) was acknowledged before the read was issued
/// is replaced by what the block held before that write.
fn stale_read(h: &mut History) -> bool {
    let mut victim = None;
    'reads: for (ri, r) in h.recs.iter().enumerate() {
        let (true, Kind::Read, Some(ack)) = (r.ok(), r.kind, r.ack) else {
            continue;
        };
        if ack >= h.cut_start {
            continue;
        }
        for lba in r.lba..r.lba + r.blocks {
            let last = h.recs.iter().find(|w| {
                w.kind.is_write()
                    && w.wrote(lba)
                    && w.acked_before(r.issue)
                    && only_latest(h, w, lba, ack)
            });
            if let Some(w) = last {
                let old = before(h, w, lba);
                if old != w.block_bytes(lba) {
                    victim = Some((ri, (lba - r.lba) as usize, old));
                    break 'reads;
                }
            }
        }
    }
    let Some((ri, i, old)) = victim else {
        return false;
    };
    h.recs[ri].data[i * BLOCK..(i + 1) * BLOCK].copy_from_slice(&old);
    true
}
