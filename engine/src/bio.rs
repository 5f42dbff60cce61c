//! Bios: one IO as a caller issued it, kept in a per-core table.
//!
//! Invariants:
//! - A bio lives in the [`BioTable`] of the core whose task issued it and is
//!   only touched on that core's thread. Its [`BioId`] is an index plus a
//!   generation, so a stale id (a future polled after its slot was reused)
//!   is detected, never aliased.
//! - A bio's memory belongs to the kernel from issue until the bio
//!   completes: the bio holds only its addresses ([`BioBuf`]); the IO's
//!   future owns the buffers while it lives, and a future dropped before
//!   the bio completes moves them into the bio ([`BioCold::keep`]), so neither
//!   the drop nor shutdown frees memory the kernel may still use. An
//!   orphaned bio (its future was dropped) is released, with what it
//!   keeps, by the completion path; what it keeps (the caller's buffer
//!   type) is dropped only once no borrow of the core's tables is held
//!   ([`bury_kept`], [`drop_buried`]): its `Drop` is the caller's code and
//!   may issue IO or take a plug on this core. A panic there is caught,
//!   not unwound through the core.
//! - A bio completes exactly once: `parts_left` counts its requests still in
//!   flight; the result is published when it reaches zero.
//! - Freed slots go on a free list and are reused (the steady state does
//!   not allocate per IO); the table only grows.

use std::task::Waker;

use plugio_device::{Error, IoFlags, OpKind};
use smallvec::SmallVec;

/// Names a bio in its core's [`BioTable`]: slot index and generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BioId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

/// One contiguous piece of memory an IO covers: an address and a length
/// in bytes. Only numbers: whoever made the bio keeps the memory alive
/// (the IO's future, or the bio's `keep` once the future is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seg {
    pub addr: usize,
    pub len: usize,
}

/// The memory a bio reads into or writes from, as addresses: the buffers
/// themselves (the caller's, or a bounce buffer) are owned by the IO's
/// future (see [`crate::buf`]), or by [`BioCold::keep`] after the future was
/// dropped mid-IO. Plain numbers except `Many`'s vector.
#[derive(Debug, Default)]
pub(crate) enum BioBuf {
    /// No data (flush, discard, write zeroes).
    #[default]
    None,
    /// One buffer: the IO covers all of `seg`. `fixed`: the registered
    /// buffer it lies in on this core's ring (`READ_FIXED`/`WRITE_FIXED`).
    One { seg: Seg, fixed: Option<u16> },
    /// Several buffers in order (readv/writev).
    Many(Vec<Seg>),
}

impl BioBuf {
    /// The registered buffer the memory lies in (one buffer only).
    #[inline]
    pub fn fixed(&self) -> Option<u16> {
        match self {
            BioBuf::One { fixed, .. } => *fixed,
            _ => None,
        }
    }

    /// Number of segments (buffers) the data is in.
    pub fn nr_segs(&self) -> usize {
        match self {
            BioBuf::None => 0,
            BioBuf::One { .. } => 1,
            BioBuf::Many(v) => v.len(),
        }
    }

    /// [`BioBuf::first_iovec`] and [`BioBuf::fixed`] with one test of the
    /// kind (the fast lane's send reads both).
    #[inline(always)]
    pub(crate) fn one_iovec(&self) -> (libc::iovec, Option<u16>) {
        let (addr, len, fixed) = match self {
            BioBuf::One { seg, fixed } => (seg.addr, seg.len, *fixed),
            _ => (0, 0, None),
        };
        let iovec = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        (iovec, fixed)
    }

    /// The whole of a one-buffer bio as one iovec; an empty iovec for the
    /// others.
    #[inline]
    pub(crate) fn first_iovec(&self) -> libc::iovec {
        self.one_iovec().0
    }

    /// [`BioBuf::push_iovecs`] of a piece that is all of a one-buffer
    /// bio, the case of every bio a merge joins whole (a sequential
    /// stream's), inlined: appends its iovec and returns its registered
    /// buffer. `None`, with nothing appended, for any other piece.
    #[inline(always)]
    pub(crate) fn push_whole_one(
        &self,
        from: u64,
        len: u64,
        out: &mut Vec<libc::iovec>,
    ) -> Option<Option<u16>> {
        match self {
            BioBuf::One { seg, fixed } if from == 0 && len == seg.len as u64 && len > 0 => {
                append_iovec(seg.addr, len, out);
                Some(*fixed)
            }
            _ => None,
        }
    }

