//! Owned IO buffers: the open [`IoBuf`] and [`IoBufMut`] traits, the shape
//! tokio-uring, monoio and compio use (a pointer that stays put when the
//! value moves, an initialised length, a total capacity), and their
//! implementations for `Vec<u8>`, `Box<[u8]>`, [`bytes::BytesMut`],
//! [`bytes::Bytes`] (write source only), [`DmaBuf`] and [`Page`].
//!
//! An IO takes its buffer by value and gives it back with the result
//! (`(Result<usize, Error>, B)`), so the kernel may use the memory while
//! the caller cannot touch it; a future dropped while its IO is in flight
//! hands the buffer to the engine, which frees it once the kernel is done.
//!
//! Invariants:
//! - A write covers `[0, bytes_init())` of its buffer; a read fills from
//!   the start, at most `bytes_total()` bytes, and then calls
//!   `set_init(n)` with the `n` bytes it read (only after a successful
//!   read).
//! - Nothing here copies: a buffer whose address does not meet the
//!   device's direct-IO alignment is bounced by the device handle (see
//!   [`Device::read_at`](crate::Device::read_at)), not by these impls.

use bytes::{Bytes, BytesMut};
use plugio_device::DmaBuf;

use crate::region::Page;

/// Memory an IO can write from: a stable address and how many bytes are
/// initialised. Open: implement it for your own buffer type.
///
/// Idea: tokio-uring's and monoio's `IoBuf` (same method names as
/// tokio-uring's).
///
/// # Safety
/// An implementation promises, for a value `b`:
/// 1. `b.stable_ptr()` is valid for reads of `b.bytes_init()` bytes, and
///    those bytes are initialised.
/// 2. The address and the memory behind it stay the same when `b` is
///    moved (the bytes live on the heap or in static memory, not inside
///    `b`), and stay valid until `b` is dropped or used through `&mut`.
///    The engine moves `b` into and out of its futures while the kernel
///    reads the memory.
/// 3. `b.bytes_init() <= b.bytes_total()`.
///
/// `Send + 'static`: the buffer may be handed to the engine (a future
/// dropped mid-IO) and dropped later, on the core's thread.
pub unsafe trait IoBuf: Send + 'static {
    /// The first byte. Stable across moves (see the trait's safety
    /// contract).
    fn stable_ptr(&self) -> *const u8;

    /// Initialised bytes from [`stable_ptr`](Self::stable_ptr): what a
    /// write sends.
    fn bytes_init(&self) -> usize;

    /// Bytes the memory holds in all (initialised or not): the most a read
    /// may fill. For types that cannot grow past their length (`Box<[u8]>`,
    /// [`Page`], [`DmaBuf`], whose length is the IO size), this is their
    /// length.
    fn bytes_total(&self) -> usize;
}

/// Memory an IO can read into: an [`IoBuf`] that may be written through
/// its stable address and told how much was filled.
///
/// # Safety
/// On top of [`IoBuf`]'s contract:
/// 1. [`stable_mut_ptr`](Self::stable_mut_ptr) returns the same address as
///    `stable_ptr`, valid for writes of `bytes_total()` bytes.
/// 2. While the value is owned by an IO, nothing else reads or writes that
///    memory: the value owns it exclusively (a view into memory shared
///    with another live value must not implement this trait).
/// 3. After `set_init(n)` (with `n <= bytes_total()`), `bytes_init()`
///    returns `n` for types that track it, and the first `n` bytes are
///    treated as initialised.
pub unsafe trait IoBufMut: IoBuf {
    /// The first byte, for writing. Same address as
    /// [`IoBuf::stable_ptr`].
    fn stable_mut_ptr(&mut self) -> *mut u8;

    /// Records that the first `len_bytes` bytes now hold data (a read
    /// filled them). Types that track a length set it to `len_bytes`
    /// (shorter after a short read at end of file: set it back before the
    /// next full read); fixed-size types ignore it.
    ///
    /// # Safety
    /// `len_bytes <= bytes_total()`, and the first `len_bytes` bytes were
    /// initialised (the kernel wrote them).
    unsafe fn set_init(&mut self, len_bytes: usize);
}

// SAFETY: a Vec's heap buffer does not move when the Vec does; `len` bytes
// are initialised, `capacity` are allocated; the Vec owns them alone.
unsafe impl IoBuf for Vec<u8> {
    #[inline]
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    #[inline]
    fn bytes_init(&self) -> usize {
        self.len()
    }
    #[inline]
    fn bytes_total(&self) -> usize {
        self.capacity()
    }
}

// SAFETY: see the `IoBuf` impl; `as_mut_ptr` is the same address.
unsafe impl IoBufMut for Vec<u8> {
    #[inline]
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    #[inline]
    unsafe fn set_init(&mut self, len_bytes: usize) {
        // SAFETY: the caller promises `len_bytes <= capacity` and that the
        // bytes are initialised.
        unsafe { self.set_len(len_bytes) }
    }
}

