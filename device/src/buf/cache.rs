//! The per-core buffer cache: free lists of aligned buffers by size class,
//! so the steady state of an IO loop does no heap allocation.
//!
//! Idea: the kernel's per-cpu bio alloc cache (`bio_alloc_cache`,
//! `ALLOC_CACHE_MAX`, the irq-side list spliced back in bulk), applied to
//! DMA buffers: a core takes and frees from its own lists without atomics;
//! a buffer freed on another core is pushed onto its owner's lock-free
//! return stack, which the owner splices into its lists when a list runs
//! dry.
//!
//! Invariants:
//! - Every cached buffer is 4096-aligned, its capacity is its class size
//!   (`512 << class`), and its bytes are initialised (zeroed when first
//!   allocated; later they hold whatever the last user left).
//! - A buffer is in exactly one place: a live `DmaBuf`, its owner's local
//!   list, or its owner's return stack.
//! - Lists are capped (`ALLOC_CACHE_MAX`-style): a buffer freed into a full
//!   list is deallocated. After the owner thread exits, its return stack is
//!   drained by whoever pushes next, so nothing leaks.

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::sync::{AtomicBool, AtomicPtr};
use std::sync::atomic::Ordering;

/// Number of size classes: 512 B to 1 MiB.
#[cfg(not(loom))]
pub const NR_CLASSES: usize = 12;
/// Number of size classes (two under loom, to keep the model small).
#[cfg(loom)]
pub const NR_CLASSES: usize = 2;

/// The smallest class, in bytes.
pub const MIN_CLASS_BYTES: usize = 512;

/// Alignment of every cached buffer.
pub const CACHE_ALIGN_BYTES: usize = 4096;

/// Most buffers kept per class (the kernel's `ALLOC_CACHE_MAX` is 256 for
/// bios); classes of 64 KiB and up keep fewer, at most 8 MiB each.
pub const MAX_PER_CLASS: usize = 256;

const MAX_CLASS_BYTES_CACHED: usize = 8 << 20;

/// The size class holding `len` bytes, if one does.
pub fn class_of(len: usize) -> Option<usize> {
    let len = len.max(MIN_CLASS_BYTES);
    // No class above the largest power of two (a debug build overflowed
    // on `usize::MAX`; found by a break-it helper).
    let class = (len.checked_next_power_of_two()? / MIN_CLASS_BYTES).trailing_zeros() as usize;
    (class < NR_CLASSES).then_some(class)
}

/// Bytes of class `class`.
pub fn class_bytes(class: usize) -> usize {
    MIN_CLASS_BYTES << class
}

fn cap_of(class: usize) -> usize {
    (MAX_CLASS_BYTES_CACHED / class_bytes(class)).clamp(4, MAX_PER_CLASS)
}

fn layout_of(class: usize) -> Layout {
    // Class sizes are powers of two and the alignment is a power of two.
    Layout::from_size_align(class_bytes(class).max(CACHE_ALIGN_BYTES), CACHE_ALIGN_BYTES)
        .expect("class layout is valid")
}

/// Frees a cached buffer's memory.
///
/// # Safety
/// `ptr` was allocated by [`alloc_class`] for `class` and is not used again.
unsafe fn dealloc_class(ptr: NonNull<u8>, class: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::alloc::dealloc(ptr.as_ptr(), layout_of(class)) }
}

fn alloc_class(class: usize) -> NonNull<u8> {
    let layout = layout_of(class);
    // SAFETY: the layout has a non-zero size.
    let raw = unsafe { std::alloc::alloc_zeroed(layout) };
    NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
}

/// The part of a core's cache other threads see: one lock-free return
/// stack per class, linked through the first 8 bytes of each buffer.
#[derive(Debug)]
pub(crate) struct CacheShared {
    heads: [AtomicPtr<u8>; NR_CLASSES],
    closed: AtomicBool,
}

impl CacheShared {
    fn new() -> Self {
        Self {
            heads: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
            closed: AtomicBool::new(false),
        }
    }

