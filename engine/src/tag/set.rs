//! [`TagSet`]: the bitmap of one device's tags, its options and its errors
//! (the module invariants are the tag module's). Waiting for a tag is the
//! `acquire` module's; a tag set is shared by reference between cores.

use std::fmt;
use std::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use super::batch::{MaskTags, Tag, MAX_BATCH_TAGS};
use super::stats::{CoreSlot, TagStats};
use super::wait::{WaitQueues, MAX_AUTO_WAKE_BATCH, MAX_WAIT_QUEUES};
use super::word::{low_mask, SbWord};

/// Words of a tag set whose frees [`TagSet::put_batch`] gathers into one
/// `fetch_and` each, in any order (4096 tags at 64 bits per word).
pub const PUT_BATCH_WORDS: usize = 64;

/// The largest depth a [`TagSet`] accepts (1 Mi tags).
pub const MAX_DEPTH: u32 = 1 << 20;

/// How a [`TagSet`] allocates and frees. `Default` gives the kernel's
/// behaviour for a blk-mq hardware queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagOptions {
    /// Number of per-core hint/stat slots; core indexes passed to the tag set
    /// are taken modulo this. Default: `std::thread::available_parallelism()`
    /// (1 if unknown). Must be at least 1.
    pub nr_cores: usize,
    /// Hand tags out in increasing order from a per-core cursor, as the
    /// kernel's `round_robin` sbitmap does (which also never batches).
    /// Default: false.
    pub round_robin: bool,
    /// Take a flush's tags in batches of bits from one word (the engine's
    /// `tag_batch` ablation switch). Off: one tag per get. Default: true.
    pub batch: bool,
    /// Retry batch gets until the flush has all its tags or a batch get
    /// returns nothing (the 2025 "plug attempts to batch allocate tags
    /// multiple times" patch; the engine's `tag_batch_retry` switch). Off:
    /// one batch get, then single gets, as before that patch. Default: true.
    pub batch_retry: bool,
    /// Free a single tag into the word's `cleared` bits, which the next
    /// allocator that finds the word full moves back (kernel
    /// `sbitmap_deferred_clear_bit`). Off: clear the bit in the word
    /// directly. Batch frees always clear directly. Default: true.
    pub deferred_clear: bool,
    /// log2 of the bits per word, 0..=6. `None`: the kernel's
    /// `sbitmap_calculate_shift` rule (at least 4 words when depth >= 4).
    pub shift: Option<u32>,
    /// Tags freed per batch of wakeups, 1..=depth. `None`: the kernel's
    /// `clamp(depth / 8, 1, 8)`.
    pub wake_batch: Option<u32>,
    /// Number of wait queues waiters are spread over, 1..=8. Default: 8.
    pub wait_queues: usize,
}

impl Default for TagOptions {
    fn default() -> Self {
        Self {
            nr_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            round_robin: false,
            batch: true,
            batch_retry: true,
            deferred_clear: true,
            shift: None,
            wake_batch: None,
            wait_queues: MAX_WAIT_QUEUES,
        }
    }
}

/// Why a [`TagSet`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagError {
    /// The depth was 0.
    ZeroDepth,
    /// The depth was above [`MAX_DEPTH`].
    DepthTooLarge {
        /// The depth asked for.
        depth: u32,
    },
    /// [`TagOptions::nr_cores`] was 0.
    ZeroCores,
    /// [`TagOptions::shift`] was above 6 (64 bits per word).
    BadShift {
        /// The shift asked for.
        shift: u32,
    },
    /// [`TagOptions::wake_batch`] was 0 or above the depth (waiters could
    /// then wait for more frees than there are tags).
    BadWakeBatch {
        /// The wake batch asked for.
        wake_batch: u32,
        /// The depth of the set.
        depth: u32,
    },
    /// [`TagOptions::wait_queues`] was 0 or above [`MAX_WAIT_QUEUES`].
    BadWaitQueues {
        /// The number asked for.
        wait_queues: usize,
    },
}

