//! `--engine glommio`: glommio 0.9, thread-per-core on io_uring like
//! plugio: `iodepth` tasks per job on one `LocalExecutor` (pinned), each
//! looping `DmaFile::read_at_aligned` / `write_at` (O_DIRECT) or the
//! `BufferedFile` equivalents with `--direct 0`.
//!
//! glommio locks memory for its rings and IO buffers: the memlock limit is
//! raised when the process may (root), and a clear error says what to do
//! otherwise.
//!
//! Invariant: a job's counters and latency are written only by its
//! executor thread.

use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use glommio::io::{BufferedFile, DmaFile, OpenOptions};
use glommio::{LocalExecutorBuilder, Placement};
use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
use rand::RngCore;

use super::error::BenchError;
use super::options::Job;
use super::output::EngineOutput;
use super::stats::{self, Counters, Dir, IoBudget, IoPattern, Latencies, Sampler};
use super::target::Target;

const NAME: &str = "glommio";

/// The memlock limit glommio checks for (512 KiB), doubled for headroom.
const MIN_MEMLOCK_BYTES: u64 = 1 << 20;

/// glommio's default IO memory (registered buffers): 10 MiB.
const DEFAULT_IO_MEMORY_BYTES: u64 = 10 << 20;

/// Raises RLIMIT_MEMLOCK as far as the process may (unlimited as root)
/// and returns the soft limit in bytes now in force.
///
/// # Errors
/// The limit stays below what glommio needs and cannot be raised.
pub fn raise_memlock() -> Result<u64, BenchError> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK)
        .map_err(|e| BenchError::io("getrlimit(RLIMIT_MEMLOCK)", e.into()))?;
    if setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY).is_ok() {
        return Ok(RLIM_INFINITY);
    }
    if hard > soft && setrlimit(Resource::RLIMIT_MEMLOCK, hard, hard).is_ok() {
        return Ok(hard);
    }
    if soft >= MIN_MEMLOCK_BYTES {
        return Ok(soft);
    }
    Err(BenchError::engine(
        NAME,
        format!(
            "RLIMIT_MEMLOCK is {} KiB (hard {} KiB) and cannot be raised: glommio needs at \
             least {} KiB; raise the hard limit (`ulimit -l {}` in a shell with \
             CAP_SYS_RESOURCE, or `memlock` in /etc/security/limits.conf) or use another engine",
            soft >> 10,
            hard >> 10,
            MIN_MEMLOCK_BYTES >> 10,
            DEFAULT_IO_MEMORY_BYTES >> 9
        ),
    ))
}

/// Runs one glommio executor per job until stopped.
///
/// # Errors
/// Memlock, executor setup, open or an IO failed.
pub fn run(
    job: &Job,
    target: &Target,
    counters: &Arc<Counters>,
) -> Result<EngineOutput, BenchError> {
    let memlock = raise_memlock()?;
    // Registered IO memory counts against the memlock limit: leave half of
    // it for the rings.
    let io_memory = DEFAULT_IO_MEMORY_BYTES.min(memlock / 2) as usize;
    let mut notes = Vec::new();
    if (io_memory as u64) < DEFAULT_IO_MEMORY_BYTES {
        notes.push(format!(
            "glommio: RLIMIT_MEMLOCK is {} KiB, so its IO memory is {} KiB instead of {} KiB",
            memlock >> 10,
            io_memory >> 10,
            DEFAULT_IO_MEMORY_BYTES >> 10
        ));
    }
    let cpus = plugio_executor::allowed_cpus().unwrap_or_default();
    let mut handles = Vec::new();
    for core in 0..job.cores {
        let placement = match cpus.get(core % cpus.len().max(1)) {
            Some(cpu) => Placement::Fixed(*cpu),
            None => Placement::Unbound,
        };
        let (job, counters) = (job.clone(), counters.clone());
        let (path, size) = (target.path.clone(), target.size_bytes);
        let h = LocalExecutorBuilder::new(placement)
            .name("glommio-bench")
            .io_memory(io_memory)
            .ring_depth((job.iodepth as usize).clamp(128, 4096).next_power_of_two())
            .spawn(move || async move { core_main(job, path, size, counters, core).await })
            .map_err(|e| BenchError::engine(NAME, format!("starting an executor: {e}")))?;
        handles.push(h);
    }
    let mut latency = Latencies::default();
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(hist)) => latency.merge(&hist),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(format!("executor: {e}"));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(BenchError::engine(NAME, e));
    }
    Ok(EngineOutput {
        latency,
        notes,
        iostats: None,
    })
}

