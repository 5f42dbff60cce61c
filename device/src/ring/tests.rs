//! Push-back tests: small rings, SQ overflow, injected enter errors and
//! per-op EAGAIN. Every op must complete exactly once with correct data.

use std::cell::Cell;
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::time::Duration;

use futures::future::join_all;

use crate::backend::file::OpenOptions;
use crate::testing::{block_on, direct_io_dir, park_until, RecordingHandler};
use crate::{
    register_handler, Backend, BatchWaitTimer, DeviceDriver, DmaBuf, File, IoFlags, IoOp,
    RingConfig, RingStats,
};

const BLOCK: usize = 4096;
const FILE_BLOCKS: u64 = 64;

fn block_pattern(block: u64) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| ((i as u64 + block * 31) % 253) as u8)
        .collect()
}

fn seeded_file() -> tempfile::NamedTempFile {
    let tmp = tempfile::NamedTempFile::new_in(direct_io_dir()).expect("temp file");
    for b in 0..FILE_BLOCKS {
        tmp.as_file()
            .write_all_at(&block_pattern(b), b * BLOCK as u64)
            .expect("seed");
    }
    tmp
}

/// The seeded file (kept alive by the caller) and a file backend on it.
fn seeded_backend() -> (tempfile::NamedTempFile, crate::FileBackend) {
    let tmp = seeded_file();
    let backend = OpenOptions::new().open(tmp.path()).expect("open");
    (tmp, backend)
}

/// A driver with `sq_entries` SQ entries and its ring.
fn driver_and_ring(sq_entries: u32) -> (DeviceDriver, Rc<super::Ring>) {
    let driver = driver_with(sq_entries);
    let ring = driver.ring().expect("ring").clone();
    (driver, ring)
}

fn driver_with(sq_entries: u32) -> DeviceDriver {
    DeviceDriver::with_ring(&RingConfig {
        sq_entries,
        ..RingConfig::default()
    })
    .expect("ring")
}

/// Submits `n` reads through the high-level API all at once and checks
/// every one's data.
fn concurrent_reads(driver: &DeviceDriver, file: &File, n: u64) {
    let results = block_on(driver, async {
        let futs = (0..n).map(|i| {
            let block = i % FILE_BLOCKS;
            let buf = DmaBuf::heap(BLOCK, BLOCK);
            async move { (block, file.read_at(buf, block * BLOCK as u64).await) }
        });
        join_all(futs).await
    });
    assert_eq!(results.len() as u64, n);
    for (block, (r, buf)) in results {
        assert_eq!(r.expect("read"), BLOCK);
        assert_eq!(buf.as_slice(), &block_pattern(block)[..], "block {block}");
    }
}

#[test]
fn eight_entry_ring_completes_a_thousand_concurrent_reads() {
    let driver = driver_with(8);
    let tmp = seeded_file();
    let file = File::open(tmp.path()).expect("open");
    concurrent_reads(&driver, &file, 1000);
    let stats = driver.ring_stats().expect("ring");
    assert!(stats.sq_full > 0, "the SQ filled up: {stats:?}");
    assert_eq!(driver.in_flight(), 0);
}

/// Pushes `n` low-level reads of the seeded file on `driver`'s ring before
/// any park (with `submit_each`, a `submit_now` after each), then parks
/// until all completed and checks each completed once with its data.
fn reads_pushed_before_any_park(driver: &DeviceDriver, n: usize, submit_each: bool) {
    let (_tmp, backend) = seeded_backend();
    let handler = Rc::new(RecordingHandler::default());
    let id = register_handler(handler.clone());
    let mut bufs: Vec<DmaBuf> = (0..n).map(|_| DmaBuf::heap(BLOCK, BLOCK)).collect();
    let iovs: Vec<libc::iovec> = bufs.iter_mut().map(|b| b.iovec(BLOCK)).collect();
    for (i, iov) in iovs.iter().enumerate() {
        let op = IoOp::read(
            (i as u64 % FILE_BLOCKS) * BLOCK as u64,
            std::slice::from_ref(iov),
        );
        // SAFETY: bufs and iovs outlive the park loop below, which waits
        // for every completion.
        unsafe { backend.submit(&op, id, i as u64) }.expect("submit");
        if submit_each {
            crate::submit_now().expect("submit_now");
        }
    }
    assert!(park_until(driver, Duration::from_secs(20), || handler
        .total()
        == n as u64));
    assert!(handler.duplicates().is_empty());
    for (i, buf) in bufs.iter().enumerate() {
        assert_eq!(handler.seen.borrow()[&(i as u64)].1, BLOCK as i32);
        assert_eq!(buf.as_slice(), &block_pattern(i as u64 % FILE_BLOCKS)[..]);
    }
}

#[test]
fn cq_overflow_is_flushed_and_nothing_is_lost() {
    // 8 SQ / 16 CQ entries, 300 ops pushed before any reap: the CQ
    // overflows into the kernel's list and must be flushed. Whether the
    // kernel posts the CQEs before the park (an overflow) or later, from
    // its task work, depends on the machine's load (a CPU hog beside the
    // suite once made every CQE arrive late): each attempt checks that
    // nothing is lost, and attempts repeat, on fresh rings, until one
    // has taken the overflow path.
    for attempt in 1..=50 {
        let driver = driver_with(8);
        reads_pushed_before_any_park(&driver, 300, true);
        let stats = driver.ring_stats().expect("ring");
        if stats.cq_overflow_flushes > 0 {
            return;
        }
        assert!(attempt < 50, "no overflow in {attempt} attempts: {stats:?}");
    }
}

#[test]
fn three_hundred_sqes_into_a_128_entry_sq_in_one_go() {
    let driver = driver_with(128);
    reads_pushed_before_any_park(&driver, 300, false);
    assert!(driver.ring_stats().expect("ring").sq_full > 0);
}

#[test]
fn injected_eagain_ebusy_eintr_from_enter_are_absorbed() {
    let (driver, ring) = driver_and_ring(32);
    let calls = Rc::new(Cell::new(0u32));
    let c = calls.clone();
    *ring.fault.borrow_mut() = Some(Box::new(move || {
        let n = c.get();
        c.set(n + 1);
        match n % 4 {
            0 => Some(libc::EAGAIN),
            1 => Some(libc::EBUSY),
            2 => Some(libc::EINTR),
            _ => None,
        }
    }));
    let tmp = seeded_file();
    let file = File::open(tmp.path()).expect("open");
    concurrent_reads(&driver, &file, 200);
    let stats = ring.stats();
    assert!(stats.enter_busy > 0 && stats.enter_eintr > 0, "{stats:?}");
    assert!(calls.get() > 8);
    *ring.fault.borrow_mut() = None;
}

#[test]
fn per_op_eagain_results_are_resubmitted_not_returned() {
    let (driver, ring) = driver_and_ring(32);
    let faked = Rc::new(Cell::new(0u32));
    let f = faked.clone();
    // Turn the first completion of every even slot into -EAGAIN.
    let mut seen = std::collections::HashSet::new();
    *ring.cqe_fault.borrow_mut() = Some(Box::new(move |ud, res| {
        if ud < super::CANCEL_UD && ud % 2 == 0 && seen.insert(ud) {
            f.set(f.get() + 1);
            -libc::EAGAIN
        } else {
            res
        }
    }));
    let tmp = seeded_file();
    let file = File::open(tmp.path()).expect("open");
    concurrent_reads(&driver, &file, 64);
    assert!(faked.get() > 0);
    assert_eq!(ring.stats().eagain_resubmits, u64::from(faked.get()));
}