    /// Appends `(address, len)` of the byte range `[from, from + len)` of
    /// this buffer list, as iovecs, to `out`. All of one buffer (a merged
    /// bio, the common case) takes no range walk.
    #[inline]
    pub(crate) fn push_iovecs(&self, from: u64, len: u64, out: &mut Vec<libc::iovec>) {
        let segs: &[Seg] = match self {
            BioBuf::None => &[],
            BioBuf::One { seg, .. } if from == 0 && len == seg.len as u64 => {
                push_segment(seg.addr, 0, len, out);
                return;
            }
            BioBuf::One { seg, .. } => std::slice::from_ref(seg),
            BioBuf::Many(v) => v,
        };
        let (mut skip, mut left) = (from, len);
        for s in segs {
            let slen = s.len as u64;
            if skip >= slen {
                skip -= slen;
                continue;
            }
            let take = (slen - skip).min(left);
            if take == 0 {
                break;
            }
            push_segment(s.addr, skip, take, out);
            left -= take;
            skip = 0;
            if left == 0 {
                break;
            }
        }
    }
}

/// Appends `[base + skip, base + skip + len)` to `out`, joined with the
/// previous segment when they are adjacent in memory (pages of one region
/// read into consecutive frames become one segment). Empty ranges add
/// nothing, so no request ever carries an empty segment.
fn push_segment(base: usize, skip: u64, len: u64, out: &mut Vec<libc::iovec>) {
    if len == 0 {
        return;
    }
    append_iovec(base + skip as usize, len, out);
}

/// [`push_segment`] of a non-empty range at `start`, inlined where a
/// request's iovecs are built from whole one-buffer bios
/// ([`BioBuf::push_whole_one`]).
#[inline(always)]
fn append_iovec(start: usize, len: u64, out: &mut Vec<libc::iovec>) {
    debug_assert!(len > 0);
    match out.last_mut() {
        Some(prev) if prev.iov_base as usize + prev.iov_len == start => {
            prev.iov_len += len as usize;
        }
        _ => out.push(libc::iovec {
            iov_base: start as *mut libc::c_void,
            iov_len: len as usize,
        }),
    }
}

/// Memory a bio keeps alive for the kernel after its future was dropped
/// mid-IO (the caller's buffer, a bounce buffer).
pub(crate) type Keep = Box<dyn std::any::Any + Send>;

/// What an IO is, without its memory: what the plug and the merge rules
/// look at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BioInfo {
    pub op: OpKind,
    pub flags: IoFlags,
    pub offset_bytes: u64,
    pub len_bytes: u64,
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

/// One bio slot: 128 bytes (checked when the crate compiles; the split and
/// orphan state is boxed in [`BioCold`]), so two or three cache lines
/// where the 16-byte aligned heap puts it. Not aligned to a line: a boxed
/// over-aligned type takes glibc's `memalign` path, which cost 20 % of the
/// NOP rate with the bio cache off (a bio allocated per IO).
#[derive(Debug)]
pub(crate) struct Bio {
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
    /// What only split or orphaned bios need (see [`BioCold`]); made on
    /// first use and kept with the bio for its reuse.
    pub cold: Option<Box<BioCold>>,
    /// Bytes transferred (unsplit bios) or the computed prefix (split ones).
    pub done_bytes: u64,
    pub error: Option<Error>,
    pub waker: Option<Waker>,
    /// The future was dropped: release the slot when the bio completes.
    pub orphaned: bool,
    /// Keep this bio for reuse when it is freed (the bio cache).
    pub cached: bool,
    /// Dispatched without a request (the fast lane, see
    /// [`crate::queue::FAST`]): the tag it holds, and when it went
    /// (iostats).
    pub tag: crate::tag::Tag,
    pub start_ns: u64,
    /// A fast-lane bio sent while a write was live: the slot of its node
    /// in the interval index (state `Lane`); `NIL` otherwise (set at
    /// [`BioTable::alloc`]).
    pub lane: u32,
}

// 128 bytes: a field added to `Bio` that makes it larger belongs in
// `BioCold` unless the common path touches it.
const _: () = assert!(std::mem::size_of::<Bio>() == 128);

