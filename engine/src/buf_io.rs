//! IO on caller-owned buffers: the futures behind
//! [`Device::read_at`], [`Device::write_at`] and their vectored forms,
//! with the bounce through an aligned buffer, and the exact forms
//! ([`Device::read_exact_at`], [`Device::write_all_at`]).
//!
//! # Mechanism
//!
//! The future owns the caller's buffers (and a bounce buffer, if any);
//! the bio it issues holds only their addresses. On completion the future
//! copies a bounced read out, marks the bytes read (`set_init`) and hands
//! the buffers back. A future dropped while its bio is in flight moves the
//! memory the kernel uses (the bounce buffer, else the caller's buffers)
//! into the bio (`Issued::release` in `device.rs`), which frees it once
//! the kernel is done: the only allocation of the path, and only on that
//! cancel path.
//!
//! Invariants:
//! - The addresses in the bio point into memory this future (or, after a
//!   drop, the bio) owns, which does not move (the [`IoBuf`] contract).
//! - A bounce happens only with `DeviceOptions::bounce_unaligned`, only
//!   when some segment's address (or, for several segments, length) is
//!   not aligned for direct IO, and the bounce buffer comes from
//!   [`Device::alloc_buf`] (so from the registered arena when it has room).
//! - `set_init` is called only after a successful read, with at most the
//!   bytes the buffer offered.

use std::any::Any;
use std::future::Future;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use plugio_device::{DmaBuf, Error, ErrorKind, IoFlags, OpKind};

use crate::bio::{BioBuf, BioResult, Keep, Seg};
use crate::buf::{IoBuf, IoBufMut};
use crate::device::{issue_inline, BioInit, Device, Issued, MAX_IO_BYTES};
use crate::shared::DeviceShared;

/// One caller buffer.
pub(crate) struct One<B>(pub B);

/// Several caller buffers, in file order.
pub(crate) struct Many<B>(pub Vec<B>);

/// What an IO future owns of the caller's: one buffer or several.
pub(crate) trait BufSet: Send + 'static {
    /// What the caller gets back.
    type Out;
    fn into_out(self) -> Self::Out;
    /// The segments a write sends (the initialised bytes).
    fn write_segs(&self) -> BioBuf;
    /// The registered buffer the memory lies in, on this core's ring.
    fn fixed_index(&self) -> Option<u16>;
    /// Copies the initialised bytes, in order, to `out` (a write bounce).
    fn gather(&self, out: &mut [u8]);
}

/// The read side of a [`BufSet`].
pub(crate) trait BufSetMut: BufSet {
    /// The segments a read fills (every byte the buffers offer).
    fn read_segs(&mut self) -> BioBuf;
    /// Copies `src` in, in order, and marks what each buffer received.
    fn scatter(&mut self, src: &[u8]);
    /// Marks the first `n` bytes, in order, as read.
    fn set_read(&mut self, n: usize);
}

fn seg(addr: *const u8, len: usize) -> Seg {
    Seg {
        addr: addr as usize,
        len,
    }
}

impl<B: IoBuf> BufSet for One<B> {
    type Out = B;
    fn into_out(self) -> B {
        self.0
    }
    fn write_segs(&self) -> BioBuf {
        BioBuf::One {
            seg: seg(self.0.stable_ptr(), self.0.bytes_init()),
            fixed: None,
        }
    }
    #[inline]
    fn fixed_index(&self) -> Option<u16> {
        // A type test the compiler resolves for a DmaBuf chunk of the
        // registered arena; any other buffer counts when its memory lies
        // inside the registered arena (carved out of it by its owner).
        (&self.0 as &dyn Any)
            .downcast_ref::<DmaBuf>()
            .and_then(DmaBuf::fixed_index)
            .or_else(|| {
                plugio_device::buf::registered_index_of(self.0.stable_ptr(), self.0.bytes_total())
            })
    }
    fn gather(&self, out: &mut [u8]) {
        out.copy_from_slice(init_bytes(&self.0));
    }
}

