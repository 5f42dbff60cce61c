//! DMA buffers: owned, aligned memory for `O_DIRECT` IO.
//!
//! Invariants:
//! - A [`DmaBuf`]'s memory is aligned to at least its requested alignment
//!   and `len <= capacity`; the bytes in `[0, capacity)` are initialised.
//! - A buffer from a core's arena returns to that arena when dropped: on the
//!   owning thread straight to the local free list, on any other thread
//!   through the arena's lock-free return stack, which the owner drains
//!   when its local list runs dry.
//! - The arena's memory is freed only when the arena and every buffer cut
//!   from it are gone; while a ring has it registered, the driver keeps the
//!   arena alive.

mod arena;
pub mod cache;
pub(crate) mod return_stack;

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use bytes::Bytes;

pub(crate) use arena::Arena;
pub use arena::{arena_stats, configure_arena, registered_index_of, ArenaConfig, ArenaStats};
pub(crate) use arena::{current_arena, ArenaShared, Chunk};

/// The default alignment of buffers (bytes): the page size, which covers the
/// direct-IO alignment of every common device.
pub const DEFAULT_ALIGN_BYTES: usize = 4096;

enum Origin {
    Heap { align: usize },
    Arena { arena: Arc<ArenaShared>, chunk: u32 },
    Cache { owner: Arc<cache::CacheShared> },
}

/// An owned, aligned buffer for direct IO.
pub struct DmaBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    origin: Origin,
}

// SAFETY: a DmaBuf exclusively owns its memory (like a Vec<u8>); the arena
// handle is an Arc to Sync data, and returning a chunk from another thread
// goes through the arena's thread-safe return stack.
unsafe impl Send for DmaBuf {}
// SAFETY: shared references only read the bytes.
unsafe impl Sync for DmaBuf {}

impl DmaBuf {
    /// A zero-filled buffer of `len_bytes` (its length; the capacity may be
    /// larger), aligned to [`DEFAULT_ALIGN_BYTES`]. Taken from the current
    /// thread's arena when it fits and a chunk is free, else a plain aligned
    /// allocation.
    ///
    /// # Panics
    /// When the allocation fails (as `Vec` does).
    pub fn new(len_bytes: usize) -> Self {
        Self::with_align(len_bytes, DEFAULT_ALIGN_BYTES)
    }

    /// Like [`DmaBuf::new`] with an explicit alignment (rounded up to a power
    /// of two).
    ///
    /// # Panics
    /// When the allocation fails, or the length rounded up to the
    /// alignment is more than `isize::MAX` bytes (see [`DmaBuf::heap`]).
    pub fn with_align(len_bytes: usize, align_bytes: usize) -> Self {
        let align = heap_layout(1, align_bytes).align();
        let mut buf =
            match current_arena().and_then(|a| a.take(len_bytes, align).map(Self::from_arena)) {
                Some(buf) => buf,
                None => Self::heap(len_bytes, align),
            };
        buf.as_full_mut_slice()[..len_bytes].fill(0);
        buf.len = len_bytes;
        buf
    }

    /// A buffer of `len_bytes` from the calling thread's buffer cache
    /// (see [`cache`]): 4096-aligned, capacity the size class (512 B to
    /// 1 MiB, powers of two), no heap allocation when the class's free
    /// list has one. Its bytes are NOT zeroed: they hold what the buffer's
    /// last user left (use it for reads, or overwrite it). Dropped on any
    /// thread, it returns to its owner's cache. Larger buffers fall back to
    /// [`DmaBuf::heap`].
    pub fn cached(len_bytes: usize) -> Self {
        match cache::take(len_bytes) {
            Some((ptr, cap, owner)) => Self {
                ptr,
                len: len_bytes,
                cap,
                origin: Origin::Cache { owner },
            },
            None => Self::heap(len_bytes, cache::CACHE_ALIGN_BYTES),
        }
    }

    /// A buffer of `len_bytes` from the calling thread's arena, when that
    /// arena is registered with the thread's ring (so IO on it goes out as
    /// `READ_FIXED`/`WRITE_FIXED`), `len_bytes` fits one chunk, the
    /// alignment is at most 4096 and a chunk is free; `None` otherwise. Its
    /// bytes are NOT zeroed: they hold what the chunk's last user left.
    /// Dropped on any thread, it returns to its arena.
    pub fn registered(len_bytes: usize, align_bytes: usize) -> Option<Self> {
        let arena = current_arena()?;
        arena.shared_fixed_index()?;
        let align = align_bytes.max(1).checked_next_power_of_two()?;
        let mut buf = Self::from_arena(arena.take(len_bytes, align)?);
        buf.len = len_bytes;
        Some(buf)
    }

