//! A file on tmpfs: `O_DIRECT` is refused with a clear error, or (Linux
//! 6.6+) works. The op suite, end-of-file reads and dropped futures on a
//! real file run in every ring configuration in `tests/matrix.rs`.

mod common;

use plugio_device::testing::block_on;
use plugio_device::{DeviceDriver, DmaBuf, ErrorKind, File, OpenOptions, RingConfig};

use common::pattern;

fn filled(file: &File, len: usize, seed: u64) -> DmaBuf {
    let mut b = file.alloc_buf(len);
    b.as_mut_slice().copy_from_slice(&pattern(len, seed));
    b
}

#[test]
fn tmpfs_direct_io_is_refused_clearly_or_works() {
    let path = std::path::Path::new("/dev/shm").join(format!("plugio-shm-{}", std::process::id()));
    let result = File::open_with(&path, OpenOptions::new().create(true));
    match result {
        Err(e) => {
            assert_eq!(*e.kind(), ErrorKind::DirectIoRefused);
            let text = e.to_string();
            assert!(
                text.contains("plugio-shm") && text.contains("direct(false)"),
                "{text}"
            );
            let buffered = File::open_with(&path, OpenOptions::new().create(true).direct(false));
            assert!(buffered.is_ok(), "buffered open works");
        }
        Ok(file) => {
            // Linux >= 6.6 tmpfs accepts O_DIRECT: then IO must simply work.
            let driver = DeviceDriver::with_ring(&RingConfig::default()).expect("ring");
            block_on(&driver, async {
                let (r, _) = file.write_at(filled(&file, 4096, 12), 0).await;
                assert_eq!(r.expect("write"), 4096);
                let (r, buf) = file.read_at(file.alloc_buf(4096), 0).await;
                assert_eq!(r.expect("read"), 4096);
                assert_eq!(buf.as_slice(), &pattern(4096, 12)[..]);
            });
        }
    }
    let _ = std::fs::remove_file(&path);
}
