//! [`FioCore`]: one plugio core per fio job thread, driven by fio's hooks.
//!
//! The hooks never block inside plugio except in `getevents` (and in the
//! drains of `iomem_free` and drop). No task runs the IO: the core owns
//! its IO futures (in [`IoSlots`], one slot per IO in flight, allocated
//! once) and polls them itself, with the executor's core entered
//! ([`LocalExecutor::enter`]). `queue` queues an IO; `commit` starts the
//! queued ones (their first polls put their bios into the plug, with the
//! core entered once for the batch), then runs one tick, whose end flushes
//! the plug and whose park submits the batch and collects the completions
//! there in one `io_uring_enter`; a collected completion
//! wakes its slot (a bit), and `getevents` polls the woken slots before it
//! runs the executor, which it does only when they are not enough. So a
//! batch of fio's costs one enter, as with fio's own io_uring engine.
//!
//! [`IoSlots`]: crate::slots::IoSlots
//!
//! Invariants (besides the crate's):
//! - `outstanding` counts the IOs queued and not yet returned by
//!   `getevents` (so it includes the done queue); `getevents` never waits
//!   for more completions than that.
//! - IO futures are polled only with the core entered, and never while
//!   the executor runs (`run_once` refuses an entered core).
//! - The cells are borrowed only for the length of a push, a drain or a
//!   round of slot polls, never across a tick.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
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

/// One IO as `queue` got it.
struct Submission {
    dev: Rc<Device>,
    op: Op,
    offset_bytes: u64,
    buf: *mut u8,
    len_bytes: usize,
    cookie: usize,
}

/// The core's IO slots with the function that makes an IO's future: the
/// future is an `async fn`'s, whose type has no name, so the slots are
/// kept behind this trait (one dynamic call per batch of starts and per
/// round of polls, none per IO).
trait IoEngine {
    /// Starts IOs of `queued`, oldest first, while a slot is free (see
    /// [`IoSlots::start`]); those that finish at once (refused before
    /// submission) go to `done`.
    fn start_queued(&mut self, queued: &mut VecDeque<Submission>, done: &mut Vec<Completion>);
    /// Polls the woken slots (see [`IoSlots::poll_ready`]).
    fn poll_ready(&mut self, doorbell: &Waker, done: &mut Vec<Completion>);
}

struct Engine<F, M> {
    slots: IoSlots<F>,
    make: M,
}

impl<F: Future<Output = i64>, M: Fn(Submission) -> F> IoEngine for Engine<F, M> {
    fn start_queued(&mut self, queued: &mut VecDeque<Submission>, done: &mut Vec<Completion>) {
        while self.slots.has_free() {
            let Some(s) = queued.pop_front() else {
                break;
            };
            let cookie = s.cookie;
            let make = &self.make;
            if let Some(c) = self.slots.start(|| make(s), cookie) {
                done.push(c);
            }
        }
    }

    fn poll_ready(&mut self, doorbell: &Waker, done: &mut Vec<Completion>) {
        self.slots.poll_ready(doorbell, done);
    }
}

fn io_engine<F, M>(make: M, iodepth: usize) -> Box<dyn IoEngine>
where
    F: Future<Output = i64> + 'static,
    M: Fn(Submission) -> F + 'static,
{
    Box::new(Engine {
        slots: IoSlots::new(iodepth),
        make,
    })
}

/// The most bytes one registered buffer may have: io_uring refuses a
/// larger one with `EFAULT` (`io_buffer_validate`: 1 GiB).
const MAX_REGISTERED_BUFFER_BYTES: u64 = 1 << 30;