impl Bio {
    fn empty() -> Self {
        Self {
            state: BioState::Free,
            dev: 0,
            op: OpKind::Nop,
            flags: IoFlags::NONE,
            offset_bytes: 0,
            len_bytes: 0,
            buf: BioBuf::None,
            parts_left: 0,
            split: false,
            cold: None,
            done_bytes: 0,
            error: None,
            waker: None,
            orphaned: false,
            cached: false,
            tag: crate::tag::Tag::new(0),
            start_ns: 0,
            lane: crate::interval::NIL,
        }
    }

    /// Sets the buffer of a fresh bio (whose buffer is empty: nothing to
    /// drop, so no drop call on the hot path).
    #[inline]
    pub(crate) fn set_buf(&mut self, buf: BioBuf) {
        debug_assert!(
            matches!(self.buf, BioBuf::None),
            "a fresh bio holds no buffer"
        );
        if matches!(buf, BioBuf::None) {
            // Already so: no store (an IO without memory, whose caller's
            // `None` is a constant, loses the test too).
            return;
        }
        let old = std::mem::replace(&mut self.buf, buf);
        debug_assert!(matches!(old, BioBuf::None), "a fresh bio holds no buffer");
        // `BioBuf::None` owns nothing: forgotten without the test of its
        // kind that `forget_if_none` makes (a fresh bio's buffer is always
        // `None`: `Bio::empty` and `reset` leave it so).
        std::mem::forget(old);
    }

    /// Sets the waker of a fresh bio (whose waker is empty: nothing to
    /// drop, so no test of the old one on the hot path).
    #[inline]
    pub(crate) fn set_waker(&mut self, waker: Waker) {
        let old = self.waker.replace(waker);
        debug_assert!(old.is_none(), "a fresh bio holds no waker");
        // `None` owns nothing: forgotten without a test (a fresh bio's
        // waker is always `None`: `Bio::empty` and `reset` leave it so).
        std::mem::forget(old);
    }

    /// Records the completion of one part: `asked` bytes at `bio_offset`
    /// within the bio, `result` bytes or a negative errno. Returns true when
    /// this was the last part.
    #[inline(always)]
    pub(crate) fn complete_part(&mut self, bio_offset: u64, asked: u64, result: i64) -> bool {
        if result < 0 {
            self.fail_part(result);
        } else if self.split {
            self.record_part(bio_offset, result as u64, asked);
        } else {
            self.done_bytes = result as u64;
        }
        self.parts_left -= 1;
        if self.parts_left > 0 {
            return false;
        }
        if self.split {
            self.end_split();
        }
        self.state = BioState::Done;
        true
    }

    /// Records a completed part of a split bio.
    #[cold]
    fn record_part(&mut self, bio_offset: u64, done: u64, asked: u64) {
        self.cold_mut().parts.push((bio_offset, done, asked));
    }

    /// The last part of a split bio came: its result is the prefix its
    /// parts transferred.
    ///
    /// A bio whose later part found no space (`ENOSPC`, `EDQUOT`), or
    /// the process's file size limit (`EFBIG`, where `SIGXFSZ` is ignored
    /// or handled: the kernel cuts a write that crosses the limit short
    /// there and fails the rest), after its first bytes landed (a short
    /// count resumed, or the earlier requests of a split) ends with those
    /// bytes, as `pwrite(2)` returns a short count once the file system is
    /// full or the limit is reached; a later write there reports the
    /// error. Only where nothing landed past those
    /// bytes: a split's requests run side by side, and one after the
    /// refused one may have landed (a file system allocating out of
    /// order, or overwriting blocks it had), so the count would say less
    /// than was written; the bio then fails as a whole, its outcome
    /// unknown past the error (found by a break-it helper). Other errors
    /// fail the bio too: how far a device got before a bad block depends
    /// on how bios were merged, and merging never changes a result.
    #[cold]
    fn end_split(&mut self) {
        let parts = &mut self.cold_mut().parts;
        let prefix = transferred_prefix(parts);
        let landed: u64 = parts.iter().map(|p| p.1).sum();
        self.done_bytes = prefix;
        let full = |e: &Error| {
            matches!(
                e.kind(),
                plugio_device::ErrorKind::OutOfSpace
                    | plugio_device::ErrorKind::Io { errno: libc::EFBIG }
            )
        };
        if prefix > 0 && landed == prefix && self.error.as_ref().is_some_and(full) {
            self.error = None;
        }
        // The parts are spent: a done bio's cold part is empty, so the
        // hot free of its result ([`reset_done`]) skips it.
        self.cold_mut().parts.clear();
    }
}

