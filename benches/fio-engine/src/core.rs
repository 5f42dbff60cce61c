//! [`FioCore`]: one plugio core per fio job thread, driven by fio's hooks.
//!
//! The hooks never block inside plugio except in `getevents` (and in the
//! drains of `iomem_free` and drop). IO runs in one task per core, the
//! engine task: it owns the IO futures of the core (in [`IoSlots`], one
//! slot per IO in flight, allocated once), takes the IOs `queue` handed
//! over, and moves finished ones to the done queue. A completion therefore
//! needs one tick: the park that reaps the CQE wakes the IO's slot, which
//! wakes the engine task, which the next tick polls; a task per IO would
//! need two.
//!
//! [`IoSlots`]: crate::slots::IoSlots
//!
//! Invariants (besides the crate's):
//! - `outstanding` counts the IOs queued and not yet returned by
//!   `getevents` (so it includes the done queue); `getevents` never waits
//!   for more completions than that.
//! - The shared cells are borrowed only for the length of a push or a
//!   drain, never across a poll of an IO future or a tick.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::Path;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use plugio_device::buf::{configure_arena, ArenaConfig};
use plugio_device::{DmaBuf, Error};
use plugio_engine::Device;
use plugio_executor::{JoinHandle, LocalExecutor};

use crate::config::EngineConfig;
pub use crate::slots::Completion;
use crate::slots::IoSlots;

/// What an io_u asks for (fio's `ddir`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    /// `DDIR_READ`: read `len` bytes at `offset` into the buffer.
    Read = 0,
    /// `DDIR_WRITE`: write `len` bytes of the buffer at `offset`.
    Write = 1,
    /// `DDIR_SYNC` (fio's `fsync=`): `Device::sync`, an `fsync`.
    Sync = 2,
    /// `DDIR_DATASYNC` (fio's `fdatasync=`): `Device::flush`, an
    /// `fdatasync`.
    DataSync = 3,
    /// `DDIR_TRIM`: `Device::discard` of `[offset, offset + len)`.
    Trim = 4,
}

impl Op {
    /// The op with the value the shim passes (`enum plugio_fio_op`).
    pub fn from_raw(raw: u32) -> Option<Op> {
        Some(match raw {
            0 => Op::Read,
            1 => Op::Write,
            2 => Op::Sync,
            3 => Op::DataSync,
            4 => Op::Trim,
            _ => return None,
        })
    }
}

/// How [`FioCore::open`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Access {
    /// For reading and writing (a job that writes or trims).
    ReadWrite = 0,
    /// The job only reads: opened for writing too where the file allows
    /// it, so that it shares the plugio device of a job thread that writes
    /// the same file at the same time (one file is one device state per
    /// process, with one set of options); read-only where it cannot be
    /// written (permissions, a read-only file system). fio itself never
    /// lets the job write (`fio_ro_check`).
    Reads = 1,
    /// Read-only, always (fio's `--readonly`).
    ReadOnly = 2,
}

impl Access {
    /// The access with the value the shim passes (`enum plugio_fio_access`).
    pub fn from_raw(raw: u32) -> Option<Access> {
        Some(match raw {
            0 => Access::ReadWrite,
            1 => Access::Reads,
            2 => Access::ReadOnly,
            _ => return None,
        })
    }
}

/// A file opened by [`FioCore::open`]: an index into the core's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevId(pub usize);

/// [`FioCore::queue`] on a device id that names no open device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoSuchDevice(pub DevId);

impl std::fmt::Display for NoSuchDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "plugio fio engine: IO queued on device {}, which is not open (open_file first)",
            self.0 .0
        )
    }
}

impl std::error::Error for NoSuchDevice {}

/// One IO handed from `queue` to the engine task.
struct Submission {
    dev: Rc<Device>,
    op: Op,
    offset_bytes: u64,
    buf: *mut u8,
    len_bytes: usize,
    cookie: usize,
}

/// What the hooks and the engine task share (same thread).
#[derive(Default)]
struct Shared {
    submitted: RefCell<VecDeque<Submission>>,
    /// Completions not yet returned by `getevents`, oldest first.
    done: RefCell<Vec<Completion>>,
    /// The engine task's waker, stored at its last poll.
    task_waker: RefCell<Option<Waker>>,
}