/// Direct ops (no slot): 300 reads into a 32-entry SQ, tokens up to the
/// 48-bit limit, each completing once with its data; a per-op `-EAGAIN`
/// on a direct op is delivered as the result (the caller issues it
/// again), not resubmitted by the ring; in-flight counts return to 0.
#[test]
fn direct_ops_complete_once_and_deliver_their_eagain() {
    let (driver, ring) = driver_and_ring(32);
    let (_tmp, backend) = seeded_backend();
    let handler = Rc::new(RecordingHandler::default());
    let id = register_handler(handler.clone());
    let high = (1u64 << super::DIRECT_TOKEN_BITS) - 300;
    let faked = Rc::new(Cell::new(0u32));
    let f = faked.clone();
    *ring.cqe_fault.borrow_mut() = Some(Box::new(move |ud, res| {
        // Every 7th direct op (token = ud's low 48 bits) meets an EAGAIN.
        let direct = ud >> super::NOT_DIRECT_SHIFT == 0;
        if direct && (ud & 0xffff_ffff_ffff) % 7 == 0 {
            f.set(f.get() + 1);
            -libc::EAGAIN
        } else {
            res
        }
    }));
    let mut bufs: Vec<DmaBuf> = (0..300).map(|_| DmaBuf::heap(BLOCK, BLOCK)).collect();
    let iovs: Vec<libc::iovec> = bufs.iter_mut().map(|b| b.iovec(BLOCK)).collect();
    for (i, iov) in iovs.iter().enumerate() {
        let op = IoOp::read(
            (i as u64 % FILE_BLOCKS) * BLOCK as u64,
            std::slice::from_ref(iov),
        );
        // SAFETY: bufs and iovs outlive the park loop below, which waits
        // for every completion.
        unsafe { backend.submit_direct(&op, id, high + i as u64) }.expect("submit");
    }
    assert!(park_until(&driver, Duration::from_secs(20), || handler
        .total()
        == 300));
    *ring.cqe_fault.borrow_mut() = None;
    assert!(handler.duplicates().is_empty());
    let seen = handler.seen.borrow();
    for (i, buf) in bufs.iter().enumerate() {
        let token = high + i as u64;
        if token % 7 == 0 {
            assert_eq!(seen[&token].1, -libc::EAGAIN, "token {token}");
        } else {
            assert_eq!(seen[&token].1, BLOCK as i32, "token {token}");
            assert_eq!(buf.as_slice(), &block_pattern(i as u64 % FILE_BLOCKS)[..]);
        }
    }
    assert!(faked.get() > 0);
    let stats = ring.stats();
    assert_eq!(stats.eagain_resubmits, 0, "{stats:?}");
    assert!(stats.sq_full > 0, "{stats:?}");
    assert_eq!(ring.ops_in_flight(), 0);
    drop(seen);
    // A token beyond 48 bits still completes, through a slot.
    let op = IoOp::read(0, std::slice::from_ref(&iovs[0]));
    // SAFETY: as above.
    unsafe { backend.submit_direct(&op, id, 1 << 50) }.expect("submit");
    assert!(park_until(&driver, Duration::from_secs(20), || handler
        .total()
        == 301));
    assert_eq!(handler.seen.borrow()[&(1 << 50)].1, BLOCK as i32);
}

#[test]
fn unpark_from_another_thread_wakes_a_blocking_park() {
    use plugio_executor::Driver;
    let driver = driver_with(8);
    let unpark = driver.unparker();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        unpark.unpark();
    });
    let start = std::time::Instant::now();
    driver.park(Some(Duration::from_secs(10))).expect("park");
    assert!(start.elapsed() < Duration::from_secs(5), "woken by unpark");
    t.join().expect("unparker");
    // An unpark before park is not lost.
    driver.unparker().unpark();
    let start = std::time::Instant::now();
    driver.park(Some(Duration::from_secs(10))).expect("park");
    assert!(start.elapsed() < Duration::from_secs(5));
    // A timeout alone returns.
    let start = std::time::Instant::now();
    driver.park(Some(Duration::from_millis(20))).expect("park");
    assert!(start.elapsed() >= Duration::from_millis(15));
}

#[test]
fn probe_reports_core_opcodes() {
    let driver = driver_with(8);
    let info = driver.ring_info().expect("ring");
    assert!(info.supported_ops.contains(&"READ"), "{info}");
    assert!(info.supports(io_uring::opcode::Nop::CODE));
    assert!(info.to_string().contains("supported ops"));
}

#[test]
fn timeout_sqe_fallback_without_ext_arg() {
    use plugio_executor::Driver;
    let (driver, ring) = driver_and_ring(8);
    ring.force_timeout_sqe.set(true);
    let start = std::time::Instant::now();
    driver.park(Some(Duration::from_millis(30))).expect("park");
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(25), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    let tmp = seeded_file();
    let file = File::open(tmp.path()).expect("open");
    concurrent_reads(&driver, &file, 100);
}

#[test]
fn sqpoll_ring_serves_reads() {
    let driver = DeviceDriver::with_ring(&RingConfig {
        sqpoll_idle_ms: Some(20),
        ..RingConfig::default()
    })
    .expect("sqpoll ring");
    assert!(driver.ring_info().expect("ring").sqpoll);
    let tmp = seeded_file();
    let file = File::open(tmp.path()).expect("open");
    concurrent_reads(&driver, &file, 200);
}

#[test]
fn registered_files_are_released_when_their_backend_drops() {
    let (driver, ring) = driver_and_ring(8);
    let tmp = seeded_file();
    for _ in 0..3 {
        let file = File::open(tmp.path()).expect("open");
        concurrent_reads(&driver, &file, 4);
        assert_eq!(ring.registered_file_count(), 1);
        drop(file);
        use plugio_executor::Driver;
        driver.park(Some(Duration::ZERO)).expect("park");
        assert_eq!(ring.registered_file_count(), 0, "swept after close");
    }
}

#[test]
fn backend_dropped_with_queued_sqes_still_completes_them() {
    let driver = driver_with(64);
    let tmp = seeded_file();
    let handler = Rc::new(RecordingHandler::default());
    let id = register_handler(handler.clone());
    let mut bufs: Vec<DmaBuf> = (0..32).map(|_| DmaBuf::heap(BLOCK, BLOCK)).collect();
    let iovs: Vec<libc::iovec> = bufs.iter_mut().map(|b| b.iovec(BLOCK)).collect();
    {
        let backend = OpenOptions::new().open(tmp.path()).expect("open");
        for (i, iov) in iovs.iter().enumerate() {
            let op = IoOp::read(i as u64 * BLOCK as u64, std::slice::from_ref(iov));
            // SAFETY: bufs and iovs outlive the park loop below.
            unsafe { backend.submit(&op, id, i as u64) }.expect("submit");
        }
        // The backend (and its fd) is dropped before anything was entered.
    }
    assert!(park_until(&driver, Duration::from_secs(10), || handler
        .total()
        == 32));
    for (i, buf) in bufs.iter().enumerate() {
        assert_eq!(handler.seen.borrow()[&(i as u64)].1, BLOCK as i32);
        assert_eq!(buf.as_slice(), &block_pattern(i as u64)[..]);
    }
}