/// The part of a [`Bio`] that only split or orphaned bios use, boxed so
/// that the bio itself stays at 128 bytes (its hot fields are touched at
/// issue, dispatch and completion; with 128 IOs in flight a core's bios do
/// not all stay in the L1, so each line is a miss per IO).
#[derive(Debug, Default)]
pub(crate) struct BioCold {
    /// `(offset within the bio, bytes done, bytes asked)` per completed
    /// part of a split bio, to compute the prefix that was transferred.
    /// Four inline, so that a bio split in up to four requests costs no
    /// allocation beyond this box (with the bio cache off, a split bio
    /// allocates the bio and this box, as it allocated the bio and a vector
    /// before the box).
    pub parts: SmallVec<[(u64, u64, u64); 4]>,
    /// The memory of an orphaned bio, freed with the bio.
    pub keep: Option<Keep>,
}

impl Bio {
    /// The cold part, made on first use (a split or an orphaning: not the
    /// common path).
    #[inline]
    pub(crate) fn cold_mut(&mut self) -> &mut BioCold {
        self.cold.get_or_insert_with(Box::default)
    }

    /// Orphans the bio: its future was dropped, `keep` (if any) holds its
    /// memory until the bio completes, and nobody waits for it. Returns
    /// the waker it held, for the caller to drop once it holds no borrow
    /// of the core's tables: a waker's drop is the caller's code, which
    /// may issue IO (found by a break-it helper).
    #[must_use = "drop the waker after the core's tables are released"]
    pub(crate) fn orphan(&mut self, keep: Option<Keep>) -> Option<Waker> {
        self.orphaned = true;
        if keep.is_some() {
            self.cold_mut().keep = keep;
        }
        self.waker.take()
    }

    /// Keeps the first error of the bio's parts (`result`, a negative
    /// errno).
    #[cold]
    fn fail_part(&mut self, result: i64) {
        if self.error.is_none() {
            self.error = Some(Error::from_errno(result as i32));
        }
    }
}

/// Resets a bio that is being freed (its result taken or dropped) to
/// the state `BioTable::alloc` hands out, dropping what it still holds
/// (on the common path nothing: the waker and the error were taken, and a
/// one-buffer bio only names its memory). Returns whether the bio may be
/// kept for reuse (it was allocated with the cache on).
#[inline(always)]
fn reset(bio: &mut Bio) -> bool {
    // Taken on the common path (by `take_result`, whose own reset skips
    // this test): checked, not dropped, here.
    if bio.error.is_some() {
        bio.error = None;
    }
    reset_without_error(bio)
}

/// [`reset`] of a bio whose error was taken.
#[inline(always)]
fn reset_without_error(bio: &mut Bio) -> bool {
    debug_assert!(bio.error.is_none(), "the bio's error was taken");
    bio.state = BioState::Free;
    if !matches!(bio.buf, BioBuf::None) {
        forget_if_none(std::mem::take(&mut bio.buf));
    }
    if let Some(cold) = bio.cold.as_deref_mut() {
        cold.parts.clear();
        if cold.keep.is_some() {
            bury_kept(cold.keep.take());
        }
    }
    bio.split = false;
    // Taken on the common path (by the completion): checked, not dropped,
    // here.
    if bio.waker.is_some() {
        bio.waker = None;
    }
    bio.orphaned = false;
    bio.done_bytes = 0;
    bio.cached
}

