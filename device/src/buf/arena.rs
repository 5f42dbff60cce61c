//! The per-core arena of equal-sized DMA chunks (one registered buffer).
//!
//! Invariants: a chunk is in exactly one place: the owner's local free list,
//! the return stack, or a live `DmaBuf`. `fixed_index` is written only by
//! the owner thread (when its driver registers or forgets the arena) and
//! read only by the owner thread. The arena's pages are a mapping of its
//! own (anonymous `mmap`, never the allocator's heap) and
//! `MADV_WIPEONFORK`: a forked child gets zeroed pages, never the
//! registered ones shared copy-on-write (see `crate::fork`), and since
//! the pages are unmapped when the arena goes, the advice never lands on
//! memory the allocator hands out again (it did when the arena came from
//! `std::alloc`: a forked child's heap had zeroed pages, and malloc
//! aborted there with "unaligned fastbin chunk detected").

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::return_stack::ReturnStack;

/// A chunk taken from an arena ([`Arena::take`]), made into a
/// [`DmaBuf`](crate::DmaBuf) at once (`DmaBuf::from_arena`), which gives it
/// back when dropped. (The arena knows chunks, not buffers, so that the
/// buffer type depends on the arena and not the reverse.)
pub(crate) struct Chunk {
    /// Start of the chunk, inside the arena's allocation.
    pub ptr: NonNull<u8>,
    /// Bytes in the chunk.
    pub cap: usize,
    /// The arena the chunk goes back to.
    pub arena: Arc<ArenaShared>,
    /// The chunk's index in the arena.
    pub index: u32,
}

/// Size of a core's arena. Set before the thread's first `DmaBuf` with
/// [`configure_arena`](crate::buf::configure_arena).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaConfig {
    /// Bytes per chunk (a multiple of 4096); buffers up to this size come
    /// from the arena. Default 64 KiB.
    pub chunk_bytes: usize,
    /// Chunks per core. Default 64 (4 MiB with the default chunk). 0
    /// disables the arena. An arena of more than 1 GiB in all is not
    /// registered (io_uring refuses one registered buffer that large): its
    /// chunks are then plain memory, and IO on them goes without
    /// `READ_FIXED`/`WRITE_FIXED`.
    pub nr_chunks: u32,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            chunk_bytes: 64 * 1024,
            nr_chunks: 64,
        }
    }
}

/// Counters of an arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaStats {
    /// Chunks in the arena.
    pub nr_chunks: u32,
    /// Bytes per chunk.
    pub chunk_bytes: usize,
    /// Chunks returned from other threads so far.
    pub remote_returns: u64,
    /// Whether the arena is registered with this core's ring.
    pub registered: bool,
}

const NOT_FIXED: u32 = u32::MAX;

/// The part of an arena shared with buffers on any thread.
#[derive(Debug)]
pub(crate) struct ArenaShared {
    base: NonNull<u8>,
    /// Bytes mapped at `base` (`chunk_bytes * nr_chunks`, whole pages).
    len_bytes: usize,
    chunk_bytes: usize,
    nr_chunks: u32,
    owner: u64,
    returned: ReturnStack,
    remote_returns: AtomicU64,
    fixed_index: AtomicU32,
}

// SAFETY: the memory is only touched through DmaBufs (exclusive owners of
// their chunk); the bookkeeping is atomic.
unsafe impl Send for ArenaShared {}
// SAFETY: as above.
unsafe impl Sync for ArenaShared {}

/// The owner side: the local free list.
pub(crate) struct Arena {
    shared: Arc<ArenaShared>,
    free: RefCell<Vec<u32>>,
}

thread_local! {
    /// This thread's token, 0 until first asked (const-initialised: one
    /// plain load on the per-IO `fixed_index` path).
    static THREAD_TOKEN: Cell<u64> = const { Cell::new(0) };
    static CONFIG: Cell<ArenaConfig> = Cell::new(ArenaConfig::default());
    static ARENA: RefCell<Option<Rc<Arena>>> = const { RefCell::new(None) };
    /// The registered arena of this thread as `(base address, bytes,
    /// registered-buffer index)`; 0 bytes while none is registered. Set
    /// with the arena's fixed index (const-initialised: one load per
    /// lookup in `registered_index_of`).
    static REGISTERED: Cell<(usize, usize, u16)> = const { Cell::new((0, 0, 0)) };
}

