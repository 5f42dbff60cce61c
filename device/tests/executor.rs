//! The device driver under the real executor: a LocalExecutor and a
//! two-core Runtime, with file IO, simulated IO, executor timers, and a
//! buffer freed on another core going back to its owner's arena.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use plugio_device::backend::mem::{Latency, MemClock};
use plugio_device::buf::arena_stats;
use plugio_device::{DeviceDriver, DmaBuf, File, MemConfig, MemDevice, OpenOptions, RingConfig};
use plugio_executor::{Driver, LocalExecutor, Runtime};

fn device_driver(_core: usize) -> std::io::Result<Box<dyn Driver>> {
    Ok(Box::new(DeviceDriver::new(&RingConfig::default())?))
}

#[test]
fn local_executor_runs_file_and_mem_io_with_timers() {
    let exec = LocalExecutor::builder()
        .driver(device_driver)
        .build()
        .expect("executor");
    let tmp = common::temp_file();
    let file = File::open_with(tmp.path(), &OpenOptions::new()).expect("open");
    let mem = File::from_backend(Arc::new(MemDevice::new(MemConfig {
        latency: Latency::Fixed(Duration::from_millis(5)),
        clock: MemClock::Real,
        ..MemConfig::default()
    })));
    exec.run(async {
        let mut b = file.alloc_buf(8192);
        b.as_mut_slice().copy_from_slice(&common::pattern(8192, 1));
        let (r, _) = file.write_at(b, 0).await;
        assert_eq!(r.expect("write"), 8192);
        let start = Instant::now();
        let io = plugio_executor::spawn_local({
            let mem = mem.clone();
            async move { mem.read_at(mem.alloc_buf(4096), 0).await.0 }
        });
        plugio_executor::sleep(Duration::from_millis(2)).await;
        let (r, b) = file.read_at(file.alloc_buf(8192), 0).await;
        assert_eq!(r.expect("read"), 8192);
        assert_eq!(b.as_slice(), &common::pattern(8192, 1)[..]);
        assert_eq!(io.await.expect("join").expect("mem read"), 4096);
        assert!(
            start.elapsed() >= Duration::from_millis(5),
            "real mem latency"
        );
    });
}

#[test]
fn runtime_cores_do_io_and_return_foreign_buffers_home() {
    let rt = Runtime::builder()
        .cores(2)
        .driver(device_driver)
        .build()
        .expect("runtime");
    let tmp = common::temp_file();
    let path = tmp.path().to_path_buf();
    for core in 0..2usize {
        let path = path.clone();
        let n = rt
            .block_on(rt.spawn_on(core, async move {
                plugio_executor::spawn_local(async move {
                    let file = File::open_with(&path, &OpenOptions::new()).expect("open");
                    let mut b = file.alloc_buf(4096);
                    b.as_mut_slice()
                        .copy_from_slice(&common::pattern(4096, core as u64));
                    let (r, _) = file.write_at(b, core as u64 * 4096).await;
                    r.expect("write");
                    let (r, b) = file.read_at(file.alloc_buf(4096), core as u64 * 4096).await;
                    assert_eq!(b.as_slice(), &common::pattern(4096, core as u64)[..]);
                    r.expect("read")
                })
                .await
                .expect("join")
            }))
            .expect("join");
        assert_eq!(n, 4096);
    }
    // A buffer from core 0's arena, dropped on core 1, returns to core 0.
    let buf: DmaBuf = rt
        .block_on(rt.spawn_on(0, async { DmaBuf::new(4096) }))
        .expect("join");
    assert!(buf.is_from_arena());
    rt.block_on(rt.spawn_on(1, async move { drop(buf) }))
        .expect("join");
    let returns = rt
        .block_on(rt.spawn_on(0, async { arena_stats().map(|s| s.remote_returns) }))
        .expect("join");
    assert!(returns.is_some_and(|n| n >= 1), "{returns:?}");
}

/// A `File` op polled where no driver reaps for it fails at once with
/// `NoDriver`, its buffer handed back and nothing submitted: a plain
/// `block_on` with no runtime, one beside an idle runtime that owns the
/// thread's ring, and an executor built without a driver. Each of them
/// waited forever: the op went into a ring or a core's inbox that nothing
/// drains for that caller.
#[test]
fn file_ops_where_no_driver_reaps_fail_at_once_with_the_buffer_back() {
    use futures::FutureExt;
    let tmp = common::temp_file();
    let file = File::open_with(tmp.path(), &OpenOptions::new()).expect("open");
    let mem = File::from_backend(Arc::new(MemDevice::new(MemConfig::default())));
    let check = |what: &str, got: Option<(plugio_device::Result<usize>, DmaBuf)>| {
        let Some((Err(e), buf)) = got else {
            panic!("{what}: did not fail at once")
        };
        assert_eq!(*e.kind(), plugio_device::ErrorKind::NoDriver, "{what}: {e}");
        assert!(
            e.to_string().contains("DeviceDriver reaps for it"),
            "{what}: {e}"
        );
        assert_eq!(buf.len(), 4096, "{what}: the buffer comes back whole");
    };
    for f in [&file, &mem] {
        check("no runtime", f.read_at(f.alloc_buf(4096), 0).now_or_never());
        let got = LocalExecutor::new().run(f.write_at(f.alloc_buf(4096), 0).map(Some));
        check("driverless executor", got);
    }
    let ex = LocalExecutor::builder()
        .driver(device_driver)
        .build()
        .expect("executor");
    ex.run(async {});
    for f in [&file, &mem] {
        check(
            "beside an idle runtime",
            f.read_at(f.alloc_buf(4096), 0).now_or_never(),
        );
    }
    // On the core itself the same ops run.
    let (r, _) = ex.run(file.write_at(file.alloc_buf(4096), 0));
    assert_eq!(r.expect("write on the core"), 4096);
    let (r, _) = ex.run(mem.read_at(mem.alloc_buf(4096), 0));
    assert_eq!(r.expect("mem read on the core"), 4096);
}
