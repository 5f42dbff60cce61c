//! The high-level async API: ownership-passing futures over any
//! [`Backend`].
//!
//! Invariants:
//! - A future owns its buffer(s) and iovec array until it completes; if it
//!   is dropped while its op is in flight, both move into the thread's
//!   pending slot and are freed only when the completion arrives.
//! - Futures are `!Send`: an op completes on the thread that submitted it,
//!   so the future must be polled there, by the core whose driver reaps
//!   for it; polled anywhere else (no driver, or beside an idle runtime
//!   that owns the thread's ring) it fails with `NoDriver` at first poll
//!   instead of waiting for a reap that never comes.
//! - Submission is lazy (first poll); bad input is answered at first poll
//!   with the buffer handed back and nothing submitted.

use std::any::Any;
use std::cell::RefCell;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::backend::file::OpenOptions;
use crate::backend::Backend;
use crate::buf::DmaBuf;
use crate::core::{register_handler, CompletionHandler, HandlerId};
use crate::error::{Error, ErrorKind, InvalidInput, Result};
use crate::geometry::Geometry;
use crate::op::{IoFlags, IoOp, OpKind, MAX_RW_BYTES};

/// A file, block device or simulated device with an async,
/// ownership-passing API. Cheap to clone.
#[derive(Debug, Clone)]
pub struct File {
    backend: Arc<dyn Backend>,
}

impl File {
    /// Opens `path` read/write with `O_DIRECT` on io_uring.
    ///
    /// # Errors
    /// See [`OpenOptions::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, &OpenOptions::new())
    }

    /// Opens `path` with `options`.
    ///
    /// # Errors
    /// See [`OpenOptions::open`].
    pub fn open_with(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Self> {
        Ok(Self::from_backend(Arc::new(options.open(path)?)))
    }

    /// Wraps any backend (for example a `MemDevice`).
    pub fn from_backend(backend: Arc<dyn Backend>) -> Self {
        Self { backend }
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The geometry.
    pub fn geometry(&self) -> &Geometry {
        self.backend.geometry()
    }

    /// A zeroed buffer of `len_bytes` aligned for this device.
    pub fn alloc_buf(&self, len_bytes: usize) -> DmaBuf {
        let align = self.geometry().mem_align_bytes().max(512) as usize;
        DmaBuf::with_align(len_bytes, align)
    }

    /// Reads `buf.len()` bytes at `offset_bytes`. Resolves to the bytes read
    /// (fewer at end of file, 0 at or past it) and the buffer, whose length
    /// is set to the bytes read.
    pub fn read_at(&self, buf: DmaBuf, offset_bytes: u64) -> IoFuture<DmaBuf> {
        let len = buf.len() as u64;
        self.data_op(OpKind::Read, buf, offset_bytes, len, IoFlags::NONE)
    }

    /// Writes `buf` at `offset_bytes`. Resolves to the bytes written and the
    /// buffer.
    pub fn write_at(&self, buf: DmaBuf, offset_bytes: u64) -> IoFuture<DmaBuf> {
        self.write_at_with(buf, offset_bytes, IoFlags::NONE)
    }

    /// Writes `buf` at `offset_bytes` with `flags` (e.g. [`IoFlags::FUA`]).
    pub fn write_at_with(
        &self,
        buf: DmaBuf,
        offset_bytes: u64,
        flags: IoFlags,
    ) -> IoFuture<DmaBuf> {
        let len = buf.len() as u64;
        self.data_op(OpKind::Write, buf, offset_bytes, len, flags)
    }

    /// Reads into `bufs` (each filled to its `len()`) from `offset_bytes`.
    /// Buffer lengths are trimmed to what was read.
    pub fn readv_at(&self, bufs: Vec<DmaBuf>, offset_bytes: u64) -> IoFuture<Vec<DmaBuf>> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.data_op(OpKind::Read, bufs, offset_bytes, len, IoFlags::NONE)
    }

    /// Writes `bufs` back to back at `offset_bytes`.
    pub fn writev_at(&self, bufs: Vec<DmaBuf>, offset_bytes: u64) -> IoFuture<Vec<DmaBuf>> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.data_op(OpKind::Write, bufs, offset_bytes, len, IoFlags::NONE)
    }

    fn data_op<T: IoResource>(
        &self,
        kind: OpKind,
        res: T,
        offset: u64,
        len: u64,
        flags: IoFlags,
    ) -> IoFuture<T> {
        IoFuture::new(self.backend.clone(), kind, offset, len, flags, res)
    }

    /// `fsync(2)`: data and metadata durable.
    ///
    /// # Errors
    /// The kernel's error, typed.
    pub async fn fsync(&self) -> Result<()> {
        self.bare(OpKind::Fsync, 0, 0).await
    }

    /// `fdatasync(2)` (a device cache flush).
    ///
    /// # Errors
    /// The kernel's error, typed.
    pub async fn fdatasync(&self) -> Result<()> {
        self.bare(OpKind::Flush, 0, 0).await
    }

    /// `fallocate(2)` with `mode` over the range.
    ///
    /// # Errors
    /// Invalid range, or the kernel's error (`Unsupported`, `OutOfSpace`...).
    pub async fn fallocate(&self, offset_bytes: u64, len_bytes: u64, mode: i32) -> Result<()> {
        self.bare(OpKind::Fallocate { mode }, offset_bytes, len_bytes)
            .await
    }

    /// Discards the range (`BLKDISCARD` on block devices, punch hole on
    /// files).
    ///
    /// # Errors
    /// Invalid range, or the kernel's error.
    pub async fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<()> {
        self.bare(OpKind::Discard, offset_bytes, len_bytes).await
    }

    /// Zeroes the range (`BLKZEROOUT` / `FALLOC_FL_ZERO_RANGE`).
    ///
    /// # Errors
    /// Invalid range, or the kernel's error.
    pub async fn write_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> Result<()> {
        self.bare(OpKind::WriteZeroes, offset_bytes, len_bytes)
            .await
    }

    async fn bare(&self, kind: OpKind, offset: u64, len: u64) -> Result<()> {
        IoFuture::new(self.backend.clone(), kind, offset, len, IoFlags::NONE, ())
            .await
            .0
            .map(drop)
    }
}