#[test]
fn zero_timeout_parks_alone_collect_completions() {
    use plugio_executor::Driver;
    let driver = driver_with(64);
    let (_tmp, backend) = seeded_backend();
    let handler = Rc::new(RecordingHandler::default());
    let id = register_handler(handler.clone());
    let mut bufs: Vec<DmaBuf> = (0..16).map(|_| DmaBuf::heap(BLOCK, BLOCK)).collect();
    let iovs: Vec<libc::iovec> = bufs.iter_mut().map(|b| b.iovec(BLOCK)).collect();
    for (i, iov) in iovs.iter().enumerate() {
        let op = IoOp::read(i as u64 * BLOCK as u64, std::slice::from_ref(iov));
        // SAFETY: bufs and iovs outlive the loop below.
        unsafe { backend.submit(&op, id, i as u64) }.expect("submit");
    }
    // A busy executor only ever parks with a zero timeout: completions
    // must still arrive (DEFER_TASKRUN needs GETEVENTS to post them).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while handler.total() < 16 && std::time::Instant::now() < deadline {
        driver.park(Some(Duration::ZERO)).expect("park");
    }
    assert_eq!(handler.total(), 16);
    drop(bufs);
}

/// A pipe whose reads stay in flight until written (or until a watchdog
/// writes after `WATCHDOG`, so a test that would hang fails instead).
pub(super) struct SlowReads {
    read_fd: std::os::fd::OwnedFd,
    write_fd: Rc<std::os::fd::OwnedFd>,
    bufs: Vec<[u8; 8]>,
    stop: Option<std::sync::mpsc::Sender<()>>,
    watchdog: Option<std::thread::JoinHandle<bool>>,
}

const WATCHDOG: Duration = Duration::from_secs(20);

impl SlowReads {
    pub(super) fn new(n: usize) -> Self {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let mut fds = [0; 2];
        // SAFETY: fds is a valid out array of two ints.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh descriptors from pipe2, owned here.
        let (read_fd, write_fd) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let write_fd = Rc::new(write_fd);
        let (stop, rx) = std::sync::mpsc::channel::<()>();
        let raw = write_fd.as_raw_fd();
        let total = n * 8;
        let watchdog = std::thread::spawn(move || {
            if rx.recv_timeout(WATCHDOG).is_ok() {
                return false;
            }
            let data = vec![7u8; total];
            // SAFETY: the test keeps the write end open until it joined us.
            unsafe { libc::write(raw, data.as_ptr().cast(), total) };
            true
        });
        Self {
            read_fd,
            write_fd,
            bufs: vec![[0u8; 8]; n],
            stop: Some(stop),
            watchdog: Some(watchdog),
        }
    }

    /// Pushes the reads on `ring` with tokens `0..n`.
    pub(super) fn push(&mut self, ring: &super::Ring, id: crate::HandlerId) {
        use std::os::fd::AsRawFd;
        for (i, buf) in self.bufs.iter_mut().enumerate() {
            let entry = io_uring::opcode::Read::new(
                io_uring::types::Fd(self.read_fd.as_raw_fd()),
                buf.as_mut_ptr(),
                8,
            )
            .build();
            ring.push(entry, None, super::NO_FILE, id, i as u64);
        }
    }