impl fmt::Display for TagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroDepth => write!(f, "tag set depth must be at least 1"),
            Self::DepthTooLarge { depth } => {
                write!(f, "tag set depth {depth} is above the maximum {MAX_DEPTH}")
            }
            Self::ZeroCores => write!(f, "tag set needs at least 1 core slot"),
            Self::BadShift { shift } => {
                write!(f, "tag word shift {shift} is above 6 (64 bits per word)")
            }
            Self::BadWakeBatch { wake_batch, depth } => write!(
                f,
                "wake batch {wake_batch} must be in 1..={depth} (the tag set depth)"
            ),
            Self::BadWaitQueues { wait_queues } => write!(
                f,
                "wait queue count {wait_queues} must be in 1..={MAX_WAIT_QUEUES}"
            ),
        }
    }
}

impl std::error::Error for TagError {}

/// The kernel's `sbitmap_calculate_shift`: bits per word = the largest power
/// of two `<= depth / 4`, capped at 64 (so at least 4 words when depth >= 4).
pub fn calculate_shift(depth: u32) -> u32 {
    let mut shift = 6;
    if depth >= 4 {
        while (4u64 << shift) > u64::from(depth) {
            shift -= 1;
        }
    }
    shift
}

/// The kernel's `sbq_calc_wake_batch`: `clamp(depth / 8, 1, 8)`.
pub fn default_wake_batch(depth: u32) -> u32 {
    (depth / MAX_WAIT_QUEUES as u32).clamp(1, MAX_AUTO_WAKE_BATCH)
}

/// Appends to `out` the tags of a batch get's `(offset, mask)` (tag
/// `offset + i` for each set bit `i`, in increasing order, as
/// [`MaskTags`] yields them); returns how many. They are decoded into an
/// array on the stack first and appended as one slice, whose length is
/// known: a `Vec` reserves once and copies them, where the extend by
/// [`MaskTags`] (an iterator of unknown length to it) tested its capacity
/// and stored its length at each tag (13 instructions a tag, the flush's
/// tag take).
#[inline]
fn extend_mask(out: &mut impl Extend<Tag>, offset: u32, mask: u64) -> usize {
    let n = mask.count_ones() as usize;
    let mut decoded = [MaybeUninit::<Tag>::uninit(); MAX_BATCH_TAGS];
    let mut rest = mask;
    // `n` is at most 64, the mask's bits: the slice index cannot fail.
    for slot in &mut decoded[..n] {
        slot.write(Tag::new(offset + rest.trailing_zeros()));
        rest &= rest - 1;
    }
    debug_assert_eq!(rest, 0, "every bit of the mask decoded");
    debug_assert!(MaskTags { offset, mask }
        .zip(&decoded[..n])
        // SAFETY: the loop above wrote each of the first `n`.
        .all(|(a, b)| a == unsafe { b.assume_init() }));
    // SAFETY: the loop above wrote the first `n` elements, and
    // `MaybeUninit<Tag>` has `Tag`'s layout.
    let tags = unsafe { std::slice::from_raw_parts(decoded.as_ptr().cast::<Tag>(), n) };
    out.extend(tags.iter().copied());
    n
}

/// The tags a [`TagPuts`] gathers as bits (the first 64 chunks of 64).
const PUT_GATHER_TAGS: u32 = 64 * PUT_BATCH_WORDS as u32;

/// Tags to free together, gathered one at a time as bits of the set's tag
/// space (made by [`TagSet::gather_puts`], freed by
/// [`TagSet::put_gathered`]): adding a tag sets its bit, with one test of
/// its range, where a list of them was appended to and gathered per word
/// again by [`TagSet::put_batch`].
#[derive(Debug)]
pub struct TagPuts<'a> {
    /// Bit `i` of `chunks[c]`: tag `64 * c + i` is to be freed. Only the
    /// first `limit.div_ceil(64)` can have bits.
    chunks: [u64; PUT_BATCH_WORDS],
    /// Tags below this go in `chunks`: the set's depth, at most
    /// `64 * PUT_BATCH_WORDS`.
    limit: u32,
    /// The set's depth (a tag at or past it is out of range).
    depth: u32,
    /// The last tag added that is in the set's range (the hint of the put);
    /// `NO_TAG` while none is.
    last: u32,
    /// Tags at or past `limit`, in the order they were added (a list the
    /// caller keeps, so a set that has such tags allocates it once).
    rest: &'a mut Vec<Tag>,
}

