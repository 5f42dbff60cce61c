//! The engine's Rust side, driven as fio's hooks drive it (queue, commit,
//! getevents), without fio: on a file on disk with O_DIRECT.

use std::collections::HashSet;
use std::time::Duration;

use plugio_fio::{Access, Completion, EngineConfig, FioCore, Op};

const BS: usize = 4096;

fn config(iodepth: u32) -> EngineConfig {
    EngineConfig {
        iodepth,
        iomem_bytes: (iodepth as u64) * BS as u64 + 8192,
        ..EngineConfig::default()
    }
}

fn file(len_bytes: u64) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new_in(plugio_device::testing::direct_io_dir()).expect("tmp");
    f.as_file().set_len(len_bytes).expect("size");
    f
}

/// Waits for `n` completions (fio's `getevents(n, n, NULL)`).
fn wait_all(core: &FioCore, n: usize) -> Vec<Completion> {
    let mut all = Vec::new();
    let mut out = Vec::new();
    while all.len() < n {
        core.getevents(n - all.len(), n, None, &mut out);
        all.append(&mut out);
    }
    all
}

/// `n` io_u buffers of `BS` bytes in the core's io_u memory.
fn io_us(core: &FioCore, n: usize) -> Vec<*mut u8> {
    let (base, _registered) = core.iomem_alloc(n * BS + 4096);
    assert_eq!(base as usize % 4096, 0, "io_u memory is page-aligned");
    // SAFETY: inside the allocation just made.
    (0..n).map(|i| unsafe { base.add(i * BS) }).collect()
}

/// Writes `seed + i` into every byte of block `i` through `bufs`, reads
/// the blocks back into the zeroed buffers, and checks the bytes and the
/// cookies: fio's queue, commit, getevents, twice.
fn write_then_read_back(core: &FioCore, dev: plugio_fio::DevId, bufs: &[*mut u8], seed: u8) {
    let n = bufs.len();
    for (i, &b) in bufs.iter().enumerate() {
        // SAFETY: each io_u buffer is BS bytes, ours until its completion.
        unsafe {
            std::ptr::write_bytes(b, seed + i as u8, BS);
            core.queue(dev, Op::Write, (i * BS) as u64, b, BS, i)
                .expect("queue");
        }
    }
    assert_eq!(core.outstanding(), n);
    core.commit();
    let done = wait_all(core, n);
    assert!(done.iter().all(|c| c.result == BS as i64), "{done:?}");
    let cookies: HashSet<usize> = done.iter().map(|c| c.cookie).collect();
    assert_eq!(cookies, (0..n).collect());
    for (i, &b) in bufs.iter().enumerate() {
        // SAFETY: as above.
        unsafe {
            std::ptr::write_bytes(b, 0, BS);
            core.queue(dev, Op::Read, (i * BS) as u64, b, BS, 100 + i)
                .expect("queue");
        }
    }
    core.commit();
    let done = wait_all(core, n);
    assert!(done.iter().all(|c| c.result == BS as i64), "{done:?}");
    for (i, &b) in bufs.iter().enumerate() {
        // SAFETY: the read completed; the buffer is ours again.
        let got = unsafe { std::slice::from_raw_parts(b, BS) };
        assert!(got.iter().all(|&x| x == seed + i as u8), "block {i}");
    }
    assert_eq!(core.outstanding(), 0);
}

#[test]
fn writes_then_reads_back_through_queue_commit_getevents() {
    let f = file(1 << 20);
    let core = FioCore::new(config(16)).expect("core");
    let dev = core.open(f.path(), true, Access::ReadWrite).expect("open");
    let bufs = io_us(&core, 16);
    write_then_read_back(&core, dev, &bufs, 1);
}

#[test]
fn one_commit_is_one_plug_flush_for_the_whole_batch() {
    let f = file(1 << 20);
    let core = FioCore::new(config(8)).expect("core");
    let dev = core.open(f.path(), true, Access::Reads).expect("open");
    let bufs = io_us(&core, 8);
    for (i, &b) in bufs.iter().enumerate() {
        // SAFETY: each io_u buffer is BS bytes, ours until its completion.
        unsafe { core.queue(dev, Op::Read, (i * 2 * BS) as u64, b, BS, i) }.expect("queue");
    }
    let before = core.device(dev).expect("dev").iostats();
    core.commit();
    let after = core.device(dev).expect("dev").iostats();
    assert_eq!(after.bios - before.bios, 8, "every queued IO became a bio");
    assert_eq!(
        after.plug_flushes - before.plug_flushes,
        1,
        "in one plug flush"
    );
    assert_eq!(wait_all(&core, 8).len(), 8);
}

