//! The C ABI the shim (`c/plugio_fio.c`) calls; declared for C in
//! `c/plugio_fio.h`.
//!
//! Invariants: every function here is called on the fio job thread that
//! made the core (fio's `FIO_NO_OFFLOAD`); no panic crosses into C (each
//! entry point that can panic catches it, reports it and returns an
//! error); pointers handed to C are `Box::into_raw` of the Rust values and
//! come back once, to the matching free function.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Duration;

use plugio_device::ErrorKind;

use crate::config::EngineConfig;
use crate::core::{Access, DevId, FioCore, Op};
use crate::slots::Completion;

/// The state the shim keeps in `td->io_ops_data` (opaque to C).
pub struct CoreHandle {
    core: FioCore,
    events: Vec<Completion>,
    /// A hook panicked inside plugio: the core's state may be half
    /// updated (a flush cut short), so it is never touched again. Its IO
    /// ends with `EIO`, `getevents` fails at once (fio then stops the job
    /// instead of waiting for completions that may never come), and the
    /// core and the io_u memory are leaked, not freed: the kernel may
    /// still be reading or writing that memory.
    poisoned: Cell<bool>,
}

/// What a hook says after a panic made the core unusable.
const POISONED_MSG: &str =
    "plugio: this job's plugio core is unusable after the panic above; its IO fails with EIO";

/// Runs `f` unless `poisoned`; a panic in it is reported on stderr and
/// poisons the core. `None` when it did not run or panicked.
fn guarded<T>(poisoned: &Cell<bool>, f: impl FnOnce() -> T) -> Option<T> {
    if poisoned.get() {
        return None;
    }
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(p) => {
            eprintln!("{}", panic_msg(&*p));
            eprintln!("{POISONED_MSG}");
            poisoned.set(true);
            None
        }
    }
}

/// Writes `msg` into the C buffer `buf` of `len` bytes, NUL-terminated and
/// cut to fit.
///
/// # Safety
/// `buf` is null or valid for `len` bytes of writes.
unsafe fn write_msg(buf: *mut c_char, len: usize, msg: &str) {
    if buf.is_null() || len == 0 {
        return;
    }
    let n = msg.len().min(len - 1);
    // SAFETY: the caller's contract; `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr().cast::<c_char>(), buf, n);
        *buf.add(n) = 0;
    }
}

/// A panic's message, for the shim to log.
fn panic_msg(p: &(dyn std::any::Any + Send)) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("plugio: panic: {what}")
}

/// `init`: makes the job thread's core; null on error, with the message in
/// `err`.
///
/// # Safety
/// `cfg` points to a valid config; `err` is valid for `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn plugio_fio_core_new(
    cfg: *const EngineConfig,
    err: *mut c_char,
    err_len: usize,
) -> *mut CoreHandle {
    // SAFETY: the caller's contract.
    let cfg = unsafe { *cfg };
    match catch_unwind(|| FioCore::new(cfg)) {
        Ok(Ok(core)) => Box::into_raw(Box::new(CoreHandle {
            core,
            events: Vec::with_capacity(cfg.iodepth as usize),
            poisoned: Cell::new(false),
        })),
        Ok(Err(e)) => {
            // SAFETY: the caller's contract.
            unsafe { write_msg(err, err_len, &format!("plugio: {e}")) };
            std::ptr::null_mut()
        }
        Err(p) => {
            // SAFETY: the caller's contract.
            unsafe { write_msg(err, err_len, &panic_msg(&*p)) };
            std::ptr::null_mut()
        }
    }
}

/// `cleanup`: waits for the core's IO in flight, then frees it (leaks it
/// after a panic poisoned it, see [`CoreHandle`]).
///
/// # Safety
/// `h` came from `plugio_fio_core_new` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn plugio_fio_core_free(h: *mut CoreHandle) {
    if h.is_null() {
        return;
    }
    // SAFETY: the caller's contract: the pointer is ours, given back once.
    let h = unsafe { Box::from_raw(h) };
    if h.poisoned.get() {
        std::mem::forget(h);
        return;
    }
    let poisoned = Cell::new(false);
    // A panic here leaks what was not dropped yet.
    guarded(&poisoned, || drop(h));
}

