//! `--engine raw`: a plain io_uring loop with the `io-uring` crate and no
//! executor, in the manner of fio's t/io_uring: one ring per core, SQEs
//! prepared in batches of 32, one `io_uring_enter` that submits a batch and
//! waits for a batch, registered (fixed) buffers and files. With `--nop`
//! it issues `IORING_OP_NOP`.
//!
//! Invariants: a slot (its buffer and its `user_data`) is in the kernel's
//! hands from the push of its SQE until its CQE is reaped, and the ring is
//! drained (every slot back) before the buffers are dropped; each worker
//! thread writes only its own counters.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use io_uring::{opcode, squeue, types, IoUring};
use plugio_device::DmaBuf;
use rand::RngCore;

use super::error::BenchError;
use super::options::Job;
use super::output::EngineOutput;
use super::stats::{self, Counters, Dir, IoBudget, IoPattern, Latencies, Sampler};
use super::target::Target;

const NAME: &str = "raw";

/// SQEs prepared per enter (t/io_uring's default `-s 32`).
pub const BATCH_SUBMIT: usize = 32;

/// CQEs waited for per enter (t/io_uring's default `-c 32`).
pub const BATCH_COMPLETE: usize = 32;

/// What a worker thread returns: its latencies and its notes.
/// `user_data` is the slot, with this bit set for a write (the report
/// counts reads and writes apart).
const WRITE_SHIFT: u32 = 32;
const SLOT_MASK: u64 = (1 << WRITE_SHIFT) - 1;

type WorkerResult = Result<(Latencies, Vec<String>), BenchError>;

/// Runs the raw io_uring loop on `job.cores` threads until stopped.
///
/// # Errors
/// Ring setup, open, or an IO failed.
pub fn run(
    job: &Job,
    target: Option<&Target>,
    counters: &Arc<Counters>,
) -> Result<EngineOutput, BenchError> {
    let cpus = plugio_executor::allowed_cpus().unwrap_or_default();
    let results: Vec<WorkerResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..job.cores)
            .map(|core| {
                let cpu = (!cpus.is_empty()).then(|| cpus[core % cpus.len()]);
                let counters = counters.clone();
                s.spawn(move || {
                    pin_to(cpu);
                    let mut w = Worker::new(job, target, core, counters)?;
                    w.counters.mark_started();
                    w.run()?;
                    // Before the ring and the buffers go: the last worker
                    // to end closes the window.
                    w.counters.mark_ended();
                    Ok((stats::take_latency(), w.notes))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(BenchError::engine(NAME, "a worker thread panicked")))
            })
            .collect()
    });
    let mut latency = Latencies::default();
    let mut notes = Vec::new();
    for r in results {
        let (h, n) = r?;
        latency.merge(&h);
        for note in n {
            if !notes.contains(&note) {
                notes.push(note);
            }
        }
    }
    Ok(EngineOutput {
        latency,
        notes,
        iostats: None,
    })
}

/// Pins the calling thread to `cpu` (best effort).
pub fn pin_to(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        let mut set = nix::sched::CpuSet::new();
        if set.set(cpu).is_ok() {
            let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
        }
    }
}

/// Builds a ring with SINGLE_ISSUER + DEFER_TASKRUN, falling back to
/// COOP_TASKRUN and then to no flags (the same ladder as plugio's rings).
fn build_ring(entries: u32) -> Result<IoUring, BenchError> {
    let mut last = None;
    for level in [2, 1, 0] {
        let mut b = IoUring::builder();
        match level {
            2 => {
                b.setup_single_issuer().setup_defer_taskrun();
            }
            1 => {
                b.setup_coop_taskrun();
            }
            _ => {}
        }
        match b.build(entries) {
            Ok(r) => return Ok(r),
            Err(e) => last = Some(e),
        }
    }
    Err(BenchError::engine(
        NAME,
        format!(
            "io_uring_setup: {}",
            last.map_or("unknown".into(), |e| e.to_string())
        ),
    ))
}