impl<B: IoBufMut> BufSetMut for One<B> {
    fn read_segs(&mut self) -> BioBuf {
        let len = self.0.bytes_total();
        BioBuf::One {
            seg: seg(self.0.stable_mut_ptr(), len),
            fixed: None,
        }
    }
    fn scatter(&mut self, src: &[u8]) {
        fill(&mut self.0, src);
    }
    fn set_read(&mut self, n: usize) {
        debug_assert!(n <= self.0.bytes_total());
        // SAFETY: the kernel wrote the first `n` bytes, at most the
        // `bytes_total` the read asked for.
        unsafe { self.0.set_init(n) };
    }
}

impl<B: IoBuf> BufSet for Many<B> {
    type Out = Vec<B>;
    fn into_out(self) -> Vec<B> {
        self.0
    }
    fn write_segs(&self) -> BioBuf {
        BioBuf::Many(
            self.0
                .iter()
                .map(|b| seg(b.stable_ptr(), b.bytes_init()))
                .collect(),
        )
    }
    fn fixed_index(&self) -> Option<u16> {
        None
    }
    fn gather(&self, out: &mut [u8]) {
        let mut at = 0;
        for b in &self.0 {
            let bytes = init_bytes(b);
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        }
    }
}

impl<B: IoBufMut> BufSetMut for Many<B> {
    fn read_segs(&mut self) -> BioBuf {
        BioBuf::Many(
            self.0
                .iter_mut()
                .map(|b| {
                    let len = b.bytes_total();
                    seg(b.stable_mut_ptr(), len)
                })
                .collect(),
        )
    }
    fn scatter(&mut self, mut src: &[u8]) {
        for b in &mut self.0 {
            let take = src.len().min(b.bytes_total());
            fill(b, &src[..take]);
            src = &src[take..];
        }
    }
    fn set_read(&mut self, mut n: usize) {
        for b in &mut self.0 {
            let take = n.min(b.bytes_total());
            // SAFETY: the kernel filled the buffers in order; this one got
            // its first `take` bytes, at most what it offered.
            unsafe { b.set_init(take) };
            n -= take;
        }
    }
}

/// The initialised bytes of `b`.
fn init_bytes<B: IoBuf>(b: &B) -> &[u8] {
    // SAFETY: the IoBuf contract: `stable_ptr` is valid for reads of
    // `bytes_init` initialised bytes while `b` is borrowed.
    unsafe { std::slice::from_raw_parts(b.stable_ptr(), b.bytes_init()) }
}

/// Copies `src` (at most `bytes_total`) to the start of `b` and marks it
/// initialised.
fn fill<B: IoBufMut>(b: &mut B, src: &[u8]) {
    assert!(
        src.len() <= b.bytes_total(),
        "bounce copy beyond the buffer"
    );
    // SAFETY: `stable_mut_ptr` is valid for writes of `bytes_total` bytes
    // (IoBufMut contract), `src` fits, and the bounce buffer never overlaps
    // the caller's memory.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), b.stable_mut_ptr(), src.len());
        b.set_init(src.len());
    }
}

/// Total bytes of a bio's segments.
#[inline]
fn total_len(buf: &BioBuf) -> u64 {
    match buf {
        BioBuf::None => 0,
        BioBuf::One { seg, .. } => seg.len as u64,
        BioBuf::Many(v) => v.iter().map(|s| s.len as u64).sum(),
    }
}

/// True when `value` is not a multiple of `align` (> 0; a mask for the
/// powers of two every built geometry has).
#[inline]
fn misaligned(value: usize, align: usize) -> bool {
    if align.is_power_of_two() {
        value & (align - 1) != 0
    } else {
        value % align != 0
    }
}

/// Whether `buf` must go through an aligned copy for the `(memory,
/// block)` alignments of [`DeviceShared::bounce_align`]: an address off the
/// memory alignment, or (several segments) a segment length off the block
/// alignment. One segment's length is the IO's length, which a copy
/// cannot fix.
#[inline]
fn needs_bounce((mem, block): (usize, usize), buf: &BioBuf) -> bool {
    match buf {
        BioBuf::One { seg, .. } => misaligned(seg.addr, mem),
        BioBuf::Many(v) => v
            .iter()
            .any(|s| misaligned(s.addr, mem) || misaligned(s.len, block)),
        BioBuf::None => false,
    }
}