/// What an [`IoFuture`] owns while in flight.
pub trait IoResource: 'static {
    /// The iovecs of the first `len_bytes` of the resource.
    fn iovecs(&mut self, len_bytes: u64) -> Vec<libc::iovec>;
    /// The registered-buffer index, when the resource is one fixed buffer.
    fn fixed_index(&self) -> Option<u16>;
    /// Called after a successful read of `n` bytes.
    fn set_read_len(&mut self, n: usize);
}

impl IoResource for DmaBuf {
    fn iovecs(&mut self, len_bytes: u64) -> Vec<libc::iovec> {
        vec![self.iovec(len_bytes as usize)]
    }
    fn fixed_index(&self) -> Option<u16> {
        DmaBuf::fixed_index(self)
    }
    fn set_read_len(&mut self, n: usize) {
        self.set_len(n);
    }
}

impl IoResource for Vec<DmaBuf> {
    fn iovecs(&mut self, _len_bytes: u64) -> Vec<libc::iovec> {
        self.iter_mut()
            .map(|b| {
                let len = b.len();
                b.iovec(len)
            })
            .collect()
    }
    fn fixed_index(&self) -> Option<u16> {
        None
    }
    fn set_read_len(&mut self, mut n: usize) {
        for b in self.iter_mut() {
            let take = b.len().min(n);
            b.set_len(take);
            n -= take;
        }
    }
}

impl IoResource for () {
    fn iovecs(&mut self, _len_bytes: u64) -> Vec<libc::iovec> {
        Vec::new()
    }
    fn fixed_index(&self) -> Option<u16> {
        None
    }
    fn set_read_len(&mut self, _n: usize) {}
}

/// What the kernel takes of one op, checked before the backend's own
/// rules, as the engine checks its IO: a read or write of at most
/// [`MAX_RW_BYTES`] (a larger one came back short, which a caller reads as
/// the end of the file), a range that ends at or before `i64::MAX`
/// (the kernel's `loff_t`; past it the kernel said only `EINVAL`), and a
/// write to a regular file that ends at or below the process's file size
/// limit ([`crate::check_file_size_limit`]; past it the kernel ended the
/// process with `SIGXFSZ`).
fn check_limits(
    geometry: &Geometry,
    op: &IoOp<'_>,
    file_fd: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
) -> Result<()> {
    use std::os::fd::AsFd;
    if op.kind.has_data() && op.len_bytes > MAX_RW_BYTES {
        return Err(Error::invalid(InvalidInput::Length {
            len_bytes: op.len_bytes,
            max_bytes: MAX_RW_BYTES,
        }));
    }
    let end = op.offset_bytes.checked_add(op.len_bytes);
    if op.kind.has_range() && end.is_none_or(|e| e > i64::MAX as u64) {
        return Err(Error::invalid(InvalidInput::Range {
            offset_bytes: op.offset_bytes,
            len_bytes: op.len_bytes,
            capacity_bytes: geometry.capacity_bytes.unwrap_or(i64::MAX as u64),
        }));
    }
    crate::check_file_size_limit(
        geometry.kind,
        op.kind,
        op.offset_bytes,
        op.len_bytes,
        || file_fd.and_then(|fd| crate::file_size_limit::fd_len_bytes(fd.as_fd())),
    )
}

