//! The CQ read in place: a second mapping of a ring's completion queue
//! ([`CqMap`]), so that a reap reads each CQE where the kernel wrote it.
//! The io-uring crate's `CompletionQueue` copies every CQE out through its
//! `Entry::clone`, which is out of line (a call per CQE); this view reads
//! them with an inlined copy, of which only the fields used are loaded.
//!
//! Invariants:
//! - The mapping covers the CQ ring (its header and every CQE slot) of
//!   the ring it was made from, which lives as long: both are fields of
//!   the same [`RingCore`](super::uring::RingCore) (and a stale ring's,
//!   never dropped in a forked child, where neither mapping exists, is
//!   never unmapped there either).
//! - Only the thread that owns the ring moves the CQ head, through this
//!   view or the io-uring crate's `CompletionQueue`, never both at once
//!   (the reap holds the `IoUring` borrowed while a [`Cqes`] lives): the
//!   head the kernel sees is always the last one published.
//! - A [`Cqes`] hands out the CQEs from the head it loaded to the tail it
//!   loaded; its drop publishes that tail as the new head (as the crate's
//!   `CompletionQueue` does), so each CQE is handed out once.

use std::io;
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use io_uring::{cqueue, squeue, IoUring};

/// `IORING_OFF_CQ_RING` from the uapi header: the mmap offset of the CQ
/// ring.
const IORING_OFF_CQ_RING: libc::off_t = 0x800_0000;

/// `struct io_cqring_offsets` from the uapi header.
#[repr(C)]
#[allow(dead_code)] // Mirrors the uapi layout: not every field is read.
struct CqOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    overflow: u32,
    cqes: u32,
    flags: u32,
    resv1: u32,
    user_addr: u64,
}

/// `struct io_uring_params` from the uapi header, of which
/// `io_uring::Parameters` is a transparent wrapper (its documentation
/// says so): the CQ offsets are read from it.
#[repr(C)]
#[allow(dead_code)] // Mirrors the uapi layout: not every field is read.
struct Params {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    sq_off: [u32; 10],
    cq_off: CqOffsets,
}

const _: () = assert!(std::mem::size_of::<Params>() == 120);
const _: () = assert!(std::mem::size_of::<Params>() == std::mem::size_of::<io_uring::Parameters>());

/// A mapping of one ring's CQ (see the module header), of CQEs of type
/// `C`.
pub(crate) struct CqMap<C: cqueue::EntryMarker> {
    base: NonNull<libc::c_void>,
    len: usize,
    head: *const AtomicU32,
    tail: *const AtomicU32,
    mask: u32,
    cqes: *const C,
    _entries: PhantomData<C>,
}

impl<C: cqueue::EntryMarker> CqMap<C> {
    /// Maps `uring`'s CQ a second time (`MADV_DONTFORK`, as the crate's
    /// own mappings: a forked child never has it).
    ///
    /// # Errors
    /// The kernel refused the mapping (`ENOMEM`).
    pub fn new<S: squeue::EntryMarker>(uring: &IoUring<S, C>) -> io::Result<Self> {
        // SAFETY: `Parameters` is `#[repr(transparent)]` over the uapi
        // `io_uring_params`, which `Params` mirrors field for field (same
        // size, asserted above).
        let p = unsafe { &*std::ptr::from_ref(uring.params()).cast::<Params>() };
        debug_assert_eq!(p.cq_entries, uring.params().cq_entries());
        let off = &p.cq_off;
        let len = off.cqes as usize + p.cq_entries as usize * std::mem::size_of::<C>();
        // SAFETY: a new shared mapping of the ring's descriptor at the CQ
        // ring's offset; no existing memory is touched.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                uring.as_raw_fd(),
                IORING_OFF_CQ_RING,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(addr).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let map = |o: u32| base.as_ptr().cast::<u8>().wrapping_add(o as usize);
        // SAFETY: `ring_mask` is a u32 the kernel set before the ring was
        // returned and never changes, inside the mapping.
        let mask = unsafe { map(off.ring_mask).cast::<u32>().read() };
        let cq = Self {
            base,
            len,
            head: map(off.head).cast::<AtomicU32>(),
            tail: map(off.tail).cast::<AtomicU32>(),
            mask,
            cqes: map(off.cqes).cast::<C>(),
            _entries: PhantomData,
        };
        debug_assert_eq!(mask, p.cq_entries - 1);
        // SAFETY: the range is the mapping just made.
        if unsafe { libc::madvise(addr, len, libc::MADV_DONTFORK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(cq)
    }

    /// The CQEs in the CQ now; they are released (the head moves past
    /// them) when the returned iterator is dropped. The caller holds the
    /// ring's `IoUring` borrowed for as long (see the module invariants).
    #[inline]
    pub fn drain(&self) -> Cqes<'_, C> {
        // SAFETY: `head` and `tail` point into the live mapping.
        let (head, tail) = unsafe {
            (
                // Relaxed: only this thread stores the head (the kernel
                // reads it).
                (*self.head).load(Ordering::Relaxed),
                // Acquire: pairs with the kernel's release store of the
                // tail after it wrote the CQEs before it.
                (*self.tail).load(Ordering::Acquire),
            )
        };
        Cqes {
            map: self,
            head,
            tail,
        }
    }
}

impl<C: cqueue::EntryMarker> Drop for CqMap<C> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no `Cqes`
        // borrows it any more.
        unsafe { libc::munmap(self.base.as_ptr(), self.len) };
    }
}

/// The CQEs of one reap pass, read from the CQ (see
/// [`CqMap::drain`]).
pub(crate) struct Cqes<'a, C: cqueue::EntryMarker> {
    map: &'a CqMap<C>,
    head: u32,
    tail: u32,
}

impl<C: cqueue::EntryMarker> Iterator for Cqes<'_, C> {
    type Item = C;

    #[inline]
    fn next(&mut self) -> Option<C> {
        if self.head == self.tail {
            return None;
        }
        let slot = (self.head & self.map.mask) as usize;
        self.head = self.head.wrapping_add(1);
        // SAFETY: the slot is inside the mapping (masked), and the kernel
        // wrote it before the tail that was loaded with Acquire; it does
        // not write it again until the head moves past it (at this
        // iterator's drop). The CQE types are plain data (no `Drop`, every
        // bit pattern valid): a bitwise copy, inlined, where the crate's
        // `Entry::clone` is a call.
        Some(unsafe { self.map.cqes.add(slot).read() })
    }
}

impl<C: cqueue::EntryMarker> Drop for Cqes<'_, C> {
    #[inline]
    fn drop(&mut self) {
        // Release: pairs with the kernel's acquire load of the head before
        // it writes a CQE slot: our reads of the CQEs handed out come
        // before it reuses them.
        // SAFETY: `head` points into the live mapping.
        unsafe { (*self.map.head).store(self.head, Ordering::Release) };
    }
}
