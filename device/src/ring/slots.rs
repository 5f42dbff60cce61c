//! In-flight slots of a ring: index = the low 32 bits of the SQE's
//! user_data (which has `SLOT_BIT` set besides).
//!
//! Invariants: a slot is occupied from push to its final CQE; indices are
//! reused only after removal; `len()` counts occupied slots. A slot keeps
//! only what completion and a per-op `-EAGAIN` resubmission need: the
//! 24-byte [`Meta`] (handler, token, the ring's file registration, the
//! preflush result) and a copy of the SQE (64 bytes, in a parallel array,
//! written once per op). The rare PREFLUSH SQE lives in a side list.

use io_uring::squeue;

use crate::completion::HandlerId;

/// Set in user_data of a slot op (and its preflush), which uses the low
/// 41 bits besides; a direct op's has neither this bit nor bit 63 (the
/// ring's reserved values, `u64::MAX - k`, have both): one shift and test
/// finds a direct op's CQE, whose handler id is then the bits above its
/// token as they are (see the ring's module invariants).
pub(super) const SLOT_BIT: u64 = 1 << 62;

/// No file registration (an op that names no file, e.g. a NOP from the
/// passthrough backend or the ring's own SQEs).
pub(crate) const NO_FILE: u32 = u32::MAX;

/// `handler` of a free slot.
const FREE: u32 = u32::MAX;

/// What completion needs of one op in flight.
#[derive(Clone, Copy)]
pub(crate) struct Meta {
    pub token: u64,
    pub handler: HandlerId,
    /// Index of the ring's file registration that keeps the op's file open
    /// (`NO_FILE` for none).
    pub file: u32,
    /// The preflush CQE's result (0 until it arrives, or without one).
    pub preflush_result: i32,
    /// A PREFLUSH SQE is linked ahead of the op (kept in the side list).
    pub has_preflush: bool,
}

const FREE_META: Meta = Meta {
    token: 0,
    handler: HandlerId(FREE),
    file: NO_FILE,
    preflush_result: 0,
    has_preflush: false,
};

/// A slab of slots with an intrusive free list (a free slot's `token`
/// holds the next free index).
pub(crate) struct Slots {
    meta: Vec<Meta>,
    /// The SQE of each slot, kept to resubmit on a per-op `-EAGAIN`.
    sqes: Vec<squeue::Entry>,
    /// The PREFLUSH SQEs of the slots that have one (few; linear search).
    preflush: Vec<(u32, squeue::Entry)>,
    /// First free slot (`NONE`: none, grow).
    free_head: u32,
    len: usize,
}

/// End of the free list.
const NONE: u32 = u32::MAX;

impl Default for Slots {
    fn default() -> Self {
        Self {
            meta: Vec::new(),
            sqes: Vec::new(),
            preflush: Vec::new(),
            free_head: NONE,
            len: 0,
        }
    }
}

impl Slots {
    /// Occupies a slot for `meta` and `entry` (stored with user_data = the
    /// slot index and `SLOT_BIT`); returns the index.
    #[inline]
    pub fn insert(&mut self, meta: Meta, entry: squeue::Entry) -> u32 {
        debug_assert!(meta.handler.0 != FREE, "handler id {FREE} is reserved");
        self.len += 1;
        let index = self.free_head;
        if index != NONE {
            let i = index as usize;
            debug_assert!(self.meta[i].handler.0 == FREE, "slot {i} reused while busy");
            self.free_head = self.meta[i].token as u32;
            self.meta[i] = meta;
            self.sqes[i] = entry.user_data(u64::from(index) | SLOT_BIT);
            index
        } else {
            let index = self.meta.len() as u32;
            assert!(index < NONE, "too many ops in flight");
            self.meta.push(meta);
            self.sqes.push(entry.user_data(u64::from(index) | SLOT_BIT));
            index
        }
    }

    /// The kept SQE of slot `index` (occupied: just inserted).
    #[inline]
    pub fn sqe_ref(&self, index: u32) -> &squeue::Entry {
        &self.sqes[index as usize]
    }

    /// Keeps `entry` as the PREFLUSH SQE of slot `index`.
    pub fn set_preflush_sqe(&mut self, index: u32, entry: squeue::Entry) {
        self.preflush.push((index, entry));
    }

    /// The PREFLUSH SQE of slot `index`.
    pub fn preflush_sqe(&self, index: u32) -> Option<squeue::Entry> {
        self.preflush
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, e)| e.clone())
    }

    /// The metadata of occupied slot `index`.
    #[inline]
    pub fn get(&self, index: u32) -> Option<&Meta> {
        self.meta
            .get(index as usize)
            .filter(|m| m.handler.0 != FREE)
    }

    /// The kept SQE of occupied slot `index`.
    pub fn sqe(&self, index: u32) -> Option<squeue::Entry> {
        self.get(index)?;
        Some(self.sqes[index as usize].clone())
    }

    pub fn set_preflush_result(&mut self, index: u32, res: i32) {
        if let Some(m) = self.meta.get_mut(index as usize) {
            if m.handler.0 != FREE {
                m.preflush_result = res;
            }
        }
    }

    pub fn reset_preflush(&mut self, index: u32) {
        self.set_preflush_result(index, 0);
    }

    /// Frees slot `index` and returns its metadata (the SQE copy stays
    /// where it is until the slot is reused).
    #[inline]
    pub fn remove(&mut self, index: u32) -> Option<Meta> {
        let slot = self.meta.get_mut(index as usize)?;
        if slot.handler.0 == FREE {
            return None;
        }
        let meta = std::mem::replace(
            slot,
            Meta {
                token: u64::from(self.free_head),
                ..FREE_META
            },
        );
        self.free_head = index;
        if meta.has_preflush {
            self.preflush.retain(|(i, _)| *i != index);
        }
        self.len -= 1;
        Some(meta)
    }

    /// True when an occupied slot names file registration `file`.
    pub fn uses_file(&self, file: u32) -> bool {
        self.meta
            .iter()
            .any(|m| m.handler.0 != FREE && m.file == file)
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_is_small_and_slots_are_reused() {
        assert!(std::mem::size_of::<Meta>() <= 24);
        let mut s = Slots::default();
        let nop = io_uring::opcode::Nop::new().build();
        let meta = |token| Meta {
            token,
            handler: HandlerId(0),
            file: NO_FILE,
            preflush_result: 0,
            has_preflush: false,
        };
        let a = s.insert(meta(1), nop.clone());
        let b = s.insert(meta(2), nop.clone());
        assert_eq!(s.len(), 2);
        assert_eq!(s.remove(a).map(|m| m.token), Some(1));
        assert!(s.remove(a).is_none(), "removed once");
        assert!(s.get(a).is_none());
        let c = s.insert(meta(3), nop);
        assert_eq!(c, a, "index reused");
        assert_eq!(s.get(b).map(|m| m.token), Some(2));
        assert_eq!(s.len(), 2);
    }
}