    /// Stops the watchdog (true when it had fired) and completes the reads.
    pub(super) fn finish(mut self) -> (bool, Self) {
        use std::os::fd::AsRawFd;
        let _ = self.stop.take().map(|s| s.send(()));
        let fired = self
            .watchdog
            .take()
            .map(|w| w.join().expect("watchdog"))
            .unwrap_or(false);
        if !fired {
            let data = vec![7u8; self.bufs.len() * 8];
            // SAFETY: writes from a live buffer to our pipe.
            let n =
                unsafe { libc::write(self.write_fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
            assert_eq!(n as usize, data.len());
        }
        (fired, self)
    }
}

/// A driver whose ring has `n` [`SlowReads`] in flight for a recording
/// handler (`force_no_min_timeout`: as if the kernel lacked `MIN_TIMEOUT`).
fn with_slow_reads(
    force_no_min_timeout: bool,
    n: usize,
) -> (
    DeviceDriver,
    Rc<super::Ring>,
    Rc<RecordingHandler>,
    crate::HandlerId,
    SlowReads,
) {
    let (driver, ring) = driver_and_ring(64);
    ring.force_no_min_timeout.set(force_no_min_timeout);
    let handler = Rc::new(RecordingHandler::default());
    let id = register_handler(handler.clone());
    let mut slow = SlowReads::new(n);
    slow.push(&ring, id);
    (driver, ring, handler, id, slow)
}

/// 31 ops that do not complete and one NOP: a park that waits for a batch
/// must still hand the NOP over (after its short bound, armed on every
/// batched wait here: `BatchWaitTimer::Always`), not wait for the slow
/// ones.
fn one_fast_among_slow(force_no_min_timeout: bool) {
    use plugio_executor::Driver;
    let (driver, ring, handler, id, slow) = with_slow_reads(force_no_min_timeout, 31);
    ring.set_batch_wait_timer(BatchWaitTimer::Always);
    ring.push(
        io_uring::opcode::Nop::new().build(),
        None,
        super::NO_FILE,
        id,
        100,
    );
    assert_eq!(ring.in_flight(), 32);
    driver.park(None).expect("park");
    let delivered: Vec<u64> = handler.seen.borrow().keys().copied().collect();
    let (fired, slow) = slow.finish();
    assert!(!fired, "the park waited for the slow ops (watchdog fired)");
    assert_eq!(delivered, vec![100], "only the NOP, after one park");
    assert!(park_until(&driver, Duration::from_secs(10), || handler
        .total()
        == 32));
    for buf in &slow.bufs {
        assert_eq!(*buf, [7u8; 8]);
    }
    assert!(handler.duplicates().is_empty());
}

#[test]
fn batched_wait_hands_over_one_fast_completion_among_slow_ops() {
    one_fast_among_slow(false);
}

#[test]
fn batched_wait_without_min_timeout_falls_back_to_one() {
    one_fast_among_slow(true);
}

/// Pushes one NOP (`token`) beside the slow ops and parks once: the
/// ring's counters after the park.
fn nop_then_park(
    driver: &DeviceDriver,
    ring: &super::Ring,
    id: crate::HandlerId,
    token: u64,
) -> RingStats {
    use plugio_executor::Driver;
    ring.push(
        io_uring::opcode::Nop::new().build(),
        None,
        super::NO_FILE,
        id,
        token,
    );
    driver.park(None).expect("park");
    ring.stats()
}

/// Lets the slow ops finish and checks that the watchdog did not fire
/// and that all `total` ops reached the handler once each.
fn finish_slow_reads(
    driver: &DeviceDriver,
    handler: &RecordingHandler,
    slow: SlowReads,
    total: u64,
) {
    let (fired, _slow) = slow.finish();
    assert!(!fired, "a park waited for the slow ops (watchdog fired)");
    assert!(park_until(driver, Duration::from_secs(10), || handler
        .total()
        == total));
    assert!(handler.duplicates().is_empty());
}

/// `BatchWaitTimer::WhenLate` (the default): the first batched wait arms
/// no timer of its own, so one fast op among slow ones waits for the
/// untimed limit; that batch is late, which arms the short bound for the
/// next waits: the next fast op goes after one timed wait. The next late
/// untimed batch arms it for twice as many waits.
#[test]
fn late_batch_arms_the_bound_for_the_next_waits() {
    for force_no_min_timeout in [false, true] {
        let (driver, ring, handler, id, slow) = with_slow_reads(force_no_min_timeout, 31);
        if !ring.info().ext_arg {
            return; // no batched waits before 5.11
        }
        assert_eq!(
            RingConfig::default().batch_wait_timer,
            BatchWaitTimer::WhenLate
        );
        // One NOP (`token`) with the 31 stuck reads, one park: (untimed
        // waits, timed waits, late batches, timed waits left).
        let step = |token| {
            let s = nop_then_park(&driver, &ring, id, token);
            let left = ring.timed_waits_left.get();
            (
                s.batch_waits_untimed,
                s.batch_waits_timed,
                s.late_batches,
                left,
            )
        };
        let bounded = super::BATCH_WAITS_BOUNDED;
        // The first batch waits untimed, and is late.
        assert_eq!(step(100), (1, 0, 1, bounded));
        // That wait also taught the ring that completions are slow (wait
        // for one from now on); as a ring that has seen fast ones again:
        // the next batch is timed, and the bound cut it short too (still
        // late, still armed).
        ring.completion_interval_ns.set(0);
        assert_eq!(step(101), (1, 1, 2, bounded));
        // Once the timed waits run out, an untimed wait that is late again
        // arms the bound for twice as many waits.
        ring.timed_waits_left.set(0);
        ring.completion_interval_ns.set(0);
        assert_eq!(step(102), (2, 1, 3, 2 * bounded));
        let mut delivered: Vec<u64> = handler.seen.borrow().keys().copied().collect();
        delivered.sort_unstable();
        assert_eq!(delivered, vec![100, 101, 102], "each NOP after one park");
        finish_slow_reads(&driver, &handler, slow, 34);
    }
}

/// A timed wait is judged by what its bound could gather at the
/// estimated completion rate, not by its whole batch: on a ring that
/// expects one completion per half a cap, a batch of 16 takes 8 caps to
/// fill and the bound (one cap) gathers about 2, so one CQE at the bound
/// is on time and the timed period counts down; with no estimate yet the
/// same wait is late (the first step of
/// `late_batch_arms_the_bound_for_the_next_waits`).
#[test]
fn timed_wait_is_judged_by_what_its_bound_can_gather() {
    for force_no_min_timeout in [false, true] {
        let (driver, ring, handler, id, slow) = with_slow_reads(force_no_min_timeout, 31);
        if !ring.info().ext_arg {
            return; // no batched waits before 5.11
        }
        let cap_ns = ring.batch_wait.as_nanos() as u64;
        // (interval estimate, token) -> (timed waits, late batches, left)
        let step = |interval_ns: u64, token| {
            ring.completion_interval_ns.set(interval_ns);
            let s = nop_then_park(&driver, &ring, id, token);
            (
                s.batch_waits_timed,
                s.late_batches,
                ring.timed_waits_left.get(),
            )
        };
        ring.timed_waits_left.set(5);
        assert_eq!(step(cap_ns / 2, 100), (1, 0, 4), "on time: counts down");
        assert_eq!(
            step(0, 101),
            (2, 1, super::BATCH_WAITS_BOUNDED),
            "no estimate: one CQE of 16 is late"
        );
        finish_slow_reads(&driver, &handler, slow, 33);
    }
}

/// An untimed batch that filled, but slowly (four 1 ms timeouts: the
/// batch of 2 fills after about 1 ms, more than 4 times the cap), is late
/// as a stall is: it arms the bound for `BATCH_WAITS_BOUNDED` waits and
/// raises the doubling's level.
#[test]
fn slowly_filled_batch_arms_the_bound() {
    use plugio_executor::Driver;
    let (driver, ring) = driver_and_ring(64);
    if !ring.info().ext_arg {
        return; // no batched waits before 5.11
    }
    let handler = Rc::new(RecordingHandler::default());
    let id = register_handler(handler.clone());
    // The kernel copies the timespec when it takes the SQE (the park's
    // enter, while `ts` lives).
    let ts = io_uring::types::Timespec::new().nsec(1_000_000);
    for token in 0..4 {
        let sqe = io_uring::opcode::Timeout::new(&ts).build();
        ring.push(sqe, None, super::NO_FILE, id, token);
    }
    ring.completion_interval_ns.set(0);
    driver.park(None).expect("park");
    let s = ring.stats();
    let late = (s.batch_waits_untimed, s.batch_waits_timed, s.late_batches);
    assert_eq!(late, (1, 0, 1), "one untimed wait, late");
    assert_eq!(ring.timed_waits_left.get(), super::BATCH_WAITS_BOUNDED);
    assert_eq!(ring.late_level.get(), 1);
    assert!(park_until(&driver, Duration::from_secs(10), || handler
        .total()
        == 4));
}

/// Slow fills in a row (each after its timed period ran out, with no
/// untimed batch on time between) double the timed period, as stalls do:
/// ops that finish late in bursts among fast ones are tried untimed ever
/// more rarely. (A fixed short period after a slow fill held the fast
/// ones again every 9 waits; a helper's review of 6071fb8.)
#[test]
fn slow_fills_in_a_row_double_the_timed_period() {
    let (_driver, ring) = driver_and_ring(64);
    let mut periods = Vec::new();
    for _ in 0..4 {
        ring.timed_waits_left.set(0);
        // Untimed, filled (40 of 32) after 5 ms; expected 32 x 20 µs.
        let (waited, bound) = (Duration::from_millis(5), Duration::from_micros(100));
        ring.note_batch(false, waited, 32 * 20_000, bound, 32, 40);
        periods.push(ring.timed_waits_left.get());
    }
    let b = super::BATCH_WAITS_BOUNDED;
    assert_eq!(periods, vec![b, 2 * b, 4 * b, 8 * b]);
    // An untimed batch on time resets the level.
    ring.timed_waits_left.set(0);
    let (waited, bound) = (Duration::from_micros(600), Duration::from_micros(100));
    ring.note_batch(false, waited, 32 * 20_000, bound, 32, 32);
    assert_eq!(ring.late_level.get(), 0);
}

#[test]
fn bound_share_scales_the_batch_by_the_bound() {
    use super::bound_share;
    let us = Duration::from_micros;
    assert_eq!(bound_share(us(100), 0, 32), 32, "no estimate: the batch");
    assert_eq!(bound_share(us(100), 50_000, 32), 32, "fills in the bound");
    assert_eq!(bound_share(us(100), 1_000_000, 32), 3, "1 ms fill: 3.2");
    assert_eq!(bound_share(us(100), 1_000_000_000, 32), 0);
    assert_eq!(bound_share(Duration::MAX, 1, 4), 4, "no overflow");
    let past_u64 = Duration::from_nanos(u64::MAX) + Duration::from_micros(1);
    assert_eq!(bound_share(past_u64, 1_000, 4), 4, "saturates, not wraps");
}

/// While a batch is being waited for, an unpark from another thread and
/// the park timeout still end the wait.
#[test]
fn unpark_and_timeout_end_a_batched_wait() {
    use plugio_executor::Driver;
    for force_no_min_timeout in [false, true] {
        let (driver, _ring, handler, _id, slow) = with_slow_reads(force_no_min_timeout, 32);
        // The timeout ends a wait with nothing completed.
        driver.park(Some(Duration::from_millis(20))).expect("park");
        // An unpark ends the next one.
        let unpark = driver.unparker();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            unpark.unpark();
        });
        driver.park(None).expect("park");
        t.join().expect("unparker");
        let (fired, _slow) = slow.finish();
        assert!(!fired, "a park outlived its timeout or the unpark");
        assert_eq!(handler.total(), 0);
        assert!(park_until(&driver, Duration::from_secs(10), || handler
            .total()
            == 32));
    }
}