/// `iomem_alloc`: the io_u memory (null when the allocation failed);
/// `*registered` says whether it is registered with the ring.
///
/// # Safety
/// `h` is a live core; `registered` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn plugio_fio_iomem_alloc(
    h: *mut CoreHandle,
    len: usize,
    registered: *mut c_int,
) -> *mut c_void {
    // SAFETY: the caller's contract.
    let h = unsafe { &*h };
    match guarded(&h.poisoned, || h.core.iomem_alloc(len)) {
        Some((ptr, reg)) => {
            // SAFETY: the caller's contract.
            unsafe { *registered = c_int::from(reg) };
            ptr.cast()
        }
        None => std::ptr::null_mut(),
    }
}

/// `iomem_free`: waits for the IO in flight, then frees the io_u memory.
///
/// # Safety
/// `h` is a live core.
#[no_mangle]
pub unsafe extern "C" fn plugio_fio_iomem_free(h: *mut CoreHandle) {
    // SAFETY: the caller's contract.
    let h = unsafe { &*h };
    // Poisoned: the memory is leaked with the core.
    guarded(&h.poisoned, || h.core.iomem_free());
}

/// `open_file`: opens `path` with `access` (`enum plugio_fio_access`, see
/// [`Access`]); returns the device id + 1 (0 on error, with `*errno_out`
/// the errno, `*direct_refused` set when the file system refused
/// `O_DIRECT`, and the message in `err`).
///
/// # Safety
/// `h` is a live core; `path` a NUL-terminated string; `errno_out` and
/// `direct_refused` valid for writes; `err` valid for `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn plugio_fio_open(
    h: *mut CoreHandle,
    path: *const c_char,
    direct: c_int,
    access: u32,
    errno_out: *mut c_int,
    direct_refused: *mut c_int,
    err: *mut c_char,
    err_len: usize,
) -> usize {
    // SAFETY: the caller's contract.
    let (h, path) = unsafe { (&*h, CStr::from_ptr(path)) };
    let path = Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
    let res = match Access::from_raw(access) {
        Some(access) => guarded(&h.poisoned, || h.core.open(path, direct != 0, access)),
        None => Some(Err(plugio_device::Error::from_errno(libc::EINVAL)
            .with_context(
                "plugio_fio_open: an access value the engine does not know",
            ))),
    };
    let (errno, refused, msg) = match res {
        Some(Ok(id)) => return id.0 + 1,
        Some(Err(e)) => (
            open_errno(&e),
            *e.kind() == ErrorKind::DirectIoRefused,
            format!("plugio: {e}"),
        ),
        None => (libc::EIO, false, POISONED_MSG.to_string()),
    };
    // SAFETY: the caller's contract.
    unsafe {
        *errno_out = errno;
        *direct_refused = c_int::from(refused);
        write_msg(err, err_len, &msg);
    }
    0
}

/// The errno an open failure reaches fio with: `EBUSY` for a file this
/// process already has open with other options (another job thread's),
/// not the `EINVAL` of other bad input, which fio would report as "does
/// not support O_DIRECT" on a `direct=1` job.
fn open_errno(e: &plugio_device::Error) -> c_int {
    match e.kind() {
        ErrorKind::InvalidInput(plugio_device::InvalidInput::AlreadyOpen { .. }) => libc::EBUSY,
        _ => e.errno(),
    }
}

/// `close_file`: lets go of device `dev` (an id from `plugio_fio_open`).
///
/// # Safety
/// `h` is a live core.
#[no_mangle]
pub unsafe extern "C" fn plugio_fio_close(h: *mut CoreHandle, dev: usize) {
    // SAFETY: the caller's contract.
    let h = unsafe { &*h };
    if dev == 0 {
        return;
    }
    guarded(&h.poisoned, || h.core.close(DevId(dev - 1)));
}