/// A read or a write: what the IO does with the caller's buffers.
pub(crate) trait Direction<S: BufSet> {
    /// The op.
    const OP: OpKind;
    /// The segments the IO covers.
    fn segs(bufs: &mut S) -> BioBuf;
    /// Fills a bounce buffer before the IO (writes: with the data).
    fn fill_bounce(bufs: &S, bounce: &mut DmaBuf);
    /// After a successful IO of `n` bytes (through `bounce`, if any).
    fn finish(bufs: &mut S, bounce: Option<&DmaBuf>, n: usize);
}

/// Reads into the caller's buffers.
pub(crate) struct Read;
/// Writes from the caller's buffers.
pub(crate) struct Write;

impl<S: BufSetMut> Direction<S> for Read {
    const OP: OpKind = OpKind::Read;
    #[inline]
    fn segs(bufs: &mut S) -> BioBuf {
        bufs.read_segs()
    }
    fn fill_bounce(_: &S, _: &mut DmaBuf) {}
    #[inline]
    fn finish(bufs: &mut S, bounce: Option<&DmaBuf>, n: usize) {
        match bounce {
            Some(b) => bufs.scatter(&b.as_slice()[..n]),
            None => bufs.set_read(n),
        }
    }
}

impl<S: BufSet> Direction<S> for Write {
    const OP: OpKind = OpKind::Write;
    #[inline]
    fn segs(bufs: &mut S) -> BioBuf {
        bufs.write_segs()
    }
    fn fill_bounce(bufs: &S, bounce: &mut DmaBuf) {
        bufs.gather(bounce.as_mut_slice());
    }
    #[inline]
    fn finish(_: &mut S, _: Option<&DmaBuf>, _: usize) {}
}

/// The future of a read or write on caller-owned buffers; resolves to the
/// bytes moved and the buffers. The segments and any bounce buffer are
/// worked out at the first poll, on the core that issues the IO; the bio
/// holds only their addresses.
pub(crate) struct BufIo<'a, S: BufSet, D> {
    shared: &'a Arc<DeviceShared>,
    offset_bytes: u64,
    flags: IoFlags,
    issued: Option<Issued>,
    /// The aligned copy the IO uses instead of the caller's memory.
    /// Dropped by hand, as `bufs` is: see [`Drop`].
    bounce: ManuallyDrop<Option<DmaBuf>>,
    /// `None` once the result was handed out.
    bufs: ManuallyDrop<Option<S>>,
    dir: PhantomData<fn() -> D>,
}

// The buffers are never pinned (only their heap memory is used, by
// address), so the future may move freely.
impl<S: BufSet, D> Unpin for BufIo<'_, S, D> {}

impl<'a, S: BufSet, D: Direction<S>> BufIo<'a, S, D> {
    /// The IO of `bufs` at `offset_bytes` on `dev`.
    pub(crate) fn new(dev: &'a Device, bufs: S, offset_bytes: u64, flags: IoFlags) -> Self {
        BufIo {
            shared: dev.shared(),
            offset_bytes,
            flags,
            issued: None,
            bounce: ManuallyDrop::new(None),
            bufs: ManuallyDrop::new(Some(bufs)),
            dir: PhantomData,
        }
    }

    /// First poll: the bio's memory (the caller's, or a bounce copy) and
    /// its registered-buffer index on this core's ring, then the bio.
    fn start(&mut self, cx: &Context<'_>) -> Poll<(Result<usize, Error>, S::Out)> {
        let Some(bufs) = self.bufs.as_mut() else {
            panic!("a plugio IO future was polled after it completed")
        };
        let mut buf = D::segs(bufs);
        let len_bytes = total_len(&buf);
        match self.shared.bounce_align {
            Some(align)
                if needs_bounce(align, &buf) && len_bytes > 0 && len_bytes <= MAX_IO_BYTES =>
            {
                let mut bounce = self.shared.alloc_buf(len_bytes as usize);
                D::fill_bounce(bufs, &mut bounce);
                let one = BioBuf::One {
                    seg: seg(bounce.as_mut_ptr(), bounce.len()),
                    fixed: bounce.fixed_index(),
                };
                drop(std::mem::replace(&mut buf, one));
                *self.bounce = Some(bounce);
            }
            _ => {
                if let BioBuf::One { fixed, .. } = &mut buf {
                    *fixed = bufs.fixed_index();
                }
            }
        }
        let init = BioInit {
            op: D::OP,
            flags: self.flags,
            offset_bytes: self.offset_bytes,
            len_bytes,
            buf,
            bounced: self.bounce.is_some(),
        };
        match issue_inline(self.shared, || init, cx) {
            Ok(issued) => {
                self.issued = Some(issued);
                Poll::Pending
            }
            Err(r) => Poll::Ready(self.finish(r)),
        }
    }

