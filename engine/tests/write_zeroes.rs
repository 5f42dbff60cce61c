//! `Device::write_zeroes` falls back to writing zeroes where the device or
//! file system refuses the zeroing op (tmpfs refuses
//! `FALLOC_FL_ZERO_RANGE`), and `write_zeroes_no_fallback` does not
//! (issue 13, "Executor and device safety").

mod common;

use std::sync::Arc;

use common::{local, watchdog};
use plugio_device::backend::mem::{MemConfig, MemDevice};
use plugio_device::{Backend, DmaBuf, ErrorKind, InvalidInput};
use plugio_engine::{Device, DeviceOptions, ZEROES_CHUNK_BYTES};

/// A pattern byte for offset `i` that is never zero.
fn pattern(i: u64) -> u8 {
    (i % 251) as u8 | 1
}

/// Fills `[0, len)` with the pattern through `dev`.
async fn fill_pattern(dev: &Device, len: u64) {
    let mut buf = DmaBuf::new(len as usize);
    for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
        *b = pattern(i as u64);
    }
    let (r, _) = dev.write_at(buf, 0).await;
    assert_eq!(r.expect("fill"), len as usize);
}

/// Reads `[0, len)` back and checks: zero inside `zeroed`, the pattern
/// elsewhere.
async fn check_zeroed(dev: &Device, len: u64, zeroed: std::ops::Range<u64>) {
    let got = dev.read_alloc_at(0, len as usize).await.expect("read back");
    assert_eq!(got.len() as u64, len);
    for (i, &b) in got.as_slice().iter().enumerate() {
        let i = i as u64;
        let want = if zeroed.contains(&i) { 0 } else { pattern(i) };
        assert_eq!(b, want, "byte {i} (zeroed range {zeroed:?})");
    }
}

/// The range zeroed by the tests: unaligned to the fallback's chunk, more
/// than two chunks long, so the last write is a partial chunk.
fn range() -> (u64, u64) {
    (4096, 2 * ZEROES_CHUNK_BYTES + 8192)
}

/// Forwards to a mem device but refuses the zeroing op at submission with
/// `EOPNOTSUPP`, as a file system without `FALLOC_FL_ZERO_RANGE` does.
#[derive(Debug)]
struct NoZeroRange(Arc<MemDevice>);

impl Backend for NoZeroRange {
    fn geometry(&self) -> &plugio_device::Geometry {
        self.0.geometry()
    }

    fn kind(&self) -> plugio_device::backend::BackendKind {
        self.0.kind()
    }

    unsafe fn submit(
        &self,
        op: &plugio_device::IoOp<'_>,
        handler: plugio_device::HandlerId,
        token: u64,
    ) -> plugio_device::Result<()> {
        if op.kind == plugio_device::OpKind::WriteZeroes {
            return Err(plugio_device::Error::from_errno(libc::EOPNOTSUPP));
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.0.submit(op, handler, token) }
    }
}

const CAP: u64 = 4 * ZEROES_CHUNK_BYTES;

fn mem_device(refuse: bool) -> Device {
    let mem = Arc::new(MemDevice::new(MemConfig {
        capacity_bytes: CAP,
        ..Default::default()
    }));
    let backend: Arc<dyn Backend> = if refuse {
        Arc::new(NoZeroRange(mem))
    } else {
        mem
    };
    Device::with_backend(backend, None, DeviceOptions::default()).expect("device")
}

#[test]
fn mem_device_that_refuses_zeroing_gets_zeroes_written() {
    watchdog(120, || {
        local().run(async {
            let dev = mem_device(true);
            fill_pattern(&dev, CAP).await;
            let (off, len) = range();
            let writes_before = dev.iostats().write.ios;
            let refused = dev.write_zeroes_no_fallback(off, len).await;
            assert_eq!(
                refused.expect_err("no fallback asked").kind(),
                &ErrorKind::Unsupported
            );
            check_zeroed(&dev, CAP, 0..0).await;
            dev.write_zeroes(off, len)
                .await
                .expect("fallback writes zeroes");
            check_zeroed(&dev, CAP, off..off + len).await;
            // The zeroes went out as writes (three chunks at least).
            assert!(dev.iostats().write.ios >= writes_before + 3);
        });
    });
}