/// One plugio core for one fio job thread. See the crate documentation.
pub struct FioCore {
    config: EngineConfig,
    shared: Rc<Shared>,
    outstanding: Cell<usize>,
    devices: RefCell<Vec<Option<Rc<Device>>>>,
    _task: JoinHandle<()>,
    /// Dropped after the devices (and the task handle) above: its drop
    /// waits for every op in flight on the ring.
    ex: LocalExecutor,
    /// The io_u memory; dropped after the executor, whose drop drained
    /// the ring.
    iomem: RefCell<Option<DmaBuf>>,
}

impl FioCore {
    /// Builds the core on the calling thread (fio's `init` hook): sizes the
    /// thread's registered arena for the io_u memory, then makes the ring
    /// and the executor.
    ///
    /// # Errors
    /// The ring or the executor could not be made (a plugio driver is
    /// already installed on this thread; io_uring setup failed in a way
    /// that has no fallback).
    pub fn new(config: EngineConfig) -> Result<FioCore, Error> {
        if config.fixedbufs != 0 && config.iomem_bytes > 0 {
            // One chunk holding all of fio's io_u memory, registered with
            // the ring when the driver is made just below.
            configure_arena(ArenaConfig {
                chunk_bytes: (config.iomem_bytes as usize).next_multiple_of(4096),
                nr_chunks: 1,
            });
        }
        let ex = plugio_engine::runtime::local(config.ring_config()).map_err(Error::from)?;
        let shared = Rc::new(Shared::default());
        let task = ex.spawn_local(serve(shared.clone(), config.iodepth as usize));
        // Runs the task's first poll, which stores its waker.
        ex.run_once();
        Ok(FioCore {
            config,
            shared,
            outstanding: Cell::new(0),
            devices: RefCell::new(Vec::new()),
            _task: task,
            ex,
            iomem: RefCell::new(None),
        })
    }

    /// The configuration the core was made with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// fio's `iomem_alloc`: `len_bytes` of io_u memory, 4096-aligned. It is
    /// the core's registered arena chunk when `fixedbufs` is on and the
    /// kernel registered it (IO on it then goes out as
    /// `READ_FIXED`/`WRITE_FIXED`), else a plain aligned allocation.
    /// Returns the memory and whether it is registered. A second call
    /// replaces the first allocation (after waiting for the IO in flight).
    pub fn iomem_alloc(&self, len_bytes: usize) -> (*mut u8, bool) {
        self.iomem_free();
        let registered = if self.config.fixedbufs != 0 {
            DmaBuf::registered(len_bytes, 4096)
        } else {
            None
        };
        let is_registered = registered.is_some();
        let mut buf = registered.unwrap_or_else(|| DmaBuf::heap(len_bytes, 4096));
        let ptr = buf.as_mut_slice().as_mut_ptr();
        *self.iomem.borrow_mut() = Some(buf);
        (ptr, is_registered)
    }

    /// fio's `iomem_free`: waits until nothing of this core is in flight,
    /// then releases the io_u memory.
    pub fn iomem_free(&self) {
        self.drain();
        self.iomem.borrow_mut().take();
    }

    /// fio's `open_file`: opens `path` through plugio, with `O_DIRECT` when
    /// `direct`, with the [`Access`] the job needs.
    ///
    /// # Errors
    /// `Device::open`'s: `ErrorKind::DirectIoRefused` when the file system
    /// refuses `O_DIRECT`; `InvalidInput::AlreadyOpen` when another job
    /// thread of this process has the file open with other options
    /// (`direct=`, the `plugio_*` options, or read-only against writing);
    /// the open's errno otherwise.
    pub fn open(&self, path: &Path, direct: bool, access: Access) -> Result<DevId, Error> {
        let open = |read_only| Device::open(path, self.config.device_options(direct, read_only));
        let dev = match access {
            Access::ReadWrite => open(false)?,
            Access::ReadOnly => open(true)?,
            Access::Reads => match open(false) {
                Err(e) if cannot_write(&e) => open(true)?,
                other => other?,
            },
        };
        let mut devices = self.devices.borrow_mut();
        let slot = devices.iter().position(Option::is_none);
        let id = match slot {
            Some(i) => {
                devices[i] = Some(Rc::new(dev));
                i
            }
            None => {
                devices.push(Some(Rc::new(dev)));
                devices.len() - 1
            }
        };
        Ok(DevId(id))
    }