/// [`TagPuts::last`] before a tag in range is added (above [`MAX_DEPTH`]).
const NO_TAG: u32 = u32::MAX;

impl TagPuts<'_> {
    /// Adds `tag`, which its holder frees (at most once per `TagPuts`).
    #[inline(always)]
    pub fn add(&mut self, tag: Tag) {
        let nr = tag.as_u32();
        if nr < self.limit {
            // `limit` is at most `64 * PUT_BATCH_WORDS`: the chunk is one of
            // them (the mask costs no more than the bounds check it saves).
            let chunk = (nr >> 6) as usize % PUT_BATCH_WORDS;
            debug_assert!(
                self.chunks[chunk] & (1 << (nr & 63)) == 0,
                "{tag} put twice in one batch"
            );
            self.chunks[chunk] |= 1 << (nr & 63);
            self.last = nr;
        } else {
            self.add_rest(tag);
        }
    }

    /// A tag at or past `limit` (a set of more than `64 * PUT_BATCH_WORDS`
    /// tags, or out of range, which the put logs).
    #[cold]
    #[inline(never)]
    fn add_rest(&mut self, tag: Tag) {
        debug_assert!(!self.rest.contains(&tag), "{tag} put twice in one batch");
        self.rest.push(tag);
        // The hint takes only a tag in range (the put logs the others).
        if tag.as_u32() < self.depth {
            self.last = tag.as_u32();
        }
    }

    /// The chunks that can have bits (those of tags below `limit`).
    #[inline]
    fn used_chunks(&self) -> &[u64] {
        // At most `PUT_BATCH_WORDS`, as `limit` is at most 64 times that.
        &self.chunks[..self.limit.div_ceil(64) as usize]
    }

    /// True when no tag was added.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.last == NO_TAG && self.rest.is_empty()
    }

    /// How many tags were added: a count of the bits of the used chunks
    /// (with no `popcnt` in the baseline x86-64 target, some 15
    /// instructions a chunk), so the completion counts once and passes
    /// the count to [`TagSet::put_gathered`].
    #[inline]
    pub fn len(&self) -> usize {
        let gathered: u32 = self.used_chunks().iter().map(|c| c.count_ones()).sum();
        gathered as usize + self.rest.len()
    }
}

/// A device's tag bitmap with batch get, deferred free and async waiters
/// (the kernel's `sbitmap_queue`). Shared by reference between cores
/// (`Sync`); each caller passes its core index for the per-core start hint.
#[derive(Debug)]
pub struct TagSet {
    depth: u32,
    shift: u32,
    words: Box<[SbWord]>,
    cores: Box<[CachePadded<CoreSlot>]>,
    pub(super) waiters: WaitQueues,
    options: TagOptions,
}

impl TagSet {
    /// A tag set of `depth` tags, all free.
    ///
    /// # Errors
    /// [`TagError`] when `depth` is 0 or above [`MAX_DEPTH`], or an option is
    /// out of its documented range.
    pub fn new(depth: u32, options: TagOptions) -> Result<Self, TagError> {
        let shift = Self::check(depth, &options)?;
        let bits_per_word = 1u32 << shift;
        let nr_words = depth.div_ceil(bits_per_word);
        let wake_batch = options.wake_batch.unwrap_or(default_wake_batch(depth));
        let cores: Box<[CachePadded<CoreSlot>]> = (0..options.nr_cores)
            .map(|_| CachePadded::new(CoreSlot::default()))
            .collect();
        if !options.round_robin {
            // Spread cores over the words (the kernel uses a random start per
            // CPU; a spread is as good and reproducible).
            for (core, slot) in cores.iter().enumerate() {
                let word = core as u64 * u64::from(nr_words) / options.nr_cores as u64;
                slot.set_hint((word as u32) << shift);
            }
        }
        Ok(Self {
            depth,
            shift,
            words: (0..nr_words).map(|_| SbWord::new()).collect(),
            cores,
            waiters: WaitQueues::new(options.wait_queues, wake_batch),
            options,
        })
    }

