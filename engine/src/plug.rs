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
//! - Each device's [`PlugCounts`] count exactly that device's bios held
//!   (all zero once the plug is drained); its limits are its options'.

use crate::bio::BioId;

/// One plugged bio: its device index on this core, its id, and its merge
/// sort key (see [`crate::merge::sort_key`]), computed once at insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plugged {
    pub dev: u32,
    pub id: BioId,
    pub key: u128,
}

/// Slots of the [`Boundaries`] table; more mergeable bios than a quarter
/// of this in one plug count as "maybe adjacent" without looking (each
/// bio adds at most two values, so the table stays at most half full).
const BOUNDARY_SLOTS: usize = 128;

/// Mergeable bios noted at most: past a quarter of the table they count
/// as "maybe adjacent" (see [`BOUNDARY_SLOTS`]).
const BOUNDARY_LIMIT: usize = BOUNDARY_SLOTS / 4;

/// Flag of a table value where a noted bio starts.
const STARTS: u8 = 1;
/// Flag of a table value where a noted bio ends.
const ENDS: u8 = 2;

/// Where the plug's mergeable bios start and end, in one small
/// open-addressing table of byte offsets, each flagged as a start, an end
/// or both, so that a flush knows whether any two of them touch (a back or
/// front merge is possible) without sorting: random IO then skips the sort
/// entirely. False positives (a read ending where a write starts) only
/// cost a sort.
#[derive(Debug)]
pub(crate) struct Boundaries {
    /// Offsets plus one (0 marks an empty slot).
    values: [u64; BOUNDARY_SLOTS],
    /// `STARTS` and `ENDS` of each value.
    flags: [u8; BOUNDARY_SLOTS],
    /// Bios noted; [`BOUNDARY_LIMIT`] once `adjacent` is set (nothing is
    /// noted then), so that one test of it skips both cases.
    len: usize,
    /// Two mergeable bios touch, or the table filled up.
    pub adjacent: bool,
}

impl Default for Boundaries {
    fn default() -> Self {
        Self {
            values: [0; BOUNDARY_SLOTS],
            flags: [0; BOUNDARY_SLOTS],
            len: 0,
            adjacent: false,
        }
    }
}

impl Boundaries {
    /// Notes a mergeable bio on `[start, end)`: adjacent when it starts
    /// where another ends or ends where another starts.
    /// Once two touch (or the table filled up), `len` is
    /// [`BOUNDARY_LIMIT`]: one test skips the rest of the plug's bios.
    #[inline]
    fn add(&mut self, start: u64, end: u64) {
        if self.len >= BOUNDARY_LIMIT {
            self.adjacent = true;
            return;
        }
        debug_assert!(!self.adjacent, "adjacent sets len to the limit");
        // Stored plus one: 0 marks an empty slot. Once its start touches,
        // the bio's end need not be noted: nothing more is noted in this
        // plug.
        if self.mark(start.wrapping_add(1), STARTS, ENDS)
            || self.mark(end.wrapping_add(1), ENDS, STARTS)
        {
            self.adjacent = true;
            self.len = BOUNDARY_LIMIT;
        } else {
            self.len += 1;
        }
    }

    /// Flags value `v` with `flag` (inserting it when absent); returns
    /// whether it already had `other` (a bio's start meeting another's
    /// end, or the reverse). One probe sequence for both.
    #[inline]
    fn mark(&mut self, v: u64, flag: u8, other: u8) -> bool {
        let mut i = slot_of(v);
        loop {
            match self.values[i] {
                0 => {
                    self.values[i] = v;
                    self.flags[i] = flag;
                    return false;
                }
                x if x == v => {
                    let had = self.flags[i] & other != 0;
                    self.flags[i] |= flag;
                    return had;
                }
                _ => i = (i + 1) % BOUNDARY_SLOTS,
            }
        }
    }

    /// Forgets every bio.
    fn clear(&mut self) {
        if self.len > 0 {
            self.values = [0; BOUNDARY_SLOTS];
            self.len = 0;
        }
        self.adjacent = false;
    }
}

fn slot_of(v: u64) -> usize {
    // Fibonacci hashing: offsets are multiples of the block size, so the
    // high bits of the product spread them.
    (v.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 57) as usize
}

/// Bit of a [`plug_class`](crate::merge::plug_class): a read or a write,
/// which may merge unless its flags forbid it. (Here, not in `merge`, so
/// that the plug, which keeps these bits, does not use `merge`.)
pub(crate) const CLASS_DATA: u8 = 1 << 2;
/// Bit of a [`plug_class`](crate::merge::plug_class): a write or a flush,
/// which the plug's flush must keep in order against the IO it overlaps.
pub(crate) const CLASS_ORDERED: u8 = 1 << 3;

/// One device's share of the plug, and its limits (indexed by the
/// device's index on the core, as `DevList`): kept in the plug, so that an
/// issue that plugs a bio borrows the plug alone, not the device list as
/// well (the borrow and the `Option` of a device slot were about 9
/// instructions per IO).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PlugCounts {
    /// The device's bios and bytes in the plug now: what `max_count` and
    /// `flush_bytes` are compared with.
    pub bios: usize,
    pub bytes: u64,
    /// Of `bios`, those whose bio was no bio cache hit: the iostats' bio
    /// cache counts are added once per flush from these two
    /// (`CoreDev::count_plugged_bios`), not per IO.
    pub cache_misses: usize,
    /// The device's `plug_max_count` and `plug_flush_bytes` options.
    pub max_count: usize,
    pub flush_bytes: u64,
}

