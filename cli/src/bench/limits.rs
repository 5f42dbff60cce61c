//! What a job asks of the machine, checked before anything starts: the
//! memory its IO buffers and jobs need against the memory available, the
//! threads it starts against the process's thread limit, and its jobs
//! against the CPUs it may run on; and a `--size` the job rounds down to
//! a multiple of `--bs`, which it warns of.
//!
//! Invariant: [`check`] refuses (exit code 2) a job that cannot fit, so a
//! run never grows until the kernel kills it; a job that only oversubscribes
//! the CPUs runs, with a warning.

use super::error::BenchError;
use super::options::{EngineKind, Job};
use super::units::fmt_bytes;
use super::units::human;

/// Memory a job (a core with its ring, tags, task table and thread) takes
/// beside its IO buffers; a deliberate overestimate.
const PER_JOB_BYTES: u64 = 1 << 20;

/// Memory an IO in flight takes beside its buffer (its task, bio,
/// request and latency record): measured about 8 KiB for plugio and 10
/// KiB for tokio (maxrss at `--iodepth` 16384 against 128, `--bs 512`);
/// a deliberate overestimate. Without it a job of deep queues and small
/// blocks passed the check and was killed by the kernel (found by a
/// break-it helper: `--iodepth 65536 --numjobs 64`).
const PER_IO_BYTES: u64 = 16 << 10;

/// Memory a psync IO thread takes beside its buffer (stack pages touched,
/// thread bookkeeping).
const PER_THREAD_BYTES: u64 = 64 << 10;

/// Checks `job` against the machine; returns warnings to print.
///
/// # Errors
/// [`BenchError::TooBig`] naming the options to lower when the job needs
/// more memory than is available or more threads than the process may
/// start.
pub fn check(job: &Job) -> Result<Vec<String>, BenchError> {
    let mut warnings = Vec::new();
    let jobs = job.cores as u64;
    let depth = u64::from(job.iodepth);
    let threads = match job.engine {
        EngineKind::Psync => jobs.saturating_mul(depth),
        _ => jobs,
    };
    if let Some(max) = thread_limit() {
        if threads > max {
            return Err(BenchError::TooBig(format!(
                "--numjobs {} starts {threads} threads, more than the {max} this process may \
                 start (RLIMIT_NPROC, kernel.threads-max, vm.max_map_count): lower --numjobs{}",
                job.cores,
                if job.engine == EngineKind::Psync {
                    " or --iodepth (psync runs one thread per IO in flight)"
                } else {
                    ""
                }
            )));
        }
    }
    let buffers = if job.nop {
        0
    } else {
        jobs.saturating_mul(depth).saturating_mul(job.bs_bytes)
    };
    let per_io = jobs.saturating_mul(depth).saturating_mul(PER_IO_BYTES);
    let needed = buffers
        .saturating_add(per_io)
        .saturating_add(jobs.saturating_mul(PER_JOB_BYTES))
        .saturating_add(threads.saturating_mul(PER_THREAD_BYTES));
    if let Some((available, source)) = plugio_cli::machine::available_memory() {
        if needed > available {
            return Err(BenchError::TooBig(format!(
                "--numjobs {} x --iodepth {} x --bs {} needs about {} ({} of IO buffers, \
                 {} for the IOs in flight and about 1 MiB per job), more than the {} this machine has available ({source}): \
                 lower --numjobs, --iodepth or --bs",
                job.cores,
                job.iodepth,
                fmt_bytes(job.bs_bytes),
                human(needed),
                human(buffers),
                human(per_io),
                human(available),
            )));
        }
    }
    if let Some(size) = job
        .size_bytes
        .filter(|&s| s % job.bs_bytes != 0 && s > job.bs_bytes)
    {
        let used = size - size % job.bs_bytes;
        warnings.push(format!(
            "--size {size} is not a multiple of --bs {bs}: the job uses its first {used} bytes \
             ({} x {bs})",
            used / job.bs_bytes,
            bs = fmt_bytes(job.bs_bytes),
        ));
    }
    if let Ok(cpus) = plugio_executor::allowed_cpus() {
        if job.cores > cpus.len() {
            warnings.push(format!(
                "--numjobs {} is more than the {} CPUs this process may run on: jobs share \
                 CPUs, so the figures measure that sharing",
                job.cores,
                cpus.len()
            ));
        }
    }
    Ok(warnings)
}