    /// Validates the arguments; returns the word shift.
    fn check(depth: u32, options: &TagOptions) -> Result<u32, TagError> {
        if depth == 0 {
            return Err(TagError::ZeroDepth);
        }
        if depth > MAX_DEPTH {
            return Err(TagError::DepthTooLarge { depth });
        }
        if options.nr_cores == 0 {
            return Err(TagError::ZeroCores);
        }
        if !(1..=MAX_WAIT_QUEUES).contains(&options.wait_queues) {
            return Err(TagError::BadWaitQueues {
                wait_queues: options.wait_queues,
            });
        }
        if let Some(wake_batch) = options.wake_batch {
            if wake_batch == 0 || wake_batch > depth {
                return Err(TagError::BadWakeBatch { wake_batch, depth });
            }
        }
        match options.shift {
            Some(shift) if shift > 6 => Err(TagError::BadShift { shift }),
            Some(shift) => Ok(shift),
            None => Ok(calculate_shift(depth)),
        }
    }

    /// Number of tags.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Bits per word (a power of two, 1..=64).
    pub fn bits_per_word(&self) -> u32 {
        1 << self.shift
    }

    /// Number of `AtomicU64` words.
    pub fn nr_words(&self) -> usize {
        self.words.len()
    }

    /// Tags freed per batch of wakeups.
    pub fn wake_batch(&self) -> u32 {
        self.waiters.wake_batch() as u32
    }

    /// The options the set was built with.
    pub fn options(&self) -> &TagOptions {
        &self.options
    }

    /// Tags currently held (sums the words; exact only when nothing runs
    /// concurrently, like the kernel's `sbitmap_weight`).
    pub fn busy(&self) -> u32 {
        (0..self.words.len())
            .map(|index| self.words[index].weight(self.word_depth(index)))
            .sum()
    }

    /// Waiters parked and not yet woken (exact only when quiet).
    pub fn waiters_queued(&self) -> usize {
        self.waiters.queued()
    }

    /// The counters summed over cores.
    pub fn stats(&self) -> TagStats {
        let mut stats = TagStats::default();
        self.cores.iter().for_each(|slot| stats.add_core(slot));
        stats
    }

    /// Usable bits of word `index` (the last word holds the remainder).
    fn word_depth(&self, index: usize) -> u32 {
        let start = (index as u32) << self.shift;
        (self.depth - start).min(1 << self.shift)
    }

    #[inline]
    pub(super) fn core_slot(&self, core: usize) -> &CoreSlot {
        // A compare instead of a division on the hot path: callers normally
        // pass an index below `nr_cores`.
        let index = if core < self.cores.len() {
            core
        } else {
            core % self.cores.len()
        };
        &self.cores[index]
    }

    /// The core's hint, re-seeded when out of range (a resize would do it).
    fn hint(&self, slot: &CoreSlot) -> u32 {
        let hint = slot.hint();
        if hint < self.depth {
            hint
        } else {
            slot.set_hint(0);
            0
        }
    }

    /// `update_alloc_hint_after_get`, with the wrap fixed to `>= depth`.
    fn update_hint_after_get(&self, slot: &CoreSlot, hint: u32, nr: Option<u32>) {
        match nr {
            None => slot.set_hint(0),
            Some(nr) if nr == hint || self.options.round_robin => {
                let next = nr + 1;
                slot.set_hint(if next >= self.depth { 0 } else { next });
            }
            Some(_) => {}
        }
    }

    /// Takes one free tag (`sbitmap_queue_get` / `__sbitmap_get`), starting
    /// at `core`'s hint word. `None` when every tag is held.
    pub fn get(&self, core: usize) -> Option<Tag> {
        let slot = self.core_slot(core);
        let hint = self.hint(slot);
        let round_robin = self.options.round_robin;
        let mut index = (hint >> self.shift) as usize;
        let mut bit = if round_robin {
            hint & (self.bits_per_word() - 1)
        } else {
            0
        };
        // Round robin starts mid-word without wrapping; one more pass
        // revisits that word's low bits (the kernel skips them).
        let passes = self.words.len() + usize::from(bit != 0);
        let mut found = None;
        for _ in 0..passes {
            let word_depth = self.word_depth(index);
            if let Some(b) = self.words[index].get_bit(word_depth, bit, !round_robin) {
                found = Some(((index as u32) << self.shift) + b);
                break;
            }
            bit = 0;
            index = (index + 1) % self.words.len();
        }
        self.update_hint_after_get(slot, hint, found);
        slot.single_calls.add(1);
        slot.single_tags.add(u64::from(found.is_some()));
        found.map(Tag::new)
    }