#[test]
fn mem_device_that_zeroes_takes_no_fallback() {
    watchdog(120, || {
        local().run(async {
            let dev = mem_device(false);
            fill_pattern(&dev, CAP).await;
            let (off, len) = range();
            dev.write_zeroes_no_fallback(off, len)
                .await
                .expect("the mem device zeroes");
            check_zeroed(&dev, CAP, off..off + len).await;
            fill_pattern(&dev, CAP).await;
            dev.write_zeroes(off, len).await.expect("write zeroes");
            check_zeroed(&dev, CAP, off..off + len).await;
        });
    });
}

/// A range over `MAX_ZEROES_BY_WRITING_BYTES` that would be zeroed by
/// writing is refused before any write, saying what to do: its writes,
/// all issued at once, took memory in proportion (a 1 TiB range took
/// 741 MB; found by a break-it helper). A tmpfs file: known to have no
/// zeroing op.
#[test]
fn a_range_too_long_to_zero_by_writing_is_refused_before_any_write() {
    let dir = match tempfile::tempdir_in("/dev/shm") {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIP a_range_too_long_to_zero_by_writing: no writable /dev/shm ({e})");
            return;
        }
    };
    let path = dir.path().join("long.img");
    std::fs::write(&path, vec![0u8; 4096]).expect("create file");
    let too_long = plugio_engine::MAX_ZEROES_BY_WRITING_BYTES + 4096;
    watchdog(120, move || {
        local().run(async move {
            let opts = DeviceOptions {
                direct: false,
                ..DeviceOptions::default()
            };
            let dev = Device::open(&path, opts).expect("open");
            let e = dev.write_zeroes(0, too_long).await.expect_err("too long");
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::InvalidInput(InvalidInput::Length { max_bytes, .. })
                        if *max_bytes == plugio_engine::MAX_ZEROES_BY_WRITING_BYTES
                ),
                "{e}"
            );
            assert!(e.to_string().contains("at most 64 GiB"), "{e}");
            assert_eq!(dev.iostats().write.ios, 0, "nothing written");
            dev.write_zeroes(0, 8192).await.expect("a short range");
            assert_eq!(
                std::fs::metadata(&path).expect("stat").len(),
                8192,
                "grown by the short range only"
            );
        });
    });
}

/// tmpfs has no `FALLOC_FL_ZERO_RANGE` (it answers `EOPNOTSUPP`): the real
/// kernel path of the fallback. Skipped, saying so, where there is no
/// writable tmpfs at `/dev/shm` or it refuses `O_DIRECT` (before 6.6).
#[test]
fn tmpfs_file_gets_zeroes_written() {
    let dir = match tempfile::tempdir_in("/dev/shm") {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIP tmpfs_file_gets_zeroes_written: no writable /dev/shm ({e})");
            return;
        }
    };
    let path = dir.path().join("zeroes.img");
    std::fs::write(&path, vec![0u8; CAP as usize]).expect("create file");
    watchdog(120, move || {
        local().run(async move {
            let dev = match Device::open(&path, DeviceOptions::default()) {
                Ok(d) => d,
                Err(e) if *e.kind() == ErrorKind::DirectIoRefused => {
                    eprintln!("SKIP tmpfs_file_gets_zeroes_written: tmpfs refuses O_DIRECT");
                    return;
                }
                Err(e) => panic!("open {}: {e}", path.display()),
            };
            fill_pattern(&dev, CAP).await;
            let (off, len) = range();
            let refused = dev.write_zeroes_no_fallback(off, len).await;
            assert_eq!(
                refused
                    .expect_err("tmpfs has no FALLOC_FL_ZERO_RANGE")
                    .kind(),
                &ErrorKind::Unsupported
            );
            dev.write_zeroes(off, len)
                .await
                .expect("fallback writes zeroes");
            check_zeroed(&dev, CAP, off..off + len).await;
            drop(dev);
            // And through the page cache, from outside the runtime.
            let bytes = std::fs::read(&path).expect("read file");
            assert!(bytes[off as usize..(off + len) as usize]
                .iter()
                .all(|&b| b == 0));
            assert_eq!(bytes[off as usize - 1], pattern(off - 1));
        });
        drop(dir);
    });
}