/// `queue`: hands one IO to the core; returns 0, or `EINVAL` for an op
/// value or a device the core does not know, `EIO` once a panic poisoned
/// the core (nothing is queued then).
///
/// # Safety
/// `h` is a live core; `buf` as [`FioCore::queue`] requires.
#[no_mangle]
pub unsafe extern "C" fn plugio_fio_queue(
    h: *mut CoreHandle,
    dev: usize,
    op: u32,
    offset: u64,
    buf: *mut c_void,
    len: u64,
    cookie: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    let h = unsafe { &*h };
    if h.poisoned.get() {
        return libc::EIO;
    }
    let (Some(op), Some(id)) = (Op::from_raw(op), dev.checked_sub(1)) else {
        return libc::EINVAL;
    };
    // SAFETY: the caller's contract (the buffer).
    let queued = unsafe {
        h.core.queue(
            DevId(id),
            op,
            offset,
            buf.cast(),
            len as usize,
            cookie as usize,
        )
    };
    match queued {
        Ok(()) => 0,
        Err(_) => libc::EINVAL,
    }
}

/// `commit`: one tick (the plug flush, one `io_uring_enter`). Returns 0,
/// or `-EIO` after a panic (reported on stderr; it poisons the core).
///
/// # Safety
/// `h` is a live core.
#[no_mangle]
pub unsafe extern "C" fn plugio_fio_commit(h: *mut CoreHandle) -> c_int {
    // SAFETY: the caller's contract.
    let h = unsafe { &*h };
    match guarded(&h.poisoned, || h.core.commit()) {
        Some(()) => 0,
        None => -libc::EIO,
    }
}

/// `getevents`: waits for `min` completions or `timeout_ns` (negative: no
/// limit), returns how many are ready (at most `max`), or `-EIO` once a
/// panic poisoned the core (in this call or an earlier one: fio then ends
/// the job instead of waiting for IO the core may never complete). The
/// events are then read with [`plugio_fio_event`].
///
/// # Safety
/// `h` is a live core.
#[no_mangle]
pub unsafe extern "C" fn plugio_fio_getevents(
    h: *mut CoreHandle,
    min: u32,
    max: u32,
    timeout_ns: i64,
) -> c_int {
    // SAFETY: the caller's contract; nothing else borrows the handle now.
    let h = unsafe { &mut *h };
    let timeout = u64::try_from(timeout_ns).ok().map(Duration::from_nanos);
    let CoreHandle {
        core,
        events,
        poisoned,
    } = h;
    match guarded(poisoned, || {
        core.getevents(min as usize, max as usize, timeout, events)
    }) {
        Some(n) => n as c_int,
        None => {
            // No stale events are read back after the failure.
            events.clear();
            -libc::EIO
        }
    }
}

/// `event`: the cookie of event `i` of the last `getevents`, and its
/// result in `*result` (bytes, or `-errno`). Null when `i` is out of range.
///
/// # Safety
/// `h` is a live core; `result` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn plugio_fio_event(
    h: *mut CoreHandle,
    i: u32,
    result: *mut i64,
) -> *mut c_void {
    // SAFETY: the caller's contract.
    let h = unsafe { &*h };
    match h.events.get(i as usize) {
        Some(c) => {
            // SAFETY: the caller's contract.
            unsafe { *result = c.result };
            c.cookie as *mut c_void
        }
        None => std::ptr::null_mut(),
    }
}

/// The iostats of device `dev` and the core's tick counts, one line, into
/// `buf` (for `plugio_stats`).
///
/// # Safety
/// `h` is a live core; `buf` is valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn plugio_fio_stats(
    h: *mut CoreHandle,
    dev: usize,
    buf: *mut c_char,
    len: usize,
) {
    // SAFETY: the caller's contract.
    let h = unsafe { &*h };
    if h.poisoned.get() {
        return;
    }
    let Some(d) = dev.checked_sub(1).and_then(|i| h.core.device(DevId(i))) else {
        return;
    };
    let s = d.iostats();
    let t = h.core.tick_stats();
    let ring = h.core.ring_stats().map_or_else(String::new, |r| {
        format!(
            "; its ring: {} enters, batched waits {} untimed {} timed, {} late",
            r.enters, r.batch_waits_untimed, r.batch_waits_timed, r.late_batches
        )
    });
    let msg = format!(
        "plugio: {}: bios {} requests {} ({:.2} bios/request), plug flushes {}, \
         merges read {} write {}, fixed-buffer requests {}, bounced IOs {}, requeues {}; \
         this job's core: {} ticks, {} blocking parks{}",
        d.path()
            .map_or_else(|| "?".into(), |p| p.display().to_string()),
        s.bios,
        s.requests,
        s.bios_per_request(),
        s.plug_flushes,
        s.read.merges,
        s.write.merges,
        s.fixed_buf_requests,
        s.bounce_ios,
        s.requeues,
        t.ticks,
        t.parks,
        ring,
    );
    // SAFETY: the caller's contract.
    unsafe { write_msg(buf, len, &msg) };
}

