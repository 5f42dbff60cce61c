//! `--engine psync`: `pread`/`pwrite` on `iodepth` threads per job, each
//! with one reused aligned buffer: the blocking baseline. A job's threads
//! are pinned to the job's CPU (one core per job, as for every engine).
//!
//! Invariant: thread `i` writes only worker counter `i`.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use plugio_device::DmaBuf;
use rand::RngCore;

use super::error::BenchError;
use super::options::Job;
use super::output::EngineOutput;
use super::stats::{Counters, Dir, IoBudget, IoPattern, Latencies, Sampler};
use super::target::Target;

const NAME: &str = "psync";

/// Opens the target for `job` (O_DIRECT as asked).
///
/// # Errors
/// The open failed.
pub fn open_target(job: &Job, target: &Target) -> Result<std::fs::File, BenchError> {
    let mut o = OpenOptions::new();
    o.read(true).write(job.writes());
    if job.direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(&target.path)
        .map_err(|e| BenchError::io(format!("open {}", plugio_cli::shown::path(&target.path)), e))
}

/// One positional IO of `buf.len()` bytes; returns the bytes moved.
///
/// # Errors
/// The OS error, or a short count (the target is a multiple of `bs`).
pub fn pio(file: &std::fs::File, dir: Dir, buf: &mut DmaBuf, offset: u64) -> Result<usize, String> {
    let len = buf.len();
    let r = match dir {
        Dir::Read => file.read_at(buf.as_mut_slice(), offset),
        Dir::Write => file.write_at(buf.as_slice(), offset),
    };
    match r {
        Ok(n) if n == len => Ok(n),
        Ok(n) => Err(format!("short {dir:?}: {n} of {len} bytes at {offset}")),
        Err(e) => Err(format!("{dir:?} at {offset}: {e}")),
    }
}

/// A buffer for `job` with random contents (so writes write data).
pub fn job_buf(job: &Job) -> DmaBuf {
    let mut b = DmaBuf::heap(job.bs_bytes as usize, 4096);
    rand::thread_rng().fill_bytes(b.as_mut_slice());
    b
}

/// Runs `iodepth * numjobs` threads until stopped.
///
/// # Errors
/// Open or an IO failed.
pub fn run(
    job: &Job,
    target: &Target,
    counters: &Arc<Counters>,
) -> Result<EngineOutput, BenchError> {
    let file = open_target(job, target)?;
    let threads = job.cores * job.iodepth as usize;
    // Job j's threads all run on the job's CPU, so that a job is one core
    // as for the other engines.
    let cpus = plugio_executor::allowed_cpus().unwrap_or_default();
    // One budget per job, shared by the job's threads.
    let budgets: Vec<IoBudget> = (0..job.cores)
        .map(|_| IoBudget::new(job.number_ios))
        .collect();
    let results: Vec<Result<Latencies, String>> = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(threads);
        let mut spawn_err = None;
        for i in 0..threads {
            let (file, thread_counters) = (&file, counters.clone());
            let core = i / job.iodepth as usize;
            let budget = &budgets[core];
            let cursor = Arc::new(AtomicU64::new(IoPattern::start_block(
                job,
                target.size_bytes,
                core,
            )));
            let mut pattern = IoPattern::new(job, target.size_bytes, i as u64 + 1, cursor);
            let cpu = (!cpus.is_empty()).then(|| cpus[core % cpus.len()]);
            let started = std::thread::Builder::new().spawn_scoped(s, move || {
                super::engine_raw::pin_to(cpu);
                let mut buf = job_buf(job);
                let mut sampler = Sampler::new(job.clat_sample);
                let mut hist = Latencies::default();
                let worker = thread_counters.worker(i);
                thread_counters.mark_started();
                while !thread_counters.stopped() && budget.take_shared() {
                    let (dir, offset) = pattern.next_io();
                    let t0 = sampler.start();
                    let n = pio(file, dir, &mut buf, offset)?;
                    worker.add_io(dir, n as u64);
                    if let Some(t0) = t0 {
                        hist.record(dir, t0.elapsed());
                    }
                }
                // The last thread to end closes the window, before
                // the buffers are freed.
                thread_counters.mark_ended();
                Ok(hist)
            });
            match started {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The threads already started end at their next IO.
                    counters.request_stop();
                    spawn_err = Some(format!(
                        "starting IO thread {} of {threads}: {e}: the machine takes no more \
                         threads; lower --iodepth or --numjobs (psync runs one thread per IO \
                         in flight)",
                        i + 1
                    ));
                    break;
                }
            }
        }
        let mut results: Vec<Result<Latencies, String>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect();
        results.extend(spawn_err.map(Err));
        results
    });
    let mut latency = Latencies::default();
    for r in results {
        latency.merge(&r.map_err(|e| BenchError::engine(NAME, e))?);
    }
    Ok(EngineOutput {
        latency,
        notes: Vec::new(),
        iostats: None,
    })
}
