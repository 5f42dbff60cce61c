//! In-flight slots of a ring: index = the SQE's user_data.
//!
//! Invariants: a slot is occupied from push to its final CQE; indices are
//! reused only after removal; `len()` counts occupied slots.

use io_uring::squeue;

use crate::core::HandlerId;

/// One op in flight.
pub(crate) struct Slot {
    pub handler: HandlerId,
    pub token: u64,
    /// The SQE, kept to resubmit on a per-op `-EAGAIN`.
    pub entry: squeue::Entry,
    /// The linked preflush SQE, if the op has `PREFLUSH`.
    pub preflush: Option<squeue::Entry>,
    /// The preflush CQE's result (0 until it arrives).
    pub preflush_result: i32,
    /// The file the SQE names, held open until the CQE.
    pub _file: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

/// What [`Slots::remove`] hands back.
pub(crate) struct Removed {
    pub handler: HandlerId,
    pub token: u64,
    pub preflush_result: i32,
    /// The file, released when this is dropped (after the completion is
    /// queued).
    pub _file: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

/// A slab of slots with a free list.
#[derive(Default)]
pub(crate) struct Slots {
    entries: Vec<Option<Slot>>,
    free: Vec<u32>,
    len: usize,
}

impl Slots {
    pub fn insert(&mut self, slot: Slot) -> u32 {
        self.len += 1;
        match self.free.pop() {
            Some(index) => {
                self.entries[index as usize] = Some(slot);
                index
            }
            None => {
                self.entries.push(Some(slot));
                (self.entries.len() - 1) as u32
            }
        }
    }

    pub fn get(&self, index: u32) -> Option<&Slot> {
        self.entries.get(index as usize).and_then(Option::as_ref)
    }

    pub fn set_preflush_result(&mut self, index: u32, res: i32) {
        if let Some(Some(slot)) = self.entries.get_mut(index as usize) {
            slot.preflush_result = res;
        }
    }

    pub fn reset_preflush(&mut self, index: u32) {
        self.set_preflush_result(index, 0);
    }

    /// Frees slot `index`, copying out only what completion needs (the
    /// SQE copies stay where they are: moving the whole slot out was a
    /// measurable memcpy per IO).
    pub fn remove(&mut self, index: u32) -> Option<Removed> {
        let entry = self.entries.get_mut(index as usize)?;
        let slot = entry.as_mut()?;
        let removed = Removed {
            handler: slot.handler,
            token: slot.token,
            preflush_result: slot.preflush_result,
            _file: slot._file.take(),
        };
        *entry = None;
        self.free.push(index);
        self.len -= 1;
        Some(removed)
    }

    pub fn len(&self) -> usize {
        self.len
    }
}
