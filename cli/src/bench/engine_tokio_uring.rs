//! `--engine tokio-uring`: tokio-uring 0.5 (io_uring under a tokio
//! current-thread runtime and `LocalSet`): one runtime per job on a pinned
//! thread, `iodepth` tasks each looping `tokio_uring::fs::File::read_at` /
//! `write_at` with one owned aligned buffer, or `read_fixed_at` /
//! `write_fixed_at` on a buffer checked out of a registered
//! `FixedBufRegistry` with `--fixedbufs 1` (the default). The file is
//! opened through tokio-uring's `OpenOptions` with `O_DIRECT` (custom
//! flags) unless `--direct 0`.
//!
//! Settings (tokio-uring's own, as its docs build a runtime): `builder()`
//! with `entries` = the larger of its default 256 and `iodepth`, the
//! default `uring_builder()` (no SQPOLL, no setup flags; tokio-uring
//! documents none for throughput); SQEs are submitted when the runtime
//! parks or the queue fills, as tokio-uring does. It has no registered
//! files for `File`: with `--registerfiles 1` the run says so in its notes.
//!
//! Invariant: a job's counters and latency are written only by its
//! runtime thread.

use std::sync::Arc;

use super::error::BenchError;
use super::options::Job;
use super::output::EngineOutput;
use super::stats::Counters;
use super::target::Target;

const NAME: &str = "tokio-uring";

/// Runs one tokio-uring runtime per job until stopped.
///
/// # Errors
/// Runtime setup (io_uring), open or an IO failed.
#[cfg(feature = "peers")]
pub fn run(
    job: &Job,
    target: &Target,
    counters: &Arc<Counters>,
) -> Result<EngineOutput, BenchError> {
    let notes = super::peers::unsupported(job, NAME, true, false);
    super::peers::run_jobs(NAME, job, target, notes, |core| {
        imp::job_main(job, target, counters, core)
    })
}

/// Without the `peers` feature: refuses, saying how to build it.
///
/// # Errors
/// Always.
#[cfg(not(feature = "peers"))]
pub fn run(
    _job: &Job,
    _target: &Target,
    _counters: &Arc<Counters>,
) -> Result<EngineOutput, BenchError> {
    Err(super::peers::not_built(NAME))
}

#[cfg(feature = "peers")]
mod imp {
    use std::io;
    use std::os::unix::fs::OpenOptionsExt;
    use std::rc::Rc;
    use std::sync::Arc;

    use tokio_uring::buf::fixed::{FixedBuf, FixedBufRegistry};
    use tokio_uring::fs::File;

    use super::super::options::Job;
    use super::super::peers::{ring_entries, JobResult, PeerBuf, Task};
    use super::super::stats::{self, Counters, Dir};
    use super::super::target::Target;
    use super::NAME;

    /// tokio-uring's default submission queue size (`Builder::entries`).
    const DEFAULT_ENTRIES: u32 = 256;

    pub(super) fn job_main(
        job: &Job,
        target: &Target,
        counters: &Arc<Counters>,
        core: usize,
    ) -> JobResult {
        let mut b = tokio_uring::builder();
        b.entries(ring_entries(job, DEFAULT_ENTRIES));
        let rt = tokio_uring::Runtime::new(&b)
            .map_err(|e| format!("building the runtime (io_uring): {e}"))?;
        rt.block_on(core_main(job, target, counters, core))
    }

    /// A task's buffer: registered (fixed) or plain.
    enum TaskBuf {
        Fixed(FixedBuf),
        Plain(PeerBuf),
    }

    async fn core_main(
        job: &Job,
        target: &Target,
        counters: &Arc<Counters>,
        core: usize,
    ) -> JobResult {
        let mut notes = Vec::new();
        let mut o = tokio_uring::fs::OpenOptions::new();
        o.read(true).write(job.writes());
        if job.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        let file = o
            .open(&target.path)
            .await
            .map_err(|e| format!("open {}: {e}", plugio_cli::shown::path(&target.path)))?;
        let file = Rc::new(file);
        let mut bufs: Vec<TaskBuf> = Vec::new();
        if job.fixed_bufs {
            let registry = FixedBufRegistry::new((0..job.iodepth).map(|_| PeerBuf::for_job(job)));
            match registry.register() {
                Ok(()) => {
                    // tokio-uring may hand out fewer registered buffers
                    // than it registered (none past the 1,024th here, with
                    // --iodepth 1025): the tasks beyond use plain buffers,
                    // and the run's notes say so.
                    for i in 0..job.iodepth as usize {
                        match registry.check_out(i) {
                            Some(b) => bufs.push(TaskBuf::Fixed(b)),
                            None => {
                                notes.push(format!(
                                    "{NAME}: {i} of {} registered buffers handed out: \
                                     the other {} tasks use plain buffers",
                                    job.iodepth,
                                    job.iodepth as usize - i
                                ));
                                break;
                            }
                        }
                    }
                }
                Err(e) => notes.push(format!(
                    "{NAME}: registering {} buffers failed ({e}): plain buffers",
                    job.iodepth
                )),
            }
        }
        let tasks: Vec<_> = Task::for_job(job, target.size_bytes, core, counters)
            .into_iter()
            .map(|t| {
                let buf = bufs
                    .pop()
                    .unwrap_or_else(|| TaskBuf::Plain(PeerBuf::for_job(job)));
                tokio_uring::spawn(io_task(file.clone(), t, buf))
            })
            .collect();
        counters.mark_started();
        let mut first_err = None;
        for t in tasks {
            let r = t.await.map_err(|e| format!("IO task: {e}")).and_then(|r| r);
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok((stats::take_latency(), notes)),
        }
    }

    async fn io_task(file: Rc<File>, mut task: Task, mut buf: TaskBuf) -> Result<(), String> {
        while let Some(io) = task.next() {
            let r;
            (r, buf) = one(&file, buf, io.dir, io.offset).await;
            task.done(io, r)?;
        }
        Ok(())
    }

    async fn one(file: &File, buf: TaskBuf, dir: Dir, offset: u64) -> (io::Result<usize>, TaskBuf) {
        match (buf, dir) {
            (TaskBuf::Fixed(b), Dir::Read) => {
                let (r, b) = file.read_fixed_at(b, offset).await;
                (r, TaskBuf::Fixed(b))
            }
            (TaskBuf::Fixed(b), Dir::Write) => {
                let (r, b) = file.write_fixed_at(b, offset).await;
                (r, TaskBuf::Fixed(b))
            }
            (TaskBuf::Plain(b), Dir::Read) => {
                let (r, b) = file.read_at(b, offset).await;
                (r, TaskBuf::Plain(b))
            }
            (TaskBuf::Plain(b), Dir::Write) => {
                let (r, b) = file.write_at(b, offset).submit().await;
                (r, TaskBuf::Plain(b))
            }
        }
    }
}
