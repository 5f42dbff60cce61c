//! With `RLIMIT_MEMLOCK` lowered to 64 KiB (and `CAP_IPC_LOCK` dropped, so
//! root is limited too) buffer registration fails; IO still returns correct
//! data through unregistered buffers. A dedicated test binary: rlimits and
//! capabilities are per process.

mod common;

use plugio_device::buf::arena_stats;
use plugio_device::testing::block_on;
use plugio_device::{DeviceDriver, File, OpenOptions, RingConfig};

const CAP_IPC_LOCK: u32 = 14;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops CAP_IPC_LOCK from this thread's effective set; false if that
/// failed.
fn drop_ipc_lock() -> bool {
    let mut header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills two CapData for version 3; pointers are live.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    // SAFETY: capset reads the header and two CapData; pointers are live.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    rc == 0
}

#[test]
fn low_memlock_still_gives_correct_data() {
    let limit = libc::rlimit {
        rlim_cur: 64 * 1024,
        rlim_max: 64 * 1024,
    };
    // SAFETY: setrlimit reads a live rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) }, 0);
    let dropped = drop_ipc_lock();
    println!("CAP_IPC_LOCK dropped: {dropped}");

    let driver = DeviceDriver::with_ring(&RingConfig::default()).expect("ring");
    let stats = arena_stats().expect("arena");
    if dropped {
        assert!(
            !stats.registered,
            "a 4 MiB arena cannot be registered under 64 KiB"
        );
    }
    let tmp = common::temp_file();
    let file = File::open_with(tmp.path(), &OpenOptions::new()).expect("open");
    block_on(&driver, async {
        for i in 0..16u64 {
            let mut b = file.alloc_buf(65536);
            assert!(b.is_from_arena());
            if dropped {
                assert_eq!(b.fixed_index(), None);
            }
            b.as_mut_slice().copy_from_slice(&common::pattern(65536, i));
            let (r, _) = file.write_at(b, i * 65536).await;
            assert_eq!(r.expect("write"), 65536);
        }
        for i in 0..16u64 {
            let (r, b) = file.read_at(file.alloc_buf(65536), i * 65536).await;
            assert_eq!(r.expect("read"), 65536);
            assert_eq!(b.as_slice(), &common::pattern(65536, i)[..]);
        }
    });
}