/// Memory mappings a thread takes: its stack and guard page, and the
/// signal stack with its guard page that std gives every thread.
const MAPS_PER_THREAD: u64 = 4;

/// Mappings left aside for everything else (the heap's arenas, the rings,
/// the buffers, the libraries).
const MAPS_SPARE: u64 = 4096;

/// The threads this process may still start: the lowest of RLIMIT_NPROC
/// (when limited), `kernel.threads-max`, and the mappings `vm.max_map_count`
/// leaves for their stacks ([`MAPS_PER_THREAD`] each; past it a thread's
/// start fails inside std and the process aborts).
fn thread_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    let nproc = getrlimit(Resource::RLIMIT_NPROC)
        .ok()
        .map(|(soft, _)| soft)
        .filter(|&soft| soft != RLIM_INFINITY);
    let maps = read("/proc/sys/vm/max_map_count").map(|max| {
        let used = std::fs::read_to_string("/proc/self/maps")
            .map(|m| m.lines().count() as u64)
            .unwrap_or(0);
        max.saturating_sub(used + MAPS_SPARE) / MAPS_PER_THREAD
    });
    [nproc, read("/proc/sys/kernel/threads-max"), maps]
        .into_iter()
        .flatten()
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::options::test_job as job;

    /// Past the mappings `vm.max_map_count` leaves, a thread's start
    /// fails inside std and the process aborts (found by a break-it
    /// helper: psync at --iodepth 40000 left its temporary file).
    #[test]
    fn the_thread_limit_counts_the_mappings_threads_take() {
        let Some(max) = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
        else {
            return;
        };
        let limit = thread_limit().expect("a limit");
        assert!(
            limit <= max / MAPS_PER_THREAD,
            "{limit} threads, {max} maps"
        );
        let err = check(&job(&[
            "--engine",
            "psync",
            "--iodepth",
            "65536",
            "--bs",
            "512",
        ]))
        .expect_err("more threads than maps");
        assert!(err.to_string().contains("vm.max_map_count"), "{err}");
    }

    #[test]
    fn a_size_off_the_block_size_is_warned_of() {
        let w = check(&job(&["--size", "5000", "--bs", "4k"])).expect("runs");
        assert!(
            w.iter()
                .any(|w| w.contains("--size 5000 is not a multiple of --bs 4KiB")
                    && w.contains("first 4096 bytes (1 x 4KiB)")),
            "{w:?}"
        );
        let w = check(&job(&["--size", "8k", "--bs", "4k"])).expect("runs");
        assert!(!w.iter().any(|w| w.contains("--size")), "{w:?}");
    }

    #[test]
    fn a_job_larger_than_the_machine_is_refused_and_the_default_fits() {
        assert!(check(&job(&[])).is_ok());
        // 100000 jobs of 128 x 4 KiB: 50 GiB of buffers alone.
        let e = check(&job(&["--numjobs", "100000"])).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        assert!(
            msg.contains("--numjobs 100000") && msg.contains("lower"),
            "{msg}"
        );
        // One job whose buffers alone exceed any machine (64 TiB).
        let e = check(&job(&["--bs", "1g", "--iodepth", "65536"])).unwrap_err();
        assert!(e.to_string().contains("--bs 1GiB"), "{e}");
        // Small blocks at a huge depth: 1 GiB of buffers, but 64 GiB of
        // IOs in flight (a break-it helper's job the kernel killed).
        let e = check(&job(&[
            "--numjobs",
            "64",
            "--iodepth",
            "65536",
            "--bs",
            "256",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("for the IOs in flight"), "{e}");
    }
}