    /// Takes up to `nr` tags from ONE word (`__sbitmap_queue_get_batch`):
    /// returns `(offset, mask)` where bit `i` of `mask` is tag `offset + i`.
    /// The window is `min(nr, 64, word depth)` bits starting at the word's
    /// first free bit; only the bits of it that were free are returned, so
    /// `mask` has 1..=nr bits, not necessarily contiguous. A word whose
    /// window does not fit is skipped. `None` when `nr == 0`, the set is
    /// round robin (which never batches, as in the kernel), or no word could
    /// give a tag.
    pub fn get_batch(&self, core: usize, nr: u32) -> Option<(u32, u64)> {
        if nr == 0 || self.options.round_robin {
            return None;
        }
        let nr = nr.min(self.bits_per_word());
        let slot = self.core_slot(core);
        let hint = self.hint(slot);
        let mut index = (hint >> self.shift) as usize;
        slot.batch_calls.add(1);
        for _ in 0..self.words.len() {
            let word_depth = self.word_depth(index);
            if let Some((mask, first)) = self.words[index].get_bits(word_depth, nr) {
                let offset = ((index as u32) << self.shift) + first;
                let last = offset + nr.min(word_depth) - 1;
                self.update_hint_after_get(slot, hint, Some(last));
                let got = mask.count_ones();
                slot.batch_tags.add(u64::from(got));
                slot.partial_batches.add(u64::from(got < nr));
                return Some((offset, mask));
            }
            index = (index + 1) % self.words.len();
        }
        slot.empty_batches.add(1);
        None
    }

    /// The 2025 retry loop: batch gets until `nr` tags are held or a batch
    /// get returns nothing. Appends the tags to `out`; returns how many.
    /// Returns 0 on a round-robin set (it never batches).
    pub fn get_batch_retry(&self, core: usize, nr: usize, out: &mut impl Extend<Tag>) -> usize {
        let mut got = 0;
        while got < nr {
            let want = (nr - got).min(MAX_BATCH_TAGS) as u32;
            match self.get_batch(core, want) {
                Some((offset, mask)) => got += extend_mask(out, offset, mask),
                None => break,
            }
        }
        got
    }

    /// Takes up to `nr` tags without waiting, the way a plug flush does:
    /// with [`TagOptions::batch`] and [`TagOptions::batch_retry`], the retry
    /// loop; with batch only, one batch get; then single gets for the rest
    /// until the bitmap runs dry. Without batch, single gets only. Appends to
    /// `out`; returns how many (0 when every tag is held).
    pub fn get_tags(&self, core: usize, nr: usize, out: &mut impl Extend<Tag>) -> usize {
        if nr == 0 {
            return 0;
        }
        let mut got = 0;
        if self.options.batch && !self.options.round_robin && nr > 1 {
            got = if self.options.batch_retry {
                self.get_batch_retry(core, nr, out)
            } else {
                self.get_batch(core, nr.min(MAX_BATCH_TAGS) as u32)
                    .map_or(0, |(offset, mask)| extend_mask(out, offset, mask))
            };
        }
        while got < nr {
            match self.get(core) {
                Some(tag) => {
                    out.extend(std::iter::once(tag));
                    got += 1;
                }
                None => break,
            }
        }
        if got < nr {
            self.core_slot(core).short_allocs.add(1);
        }
        got
    }

    /// Splits a tag into (word index, bit), or `None` when out of range
    /// (a debug assertion: only tags from this set may be put back).
    #[inline]
    fn locate(&self, tag: Tag) -> Option<(usize, u32)> {
        let nr = tag.as_u32();
        if nr >= self.depth {
            self.out_of_range(tag);
            return None;
        }
        Some(((nr >> self.shift) as usize, nr & (self.bits_per_word() - 1)))
    }

