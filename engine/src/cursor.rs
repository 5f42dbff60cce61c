//! [`DeviceCursor`]: sequential `AsyncRead` + `AsyncBufRead` +
//! `AsyncWrite` + `AsyncSeek` (the `futures-io` traits) over a
//! [`Device`], for codecs, compressors and anything else written against
//! streams.
//!
//! # Mechanism
//!
//! The cursor keeps one window of the file in an aligned buffer from
//! [`Device::alloc_buf`] (`window_bytes`, 128 KiB by default), starting at
//! an offset aligned for the device's direct IO. Reads are served from the
//! window and refill it a window at a time; writes go into it (after
//! loading what the file holds there, so a partial block keeps its other
//! bytes) and go to the device when the cursor leaves the window, on
//! `flush` and on `close`. With `O_DIRECT` a window that ends inside a
//! block is written rounded up to the block and the file is cut back to
//! its true end (`set_len`), so the file never shows the padding once the
//! flush completes. `flush` does not make the data durable: call
//! [`Device::sync_data`] or [`Device::sync_all`] after it.
//!
//! Invariants:
//! - `win_off` is a multiple of the device's offset alignment; the window
//!   holds the file's bytes `[win_off, win_off + win_valid)` as this
//!   cursor last saw or wrote them; `dirty` when some of them are not on
//!   the device yet, including after a store that failed (it is tried
//!   again by the next flush, close or move out of the window).
//! - `size_bytes` is the file's size as this cursor knows it (from
//!   `metadata` at creation, raised by its writes); the cursor assumes no
//!   one else changes the file while it is in use.
//! - At most one IO is in flight; while it is, the window's buffer is
//!   lent to it (`buf` is `None`).
//! - On a device with a capacity (a block device, an NVMe namespace) no
//!   window IO reaches past it, rounded down to whole blocks (`end_bytes`): a load reads only up to the capacity, and
//!   a write at or past it is refused at the `write` call
//!   (`io::ErrorKind::WriteZero`), never buffered to fail at `flush`.
//! - No window reaches past the largest file offset (`i64::MAX`, the
//!   kernel's `loff_t`): a write whose end, rounded up to the alignment,
//!   would is refused at the `write` call (`InvalidInput`); the window's
//!   end then fits `u64` (a write near `u64::MAX` wrapped it and spun the
//!   core; found by a break-it helper).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use std::io::SeekFrom;

use futures_io::{AsyncBufRead, AsyncRead, AsyncSeek, AsyncWrite};
use plugio_device::{DmaBuf, Error};

use crate::device::Device;

/// Default window size in bytes.
pub const DEFAULT_WINDOW_BYTES: usize = 128 * 1024;

/// Largest window size in bytes ([`DeviceCursor::with_window`]): 1 GiB.
pub const MAX_WINDOW_BYTES: usize = 1 << 30;

/// What an IO of the cursor gives back.
enum Done {
    /// A window load: bytes read, the buffer.
    Load(Result<usize, Error>, DmaBuf),
    /// A window write (and the cut back to the true end): the buffer.
    Store(Result<(), Error>, DmaBuf),
}

type Op = Pin<Box<dyn Future<Output = Done> + Send>>;

/// A sequential reader and writer over a [`Device`], with a position
/// (see the [module docs](self)).
///
/// Writes wait in the window until `flush`, `close` or a move out of the
/// window. Dropping a cursor with writes still in its window loses them
/// (a drop cannot wait for IO, unlike std's `BufWriter`, which flushes
/// on drop): flush or close it first. After a flush that failed, the
/// window stays dirty and every later flush tries it again;
/// [`discard_buffered`](Self::discard_buffered) drops it instead.
///
/// ```
/// # plugio::engine::doc_example(|dev| async move {
/// use futures::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt, SeekFrom};
/// use plugio::DeviceCursor;
///
/// let mut cur = DeviceCursor::new(dev.clone()).await?;
/// cur.write_all(b"any length, any offset").await?;
/// cur.close().await?; // on the device (durable after dev.sync_data())
/// cur.seek(SeekFrom::Start(4)).await?;
/// let mut word = [0u8; 6];
/// cur.read_exact(&mut word).await?;
/// assert_eq!(&word, b"length");
/// # Ok(()) });
/// ```
pub struct DeviceCursor {
    dev: Device,
    pos: u64,
    size_bytes: u64,
    /// A device's capacity in whole blocks of `align`; `None` for a file.
    end_bytes: Option<u64>,
    align: u64,
    window_bytes: usize,
    buf: Option<DmaBuf>,
    win_off: u64,
    win_valid: usize,
    /// The window holds what the file has in its range (loaded, or known
    /// to be past the end), so writes may go into it.
    win_loaded: bool,
    /// The position the last load was for: a load that did not reach it
    /// means end of file.
    loaded_for: Option<u64>,
    dirty: bool,
    op: Option<Op>,
}

