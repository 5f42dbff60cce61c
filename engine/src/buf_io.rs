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
//! into the bio ([`BioFuture::release`]), which frees it once the kernel is
//! done: the only allocation of the path, and only on that cancel path.
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
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use plugio_device::{DmaBuf, Error, ErrorKind, Geometry, IoFlags, OpKind};

use crate::bio::{forget_if_none, BioBuf, Keep, Seg};
use crate::buf::{IoBuf, IoBufMut};
use crate::device::{BioFuture, Device, MAX_IO_BYTES};

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

/// Whether the memory of `buf` must go through an aligned copy for
/// `geometry`: an address off the direct-IO memory alignment, or (several
/// segments) a segment length off the block alignment. One segment's
/// length is the IO's length, which a copy cannot fix.
#[inline]
fn needs_bounce(geometry: &Geometry, buf: &BioBuf) -> bool {
    let mem = geometry.mem_align_bytes() as usize;
    let block = geometry.offset_align_bytes() as usize;
    if mem <= 1 && block <= 1 {
        return false;
    }
    match buf {
        BioBuf::None => false,
        BioBuf::One { seg, .. } => misaligned(seg.addr, mem),
        BioBuf::Many(v) => v
            .iter()
            .any(|s| misaligned(s.addr, mem) || misaligned(s.len, block)),
    }
}

/// A bounce buffer for an IO of `len_bytes` on `dev` when `buf` needs one
/// (and bouncing is on, and the length is one the device may take).
fn bounce_for(dev: &Device, buf: &BioBuf) -> Option<DmaBuf> {
    let shared = dev.shared();
    if !shared.opts.bounce_unaligned || !needs_bounce(&shared.geometry, buf) {
        return None;
    }
    let len = total_len(buf);
    // Zero and oversized lengths are refused by the check, unbounced.
    (len > 0 && len <= MAX_IO_BYTES).then(|| dev.alloc_buf(len as usize))
}

/// The whole of `b` as the one segment of a bio.
fn bounce_segs(b: &mut DmaBuf) -> BioBuf {
    let len = b.len();
    BioBuf::One {
        seg: seg(b.as_mut_ptr(), len),
        fixed: None,
    }
}

/// A read into `bufs` at `offset_bytes`.
pub(crate) fn read<S: BufSetMut>(
    dev: &Device,
    mut bufs: S,
    offset_bytes: u64,
    flags: IoFlags,
) -> BufIo<'_, S> {
    let mut segs = bufs.read_segs();
    let mut bounce = bounce_for(dev, &segs);
    if let Some(b) = &mut bounce {
        forget_if_none(std::mem::replace(&mut segs, bounce_segs(b)));
    }
    let io = bio_io(
        dev,
        OpKind::Read,
        flags,
        offset_bytes,
        segs,
        bounce.is_some(),
    );
    BufIo::new(io, bufs, bounce, finish_read::<S>)
}

/// A write of `bufs` at `offset_bytes`.
pub(crate) fn write<S: BufSet>(
    dev: &Device,
    bufs: S,
    offset_bytes: u64,
    flags: IoFlags,
) -> BufIo<'_, S> {
    let mut segs = bufs.write_segs();
    let mut bounce = bounce_for(dev, &segs);
    if let Some(b) = &mut bounce {
        bufs.gather(b.as_mut_slice());
        forget_if_none(std::mem::replace(&mut segs, bounce_segs(b)));
    }
    let io = bio_io(
        dev,
        OpKind::Write,
        flags,
        offset_bytes,
        segs,
        bounce.is_some(),
    );
    BufIo::new(io, bufs, bounce, |_, _, _| {})
}

/// After a successful read: hands a bounced read's bytes to the caller's
/// buffers, or marks the bytes the kernel read into them.
fn finish_read<S: BufSetMut>(bufs: &mut S, bounce: Option<&DmaBuf>, n: usize) {
    match bounce {
        Some(b) => bufs.scatter(&b.as_slice()[..n]),
        None => bufs.set_read(n),
    }
}

/// What a finished IO does to its buffers with the bytes it moved.
type Finish<S> = fn(&mut S, Option<&DmaBuf>, usize);