/// One core's ring, file, buffers and slots.
struct Worker<'a> {
    job: &'a Job,
    ring: IoUring,
    file: Option<File>,
    fixed_file: bool,
    fixed_bufs: bool,
    bufs: Vec<DmaBuf>,
    /// Start time of each slot's IO when sampled.
    started: Vec<Option<Instant>>,
    free: Vec<u32>,
    pattern: Option<IoPattern>,
    sampler: Sampler,
    /// `--number_ios`: IOs this worker may still issue.
    budget: IoBudget,
    counters: Arc<Counters>,
    core: usize,
    notes: Vec<String>,
    enters: u64,
    submitted: u64,
    reaped: u64,
}

impl<'a> Worker<'a> {
    fn new(
        job: &'a Job,
        target: Option<&Target>,
        core: usize,
        counters: Arc<Counters>,
    ) -> Result<Worker<'a>, BenchError> {
        let depth = job.iodepth as usize;
        let ring = build_ring((depth as u32).clamp(32, 4096).next_power_of_two())?;
        let mut w = Worker {
            job,
            ring,
            file: None,
            fixed_file: false,
            fixed_bufs: false,
            bufs: Vec::new(),
            started: vec![None; depth],
            free: (0..depth as u32).rev().collect(),
            pattern: None,
            sampler: Sampler::new(job.clat_sample),
            budget: IoBudget::new(job.number_ios),
            counters,
            core,
            notes: Vec::new(),
            enters: 0,
            submitted: 0,
            reaped: 0,
        };
        if let (Some(t), false) = (target, job.nop) {
            w.open(t)?;
        }
        Ok(w)
    }

    /// Opens the target, registers it and the buffers where asked.
    fn open(&mut self, t: &Target) -> Result<(), BenchError> {
        let job = self.job;
        let mut o = OpenOptions::new();
        o.read(true).write(job.writes());
        if job.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        let file = o
            .open(&t.path)
            .map_err(|e| BenchError::io(format!("open {}", plugio_cli::shown::path(&t.path)), e))?;
        if file
            .metadata()
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        {
            // No atime checks per read of a block device, as plugio's file
            // backend (and fio, for files that are not regular) asks.
            plugio_device::backend::file::skip_atime(&file);
        }
        if job.register_files {
            match self.ring.submitter().register_files(&[file.as_raw_fd()]) {
                Ok(()) => self.fixed_file = true,
                Err(e) => self
                    .notes
                    .push(format!("raw: registered files refused ({e}); using the fd")),
            }
        }
        let mut rng = rand::thread_rng();
        self.bufs = (0..job.iodepth)
            .map(|_| {
                let mut b = DmaBuf::heap(job.bs_bytes as usize, 4096);
                rng.fill_bytes(b.as_mut_slice());
                b
            })
            .collect();
        if job.fixed_bufs {
            let iovecs: Vec<libc::iovec> = self
                .bufs
                .iter_mut()
                .map(|b| libc::iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                })
                .collect();
            // SAFETY: the buffers live in `self.bufs`, are never moved or
            // freed while registered (they are dropped with the worker,
            // after the ring has been drained), and each iovec covers
            // exactly one buffer's allocation.
            match unsafe { self.ring.submitter().register_buffers(&iovecs) } {
                Ok(()) => self.fixed_bufs = true,
                Err(e) => self.notes.push(format!(
                    "raw: fixed buffers refused ({e}; RLIMIT_MEMLOCK?); using plain reads"
                )),
            }
        }
        let cursor = Arc::new(AtomicU64::new(IoPattern::start_block(
            job,
            t.size_bytes,
            self.core,
        )));
        self.pattern = Some(IoPattern::new(
            job,
            t.size_bytes,
            self.core as u64 + 1,
            cursor,
        ));
        self.file = Some(file);
        Ok(())
    }

    /// The SQE for slot `slot`.
    fn sqe(&mut self, slot: u32) -> squeue::Entry {
        let (Some(pattern), Some(file)) = (self.pattern.as_mut(), self.file.as_ref()) else {
            return opcode::Nop::new().build().user_data(u64::from(slot));
        };
        let (dir, offset) = pattern.next_io();
        let buf = &mut self.bufs[slot as usize];
        let (ptr, len) = (buf.as_mut_ptr(), buf.len() as u32);
        let fd = file.as_raw_fd();
        let e = match (dir, self.fixed_bufs, self.fixed_file) {
            (Dir::Read, true, true) => {
                opcode::ReadFixed::new(types::Fixed(0), ptr, len, slot as u16)
                    .offset(offset)
                    .build()
            }
            (Dir::Read, true, false) => {
                opcode::ReadFixed::new(types::Fd(fd), ptr, len, slot as u16)
                    .offset(offset)
                    .build()
            }
            (Dir::Read, false, true) => opcode::Read::new(types::Fixed(0), ptr, len)
                .offset(offset)
                .build(),
            (Dir::Read, false, false) => opcode::Read::new(types::Fd(fd), ptr, len)
                .offset(offset)
                .build(),
            (Dir::Write, true, true) => {
                opcode::WriteFixed::new(types::Fixed(0), ptr, len, slot as u16)
                    .offset(offset)
                    .build()
            }
            (Dir::Write, true, false) => {
                opcode::WriteFixed::new(types::Fd(fd), ptr, len, slot as u16)
                    .offset(offset)
                    .build()
            }
            (Dir::Write, false, true) => opcode::Write::new(types::Fixed(0), ptr, len)
                .offset(offset)
                .build(),
            (Dir::Write, false, false) => opcode::Write::new(types::Fd(fd), ptr, len)
                .offset(offset)
                .build(),
        };
        let write = u64::from(dir == Dir::Write) << WRITE_SHIFT;
        e.user_data(u64::from(slot) | write)
    }

    /// Prepares up to [`BATCH_SUBMIT`] SQEs; returns how many.
    fn prep(&mut self) -> usize {
        let n = BATCH_SUBMIT.min(self.free.len());
        for done in 0..n {
            if self.budget.spent() {
                return done;
            }
            let Some(slot) = self.free.pop() else {
                return done;
            };
            self.started[slot as usize] = self.sampler.start();
            let sqe = self.sqe(slot);
            // SAFETY: the SQE's buffer (slot `slot`) stays allocated and
            // untouched until its CQE is reaped (the slot is off the free
            // list until then), and the file and its registration outlive
            // every IO (`run` drains the ring before returning).
            if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                // SQ full (not expected: entries >= depth): keep the slot.
                self.started[slot as usize] = None;
                self.free.push(slot);
                return done;
            }
            // Taken only once the SQE is in the ring, so the count is exact.
            self.budget.take_local();
        }
        n
    }

    /// The loop: prep a batch, submit it and wait for a batch when the
    /// queue is full, reap, until stopped and drained.
    fn run(&mut self) -> Result<(), BenchError> {
        let depth = self.job.iodepth as usize;
        let bs = self.job.bs_bytes;
        loop {
            let stopping = self.counters.stopped() || self.budget.spent();
            let inflight = depth - self.free.len();
            if stopping && inflight == 0 {
                return Ok(());
            }
            let prepped = if stopping { 0 } else { self.prep() };
            let inflight = inflight + prepped;
            let want = if prepped == 0 || inflight >= depth {
                BATCH_COMPLETE.min(inflight)
            } else {
                0
            };
            match self.ring.submit_and_wait(want) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(e) => return Err(BenchError::engine(NAME, format!("io_uring_enter: {e}"))),
            }
            self.enters += 1;
            self.submitted += prepped as u64;
            self.reap(bs)?;
            self.counters
                .worker(self.core)
                .set_calls(self.enters, self.submitted, self.reaped);
        }
    }

    fn reap(&mut self, bs: u64) -> Result<(), BenchError> {
        let worker = self.counters.worker(self.core);
        let nop = self.job.nop;
        for cqe in self.ring.completion() {
            let slot = (cqe.user_data() & SLOT_MASK) as usize;
            let dir = if cqe.user_data() >> WRITE_SHIFT == 1 {
                Dir::Write
            } else {
                Dir::Read
            };
            let res = cqe.result();
            if res < 0 {
                return Err(BenchError::engine(
                    NAME,
                    std::io::Error::from_raw_os_error(-res),
                ));
            }
            if !nop && res as u64 != bs {
                return Err(BenchError::engine(
                    NAME,
                    format!("short IO: {res} of {bs} bytes"),
                ));
            }
            worker.add_io(dir, res as u64);
            if let Some(t0) = self.started[slot].take() {
                stats::record_latency(dir, t0.elapsed());
            }
            self.free.push(slot as u32);
            self.reaped += 1;
        }
        Ok(())
    }
}