impl std::fmt::Debug for DeviceCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCursor")
            .field("pos", &self.pos)
            .field("size_bytes", &self.size_bytes)
            .field("win_off", &self.win_off)
            .field("win_valid", &self.win_valid)
            .field("dirty", &self.dirty)
            .field("in_flight", &self.op.is_some())
            .finish()
    }
}

fn io_err(e: Error) -> io::Error {
    e.into()
}

impl DeviceCursor {
    /// ` (path P)` for the cursor's own errors, as an IO error names its
    /// device; empty for a device without a path.
    fn path_note(&self) -> String {
        match self.dev.path() {
            Some(p) => format!(" (path {})", p.display()),
            None => String::new(),
        }
    }

    /// A cursor at offset 0 of `dev` with a [`DEFAULT_WINDOW_BYTES`]
    /// window; reads the file's size (a block device's capacity).
    ///
    /// # Errors
    /// The `statx` error.
    pub async fn new(dev: Device) -> Result<Self, Error> {
        Self::with_window(dev, DEFAULT_WINDOW_BYTES).await
    }

    /// [`new`](Self::new) with a window of `window_bytes` (rounded up to
    /// the device's offset alignment, at least one block; at most
    /// [`MAX_WINDOW_BYTES`]).
    ///
    /// # Errors
    /// [`InvalidInput::Config`](plugio_device::InvalidInput::Config) for
    /// a window over [`MAX_WINDOW_BYTES`] (a huge one wrapped to 0 when
    /// rounded); the `statx` error.
    pub async fn with_window(dev: Device, window_bytes: usize) -> Result<Self, Error> {
        if window_bytes > MAX_WINDOW_BYTES {
            return Err(dev.name_err(crate::options::invalid(format!(
                "window_bytes {window_bytes} is out of range: use 1..={MAX_WINDOW_BYTES}"
            ))));
        }
        let align = u64::from(dev.geometry().offset_align_bytes().max(1));
        // A device's end in whole blocks: a capacity off its block (a loop
        // device over a file of odd size) has a tail no aligned IO reaches.
        let end_bytes = dev.geometry().capacity_bytes.map(|c| c / align * align);
        let size_bytes = match end_bytes {
            Some(c) => c,
            None => dev.metadata().await?.len_bytes,
        };
        let window_bytes = (window_bytes.max(1) as u64).next_multiple_of(align) as usize;
        let buf = dev.alloc_buf(window_bytes);
        Ok(Self {
            dev,
            pos: 0,
            size_bytes,
            end_bytes,
            align,
            window_bytes,
            buf: Some(buf),
            win_off: 0,
            win_valid: 0,
            win_loaded: false,
            loaded_for: None,
            dirty: false,
            op: None,
        })
    }

    /// The position, in bytes from the start.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The file's size as this cursor sees it (its own writes included,
    /// flushed or not).
    pub fn len_bytes(&self) -> u64 {
        self.size_bytes.max(self.win_off + self.win_valid as u64)
    }

