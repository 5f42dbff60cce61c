//! The C ABI the shim calls, called here the way the shim calls it (init,
//! iomem_alloc, open_file, queue, commit, getevents, event, close_file,
//! iomem_free, cleanup), without fio.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;

use plugio_fio::ffi::*;
use plugio_fio::EngineConfig;

const BS: usize = 4096;

fn err_buf() -> Vec<c_char> {
    vec![0; 512]
}

fn msg(buf: &[c_char]) -> String {
    // SAFETY: the callee NUL-terminates what it writes; the buffer starts
    // zeroed.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn the_hooks_sequence_writes_and_reads_back() {
    let tmp =
        tempfile::NamedTempFile::new_in(plugio_device::testing::direct_io_dir()).expect("tmp");
    tmp.as_file().set_len(1 << 20).expect("size");
    let path = CString::new(tmp.path().to_str().expect("utf-8")).expect("path");
    let cfg = EngineConfig {
        iodepth: 4,
        iomem_bytes: 4 * BS as u64 + 8192,
        ..EngineConfig::default()
    };
    let mut err = err_buf();
    // SAFETY: valid config and buffer.
    let core = unsafe { plugio_fio_core_new(&cfg, err.as_mut_ptr(), err.len()) };
    assert!(!core.is_null(), "{}", msg(&err));
    let mut registered: c_int = -1;
    // SAFETY: a live core; a valid out pointer.
    let mem = unsafe { plugio_fio_iomem_alloc(core, 4 * BS + 4096, &mut registered) }.cast::<u8>();
    assert!(!mem.is_null());
    assert!(registered == 0 || registered == 1);
    let (mut errno, mut refused) = (0, 0);
    // SAFETY: a live core, a C string, valid out pointers and buffer.
    let dev = unsafe {
        plugio_fio_open(
            core,
            path.as_ptr(),
            1,
            0,
            &mut errno,
            &mut refused,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    assert!(dev > 0, "{}", msg(&err));

    // Four io_us write their index, then read back.
    let cookies: Vec<*mut c_void> = (0..4).map(|i| (0x1000 + i) as *mut c_void).collect();
    for (i, &cookie) in cookies.iter().enumerate() {
        // SAFETY: inside the io_u memory; ours until the completion.
        unsafe {
            let buf = mem.add(i * BS);
            ptr::write_bytes(buf, i as u8 + 1, BS);
            assert_eq!(
                plugio_fio_queue(core, dev, 1, (i * BS) as u64, buf.cast(), BS as u64, cookie),
                0
            );
        }
    }
    // SAFETY: a live core.
    assert_eq!(unsafe { plugio_fio_commit(core) }, 0);
    let mut seen = Vec::new();
    while seen.len() < 4 {
        // SAFETY: a live core.
        let n = unsafe { plugio_fio_getevents(core, 1, 4, -1) };
        assert!(n >= 1);
        for i in 0..n as u32 {
            let mut result = 0i64;
            // SAFETY: a live core, `i` below the count.
            let cookie = unsafe { plugio_fio_event(core, i, &mut result) };
            assert_eq!(result, BS as i64);
            seen.push(cookie);
        }
        // Past the last event: null.
        let mut result = 0i64;
        // SAFETY: as above.
        assert!(unsafe { plugio_fio_event(core, n as u32, &mut result) }.is_null());
    }
    seen.sort();
    assert_eq!(seen, cookies);

    // A bad op value and an unknown device are refused at queue time.
    // SAFETY: a live core; nothing is queued.
    unsafe {
        assert_eq!(
            plugio_fio_queue(core, dev, 99, 0, ptr::null_mut(), 0, ptr::null_mut()),
            libc::EINVAL
        );
        assert_eq!(
            plugio_fio_queue(core, 77, 0, 0, mem.cast(), BS as u64, ptr::null_mut()),
            libc::EINVAL
        );
    }

    let mut line = err_buf();
    // SAFETY: a live core and device; a valid buffer.
    unsafe { plugio_fio_stats(core, dev, line.as_mut_ptr(), line.len()) };
    assert!(msg(&line).contains("bios 4 requests"), "{}", msg(&line));

    // SAFETY: the handles are live and given back once each.
    unsafe {
        plugio_fio_close(core, dev);
        plugio_fio_iomem_free(core);
        plugio_fio_core_free(core);
    }
    let on_disk = std::fs::read(tmp.path()).expect("read");
    for i in 0..4 {
        assert!(on_disk[i * BS..(i + 1) * BS]
            .iter()
            .all(|&b| b == i as u8 + 1));
    }
}

#[test]
fn open_reports_the_errno_and_the_message() {
    let cfg = EngineConfig::default();
    let mut err = err_buf();
    // SAFETY: valid config and buffer.
    let core = unsafe { plugio_fio_core_new(&cfg, err.as_mut_ptr(), err.len()) };
    assert!(!core.is_null());
    let path = CString::new("/nonexistent/plugio-fio").expect("path");
    let (mut errno, mut refused) = (0, 0);
    // SAFETY: a live core, a C string, valid out pointers and buffer.
    let dev = unsafe {
        plugio_fio_open(
            core,
            path.as_ptr(),
            1,
            1,
            &mut errno,
            &mut refused,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    assert_eq!(dev, 0);
    assert_eq!(errno, libc::ENOENT);
    assert_eq!(refused, 0);
    assert!(msg(&err).starts_with("plugio: "), "{}", msg(&err));
    // A one-byte buffer still gets its NUL.
    let mut tiny: [c_char; 1] = [7];
    // SAFETY: as above, with a one-byte message buffer.
    unsafe {
        plugio_fio_open(
            core,
            path.as_ptr(),
            1,
            1,
            &mut errno,
            &mut refused,
            tiny.as_mut_ptr(),
            1,
        );
        plugio_fio_core_free(core);
    }
    assert_eq!(tiny[0], 0);
}