/// `ring_stats` (what `plugio_stats` prints) counts this core's ring: the
/// batch's CQEs and the enters that submitted and reaped it.
#[test]
fn ring_stats_count_this_core_s_ring() {
    let f = file(1 << 20);
    let core = FioCore::new(config(8)).expect("core");
    let Some(before) = core.ring_stats() else {
        return; // the sync fallback: io_uring refused here, no ring
    };
    let dev = core.open(f.path(), true, Access::Reads).expect("open");
    let bufs = io_us(&core, 8);
    for (i, &b) in bufs.iter().enumerate() {
        // SAFETY: each io_u buffer is BS bytes, ours until its completion.
        unsafe { core.queue(dev, Op::Read, (i * 2 * BS) as u64, b, BS, i) }.expect("queue");
    }
    core.commit();
    assert_eq!(wait_all(&core, 8).len(), 8);
    let after = core.ring_stats().expect("the same ring");
    assert!(after.cqes - before.cqes >= 8, "{before:?} -> {after:?}");
    assert!(after.enters > before.enters, "{before:?} -> {after:?}");
}

#[test]
fn adjacent_ios_of_one_commit_merge() {
    let f = file(1 << 20);
    let core = FioCore::new(config(32)).expect("core");
    let dev = core.open(f.path(), true, Access::Reads).expect("open");
    let bufs = io_us(&core, 32);
    for (i, &b) in bufs.iter().enumerate() {
        // SAFETY: each io_u buffer is BS bytes, ours until its completion.
        unsafe { core.queue(dev, Op::Read, (i * BS) as u64, b, BS, i) }.expect("queue");
    }
    core.commit();
    let done = wait_all(&core, 32);
    assert!(done.iter().all(|c| c.result == BS as i64));
    let s = core.device(dev).expect("dev").iostats();
    assert_eq!(s.bios, 32);
    assert!(
        s.requests < s.bios,
        "sequential bios of one commit merged: {s:?}"
    );
}

#[test]
fn getevents_returns_at_most_max_and_keeps_the_rest() {
    let f = file(1 << 20);
    let core = FioCore::new(config(8)).expect("core");
    let dev = core.open(f.path(), true, Access::Reads).expect("open");
    let bufs = io_us(&core, 8);
    for (i, &b) in bufs.iter().enumerate() {
        // SAFETY: each io_u buffer is BS bytes, ours until its completion.
        unsafe { core.queue(dev, Op::Read, (i * BS) as u64, b, BS, i) }.expect("queue");
    }
    core.commit();
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    while seen.len() < 8 {
        let n = core.getevents(1, 3, None, &mut out);
        assert!((1..=3).contains(&n), "min 1, max 3: got {n}");
        assert_eq!(out.len(), n);
        seen.extend(out.iter().map(|c| c.cookie));
    }
    assert_eq!(seen.len(), 8);
    assert_eq!(core.outstanding(), 0);
}

#[test]
fn getevents_never_waits_for_io_that_was_not_queued() {
    let core = FioCore::new(config(4)).expect("core");
    let mut out = Vec::new();
    // No timeout and min 4: with nothing queued this must return at once.
    assert_eq!(core.getevents(4, 4, None, &mut out), 0);
    // min 0 is a poll.
    assert_eq!(core.getevents(0, 4, None, &mut out), 0);
    // A zero timeout returns too.
    assert_eq!(
        core.getevents(1, 4, Some(Duration::ZERO), &mut out),
        0,
        "nothing queued"
    );
}

#[test]
fn errors_reach_the_completion_as_negative_errnos() {
    let f = file(64 * 1024);
    let core = FioCore::new(config(4)).expect("core");
    let dev = core.open(f.path(), true, Access::ReadWrite).expect("open");
    let bufs = io_us(&core, 4);
    // SAFETY: each io_u buffer is BS bytes, ours until its completion.
    unsafe {
        // Unaligned offset and sub-block length under O_DIRECT.
        core.queue(dev, Op::Read, 1000, bufs[0], BS, 0)
            .expect("queue");
        core.queue(dev, Op::Write, 0, bufs[1], 100, 1)
            .expect("queue");
        // Past the end of a regular file: no error, 0 bytes (pread's
        // answer; fio sees the whole length as resid).
        core.queue(dev, Op::Read, 1 << 30, bufs[2], BS, 2)
            .expect("queue");
        // A good one among them.
        core.queue(dev, Op::Read, 0, bufs[3], BS, 3).expect("queue");
    }
    core.commit();
    let mut done = wait_all(&core, 4);
    done.sort_by_key(|c| c.cookie);
    let einval = -i64::from(libc::EINVAL);
    assert_eq!(
        done.iter().map(|c| c.result).collect::<Vec<_>>(),
        vec![einval, einval, 0, BS as i64]
    );
}