    /// Drops the bytes the window holds that are not on the device yet
    /// (after a flush that failed: a write past the file system's largest
    /// file, out of space), and reads the file's size again, since the
    /// cursor's own writes had raised it. Returns whether anything was
    /// dropped. Waits for a window IO still in flight first (its error is
    /// the one being dropped, if any). The position stays.
    ///
    /// ```
    /// # plugio::engine::doc_example(|dev| async move {
    /// use futures::io::AsyncWriteExt;
    /// let mut cur = plugio::DeviceCursor::new(dev).await?;
    /// cur.write_all(b"not wanted").await?;
    /// assert!(cur.discard_buffered().await?);
    /// assert_eq!(cur.len_bytes(), 0);
    /// cur.close().await?; // nothing to write
    /// # Ok(()) });
    /// ```
    ///
    /// # Errors
    /// The `statx` error of reading the size again.
    pub async fn discard_buffered(&mut self) -> Result<bool, Error> {
        // The op's result is the window's fate, which is dropped anyway.
        let _ = std::future::poll_fn(|cx| self.poll_op(cx)).await;
        let dropped = self.dirty;
        self.dirty = false;
        self.win_loaded = false;
        // `len_bytes` counts the window's end: an empty window at 0 adds
        // nothing (one left at the dropped window's start made appends
        // land there; found by a break-it helper).
        self.win_off = 0;
        self.win_valid = 0;
        self.loaded_for = None;
        self.size_bytes = match self.end_bytes {
            Some(c) => c,
            None => self.dev.metadata().await?.len_bytes,
        };
        Ok(dropped)
    }

    /// Drives the IO in flight, if any, to its end and takes its result.
    fn poll_op(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(op) = self.op.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let done = ready!(op.as_mut().poll(cx));
        self.op = None;
        Poll::Ready(match done {
            Done::Load(r, mut buf) => {
                let n = r.map_err(io_err);
                self.win_valid = *n.as_ref().unwrap_or(&0);
                self.win_loaded = n.is_ok();
                buf.set_len(self.window_bytes);
                self.buf = Some(buf);
                n.map(drop)
            }
            Done::Store(r, mut buf) => {
                buf.set_len(self.window_bytes);
                self.buf = Some(buf);
                // A failed store keeps the window and leaves it dirty, as
                // std's `BufWriter` keeps its buffer: the next flush,
                // close or move out of the window writes it again, so the
                // bytes `write` took are never dropped unwritten (found by
                // a break-it helper: a second flush after an out-of-space
                // one returned Ok with the rest lost).
                self.dirty = r.is_err();
                self.loaded_for = None;
                r.map_err(io_err)
            }
        })
    }

    /// Starts writing the dirty window: rounded up to the alignment, then
    /// the file cut back to its true end when the padding went past it.
    fn start_store(&mut self) {
        let mut buf = self.buf.take().expect("the window buffer is home");
        let valid = self.win_valid;
        let padded = (valid as u64).next_multiple_of(self.align) as usize;
        buf.set_len(padded);
        buf.as_mut_slice()[valid..].fill(0);
        let end = self.win_off + valid as u64;
        self.size_bytes = self.size_bytes.max(end);
        let true_end = self.size_bytes;
        let cut = self.win_off + padded as u64 > true_end;
        let (dev, off) = (self.dev.clone(), self.win_off);
        self.op = Some(Box::pin(async move {
            let (r, buf) = dev.write_all_at(buf, off).await;
            let r = match r {
                Ok(()) if cut => dev.set_len(true_end).await,
                r => r,
            };
            Done::Store(r, buf)
        }));
    }

    /// The bytes a window at `win_off` may hold: the window's size, less
    /// what lies past the device's capacity or past the largest file
    /// offset (`i64::MAX`), both in whole blocks (a load near `i64::MAX`
    /// asked for a whole window past it and failed; found by a break-it
    /// helper). A multiple of the alignment; 0 where no block fits.
    fn window_room(&self, win_off: u64) -> usize {
        let largest = i64::MAX as u64 / self.align * self.align;
        let end = self.end_bytes.map_or(largest, |cap| cap.min(largest));
        end.saturating_sub(win_off).min(self.window_bytes as u64) as usize
    }

    /// Starts loading the window that holds `pos`.
    fn start_load(&mut self, pos: u64) {
        let mut buf = self.buf.take().expect("the window buffer is home");
        self.win_off = pos / self.align * self.align;
        // `end_bytes` is in whole blocks: so is the room.
        buf.set_len(self.window_room(self.win_off));
        self.win_valid = 0;
        self.win_loaded = false;
        self.loaded_for = Some(pos);
        let (dev, off) = (self.dev.clone(), self.win_off);
        self.op = Some(Box::pin(async move {
            let (r, buf) = dev.read_at(buf, off).await;
            Done::Load(r, buf)
        }));
    }

    /// Whether the window holds a byte at `pos`.
    fn window_has(&self, pos: u64) -> bool {
        self.win_loaded && pos >= self.win_off && pos < self.win_off + self.win_valid as u64
    }

