//! Bios: one IO as a caller issued it, kept in a per-core table.
//!
//! Invariants:
//! - A bio lives in the [`BioTable`] of the core whose task issued it and is
//!   only touched on that core's thread. Its [`BioId`] is an index plus a
//!   generation, so a stale id (a future polled after its slot was reused)
//!   is detected, never aliased.
//! - A bio's buffer belongs to the bio from issue until the bio completes:
//!   while any of its requests is in flight, the kernel may read or write
//!   that memory, so neither the future being dropped nor shutdown frees it
//!   before then. An orphaned bio (its future was dropped) is released by
//!   the completion path.
//! - A bio completes exactly once: `parts_left` counts its requests still in
//!   flight; the result is published when it reaches zero.
//! - Freed slots go on a free list and are reused (the steady state does
//!   not allocate per IO); the table only grows.

use std::task::Waker;

use plugio_device::{DmaBuf, Error, IoFlags, OpKind};

/// Names a bio in its core's [`BioTable`]: slot index and generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BioId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

/// The memory a bio reads into or writes from.
#[derive(Debug, Default)]
pub enum BioBuf {
    /// No data (flush, discard, write zeroes).
    #[default]
    None,
    /// One buffer: the IO covers `buf.len()` bytes.
    One(DmaBuf),
    /// Several buffers in order (readv/writev).
    Many(Vec<DmaBuf>),
}

impl BioBuf {
    /// Total bytes of data.
    pub fn len_bytes(&self) -> u64 {
        match self {
            BioBuf::None => 0,
            BioBuf::One(b) => b.len() as u64,
            BioBuf::Many(v) => v.iter().map(|b| b.len() as u64).sum(),
        }
    }

    /// Appends `(address, len)` of the byte range `[from, from + len)` of
    /// this buffer list, as iovecs, to `out`.
    pub(crate) fn push_iovecs(&self, from: u64, len: u64, out: &mut Vec<libc::iovec>) {
        let bufs: &[DmaBuf] = match self {
            BioBuf::None => &[],
            BioBuf::One(b) => std::slice::from_ref(b),
            BioBuf::Many(v) => v,
        };
        let (mut skip, mut left) = (from, len);
        for b in bufs {
            let blen = b.len() as u64;
            if skip >= blen {
                skip -= blen;
                continue;
            }
            let take = (blen - skip).min(left);
            out.push(libc::iovec {
                // SAFETY: `skip < blen`, so the offset stays inside the
                // buffer's allocation.
                iov_base: unsafe { b.as_ptr().add(skip as usize) } as *mut libc::c_void,
                iov_len: take as usize,
            });
            left -= take;
            skip = 0;
            if left == 0 {
                break;
            }
        }
    }
}

/// Where a bio is on its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BioState {
    /// On the free list.
    Free,
    /// In the plug, or split into requests waiting for tags or in flight.
    Issued,
    /// Completed; the result waits for its future.
    Done,
}

/// One bio slot.
#[derive(Debug)]
pub(crate) struct Bio {
    pub generation: u32,
    pub state: BioState,
    /// Index of the device in the core's device list.
    pub dev: u32,
    pub op: OpKind,
    pub flags: IoFlags,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub buf: BioBuf,
    /// Requests of this bio not yet completed.
    pub parts_left: u32,
    /// Whether the bio was split into more than one request.
    pub split: bool,
    /// `(offset within the bio, bytes done, bytes asked)` per completed part,
    /// kept only for split bios, to compute the prefix that was transferred.
    pub parts: Vec<(u64, u64, u64)>,
    /// Bytes transferred (unsplit bios) or the computed prefix (split ones).
    pub done_bytes: u64,
    pub error: Option<Error>,
    pub waker: Option<Waker>,
    /// The future was dropped: release the slot when the bio completes.
    pub orphaned: bool,
}

impl Bio {
    fn empty() -> Self {
        Self {
            generation: 0,
            state: BioState::Free,
            dev: 0,
            op: OpKind::Nop,
            flags: IoFlags::NONE,
            offset_bytes: 0,
            len_bytes: 0,
            buf: BioBuf::None,
            parts_left: 0,
            split: false,
            parts: Vec::new(),
            done_bytes: 0,
            error: None,
            waker: None,
            orphaned: false,
        }
    }

