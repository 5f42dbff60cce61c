//! A per-thread runtime kept in a `thread_local!` that is destroyed after
//! the engine's own thread-local state, with orphaned reads (their futures
//! dropped) at the kernel as the thread exits. The engine state, which
//! keeps those reads' buffers, must not be dropped before the executor's
//! driver drains the ring: the kernel would write into freed memory (a
//! break-it helper's finding), and the requests' tags would stay taken.
//! Each buffer's `Drop` fills its memory with a mark and records it; no
//! read may write into it afterwards.

use std::cell::RefCell;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Context;
use std::time::Duration;

use plugio_device::backend::mem::{Latency, MemClock, MemConfig, MemDevice};
use plugio_engine::{Device, DeviceOptions, IoBuf, IoBufMut};

mod common;
use common::local;

/// The byte the device's data is made of (the reads bring it in).
const DATA: u8 = 0x5A;
/// The byte a buffer's `Drop` fills it with.
const DROPPED: u8 = 0xEE;

/// The buffers whose `Drop` ran: (address, length) of their memory, which
/// stays allocated until `check` has looked for late writes into it.
static DROPPED_BUFS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
/// One test at a time uses `DROPPED_BUFS`.
static SERIAL: Mutex<()> = Mutex::new(());

/// A 4096-aligned buffer whose memory outlives it (freed by `check`).
struct Marked {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain memory that no one else touches.
unsafe impl Send for Marked {}

impl Marked {
    fn new(len: usize) -> Marked {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: `len` is not zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Marked { ptr, len }
    }
}

impl Drop for Marked {
    fn drop(&mut self) {
        // SAFETY: the buffer's own memory, freed only by `check`.
        unsafe { std::ptr::write_bytes(self.ptr, DROPPED, self.len) };
        DROPPED_BUFS
            .lock()
            .unwrap()
            .push((self.ptr as usize, self.len));
    }
}

// SAFETY: the memory never moves and is freed only after the IO ended.
unsafe impl IoBuf for Marked {
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

// SAFETY: as above.
unsafe impl IoBufMut for Marked {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    unsafe fn set_init(&mut self, _len_bytes: usize) {}
}

thread_local! {
    /// An executor kept past the test body. Thread-locals are destroyed
    /// in the reverse order of their first use, so used before the
    /// engine's it is destroyed after it.
    static HOLD: RefCell<Option<plugio_executor::LocalExecutor>> = const { RefCell::new(None) };
}

/// Issues `count` reads of `size` bytes on `dev` and drops their futures
/// (orphaned), then lets one tick send them.
async fn orphan_reads(dev: &Device, count: u64, size: usize) {
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    for k in 0..count {
        let offset = k * size as u64 % (1 << 20);
        let mut f = Box::pin(dev.read_at(Marked::new(size), offset));
        assert!(f.as_mut().poll(&mut cx).is_pending());
        drop(f);
    }
    plugio_executor::yield_now().await;
}

/// The checks after the thread exited: no dropped buffer got data after
/// its `Drop`, and the device has no tag taken.
fn check(dev: &Device, what: &str) {
    assert_eq!(
        dev.tags_in_use(),
        0,
        "{what}: tags left taken after the thread exited"
    );
    let dropped = std::mem::take(&mut *DROPPED_BUFS.lock().unwrap());
    for (ptr, len) in dropped {
        // SAFETY: memory of a `Marked`, not freed yet.
        let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
        let late = bytes.iter().filter(|&&b| b == DATA).count();
        assert_eq!(
            late, 0,
            "{what}: {late} bytes were read into a buffer after its Drop ran"
        );
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: allocated by `Marked::new` with this layout; its `Drop`
        // ran and no tag is taken (checked above: its read ended), so
        // nothing uses it any more. (Freed so that leak checkers see no
        // leak.)
        unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
    }
    let ex = local();
    ex.run(async { dev.nop().await.unwrap() });
}

/// The executor goes into `HOLD`, whose first use comes before the
/// engine's (`hold_first`: destroyed after the engine's state) or after.
fn run(dev: Device, size: usize, hold_first: bool, what: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    DROPPED_BUFS.lock().unwrap().clear();
    let d = dev.clone();
    std::thread::spawn(move || {
        if hold_first {
            HOLD.with(|_| {});
        }
        let ex = local();
        ex.run(orphan_reads(&d, 32, size));
        HOLD.with(|h| *h.borrow_mut() = Some(ex));
    })
    .join()
    .unwrap();
    check(&dev, what);
}

fn mem_device(clock: MemClock) -> Device {
    let mem = Arc::new(MemDevice::new(MemConfig {
        capacity_bytes: 1 << 20,
        latency: Latency::Fixed(Duration::from_millis(5)),
        clock,
        ..Default::default()
    }));
    let dev = Device::with_backend(mem, None, DeviceOptions::default()).unwrap();
    let d = dev.clone();
    local().run(async move {
        let mut buf = d.alloc_buf(1 << 20);
        buf.as_mut_slice().fill(DATA);
        d.write_at(buf, 0).await.0.unwrap();
    });
    dev
}

#[test]
fn orphaned_reads_at_thread_exit_mem_real_clock() {
    run(mem_device(MemClock::Real), 4096, true, "mem, real clock");
}

#[test]
fn orphaned_reads_at_thread_exit_mem_virtual_clock() {
    run(
        mem_device(MemClock::Virtual),
        4096,
        true,
        "mem, virtual clock",
    );
}

#[test]
fn orphaned_reads_at_thread_exit_executor_dropped_first() {
    run(
        mem_device(MemClock::Real),
        4096,
        false,
        "executor dropped first",
    );
}

#[test]
fn orphaned_reads_at_thread_exit_file() {
    let dir = common::tmpdir();
    let path = common::file_of(dir.path(), "f", &vec![DATA; 1 << 20]);
    let dev = Device::open(&path, DeviceOptions::default()).unwrap();
    run(dev, 65536, true, "O_DIRECT file");
}

thread_local! {
    /// The usual lazily built per-thread runtime.
    static RUNTIME: plugio_executor::LocalExecutor = local();
}

#[test]
fn per_thread_runtime_in_a_thread_local() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    DROPPED_BUFS.lock().unwrap().clear();
    let dir = common::tmpdir();
    let path = common::file_of(dir.path(), "g", &vec![DATA; 1 << 20]);
    let dev = Device::open(&path, DeviceOptions::default()).unwrap();
    let d = dev.clone();
    std::thread::spawn(move || RUNTIME.with(|rt| rt.run(orphan_reads(&d, 64, 65536))))
        .join()
        .unwrap();
    check(&dev, "thread_local! runtime");
}
