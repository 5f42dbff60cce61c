//! What the completion-based peers (`--engine monoio`, `tokio-uring`,
//! `compio`) share: the owned, aligned buffer they pass by value to their
//! runtime's positional read/write ([`PeerBuf`], with each runtime's buffer
//! traits), one pinned thread per job ([`run_jobs`]), and the check that
//! every IO moved the whole block ([`full`]).
//!
//! The three runtimes are optional dependencies behind the `peers` feature
//! (on by default): without it the engines exist on the command line but
//! refuse to run, saying how to build them.
//!
//! Invariants: a [`PeerBuf`]'s bytes are always all initialised (the
//! buffer starts filled with random data and IO only overwrites it), its
//! memory never moves while the struct moves (it is a heap [`DmaBuf`]), and
//! its length is the job's block size; a job's counters and latency are
//! written only by that job's thread.

#![cfg_attr(not(feature = "peers"), allow(dead_code))]

use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use plugio_device::DmaBuf;

use super::error::BenchError;
use super::options::Job;
use super::output::EngineOutput;
use super::stats::{self, Counters, Dir, IoBudget, IoPattern, Latencies, Sampler};
use super::target::Target;

/// [`Target::kind`] of an NVMe passthrough namespace (`/dev/ngXnY`).
const PASSTHROUGH_KIND: &str = "NVMe passthrough namespace";

/// One task's buffer: a 4 KiB-aligned [`DmaBuf`] of `bs` bytes, moved into
/// the runtime for each IO and handed back on completion.
#[derive(Debug)]
pub struct PeerBuf(DmaBuf);

impl PeerBuf {
    /// A buffer for `job`, filled with random bytes (so writes write data).
    pub fn for_job(job: &Job) -> PeerBuf {
        PeerBuf(super::engine_psync::job_buf(job))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.0.as_slice()
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
}

/// The kernel's largest submission queue (`IORING_MAX_ENTRIES`).
const MAX_RING_ENTRIES: u32 = 32768;

/// Ring entries for a job: the runtime's own default, or `iodepth` rounded
/// up to a power of two when that is larger (every task's IO fits), at
/// most the kernel's limit (the runtimes submit early when the queue is
/// full).
pub fn ring_entries(job: &Job, runtime_default: u32) -> u32 {
    job.iodepth
        .next_power_of_two()
        .max(runtime_default)
        .min(MAX_RING_ENTRIES)
}

/// The bytes one IO moved, or an error for a failed or short IO (the
/// target is a multiple of `bs`, so a short count is a bug or a fault).
///
/// # Errors
/// The OS error or the short count, with the direction and offset.
pub fn full(dir: Dir, offset: u64, bs: usize, r: std::io::Result<usize>) -> Result<usize, String> {
    match r {
        Ok(n) if n == bs => Ok(n),
        Ok(n) => Err(format!("short {dir:?}: {n} of {bs} bytes at {offset}")),
        Err(e) => Err(format!("{dir:?} at {offset}: {e}")),
    }
}

/// One task's loop state: the shared stop flag and IO budget, its own
/// pattern and latency sampler. A runtime's task does
/// `while let Some(io) = t.next() { ...IO...; t.done(io, result)? }`.
pub struct Task {
    counters: Arc<Counters>,
    budget: Rc<IoBudget>,
    core: usize,
    pattern: IoPattern,
    sampler: Sampler,
    bs: usize,
}

/// One IO a [`Task`] is to issue.
#[derive(Debug, Clone, Copy)]
pub struct NextIo {
    /// Read or write.
    pub dir: Dir,
    /// Byte offset (a multiple of `bs` within the target).
    pub offset: u64,
    started: Option<Instant>,
}

impl Task {
    /// The `iodepth` tasks of job `core` on a target of `size_bytes`: one
    /// pattern each (a shared cursor for sequential patterns), one budget
    /// for the job, as every other engine.
    pub fn for_job(job: &Job, size_bytes: u64, core: usize, counters: &Arc<Counters>) -> Vec<Task> {
        let cursor = Arc::new(AtomicU64::new(IoPattern::start_block(
            job, size_bytes, core,
        )));
        let budget = Rc::new(IoBudget::new(job.number_ios));
        (0..job.iodepth)
            .map(|i| Task {
                counters: counters.clone(),
                budget: budget.clone(),
                core,
                pattern: IoPattern::new(
                    job,
                    size_bytes,
                    (core as u64) << 32 | u64::from(i),
                    cursor.clone(),
                ),
                sampler: Sampler::new(job.clat_sample),
                bs: job.bs_bytes as usize,
            })
            .collect()
    }