    /// Pushes a buffer freed on another thread. If the owner is gone, the
    /// pusher frees what is on the stack itself.
    pub(crate) fn push_remote(&self, ptr: NonNull<u8>, class: usize) {
        let head = &self.heads[class];
        // Relaxed: only a first guess for the CAS.
        let mut cur = head.load(Ordering::Relaxed);
        loop {
            // SAFETY: we own the buffer (>= 512 bytes, 4096-aligned); its
            // first 8 bytes hold the link while it is on the stack.
            unsafe { ptr.as_ptr().cast::<*mut u8>().write(cur) };
            // SeqCst (a Release at least) pairs with the swap in
            // `take_all`: the owner sees the link and every write to the
            // buffer before the free. SeqCst also orders this push before
            // the `closed` load below against `close`'s store and swap (a
            // store-buffer pattern: all four must be SeqCst).
            match head.compare_exchange_weak(cur, ptr.as_ptr(), Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        // SeqCst pairs with the SeqCst store in `close`: either the owner
        // drains after our push, or we see `closed` and drain ourselves.
        if self.closed.load(Ordering::SeqCst) {
            self.free_class(class);
        }
    }

    /// Takes every buffer on class `class`'s stack.
    fn take_all(&self, class: usize, out: &mut Vec<NonNull<u8>>) {
        // SeqCst (an Acquire at least) pairs with the CAS of every push; see
        // `push_remote` for why it is SeqCst.
        let mut cur = self.heads[class].swap(std::ptr::null_mut(), Ordering::SeqCst);
        while let Some(p) = NonNull::new(cur) {
            out.push(p);
            // SAFETY: the link written by the pusher, made visible by the
            // Acquire swap.
            cur = unsafe { p.as_ptr().cast::<*mut u8>().read() };
        }
    }

    /// Frees everything on class `class`'s stack.
    fn free_class(&self, class: usize) {
        let mut list = Vec::new();
        self.take_all(class, &mut list);
        for p in list {
            // SAFETY: taken off the stack, so owned here; allocated for
            // this class.
            unsafe { dealloc_class(p, class) };
        }
    }

    fn close(&self) {
        // SeqCst pairs with the SeqCst load in `push_remote`.
        self.closed.store(true, Ordering::SeqCst);
        (0..NR_CLASSES).for_each(|class| self.free_class(class));
    }
}

/// Counters of the calling thread's buffer cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufCacheStats {
    /// Buffers served from a free list.
    pub hits: u64,
    /// Buffers that had to be allocated.
    pub misses: u64,
    /// Buffers returned by other threads and spliced back.
    pub remote_returns: u64,
    /// Buffers freed because their list was full.
    pub overflows: u64,
}

/// A core's buffer cache.
pub(crate) struct BufCache {
    pub(crate) shared: Arc<CacheShared>,
    lists: RefCell<[Vec<NonNull<u8>>; NR_CLASSES]>,
    stats: Cell<BufCacheStats>,
}

thread_local! {
    static CACHE: BufCache = BufCache::new();
}

impl BufCache {
    fn new() -> Self {
        Self {
            shared: Arc::new(CacheShared::new()),
            lists: RefCell::new(std::array::from_fn(|_| Vec::new())),
            stats: Cell::new(BufCacheStats::default()),
        }
    }