    /// The error of this IO as it is handed out (see
    /// [`crate::device::name_io`]).
    #[cold]
    fn name_error(&self, e: Error, bufs: &mut S) -> Error {
        let len_bytes = total_len(&D::segs(bufs));
        crate::device::name_io(self.shared, e, D::OP, self.offset_bytes, len_bytes)
    }

    /// Hands the buffers back with the result.
    #[inline(always)]
    fn finish(&mut self, r: BioResult) -> (Result<usize, Error>, S::Out) {
        self.issued = None;
        let Some(mut bufs) = self.bufs.take() else {
            panic!("a plugio IO future was polled after it completed")
        };
        let result = match r {
            Ok(n) => {
                D::finish(&mut bufs, self.bounce.as_ref(), n as usize);
                Ok(n as usize)
            }
            Err(e) => Err(self.name_error(e, &mut bufs)),
        };
        // Stored only where there is one to drop (the common IO has
        // none: one test, which `D::finish`'s own test of it meets).
        if self.bounce.is_some() {
            *self.bounce = None;
        }
        (result, bufs.into_out())
    }
}

impl<S: BufSet, D: Direction<S>> Future for BufIo<'_, S, D> {
    type Output = (Result<usize, Error>, S::Out);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match this.issued {
            None => this.start(cx),
            Some(issued) => {
                // The common case inline, with no call (see
                // `Issued::take_ok`); `Issued::poll` does the rest.
                let r = match issued.take_ok() {
                    Some(n) => Ok(n),
                    None => ready!(issued.poll(cx)),
                };
                #[cfg(feature = "trace-io")]
                crate::device::trace_done(this.shared, issued, &r);
                Poll::Ready(this.finish(r))
            }
        }
    }
}

impl<S: BufSet, D> Drop for BufIo<'_, S, D> {
    /// A finished IO (the common case: its result was taken) has nothing
    /// to release and no buffer left: three tests, inline, so that
    /// dropping the future needs no frame of its own. The buffers are
    /// in `ManuallyDrop` so that no drop glue of theirs follows (an
    /// out-of-line call of 12 instructions per read, for two `None`s).
    #[inline]
    fn drop(&mut self) {
        if self.issued.is_some() || self.bufs.is_some() || self.bounce.is_some() {
            self.drop_slow();
        }
    }
}

impl<S: BufSet, D> BufIo<'_, S, D> {
    /// [`Drop`] of a future that still holds buffers (never polled, or
    /// dropped before its result was taken). An IO whose bio has not
    /// given its result orphans the bio with the memory the kernel may
    /// still use: the bounce buffer when there is one, else the caller's
    /// buffers. The buffers are taken into locals first, so that a panic
    /// in the release still drops what it does not keep (as the fields'
    /// drop glue did; found by a reviewer).
    #[cold]
    #[inline(never)]
    fn drop_slow(&mut self) {
        // SAFETY: called only from `drop`, once; neither field is used
        // after it.
        let (bounce, bufs) = unsafe {
            (
                ManuallyDrop::take(&mut self.bounce),
                ManuallyDrop::take(&mut self.bufs),
            )
        };
        let Some(issued) = self.issued.take() else {
            return;
        };
        let keep: Option<Keep> = match bounce {
            Some(b) => Some(Box::new(b)),
            None => bufs.map(|b| Box::new(b) as Keep),
        };
        issued.release(self.shared, keep);
    }
}

