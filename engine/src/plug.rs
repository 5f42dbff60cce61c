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

/// The bios of one tick on one core.
#[derive(Debug, Default)]
pub(crate) struct Plug {
    /// `(device index on this core, bio)` in issue order.
    pub bios: Vec<(u32, BioId)>,
    /// Bytes of data held.
    pub bytes: u64,
    /// Explicit plug guards open on this core and their declared IO count
    /// (`blk_start_plug_nr_ios`); 0 when none is open.
    pub nr_ios: usize,
    pub guards: u32,
}

impl Plug {
    /// Adds a bio of `len_bytes`.
    pub fn push(&mut self, dev: u32, bio: BioId, len_bytes: u64) {
        self.bios.push((dev, bio));
        self.bytes += len_bytes;
    }

    /// Whether the plug must be flushed now, before the tick ends: it holds
    /// `max_count` bios (or the larger count an open guard declared), or
    /// `flush_bytes` bytes (0 disables the byte trigger).
    pub fn should_flush(&self, max_count: usize, flush_bytes: u64) -> bool {
        let count_limit = max_count.max(self.nr_ios);
        self.bios.len() >= count_limit || (flush_bytes != 0 && self.bytes >= flush_bytes)
    }

    /// Takes every bio out, leaving the plug empty (capacity kept).
    pub fn drain_into(&mut self, out: &mut Vec<(u32, BioId)>) {
        out.append(&mut self.bios);
        self.bytes = 0;
    }
}