    /// Records the completion of one part: `asked` bytes at `bio_offset`
    /// within the bio, `result` bytes or a negative errno. Returns true when
    /// this was the last part.
    pub(crate) fn complete_part(&mut self, bio_offset: u64, asked: u64, result: i64) -> bool {
        if result < 0 {
            if self.error.is_none() {
                self.error = Some(Error::from_errno(result as i32));
            }
        } else if self.split {
            self.parts.push((bio_offset, result as u64, asked));
        } else {
            self.done_bytes = result as u64;
        }
        self.parts_left -= 1;
        if self.parts_left > 0 {
            return false;
        }
        if self.split {
            self.done_bytes = transferred_prefix(&mut self.parts);
        }
        self.state = BioState::Done;
        true
    }
}

/// The bytes transferred from the start of a split bio: parts sorted by
/// offset, summed until the first short one (a short read at end of file
/// ends the data; later parts read nothing).
fn transferred_prefix(parts: &mut [(u64, u64, u64)]) -> u64 {
    parts.sort_unstable_by_key(|p| p.0);
    let mut total = 0;
    for &(off, done, asked) in parts.iter() {
        if off != total {
            break;
        }
        total += done;
        if done < asked {
            break;
        }
    }
    total
}

/// What a finished bio gives back to its future.
#[derive(Debug)]
pub struct BioResult {
    /// Bytes transferred, or the first error of its requests.
    pub result: Result<u64, Error>,
    /// The bio's memory, handed back to the caller.
    pub buf: BioBuf,
}

/// The per-core table of bios: a slab with a free list. This is also the
/// per-core bio cache: a freed slot (with its `parts` vector's capacity) is
/// reused by the next IO without touching the allocator.
#[derive(Debug, Default)]
pub(crate) struct BioTable {
    slots: Vec<Bio>,
    free: Vec<u32>,
    in_use: usize,
}

impl BioTable {
    /// Takes a free slot (reusing one when possible) and returns its id.
    pub fn alloc(&mut self) -> BioId {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Bio::empty());
                (self.slots.len() - 1) as u32
            }
        };
        self.in_use += 1;
        let bio = &mut self.slots[index as usize];
        bio.generation = bio.generation.wrapping_add(1);
        bio.state = BioState::Issued;
        BioId {
            index,
            generation: bio.generation,
        }
    }

    /// The bio named by `id`, if the id is current.
    pub fn get_mut(&mut self, id: BioId) -> Option<&mut Bio> {
        self.slots
            .get_mut(id.index as usize)
            .filter(|b| b.generation == id.generation && b.state != BioState::Free)
    }

    /// The bio named by `id`, if the id is current (shared access).
    pub fn get(&self, id: BioId) -> Option<&Bio> {
        self.slots
            .get(id.index as usize)
            .filter(|b| b.generation == id.generation && b.state != BioState::Free)
    }

    /// Returns the slot to the free list, resetting it. The buffer is
    /// dropped (returned to its cache) here unless it was taken before.
    pub fn free(&mut self, id: BioId) {
        let Some(bio) = self.get_mut(id) else {
            return;
        };
        bio.state = BioState::Free;
        bio.buf = BioBuf::None;
        bio.parts.clear();
        bio.error = None;
        bio.waker = None;
        bio.orphaned = false;
        bio.split = false;
        bio.done_bytes = 0;
        self.free.push(id.index);
        self.in_use -= 1;
    }

    /// Takes the result of a completed bio and frees its slot.
    pub fn take_result(&mut self, id: BioId) -> Option<BioResult> {
        let bio = self.get_mut(id)?;
        if bio.state != BioState::Done {
            return None;
        }
        let buf = std::mem::take(&mut bio.buf);
        let result = match bio.error.take() {
            Some(e) => Err(e),
            None => Ok(bio.done_bytes),
        };
        self.free(id);
        Some(BioResult { result, buf })
    }

    /// Bios issued and not yet freed.
    #[cfg(test)]
    pub fn in_use(&self) -> usize {
        self.in_use
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_stops_at_first_short_part() {
        let mut parts = vec![(8192, 0, 4096), (0, 4096, 4096), (4096, 768, 4096)];
        assert_eq!(transferred_prefix(&mut parts), 4864);
        let mut full = vec![(4096, 4096, 4096), (0, 4096, 4096)];
        assert_eq!(transferred_prefix(&mut full), 8192);
    }

    #[test]
    fn stale_ids_are_refused() {
        let mut t = BioTable::default();
        let a = t.alloc();
        t.free(a);
        let b = t.alloc();
        assert_eq!(a.index, b.index);
        assert!(t.get_mut(a).is_none());
        assert!(t.get_mut(b).is_some());
        assert_eq!(t.in_use(), 1);
    }
}
