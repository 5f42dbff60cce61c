//! `--engine monoio`: monoio 0.2 (ByteDance's thread-per-core runtime) on
//! its io_uring driver: one runtime per job on a pinned thread, `iodepth`
//! tasks each looping `monoio::fs::File::read_at` / `write_at` with one
//! owned aligned buffer that moves into the runtime and back. The file is
//! opened through monoio's `OpenOptions` with `O_DIRECT` (custom flags)
//! unless `--direct 0`.
//!
//! Settings (monoio's own defaults, as its README and examples build a
//! runtime): `RuntimeBuilder::<IoUringDriver>` with `with_entries` = the
//! larger of its default 1024 and `iodepth`; no SQPOLL and no ring setup
//! flags (monoio sets none); no timer driver (the loop needs none).
//! monoio has no registered buffers or registered files for `File`: with
//! the default `--fixedbufs 1 --registerfiles 1` the run says so in its
//! notes.
//!
//! Invariant: a job's counters and latency are written only by its
//! runtime thread.

use std::sync::Arc;

use super::error::BenchError;
use super::options::Job;
use super::output::EngineOutput;
use super::stats::Counters;
use super::target::Target;

const NAME: &str = "monoio";

/// Runs one monoio runtime per job until stopped.
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
    use std::os::unix::fs::OpenOptionsExt;
    use std::rc::Rc;
    use std::sync::Arc;

    use monoio::fs::File;

    use super::super::options::Job;
    use super::super::peers::{ring_entries, JobResult, PeerBuf, Task};
    use super::super::stats::{self, Counters, Dir};
    use super::super::target::Target;

    /// monoio's default ring size (`RuntimeBuilder::with_entries` docs).
    const DEFAULT_ENTRIES: u32 = 1024;

    pub(super) fn job_main(
        job: &Job,
        target: &Target,
        counters: &Arc<Counters>,
        core: usize,
    ) -> JobResult {
        let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .with_entries(ring_entries(job, DEFAULT_ENTRIES))
            .build()
            .map_err(|e| format!("building the runtime (io_uring): {e}"))?;
        rt.block_on(core_main(job, target, counters, core))
    }

    async fn core_main(
        job: &Job,
        target: &Target,
        counters: &Arc<Counters>,
        core: usize,
    ) -> JobResult {
        let mut o = monoio::fs::OpenOptions::new();
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
            .map(|t| monoio::spawn(io_task(file.clone(), t, PeerBuf::for_job(job))))
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
            None => Ok((stats::take_latency(), Vec::new())),
        }
    }

    async fn io_task(file: Rc<File>, mut task: Task, mut buf: PeerBuf) -> Result<(), String> {
        while let Some(io) = task.next() {
            let (r, b) = match io.dir {
                Dir::Read => file.read_at(buf, io.offset).await,
                Dir::Write => file.write_at(buf, io.offset).await,
            };
            buf = b;
            task.done(io, r)?;
        }
        Ok(())
    }
}