// SAFETY: a boxed slice's bytes live on the heap (or are a dangling,
// zero-length pointer), all initialised, owned by the box.
unsafe impl IoBuf for Box<[u8]> {
    #[inline]
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    #[inline]
    fn bytes_init(&self) -> usize {
        self.len()
    }
    #[inline]
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

// SAFETY: as the `IoBuf` impl; the box owns its bytes exclusively.
unsafe impl IoBufMut for Box<[u8]> {
    #[inline]
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    #[inline]
    unsafe fn set_init(&mut self, _len_bytes: usize) {}
}

// SAFETY: a BytesMut's bytes are on the heap and do not move with the
// handle; `len` are initialised, `capacity` reserved; a BytesMut is the
// unique owner of its view (split halves are disjoint).
unsafe impl IoBuf for BytesMut {
    #[inline]
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    #[inline]
    fn bytes_init(&self) -> usize {
        self.len()
    }
    #[inline]
    fn bytes_total(&self) -> usize {
        self.capacity()
    }
}

// SAFETY: see the `IoBuf` impl.
unsafe impl IoBufMut for BytesMut {
    #[inline]
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    #[inline]
    unsafe fn set_init(&mut self, len_bytes: usize) {
        // SAFETY: the caller promises `len_bytes <= capacity` and that the
        // bytes are initialised.
        unsafe { self.set_len(len_bytes) }
    }
}

// SAFETY: `Bytes` is immutable shared memory on the heap or static; reads
// by the kernel race with nothing. (No `IoBufMut`: it may be shared.)
unsafe impl IoBuf for Bytes {
    #[inline]
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    #[inline]
    fn bytes_init(&self) -> usize {
        self.len()
    }
    #[inline]
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

// SAFETY: a DmaBuf owns its aligned allocation (heap, arena chunk or cache
// buffer), which does not move with the handle; its whole capacity is
// initialised. Its length is the IO size (`bytes_total` = `len`).
unsafe impl IoBuf for DmaBuf {
    #[inline]
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    #[inline]
    fn bytes_init(&self) -> usize {
        self.len()
    }
    #[inline]
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

// SAFETY: see the `IoBuf` impl; `set_len(n)` with `n <= len <= capacity`.
unsafe impl IoBufMut for DmaBuf {
    #[inline]
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    #[inline]
    unsafe fn set_init(&mut self, len_bytes: usize) {
        self.set_len(len_bytes);
    }
}

// SAFETY: a page is a disjoint, uniquely owned range of its region's
// allocation, which its `Arc` keeps alive and in place; zeroed at
// allocation, so initialised.
unsafe impl IoBuf for Page {
    #[inline]
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    #[inline]
    fn bytes_init(&self) -> usize {
        self.len()
    }
    #[inline]
    fn bytes_total(&self) -> usize {
        self.len()
    }
}

// SAFETY: see the `IoBuf` impl; no other page covers this range.
unsafe impl IoBufMut for Page {
    #[inline]
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }
    #[inline]
    unsafe fn set_init(&mut self, _len_bytes: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moved<B>(b: B) -> B {
        b
    }

    #[test]
    fn addresses_survive_moves_and_lengths_follow_set_init() {
        let mut v: Vec<u8> = Vec::with_capacity(4096);
        let addr = v.stable_mut_ptr() as usize;
        assert_eq!((v.bytes_init(), v.bytes_total()), (0, 4096));
        // SAFETY: a test pretending 100 bytes were read (they are written
        // first).
        unsafe {
            std::ptr::write_bytes(v.stable_mut_ptr(), 7, 100);
            v.set_init(100);
        }
        let v = moved(v);
        assert_eq!(v.stable_ptr() as usize, addr);
        assert_eq!(v.as_slice(), &[7; 100][..]);

        let mut m = BytesMut::with_capacity(8192);
        let addr = m.stable_mut_ptr() as usize;
        let m = moved(m);
        assert_eq!((m.stable_ptr() as usize, m.bytes_init()), (addr, 0));
        assert!(m.bytes_total() >= 8192);

        let b: Box<[u8]> = vec![1u8; 512].into_boxed_slice();
        assert_eq!((b.bytes_init(), b.bytes_total()), (512, 512));

        let mut d = DmaBuf::heap(4096, 4096);
        // SAFETY: 10 <= len; the bytes are initialised (zeroed).
        unsafe { d.set_init(10) };
        assert_eq!(
            (d.bytes_init(), d.bytes_total(), d.capacity()),
            (10, 10, 4096)
        );

        let bytes = Bytes::from_static(b"hello");
        assert_eq!(bytes.bytes_init(), 5);
    }
}
