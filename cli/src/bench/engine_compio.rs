//! `--engine compio`: compio 0.19 (completion-based, thread-per-core) on
//! its io_uring driver: one runtime per job on a pinned thread, `iodepth`
//! tasks each looping `compio::fs::File::read_at` / `write_at`
//! (`AsyncReadAt` / `AsyncWriteAt` on `&File`) with one owned aligned
//! buffer. The file is opened through compio's `OpenOptions` with
//! `O_DIRECT` (custom flags) unless `--direct 0`.
//!
//! Settings (compio's own, from its `ProactorBuilder` docs): `capacity` =
//! the larger of its default 1024 and `iodepth`, `coop_taskrun(true)` and
//! `taskrun_flag(true)` ("optimize performance for most cases, especially
//! \[as\] compio is a single thread runtime"; the flag "should be enabled
//! with coop_taskrun"), no SQPOLL; the kernel refusing those flags falls
//! back to none, with a note. compio has no registered buffers and its
//! `File` does not use registered files: with the default `--fixedbufs 1
//! --registerfiles 1` the run says so in its notes.
//!
//! Invariant: a job's counters and latency are written only by its
//! runtime thread.

use std::sync::Arc;

use super::error::BenchError;
use super::options::Job;
use super::output::EngineOutput;
use super::stats::Counters;
use super::target::Target;

const NAME: &str = "compio";

/// Runs one compio runtime per job until stopped.
///
/// # Errors
/// Runtime setup (io_uring), open or an IO failed.
#[cfg(feature = "peers")]
pub fn run(
    job: &Job,
    target: &Target,
    counters: &Arc<Counters>,
) -> Result<EngineOutput, BenchError> {
    let notes = super::peers::unsupported(job, NAME, false, false);
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
    use std::rc::Rc;
    use std::sync::Arc;

    use compio::driver::ProactorBuilder;
    use compio::fs::File;
    use compio::io::{AsyncReadAt, AsyncWriteAt};
    use compio::BufResult;

    use super::super::options::Job;
    use super::super::peers::{ring_entries, JobResult, PeerBuf, Task};
    use super::super::stats::{self, Counters, Dir};
    use super::super::target::Target;
    use super::NAME;

    /// compio's default queue size (`ProactorBuilder::capacity`).
    const DEFAULT_ENTRIES: u32 = 1024;

    pub(super) fn job_main(
        job: &Job,
        target: &Target,
        counters: &Arc<Counters>,
        core: usize,
    ) -> JobResult {
        let mut notes = Vec::new();
        let build = |taskrun: bool| {
            let mut p = ProactorBuilder::new();
            p.capacity(ring_entries(job, DEFAULT_ENTRIES))
                .coop_taskrun(taskrun)
                .taskrun_flag(taskrun);
            compio::runtime::RuntimeBuilder::new()
                .with_proactor(p)
                .build()
        };
        let rt = match build(true) {
            Ok(rt) => rt,
            Err(e) => {
                notes.push(format!(
                    "{NAME}: the kernel refused COOP_TASKRUN/TASKRUN_FLAG ({e}): ring without them"
                ));
                build(false).map_err(|e| format!("building the runtime (io_uring): {e}"))?
            }
        };
        let (hist, more) = rt.block_on(core_main(job, target, counters, core))?;
        notes.extend(more);
        Ok((hist, notes))
    }

    async fn core_main(
        job: &Job,
        target: &Target,
        counters: &Arc<Counters>,
        core: usize,
    ) -> JobResult {
        let mut o = compio::fs::OpenOptions::new();
        o.read(true).write(job.writes());
        if job.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        let file = o
            .open(&target.path)
            .await
            .map_err(|e| format!("open {}: {e}", plugio_cli::shown::path(&target.path)))?;
        let file = Rc::new(file);
        let tasks: Vec<_> = Task::for_job(job, target.size_bytes, core, counters)
            .into_iter()
            .map(|t| compio::runtime::spawn(io_task(file.clone(), t, PeerBuf::for_job(job))))
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
            None => Ok((stats::take_latency(), Vec::new())),
        }
    }

    async fn io_task(file: Rc<File>, mut task: Task, mut buf: PeerBuf) -> Result<(), String> {
        while let Some(io) = task.next() {
            let BufResult(r, b) = match io.dir {
                Dir::Read => file.read_at(buf, io.offset).await,
                Dir::Write => {
                    let mut f: &File = &file;
                    f.write_at(buf, io.offset).await
                }
            };
            buf = b;
            task.done(io, r)?;
        }
        Ok(())
    }
}