/// The file, as glommio opens it for the job.
enum GFile {
    Dma(DmaFile),
    Buffered(BufferedFile),
}

async fn core_main(
    job: Job,
    path: std::path::PathBuf,
    size_bytes: u64,
    counters: Arc<Counters>,
    core: usize,
) -> Result<Latencies, String> {
    let mut o = OpenOptions::new();
    o.read(true).write(job.writes());
    let file = if job.direct {
        GFile::Dma(o.dma_open(&path).await.map_err(|e| format!("open: {e}"))?)
    } else {
        GFile::Buffered(
            o.buffered_open(&path)
                .await
                .map_err(|e| format!("open: {e}"))?,
        )
    };
    let file = Rc::new(file);
    let cursor = Arc::new(AtomicU64::new(IoPattern::start_block(
        &job, size_bytes, core,
    )));
    // The job's tasks all run on this executor's thread.
    let budget = Rc::new(IoBudget::new(job.number_ios));
    let tasks: Vec<_> = (0..job.iodepth)
        .map(|i| {
            let seed = (core as u64) << 32 | u64::from(i);
            let pattern = IoPattern::new(&job, size_bytes, seed, cursor.clone());
            let t = IoTask {
                file: file.clone(),
                budget: budget.clone(),
                counters: counters.clone(),
                core,
                pattern,
                sampler: Sampler::new(job.clat_sample),
                bs: job.bs_bytes as usize,
            };
            glommio::spawn_local(t.run())
        })
        .collect();
    counters.mark_started();
    let mut first_err = None;
    for t in tasks {
        if let Err(e) = t.await {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(stats::take_latency()),
    }
}

struct IoTask {
    file: Rc<GFile>,
    budget: Rc<IoBudget>,
    counters: Arc<Counters>,
    core: usize,
    pattern: IoPattern,
    sampler: Sampler,
    bs: usize,
}

impl IoTask {
    async fn run(mut self) -> Result<(), String> {
        let mut data = vec![0u8; self.bs];
        rand::thread_rng().fill_bytes(&mut data);
        while !self.counters.stopped() && self.budget.take_local() {
            let (dir, offset) = self.pattern.next_io();
            let t0 = self.sampler.start();
            let n = self.one(dir, offset, &data).await?;
            if n != self.bs {
                return Err(format!(
                    "short {dir:?}: {n} of {} bytes at {offset}",
                    self.bs
                ));
            }
            self.counters.worker(self.core).add_io(dir, n as u64);
            if let Some(t0) = t0 {
                stats::record_latency(dir, t0.elapsed());
            }
        }
        // The last task to end closes the window, before the teardown.
        self.counters.mark_ended();
        Ok(())
    }

    async fn one(&self, dir: Dir, offset: u64, data: &[u8]) -> Result<usize, String> {
        let r = match (&*self.file, dir) {
            (GFile::Dma(f), Dir::Read) => f.read_at_aligned(offset, self.bs).await.map(|r| r.len()),
            (GFile::Dma(f), Dir::Write) => {
                let mut b = f.alloc_dma_buffer(self.bs);
                b.as_bytes_mut().copy_from_slice(data);
                f.write_at(b, offset).await
            }
            (GFile::Buffered(f), Dir::Read) => f.read_at(offset, self.bs).await.map(|r| r.len()),
            (GFile::Buffered(f), Dir::Write) => f.write_at(data.to_vec(), offset).await,
        };
        r.map_err(|e| format!("{dir:?} at {offset}: {e}"))
    }
}
