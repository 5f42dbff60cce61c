//! One sbitmap word: the allocation bits, the deferred-free bits, and the
//! in-word searches (the kernel's `sbitmap_word`, `__sbitmap_get_word`,
//! `sbitmap_find_bits_in_word` and `sbitmap_deferred_clear`).
//!
//! Invariants:
//! - A bit set in `word` is a tag someone holds, or a tag that was freed with a
//!   deferred clear and whose bit is also set in `cleared`.
//! - A bit is set in `cleared` only by the holder of that tag, when it frees
//!   it; it leaves `cleared` only inside [`SbWord::move_cleared`], under
//!   `swap_lock`, together with its removal from `word`. So "`cleared` is
//!   empty and `word` is full" is never observed, under the lock, half way
//!   through a move (the 2024 "io hung due to race on sbitmap_word::cleared"
//!   fix).
//! - `word` and `cleared` live on different cache lines: a free does not dirty
//!   the line allocators read.

use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Mutex};

/// The low `nr_bits` bits set, for `nr_bits` in `0..=64`, without the
/// `1 << 64` overflow (the u64 shift guard of the batch path).
#[inline]
pub(crate) fn low_mask(nr_bits: u32) -> u64 {
    if nr_bits == 0 {
        0
    } else {
        u64::MAX >> (64 - nr_bits.min(64))
    }
}

/// The deferred-free half of a word, on its own cache line.
#[derive(Debug)]
struct ClearState {
    /// Bits freed by `put` but not yet removed from `word`.
    cleared: AtomicU64,
    /// Makes "check `cleared`, swap it out, and-not it into `word`" atomic
    /// with respect to other movers (slow path only).
    swap_lock: Mutex<()>,
}

/// One word of a tag bitmap: `depth` usable bits (1..=64).
#[derive(Debug)]
pub(crate) struct SbWord {
    /// 1 = busy (held, or freed into `cleared` and not yet moved back).
    word: CachePadded<AtomicU64>,
    clear: CachePadded<ClearState>,
}

impl SbWord {
    /// An all-free word.
    pub(crate) fn new() -> Self {
        Self {
            word: CachePadded::new(AtomicU64::new(0)),
            clear: CachePadded::new(ClearState {
                cleared: AtomicU64::new(0),
                swap_lock: Mutex::new(()),
            }),
        }
    }

    /// Claims one free bit in `0..depth`, searching from `hint_bit`; with
    /// `wrap` the search goes back to bit 0 once. Moves deferred frees back
    /// into the word when it finds nothing (`sbitmap_find_bit_in_word`).
    pub(crate) fn get_bit(&self, depth: u32, hint_bit: u32, wrap: bool) -> Option<u32> {
        loop {
            if let Some(bit) = self.get_bit_no_clear(depth, hint_bit, wrap) {
                return Some(bit);
            }
            if !self.deferred_clear(depth, hint_bit, wrap) {
                return None;
            }
        }
    }

    /// `__sbitmap_get_word`: one pass of find-zero + test-and-set.
    fn get_bit_no_clear(&self, depth: u32, mut hint_bit: u32, wrap: bool) -> Option<u32> {
        let depth_mask = low_mask(depth);
        loop {
            // Relaxed: only a guess of which bit to try; the fetch_or below
            // decides ownership.
            let val = self.word.load(Ordering::Relaxed);
            let free = !val & depth_mask & !low_mask(hint_bit);
            if free == 0 {
                if hint_bit != 0 && wrap {
                    hint_bit = 0;
                    continue;
                }
                return None;
            }
            let bit = free.trailing_zeros();
            let mask = 1u64 << bit;
            // Acquire: pairs with the Release (SeqCst) of the free that made
            // this bit zero (`put_direct`/`put_batch` on `word`, or the
            // `fetch_and` in `move_cleared`), so the previous holder's writes
            // to the request slot are visible to the new holder.
            if self.word.fetch_or(mask, Ordering::Acquire) & mask == 0 {
                return Some(bit);
            }
            // Lost the race for this bit: search on from the next one (the
            // kernel wraps at `depth - 1`, one too early; we wrap at `depth`).
            hint_bit = bit + 1;
            if hint_bit >= depth {
                hint_bit = 0;
            }
        }
    }