/// [`reset`] of a `Done` bio whose result (its error) was taken: its
/// future's second poll, the hot path. Such a bio holds no waker (every
/// completion that ends a bio takes it: `complete.rs`, the cancel of
/// `core.rs`), is not orphaned (an orphaned bio is freed when it ends)
/// and its cold part holds nothing ([`Bio::end_split`] emptied a split's
/// parts; only an orphan keeps memory): three tests and a store fewer
/// than [`reset_without_error`], each checked in debug builds.
#[inline(always)]
fn reset_done(bio: &mut Bio) -> bool {
    debug_assert!(bio.error.is_none(), "the bio's error was taken");
    debug_assert!(bio.waker.is_none(), "a done bio's waker was taken");
    debug_assert!(!bio.orphaned, "a done bio is not orphaned");
    debug_assert!(
        bio.cold
            .as_deref()
            .is_none_or(|c| c.parts.is_empty() && c.keep.is_none()),
        "a done bio's cold part is empty"
    );
    bio.state = BioState::Free;
    if !matches!(bio.buf, BioBuf::None) {
        forget_if_none(std::mem::take(&mut bio.buf));
    }
    bio.split = false;
    // `done_bytes` is left as it is: every ending that makes a bio's
    // result a count writes it first (`complete_part` for one part,
    // `end_split` for a split), so a later bio of this slot never reads
    // this one's.
    bio.cached
}

/// Buffers of orphaned bios freed while the core's tables were borrowed,
/// to be dropped by [`drop_buried`] once the borrows are released. A
/// buffer's `Drop` that took a plug or issued IO on the core from inside
/// the completion found the tables borrowed: the panic was caught, but it
/// left the flush marked as running, and no later IO of that core was
/// sent (found by a break-it helper).
struct Buried(std::cell::RefCell<Vec<Keep>>);

impl Drop for Buried {
    /// At thread exit: what is still buried is dropped, contained.
    fn drop(&mut self) {
        for keep in self.0.get_mut().drain(..) {
            drop_kept(Some(keep));
        }
    }
}

thread_local! {
    static BURIED: Buried = const { Buried(std::cell::RefCell::new(Vec::new())) };
}

/// Defers the drop of what an orphaned bio kept to [`drop_buried`]: the
/// caller holds a borrow of the core's tables, which the buffer's `Drop`
/// (the caller's code) may need. Dropped at once where the thread is
/// exiting.
#[cold]
#[inline(never)]
pub(crate) fn bury_kept(keep: Option<Keep>) {
    let Some(keep) = keep else { return };
    let mut keep = Some(keep);
    let _ = BURIED.try_with(|b| b.0.borrow_mut().extend(keep.take()));
    drop_kept(keep);
}

/// Drops what [`bury_kept`] deferred, contained ([`drop_kept`]). Call it
/// with no borrow of the core's tables held: after a completion batch, a
/// flush, an abandon. What those drops bury in turn is dropped too.
#[inline]
pub(crate) fn drop_buried() {
    let pending = BURIED
        .try_with(|b| !b.0.borrow().is_empty())
        .unwrap_or(false);
    if pending {
        drop_buried_slow();
    }
}

#[cold]
#[inline(never)]
fn drop_buried_slow() {
    loop {
        let Ok(keeps) = BURIED.try_with(|b| std::mem::take(&mut *b.0.borrow_mut())) else {
            return;
        };
        if keeps.is_empty() {
            return;
        }
        for keep in keeps {
            drop_kept(Some(keep));
        }
    }
}