    /// The next IO, or `None` once the run is stopped or the job's budget
    /// is spent.
    pub fn next(&mut self) -> Option<NextIo> {
        if self.counters.stopped() || !self.budget.take_local() {
            // This task's last IO is counted; the last task to get here
            // closes the measured window, before the buffers and the
            // runtime are torn down.
            self.counters.mark_ended();
            return None;
        }
        let (dir, offset) = self.pattern.next_io();
        Some(NextIo {
            dir,
            offset,
            started: self.sampler.start(),
        })
    }

    /// Counts a completed IO (and its latency when sampled).
    ///
    /// # Errors
    /// The IO failed or was short; the run is then stopped, so the job's
    /// other tasks end too.
    pub fn done(&self, io: NextIo, r: std::io::Result<usize>) -> Result<(), String> {
        let n = match full(io.dir, io.offset, self.bs, r) {
            Ok(n) => n,
            Err(e) => {
                self.counters.request_stop();
                return Err(e);
            }
        };
        self.counters.worker(self.core).add_io(io.dir, n as u64);
        if let Some(t0) = io.started {
            stats::record_latency(io.dir, t0.elapsed());
        }
        Ok(())
    }
}

/// What one job's thread hands back: its latency histogram and what it
/// could not do as asked.
pub type JobResult = Result<(Latencies, Vec<String>), String>;

/// Runs `job_main(core)` on one thread per job, pinned to the job's CPU
/// (the allowed CPUs in turn), and merges the histograms and notes they
/// return (each distinct note once) after `notes`.
///
/// # Errors
/// The target is an NVMe passthrough namespace, which these runtimes'
/// `File` cannot drive (usage, exit code 2); or the first job's error, as
/// an engine error of `name`.
pub fn run_jobs<F>(
    name: &'static str,
    job: &Job,
    target: &Target,
    mut notes: Vec<String>,
    job_main: F,
) -> Result<EngineOutput, BenchError>
where
    F: Fn(usize) -> JobResult + Sync,
{
    if target.kind == PASSTHROUGH_KIND {
        return Err(BenchError::usage(format!(
            "--engine {name} cannot drive {} (an NVMe passthrough namespace takes \
             IORING_OP_URING_CMD, which its File has no call for): pass the namespace's \
             block device (/dev/nvmeXnY) instead",
            plugio_cli::shown::path(&target.path)
        )));
    }
    let cpus = plugio_executor::allowed_cpus().unwrap_or_default();
    let job_main = &job_main;
    let results: Vec<JobResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..job.cores)
            .map(|core| {
                let cpu = (!cpus.is_empty()).then(|| cpus[core % cpus.len()]);
                std::thread::Builder::new()
                    .name(format!("{name}-bench"))
                    .spawn_scoped(s, move || {
                        super::engine_raw::pin_to(cpu);
                        job_main(core)
                    })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err("a runtime thread panicked".into())),
                Err(e) => Err(format!("starting a runtime thread: {e}")),
            })
            .collect()
    });
    let mut latency = Latencies::default();
    for r in results {
        let (hist, job_notes) = r.map_err(|e| BenchError::engine(name, e))?;
        latency.merge(&hist);
        for n in job_notes {
            if !notes.contains(&n) {
                notes.push(n);
            }
        }
    }
    Ok(EngineOutput {
        latency,
        notes,
        iostats: None,
    })
}