    /// A plain zeroed aligned allocation (never from the arena).
    ///
    /// # Panics
    /// When `len_bytes` rounded up to the alignment is more than
    /// `isize::MAX` bytes (the rounding wrapped to 0 in release builds and
    /// gave a zero-size allocation with `len() == usize::MAX`: safe code
    /// could write anywhere; found by a break-it helper), and when the
    /// allocation fails (a panic, not the allocator's abort, so a caller
    /// asking for an absurd size can catch it).
    pub fn heap(len_bytes: usize, align_bytes: usize) -> Self {
        let layout = heap_layout(len_bytes, align_bytes);
        let (cap, align) = (layout.size(), layout.align());
        // SAFETY: the layout has non-zero size (`heap_layout`: at least one
        // byte, rounded up to the alignment without overflow).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            panic!("allocating a DmaBuf of {cap} bytes aligned to {align} failed: out of memory");
        };
        Self {
            ptr,
            len: len_bytes,
            cap,
            origin: Origin::Heap { align },
        }
    }

    pub(crate) fn from_arena(chunk: Chunk) -> Self {
        Self {
            ptr: chunk.ptr,
            len: 0,
            cap: chunk.cap,
            origin: Origin::Arena {
                arena: chunk.arena,
                chunk: chunk.index,
            },
        }
    }

    /// Bytes in use.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when `len() == 0`.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the length; bytes newly exposed keep their previous contents
    /// (zero for a fresh allocation, stale data for a reused arena chunk).
    ///
    /// # Panics
    /// When `len_bytes > capacity()`.
    #[inline]
    pub fn set_len(&mut self, len_bytes: usize) {
        assert!(
            len_bytes <= self.cap,
            "DmaBuf::set_len({len_bytes}) beyond capacity {}",
            self.cap
        );
        self.len = len_bytes;
    }

    /// The bytes in use.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialised bytes, owned by us.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes in use, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn as_full_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the whole capacity is allocated and initialised (arena
        // memory and heap allocations are zeroed at creation) and ours.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }

    /// The start address.
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The start address, mutable.
    #[inline]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// An iovec over the first `len_bytes` of the allocation.
    ///
    /// # Panics
    /// When `len_bytes > capacity()`.
    pub fn iovec(&mut self, len_bytes: usize) -> libc::iovec {
        assert!(len_bytes <= self.cap, "iovec beyond capacity");
        libc::iovec {
            iov_base: self.ptr.as_ptr().cast(),
            iov_len: len_bytes,
        }
    }

    /// The registered-buffer index to use with `READ_FIXED`/`WRITE_FIXED`
    /// on the current thread's ring: `Some` only for a buffer of this
    /// thread's arena while the arena is registered with this thread's ring.
    #[inline]
    pub fn fixed_index(&self) -> Option<u16> {
        match &self.origin {
            Origin::Arena { arena, .. } => arena.fixed_index_here(),
            Origin::Heap { .. } | Origin::Cache { .. } => None,
        }
    }

    /// True when the buffer came from an arena (and goes back to it).
    pub fn is_from_arena(&self) -> bool {
        matches!(self.origin, Origin::Arena { .. })
    }

    /// Converts to `Bytes` without copying; the buffer is returned to its
    /// arena (or freed) when the last `Bytes` clone is dropped.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for DmaBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsMut<[u8]> for DmaBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuf")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("cap", &self.cap)
            .field("arena", &self.is_from_arena())
            .finish()
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        match &self.origin {
            Origin::Heap { align } => {
                if let Ok(layout) = std::alloc::Layout::from_size_align(self.cap, *align) {
                    // SAFETY: allocated in `heap` with exactly this layout.
                    unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
                }
            }
            Origin::Arena { arena, chunk } => arena.give_back(*chunk),
            Origin::Cache { owner } => cache::give_back(self.ptr, self.cap, owner),
        }
    }
}

/// The layout of a heap [`DmaBuf`] of `len_bytes` (at least 1) aligned to
/// `align_bytes` rounded up to a power of two.
///
/// # Panics
/// When the alignment or the rounded size does not fit `isize::MAX`.
fn heap_layout(len_bytes: usize, align_bytes: usize) -> std::alloc::Layout {
    let align = align_bytes
        .max(1)
        .checked_next_power_of_two()
        .unwrap_or_else(|| panic!("DmaBuf alignment {align_bytes} is too large"));
    let cap = len_bytes.max(1).checked_next_multiple_of(align);
    cap.and_then(|cap| std::alloc::Layout::from_size_align(cap, align).ok())
        .unwrap_or_else(|| {
            panic!(
                "a DmaBuf of {len_bytes} bytes aligned to {align} is larger than memory can \
                 be (at most isize::MAX bytes): ask for a length that fits the machine"
            )
        })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn heap_buffer_is_aligned_and_zeroed() {
        let mut b = DmaBuf::heap(5000, 4096);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert_eq!(b.len(), 5000);
        assert!(b.capacity() >= 5000);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[0] = 7;
        b.set_len(1);
        assert_eq!(b.as_slice(), &[7]);
    }

    #[test]
    fn into_bytes_keeps_contents() {
        let mut b = DmaBuf::new(4096);
        b.as_mut_slice().fill(0xab);
        let addr = b.as_ptr();
        let bytes = b.into_bytes();
        assert_eq!(bytes.as_ptr(), addr, "no copy");
        assert!(bytes.iter().all(|&x| x == 0xab));
    }

    /// A length whose rounding to the alignment overflows is refused with
    /// a panic before any allocation (it wrapped to a zero-size buffer of
    /// `len() == usize::MAX` in release builds); so is an alignment with no
    /// power of two above it.
    #[test]
    fn a_length_that_overflows_the_rounding_panics_before_allocating() {
        for (len, align) in [
            (usize::MAX, 4096),
            (usize::MAX - 100, 4096),
            (isize::MAX as usize, 4096),
            (4096, usize::MAX),
        ] {
            let err = std::panic::catch_unwind(|| DmaBuf::heap(len, align))
                .expect_err("an impossible DmaBuf");
            let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(msg.contains("DmaBuf"), "{len} aligned {align}: {msg}");
            let err = std::panic::catch_unwind(|| DmaBuf::with_align(len, align))
                .expect_err("an impossible DmaBuf");
            assert!(err
                .downcast_ref::<String>()
                .is_some_and(|m| m.contains("DmaBuf")));
        }
        let ok = DmaBuf::heap(5000, 4096);
        assert_eq!((ok.len(), ok.capacity()), (5000, 8192));
    }
}