    /// fio's `close_file`: lets go of the device (fio closes a file only
    /// when no IO of it is in flight); one tick lets the core drop it.
    pub fn close(&self, id: DevId) {
        let dev = self
            .devices
            .borrow_mut()
            .get_mut(id.0)
            .and_then(Option::take);
        drop(dev);
        self.ex.run_once();
    }

    /// The device of `id` (for its iostats and geometry).
    pub fn device(&self, id: DevId) -> Option<Rc<Device>> {
        self.devices.borrow().get(id.0).cloned().flatten()
    }

    /// fio's `queue`: hands one IO to the engine task; it is issued by the
    /// next [`FioCore::commit`] (or `getevents`), and completes through
    /// [`FioCore::getevents`] with `cookie`.
    ///
    /// # Errors
    /// [`NoSuchDevice`] when `id` names no open device (fio never queues
    /// IO on a closed file); nothing is queued then.
    ///
    /// # Safety
    /// For `Read` and `Write`, `buf` must be valid for `len_bytes` bytes of
    /// reads and writes until `getevents` returns this IO's completion, and
    /// nothing else may touch it meanwhile.
    pub unsafe fn queue(
        &self,
        id: DevId,
        op: Op,
        offset_bytes: u64,
        buf: *mut u8,
        len_bytes: usize,
        cookie: usize,
    ) -> Result<(), NoSuchDevice> {
        let dev = self.device(id).ok_or(NoSuchDevice(id))?;
        self.shared.submitted.borrow_mut().push_back(Submission {
            dev,
            op,
            offset_bytes,
            buf,
            len_bytes,
            cookie,
        });
        self.outstanding.set(self.outstanding.get() + 1);
        Ok(())
    }

    /// fio's `commit`: one executor tick (`LocalExecutor::run_once`): the
    /// engine task issues the queued IOs into the plug, the tick hook
    /// flushes the plug (merging, tags, SQEs), and one `io_uring_enter`
    /// submits the batch. Completions already there are collected too.
    pub fn commit(&self) {
        self.wake_task();
        self.ex.run_once();
    }

    /// fio's `getevents`: drives the executor until at least `min`
    /// completions are ready or `timeout` passes (`None`: no limit;
    /// `Some(ZERO)`: one tick without waiting), then moves up to `max` of
    /// them into `out` (cleared first) and returns how many. `min` is
    /// capped at what can still complete, so the call never waits for IO
    /// that was not queued.
    pub fn getevents(
        &self,
        min: usize,
        max: usize,
        timeout: Option<Duration>,
        out: &mut Vec<Completion>,
    ) -> usize {
        self.wake_task();
        let min = min.min(self.outstanding.get());
        let deadline = timeout.map(|t| Instant::now() + t);
        if min == 0 || self.done_len() < min {
            loop {
                let wait = if min == 0 {
                    Some(Duration::ZERO)
                } else {
                    deadline.map(|d| d.saturating_duration_since(Instant::now()))
                };
                self.ex.run_once_timeout(wait);
                let expired = deadline.is_some_and(|d| Instant::now() >= d);
                if self.done_len() >= min || expired {
                    break;
                }
            }
        }
        out.clear();
        let mut done = self.shared.done.borrow_mut();
        let n = done.len().min(max);
        if n == done.len() {
            // The common case (max is fio's iodepth_batch_complete_max):
            // hand the whole queue over, keep the other vector's capacity.
            std::mem::swap(out, &mut *done);
        } else {
            out.extend(done.drain(..n));
        }
        self.outstanding.set(self.outstanding.get() - n);
        n
    }

    /// The executor's tick statistics (ticks run, blocking parks).
    pub fn tick_stats(&self) -> plugio_executor::TickStats {
        self.ex.tick_stats()
    }

    /// IOs queued and not yet returned by `getevents`.
    pub fn outstanding(&self) -> usize {
        self.outstanding.get()
    }

    fn done_len(&self) -> usize {
        self.shared.done.borrow().len()
    }

