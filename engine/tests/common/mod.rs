//! Helpers shared by the engine's adversarial integration tests (the
//! engine's twin of the facade's `tests/common`, which the engine crate
//! cannot import).

#![allow(dead_code)] // each test binary uses its own subset

use std::time::Duration;

use plugio_device::RingConfig;

/// A single-thread executor with the device driver installed.
pub fn local() -> plugio_executor::LocalExecutor {
    plugio_engine::runtime::local(RingConfig::default()).expect("executor")
}

/// A temporary directory on a file system that takes O_DIRECT (the target
/// dir, not a tmpfs /tmp).
pub fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

/// The file systems under test, named: ext4 (a directory under the
/// target dir, on the disk) and tmpfs (/dev/shm, where there is one).
pub fn fs_dirs() -> Vec<(&'static str, tempfile::TempDir)> {
    let mut v = vec![("ext4", tmpdir())];
    match tempfile::tempdir_in("/dev/shm") {
        Ok(d) => v.push(("tmpfs", d)),
        Err(e) => eprintln!("no /dev/shm here ({e}): tmpfs not tested"),
    }
    v
}

/// Opens `path` with default options, `O_DIRECT` as `direct` says.
pub fn open_direct(path: &std::path::Path, direct: bool) -> plugio_engine::Device {
    let options = plugio_engine::DeviceOptions {
        direct,
        ..plugio_engine::DeviceOptions::default()
    };
    plugio_engine::Device::open(path, options).expect("open")
}

/// Runs `f` on its own thread; a hang fails the test after `secs` instead
/// of blocking the suite, and a panic in `f` is re-raised.
pub fn watchdog<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().expect("test thread"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(_) => panic!("hang: not finished after {secs} s"),
    }
}

/// Write A [0, 8 KiB), write B [2 KiB, 6 KiB), read [0, 10 KiB) in one
/// plug: B lands on top of A and the read sees both (and so does a read
/// after them). Shared by the mem-device seeds of `batching.rs` and every
/// configuration of `matrix.rs`.
pub async fn overlapping_writes_then_read(dev: plugio_engine::Device) {
    let mut a = dev.alloc_buf(8192);
    a.as_mut_slice().fill(0xAA);
    let mut b = dev.alloc_buf(4096);
    b.as_mut_slice().fill(0xBB);
    let (wa, wb, r) = futures::join!(
        dev.write_at(a, 0),
        dev.write_at(b, 2048),
        dev.read_alloc_at(0, 10240)
    );
    wa.0.expect("write A");
    wb.0.expect("write B");
    let mut want = vec![0u8; 10240];
    want[..8192].fill(0xAA);
    want[2048..6144].fill(0xBB);
    assert_eq!(r.expect("read").as_slice(), &want[..]);
    let back = dev.read_alloc_at(0, 10240).await.expect("read back");
    assert_eq!(back.as_slice(), &want[..]);
}

/// `len` bytes of a pattern that differs by `seed` and from one 512-byte
/// sector to the next.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(seed as u32 * 7 + (i / 512) as u32) as u8
        })
        .collect()
}

/// A file `name` in `dir` holding `data`, synced (so that no O_DIRECT read
/// waits for writeback).
pub fn file_of(dir: &std::path::Path, name: &str, data: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    let f = std::fs::File::create(&path).unwrap();
    std::io::Write::write_all(&mut &f, data).unwrap();
    f.sync_all().unwrap();
    path
}

/// A xorshift generator: the streams are the same for a seed on every
/// run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (not 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The value of environment variable `name` as a number (a test's seed
/// count, first seed), or `default` when it is unset or not a number.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The fast-lane settings a model test runs: `FL=1` on only, `FL=0` off
/// only, else both.
pub fn fast_lane_settings() -> &'static [bool] {
    match std::env::var("FL").as_deref() {
        Ok("1") => &[true],
        Ok("0") => &[false],
        _ => &[true, false],
    }
}

/// NOPs on `dev` until no tag is in use after four NOPs in a row (the
/// first flushes the plug), for up to 10 s, sleeping 200 µs after each
/// NOP that still finds a tag in use (leaving the CPU to io_uring's
/// workers). One reading of no tag in use is not enough: a request may
/// wait in the FIFO for the tag waiter's next tick, holding no tag, and
/// each NOP's round trip gives that tick. The bound is a time, not a
/// count of NOPs: beside a CPU hog, an IO the kernel handed to io_uring's
/// workers may take hundreds of milliseconds (a write 856 ms, a discard
/// 56 ms, in the break-it passes' runs beside two busy loops), while a
/// NOP completes at once; 1,000 NOPs, the bound the stream models had,
/// last 1-3 ms. Panics, naming `desc`, when a tag is still in use at the
/// bound: a hang, not a mismatch to puzzle over later.
pub async fn settle(dev: &plugio_engine::Device, desc: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut idle = 0;
    while idle < 4 && std::time::Instant::now() < deadline {
        dev.nop().await.expect("nop");
        idle = if dev.tags_in_use() == 0 { idle + 1 } else { 0 };
        if idle == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert!(
        idle == 4,
        "{desc}: a tag still in use after 10 s of NOPs ({} in use)",
        dev.tags_in_use()
    );
}
