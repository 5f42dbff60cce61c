//! `fork()` with a live runtime, for real: the parent is never affected
//! (its rings and registered buffers are not shared with the child), and
//! IO in the child through the inherited runtime fails at once with
//! `ErrorKind::Forked`, whose message says to build a new runtime; a new
//! runtime built in the child works. The child reports through a pipe and
//! its exit status (and `alarm` kills it if it hangs).
//!
//! Before the fix the child spun on `io_uring_enter` (`EEXIST`) over the
//! parent's shared ring, and the parent's reads returned another block's
//! data in 5 of 8 runs.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::FutureExt;
use plugio_device::testing::in_forked_child;
use plugio_device::{ErrorKind, RingConfig};
use plugio_engine::{Device, DeviceOptions};

mod common;
use common::{local, tmpdir, watchdog};

const BLOCK: usize = 4096;
const BLOCKS: u64 = 256;
/// Tries at getting IO in flight at the fork: a page-cached read may
/// complete before the tick that would fork ends (one try in 15 under
/// AddressSanitizer on a busy machine), and the child then rightly sees
/// its data, not `Forked`.
const ATTEMPTS: u32 = 100;

/// The contents of block `b` at version `v`: every 8 bytes say which.
fn block(b: u64, v: u64) -> Vec<u8> {
    (0..BLOCK as u64 / 8)
        .flat_map(|i| (b << 40 | v << 20 | i).to_le_bytes())
        .collect()
}