/// The registered-buffer index of the memory `[addr, addr + len_bytes)`
/// when it lies inside this thread's registered arena, so that IO on it
/// may go out as `READ_FIXED`/`WRITE_FIXED` on this thread's ring; `None`
/// otherwise (another thread's arena, an unregistered arena, other
/// memory). Any memory carved out of the arena counts, not only whole
/// [`DmaBuf`](crate::DmaBuf) chunks: an embedder that takes the arena as one chunk and
/// lays out its own buffers in it (the fio engine's io_u memory) gets
/// fixed-buffer IO on them too.
#[inline]
pub fn registered_index_of(addr: *const u8, len_bytes: usize) -> Option<u16> {
    let (base, size, index) = REGISTERED.try_with(Cell::get).ok()?;
    let start = (addr as usize).checked_sub(base)?;
    (size > 0 && start.checked_add(len_bytes)? <= size).then_some(index)
}

/// `MADV_WIPEONFORK` on the arena's pages (whole pages: its own mapping,
/// a multiple of pages): a forked child gets zeroed
/// pages there instead of sharing the registered (pinned) ones
/// copy-on-write with this process (see `fork`). Logged once where the
/// kernel refuses (before 4.14).
fn wipe_on_fork(base: NonNull<u8>, len: usize) {
    // SAFETY: `[base, base + len)` is this arena's own mapping; the
    // advice changes only what a child inherits.
    let rc = unsafe { libc::madvise(base.as_ptr().cast(), len, libc::MADV_WIPEONFORK) };
    if rc != 0 {
        static LOGGED: std::sync::Once = std::sync::Once::new();
        LOGGED.call_once(|| {
            tracing::warn!(error = %std::io::Error::last_os_error(), "MADV_WIPEONFORK refused on the buffer arena");
        });
    }
}

/// `len` bytes (a multiple of the page size, not zero) of zeroed,
/// private anonymous memory of the arena's own (`None` when `mmap`
/// fails: the arena is then disabled, as when it is configured off).
fn map_pages(len: usize) -> Option<NonNull<u8>> {
    use nix::sys::mman::{mmap_anonymous, MapFlags, ProtFlags};
    // SAFETY: a new private anonymous mapping at an address of the
    // kernel's choice: it aliases nothing.
    let mapped = unsafe {
        mmap_anonymous(
            None,
            std::num::NonZeroUsize::new(len)?,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
        )
    };
    match mapped {
        Ok(base) => Some(base.cast()),
        Err(e) => {
            tracing::warn!(error = %e, len, "mmap of the buffer arena failed; buffers come from the heap");
            None
        }
    }
}

fn next_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // Relaxed: only uniqueness matters.
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[inline]
fn thread_token() -> u64 {
    THREAD_TOKEN
        .try_with(|t| match t.get() {
            0 => {
                let token = next_token();
                t.set(token);
                token
            }
            token => token,
        })
        .unwrap_or(0)
}

/// Sets the size of the calling thread's arena. Takes effect only before
/// the thread's first arena use; returns false when the arena already
/// exists.
pub fn configure_arena(config: ArenaConfig) -> bool {
    let exists = ARENA.with(|a| a.borrow().is_some());
    if !exists {
        CONFIG.with(|c| c.set(config));
    }
    !exists
}

/// The calling thread's arena, created on first use; `None` when disabled.
pub(crate) fn current_arena() -> Option<Rc<Arena>> {
    ARENA
        .try_with(|slot| {
            let mut slot = slot.borrow_mut();
            if slot.is_none() {
                *slot = Arena::new(CONFIG.with(Cell::get)).map(Rc::new);
            }
            slot.clone()
        })
        .ok()
        .flatten()
}

/// The counters of the calling thread's arena.
pub fn arena_stats() -> Option<ArenaStats> {
    current_arena().map(|a| a.stats())
}

