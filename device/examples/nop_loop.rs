//! The device half of the per-IO path, measured: one `FileBackend`, a
//! `DeviceDriver` on this thread, queue depth 128, ops submitted in
//! batches of 32, a trivial completion handler, and a park per loop turn
//! (as the executor parks once per tick); completed ops are resubmitted
//! after each park.
//!
//! ```text
//! cargo build --release -p plugio-device --example nop_loop
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.N1 target/release/examples/nop_loop 20000
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.N2 target/release/examples/nop_loop 60000
//! # instructions per NOP = (Ir(N2) - Ir(N1)) / (N2 - N1)
//! ```
//!
//! Arguments: `N` (ops, default 100000). Environment:
//! - `SUBMIT_NOW=1` calls `submit_now()` after every 32-op batch (what the
//!   engine's plug flush did before issue #12).
//! - `READ=PATH` does 4 KiB `O_DIRECT` random reads of `PATH` (a file or a
//!   block device such as a zram disk) instead of NOPs.
//! - `BATCH_WAIT_US=N` sets `RingConfig::batch_wait` (after issue #12).
//!
//! Prints the ring's counters (IOs per `io_uring_enter`, enters per 128
//! IOs) and the process CPU time per IO (user + system, io-wq workers
//! included).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use plugio_device::{
    register_handler, Backend, CompletionHandler, DeviceDriver, DmaBuf, IoOp, OpKind, OpenOptions,
    RingConfig,
};
use plugio_executor::Driver;

const QD: usize = 128;
const BATCH: usize = 32;
const BLOCK: usize = 4096;

#[derive(Default)]
struct Done {
    tokens: RefCell<Vec<u64>>,
    errors: RefCell<u64>,
}

impl CompletionHandler for Done {
    fn complete(&self, token: u64, result: i32) {
        self.tokens.borrow_mut().push(token);
        if result < 0 {
            *self.errors.borrow_mut() += 1;
        }
    }
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills a plain-old-data struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("N is a number"))
        .unwrap_or(100_000);
    let submit_now = std::env::var("SUBMIT_NOW").is_ok_and(|v| v == "1");
    let read_path = std::env::var("READ").ok();
    let mut config = RingConfig {
        sq_entries: 128,
        ..RingConfig::default()
    };
    if let Ok(us) = std::env::var("BATCH_WAIT_US") {
        config.batch_wait = std::time::Duration::from_micros(us.parse().expect("BATCH_WAIT_US"));
    }
    let driver = DeviceDriver::with_ring(&config).expect("io_uring ring");
    let tmp = tempfile::NamedTempFile::new().expect("temp file");
    let backend = match &read_path {
        Some(path) => OpenOptions::new().write(false).open(path).expect("open"),
        None => OpenOptions::new()
            .direct(false)
            .open(tmp.path())
            .expect("open"),
    };
    let blocks = match &read_path {
        Some(_) => backend.size_bytes().expect("size") / BLOCK as u64,
        None => 1,
    };
    let mut bufs: Vec<DmaBuf> = (0..QD).map(|_| DmaBuf::heap(BLOCK, BLOCK)).collect();
    let iovs: Vec<libc::iovec> = bufs.iter_mut().map(|b| b.iovec(BLOCK)).collect();
    let done = Rc::new(Done::default());
    let handler = register_handler(done.clone());
    let mut rng: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut submitted = 0u64;
    let mut completed = 0u64;
    let mut free: Vec<u64> = (0..QD as u64).rev().collect();
    let start = Instant::now();
    let cpu0 = cpu_seconds();
    while completed < n {
        // Refill to QD in batches of 32.
        while submitted < n && free.len() >= BATCH.min((n - submitted) as usize) && !free.is_empty()
        {
            let batch = BATCH.min((n - submitted) as usize);
            for _ in 0..batch {
                let slot = free.pop().expect("free slot");
                let op = match &read_path {
                    Some(_) => {
                        rng = rng
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        let block = (rng >> 33) % blocks;
                        IoOp::read(
                            block * BLOCK as u64,
                            std::slice::from_ref(&iovs[slot as usize]),
                        )
                    }
                    None => IoOp::bare(OpKind::Nop),
                };
                // SAFETY: the buffers and iovecs live until the loop ends,
                // after every op completed.
                unsafe { backend.submit(&op, handler, slot) }.expect("submit");
                submitted += 1;
            }
            if submit_now {
                plugio_device::submit_now().expect("submit_now");
            }
        }
        driver.park(None).expect("park");
        let mut tokens = done.tokens.borrow_mut();
        completed += tokens.len() as u64;
        free.extend(tokens.drain(..));
    }
    let wall = start.elapsed();
    let cpu = cpu_seconds() - cpu0;
    let stats = driver.ring_stats().expect("ring");
    assert_eq!(*done.errors.borrow(), 0, "errors");
    println!(
        "ops={n} enters={} ios_per_enter={:.2} enters_per_128={:.3} cpu_ns_per_io={:.0} wall_ns_per_io={:.0} {stats:?}",
        stats.enters,
        n as f64 / stats.enters as f64,
        stats.enters as f64 * 128.0 / n as f64,
        cpu * 1e9 / n as f64,
        wall.as_nanos() as f64 / n as f64,
    );
    drop(bufs);
}