/// Counts the calls of each kind a handler gets.
#[derive(Default)]
struct BatchCounter {
    batches: std::cell::RefCell<Vec<Vec<u64>>>,
    singles: Cell<u32>,
}

impl crate::CompletionHandler for BatchCounter {
    fn complete(&self, _token: u64, _result: i32) {
        self.singles.set(self.singles.get() + 1);
    }

    fn complete_batch(&self, completions: &[(u64, i32)]) {
        assert!(completions.iter().all(|&(_, r)| r == 0));
        self.batches
            .borrow_mut()
            .push(completions.iter().map(|&(t, _)| t).collect());
    }
}

#[test]
fn completions_of_one_reap_come_in_one_batch_per_handler_run() {
    use plugio_executor::Driver;
    let driver = driver_with(64);
    let (_tmp, backend) = seeded_backend();
    let a = Rc::new(BatchCounter::default());
    let b = Rc::new(BatchCounter::default());
    let (ia, ib) = (register_handler(a.clone()), register_handler(b.clone()));
    let nop = IoOp::bare(crate::OpKind::Nop);
    for t in 0..16 {
        // SAFETY: a NOP carries no memory.
        unsafe { backend.submit(&nop, ia, t) }.expect("submit");
    }
    for t in 16..32 {
        // SAFETY: as above.
        unsafe { backend.submit(&nop, ib, t) }.expect("submit");
    }
    // NOPs complete inside the submitting enter: one park reaps all 32.
    driver.park(None).expect("park");
    assert_eq!(*a.batches.borrow(), vec![(0..16).collect::<Vec<u64>>()]);
    assert_eq!(*b.batches.borrow(), vec![(16..32).collect::<Vec<u64>>()]);
    assert_eq!(a.singles.get() + b.singles.get(), 0);
    let stats = driver.ring_stats().expect("ring");
    assert!(stats.enters <= 2, "one enter for the park: {stats:?}");
}

/// A backend dropped while its ops are in flight in the kernel: its
/// registration (and descriptor) stays until they complete, then goes.
/// A FIFO in `dir` and four 8-byte reads of it submitted on `driver`'s
/// ring (entered by a park): they wait for a writer's data. Returns the
/// FIFO, the handler that records their results, their buffers (moving
/// the vector does not move them; keep it until the reads complete) and
/// the backend.
fn four_fifo_reads(
    driver: &DeviceDriver,
    dir: &std::path::Path,
) -> (
    std::path::PathBuf,
    Rc<RecordingHandler>,
    Vec<[u8; 8]>,
    crate::FileBackend,
) {
    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let handler = Rc::new(RecordingHandler::default());
    let id = register_handler(handler.clone());
    let mut bufs = vec![[0u8; 8]; 4];
    // O_RDWR on a FIFO does not block; reads wait for a writer's data.
    let backend = crate::FileBackend::fifo_for_tests(&fifo).expect("open fifo");
    let iovs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: 8,
        })
        .collect();
    for (i, iov) in iovs.iter().enumerate() {
        let op = IoOp::read(0, std::slice::from_ref(iov));
        // SAFETY: the buffers go back to the caller, who keeps them
        // until the reads complete; the iovecs live until the park below
        // has submitted the reads.
        unsafe { backend.submit(&op, id, i as u64) }.expect("submit");
    }
    plugio_executor::Driver::park(driver, Some(Duration::ZERO)).expect("park");
    (fifo, handler, bufs, backend)
}

#[test]
fn backend_dropped_with_ops_in_flight_completes_them_then_releases_its_file() {
    use plugio_executor::Driver;
    use std::os::fd::AsRawFd;
    let (driver, ring) = driver_and_ring(64);
    let dir = tempfile::tempdir().expect("dir");
    let (fifo, handler, bufs, backend) = four_fifo_reads(&driver, dir.path());
    assert_eq!(ring.in_flight(), 4);
    drop(backend);
    // Swept at these parks only if nothing names it: it must stay.
    driver.park(Some(Duration::ZERO)).expect("park");
    driver.park(Some(Duration::ZERO)).expect("park");
    assert_eq!(
        ring.registered_file_count(),
        1,
        "kept while ops are in flight"
    );
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .expect("writer");
    let data = [9u8; 32];
    // SAFETY: writes from a live buffer to an open FIFO.
    let n = unsafe { libc::write(writer.as_raw_fd(), data.as_ptr().cast(), 32) };
    assert_eq!(n, 32);
    assert!(park_until(&driver, Duration::from_secs(10), || handler
        .total()
        == 4));
    for i in 0..4 {
        assert_eq!(handler.seen.borrow()[&i].1, 8);
    }
    for buf in &bufs {
        assert_eq!(*buf, [9u8; 8]);
    }
    driver.park(Some(Duration::ZERO)).expect("park");
    assert_eq!(ring.registered_file_count(), 0, "released once idle");
}

/// A driver dropped with ops that would never complete on their own
/// (reads of a FIFO nobody writes) cancels them after a second of its
/// drain and ends; it waited forever, holding the runtime's shutdown. The
/// cancelled ops are delivered with ECANCELED before their memory goes.
#[test]
fn a_driver_dropped_with_ops_that_never_complete_cancels_them() {
    let (driver, ring) = driver_and_ring(64);
    let dir = tempfile::tempdir().expect("dir");
    let (_fifo, handler, bufs, backend) = four_fifo_reads(&driver, dir.path());
    assert_eq!(ring.in_flight(), 4);
    drop(ring);
    let (tx, rx) = std::sync::mpsc::channel();
    // A drop that never returns fails the whole test binary, not just
    // this test, rather than hang it.
    let watchdog = std::thread::spawn(move || {
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            // Past the test harness's capture, which exit would lose.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "the driver's drop did not return in 30 s (it waited forever)"
            );
            std::process::exit(101);
        }
    });
    drop(driver);
    tx.send(()).expect("send");
    watchdog.join().expect("in time");
    assert_eq!(handler.total(), 4, "every op delivered");
    for i in 0..4 {
        assert_eq!(handler.seen.borrow()[&i].1, -libc::ECANCELED, "op {i}");
    }
    drop(backend);
    drop(bufs);
}

