//! `#[plugio::main]` and `#[plugio::test]`: the runtime they build (one
//! local core or N core threads, ring and pool settings), IO on it, a
//! `Result` return, `should_panic`, and the watchdog failing a hung test.

use plugio::executor::blocking::BlockingPool;
use plugio::executor::Handle;
use plugio::{Device, DeviceOptions};

#[plugio::test]
async fn a_test_runs_on_a_local_core_with_the_device_driver() {
    assert_eq!(plugio::executor::core_id(), Some(0));
    assert!(
        Handle::current().is_none(),
        "a local executor, not a runtime"
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let path = dir.path().join("f");
    std::fs::write(&path, vec![3u8; 8192]).expect("fixture");
    let dev = Device::open(&path, DeviceOptions::default()).expect("open");
    let got = dev.read_alloc_at(4096, 4096).await.expect("read");
    assert!(got.as_slice().iter().all(|&b| b == 3));
}

#[plugio::test(
    cores = 3,
    max_blocking_threads = 2,
    sq_entries = 64,
    batch_wait_us = 0,
    batch_wait_timer = "always"
)]
async fn cores_and_pool_arguments_shape_the_runtime() {
    let h = Handle::current().expect("a runtime");
    assert_eq!(h.cores(), 3);
    assert_eq!(BlockingPool::current().expect("pool").max_threads(), 2);
    assert_eq!(plugio::spawn_blocking(|| 6 * 7).await.expect("join"), 42);
}

#[plugio::test(timeout_s = 30)]
async fn a_test_may_return_a_result() -> Result<(), Box<dyn std::error::Error>> {
    let n: u32 = "42".parse()?;
    assert_eq!(n, 42);
    Ok(())
}

#[plugio::test]
#[should_panic(expected = "boom inside the body")]
async fn a_panic_in_the_body_fails_the_test_with_its_message() {
    panic!("boom inside the body");
}

#[plugio::test(timeout_s = 1)]
#[should_panic(expected = "did not finish within 1 s")]
async fn the_watchdog_fails_a_hung_test() {
    std::future::pending::<()>().await;
}

#[plugio::main(cores = 2, iopoll = false, registered_files = 0)]
async fn main_on_two_cores() -> (usize, Option<usize>) {
    (
        Handle::current().expect("a runtime").cores(),
        plugio::executor::core_id(),
    )
}

#[plugio::main]
async fn main_on_this_thread() -> std::thread::ThreadId {
    std::thread::current().id()
}

#[test]
fn main_runs_the_body_on_the_runtime_it_describes() {
    assert_eq!(main_on_two_cores(), (2, Some(0)));
    assert_eq!(main_on_this_thread(), std::thread::current().id());
}