/// The future of a read or write on caller-owned buffers; resolves to the
/// bytes moved and the buffers.
pub(crate) struct BufIo<'a, S: BufSet> {
    io: BioFuture<'a>,
    bufs: Option<S>,
    bounce: Option<DmaBuf>,
    finish: Finish<S>,
}

// The buffers are never pinned (only their heap memory is used, by
// address), so the future may move freely.
impl<S: BufSet> Unpin for BufIo<'_, S> {}

/// The bio future of a data IO over `segs`.
fn bio_io(
    dev: &Device,
    op: OpKind,
    flags: IoFlags,
    offset_bytes: u64,
    segs: BioBuf,
    bounced: bool,
) -> BioFuture<'_> {
    let len = total_len(&segs);
    let mut io = dev.io(op, flags, offset_bytes, len, segs);
    if let Some(init) = io.init_mut() {
        init.bounced = bounced;
    }
    io
}

impl<'a, S: BufSet> BufIo<'a, S> {
    fn new(io: BioFuture<'a>, bufs: S, bounce: Option<DmaBuf>, finish: Finish<S>) -> Self {
        BufIo {
            io,
            bufs: Some(bufs),
            bounce,
            finish,
        }
    }
}

impl<S: BufSet> Future for BufIo<'_, S> {
    type Output = (Result<usize, Error>, S::Out);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(init) = this.io.init_mut() {
            // First poll, on the core that issues the IO: name the
            // registered buffer on its ring, if the memory is one.
            if let BioBuf::One { fixed, .. } = &mut init.buf {
                *fixed = match &this.bounce {
                    Some(b) => b.fixed_index(),
                    None => this.bufs.as_ref().and_then(BufSet::fixed_index),
                };
            }
        }
        let r = ready!(Pin::new(&mut this.io).poll(cx));
        let Some(mut bufs) = this.bufs.take() else {
            panic!("a plugio IO future was polled after it completed")
        };
        forget_if_none(r.buf);
        let result = r.result.map(|n| n as usize);
        if let Ok(n) = result {
            (this.finish)(&mut bufs, this.bounce.as_ref(), n);
        }
        this.bounce = None;
        Poll::Ready((result, bufs.into_out()))
    }
}

impl<S: BufSet> Drop for BufIo<'_, S> {
    fn drop(&mut self) {
        if !self.io.is_issued() {
            return;
        }
        // The kernel may still use the memory: the bounce buffer when
        // there is one, else the caller's buffers.
        let keep: Option<Keep> = match self.bounce.take() {
            Some(b) => Some(Box::new(b)),
            None => self.bufs.take().map(|b| Box::new(b) as Keep),
        };
        self.io.release(keep);
    }
}

impl Device {
    /// Reads exactly `buf.bytes_total()` bytes at `offset_bytes` into
    /// `buf` (see [`read_at`](Self::read_at), which this calls once: the
    /// engine already resumes a short transfer, so a short count is the
    /// end of the file).
    ///
    /// ```
    /// # plugio_engine::doc_example(|dev| async move {
    /// use plugio_engine::ErrorKind;
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
        (exact(r, offset_bytes, want, Short::Eof), buf)
    }

    /// Writes all the initialised bytes of `buf` at `offset_bytes` (see
    /// [`write_at`](Self::write_at); the engine resumes short writes, so a
    /// short count means the device made no progress).
    ///
    /// ```
    /// # plugio_engine::doc_example(|dev| async move {
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
        (exact(r, offset_bytes, want, Short::WriteZero), buf)
    }

    /// [`read_exact_at`](Self::read_exact_at) into several buffers in order
    /// (all of each one's `bytes_total()`).
    ///
    /// ```
    /// # plugio_engine::doc_example(|dev| async move {
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
        (exact(r, offset_bytes, want, Short::Eof), bufs)
    }

    /// [`write_all_at`](Self::write_all_at) of several buffers back to
    /// back.
    ///
    /// ```
    /// # plugio_engine::doc_example(|dev| async move {
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
        (exact(r, offset_bytes, want, Short::WriteZero), bufs)
    }
}

/// What a short count means for an exact IO.
#[derive(Clone, Copy)]
enum Short {
    Eof,
    WriteZero,
}

/// `Ok` when `r` moved all `want` bytes; the typed short-count error else.
fn exact(
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
    Err(Error::new(match short {
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
    }))
}
