//! The per-core plug: the bios issued during one executor tick.
//!
//! Idea: the kernel's `blk_plug` (`blk_start_plug_nr_ios`, flushed at
//! `BLK_MAX_REQUEST_COUNT` requests, at `BLK_PLUG_FLUSH_SIZE` bytes, when the
//! task sleeps, and at `blk_finish_plug`). Here the "task sleeps" point is the
//! end of the executor tick (the engine's tick hook), which runs before the
//! core parks.
//!
//! Invariants:
//! - Bios in the plug are in issue order; a flush takes them all.
//! - The executor never parks with a non-empty plug: the tick hook flushes
//!   it before every park.
//! - `count`/`bytes` describe exactly the bios held.

use crate::bio::BioId;

/// One plugged bio: its device index on this core, its id, and its merge
/// sort key (see [`crate::merge::sort_key`]), computed once at insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plugged {
    pub dev: u32,
    pub id: BioId,
    pub key: u128,
}

/// The bios of one tick on one core.
#[derive(Debug, Default)]
pub(crate) struct Plug {
    /// The bios in issue order.
    pub bios: Vec<Plugged>,
    /// Bytes of data held.
    pub bytes: u64,
    /// Bios held that may merge (reads and writes without FUA, PREFLUSH
    /// or NOMERGE): below two, a flush has nothing to sort.
    pub mergeable: usize,
    /// A write or a flush is held: the flush must look for ordering
    /// conflicts before it sorts.
    pub writes_or_flush: bool,
    /// Explicit plug guards open on this core and their declared IO count
    /// (`blk_start_plug_nr_ios`); 0 when none is open.
    pub nr_ios: usize,
    pub guards: u32,
}

/// What the flush learns about the plug it drains.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Drained {
    pub mergeable: usize,
    pub writes_or_flush: bool,
}

impl Plug {
    /// Adds a bio of `len_bytes`; `mergeable` and `writes_or_flush` say
    /// what kind of IO it is.
    pub fn push(&mut self, entry: Plugged, len_bytes: u64, mergeable: bool, writes_or_flush: bool) {
        self.bios.push(entry);
        self.bytes += len_bytes;
        self.mergeable += usize::from(mergeable);
        self.writes_or_flush |= writes_or_flush;
    }

    /// Whether the plug must be flushed now, before the tick ends: it holds
    /// `max_count` bios (or the larger count an open guard declared), or
    /// `flush_bytes` bytes (0 disables the byte trigger).
    pub fn should_flush(&self, max_count: usize, flush_bytes: u64) -> bool {
        let count_limit = max_count.max(self.nr_ios);
        self.bios.len() >= count_limit || (flush_bytes != 0 && self.bytes >= flush_bytes)
    }

    /// Takes every bio out, leaving the plug empty (capacity kept).
    pub fn drain_into(&mut self, out: &mut Vec<Plugged>) -> Drained {
        out.append(&mut self.bios);
        self.bytes = 0;
        let drained = Drained {
            mergeable: self.mergeable,
            writes_or_flush: self.writes_or_flush,
        };
        self.mergeable = 0;
        self.writes_or_flush = false;
        drained
    }
}