#[test]
fn sync_datasync_and_trim_complete() {
    let f = file(1 << 20);
    let core = FioCore::new(config(4)).expect("core");
    let dev = core.open(f.path(), false, Access::ReadWrite).expect("open");
    let bufs = io_us(&core, 1);
    // SAFETY: the io_u buffer is BS bytes, ours until its completion.
    unsafe {
        core.queue(dev, Op::Write, 0, bufs[0], BS, 0)
            .expect("queue");
    }
    core.commit();
    assert_eq!(wait_all(&core, 1)[0].result, BS as i64);
    // SAFETY: no buffer for these ops.
    unsafe {
        core.queue(dev, Op::Sync, 0, std::ptr::null_mut(), 0, 1)
            .expect("queue");
        core.queue(dev, Op::DataSync, 0, std::ptr::null_mut(), 0, 2)
            .expect("queue");
    }
    core.commit();
    let done = wait_all(&core, 2);
    assert!(done.iter().all(|c| c.result == 0), "{done:?}");
    // SAFETY: no buffer for a trim.
    unsafe { core.queue(dev, Op::Trim, 0, std::ptr::null_mut(), 65536, 3) }.expect("queue");
    core.commit();
    let done = wait_all(&core, 1);
    // ext4 and xfs punch the range; a file system without discard says
    // EOPNOTSUPP: either way the trim completes exactly once.
    assert!(
        done[0].result == 65536 || done[0].result == -i64::from(libc::EOPNOTSUPP),
        "a trim counts its length: {done:?}"
    );
}

#[test]
fn open_errors_name_the_errno() {
    let core = FioCore::new(config(1)).expect("core");
    let err = core
        .open(
            std::path::Path::new("/nonexistent/plugio-fio"),
            true,
            Access::Reads,
        )
        .expect_err("no such file");
    assert_eq!(err.errno(), libc::ENOENT);
    let dir = tempfile::tempdir().expect("dir");
    let err = core
        .open(dir.path(), true, Access::Reads)
        .expect_err("a directory");
    assert_eq!(err.errno(), libc::EINVAL);
}

#[test]
fn iomem_free_waits_for_the_io_in_flight() {
    let f = file(1 << 20);
    let core = FioCore::new(config(32)).expect("core");
    let dev = core.open(f.path(), true, Access::Reads).expect("open");
    let bufs = io_us(&core, 32);
    for (i, &b) in bufs.iter().enumerate() {
        // SAFETY: each io_u buffer is BS bytes, ours until its completion.
        unsafe { core.queue(dev, Op::Read, (i * BS) as u64, b, BS, i) }.expect("queue");
    }
    core.commit();
    core.iomem_free();
    // Everything completed before the memory went; the completions are
    // still there for getevents.
    let mut out = Vec::new();
    assert_eq!(core.getevents(0, 32, Some(Duration::ZERO), &mut out), 32);
}

#[test]
fn io_u_memory_is_used_in_place_and_registered_memory_goes_out_fixed() {
    let f = file(1 << 20);
    let core = FioCore::new(config(8)).expect("core");
    let dev = core.open(f.path(), true, Access::ReadWrite).expect("open");
    let (base, registered) = core.iomem_alloc(8 * BS + 4096);
    // SAFETY: inside the allocation just made.
    let bufs: Vec<*mut u8> = (0..8).map(|i| unsafe { base.add(i * BS) }).collect();
    for (i, &b) in bufs.iter().enumerate() {
        // SAFETY: each io_u buffer is BS bytes, ours until its completion;
        // every other block, so nothing merges.
        unsafe {
            std::ptr::write_bytes(b, 0x40 + i as u8, BS);
            core.queue(dev, Op::Write, (i * 2 * BS) as u64, b, BS, i)
                .expect("queue");
        }
    }
    core.commit();
    assert!(wait_all(&core, 8).iter().all(|c| c.result == BS as i64));
    let s = core.device(dev).expect("dev").iostats();
    assert_eq!(s.bounce_ios, 0, "aligned io_u memory is not copied");
    if registered {
        assert_eq!(s.fixed_buf_requests, 8, "WRITE_FIXED on the arena: {s:?}");
    } else {
        // The kernel refused the registration (RLIMIT_MEMLOCK): plain
        // writes from the same memory.
        assert_eq!(s.fixed_buf_requests, 0);
    }
    // The data on disk is what was in the io_u memory.
    let on_disk = std::fs::read(f.path()).expect("read back");
    for i in 0..8 {
        let block = &on_disk[i * 2 * BS..i * 2 * BS + BS];
        assert!(block.iter().all(|&x| x == 0x40 + i as u8), "block {i}");
    }
}