/// The bios of one tick on one core.
#[derive(Debug, Default)]
pub(crate) struct Plug {
    /// The bios in issue order.
    pub bios: Vec<Plugged>,
    /// Each device's counts and limits, by device index on the core (see
    /// [`PlugCounts`]); set by [`Plug::set_limits`] when the core first
    /// uses the device.
    pub devs: Vec<PlugCounts>,
    /// Bios held that may merge (reads and writes without FUA, PREFLUSH
    /// or NOMERGE): below two, a flush has nothing to sort.
    pub mergeable: usize,
    /// The [`plug_class`](crate::merge::plug_class) bits of the bios
    /// held, or-ed: with [`CLASS_ORDERED`] a write or a flush is held,
    /// and the flush must look for ordering conflicts before it sorts.
    /// (Kept as the class's bits, so that a push is one `or` of them.)
    classes: u8,
    /// Whether two mergeable bios touch.
    pub boundaries: Boundaries,
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
    /// Two mergeable bios touch: sorting may find merges.
    pub adjacent: bool,
}

impl Plug {
    /// Adds a bio on `[offset_bytes, offset_bytes + len_bytes)`;
    /// `mergeable` and `class` (its op's
    /// [`plug_class`](crate::merge::plug_class)) say what kind of IO it
    /// is.
    #[inline]
    pub fn push(
        &mut self,
        entry: Plugged,
        offset_bytes: u64,
        len_bytes: u64,
        mergeable: bool,
        class: u8,
    ) {
        self.bios.push(entry);
        if mergeable {
            self.mergeable += 1;
            self.boundaries
                .add(offset_bytes, offset_bytes.saturating_add(len_bytes));
        }
        self.classes |= class;
    }

    /// Device `dev`'s limits (its `plug_max_count` and
    /// `plug_flush_bytes`), set when the core starts using it in slot
    /// `dev`. Its counts are zero then: a slot is reused only once its
    /// device was released, which needs an empty plug.
    pub fn set_limits(&mut self, dev: usize, max_count: usize, flush_bytes: u64) {
        if self.devs.len() <= dev {
            self.devs.resize(dev + 1, PlugCounts::default());
        }
        let c = &mut self.devs[dev];
        debug_assert_eq!((c.bios, c.bytes, c.cache_misses), (0, 0, 0));
        c.max_count = max_count;
        c.flush_bytes = flush_bytes;
    }

    /// Device `dev`'s counts, emptied (the limits stay): its bios left the
    /// plug. All zero for a device with no slot.
    pub fn take_counts(&mut self, dev: usize) -> PlugCounts {
        match self.devs.get_mut(dev) {
            Some(c) => {
                let taken = *c;
                c.bios = 0;
                c.bytes = 0;
                c.cache_misses = 0;
                taken
            }
            None => PlugCounts::default(),
        }
    }

    /// Whether the plug must be flushed now, before the tick ends: the
    /// device of `counts` holds its `max_count` bios in it (or the larger
    /// count an open guard declared, `nr_ios`: the plug's
    /// [`Plug::nr_ios`]), or its `flush_bytes` bytes (0 disables the byte
    /// trigger).
    #[inline]
    pub fn should_flush(nr_ios: usize, counts: &PlugCounts) -> bool {
        let count_limit = counts.max_count.max(nr_ios);
        counts.bios >= count_limit
            || (counts.flush_bytes != 0 && counts.bytes >= counts.flush_bytes)
    }

    /// Takes every bio out, leaving the plug empty (with the capacity of
    /// `out`'s vector, when `out` was empty: the two are swapped).
    pub fn drain_into(&mut self, out: &mut Vec<Plugged>) -> Drained {
        if out.is_empty() {
            // The flush's case (its list is empty between flushes): the
            // two vectors trade places, each keeping its capacity, where
            // appending copied every entry.
            std::mem::swap(&mut self.bios, out);
        } else {
            out.append(&mut self.bios);
        }
        let drained = Drained {
            mergeable: self.mergeable,
            writes_or_flush: self.classes & CLASS_ORDERED != 0,
            adjacent: self.boundaries.adjacent,
        };
        self.mergeable = 0;
        self.classes = 0;
        self.boundaries.clear();
        drained
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(ranges: &[(u64, u64)]) -> bool {
        let mut b = Boundaries::default();
        for &(s, len) in ranges {
            b.add(s, s + len);
        }
        b.adjacent
    }

    #[test]
    fn boundaries_find_back_and_front_neighbours_only() {
        assert!(!touch(&[(0, 4096), (8192, 4096), (100 << 20, 4096)]));
        assert!(touch(&[(0, 4096), (4096, 4096)]), "back merge");
        assert!(touch(&[(8192, 4096), (4096, 4096)]), "front merge");
        assert!(touch(&[(0, 4096), (1 << 20, 512), ((1 << 20) + 512, 4096)]));
        let far: Vec<_> = (0..32).map(|i| (i * 3 * 4096, 4096)).collect();
        assert!(!touch(&far), "32 bios with gaps");
        let many: Vec<_> = (0..33).map(|i| (i * 3 * 4096, 4096)).collect();
        assert!(
            touch(&many),
            "past a quarter of the table: assumed adjacent"
        );
        assert!(!touch(&[(0, 4096), (0, 4096)]), "the same range twice");
        assert!(!touch(&[(0, 8192), (4096, 4096)]), "ends meeting ends");
        assert!(touch(&[(0, 0), (0, 4096)]), "an empty range touches");
    }
}