    /// Makes the window hold `pos` for reading: `Ok(false)` at end of
    /// file.
    fn poll_window_for_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        loop {
            ready!(self.poll_op(cx))?;
            if self.window_has(self.pos) {
                return Poll::Ready(Ok(true));
            }
            if self.pos >= self.len_bytes()
                || self.loaded_for == Some(self.pos)
                || self.window_room(self.pos / self.align * self.align) == 0
            {
                return Poll::Ready(Ok(false));
            }
            if self.dirty {
                self.start_store();
                continue;
            }
            self.start_load(self.pos);
        }
    }

    /// Makes the window take a write at `pos`: it covers `pos`, holds the
    /// file's bytes before it in the window, and has room.
    fn poll_window_for_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            ready!(self.poll_op(cx))?;
            let end = self.win_off + self.window_bytes as u64;
            if self.win_loaded && self.pos >= self.win_off && self.pos < end {
                let at = (self.pos - self.win_off) as usize;
                if at > self.win_valid {
                    // Past the end of the file: a hole reads as zeroes.
                    let buf = self.buf.as_mut().expect("home");
                    buf.as_mut_slice()[self.win_valid..at].fill(0);
                    self.win_valid = at;
                }
                return Poll::Ready(Ok(()));
            }
            if self.dirty {
                self.start_store();
                continue;
            }
            let win_off = self.pos / self.align * self.align;
            if win_off >= self.len_bytes() {
                // Nothing of the file there: no need to read it.
                self.win_off = win_off;
                self.win_valid = 0;
                self.win_loaded = true;
                continue;
            }
            self.start_load(self.pos);
        }
    }
}

impl AsyncRead for DeviceCursor {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        if out.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let avail = ready!(self.as_mut().poll_fill_buf(cx))?;
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Poll::Ready(Ok(n))
    }
}

impl AsyncBufRead for DeviceCursor {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        if !ready!(this.poll_window_for_read(cx))? {
            return Poll::Ready(Ok(&[]));
        }
        let at = (this.pos - this.win_off) as usize;
        let buf = this.buf.as_ref().expect("the window buffer is home");
        Poll::Ready(Ok(&buf.as_slice()[at..this.win_valid]))
    }

    fn consume(mut self: Pin<&mut Self>, amt: usize) {
        self.pos += amt as u64;
    }
}

impl AsyncWrite for DeviceCursor {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if let Some(cap) = this.end_bytes.filter(|&c| this.pos >= c) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "write at {} is at or past the end of the device ({cap} bytes in whole \
                     blocks){}",
                    this.pos,
                    this.path_note()
                ),
            )));
        }
        let end = (this.pos.checked_add(data.len() as u64))
            .and_then(|e| e.checked_next_multiple_of(this.align));
        if end.is_none_or(|e| e > i64::MAX as u64) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a write of {} bytes at {} would end past the largest file offset \
                     (i64::MAX bytes, in whole blocks of {}): seek lower{}",
                    data.len(),
                    this.pos,
                    this.align,
                    this.path_note()
                ),
            )));
        }
        ready!(this.poll_window_for_write(cx))?;
        let at = (this.pos - this.win_off) as usize;
        let n = (this.window_room(this.win_off) - at).min(data.len());
        let buf = this.buf.as_mut().expect("the window buffer is home");
        buf.as_mut_slice()[at..at + n].copy_from_slice(&data[..n]);
        this.win_valid = this.win_valid.max(at + n);
        this.dirty = true;
        this.loaded_for = None;
        this.pos += n as u64;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_op(cx))?;
        if this.dirty {
            this.start_store();
            ready!(this.poll_op(cx))?;
        }
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

impl AsyncSeek for DeviceCursor {
    fn poll_seek(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        to: SeekFrom,
    ) -> Poll<io::Result<u64>> {
        let this = self.get_mut();
        ready!(this.poll_op(cx))?;
        let (base, delta) = match to {
            SeekFrom::Start(n) => (n, 0),
            SeekFrom::Current(d) => (this.pos, d),
            SeekFrom::End(d) => (this.len_bytes(), d),
        };
        match base.checked_add_signed(delta) {
            Some(pos) => {
                this.pos = pos;
                Poll::Ready(Ok(pos))
            }
            None => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("seek to {base} + {delta} is before the start or past u64"),
            ))),
        }
    }
}