#[test]
fn batch_policy_adapts_to_the_completion_interval_and_the_cap() {
    let (driver, ring) = driver_and_ring(64);
    let cap = RingConfig::default().batch_wait;
    if !ring.info().ext_arg {
        // Kernels before 5.11 wait with a timeout SQE: no batching.
        assert_eq!(ring.batch_policy(100).0, 1);
        return;
    }
    // Fresh ring (interval unknown = 0): batch, shortest bound.
    let (want, bound) = ring.batch_policy(100);
    assert_eq!(want, 32);
    assert_eq!(bound, super::BATCH_WAIT_MIN);
    // At most half of what is in flight (rounded up): the rest keeps the
    // device busy while the core handles the batch and refills.
    assert_eq!(ring.batch_policy(64).0, 32);
    assert_eq!(ring.batch_policy(40).0, 20);
    assert_eq!(ring.batch_policy(5), (3, super::BATCH_WAIT_MIN));
    assert_eq!(ring.batch_policy(2).0, 1, "two ops: wait for the first");
    assert_eq!(ring.batch_policy(1).0, 1, "one op: nothing to batch");
    // Completions every 1 µs: twice the fill time of 32.
    ring.completion_interval_ns.set(1_000);
    assert_eq!(ring.batch_policy(100), (32, Duration::from_micros(64)));
    // The bound is twice the fill time of the halved batch.
    assert_eq!(ring.batch_policy(40), (20, Duration::from_micros(40)));
    // Every 20 µs: the fill time is past the cap, which bounds the wait.
    ring.completion_interval_ns.set(20_000);
    assert_eq!(ring.batch_policy(100), (32, cap));
    // Slower than one per cap: a batch could not fill, wait for one.
    ring.completion_interval_ns.set(cap.as_nanos() as u64);
    assert_eq!(ring.batch_policy(100).0, 1);
    // Observed waits move the estimate.
    ring.completion_interval_ns.set(0);
    ring.observe(Duration::from_micros(80), 8);
    assert_eq!(ring.completion_interval_ns.get(), 10_000 / 8);
    ring.observe(Duration::from_secs(5), 1);
    assert!(ring.completion_interval_ns.get() <= 10 * cap.as_nanos() as u64 / 8 + 10_000);
    // batch_wait = 0 disables batching.
    drop(ring);
    drop(driver);
    let driver = DeviceDriver::with_ring(&RingConfig {
        batch_wait: Duration::ZERO,
        ..RingConfig::default()
    })
    .expect("ring");
    let ring = driver.ring().expect("ring").clone();
    assert_eq!(ring.batch_policy(100).0, 1);
}

/// A batch written through an `SqSession` (the SQ held for the batch,
/// its tail published once): 40 reads into a 16-entry SQ, so that the SQ
/// fills mid-session and the rest wait in the backlog, submitted when the
/// session ends; the session declines a PREFLUSH read as the writer does.
/// Every op completes exactly once with its data; after the session the
/// writer and the backend push again.
#[test]
fn sq_session_batch_over_a_full_sq_completes_once() {
    let (driver, ring) = driver_and_ring(16);
    let (_tmp, backend) = seeded_backend();
    let handler = Rc::new(RecordingHandler::default());
    let id = register_handler(handler.clone());
    let mut bufs: Vec<DmaBuf> = (0..41).map(|_| DmaBuf::heap(BLOCK, BLOCK)).collect();
    let iovs: Vec<libc::iovec> = bufs.iter_mut().map(|b| b.iovec(BLOCK)).collect();
    backend.with_sq_writer(id, &mut |w| {
        let w = w.expect("a file backend on a ring has a writer");
        let written = w.session(|s| {
            let mut n = 0;
            for (i, iov) in iovs.iter().take(40).enumerate() {
                let off = (i as u64 % FILE_BLOCKS) * BLOCK as u64;
                // SAFETY: bufs and iovs outlive the park loop below,
                // which waits for every completion.
                let sent = unsafe {
                    s.try_submit_one(
                        crate::OpKind::Read,
                        IoFlags::NONE,
                        off,
                        BLOCK as u64,
                        *iov,
                        None,
                        i as u64,
                    )
                };
                n += usize::from(sent);
            }
            // SAFETY: declined, nothing written.
            let declined = unsafe {
                s.try_submit_one(
                    crate::OpKind::Read,
                    IoFlags::PREFLUSH,
                    0,
                    BLOCK as u64,
                    iovs[0],
                    None,
                    99,
                )
            };
            assert!(!declined);
            n
        });
        assert_eq!(written, 40);
        assert_eq!(ring.direct_in_flight.get(), 40);
        // After the session: the writer pushes again.
        let op = IoOp::read(0, std::slice::from_ref(&iovs[40]));
        // SAFETY: as above.
        assert!(unsafe { w.try_submit_direct(&op, 40) });
    });
    assert!(park_until(&driver, Duration::from_secs(20), || handler
        .total()
        == 41));
    assert!(handler.duplicates().is_empty());
    let seen = handler.seen.borrow();
    for (i, buf) in bufs.iter().enumerate() {
        let block = if i == 40 { 0 } else { i as u64 % FILE_BLOCKS };
        assert_eq!(seen[&(i as u64)].1, BLOCK as i32, "token {i}");
        assert_eq!(buf.as_slice(), &block_pattern(block)[..], "token {i}");
    }
    assert!(ring.stats().sq_full > 0, "{:?}", ring.stats());
    assert_eq!(ring.ops_in_flight(), 0);
}

/// A batch written through the backend's `SqWriter` (ring and file found
/// once): every op completes exactly once with its data, without a ring
/// slot; the writer declines a PREFLUSH write and a token over 48 bits,
/// which then take the backend's way (a slot) and complete too. Off the
/// ring (a sync-pool backend) the writer is `None`.
#[test]
fn sq_writer_batch_completes_once_and_falls_back_where_it_must() {
    let (driver, ring) = driver_and_ring(16);
    let (_tmp, backend) = seeded_backend();
    let handler = Rc::new(RecordingHandler::default());
    let id = register_handler(handler.clone());
    let mut bufs: Vec<DmaBuf> = (0..40).map(|_| DmaBuf::heap(BLOCK, BLOCK)).collect();
    let iovs: Vec<libc::iovec> = bufs.iter_mut().map(|b| b.iovec(BLOCK)).collect();
    let mut data = DmaBuf::heap(BLOCK, BLOCK);
    data.as_mut_slice().copy_from_slice(&block_pattern(5));
    let data_iov = [data.iovec(BLOCK)];
    let mut writers = 0;
    backend.with_sq_writer(id, &mut |w| {
        let w = w.expect("a file backend on a ring has a writer");
        writers += 1;
        for (i, iov) in iovs.iter().enumerate() {
            let op = IoOp::read(
                (i as u64 % FILE_BLOCKS) * BLOCK as u64,
                std::slice::from_ref(iov),
            );
            // SAFETY: bufs and iovs outlive the park loop below, which
            // waits for every completion.
            assert!(unsafe { w.try_submit_direct(&op, i as u64) });
        }
        // Needs a linked fdatasync (a slot), and a token over 48 bits a
        // slot too: the writer declines both, and they go the backend's
        // way.
        let flush_write = IoOp::write(5 * BLOCK as u64, &data_iov).with_flags(IoFlags::PREFLUSH);
        let far = IoOp::read(0, std::slice::from_ref(&iovs[0]));
        for (op, token) in [(&flush_write, 1000), (&far, 1 << 50)] {
            // SAFETY: as above (data and bufs outlive the park loop).
            assert!(!unsafe { w.try_submit_direct(op, token) });
            // SAFETY: as above.
            unsafe { backend.submit_direct(op, id, token) }.expect("submit");
        }
        // The 40 reads went without a slot; the last two took one each.
        assert_eq!(ring.direct_in_flight.get(), 40);
        assert_eq!(ring.slots.borrow().len(), 2);
    });
    assert_eq!(writers, 1);
    assert!(park_until(&driver, Duration::from_secs(20), || handler
        .total()
        == 42));
    assert!(handler.duplicates().is_empty());
    let seen = handler.seen.borrow();
    for (i, buf) in bufs.iter().enumerate() {
        assert_eq!(seen[&(i as u64)].1, BLOCK as i32, "token {i}");
        assert_eq!(buf.as_slice(), &block_pattern(i as u64)[..], "token {i}");
    }
    assert_eq!(seen[&1000].1, BLOCK as i32);
    assert_eq!(seen[&(1 << 50)].1, BLOCK as i32);
    assert!(ring.stats().sq_full > 0, "{:?}", ring.stats());
    assert_eq!(ring.ops_in_flight(), 0);
    drop(seen);

    let tmp = seeded_file();
    let pool = OpenOptions::new()
        .backend(crate::BackendKind::Sync)
        .open(tmp.path())
        .expect("open");
    let mut none = 0;
    pool.with_sq_writer(id, &mut |w| {
        assert!(w.is_none(), "a sync-pool backend writes no SQEs");
        none += 1;
    });
    assert_eq!(none, 1);
}