/// The context of the `NoDriver` error of a [`File`] op polled where no
/// driver reaps for it: what to change.
const OFF_DRIVER: &str = "a plugio::device::File op must be awaited on the thread and core whose \
    DeviceDriver reaps for it: inside plugio::runtime::local(RingConfig::default())?.run(..), a task \
    spawned on a runtime with a DeviceDriver, or an executor built with one (a plain block_on, \
    beside a runtime or without one, has no driver)";

enum State {
    Idle,
    InFlight(u32),
    Finished,
}

/// An op in progress; resolves to `(result, resource)`. `!Send`: poll it on
/// the thread that first polled it.
///
/// # Errors
/// The op's input refused by the backend, or the kernel's error, typed.
/// `NoDriver` when it is first polled where no
/// [`DeviceDriver`](crate::DeviceDriver) reaps for the caller (a plain
/// `block_on`, or an executor built without one); `Forked` in a forked
/// child. The resource comes back with every error.
pub struct IoFuture<T: IoResource> {
    backend: Arc<dyn Backend>,
    kind: OpKind,
    offset_bytes: u64,
    len_bytes: u64,
    flags: IoFlags,
    res: Option<T>,
    iovecs: Vec<libc::iovec>,
    state: State,
}

impl<T: IoResource> Unpin for IoFuture<T> {}

impl<T: IoResource> IoFuture<T> {
    fn new(
        backend: Arc<dyn Backend>,
        kind: OpKind,
        offset_bytes: u64,
        len_bytes: u64,
        flags: IoFlags,
        res: T,
    ) -> Self {
        Self {
            backend,
            kind,
            offset_bytes,
            len_bytes,
            flags,
            res: Some(res),
            iovecs: Vec::new(),
            state: State::Idle,
        }
    }

    fn submit(&mut self, waker: &Waker) -> Result<u32> {
        let res = self
            .res
            .as_mut()
            .ok_or_else(|| Error::from_errno(libc::EINVAL))?;
        if self.kind.has_data() {
            self.iovecs = res.iovecs(self.len_bytes);
        }
        let op = IoOp {
            kind: self.kind,
            offset_bytes: self.offset_bytes,
            len_bytes: self.len_bytes,
            segments: &self.iovecs,
            fixed_buf: res.fixed_index(),
            flags: self.flags,
        };
        check_limits(self.backend.geometry(), &op, self.backend.file_fd())?;
        self.backend.check(&op)?;
        // Not into a ring (or a core's inbox) nothing reaps for this
        // caller: the future would wait forever; nor through a forked
        // child's copy of the parent's core.
        crate::fork::check()?;
        if !crate::core::ring_serves_caller() {
            return Err(Error::new(ErrorKind::NoDriver).with_context(OFF_DRIVER));
        }
        let (pending, handler) = pending();
        let slot = pending.waiting(waker.clone());
        // SAFETY: the buffers and the iovec array are owned by this future
        // and, if it is dropped first, moved to the pending slot until the
        // completion (see Drop).
        match unsafe { self.backend.submit(&op, handler, u64::from(slot)) } {
            Ok(()) => Ok(slot),
            Err(e) => {
                pending.free(slot);
                Err(e)
            }
        }
    }

    fn finish(&mut self, result: Result<usize>) -> Poll<(Result<usize>, T)> {
        self.state = State::Finished;
        let Some(mut res) = self.res.take() else {
            unreachable!("IoFuture polled after completion")
        };
        if let (Ok(n), OpKind::Read) = (&result, self.kind) {
            res.set_read_len(*n);
        }
        Poll::Ready((result, res))
    }
}