/// One plugio core for one fio job thread. See the crate documentation.
pub struct FioCore {
    config: EngineConfig,
    outstanding: Cell<usize>,
    devices: RefCell<Vec<Option<Rc<Device>>>>,
    /// The IO futures (dropped before the executor: a future of an IO
    /// still in flight lets go of its bio through the core's state).
    slots: RefCell<Box<dyn IoEngine>>,
    /// IOs queued and not started yet, oldest first: `commit` starts them
    /// (with the core entered once for the batch), or `getevents` when a
    /// slot frees up (fio queues at most `iodepth`, so they normally all
    /// start at the commit).
    queued: RefCell<VecDeque<Submission>>,
    /// Completions not yet returned by `getevents`, oldest first.
    done: RefCell<Vec<Completion>>,
    /// The waker of a task that does nothing: the first slot wake of a
    /// round wakes it, which unparks the core when the wake comes from
    /// another thread (an IO completed off the core), so that a
    /// `getevents` waiting in the park returns to poll the slot.
    doorbell: Waker,
    _doorbell_task: JoinHandle<()>,
    /// Dropped after the devices and the slots above: its drop waits for
    /// every op in flight on the ring.
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
    /// An engine option out of its range ([`EngineConfig::check`];
    /// `InvalidInput::Config`); the ring or the executor could not be made
    /// (a plugio driver is already installed on this thread; io_uring
    /// setup failed in a way that has no fallback).
    pub fn new(config: EngineConfig) -> Result<FioCore, Error> {
        config
            .check()
            .map_err(|detail| Error::invalid(plugio_device::InvalidInput::Config { detail }))?;
        let iomem_bytes = config.iomem_bytes.next_multiple_of(4096);
        if config.fixedbufs != 0 && iomem_bytes > MAX_REGISTERED_BUFFER_BYTES {
            eprintln!(
                "plugio: the job's io_u memory ({iomem_bytes} bytes) is over io_uring's \
                 limit of {MAX_REGISTERED_BUFFER_BYTES} bytes for one registered buffer: it is \
                 not registered, and IO goes without READ_FIXED/WRITE_FIXED (lower iodepth \
                 or bs, or set plugio_fixedbufs=0)"
            );
        } else if config.fixedbufs != 0 && iomem_bytes > 0 {
            // One chunk holding all of fio's io_u memory, registered with
            // the ring when the driver is made just below.
            configure_arena(ArenaConfig {
                chunk_bytes: iomem_bytes as usize,
                nr_chunks: 1,
            });
        }
        let ex = plugio_engine::runtime::local(config.ring_config()).map_err(Error::from)?;
        let stored = Rc::new(RefCell::new(None::<Waker>));
        let doorbell_task = ex.spawn_local(doorbell(stored.clone()));
        // Runs the task's first poll, which stores its waker.
        ex.run_once();
        let doorbell = stored
            .borrow_mut()
            .take()
            .expect("the doorbell task stores its waker at its first poll");
        Ok(FioCore {
            slots: RefCell::new(io_engine(run_io, config.iodepth as usize)),
            config,
            outstanding: Cell::new(0),
            devices: RefCell::new(Vec::new()),
            queued: RefCell::new(VecDeque::new()),
            done: RefCell::new(Vec::new()),
            doorbell,
            _doorbell_task: doorbell_task,
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
        if self.config.fixedbufs != 0
            && !is_registered
            && len_bytes as u64 <= MAX_REGISTERED_BUFFER_BYTES
        {
            eprintln!(
                "plugio: the job's io_u memory ({len_bytes} bytes) could not be registered \
                 with the ring (RLIMIT_MEMLOCK?); IO goes without READ_FIXED/WRITE_FIXED"
            );
        }
        // Not registered (fixed buffers off, or the ring refused the
        // arena): the arena's chunk where it fits, as plain memory, so
        // that the job does not hold that memory twice; else the heap.
        let mut buf = registered.unwrap_or_else(|| DmaBuf::with_align(len_bytes, 4096));
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
        self.tick(Some(Duration::ZERO));
    }

    /// The device of `id` (for its iostats and geometry).
    pub fn device(&self, id: DevId) -> Option<Rc<Device>> {
        self.devices.borrow().get(id.0).cloned().flatten()
    }

    /// fio's `queue`: queues one IO; the next [`FioCore::commit`] starts
    /// it (its bio joins the core's plug) and sends it. It completes
    /// through [`FioCore::getevents`] with `cookie`; an IO refused before
    /// submission (bad input) completes with its errno.
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
        let s = Submission {
            dev,
            op,
            offset_bytes,
            buf,
            len_bytes,
            cookie,
        };
        self.queued.borrow_mut().push_back(s);
        self.outstanding.set(self.outstanding.get() + 1);
        Ok(())
    }

    /// fio's `commit`: starts the queued IOs (their first polls, with the
    /// core entered once for the batch: the bios join the plug), then one
    /// executor tick (`LocalExecutor::run_once`): the tick hook flushes the
    /// plug (merging, tags, SQEs), and one `io_uring_enter` submits the
    /// batch and collects the completions already there (they wake their
    /// slots for `getevents`).
    pub fn commit(&self) {
        self.ex
            .enter(|| self.start_queued(&mut **self.slots.borrow_mut()));
        self.tick(Some(Duration::ZERO));
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
        let min = min.min(self.outstanding.get());
        // The completions the last enter collected first: no tick (and no
        // enter) when they are enough.
        self.poll_slots();
        if min == 0 || self.done_len() < min {
            let deadline = timeout.map(|t| Instant::now() + t);
            loop {
                let wait = if min == 0 {
                    Some(Duration::ZERO)
                } else {
                    deadline.map(|d| d.saturating_duration_since(Instant::now()))
                };
                self.tick(wait);
                self.poll_slots();
                let expired = deadline.is_some_and(|d| Instant::now() >= d);
                if self.done_len() >= min || expired {
                    break;
                }
            }
        }
        out.clear();
        let mut done = self.done.borrow_mut();
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

    /// The counters of this core's ring (`None` without one: the sync
    /// fallback).
    pub fn ring_stats(&self) -> Option<plugio_device::RingStats> {
        plugio_device::ring::current_stats()
    }

    /// IOs queued and not yet returned by `getevents`.
    pub fn outstanding(&self) -> usize {
        self.outstanding.get()
    }

    fn done_len(&self) -> usize {
        self.done.borrow().len()
    }

    /// Polls the slots woken since the last round (their completions go to
    /// the done queue), then starts queued IOs that waited for a free slot
    /// (or for a commit).
    fn poll_slots(&self) {
        self.ex.enter(|| {
            let mut slots = self.slots.borrow_mut();
            slots.poll_ready(&self.doorbell, &mut self.done.borrow_mut());
            self.start_queued(&mut **slots);
        });
    }

    /// Starts queued IOs while slots are free (the core is entered).
    fn start_queued(&self, slots: &mut dyn IoEngine) {
        let mut queued = self.queued.borrow_mut();
        if queued.is_empty() {
            return;
        }
        slots.start_queued(&mut queued, &mut self.done.borrow_mut());
    }

    /// One tick that waits at most `wait` first. Started IOs that wait in
    /// the plug are not waited for: the executor ticks first after an
    /// `enter` that left bios in the plug (`TickHook::has_pending`).
    fn tick(&self, wait: Option<Duration>) {
        self.ex.run_once_timeout(wait);
    }

    /// Drives the executor until every queued IO has completed (their
    /// completions stay in the done queue for `getevents`).
    fn drain(&self) {
        self.poll_slots();
        while self.done_len() < self.outstanding.get() {
            self.tick(Some(Duration::from_millis(100)));
            self.poll_slots();
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

/// The doorbell task: never finishes; stores its waker at its first poll
/// (a later wake only makes the executor run it, and return from a park).
async fn doorbell(stored: Rc<RefCell<Option<Waker>>>) {
    let mut first = true;
    std::future::poll_fn(move |cx| {
        if std::mem::take(&mut first) {
            *stored.borrow_mut() = Some(cx.waker().clone());
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