impl Arena {
    fn new(config: ArenaConfig) -> Option<Self> {
        if config.nr_chunks == 0 || config.chunk_bytes == 0 {
            return None;
        }
        let chunk_bytes = config.chunk_bytes.next_multiple_of(4096);
        let total = chunk_bytes.checked_mul(config.nr_chunks as usize)?;
        let base = map_pages(total)?;
        wipe_on_fork(base, total);
        Some(Self {
            shared: Arc::new(ArenaShared {
                base,
                len_bytes: total,
                chunk_bytes,
                nr_chunks: config.nr_chunks,
                owner: thread_token(),
                returned: ReturnStack::new(config.nr_chunks),
                remote_returns: AtomicU64::new(0),
                fixed_index: AtomicU32::new(NOT_FIXED),
            }),
            free: RefCell::new((0..config.nr_chunks).rev().collect()),
        })
    }

    /// A chunk for a buffer of `len` bytes aligned to `align`, if one fits
    /// and is free.
    pub fn take(&self, len: usize, align: usize) -> Option<Chunk> {
        if len > self.shared.chunk_bytes || align > 4096 {
            return None;
        }
        let mut free = self.free.borrow_mut();
        if free.is_empty() {
            self.shared.returned.take_all(&mut free);
        }
        let chunk = free.pop()?;
        let offset = chunk as usize * self.shared.chunk_bytes;
        // SAFETY: offset < total size, inside the allocation.
        let ptr = unsafe { NonNull::new_unchecked(self.shared.base.as_ptr().add(offset)) };
        Some(Chunk {
            ptr,
            cap: self.shared.chunk_bytes,
            arena: self.shared.clone(),
            index: chunk,
        })
    }

    /// The whole arena as one iovec, for `IORING_REGISTER_BUFFERS`.
    pub fn iovec(&self) -> libc::iovec {
        libc::iovec {
            iov_base: self.shared.base.as_ptr().cast(),
            iov_len: self.shared.len_bytes,
        }
    }

    /// Records the registered-buffer index (or `None` when unregistered).
    /// Called on the owner thread, by its driver.
    pub fn set_fixed_index(&self, index: Option<u16>) {
        // Relaxed: written and read on the owner thread only.
        self.shared
            .fixed_index
            .store(index.map_or(NOT_FIXED, u32::from), Ordering::Relaxed);
        let range = match index {
            Some(i) => (self.shared.base.as_ptr() as usize, self.shared.len_bytes, i),
            None => (0, 0, 0),
        };
        let _ = REGISTERED.try_with(|r| r.set(range));
    }

    /// The registered-buffer index of this arena on this thread's ring.
    pub fn shared_fixed_index(&self) -> Option<u16> {
        self.shared.fixed_index_here()
    }

    pub fn stats(&self) -> ArenaStats {
        ArenaStats {
            nr_chunks: self.shared.nr_chunks,
            chunk_bytes: self.shared.chunk_bytes,
            // Relaxed: a statistic.
            remote_returns: self.shared.remote_returns.load(Ordering::Relaxed),
            registered: self.shared.fixed_index_here().is_some(),
        }
    }
}

impl ArenaShared {
    /// Returns `chunk` from a dropped buffer.
    pub fn give_back(&self, chunk: u32) {
        if thread_token() == self.owner {
            let returned_locally = ARENA
                .try_with(
                    |slot| match slot.try_borrow().ok().and_then(|s| s.clone()) {
                        Some(arena) if std::ptr::eq(Arc::as_ptr(&arena.shared), self) => {
                            arena.free.borrow_mut().push(chunk);
                            true
                        }
                        _ => false,
                    },
                )
                .unwrap_or(false);
            if returned_locally {
                return;
            }
        } else {
            // Relaxed: a statistic.
            self.remote_returns.fetch_add(1, Ordering::Relaxed);
        }
        self.returned.push(chunk);
    }

    /// The registered index, when called on the owner thread.
    #[inline]
    pub fn fixed_index_here(&self) -> Option<u16> {
        if thread_token() != self.owner {
            return None;
        }
        // Relaxed: written and read on the owner thread only.
        match self.fixed_index.load(Ordering::Relaxed) {
            NOT_FIXED => None,
            i => u16::try_from(i).ok(),
        }
    }
}