impl<T: IoResource> Future for IoFuture<T> {
    type Output = (Result<usize>, T);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.state {
            State::Idle => match self.submit(cx.waker()) {
                Ok(slot) => {
                    self.state = State::InFlight(slot);
                    Poll::Pending
                }
                Err(e) => self.finish(Err(e)),
            },
            State::InFlight(slot) => match pending().0.poll(slot, cx.waker()) {
                Some(r) if r < 0 => self.finish(Err(Error::from_errno(r))),
                Some(r) => self.finish(Ok(r as usize)),
                None => Poll::Pending,
            },
            State::Finished => panic!("IoFuture polled after completion"),
        }
    }
}

impl<T: IoResource> Drop for IoFuture<T> {
    fn drop(&mut self) {
        if let State::InFlight(slot) = self.state {
            let keep: Box<dyn Any> = Box::new((self.res.take(), std::mem::take(&mut self.iovecs)));
            pending().0.orphan(slot, keep);
        }
    }
}

enum Slot {
    Free,
    Waiting(Waker),
    Done(i32),
    /// The future is gone: what the op uses, kept until it completes, and
    /// what to do with its result then (close an fd an open returned).
    Orphan(Box<dyn Any>, Option<fn(i32)>),
}

/// The thread's completion handler for [`IoFuture`]s and the one-shot
/// ring ops of [`crate::fs_ops`].
#[derive(Default)]
pub(crate) struct Pending {
    slots: RefCell<Vec<Slot>>,
    free: RefCell<Vec<u32>>,
}

thread_local! {
    static PENDING: (Rc<Pending>, HandlerId) = {
        let p = Rc::new(Pending::default());
        let id = register_handler(p.clone());
        (p, id)
    };
}

pub(crate) fn pending() -> (Rc<Pending>, HandlerId) {
    PENDING.with(|(p, id)| (p.clone(), *id))
}

impl Pending {
    pub(crate) fn waiting(&self, waker: Waker) -> u32 {
        let mut slots = self.slots.borrow_mut();
        match self.free.borrow_mut().pop() {
            Some(i) => {
                slots[i as usize] = Slot::Waiting(waker);
                i
            }
            None => {
                slots.push(Slot::Waiting(waker));
                (slots.len() - 1) as u32
            }
        }
    }

    pub(crate) fn free(&self, slot: u32) {
        let old = std::mem::replace(&mut self.slots.borrow_mut()[slot as usize], Slot::Free);
        self.free.borrow_mut().push(slot);
        drop(old);
    }

    pub(crate) fn poll(&self, slot: u32, waker: &Waker) -> Option<i32> {
        let mut slots = self.slots.borrow_mut();
        match &mut slots[slot as usize] {
            Slot::Done(r) => {
                let r = *r;
                drop(slots);
                self.free(slot);
                Some(r)
            }
            Slot::Waiting(w) => {
                w.clone_from(waker);
                None
            }
            Slot::Free | Slot::Orphan(..) => unreachable!("pending slot {slot} in a bad state"),
        }
    }

    fn orphan(&self, slot: u32, keep: Box<dyn Any>) {
        self.orphan_with(slot, keep, None);
    }

    /// The future of `slot` is gone: keeps `keep` until the op completes,
    /// then drops it and hands the result to `on_result` (at once when it
    /// has completed already).
    pub(crate) fn orphan_with(&self, slot: u32, keep: Box<dyn Any>, on_result: Option<fn(i32)>) {
        let mut slots = self.slots.borrow_mut();
        if let Slot::Done(r) = slots[slot as usize] {
            drop(slots);
            self.free(slot);
            drop(keep);
            if let Some(f) = on_result {
                f(r);
            }
        } else {
            slots[slot as usize] = Slot::Orphan(keep, on_result);
        }
    }
}

impl CompletionHandler for Pending {
    fn complete(&self, token: u64, result: i32) {
        let slot = token as u32;
        let old = {
            let mut slots = self.slots.borrow_mut();
            let Some(entry) = slots.get_mut(slot as usize) else {
                tracing::error!(token, "completion for an unknown pending slot");
                return;
            };
            std::mem::replace(entry, Slot::Done(result))
        };
        match old {
            Slot::Waiting(w) => w.wake(),
            Slot::Orphan(keep, on_result) => {
                // The future is gone: release the buffer now that the
                // kernel is done with it.
                self.free(slot);
                drop(keep);
                if let Some(f) = on_result {
                    f(result);
                }
            }
            Slot::Free | Slot::Done(_) => {
                tracing::error!(token, "duplicate completion for a pending slot");
            }
        }
    }
}
