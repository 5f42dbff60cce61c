//! The device half of the per-IO path, measured on NOPs: one `FileBackend`
//! on a temp file, a `DeviceDriver` on this thread, queue depth 128, NOPs
//! submitted in batches of 32, a trivial completion handler, and a park per
//! loop turn (as the executor parks once per tick).
//!
//! ```text
//! cargo build --release -p plugio-device --example nop_loop
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.N1 target/release/examples/nop_loop 50000
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.N2 target/release/examples/nop_loop 150000
//! # instructions per NOP = (Ir(N2) - Ir(N1)) / (N2 - N1)
//! ```
//!
//! Arguments: `N` (NOPs, default 100000). Environment: `SUBMIT_NOW=1` calls
//! `submit_now()` after every 32-op batch (what the engine's plug flush did
//! before issue #12). Prints the ring's counters: IOs per `io_uring_enter`
//! and enters per 128 IOs.

use std::cell::Cell;
use std::rc::Rc;

use plugio_device::{
    register_handler, Backend, CompletionHandler, DeviceDriver, IoOp, OpKind, OpenOptions,
    RingConfig,
};
use plugio_executor::Driver;

const QD: u64 = 128;
const BATCH: u64 = 32;

#[derive(Default)]
struct Count {
    done: Cell<u64>,
    errors: Cell<u64>,
}

impl CompletionHandler for Count {
    fn complete(&self, _token: u64, result: i32) {
        self.done.set(self.done.get() + 1);
        if result < 0 {
            self.errors.set(self.errors.get() + 1);
        }
    }
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("N is a number"))
        .unwrap_or(100_000);
    let submit_now = std::env::var("SUBMIT_NOW").is_ok_and(|v| v == "1");
    let driver = DeviceDriver::with_ring(&RingConfig {
        sq_entries: 128,
        ..RingConfig::default()
    })
    .expect("io_uring ring");
    let tmp = tempfile::NamedTempFile::new().expect("temp file");
    let backend = OpenOptions::new()
        .direct(false)
        .open(tmp.path())
        .expect("open");
    let count = Rc::new(Count::default());
    let handler = register_handler(count.clone());
    let op = IoOp::bare(OpKind::Nop);
    let mut submitted = 0u64;
    while count.done.get() < n {
        // Refill to QD in batches of 32.
        while submitted < n && submitted - count.done.get() + BATCH <= QD {
            let batch = BATCH.min(n - submitted);
            for _ in 0..batch {
                // SAFETY: a NOP carries no memory.
                unsafe { backend.submit(&op, handler, submitted) }.expect("submit");
                submitted += 1;
            }
            if submit_now {
                plugio_device::submit_now().expect("submit_now");
            }
        }
        driver.park(None).expect("park");
    }
    let stats = driver.ring_stats().expect("ring");
    assert_eq!(count.errors.get(), 0);
    println!(
        "nops={n} enters={} ios_per_enter={:.2} enters_per_128={:.3} cqes={} {stats:?}",
        stats.enters,
        n as f64 / stats.enters as f64,
        stats.enters as f64 * 128.0 / n as f64,
        stats.cqes
    );
}