    #[cold]
    fn out_of_range(&self, tag: Tag) {
        debug_assert!(false, "put of {tag} outside depth {}", self.depth);
        tracing::error!(
            tag = tag.as_u32(),
            depth = self.depth,
            "put of an out-of-range tag ignored"
        );
    }

    /// Frees one tag (`sbitmap_queue_clear`): a deferred clear (or a direct
    /// one with [`TagOptions::deferred_clear`] off), then a batched wakeup
    /// of waiters, then `core`'s hint is pointed at the tag (pass the core
    /// that allocated it, as the kernel does).
    ///
    /// Putting a tag that is not held is a bug: a debug assertion fails; in
    /// release builds an out-of-range tag is ignored (logged) and a double
    /// put corrupts only this set's accounting.
    pub fn put(&self, core: usize, tag: Tag) {
        let Some((index, bit)) = self.locate(tag) else {
            return;
        };
        let word = &self.words[index];
        debug_assert!(word.is_held(1 << bit), "put of {tag}, which is not held");
        if self.options.deferred_clear {
            word.put_deferred(bit);
        } else {
            word.put_direct(1 << bit);
        }
        self.after_puts(core, tag.as_u32(), 1);
    }

    /// What every put does once its bits are cleared: one wakeup call for
    /// the `freed` tags, `core`'s hint at `last` (unless round-robin) and
    /// the per-core put count.
    #[inline]
    fn after_puts(&self, core: usize, last: u32, freed: usize) {
        self.waiters.wake_up(freed);
        let slot = self.core_slot(core);
        if !self.options.round_robin {
            slot.set_hint(last);
        }
        slot.puts.add(freed as u64);
    }

    /// Frees many tags (`sbitmap_queue_clear_batch`): the tags' bits are
    /// gathered per word first, so each word gets one `fetch_and` whatever
    /// the order of `tags` (for the first [`PUT_BATCH_WORDS`] words; tags
    /// in later words go in runs of one word), then one wakeup call for all
    /// of them; `core`'s hint goes to the last tag. Same rules as
    /// [`put`](Self::put) for tags that are not held.
    pub fn put_batch(&self, core: usize, tags: &[Tag]) {
        let mut masks = [0u64; PUT_BATCH_WORDS];
        let mut touched = 0u64;
        let mut run: Option<(usize, u64)> = None;
        // Out-of-range tags are a bug (logged and skipped): counted apart,
        // so the loop keeps neither a count nor the last tag freed.
        let mut skipped = 0usize;
        let (depth, shift) = (self.depth, self.shift);
        let low = self.bits_per_word() - 1;
        for &tag in tags {
            let nr = tag.as_u32();
            if nr >= depth {
                self.out_of_range(tag);
                skipped += 1;
                continue;
            }
            let (index, bit) = ((nr >> shift) as usize, nr & low);
            let bit_mask = 1u64 << bit;
            debug_assert!(
                self.words[index].is_held(bit_mask),
                "put of {tag}, which is not held"
            );
            if index < PUT_BATCH_WORDS {
                debug_assert!(masks[index] & bit_mask == 0, "{tag} put twice in one batch");
                masks[index] |= bit_mask;
                touched |= 1 << index;
            } else {
                self.put_run(&mut run, index, bit_mask);
            }
        }
        while touched != 0 {
            let index = touched.trailing_zeros() as usize;
            touched &= touched - 1;
            self.words[index].put_direct(masks[index]);
        }
        if let Some((index, mask)) = run {
            self.words[index].put_direct(mask);
        }
        let freed = tags.len() - skipped;
        if freed == 0 {
            return;
        }
        let last = if skipped == 0 {
            tags[tags.len() - 1]
        } else {
            Self::last_in_range(tags, depth)
        };
        self.after_puts(core, last.as_u32(), freed);
    }