    /// Wakes the engine task when `queue` handed it IOs.
    fn wake_task(&self) {
        if self.shared.submitted.borrow().is_empty() {
            return;
        }
        let waker = self.shared.task_waker.borrow().clone();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Drives the executor until every queued IO has completed (their
    /// completions stay in the done queue for `getevents`).
    fn drain(&self) {
        self.wake_task();
        while self.done_len() < self.outstanding.get() {
            self.ex.run_once_timeout(Some(Duration::from_millis(100)));
        }
    }
}

impl Drop for FioCore {
    fn drop(&mut self) {
        self.drain();
        self.devices.borrow_mut().clear();
        self.ex.run_once();
    }
}

/// Whether `e` says the file cannot be opened for writing (permissions, a
/// read-only file system).
fn cannot_write(e: &Error) -> bool {
    matches!(e.kind(), plugio_device::ErrorKind::PermissionDenied) || e.errno() == libc::EROFS
}

/// The engine task: takes the IOs handed over by `queue` (as many as it
/// has free slots: fio never has more than `iodepth` in flight), polls the
/// woken IO futures, and moves the finished ones to the done queue.
async fn serve(shared: Rc<Shared>, iodepth: usize) {
    let mut slots = IoSlots::new(iodepth);
    std::future::poll_fn(move |cx| {
        let mut done = shared.done.borrow_mut();
        slots.poll_ready(cx.waker(), &mut done);
        while slots.has_free() {
            let Some(s) = shared.submitted.borrow_mut().pop_front() else {
                break;
            };
            let cookie = s.cookie;
            if let Some(c) = slots.start(|| run_io(s), cookie) {
                done.push(c);
            }
        }
        let mut stored = shared.task_waker.borrow_mut();
        if !stored.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *stored = Some(cx.waker().clone());
        }
        Poll::<()>::Pending
    })
    .await;
}

/// One IO through the plugio device: its bytes, or `-errno`. Reads and
/// writes go straight to and from the io_u's memory ([`IoUBuf`]): no copy
/// (unless the memory is not aligned for direct IO and the device bounces
/// it, `plugio_bounce_unaligned`).
async fn run_io(s: Submission) -> i64 {
    let buf = IoUBuf {
        ptr: s.buf,
        len: s.len_bytes,
    };
    let result = match s.op {
        Op::Read => s.dev.read_at(buf, s.offset_bytes).await.0.map(|n| n as i64),
        Op::Write => s
            .dev
            .write_at(buf, s.offset_bytes)
            .await
            .0
            .map(|n| n as i64),
        Op::Sync => s.dev.sync_all().await.map(|()| 0),
        Op::DataSync => s.dev.sync_data().await.map(|()| 0),
        // The bytes discarded: fio counts a trim's length as its
        // transfer (`xfer_buflen - resid`).
        Op::Trim => s
            .dev
            .discard(s.offset_bytes, s.len_bytes as u64)
            .await
            .map(|()| s.len_bytes as i64),
    };
    result.unwrap_or_else(|e| -i64::from(e.errno()))
}

/// The memory of one io_u: `len` bytes at `ptr`, inside the region fio
/// carved its io_u buffers from (the core's registered arena when
/// `fixedbufs` is on, so the engine sends IO on it as
/// `READ_FIXED`/`WRITE_FIXED`). It does not own the memory: fio does, and
/// lends it to the IO from `queue` until `getevents` returns it.
struct IoUBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is a pointer to memory the io_u lends to this IO
// alone (`FioCore::queue`'s contract); it is only used on the core's
// thread, and moving the handle to another thread would not touch the
// memory.
unsafe impl Send for IoUBuf {}

// SAFETY: (1) `FioCore::queue`'s contract: `ptr` is valid for reads of
// `len` bytes, initialised (fio fills its buffers), until the IO
// completes, which is before `getevents` gives the io_u back; (2) the
// address is the io_u's memory, not inside this handle, so moves do not
// change it; (3) `bytes_init == bytes_total`.
unsafe impl plugio_engine::IoBuf for IoUBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
}

// SAFETY: (1) the same address, valid for writes of `len` bytes
// (`queue`'s contract); (2) fio does not touch an io_u's memory while the
// io_u is queued, and no other IO is given the same memory at once (an
// io_u is in flight at most once); (3) fixed-size: the read's byte count
// reaches fio as the completion's result, which becomes `resid`.
unsafe impl plugio_engine::IoBufMut for IoUBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    unsafe fn set_init(&mut self, _len_bytes: usize) {}
}