#[cfg(plugio_fio_shim)]
extern "C" {
    /// The shim's `struct ioengine_ops` (`c/plugio_fio.c`).
    fn plugio_fio_ioengine_ops() -> *mut c_void;
}

/// The symbol fio looks up after `dlopen` (`get_ioengine`, fio's
/// `get_ioengine_t`): fills in the engine's ops. Only in a build with the
/// shim (`FIO_SRC` set when building).
///
/// # Safety
/// `ops` is valid for a write (fio passes its own local).
#[cfg(plugio_fio_shim)]
#[no_mangle]
pub unsafe extern "C" fn get_ioengine(ops: *mut *mut c_void) {
    // SAFETY: the caller's contract; the shim's ops are a static.
    unsafe { *ops = plugio_fio_ioengine_ops() };
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugio_device::{Error, InvalidInput};

    #[test]
    fn a_panic_poisons_the_core_and_later_hooks_do_not_run() {
        let poisoned = Cell::new(false);
        assert_eq!(guarded(&poisoned, || 7), Some(7));
        let r: Option<()> = guarded(&poisoned, || panic!("a bug in a hook"));
        assert_eq!(r, None);
        assert!(poisoned.get());
        let ran = Cell::new(false);
        assert_eq!(guarded(&poisoned, || ran.set(true)), None);
        assert!(!ran.get(), "a poisoned core is not touched again");
    }

    #[test]
    fn a_poisoned_core_fails_its_hooks_at_once_and_is_leaked() {
        let cfg = EngineConfig {
            iodepth: 4,
            iomem_bytes: 4 * 4096,
            ..EngineConfig::default()
        };
        let mut err = vec![0 as c_char; 256];
        // SAFETY: a valid config and message buffer.
        let h = unsafe { plugio_fio_core_new(&cfg, err.as_mut_ptr(), err.len()) };
        assert!(!h.is_null());
        let mut registered = 0;
        // SAFETY: a live core; a valid out pointer.
        let mem = unsafe { plugio_fio_iomem_alloc(h, 4 * 4096, &mut registered) };
        assert!(!mem.is_null());
        // What a panic inside a hook leaves (see `guarded`).
        // SAFETY: a live core, not borrowed elsewhere.
        unsafe { (*h).poisoned.set(true) };
        // SAFETY: a live core; the buffer is the io_u memory.
        unsafe {
            assert_eq!(plugio_fio_queue(h, 1, 0, 0, mem, 4096, mem), libc::EIO);
            assert_eq!(plugio_fio_commit(h), -libc::EIO);
            // With no limit: it must not wait.
            assert_eq!(plugio_fio_getevents(h, 4, 4, -1), -libc::EIO);
            let mut result = 0;
            assert!(plugio_fio_event(h, 0, &mut result).is_null());
        }
        let path = c"/nonexistent-but-never-opened";
        let (mut errno, mut refused) = (0, 0);
        // SAFETY: a live core, a C string, valid out pointers and buffer.
        let dev = unsafe {
            plugio_fio_open(
                h,
                path.as_ptr(),
                1,
                0,
                &mut errno,
                &mut refused,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        assert_eq!((dev, errno), (0, libc::EIO));
        // SAFETY: a live core, then given back once.
        unsafe {
            plugio_fio_iomem_free(h);
            plugio_fio_close(h, 1);
            plugio_fio_core_free(h);
        }
    }

    #[test]
    fn an_open_with_other_options_is_ebusy_other_bad_input_einval() {
        let busy = Error::invalid(InvalidInput::AlreadyOpen {
            detail: "queue_depth: 512 vs 256".into(),
        });
        assert_eq!(open_errno(&busy), libc::EBUSY);
        let bad = Error::invalid(InvalidInput::ZeroLength);
        assert_eq!(open_errno(&bad), libc::EINVAL);
    }
}