impl Drop for ArenaShared {
    fn drop(&mut self) {
        // SAFETY: mapped in Arena::new with this length; every DmaBuf of
        // the arena holds an Arc, so none is alive. A ring that still has
        // the pages registered keeps them pinned in the kernel; they are
        // never mapped again for anything else in this process meanwhile
        // (a mapping, unlike a heap block, is not reused while pinned).
        if let Err(e) = unsafe { nix::sys::mman::munmap(self.base.cast(), self.len_bytes) } {
            tracing::warn!(error = %e, "munmap of the buffer arena failed; its pages stay mapped");
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The `VmFlags` of the mapping that holds `addr` (from
    /// `/proc/self/smaps`), or `None` when no mapping holds it.
    fn vm_flags_at(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            if let Some((start, end)) = range.filter(|_| !line.starts_with("VmFlags")) {
                if let (Ok(start), Ok(end)) = (
                    usize::from_str_radix(start, 16),
                    usize::from_str_radix(end, 16),
                ) {
                    inside = (start..end).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return Some(flags.trim().to_owned());
                }
            }
        }
        None
    }

    /// The arena's pages are a mapping of their own, `MADV_WIPEONFORK`
    /// (`wf`), and gone once the arena is: the advice never stays on
    /// memory the allocator reuses (it did with an arena from
    /// `std::alloc`; a forked child's heap then had zeroed pages and
    /// malloc aborted: "unaligned fastbin chunk detected"). Checked in a
    /// forked child, where no other thread maps memory meanwhile.
    #[test]
    fn the_arena_is_its_own_wipe_on_fork_mapping_and_unmapped_when_dropped() {
        crate::testing::in_forked_child(20, || {
            // Freeing a large block raises glibc's mmap threshold above
            // the arena's size, so a heap allocation of it would come
            // from the heap proper (as in a long-running process).
            drop(std::hint::black_box(vec![1u8; 8 << 20]));
            let arena = Arena::new(ArenaConfig::default()).ok_or("arena")?;
            let base = arena.iovec().iov_base as usize;
            let flags = vm_flags_at(base).ok_or("the arena is not mapped")?;
            if !flags.split_whitespace().any(|f| f == "wf") {
                return Err(format!("no wf in the arena's VmFlags: {flags}"));
            }
            drop(arena);
            match vm_flags_at(base) {
                None => Ok(()),
                Some(flags) => Err(format!("still mapped after the drop: {flags}")),
            }
        })
        .unwrap();
    }

    #[test]
    fn chunks_come_back_from_other_threads() {
        let arena = Arena::new(ArenaConfig {
            chunk_bytes: 4096,
            nr_chunks: 2,
        })
        .expect("arena");
        let take = |len, align| arena.take(len, align).map(crate::DmaBuf::from_arena);
        let a = take(4096, 4096).expect("chunk a");
        let b = take(100, 512).expect("chunk b");
        assert!(arena.take(1, 1).is_none(), "exhausted");
        assert_eq!(a.as_ptr() as usize % 4096, 0);
        std::thread::spawn(move || drop((a, b)))
            .join()
            .expect("drop thread");
        assert_eq!(arena.stats().remote_returns, 2);
        let c = take(4096, 4096).expect("returned chunk reused");
        assert!(c.is_from_arena());
        assert!(arena.take(8192, 4096).is_none(), "too big for a chunk");
    }

    #[test]
    fn registered_index_of_covers_memory_inside_the_registered_arena_only() {
        let arena = Arena::new(ArenaConfig {
            chunk_bytes: 8192,
            nr_chunks: 2,
        })
        .expect("arena");
        let base = arena.iovec().iov_base as *const u8;
        assert_eq!(registered_index_of(base, 4096), None, "not registered yet");
        arena.set_fixed_index(Some(3));
        // SAFETY: offsets inside (or one past) the 16 KiB allocation.
        let (mid, end) = unsafe { (base.add(4096), base.add(16384)) };
        assert_eq!(registered_index_of(base, 16384), Some(3), "all of it");
        assert_eq!(
            registered_index_of(mid, 4096),
            Some(3),
            "a piece of a chunk"
        );
        assert_eq!(registered_index_of(mid, 16384), None, "runs past the end");
        assert_eq!(registered_index_of(end, 1), None, "after it");
        assert_eq!(
            registered_index_of(base.wrapping_sub(1), 2),
            None,
            "before it"
        );
        let mid_addr = mid as usize;
        let other = std::thread::spawn(move || registered_index_of(mid_addr as *const u8, 1));
        assert_eq!(other.join().expect("thread"), None, "another thread's ring");
        arena.set_fixed_index(None);
        assert_eq!(registered_index_of(mid, 4096), None, "unregistered");
    }
}