    fn bump(&self, f: impl FnOnce(&mut BufCacheStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// A buffer of class `class` and the owner handle to return it to.
    fn take(&self, class: usize) -> (NonNull<u8>, Arc<CacheShared>) {
        let mut lists = self.lists.borrow_mut();
        let list = &mut lists[class];
        if list.is_empty() {
            let before = list.len();
            self.shared.take_all(class, list);
            let got = (list.len() - before) as u64;
            if got > 0 {
                self.bump(|s| s.remote_returns += got);
            }
        }
        let ptr = match list.pop() {
            Some(p) => {
                self.bump(|s| s.hits += 1);
                p
            }
            None => {
                self.bump(|s| s.misses += 1);
                alloc_class(class)
            }
        };
        (ptr, self.shared.clone())
    }

    /// Takes back a buffer freed on this thread.
    fn give(&self, ptr: NonNull<u8>, class: usize) {
        let mut lists = self.lists.borrow_mut();
        let list = &mut lists[class];
        if list.len() < cap_of(class) {
            list.push(ptr);
        } else {
            self.bump(|s| s.overflows += 1);
            // SAFETY: owned by the dropping DmaBuf, allocated for `class`.
            unsafe { dealloc_class(ptr, class) };
        }
    }
}

impl Drop for BufCache {
    fn drop(&mut self) {
        for (class, list) in self.lists.get_mut().iter_mut().enumerate() {
            for p in list.drain(..) {
                // SAFETY: on the local list, so owned by the cache.
                unsafe { dealloc_class(p, class) };
            }
        }
        self.shared.close();
    }
}

/// Takes a buffer of at least `len` bytes from the calling thread's cache:
/// `(pointer, capacity, owner)`, or `None` when `len` is above the largest
/// class.
pub(crate) fn take(len: usize) -> Option<(NonNull<u8>, usize, Arc<CacheShared>)> {
    let class = class_of(len)?;
    CACHE
        .try_with(|c| {
            let (p, owner) = c.take(class);
            (p, class_bytes(class), owner)
        })
        .ok()
}

/// Returns a cached buffer: to the local list when the calling thread owns
/// it, else to the owner's return stack.
pub(crate) fn give_back(ptr: NonNull<u8>, cap: usize, owner: &Arc<CacheShared>) {
    let class = class_of(cap).expect("a cached buffer has a class capacity");
    let local = CACHE
        .try_with(|c| {
            if Arc::ptr_eq(&c.shared, owner) {
                c.give(ptr, class);
                true
            } else {
                false
            }
        })
        .unwrap_or(false);
    if !local {
        owner.push_remote(ptr, class);
    }
}

/// The calling thread's buffer-cache counters.
pub fn buf_cache_stats() -> BufCacheStats {
    CACHE.try_with(|c| c.stats.get()).unwrap_or_default()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Lengths past the largest class have none, up to `usize::MAX`
    /// (whose rounding to a power of two overflowed in debug builds).
    #[test]
    fn lengths_past_the_largest_class_have_none() {
        assert_eq!(class_of(1), Some(0));
        assert_eq!(
            class_of(MIN_CLASS_BYTES << (NR_CLASSES - 1)),
            Some(NR_CLASSES - 1)
        );
        assert_eq!(class_of((MIN_CLASS_BYTES << (NR_CLASSES - 1)) + 1), None);
        assert_eq!(class_of(usize::MAX), None);
        assert_eq!(class_of(usize::MAX / 2 + 2), None);
    }

    #[test]
    fn a_buffer_freed_on_another_thread_comes_back_to_its_owner() {
        let before = buf_cache_stats();
        let b = crate::DmaBuf::cached(4096);
        assert_eq!(b.capacity(), 4096);
        assert_eq!(b.as_ptr() as usize % CACHE_ALIGN_BYTES, 0);
        let addr = b.as_ptr() as usize;
        std::thread::spawn(move || drop(b)).join().unwrap();
        let again = crate::DmaBuf::cached(4000);
        assert_eq!(
            again.as_ptr() as usize,
            addr,
            "the returned buffer is reused"
        );
        let after = buf_cache_stats();
        assert_eq!(after.remote_returns - before.remote_returns, 1);
        assert_eq!(after.hits - before.hits, 1);
    }

    #[test]
    fn classes() {
        assert_eq!(class_of(1), Some(0));
        assert_eq!(class_of(512), Some(0));
        assert_eq!(class_of(513), Some(1));
        assert_eq!(class_of(4096), Some(3));
        assert_eq!(class_of(1 << 20), Some(11));
        assert_eq!(class_of((1 << 20) + 1), None);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// Two threads return buffers while the owner splices: each buffer is
    /// taken exactly once.
    #[test]
    fn loom_remote_returns_are_taken_once() {
        loom::model(|| {
            let shared = Arc::new(CacheShared::new());
            let bufs: Vec<usize> = (0..2).map(|_| alloc_class(0).as_ptr() as usize).collect();
            let handles: Vec<_> = bufs
                .iter()
                .map(|&p| {
                    let s = shared.clone();
                    loom::thread::spawn(move || {
                        s.push_remote(NonNull::new(p as *mut u8).unwrap(), 0)
                    })
                })
                .collect();
            let mut got = Vec::new();
            shared.take_all(0, &mut got);
            for h in handles {
                h.join().unwrap();
            }
            shared.take_all(0, &mut got);
            let mut addrs: Vec<usize> = got.iter().map(|p| p.as_ptr() as usize).collect();
            addrs.sort_unstable();
            let mut want = bufs.clone();
            want.sort_unstable();
            assert_eq!(addrs, want);
            for p in got {
                // SAFETY: taken once each, allocated for class 0.
                unsafe { dealloc_class(p, 0) };
            }
        });
    }

    /// A push racing with the owner's close never leaks: whoever comes
    /// last frees the buffer.
    #[test]
    fn loom_push_after_close_is_freed() {
        loom::model(|| {
            let shared = Arc::new(CacheShared::new());
            let p = alloc_class(0).as_ptr() as usize;
            let s = shared.clone();
            let t =
                loom::thread::spawn(move || s.push_remote(NonNull::new(p as *mut u8).unwrap(), 0));
            shared.close();
            t.join().unwrap();
            let mut left = Vec::new();
            shared.take_all(0, &mut left);
            assert!(left.is_empty(), "a returned buffer was stranded");
        });
    }
}