#[test]
fn unaligned_io_u_memory_bounces_or_is_refused_as_configured() {
    let f = file(1 << 20);
    for bounce in [1, 0] {
        let core = FioCore::new(EngineConfig {
            bounce_unaligned: bounce,
            ..config(2)
        })
        .expect("core");
        let dev = core.open(f.path(), true, Access::Reads).expect("open");
        let (base, _) = core.iomem_alloc(2 * BS + 4096);
        // fio's iomem_align=100: the buffer starts 100 bytes in.
        // SAFETY: 100 + BS bytes fit in the allocation.
        let buf = unsafe { base.add(100) };
        // SAFETY: as above; ours until the completion.
        unsafe { core.queue(dev, Op::Read, 0, buf, BS, 0) }.expect("queue");
        core.commit();
        let done = wait_all(&core, 1);
        let s = core.device(dev).expect("dev").iostats();
        if bounce == 1 {
            assert_eq!(done[0].result, BS as i64);
            assert_eq!(s.bounce_ios, 1);
        } else {
            assert_eq!(done[0].result, -i64::from(libc::EINVAL));
            assert_eq!(s.bounce_ios, 0);
        }
    }
}

#[test]
fn queue_on_a_closed_file_is_refused_and_nothing_is_queued() {
    let f = file(1 << 20);
    let core = FioCore::new(config(1)).expect("core");
    let dev = core.open(f.path(), true, Access::Reads).expect("open");
    core.close(dev);
    let bufs = io_us(&core, 1);
    // SAFETY: refused before the buffer is used.
    let err = unsafe { core.queue(dev, Op::Read, 0, bufs[0], BS, 0) }.expect_err("closed");
    assert_eq!(err, plugio_fio::NoSuchDevice(dev));
    assert!(err.to_string().contains("not open"), "{err}");
    assert_eq!(core.outstanding(), 0);
}

#[test]
fn job_threads_that_read_and_write_one_file_share_its_device_in_either_order() {
    let f = file(1 << 20);
    for reader_first in [false, true] {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let path = f.path().to_path_buf();
        // The other job thread: opens when told, keeps the file open until
        // told again (one plugio core per thread).
        let other = std::thread::spawn(move || {
            let core = FioCore::new(config(1)).expect("core");
            rx.recv().expect("go");
            let access = if reader_first {
                Access::ReadWrite
            } else {
                Access::Reads
            };
            let id = core.open(&path, true, access).expect("second open shares");
            assert!(!core.device(id).expect("dev").options().read_only);
            done_tx.send(()).expect("done");
        });
        let core = FioCore::new(config(1)).expect("core");
        let access = if reader_first {
            Access::Reads
        } else {
            Access::ReadWrite
        };
        let id = core.open(f.path(), true, access).expect("first open");
        tx.send(()).expect("go");
        done_rx.recv().expect("second open finished");
        other.join().expect("other thread");
        core.close(id);
    }
}

#[test]
fn other_options_on_an_open_file_are_refused_with_plugio_s_message() {
    let f = file(1 << 20);
    let strict = FioCore::new(config(1)).expect("core");
    let id = strict
        .open(f.path(), true, Access::ReadOnly)
        .expect("read-only");
    assert!(strict.device(id).expect("dev").options().read_only);
    let path = f.path().to_path_buf();
    std::thread::spawn(move || {
        let other = FioCore::new(config(1)).expect("core");
        // Writing a file held read-only (fio's --readonly), and another
        // direct= setting: refused, EINVAL, saying why.
        for (direct, access) in [(true, Access::ReadWrite), (false, Access::ReadOnly)] {
            let err = other
                .open(&path, direct, access)
                .expect_err("other options");
            assert_eq!(err.errno(), libc::EINVAL);
            assert!(err.to_string().contains("already open"), "{err}");
        }
    })
    .join()
    .expect("other thread");
    strict.close(id);
}

#[test]
fn ios_queued_past_iodepth_wait_for_a_slot_and_all_complete() {
    // fio never queues more than `iodepth`; if a caller does, the IOs past
    // the slots wait in order and start as slots free up.
    let f = file(1 << 20);
    let core = FioCore::new(config(2)).expect("core");
    let dev = core.open(f.path(), true, Access::ReadWrite).expect("open");
    let bufs = io_us(&core, 6);
    write_then_read_back(&core, dev, &bufs, 0x40);
}