impl Device {
    /// Reads at `offset_bytes` into `buf`, any [`IoBufMut`] (`Vec<u8>`,
    /// `Box<[u8]>`, `BytesMut`, [`DmaBuf`], [`Page`](crate::Page), or your
    /// own), and gives the buffer back with the bytes read: up to
    /// `buf.bytes_total()` bytes (a `Vec`'s capacity, a `DmaBuf`'s length),
    /// filled from the buffer's start; fewer only at end of file (0 at or
    /// past it), and then `set_init(n)` shortens a `Vec`, `BytesMut` or
    /// `DmaBuf` to `n` (set it back before reusing it for a full read).
    /// After an error the buffer keeps its length and its contents are
    /// unspecified.
    ///
    /// With `O_DIRECT`, a buffer whose address is not aligned to the
    /// device's `mem_align_bytes` (a `Vec`'s heap memory, usually) is read
    /// through an aligned buffer from [`alloc_buf`](Self::alloc_buf) and
    /// copied (counted in [`IoStats::bounce_ios`](crate::IoStats) and
    /// `bounce_bytes`), or refused when
    /// [`DeviceOptions::bounce_unaligned`](crate::DeviceOptions::bounce_unaligned)
    /// is off. A [`DmaBuf`] from the core's registered arena goes out as
    /// `READ_FIXED`.
    ///
    /// Idea: tokio-uring's and monoio's `read_at(buf, pos)`.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let (n, _) = dev.write_at(vec![7u8; 4096], 0).await;
    /// n?;
    /// let (n, buf) = dev.read_at(Vec::with_capacity(4096), 0).await;
    /// assert_eq!(n?, 4096);
    /// assert_eq!(buf, vec![7u8; 4096]);
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// Invalid input (a zero or unaligned length, an unaligned offset, a
    /// range beyond the device, an unaligned address with bouncing off)
    /// before submission; the device's error otherwise.
    pub fn read_at<B: IoBufMut>(
        &self,
        buf: B,
        offset_bytes: u64,
    ) -> impl Future<Output = (Result<usize, Error>, B)> + Send + '_ {
        self.read_at_with(buf, offset_bytes, IoFlags::NONE)
    }

    /// [`read_at`](Self::read_at) with flags (priority, NOMERGE). `FUA`
    /// and `PREFLUSH` are write flags: a read with either is refused
    /// before submission
    /// ([`InvalidInput::WriteOnlyFlags`](plugio_device::InvalidInput::WriteOnlyFlags)),
    /// as the kernel refuses them on a read.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// use plugio::IoFlags;
    /// let (n, _) = dev.read_at_with(vec![0u8; 4096], 0, IoFlags::NOMERGE).await;
    /// assert_eq!(n?, 0, "the example file is empty");
    /// # Ok(()) });
    /// ```
    pub fn read_at_with<B: IoBufMut>(
        &self,
        buf: B,
        offset_bytes: u64,
        flags: IoFlags,
    ) -> impl Future<Output = (Result<usize, Error>, B)> + Send + '_ {
        BufIo::<_, Read>::new(self, One(buf), offset_bytes, flags)
    }

    /// Writes the initialised bytes of `buf` (any [`IoBuf`]: `Vec<u8>`,
    /// `Box<[u8]>`, `BytesMut`, `Bytes`, [`DmaBuf`], [`Page`](crate::Page),
    /// or your own) at `offset_bytes` and gives the buffer back with the
    /// bytes written: all of them, unless the device ran out of space
    /// after writing a first part of them and nothing past it (then that
    /// part, as `pwrite(2)` returns a short count; a write of the rest
    /// normally fails with `ErrorKind::OutOfSpace`, and
    /// [`write_all_at`](Self::write_all_at) reports the short count as
    /// `WriteZero`). Where a later part of a large write landed too, the
    /// write fails with `OutOfSpace` and what it left is unknown. An
    /// address that does not meet `O_DIRECT` alignment is copied into an
    /// aligned buffer first, as in [`read_at`](Self::read_at); a [`DmaBuf`]
    /// from the registered arena goes out as `WRITE_FIXED`.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let (n, buf) = dev.write_at(bytes::Bytes::from(vec![1u8; 8192]), 4096).await;
    /// assert_eq!(n?, 8192);
    /// assert_eq!(buf.len(), 8192);
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// As [`read_at`](Self::read_at); and, on a regular file, a write that
    /// would end past the process's file size limit (`RLIMIT_FSIZE`,
    /// `ulimit -f`) while `SIGXFSZ` has its default action is refused
    /// before submission with
    /// [`InvalidInput::FileSizeLimit`](plugio_device::InvalidInput::FileSizeLimit)
    /// (the kernel would end the process with `SIGXFSZ`); a program that
    /// ignores or handles the signal gets the kernel's short count and
    /// `EFBIG`, as from `pwrite(2)`.
    pub fn write_at<B: IoBuf>(
        &self,
        buf: B,
        offset_bytes: u64,
    ) -> impl Future<Output = (Result<usize, Error>, B)> + Send + '_ {
        self.write_at_with(buf, offset_bytes, IoFlags::NONE)
    }

    /// [`write_at`](Self::write_at) with flags: [`IoFlags::FUA`] makes the
    /// write durable when it completes; priority; NOMERGE.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// use plugio::IoFlags;
    /// let (n, _) = dev.write_at_with(vec![2u8; 4096], 0, IoFlags::FUA).await;
    /// assert_eq!(n?, 4096);
    /// # Ok(()) });
    /// ```
    pub fn write_at_with<B: IoBuf>(
        &self,
        buf: B,
        offset_bytes: u64,
        flags: IoFlags,
    ) -> impl Future<Output = (Result<usize, Error>, B)> + Send + '_ {
        BufIo::<_, Write>::new(self, One(buf), offset_bytes, flags)
    }

    /// Reads into several buffers in order (`preadv`), starting at
    /// `offset_bytes`; each buffer receives up to its `bytes_total()` and
    /// gets `set_init` with what it received. Unaligned buffers are
    /// bounced as one, as in [`read_at`](Self::read_at).
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let (n, _) = dev.write_at(vec![3u8; 8192], 0).await;
    /// n?;
    /// let bufs = vec![Vec::with_capacity(4096), Vec::with_capacity(4096)];
    /// let (n, bufs) = dev.readv_at(bufs, 0).await;
    /// assert_eq!(n?, 8192);
    /// assert!(bufs.iter().all(|b| b.len() == 4096));
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// As [`read_at`](Self::read_at).
    pub fn readv_at<B: IoBufMut>(
        &self,
        bufs: Vec<B>,
        offset_bytes: u64,
    ) -> impl Future<Output = (Result<usize, Error>, Vec<B>)> + Send + '_ {
        BufIo::<_, Read>::new(self, Many(bufs), offset_bytes, IoFlags::NONE)
    }

    /// Writes the initialised bytes of several buffers back to back
    /// (`pwritev`) at `offset_bytes`.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let (n, _) = dev.writev_at(vec![vec![1u8; 4096], vec![2u8; 4096]], 0).await;
    /// assert_eq!(n?, 8192);
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// As [`read_at`](Self::read_at).
    pub fn writev_at<B: IoBuf>(
        &self,
        bufs: Vec<B>,
        offset_bytes: u64,
    ) -> impl Future<Output = (Result<usize, Error>, Vec<B>)> + Send + '_ {
        BufIo::<_, Write>::new(self, Many(bufs), offset_bytes, IoFlags::NONE)
    }

    /// Reads exactly `buf.bytes_total()` bytes at `offset_bytes` into
    /// `buf` (see [`read_at`](Self::read_at), which this calls once: the
    /// engine already resumes a short transfer, so a short count is the
    /// end of the file).
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// use plugio::ErrorKind;
    /// let (n, _) = dev.write_at(vec![5u8; 4096], 0).await;
    /// n?;
    /// let (r, buf) = dev.read_exact_at(vec![0u8; 4096], 0).await;
    /// r?;
    /// assert_eq!(buf, vec![5u8; 4096]);
    /// // Past the end: an error naming the offset and length.
    /// let (r, _) = dev.read_exact_at(vec![0u8; 4096], 4096).await;
    /// assert!(matches!(
    ///     r.unwrap_err().kind(),
    ///     ErrorKind::UnexpectedEof { offset_bytes: 4096, len_bytes: 4096, done_bytes: 0 }
    /// ));
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::UnexpectedEof`] naming the offset, the length asked
    /// for and the bytes read, when the file ends first (the buffer holds
    /// those bytes); otherwise as [`read_at`](Self::read_at).
    pub async fn read_exact_at<B: IoBufMut>(
        &self,
        buf: B,
        offset_bytes: u64,
    ) -> (Result<(), Error>, B) {
        let want = buf.bytes_total();
        let (r, buf) = self.read_at(buf, offset_bytes).await;
        (exact(self, r, offset_bytes, want, Short::Eof), buf)
    }

    /// Writes all the initialised bytes of `buf` at `offset_bytes` (see
    /// [`write_at`](Self::write_at); the engine resumes short writes, so a
    /// short count means the device made no progress).
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let (r, _) = dev.write_all_at(vec![5u8; 8192], 0).await;
    /// r?;
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::WriteZero`] naming the offset, length and bytes
    /// written when the device stops taking bytes; otherwise as
    /// [`write_at`](Self::write_at).
    pub async fn write_all_at<B: IoBuf>(
        &self,
        buf: B,
        offset_bytes: u64,
    ) -> (Result<(), Error>, B) {
        let want = buf.bytes_init();
        let (r, buf) = self.write_at(buf, offset_bytes).await;
        (exact(self, r, offset_bytes, want, Short::WriteZero), buf)
    }

    /// [`read_exact_at`](Self::read_exact_at) into several buffers in order
    /// (all of each one's `bytes_total()`).
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let (r, _) = dev.write_all_at(vec![9u8; 8192], 0).await;
    /// r?;
    /// let (r, bufs) = dev.readv_exact_at(vec![vec![0u8; 4096], vec![0u8; 4096]], 0).await;
    /// r?;
    /// assert!(bufs.iter().all(|b| b.iter().all(|&x| x == 9)));
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// As [`read_exact_at`](Self::read_exact_at).
    pub async fn readv_exact_at<B: IoBufMut>(
        &self,
        bufs: Vec<B>,
        offset_bytes: u64,
    ) -> (Result<(), Error>, Vec<B>) {
        let want = bufs.iter().map(IoBuf::bytes_total).sum();
        let (r, bufs) = self.readv_at(bufs, offset_bytes).await;
        (exact(self, r, offset_bytes, want, Short::Eof), bufs)
    }

    /// [`write_all_at`](Self::write_all_at) of several buffers back to
    /// back.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// let (r, _) = dev.writev_all_at(vec![vec![1u8; 4096], vec![2u8; 4096]], 0).await;
    /// r?;
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// As [`write_all_at`](Self::write_all_at).
    pub async fn writev_all_at<B: IoBuf>(
        &self,
        bufs: Vec<B>,
        offset_bytes: u64,
    ) -> (Result<(), Error>, Vec<B>) {
        let want = bufs.iter().map(IoBuf::bytes_init).sum();
        let (r, bufs) = self.writev_at(bufs, offset_bytes).await;
        (exact(self, r, offset_bytes, want, Short::WriteZero), bufs)
    }
}

/// What a short count means for an exact IO.
#[derive(Clone, Copy)]
enum Short {
    Eof,
    WriteZero,
}

/// `Ok` when `r` moved all `want` bytes; the typed short-count error else,
/// naming `dev`'s path.
fn exact(
    dev: &Device,
    r: Result<usize, Error>,
    offset_bytes: u64,
    want: usize,
    short: Short,
) -> Result<(), Error> {
    let done = r?;
    if done >= want {
        return Ok(());
    }
    let (offset_bytes, len_bytes, done_bytes) = (offset_bytes, want as u64, done as u64);
    Err(dev.name_err(Error::new(match short {
        Short::Eof => ErrorKind::UnexpectedEof {
            offset_bytes,
            len_bytes,
            done_bytes,
        },
        Short::WriteZero => ErrorKind::WriteZero {
            offset_bytes,
            len_bytes,
            done_bytes,
        },
    })))
}