/// A read and a write of several segments that all lie in one registered
/// buffer (`IoOp::fixed_buf`) go as `READV_FIXED`/`WRITEV_FIXED` where the
/// ring has them, counted in `fixed_buf_sqes`, and as plain `READV`/
/// `WRITEV` (not counted) on a ring without them (forced here); the data
/// is right both ways.
#[test]
fn several_segments_in_one_registered_buffer_go_vectored_fixed_or_plain() {
    let (driver, ring) = driver_and_ring(16);
    let (tmp, backend) = seeded_backend();
    let handler = Rc::new(RecordingHandler::default());
    let id = register_handler(handler.clone());
    let Some(mut region) = DmaBuf::registered(4 * BLOCK, BLOCK) else {
        eprintln!("buffer registration refused here (memlock): nothing to check");
        return;
    };
    let index = region
        .fixed_index()
        .expect("a registered buffer has an index");
    let probed = ring.vectored_fixed();
    for (round, vectored) in [(0u64, probed), (1, false)] {
        ring.vectored_fixed.set(vectored);
        let base = region.as_mut_slice().as_mut_ptr();
        // Blocks 2 and 3 of the region, then 0: three runs of memory
        // apart, read from file blocks 8..11 (round 0) or 12..15.
        let iovs: Vec<libc::iovec> = [2usize, 0, 3]
            .iter()
            .map(|&b| libc::iovec {
                // SAFETY: inside the 4-block region.
                iov_base: unsafe { base.add(b * BLOCK) }.cast(),
                iov_len: BLOCK,
            })
            .collect();
        let first = 8 + 4 * round;
        let mut read = IoOp::read(first * BLOCK as u64, &iovs);
        read.fixed_buf = Some(index);
        let before = ring.stats().fixed_buf_sqes;
        backend.with_sq_writer(id, &mut |w| {
            let w = w.expect("a file backend on a ring has a writer");
            assert_eq!(w.vectored_fixed(), vectored);
            // SAFETY: the region outlives the park below, which waits for
            // the completion.
            assert!(unsafe { w.try_submit_direct(&read, 10 + round) });
        });
        assert_eq!(
            ring.stats().fixed_buf_sqes - before,
            u64::from(vectored),
            "vectored fixed: {vectored}"
        );
        assert!(park_until(&driver, Duration::from_secs(20), || handler
            .total()
            == 2 * round + 1));
        assert_eq!(handler.seen.borrow()[&(10 + round)].1, 3 * BLOCK as i32);
        for (i, b) in [2usize, 0, 3].iter().enumerate() {
            assert_eq!(
                &region.as_slice()[b * BLOCK..(b + 1) * BLOCK],
                &block_pattern(first + i as u64)[..],
                "round {round}, region block {b}"
            );
        }
        // The same three runs written to blocks 40..43 (or 44..47).
        let at = 40 + 4 * round;
        let mut write = IoOp::write(at * BLOCK as u64, &iovs);
        write.fixed_buf = Some(index);
        // SAFETY: as above.
        unsafe { backend.submit_direct(&write, id, 20 + round) }.expect("submit");
        assert!(park_until(&driver, Duration::from_secs(20), || handler
            .total()
            == 2 * round + 2));
        assert_eq!(handler.seen.borrow()[&(20 + round)].1, 3 * BLOCK as i32);
        for i in 0..3u64 {
            let mut got = vec![0u8; BLOCK];
            backend_file(&tmp)
                .read_exact_at(&mut got, (at + i) * BLOCK as u64)
                .expect("read back");
            assert_eq!(
                got,
                block_pattern(first + i),
                "round {round}, file block {}",
                at + i
            );
        }
    }
    assert_eq!(ring.ops_in_flight(), 0);
}

fn backend_file(tmp: &tempfile::NamedTempFile) -> std::fs::File {
    std::fs::File::open(tmp.path()).expect("open")
}

/// `with_sq_writer` is a safe method that runs the caller's code while it
/// holds the thread's ring: if that code drops the thread's driver, the
/// ring stays alive until the call returns (the writer holds a strong
/// count of its own), and nothing is used after it is freed. (With the
/// ring borrowed from the thread-local instead, debug builds panicked
/// here and release builds would read freed memory.)
#[test]
fn dropping_the_driver_inside_the_sq_writer_callback_is_sound() {
    let (driver, ring) = driver_and_ring(8);
    let (_tmp, backend) = seeded_backend();
    let handler = Rc::new(RecordingHandler::default());
    let id = register_handler(handler);
    // Only the driver and the writer hold the ring from here on.
    drop(ring);
    let mut driver = Some(driver);
    let mut calls = 0;
    backend.with_sq_writer(id, &mut |w| {
        assert!(w.is_some());
        calls += 1;
        drop(driver.take());
    });
    assert_eq!(calls, 1);
    assert!(!crate::driver::uring_active(), "the driver is gone");
    // Without a ring now: the backend says so.
    backend.with_sq_writer(id, &mut |w| {
        assert!(w.is_none());
        calls += 1;
    });
    assert_eq!(calls, 2);
}

/// `set_user_data` writes the field `Entry::user_data` sets, and nothing
/// else: the direct path's in-place store matches io-uring's builder on
/// every opcode shape it patches (the offset is the kernel ABI's).
#[test]
fn user_data_set_in_place_equals_the_builder() {
    use io_uring::{opcode, squeue, types};
    let entries: [squeue::Entry; 3] = [
        opcode::Nop::new().build(),
        opcode::Read::new(types::Fd(7), std::ptr::null_mut(), 4096)
            .offset(1 << 20)
            .build(),
        opcode::Fsync::new(types::Fixed(3)).build(),
    ];
    let raw = |e: &squeue::Entry| -> [u8; 64] {
        // SAFETY: a `squeue::Entry` is the 64 bytes of an io_uring_sqe
        // (checked at compile time in `set_user_data`), all initialized by
        // its builder.
        unsafe { std::mem::transmute_copy(e) }
    };
    for e in entries {
        let ud = 0x4000_1234_5678_9abc;
        let mut patched = e.clone();
        super::set_user_data(&mut patched, ud);
        assert_eq!(patched.get_user_data(), ud);
        assert_eq!(raw(&patched), raw(&e.user_data(ud)));
    }
}