fn check_block(got: &[u8], b: u64, v: u64) -> Result<(), String> {
    if got == block(b, v).as_slice() {
        return Ok(());
    }
    let word = u64::from_le_bytes(got[..8].try_into().unwrap_or_default());
    Err(format!(
        "block {b} version {v}: holds block {} version {} instead",
        word >> 40,
        word >> 20 & 0xfffff
    ))
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe() writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: fresh descriptors, owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// What the child checks; `Err` says what went wrong.
fn child_checks(dev: &Device, path: &Path) -> Result<(), String> {
    // The inherited runtime: IO ends at its first poll, with `Forked`.
    let read = dev
        .read_alloc_at(0, BLOCK)
        .now_or_never()
        .ok_or("a read through the inherited runtime did not end at once")?;
    let e = read
        .err()
        .ok_or("a read through the inherited runtime succeeded")?;
    // The text of book/src/troubleshooting.md.
    let text = "this runtime was built before fork(): a child process may not use its \
                parent's io_uring rings; build a new runtime in the child";
    // Every IO error names its device's path, at the end.
    let text = format!("{text} (path {})", path.display());
    if *e.kind() != ErrorKind::Forked || e.to_string() != text {
        return Err(format!("read: {e:?} ({e})"));
    }
    let (write, _) = dev
        .write_at(dev.alloc_buf(BLOCK), 0)
        .now_or_never()
        .ok_or("a write through the inherited runtime did not end at once")?;
    match write {
        Err(e) if *e.kind() == ErrorKind::Forked => {}
        other => return Err(format!("write: {other:?}")),
    }
    // The device layer's own API on the inherited core: refused too.
    let file = plugio_device::File::open(path).map_err(|e| format!("File::open: {e}"))?;
    match file.read_at(file.alloc_buf(BLOCK), 0).now_or_never() {
        Some((Err(e), _)) if *e.kind() == ErrorKind::Forked => {}
        other => return Err(format!("File::read_at: {:?}", other.map(|o| o.0))),
    }
    // File-level operations on the inherited core: refused with `Forked`
    // at their first poll (an SQE written to the parent's ring, which is
    // not mapped in the child, killed the child with SIGSEGV).
    let file_ops: [(&str, Option<Result<(), plugio_device::Error>>); 4] = [
        (
            "Device::metadata",
            dev.metadata().now_or_never().map(|r| r.map(drop)),
        ),
        ("Device::set_len", dev.set_len(BLOCK as u64).now_or_never()),
        (
            "fs::metadata",
            plugio_engine::fs::metadata(path)
                .now_or_never()
                .map(|r| r.map(drop)),
        ),
        (
            "OpenOptions::open",
            plugio_engine::OpenOptions::new()
                .open(path)
                .now_or_never()
                .map(|r| r.map(drop)),
        ),
    ];
    for (what, got) in file_ops {
        match got {
            Some(Err(e)) if *e.kind() == ErrorKind::Forked => {}
            other => return Err(format!("{what} in the child: {other:?}")),
        }
    }
    // A new runtime (new threads, new ring) in the child works, and sees
    // the file as the parent left it at the fork.
    let rt = plugio_engine::runtime::builder(RingConfig::default())
        .cores(1)
        .build()
        .map_err(|e| format!("new runtime: {e}"))?;
    let p = path.to_path_buf();
    let got = futures::executor::block_on(rt.spawn_on(0, async move {
        let d = Device::open(&p, DeviceOptions::default()).map_err(|e| e.to_string())?;
        let b = d
            .read_alloc_at(200 * BLOCK as u64, BLOCK)
            .await
            .map_err(|e| e.to_string())?;
        check_block(b.as_slice(), 200, 0)
    }))
    .map_err(|e| format!("new runtime's task: {e:?}"))?;
    got.map_err(|e| format!("new runtime: {e}"))?;
    rt.shutdown(plugio_executor::ShutdownMode::Wait)
        .map_err(|e| format!("shutdown: {e:?}"))
}

/// Then the child keeps using the inherited runtime for a while (IO,
/// which fails, and sleeps, which park its core) while the parent does
/// IO: before the fix those parks entered and reaped the parent's ring.
async fn child_lingers(dev: &Device) -> Result<(), String> {
    for i in 0..200u64 {
        match dev.read_alloc_at(i % BLOCKS * BLOCK as u64, BLOCK).await {
            Err(e) if *e.kind() == ErrorKind::Forked => {}
            other => return Err(format!("read {i} in the child: {:?}", other.map(|_| ()))),
        }
        plugio_executor::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// The child: runs the checks, reports, and leaves without unwinding into
/// the parent's test harness.
async fn child(dev: &Device, path: &Path, report: RawFd) -> ! {
    // SAFETY: plain syscalls; `report` is the pipe's write end.
    unsafe { libc::alarm(30) };
    let checks = async {
        child_checks(dev, path)?;
        child_lingers(dev).await
    };
    let out = std::panic::AssertUnwindSafe(checks).catch_unwind().await;
    let (code, msg) = match out {
        Ok(Ok(())) => (0, "ok".to_string()),
        Ok(Err(m)) => (1, m),
        Err(_) => (2, "the child panicked".to_string()),
    };
    // SAFETY: writes `msg` to the pipe, then ends the process at once
    // (no destructors, no atexit: nothing of the parent's state is run).
    unsafe {
        libc::write(report, msg.as_ptr().cast(), msg.len());
        libc::_exit(code)
    }
}

/// The parent's IO: each of `tasks` tasks rewrites its own blocks (a new
/// version each round) and reads them back, and reads the static blocks
/// (200..256), checking every byte.
async fn parent_io(dev: &Device, round: u64) -> Result<(), String> {
    let tasks = (0..4u64).map(|t| {
        let dev = dev.clone();
        plugio_executor::spawn_local(async move {
            for i in 0..8u64 {
                let b = t * 32 + i;
                let v = round * 8 + i + 1;
                let mut buf = dev.alloc_buf(BLOCK);
                buf.as_mut_slice().copy_from_slice(&block(b, v));
                let (w, _) = dev.write_at(buf, b * BLOCK as u64).await;
                w.map_err(|e| format!("write: {e}"))?;
                let r = dev
                    .read_alloc_at(b * BLOCK as u64, BLOCK)
                    .await
                    .map_err(|e| e.to_string())?;
                check_block(r.as_slice(), b, v)?;
                let s = 200 + (t * 8 + i + round) % 56;
                let r = dev
                    .read_alloc_at(s * BLOCK as u64, BLOCK)
                    .await
                    .map_err(|e| e.to_string())?;
                check_block(r.as_slice(), s, 0)?;
            }
            Ok::<(), String>(())
        })
    });
    for h in tasks.collect::<Vec<_>>() {
        h.await.map_err(|e| format!("task: {e:?}"))??;
    }
    Ok(())
}

/// A read future of the blocks 0, 2, 4, ... (`n` of them, polled once),
/// boxed.
type InFlightRead<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<plugio_device::DmaBuf, plugio_device::Error>> + 'a>,
>;

/// `n` reads of `dev` sent and in flight together (`tags_in_use` says
/// so), not yet awaited: the state to fork in. Tries again while some
/// completed before the check (a page-cached read may), up to
/// [`ATTEMPTS`] times.
async fn reads_in_flight(dev: &Device, n: u64) -> Vec<InFlightRead<'_>> {
    for _ in 0..ATTEMPTS {
        let mut reads: Vec<InFlightRead<'_>> = (0..n)
            .map(|b| Box::pin(dev.read_alloc_at(2 * b * BLOCK as u64, BLOCK)) as InFlightRead<'_>)
            .collect();
        for r in &mut reads {
            assert!(futures::poll!(r.as_mut()).is_pending());
        }
        // The tick's end flushes and sends them.
        plugio_executor::yield_now().await;
        if u64::from(dev.tags_in_use()) == n {
            return reads;
        }
        for r in reads {
            r.await.expect("a read before the fork");
        }
    }
    panic!("never {n} reads in flight at once in {ATTEMPTS} tries");
}

/// Runs `test(device, its path, the report pipe's write end)` on a
/// fresh core and a file of [`file_with_blocks`]; the test forks a child
/// that reports through the pipe and returns the child's wait status.
/// Then checks that the child exited with 0 and reported "ok".
fn with_a_forked_child<F, Fut>(test: F)
where
    F: FnOnce(Device, PathBuf, RawFd) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = i32>,
{
    watchdog(120, move || {
        let dir = tmpdir();
        let path = file_with_blocks(dir.path());
        let (read_end, write_end) = pipe();
        let write_fd = std::os::fd::AsRawFd::as_raw_fd(&write_end);
        let status = local().run(async move {
            let dev = Device::open(&path, DeviceOptions::default()).expect("open");
            test(dev, path, write_fd).await
        });
        assert_child_ok(read_end, write_end, status);
    });
}

/// The parent's check of a child that reported through the pipe
/// (`read_end`, `write_end`) and exited with `status`: it exited with 0
/// and reported "ok".
fn assert_child_ok(read_end: OwnedFd, write_end: OwnedFd, status: i32) {
    drop(write_end);
    let mut msg = String::new();
    std::fs::File::from(read_end)
        .read_to_string(&mut msg)
        .expect("child's report");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed (status {status:#x}, signalled: {}): {msg}",
        libc::WIFSIGNALED(status)
    );
    assert_eq!(msg, "ok");
}

fn file_with_blocks(dir: &Path) -> PathBuf {
    let path = dir.join("forked");
    let data: Vec<u8> = (0..BLOCKS).flat_map(|b| block(b, 0)).collect();
    std::fs::write(&path, data).unwrap();
    path
}

/// Forks from inside a task while the parent's IO is in flight on the
/// same core; the child checks its IO is refused and a new runtime works,
/// then keeps running the inherited core for a while; the parent keeps
/// doing verified IO before, during and after the child.
#[test]
fn fork_with_a_live_runtime_leaves_the_parent_alone_and_refuses_the_childs_io() {
    with_a_forked_child(|dev, path, write_fd| async move {
        parent_io(&dev, 0).await.expect("before the fork");
        // IO in flight at the fork: a round started, not awaited.
        let busy = {
            let dev = dev.clone();
            plugio_executor::spawn_local(async move { parent_io(&dev, 1).await })
        };
        plugio_executor::yield_now().await;
        // SAFETY: the child only runs `child`, which ends in _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            child(&dev, &path, write_fd).await;
        }
        busy.await.expect("task").expect("IO in flight at the fork");
        let mut status = 0;
        let mut round = 2;
        loop {
            parent_io(&dev, round).await.expect("while the child runs");
            round += 1;
            // SAFETY: waits for our own child without blocking.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                break;
            }
            plugio_executor::sleep(Duration::from_millis(1)).await;
        }
        parent_io(&dev, round).await.expect("after the child ended");
        assert_eq!(dev.tags_in_use(), 0);
        status
    });
}

/// Reads in flight at the fork (issued, flushed and sent on the parent's
/// ring, not reaped): awaited in the child through the inherited runtime,
/// each ends at once with `Forked` (before, the child waited for them
/// forever); in the parent each completes with its data.
#[test]
fn reads_in_flight_at_the_fork_end_with_forked_in_the_child() {
    with_a_forked_child(|dev, _path, write_fd| async move {
        let mut reads = reads_in_flight(&dev, 8).await;
        // SAFETY: the child only awaits the reads, reports and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: a plain syscall (kills a hung child).
            unsafe { libc::alarm(30) };
            let mut msg = String::from("ok");
            for r in &mut reads {
                match r.as_mut().await {
                    Err(e)
                        if *e.kind() == ErrorKind::Forked
                            && e.to_string()
                                .starts_with("this IO was in flight at the fork") => {}
                    other => {
                        msg = format!("child: {:?}", other.map(|b| b.len()));
                        break;
                    }
                }
            }
            // SAFETY: writes the report, then ends the process at once.
            unsafe {
                libc::write(write_fd, msg.as_ptr().cast(), msg.len());
                libc::_exit(0)
            }
        }
        for (b, r) in reads.into_iter().enumerate() {
            let got = r.await.expect("the parent's read");
            check_block(got.as_slice(), 2 * b as u64, 0).expect("the parent's data");
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(dev.tags_in_use(), 0);
        status
    });
}

/// A task waiting on a read in flight at the fork (spawned, polled, its
/// read sent on the parent's ring): in the child, awaiting the task
/// through the inherited runtime ends with the read's `Forked` error
/// instead of waiting forever (found by a break-it helper: only a future
/// polled by the child itself was refused; a parked task was never woken,
/// since only a completion wakes it and the child reaps none).
#[test]
fn a_task_parked_on_io_in_flight_at_the_fork_is_woken_in_the_child() {
    with_a_forked_child(|dev, _path, write_fd| async move {
        let mut attempt = 0;
        let task = loop {
            assert!(
                attempt < ATTEMPTS,
                "the task's read never in flight at the fork"
            );
            attempt += 1;
            let task = {
                let dev = dev.clone();
                plugio_executor::spawn_local(async move {
                    dev.read_alloc_at(0, BLOCK)
                        .await
                        .map(|b| b.as_slice().to_vec())
                })
            };
            // The task issues its read; the tick's end sends it.
            plugio_executor::yield_now().await;
            plugio_executor::yield_now().await;
            if dev.tags_in_use() == 1 {
                break task;
            }
            // The read completed already (a page-cached read may): again.
            task.await.expect("task").expect("a read before the fork");
        };
        // SAFETY: the child only awaits the task, reports and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: a plain syscall (kills a hung child).
            unsafe { libc::alarm(30) };
            let msg = match plugio_executor::timeout(Duration::from_secs(10), task).await {
                Ok(Ok(Err(e))) if *e.kind() == ErrorKind::Forked => "ok".to_string(),
                Ok(other) => format!("child: {:?}", other.map(|r| r.map(|b| b.len()))),
                Err(_) => "child: the task never ended".to_string(),
            };
            // SAFETY: writes the report, then ends the process at once.
            unsafe {
                libc::write(write_fd, msg.as_ptr().cast(), msg.len());
                libc::_exit(0)
            }
        }
        let got = task.await.expect("task").expect("the parent's read");
        check_block(&got, 0, 0).expect("the parent's data");
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(dev.tags_in_use(), 0);
        status
    });
}

/// A device opened before the fork, in the child, through a runtime built
/// there: its IO is refused with `Forked`, saying to open it again (before,
/// a read waited for ever when the parent's requests held the device's
/// tags at the fork: only the parent completes them; found by a break-it
/// helper); its iostats show nothing in flight and its tags none in use,
/// and the device opened again in the child works. The parent's reads all
/// complete with their data.
#[test]
fn a_device_opened_before_the_fork_is_refused_in_the_childs_new_runtime() {
    watchdog(120, || {
        let dir = tmpdir();
        let path = file_with_blocks(dir.path());
        local().run(async move {
            let opts = DeviceOptions {
                queue_depth: 2,
                ..DeviceOptions::default()
            };
            let dev = Device::open(&path, opts).expect("open");
            // Every tag in use.
            let reads = reads_in_flight(&dev, 2).await;
            let child = in_forked_child(30, || the_parents_device_in_the_child(&dev, &path));
            for (b, r) in reads.into_iter().enumerate() {
                let got = r.await.expect("the parent's read");
                check_block(got.as_slice(), 2 * b as u64, 0).expect("the parent's data");
            }
            assert_eq!((dev.tags_in_use(), dev.iostats().in_flight), (0, 0));
            child.expect("the child");
        });
    });
}

/// The child's side of
/// [`a_device_opened_before_the_fork_is_refused_in_the_childs_new_runtime`].
fn the_parents_device_in_the_child(dev: &Device, path: &Path) -> Result<(), String> {
    let (in_flight, tags) = (dev.iostats().in_flight, dev.tags_in_use());
    if (in_flight, tags) != (0, 0) {
        return Err(format!(
            "the inherited device: {in_flight} in flight, {tags} tags in use"
        ));
    }
    let rt = plugio_engine::runtime::builder(RingConfig::default())
        .cores(1)
        .build()
        .map_err(|e| format!("new runtime: {e}"))?;
    let (dev, path) = (dev.clone(), path.to_path_buf());
    let got = futures::executor::block_on(rt.spawn_on(0, async move {
        let advice = "this device was opened before fork(): open it again in the child";
        match dev.read_alloc_at(0, BLOCK).await {
            Err(e)
                if *e.kind() == ErrorKind::Forked
                    && e.to_string().starts_with(advice)
                    && e.to_string()
                        .contains("open the devices again in the child") => {}
            other => return Err(format!("a read: {:?}", other.map(|b| b.len()))),
        }
        let again = Device::open(&path, DeviceOptions::default()).map_err(|e| e.to_string())?;
        let b = again
            .read_alloc_at(200 * BLOCK as u64, BLOCK)
            .await
            .map_err(|e| e.to_string())?;
        check_block(b.as_slice(), 200, 0)
    }))
    .map_err(|e| format!("the new runtime's task: {e:?}"))?;
    got?;
    rt.shutdown(plugio_executor::ShutdownMode::Wait)
        .map_err(|e| format!("shutdown: {e:?}"))
}