/// Drops what an orphaned bio kept: the caller's buffer, whose type's
/// `Drop` is the caller's code and runs here, in the core's completion
/// path or flush (or wherever the bio or its device is freed). A panic
/// there is caught and logged ([`plugio_executor::drop_contained`]):
/// unwinding through the completion would stop the core, cancel every
/// task on it and leave its IO state half updated.
#[cold]
#[inline(never)]
pub(crate) fn drop_kept(keep: Option<Keep>) {
    if keep.is_some() {
        plugio_executor::drop_contained(keep, "the buffer of an IO whose future was dropped");
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

/// Drops `buf`, skipping the drop call when it owns nothing (the common
/// case on the hot path: no-data ops, freshly reset bios, and one caller
/// buffer, which the bio only names by address).
#[inline]
pub(crate) fn forget_if_none(buf: BioBuf) {
    if matches!(buf, BioBuf::None | BioBuf::One { .. }) {
        std::mem::forget(buf);
    } else {
        drop(buf);
    }
}

/// What a finished bio gives back to its future: the bytes transferred,
/// or the first error of its requests. (The memory is the future's: the
/// bio only named it by address, and forgets the addresses when freed.)
pub(crate) type BioResult = Result<u64, Error>;

/// Allocates the bio of `slot`, which has none (a cache miss).
#[cold]
#[inline(never)]
fn new_bio(slot: &mut Slot) {
    slot.bio = Some(Box::new(Bio::empty()));
}

/// The most idle bios a core keeps for reuse, as the kernel's per-cpu bio
/// cache caps itself (`ALLOC_CACHE_MAX`, 256 since "bio: shrink max number
/// of pcpu cached bios").
pub(crate) const BIO_CACHE_MAX: usize = 256;

/// One slot of the table: a generation that outlives the bio, and the bio
/// itself (boxed, so a slot without a cached bio costs no bio memory).
#[derive(Debug, Default)]
struct Slot {
    generation: u32,
    bio: Option<Box<Bio>>,
}

/// The per-core table of bios, which is also the per-core bio cache.
///
/// Slots are named by index and generation. A freed bio stays in its slot
/// (with its `parts` vector's capacity) and its slot goes on the cached
/// free list, so the next IO reuses it without touching the allocator: a
/// cache hit. Without the cache (`bio_cache: false`), or past
/// [`BIO_CACHE_MAX`] idle bios, a freed bio is deallocated and the next IO
/// allocates one: a miss.
#[derive(Debug, Default)]
pub(crate) struct BioTable {
    slots: Vec<Slot>,
    /// Free slots that still hold a bio.
    free_cached: Vec<u32>,
    /// Free slots without a bio.
    free_empty: Vec<u32>,
    /// Bios issued and not yet freed, counted in debug builds only, to
    /// check [`BioTable::in_use`]: every slot is in use or on exactly one
    /// of the free lists, so the count is what the lists leave (two
    /// read-modify-writes fewer per IO).
    #[cfg(debug_assertions)]
    live: usize,
}

impl Drop for BioTable {
    /// Drops what orphaned bios still keep (a bio left in the plug of an
    /// executor that is gone, freed as its thread exits) contained, as the
    /// completion does: a panic in a caller's buffer's `Drop` inside a
    /// thread-local destructor aborted the process (found by a break-it
    /// helper).
    fn drop(&mut self) {
        for slot in &mut self.slots {
            let keep = slot
                .bio
                .as_deref_mut()
                .and_then(|bio| bio.cold.as_deref_mut())
                .and_then(|cold| cold.keep.take());
            drop_kept(keep);
        }
    }
}

impl BioTable {
    /// Takes a free slot and returns its id, whether the bio came from the
    /// cache, and the bio. With `cache` false, a fresh bio is allocated
    /// every time.
    #[inline]
    pub fn alloc(&mut self, cache: bool) -> (BioId, bool, &mut Bio) {
        let cached = if cache { self.free_cached.pop() } else { None };
        let (index, hit) = match cached {
            Some(i) => (i, true),
            None => (self.alloc_slot(), false),
        };
        #[cfg(debug_assertions)]
        {
            self.live += 1;
        }
        debug_assert!((index as usize) < self.slots.len());
        // SAFETY: `index` is in bounds: it is a free list's (each holds
        // only indexes of slots that were in the table when they were
        // freed) or `alloc_slot`'s (a free one, or the one it just
        // pushed), and the table's slots are never removed (`slots` only
        // grows).
        let slot = unsafe { self.slots.get_unchecked_mut(index as usize) };
        slot.generation = slot.generation.wrapping_add(1);
        let id = BioId {
            index,
            generation: slot.generation,
        };
        let bio = if hit {
            debug_assert!(slot.bio.is_some(), "a cached free slot holds its bio");
            // SAFETY: a slot on `free_cached` holds its bio: `put_free`
            // pushes a slot there only with its bio kept, and the one
            // place that takes a slot's bio (`free_uncached`) puts that
            // slot on `free_empty` instead.
            let bio = unsafe { slot.bio.as_deref_mut().unwrap_unchecked() };
            // Kept for reuse only when allocated with the cache on (see
            // `put_free`), and a hit has the cache on: `cached` already
            // says so.
            debug_assert!(bio.cached && cache);
            bio
        } else {
            if slot.bio.is_none() {
                new_bio(slot);
            }
            let bio = slot.bio.as_deref_mut().expect("a bio was just made");
            bio.cached = cache;
            bio
        };
        bio.state = BioState::Issued;
        bio.lane = crate::interval::NIL;
        (id, hit, bio)
    }

    /// A slot for a bio that does not come from the cache (a miss): a
    /// free one, or a new one at the end. Out of line, so that the cache
    /// hit's path keeps a small frame.
    #[cold]
    #[inline(never)]
    fn alloc_slot(&mut self) -> u32 {
        match self.free_empty.pop() {
            Some(i) => i,
            None => {
                if self.free_cached.capacity() < BIO_CACHE_MAX {
                    // Room for every bio the cache may keep, before the
                    // first slot is freed (`put_free` pushes without a
                    // test of the capacity).
                    self.free_cached
                        .reserve_exact(BIO_CACHE_MAX - self.free_cached.len());
                }
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// The bio named by `id`, if the id is current.
    #[inline]
    pub fn get_mut(&mut self, id: BioId) -> Option<&mut Bio> {
        self.slots
            .get_mut(id.index as usize)
            .filter(|s| s.generation == id.generation)
            .and_then(|s| s.bio.as_deref_mut())
            .filter(|b| b.state != BioState::Free)
    }

    /// The bio named by `id`, if the id is current (shared access).
    #[inline]
    pub fn get(&self, id: BioId) -> Option<&Bio> {
        self.slots
            .get(id.index as usize)
            .filter(|s| s.generation == id.generation)
            .and_then(|s| s.bio.as_deref())
            .filter(|b| b.state != BioState::Free)
    }

    /// Frees the bio: resets it and keeps it for reuse (cache on and room
    /// left) or deallocates it. Its buffer, unless taken before, is
    /// dropped here (back to its cache).
    pub fn free(&mut self, id: BioId) {
        if self.get(id).is_some() {
            self.free_current(id.index);
        }
    }

    /// [`BioTable::free`] of slot `index`, whose id was just checked.
    #[inline]
    fn free_current(&mut self, index: u32) {
        let Some(bio) = self.slots[index as usize].bio.as_deref_mut() else {
            return;
        };
        let keep = reset(bio);
        self.put_free(index, keep);
    }

    /// Puts free slot `index` on its free list: the cached one while it
    /// has room and `keep` (the bio was allocated with the cache on), else
    /// the bio is deallocated.
    #[inline(always)]
    fn put_free(&mut self, index: u32, keep: bool) {
        if keep && self.free_cached.len() < BIO_CACHE_MAX {
            self.push_free_cached(index);
        } else {
            self.free_uncached(index);
        }
        #[cfg(debug_assertions)]
        {
            self.live -= 1;
        }
    }

    /// Pushes free slot `index` on the cached free list, which holds
    /// fewer than [`BIO_CACHE_MAX`] (the caller tested it).
    #[inline(always)]
    fn push_free_cached(&mut self, index: u32) {
        let len = self.free_cached.len();
        debug_assert!(len < BIO_CACHE_MAX);
        debug_assert!(self.free_cached.capacity() > len);
        // SAFETY: `free_cached` has room for `BIO_CACHE_MAX` indexes
        // (reserved by `alloc_slot` before the table's first slot was
        // made, and every slot freed here was made there; the vector
        // is never shrunk), and it holds fewer (the caller's test): the
        // write is within its capacity, and the index written is
        // initialized before the length covers it.
        unsafe {
            self.free_cached.as_mut_ptr().add(len).write(index);
            self.free_cached.set_len(len + 1);
        }
    }

    /// Deallocates the bio of free slot `index` (the cache is off or full).
    #[cold]
    fn free_uncached(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        slot.bio = None;
        // A new generation: no id names a slot without a bio (so
        // `take_result` finds the bio of any current id without a test).
        slot.generation = slot.generation.wrapping_add(1);
        self.free_empty.push(index);
    }

    /// The bio of `id` when the id is current and the bio `Done`: the one
    /// lookup of [`BioTable::take_result`] and
    /// [`BioTable::take_ok_cached`].
    #[inline(always)]
    fn done_mut(&mut self, id: BioId) -> Option<&mut Bio> {
        let slot = self.slots.get_mut(id.index as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        debug_assert!(slot.bio.is_some(), "a current id names a bio");
        // SAFETY: the slot of a current id holds a bio: `alloc` makes one
        // when it hands out the id's generation, and the one place that
        // takes a slot's bio (`free_uncached`) starts a new generation.
        let bio = unsafe { slot.bio.as_deref_mut().unwrap_unchecked() };
        // A free bio is never `Done`, so this also refuses free slots.
        (bio.state == BioState::Done).then_some(bio)
    }

    /// [`BioTable::take_result`] of its common case, with no call on its
    /// path (the future's last poll then needs no frame): a `Done` bio
    /// without an error, whose memory is none or one buffer (nothing to
    /// drop), kept for reuse (`cached`) while the cache has room. Returns
    /// its byte count and frees its slot as `take_result` does; `None`,
    /// with nothing changed, in every other case (the caller then calls
    /// `take_result`).
    #[inline(always)]
    pub fn take_ok_cached(&mut self, id: BioId) -> Option<u64> {
        let room = self.free_cached.len() < BIO_CACHE_MAX;
        let bio = self.done_mut(id)?;
        if bio.error.is_some() || matches!(bio.buf, BioBuf::Many(_)) || !bio.cached || !room {
            return None;
        }
        let n = bio.done_bytes;
        // The buffer is `None` or `One`: forgotten, no drop.
        let keep = reset_done(bio);
        debug_assert!(keep);
        self.push_free_cached(id.index);
        #[cfg(debug_assertions)]
        {
            self.live -= 1;
        }
        Some(n)
    }

    /// Takes the result of a completed bio and frees its slot. One lookup
    /// of the slot for both (the future's second poll: the hot path).
    #[inline(always)]
    pub fn take_result(&mut self, id: BioId) -> Option<BioResult> {
        let bio = self.done_mut(id)?;
        // The error is taken only where there is one: no store on the
        // common path.
        let result = if bio.error.is_some() {
            Err(bio.error.take().expect("tested just above"))
        } else {
            Ok(bio.done_bytes)
        };
        let keep = reset_done(bio);
        self.put_free(id.index, keep);
        Some(result)
    }

    /// The live bio in slot `index` (a fast-lane token names its bio by
    /// index alone: the bio lives until its one part completes, so the
    /// slot cannot have been reused; checked in debug builds).
    #[inline]
    pub fn fast_mut(&mut self, index: u32) -> &mut Bio {
        let bio = self.slots[index as usize]
            .bio
            .as_deref_mut()
            .expect("a fast-lane bio slot holds its bio");
        debug_assert_eq!(
            bio.state,
            BioState::Issued,
            "fast-lane bio {index} not live"
        );
        bio
    }

    /// The id of the live bio in slot `index`.
    #[inline]
    pub fn id_at(&self, index: u32) -> BioId {
        BioId {
            index,
            generation: self.slots[index as usize].generation,
        }
    }

    /// Bios issued and not yet freed: the slots on neither free list
    /// (a slot is made in use, and leaves use only onto one of them).
    pub fn in_use(&self) -> usize {
        let n = self.slots.len() - self.free_cached.len() - self.free_empty.len();
        #[cfg(debug_assertions)]
        debug_assert_eq!(n, self.live, "every slot in use or on one free list");
        n
    }

    /// Takes the waker of every bio that has one into `out`. Cold: walks
    /// the whole table (a forked child's wake of what was in flight at
    /// the fork, [`EngineCore::wake_forked`](crate::core::EngineCore::wake_forked)).
    #[cold]
    pub fn take_wakers(&mut self, out: &mut Vec<Waker>) {
        let bios = self.slots.iter_mut().filter_map(|s| s.bio.as_mut());
        out.extend(bios.filter_map(|b| b.waker.take()));
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
        let (a, hit, _) = t.alloc(true);
        assert!(!hit);
        t.free(a);
        let (b, hit, _) = t.alloc(true);
        assert!(hit, "a freed bio is reused");
        assert_eq!(a.index, b.index);
        assert!(t.get_mut(a).is_none());
        assert!(t.get_mut(b).is_some());
        assert_eq!(t.in_use(), 1);
        t.free(b);
        let (c, hit, _) = t.alloc(false);
        assert!(!hit, "without the cache every bio is fresh");
        assert_ne!(
            c.index, b.index,
            "an uncached alloc does not take a cached bio"
        );
        t.free(c);
        let (d, hit, _) = t.alloc(true);
        assert!(hit && d.index == b.index);
        let (e, hit, _) = t.alloc(true);
        assert!(!hit, "the bio freed without the cache was deallocated");
        assert_eq!(e.index, c.index, "its empty slot is reused");
    }
}
