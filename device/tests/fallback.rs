//! Where io_uring is refused (here: a seccomp filter on this thread that
//! makes `io_uring_setup` fail with EPERM), `DeviceDriver::new` runs
//! without a ring and file IO goes through the sync pool with the same
//! results. Also: a io_uring-kind file on a ring-less driver uses the pool.

mod common;

use plugio_device::testing::block_on;
use plugio_device::{BackendKind, DeviceDriver, File, OpenOptions, RingConfig};

const IO_URING_SETUP: u32 = 425;

/// Installs a seccomp filter on the calling thread: `io_uring_setup`
/// returns EPERM, everything else is allowed.
fn refuse_io_uring_on_this_thread() {
    let filter = [
        // A = seccomp_data.nr
        libc::sock_filter {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 0,
        },
        // if A == io_uring_setup: next, else skip one
        libc::sock_filter {
            code: 0x15,
            jt: 0,
            jf: 1,
            k: IO_URING_SETUP,
        },
        // return SECCOMP_RET_ERRNO | EPERM
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0x0005_0000 | libc::EPERM as u32,
        },
        // return SECCOMP_RET_ALLOW
        libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0x7fff_0000,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with documented arguments; `prog` and `filter` are live
    // for the call (the kernel copies the program).
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const _
            ),
            0,
            "seccomp filter"
        );
    }
}

fn write_then_read(driver: &DeviceDriver, file: &File) -> Vec<u8> {
    block_on(driver, async {
        let mut b = file.alloc_buf(8192);
        b.as_mut_slice().copy_from_slice(&common::pattern(8192, 5));
        let (r, _) = file.write_at(b, 4096).await;
        assert_eq!(r.expect("write"), 8192);
        file.fdatasync().await.expect("flush");
        let (r, b) = file.read_at(file.alloc_buf(16384), 0).await;
        assert_eq!(r.expect("read"), 12288, "short at end of file");
        b.as_slice().to_vec()
    })
}

#[test]
fn seccomp_refused_io_uring_falls_back_to_the_sync_pool() {
    let tmp = common::temp_file();
    let path = tmp.path().to_path_buf();
    let data = std::thread::spawn(move || {
        refuse_io_uring_on_this_thread();
        let err = DeviceDriver::with_ring(&RingConfig::default()).expect_err("refused");
        assert_eq!(
            *err.kind(),
            plugio_device::ErrorKind::PermissionDenied,
            "{err}"
        );
        let driver = DeviceDriver::new(&RingConfig::default()).expect("fallback driver");
        assert!(driver.ring_info().is_none(), "no ring");
        let file = File::open_with(&path, &OpenOptions::new()).expect("open");
        assert_eq!(file.backend().kind(), BackendKind::Uring);
        write_then_read(&driver, &file)
    })
    .join()
    .expect("fallback thread");
    let mut want = vec![0u8; 4096];
    want.extend(common::pattern(8192, 5));
    assert_eq!(data, want);
}

#[test]
fn ring_less_driver_serves_uring_files_through_the_pool() {
    let tmp = common::temp_file();
    let driver = DeviceDriver::without_ring().expect("driver");
    let file = File::open_with(tmp.path(), &OpenOptions::new()).expect("open");
    let data = write_then_read(&driver, &file);
    assert_eq!(&data[4096..], &common::pattern(8192, 5)[..]);
}