/// Notes for what `job` asks that runtime `name` cannot do: registered
/// (fixed) buffers and registered files (`--fixedbufs 1` and
/// `--registerfiles 1`, the defaults), given what the runtime offers for
/// positional file IO.
pub fn unsupported(
    job: &Job,
    name: &str,
    has_fixed_bufs: bool,
    has_reg_files: bool,
) -> Vec<String> {
    let mut notes = Vec::new();
    if job.fixed_bufs && !has_fixed_bufs {
        notes.push(format!(
            "{name}: no registered (fixed) buffers for file reads/writes in this runtime: \
             plain aligned buffers (--fixedbufs 1 not honoured)"
        ));
    }
    if job.register_files && !has_reg_files {
        notes.push(format!(
            "{name}: no registered files for its File: IO goes through the file descriptor \
             (--registerfiles 1 not honoured)"
        ));
    }
    notes
}

/// The error of a peer engine in a build without the `peers` feature
/// (the options refuse it first: see [`super::options::peer_not_built`]).
#[cfg(not(feature = "peers"))]
pub fn not_built(name: &str) -> BenchError {
    super::options::peer_not_built(name)
}

#[cfg(feature = "peers")]
mod buf_traits {
    //! The buffer traits of the three runtimes for [`PeerBuf`]. All three
    //! read into the whole capacity (`bytes_total`/`as_uninit`) and write
    //! the initialised bytes, which are the whole buffer (see the module
    //! invariants), so `set_init`/`set_len` have nothing to record.

    use std::mem::MaybeUninit;

    use super::PeerBuf;

    // SAFETY: the pointer is the DmaBuf's heap allocation, which stays put
    // when the PeerBuf moves (monoio pins the struct, not the bytes) and
    // lives as long as the PeerBuf; all `len` bytes are initialised.
    unsafe impl monoio::buf::IoBuf for PeerBuf {
        fn read_ptr(&self) -> *const u8 {
            self.as_slice().as_ptr()
        }

        fn bytes_init(&self) -> usize {
            self.as_slice().len()
        }
    }

    // SAFETY: as for IoBuf above; the pointer is writable for `len` bytes
    // and the buffer is never read while the kernel writes it (it is moved
    // into the runtime for the IO).
    unsafe impl monoio::buf::IoBufMut for PeerBuf {
        fn write_ptr(&mut self) -> *mut u8 {
            self.as_mut_slice().as_mut_ptr()
        }

        fn bytes_total(&mut self) -> usize {
            self.as_slice().len()
        }

        unsafe fn set_init(&mut self, _pos: usize) {
            // Every byte is already initialised (module invariant).
        }
    }

    // SAFETY: as for monoio's IoBuf: a stable heap pointer valid for `len`
    // initialised bytes while the PeerBuf lives.
    unsafe impl tokio_uring::buf::IoBuf for PeerBuf {
        fn stable_ptr(&self) -> *const u8 {
            self.as_slice().as_ptr()
        }

        fn bytes_init(&self) -> usize {
            self.as_slice().len()
        }

        fn bytes_total(&self) -> usize {
            self.as_slice().len()
        }
    }

    // SAFETY: as for tokio_uring's IoBuf; writable for `len` bytes.
    unsafe impl tokio_uring::buf::IoBufMut for PeerBuf {
        fn stable_mut_ptr(&mut self) -> *mut u8 {
            self.as_mut_slice().as_mut_ptr()
        }

        unsafe fn set_init(&mut self, _pos: usize) {
            // Every byte is already initialised (module invariant).
        }
    }

    impl compio::buf::IoBuf for PeerBuf {
        fn as_init(&self) -> &[u8] {
            self.as_slice()
        }
    }

    impl compio::buf::SetLen for PeerBuf {
        unsafe fn set_len(&mut self, _len: usize) {
            // The length stays the block size: every byte is initialised
            // (module invariant) and a short read is reported as an error.
        }
    }

    impl compio::buf::IoBufMut for PeerBuf {
        fn as_uninit(&mut self) -> &mut [MaybeUninit<u8>] {
            let s = self.as_mut_slice();
            // SAFETY: MaybeUninit<u8> has the layout of u8, and the slice
            // stays initialised: callers only write bytes into it.
            unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) }
        }
    }
}
