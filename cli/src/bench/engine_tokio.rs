//! `--engine tokio`: what tokio offers for files: each of `iodepth` tasks
//! per job loops a positional read/write on tokio's blocking thread pool
//! (`spawn_blocking`, as `tokio::fs` does internally), with one reused
//! aligned buffer that moves into the pool call and back. The runtime
//! thread and its blocking pool are pinned to the job's CPU.
//!
//! Invariant: counters and latency of a job are written only by its
//! runtime thread (after each `spawn_blocking` returns).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::engine_psync::{job_buf, open_target, pio};
use super::error::BenchError;
use super::options::Job;
use super::output::EngineOutput;
use super::stats::{self, Counters, IoBudget, IoPattern, Latencies, Sampler};
use super::target::Target;

const NAME: &str = "tokio";

/// Runs one current-thread tokio runtime per job until stopped.
///
/// # Errors
/// Runtime setup, open or an IO failed.
pub fn run(
    job: &Job,
    target: &Target,
    counters: &Arc<Counters>,
) -> Result<EngineOutput, BenchError> {
    let file = Arc::new(open_target(job, target)?);
    let cpus = plugio_executor::allowed_cpus().unwrap_or_default();
    let results: Vec<Result<Latencies, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..job.cores)
            .map(|core| {
                let (file, counters) = (file.clone(), counters.clone());
                let cpu = (!cpus.is_empty()).then(|| cpus[core % cpus.len()]);
                s.spawn(move || {
                    super::engine_raw::pin_to(cpu);
                    // The blocking pool's threads run on the job's CPU too.
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .max_blocking_threads(job.iodepth as usize)
                        .on_thread_start(move || super::engine_raw::pin_to(cpu))
                        .build()
                        .map_err(|e| format!("building the runtime: {e}"))?;
                    rt.block_on(core_main(job, target.size_bytes, file, counters, core))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a runtime thread panicked".into()))
            })
            .collect()
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

async fn core_main(
    job: &Job,
    size_bytes: u64,
    file: Arc<std::fs::File>,
    counters: Arc<Counters>,
    core: usize,
) -> Result<Latencies, String> {
    let cursor = Arc::new(AtomicU64::new(IoPattern::start_block(
        job, size_bytes, core,
    )));
    // The job's tasks all run on this current-thread runtime's thread.
    let budget = Arc::new(IoBudget::new(job.number_ios));
    let tasks: Vec<_> = (0..job.iodepth)
        .map(|i| {
            let pattern = IoPattern::new(
                job,
                size_bytes,
                (core as u64) << 32 | u64::from(i),
                cursor.clone(),
            );
            let (file, counters, budget) = (file.clone(), counters.clone(), budget.clone());
            let (buf, every) = (job_buf(job), job.clat_sample);
            tokio::task::spawn(io_task(file, counters, budget, core, pattern, buf, every))
        })
        .collect();
    counters.mark_started();
    for t in tasks {
        t.await.map_err(|e| format!("IO task: {e}"))??;
    }
    Ok(stats::take_latency())
}

async fn io_task(
    file: Arc<std::fs::File>,
    counters: Arc<Counters>,
    budget: Arc<IoBudget>,
    core: usize,
    mut pattern: IoPattern,
    mut buf: plugio_device::DmaBuf,
    every: u32,
) -> Result<(), String> {
    let mut sampler = Sampler::new(every);
    while !counters.stopped() && budget.take_local() {
        let (dir, offset) = pattern.next_io();
        let t0 = sampler.start();
        let f = file.clone();
        let (b, r) = tokio::task::spawn_blocking(move || {
            let r = pio(&f, dir, &mut buf, offset);
            (buf, r)
        })
        .await
        .map_err(|e| format!("blocking call: {e}"))?;
        buf = b;
        counters.worker(core).add_io(dir, r? as u64);
        if let Some(t0) = t0 {
            stats::record_latency(dir, t0.elapsed());
        }
    }
    // The last task to end closes the window, before the teardown.
    counters.mark_ended();
    Ok(())
}