    /// An empty [`TagPuts`] for this set: tags are added to it one at a
    /// time as their requests complete, and freed together by
    /// [`put_gathered`](Self::put_gathered). `rest` holds those of its
    /// tags that are not gathered as bits (it is emptied first).
    #[inline]
    pub fn gather_puts<'a>(&self, rest: &'a mut Vec<Tag>) -> TagPuts<'a> {
        rest.clear();
        TagPuts {
            chunks: [0; PUT_BATCH_WORDS],
            limit: self.depth.min(PUT_GATHER_TAGS),
            depth: self.depth,
            last: NO_TAG,
            rest,
        }
    }

    /// Frees the tags gathered in `puts` (a [`TagPuts`] of this set), as
    /// [`put_batch`](Self::put_batch) of them in the order they were
    /// added does: each word's bits with one `fetch_and` (in increasing
    /// word order), one wakeup call for all of them, and `core`'s hint at
    /// the last tag added that is in range. Out-of-range tags are logged
    /// and skipped. `added` is how many tags were added
    /// ([`TagPuts::len`]). Returns how many tags were freed.
    pub fn put_gathered(&self, core: usize, puts: &TagPuts<'_>, added: usize) -> usize {
        debug_assert_eq!(puts.depth, self.depth, "a TagPuts of another set");
        debug_assert_eq!(added, puts.len(), "the count of the tags added");
        let shift = self.shift;
        let low = low_mask(1 << shift);
        let mut freed = added;
        for (chunk, &chunk_bits) in puts.used_chunks().iter().enumerate() {
            let mut bits = chunk_bits;
            // A chunk holds 64 tags: one word's bits, or those of several
            // words (`64 >> shift` of them).
            let base = chunk << (6 - shift);
            while bits != 0 {
                let sub = bits.trailing_zeros() >> shift;
                let at = sub << shift;
                let mask = (bits >> at) & low;
                let index = base + sub as usize;
                debug_assert!(
                    self.words[index].is_held(mask),
                    "put of a tag of word {index}, which is not held"
                );
                self.words[index].put_direct(mask);
                bits &= !(mask << at);
            }
        }
        if !puts.rest.is_empty() {
            // Those out of range are not freed.
            freed -= puts.rest.len() - self.put_rest(puts.rest);
        }
        if puts.last == NO_TAG {
            return 0;
        }
        self.after_puts(core, puts.last, freed);
        freed
    }

    /// The tags of a [`TagPuts`] at or past its limit (in words past the
    /// first [`PUT_BATCH_WORDS`] chunks of 64 tags, or out of range): in
    /// runs of one word, as [`put_batch`](Self::put_batch) frees them;
    /// returns how many were in range.
    #[cold]
    #[inline(never)]
    fn put_rest(&self, tags: &[Tag]) -> usize {
        let mut run: Option<(usize, u64)> = None;
        let mut freed = 0;
        for &tag in tags {
            let Some((index, bit)) = self.locate(tag) else {
                continue;
            };
            debug_assert!(
                self.words[index].is_held(1 << bit),
                "put of {tag}, which is not held"
            );
            self.put_run(&mut run, index, 1 << bit);
            freed += 1;
        }
        if let Some((index, mask)) = run {
            self.words[index].put_direct(mask);
        }
        freed
    }

    /// A tag of a word past the first [`PUT_BATCH_WORDS`] (only sets of
    /// more words than that): joins the run of its word, or frees the run before it
    /// and starts its own. Out of line, so the common loop keeps no run.
    #[cold]
    #[inline(never)]
    fn put_run(&self, run: &mut Option<(usize, u64)>, index: usize, bit_mask: u64) {
        *run = match *run {
            Some((run_index, mask)) if run_index == index => Some((index, mask | bit_mask)),
            Some((run_index, mask)) => {
                self.words[run_index].put_direct(mask);
                Some((index, bit_mask))
            }
            None => Some((index, bit_mask)),
        };
    }

    /// The last tag of `tags` below `depth` (a batch that held an
    /// out-of-range tag; at least one is in range).
    #[cold]
    fn last_in_range(tags: &[Tag], depth: u32) -> Tag {
        *tags
            .iter()
            .rev()
            .find(|t| t.as_u32() < depth)
            .expect("a tag in range")
    }

    /// Wakes every parked waiter (`sbitmap_queue_wake_all`), e.g. at
    /// shutdown or after a depth change. Returns how many were woken.
    pub fn wake_all(&self) -> usize {
        self.waiters.wake_all()
    }
}