    /// `sbitmap_deferred_clear` for the single-bit path: returns true when a
    /// retry can succeed, i.e. freed bits were moved back into `word`, or
    /// `word` (re-read under the lock) has a free bit in the searched range.
    fn deferred_clear(&self, depth: u32, hint_bit: u32, wrap: bool) -> bool {
        let _guard = self
            .clear
            .swap_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Acquire: pairs with the SeqCst (release) fetch_or in `put_deferred`.
        if self.clear.cleared.load(Ordering::Acquire) == 0 {
            let mut searched = low_mask(depth);
            if !wrap {
                searched &= !low_mask(hint_bit);
            }
            // Relaxed: re-check only; ownership is decided by fetch_or.
            return self.word.load(Ordering::Relaxed) & searched != searched;
        }
        self.move_cleared_locked();
        true
    }

    /// Moves deferred frees back into `word`; true if any bits moved. Used by
    /// the batch path, which must not loop on "the word has free bits"
    /// (they may not fit its window).
    fn move_cleared(&self) -> bool {
        // Fast check without the lock: nothing to move.
        // Relaxed: a hint only; the swap under the lock decides.
        if self.clear.cleared.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let _guard = self
            .clear
            .swap_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.move_cleared_locked()
    }

    /// The move itself; the caller holds `swap_lock`.
    fn move_cleared_locked(&self) -> bool {
        // AcqRel: Acquire pairs with the freers' SeqCst fetch_or on `cleared`
        // (their slot writes happen before our and-not); Release is not
        // needed for others but keeps the RMW symmetric.
        let mask = self.clear.cleared.swap(0, Ordering::AcqRel);
        if mask == 0 {
            return false;
        }
        // Release: pairs with the Acquire fetch_or/CAS of the next allocator
        // of these bits, carrying the freers' writes (which we acquired) on.
        self.word.fetch_and(!mask, Ordering::Release);
        true
    }

    /// `sbitmap_find_bits_in_word`: claims a window of `min(nr, depth)` bit
    /// positions starting at the first zero bit, and returns the bits of it
    /// that were free, shifted down, with the window's first bit:
    /// `(mask, first_bit)`. `None` when the word is full or the window does
    /// not fit inside the word (after one attempt to move deferred frees).
    pub(crate) fn get_bits(&self, depth: u32, nr: u32) -> Option<(u64, u32)> {
        let nr = nr.min(depth);
        let full = low_mask(depth);
        let (mut val, first) = loop {
            // Relaxed: the CAS below re-validates the value.
            let val = self.word.load(Ordering::Relaxed);
            if val & full != full {
                let first = (!val & full).trailing_zeros();
                if first + nr <= depth {
                    break (val, first);
                }
            }
            if !self.move_cleared() {
                return None;
            }
        };
        let window = low_mask(nr) << first;
        loop {
            // Acquire on success: pairs with the Release frees of these bits
            // (see `get_bit_no_clear`). Relaxed on failure: we only retry.
            match self.word.compare_exchange_weak(
                val,
                val | window,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(current) => val = current,
            }
        }
        let got = (window & !val) >> first;
        (got != 0).then_some((got, first))
    }

    /// Frees one bit the kernel way: set it in `cleared`, leave `word` alone
    /// (`sbitmap_deferred_clear_bit`).
    pub(crate) fn put_deferred(&self, bit: u32) {
        // SeqCst: Release for the next holder (see `move_cleared_locked`),
        // and the store half of the store-then-load handshake with a
        // registering waiter (`WaitQueues::wake_up` loads `ws_active` next).
        self.clear.cleared.fetch_or(1u64 << bit, Ordering::SeqCst);
    }

    /// Frees the bits of `mask` directly in `word` (the batch free, or a
    /// single free with deferred clearing off).
    pub(crate) fn put_direct(&self, mask: u64) {
        // SeqCst: Release pairs with the next allocator's Acquire; SeqCst is
        // the store half of the handshake with a registering waiter.
        self.word.fetch_and(!mask, Ordering::SeqCst);
    }

    /// True when every bit of `mask` is busy in `word` and none is pending in
    /// `cleared`: the bits are held by someone (a debug ownership check).
    pub(crate) fn is_held(&self, mask: u64) -> bool {
        // Relaxed: diagnostic read; a held tag's bits cannot change under it.
        let busy = self.word.load(Ordering::Relaxed) & mask == mask;
        busy && self.clear.cleared.load(Ordering::Relaxed) & mask == 0
    }

    /// Number of held bits (busy in `word` and not pending in `cleared`);
    /// exact only when nothing runs concurrently.
    pub(crate) fn weight(&self, depth: u32) -> u32 {
        // Relaxed: a statistic.
        let busy = self.word.load(Ordering::Relaxed) & low_mask(depth);
        (busy & !self.clear.cleared.load(Ordering::Relaxed)).count_ones()
    }
}