/// The ring slot table's lock, held by another thread at a fork (as a
/// ring being built or dropped there holds it): a ring built in the child
/// does not wait for it (it waited forever before: the child inherits the
/// lock but not its holder).
#[test]
fn a_ring_slot_lock_held_at_the_fork_does_not_stop_the_childs_rings() {
    let hold = || super::RING_SLOTS.get().lock().unwrap();
    let child = crate::testing::while_another_thread_holds(hold, || {
        crate::testing::in_forked_child(20, || {
            let ring = super::Ring::new(&RingConfig::default()).map_err(|e| e.to_string())?;
            let slot = ring.cache_slot;
            drop(ring);
            // The child's own table: its first ring takes slot 0.
            (slot == 0)
                .then_some(())
                .ok_or(format!("the child's first ring took slot {slot}"))
        })
    });
    child.unwrap();
}

/// A parent's ring dropped in a forked child (as dropping the parent's
/// runtime there does) leaves the child's slot table alone: before, its
/// drop freed its slot number in the child's table, where a live ring of
/// the child held it, and the next ring took the same slot (found by a
/// break-it helper).
#[test]
fn a_parents_ring_dropped_in_the_child_frees_no_slot_of_the_childs() {
    let parent_ring = super::Ring::new(&RingConfig::default()).unwrap();
    let stale_slot = parent_ring.cache_slot;
    let child = crate::testing::in_forked_child(20, move || {
        let mut live: Vec<super::Ring> = Vec::new();
        // Child rings until one holds the parent ring's slot number.
        while live.last().is_none_or(|r| r.cache_slot != stale_slot) {
            live.push(super::Ring::new(&RingConfig::default()).map_err(|e| e.to_string())?);
        }
        drop(parent_ring);
        let next = super::Ring::new(&RingConfig::default()).map_err(|e| e.to_string())?;
        match live.iter().find(|r| r.cache_slot == next.cache_slot) {
            None => Ok(()),
            Some(r) => Err(format!(
                "two live rings of the child hold slot {}",
                r.cache_slot
            )),
        }
    });
    child.unwrap();
}

/// Sizes the kernel refuses with a bare `EINVAL` are refused first, with
/// the option named, and the driver is not installed: a bad size is not
/// taken for a kernel without io_uring, which falls back to the sync
/// thread pool (found by an API audit helper: `sq_entries: 0` ran every
/// IO on the pool, logging only a warning).
#[test]
fn ring_sizes_out_of_range_are_refused_not_taken_for_no_io_uring() {
    for (config, field) in [
        (
            RingConfig {
                sq_entries: 0,
                ..RingConfig::default()
            },
            "sq_entries",
        ),
        (
            RingConfig {
                sq_entries: crate::MAX_SQ_ENTRIES + 1,
                ..RingConfig::default()
            },
            "sq_entries",
        ),
        (
            RingConfig {
                sq_entries: 256,
                cq_entries: Some(128),
                ..RingConfig::default()
            },
            "cq_entries",
        ),
        (
            RingConfig {
                cq_entries: Some(crate::MAX_CQ_ENTRIES + 1),
                ..RingConfig::default()
            },
            "cq_entries",
        ),
        // 0 rounds up to 1, which an SQ of 1 let through (found by a
        // break-it helper).
        (
            RingConfig {
                sq_entries: 1,
                cq_entries: Some(0),
                ..RingConfig::default()
            },
            "cq_entries",
        ),
        // An SQPOLL ring of one SQ entry: its wake read filled the SQ
        // and the first IO hung in the backlog (a break-it helper's
        // finding).
        (
            RingConfig {
                sq_entries: 1,
                sqpoll_idle_ms: Some(10),
                ..RingConfig::default()
            },
            "SQPOLL ring needs at least 2",
        ),
        // Its arithmetic overflowed at the first batched park (a debug
        // build aborted; found by a break-it helper).
        (
            RingConfig {
                batch_wait: Duration::MAX,
                ..RingConfig::default()
            },
            "batch_wait",
        ),
    ] {
        for e in [
            DeviceDriver::new(&config).expect_err("refused"),
            super::Ring::new(&config).expect_err("refused"),
        ] {
            assert!(
                matches!(
                    e.kind(),
                    crate::ErrorKind::InvalidInput(crate::InvalidInput::Config { .. })
                ),
                "{e}"
            );
            assert!(e.to_string().contains(field), "{e}");
        }
        assert!(!crate::driver::uring_active(), "no driver was installed");
    }
    // The limits themselves are accepted (a CQ rounded up to the SQ's
    // power of two too), and the driver installs after the refusals.
    for config in [
        RingConfig {
            sq_entries: 1,
            ..RingConfig::default()
        },
        RingConfig {
            sq_entries: 200,
            cq_entries: Some(129),
            ..RingConfig::default()
        },
    ] {
        config.validate().expect("in range");
    }
    RingConfig {
        sq_entries: crate::MAX_SQ_ENTRIES,
        cq_entries: Some(crate::MAX_CQ_ENTRIES),
        ..RingConfig::default()
    }
    .validate()
    .expect("the largest sizes");
    let driver = DeviceDriver::new(&RingConfig {
        sq_entries: 200,
        cq_entries: Some(129),
        ..RingConfig::default()
    })
    .expect("driver");
    if let Some(ring) = driver.ring() {
        assert_eq!((ring.info().sq_entries, ring.info().cq_entries), (256, 256));
    }
}

/// `RingInfo`'s lines and `plugio info`'s io_uring section show the same
/// fields and values, each layout in one column (`info` indents them
/// under its heading).
#[test]
fn ring_info_lines_and_plugio_info_show_the_same_fields() {
    let info = crate::RingInfo {
        sq_entries: 64,
        cq_entries: 128,
        coop_taskrun: true,
        iopoll: true,
        supported_ops: vec!["NOP", "READ"],
        ..crate::RingInfo::default()
    };
    let shown = info.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), info.fields().len(), "{shown}");
    for (line, (name, value)) in lines.iter().zip(info.fields()) {
        assert_eq!(
            line.get(..21).map(str::trim_end),
            Some(&*format!("{name}:"))
        );
        assert_eq!(&line[21..], value, "{line}");
    }
    assert!(
        shown.contains("setup flags:         COOP_TASKRUN IOPOLL"),
        "{shown}"
    );
    assert!(shown.ends_with("unsupported ops:     none"), "{shown}");
    let tmp = tempfile::NamedTempFile::new().expect("temp file");
    let described = crate::describe(tmp.path()).expect("describe");
    let Some((_, section)) = described.split_once("io_uring:\n") else {
        return assert!(described.contains("unavailable"), "{described}");
    };
    let names: Vec<&str> = section.lines().map(|l| l[..21].trim()).collect();
    let expected: Vec<String> = info.fields().iter().map(|(n, _)| format!("{n}:")).collect();
    assert_eq!(names, expected, "{described}");
}