/// The fallback keeps program order (found by a break-it helper: on
/// tmpfs, IO issued right after a `write_zeroes` ran before its fallback
/// writes, so a read saw the old bytes and a later write was zeroed over).
/// tmpfs is known at open to have no zeroing op, so the zero-filled writes
/// are issued in the call's place: a read issued after it sees zeroes, and
/// a write issued after it survives. Over several fallback chunks, through
/// `write_zeroes` and `fallocate(ZeroRange)`, 50 rounds each.
#[test]
fn tmpfs_zeroes_fallback_keeps_program_order_with_later_io() {
    use plugio_engine::FallocateMode;
    let dir = match tempfile::tempdir_in("/dev/shm") {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIP: no writable /dev/shm ({e})");
            return;
        }
    };
    let len = 3 * ZEROES_CHUNK_BYTES;
    let later = 5 * ZEROES_CHUNK_BYTES / 2;
    let path = dir.path().join("order.img");
    std::fs::write(&path, vec![0u8; len as usize]).expect("create file");
    watchdog(120, move || {
        local().run(async move {
            let options = DeviceOptions {
                direct: false,
                ..DeviceOptions::default()
            };
            let dev = Device::open(&path, options).expect("open");
            for round in 0..100 {
                let (r, _) = dev.write_all_at(vec![0x22u8; len as usize], 0).await;
                r.expect("fill");
                let (d1, d2, d3) = (dev.clone(), dev.clone(), dev.clone());
                let zero = plugio_executor::spawn_local(async move {
                    if round % 2 == 0 {
                        d1.write_zeroes(0, len).await
                    } else {
                        d1.fallocate(0, len, FallocateMode::ZeroRange).await
                    }
                });
                let read =
                    plugio_executor::spawn_local(
                        async move { d2.read_alloc_at(0, len as usize).await },
                    );
                let write = plugio_executor::spawn_local(async move {
                    d3.write_all_at(vec![0x33u8; 4096], later).await.0
                });
                zero.await.expect("task").expect("zeroes");
                let seen = read.await.expect("task").expect("read");
                write.await.expect("task").expect("write");
                assert!(
                    seen.as_slice().iter().all(|&b| b == 0),
                    "round {round}: a read issued after the zeroes saw the old bytes"
                );
                let end = dev.read_alloc_at(0, len as usize).await.expect("read back");
                for (i, &b) in end.as_slice().iter().enumerate() {
                    let i = i as u64;
                    let want = if (later..later + 4096).contains(&i) {
                        0x33
                    } else {
                        0
                    };
                    assert_eq!(b, want, "round {round}: byte {i} after the later write");
                }
            }
        })
    });
}

/// Where the backend cannot say up front (support unknown), the first
/// refusal is remembered: every later `write_zeroes` writes its zeroes in
/// the call's place, so a write issued after it in the same tick survives
/// (found by a break-it helper: a symbolic link to a tmpfs file was
/// probed beside the link, and every call lost the later write).
#[test]
fn a_refused_zeroing_op_is_remembered_and_later_calls_keep_program_order() {
    watchdog(120, || {
        local().run(async {
            let dev = mem_device(true);
            let (off, len) = range();
            dev.write_zeroes(off, len)
                .await
                .expect("first: refused, then written");
            for round in 0..20 {
                fill_pattern(&dev, CAP).await;
                let (d1, d2) = (dev.clone(), dev.clone());
                let zero =
                    plugio_executor::spawn_local(async move { d1.write_zeroes(off, len).await });
                let later = plugio_executor::spawn_local(async move {
                    let mut b = DmaBuf::new(4096);
                    b.as_mut_slice().fill(0x33);
                    d2.write_all_at(b, off + len - 4096).await.0
                });
                zero.await.expect("task").expect("zeroes");
                later.await.expect("task").expect("later write");
                let got = dev.read_alloc_at(0, CAP as usize).await.expect("read");
                let last = (off + len - 4096) as usize;
                assert!(
                    got.as_slice()[last..last + 4096].iter().all(|&b| b == 0x33),
                    "round {round}: the later write was zeroed over"
                );
                assert!(got.as_slice()[off as usize..last].iter().all(|&b| b == 0));
            }
        })
    });
}
