//! A 1 kHz SIGUSR1 storm (no-op handler installed without SA_RESTART)
//! during a queue-depth-32 run: every IO completes exactly once with the
//! right data, on io_uring and on the sync pool.

mod common;

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use plugio_device::backend::BackendKind;
use plugio_device::testing::block_on;
use plugio_device::{DeviceDriver, DmaBuf, File, OpenOptions, RingConfig};
use plugio_executor::Driver;

const BLOCK: usize = 4096;
const BLOCKS: u64 = 256;
const IOS: u64 = 4000;
const QD: usize = 32;

static SIGNALS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigusr1(_: libc::c_int) {
    // Relaxed: a counter read after the storm is joined.
    SIGNALS.fetch_add(1, Ordering::Relaxed);
}

fn install_handler() {
    // SAFETY: sigaction is plain old data; zeroed is a valid empty value.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigusr1 as *const () as usize;
    sa.sa_flags = 0; // no SA_RESTART: blocking calls fail with EINTR
                     // SAFETY: sa_mask is a valid sigset to clear; installing an
                     // async-signal-safe handler (one atomic add).
    let rc = unsafe {
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut())
    };
    assert_eq!(rc, 0, "sigaction");
}

/// Sends SIGUSR1 to one thread every millisecond until dropped.
struct Storm {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Storm {
    fn start() -> Self {
        // SAFETY: pthread_self has no preconditions.
        let target = unsafe { libc::pthread_self() };
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            // Relaxed: a stop flag; join provides the ordering.
            while !s.load(Ordering::Relaxed) {
                // SAFETY: the target thread outlives this thread: Storm's
                // drop stops and joins it before the target can exit.
                unsafe { libc::pthread_kill(target, libc::SIGUSR1) };
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Storm {
    fn drop(&mut self) {
        // Relaxed: see above.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn block_pattern(block: u64) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| ((i as u64 * 3 + block) % 241) as u8)
        .collect()
}

fn run(kind: BackendKind, driver: &DeviceDriver, file: &File) -> Vec<u32> {
    block_on(driver, async {
        let mut seen = vec![0u32; IOS as usize];
        let mut in_flight = FuturesUnordered::new();
        let mut next = 0u64;
        while next < IOS || !in_flight.is_empty() {
            while next < IOS && in_flight.len() < QD {
                let block = next % BLOCKS;
                let fut = file.read_at(DmaBuf::heap(BLOCK, BLOCK), block * BLOCK as u64);
                let id = next;
                in_flight.push(async move { (id, block, fut.await) });
                next += 1;
            }
            if let Some((id, block, (r, buf))) = in_flight.next().await {
                assert_eq!(r.expect("read under signals"), BLOCK, "{kind:?}");
                assert_eq!(buf.as_slice(), &block_pattern(block)[..]);
                seen[id as usize] += 1;
            }
        }
        seen
    })
}

#[test]
fn signal_storm_during_qd32_run() {
    install_handler();
    let tmp = common::temp_file();
    for b in 0..BLOCKS {
        tmp.as_file()
            .write_all_at(&block_pattern(b), b * BLOCK as u64)
            .expect("seed");
    }
    let driver = DeviceDriver::with_ring(&RingConfig::default()).expect("ring");
    let storm = Storm::start();
    for kind in [BackendKind::Uring, BackendKind::Sync] {
        let file = File::open_with(tmp.path(), OpenOptions::new().backend(kind)).expect("open");
        let seen = run(kind, &driver, &file);
        assert!(
            seen.iter().all(|&n| n == 1),
            "{kind:?}: every IO exactly once"
        );
    }
    // Idle parks are interrupted too and simply return.
    for _ in 0..20 {
        driver.park(Some(Duration::from_millis(20))).expect("park");
    }
    drop(storm);
    let stats = driver.ring_stats().expect("ring");
    assert!(
        SIGNALS.load(Ordering::Relaxed) > 10,
        "signals were delivered"
    );
    assert!(stats.enter_eintr > 0, "enter saw EINTR: {stats:?}");
    assert_eq!(driver.in_flight(), 0);
}
