//! `spawn_blocking` under load does not starve IO: with every thread of the
//! runtime's blocking pool stuck (and more calls queued behind them), file
//! IO on the core still completes, through io_uring and through the sync
//! fallback backend (which runs on the runtime's separate sync IO pool).

mod common;

use std::sync::{Arc, Condvar, Mutex};

use common::{tmpdir, watchdog};
use plugio_device::{DeviceDriver, RingConfig};
use plugio_engine::device::Device;
use plugio_engine::options::DeviceOptions;
use plugio_executor::blocking::BlockingPool;
use plugio_executor::{sleep, spawn_blocking, Driver, JoinHandle, LocalExecutor};

/// A gate the blocking calls wait on until it is opened.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn wait(&self) {
        let (open, cv) = &*self.0;
        let mut g = open.lock().expect("gate");
        while !*g {
            g = cv.wait(g).expect("gate");
        }
    }

    fn open(&self) {
        let (open, cv) = &*self.0;
        *open.lock().expect("gate") = true;
        cv.notify_all();
    }
}

/// Fills the current runtime's blocking pool (bound 2) with calls stuck on
/// `gate`, plus 6 queued behind them; returns once they are.
async fn fill_blocking_pool(gate: &Gate) -> Vec<JoinHandle<()>> {
    let pool = BlockingPool::current().expect("on a core");
    assert_eq!(pool.max_threads(), 2);
    let stuck: Vec<_> = (0..8)
        .map(|_| {
            let g = gate.clone();
            spawn_blocking(move || g.wait())
        })
        .collect();
    while !(pool.threads() == 2 && pool.queued() == 6) {
        sleep(std::time::Duration::from_millis(1)).await;
    }
    stuck
}

/// 64 writes and 64 read-backs of 4 KiB, checked.
async fn io_round(dev: &Device) {
    for i in 0..64u64 {
        let mut buf = dev.alloc_buf(4096);
        buf.as_mut_slice().fill(i as u8);
        let (r, _) = dev.write_at(buf, i * 4096).await;
        assert_eq!(r.expect("write"), 4096);
    }
    for i in 0..64u64 {
        let got = dev.read_alloc_at(i * 4096, 4096).await.expect("read");
        assert!(got.as_slice().iter().all(|&b| b == i as u8), "block {i}");
    }
}

fn run_with_full_pool(ex: &LocalExecutor, path: std::path::PathBuf) -> usize {
    let gate = Gate::default();
    ex.run(async {
        let stuck = fill_blocking_pool(&gate).await;
        let dev = Device::open(&path, DeviceOptions::default()).expect("open");
        io_round(&dev).await;
        dev.sync_data().await.expect("flush");
        let still_queued = BlockingPool::current().expect("core").queued();
        gate.open();
        for h in stuck {
            h.await.expect("stuck call");
        }
        assert_eq!(dev.tags_in_use(), 0);
        still_queued
    })
}

#[test]
fn io_uring_io_completes_while_the_blocking_pool_is_full() {
    watchdog(60, || {
        let dir = tmpdir();
        let path = dir.path().join("uring");
        std::fs::write(&path, vec![0u8; 64 * 4096]).expect("fixture");
        let ex = LocalExecutor::builder()
            .max_blocking_threads(2)
            .driver(|_| Ok(Box::new(DeviceDriver::new(&RingConfig::default())?) as Box<dyn Driver>))
            .build()
            .expect("executor");
        let queued = run_with_full_pool(&ex, path);
        assert_eq!(queued, 6, "the pool stayed full while the IO ran");
    });
}

#[test]
fn sync_backend_io_completes_while_the_blocking_pool_is_full() {
    watchdog(60, || {
        let dir = tmpdir();
        let path = dir.path().join("sync");
        std::fs::write(&path, vec![0u8; 64 * 4096]).expect("fixture");
        // No ring: file IO goes to the sync backend, on the runtime's sync
        // IO pool.
        let ex = LocalExecutor::builder()
            .max_blocking_threads(2)
            .sync_io_threads(3)
            // Long: the check below counts the pool's threads after the IO.
            .blocking_keep_alive(std::time::Duration::from_secs(3600))
            .driver(|_| Ok(Box::new(DeviceDriver::without_ring()?) as Box<dyn Driver>))
            .build()
            .expect("executor");
        let queued = run_with_full_pool(&ex, path);
        assert_eq!(queued, 6, "the pool stayed full while the IO ran");
        let sync_io = ex.run(async { BlockingPool::current_sync_io().expect("core") });
        assert_eq!(sync_io.max_threads(), 3);
        assert!(
            sync_io.threads() >= 1,
            "the sync backend ran on the runtime's sync IO pool: {sync_io:?}"
        );
    });
}
