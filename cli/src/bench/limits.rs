//! What a job asks of the machine, checked before anything starts: the
//! memory its IO buffers and jobs need against the memory available, the
//! threads it starts against the process's thread limit, and its jobs
//! against the CPUs it may run on.
//!
//! Invariant: [`check`] refuses (exit code 2) a job that cannot fit, so a
//! run never grows until the kernel kills it; a job that only oversubscribes
//! the CPUs runs, with a warning.

use super::error::BenchError;
use super::options::{EngineKind, Job};
use super::report::fmt_bytes;

/// Memory a job (a core with its ring, tags, task table and thread) takes
/// beside its IO buffers; a deliberate overestimate.
const PER_JOB_BYTES: u64 = 1 << 20;

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
                 start (RLIMIT_NPROC, kernel.threads-max): lower --numjobs{}",
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
    let needed = buffers
        .saturating_add(jobs.saturating_mul(PER_JOB_BYTES))
        .saturating_add(threads.saturating_mul(PER_THREAD_BYTES));
    if let Some((available, source)) = available_memory() {
        if needed > available {
            return Err(BenchError::TooBig(format!(
                "--numjobs {} x --iodepth {} x --bs {} needs about {} ({} of IO buffers and \
                 about 1 MiB per job), more than the {} this machine has available ({source}): \
                 lower --numjobs, --iodepth or --bs",
                job.cores,
                job.iodepth,
                fmt_bytes(job.bs_bytes),
                human(needed),
                human(buffers),
                human(available),
            )));
        }
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

/// `n` bytes in GiB or MiB with one decimal.
fn human(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    }
}

/// The threads this process may still start: the lower of RLIMIT_NPROC
/// (when limited) and `kernel.threads-max`.
fn thread_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    let nproc = getrlimit(Resource::RLIMIT_NPROC)
        .ok()
        .map(|(soft, _)| soft)
        .filter(|&soft| soft != RLIM_INFINITY);
    let max = std::fs::read_to_string("/proc/sys/kernel/threads-max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    match (nproc, max) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Bytes of memory this process can still use, and where the figure comes
/// from: `MemAvailable` of /proc/meminfo, lowered to what the process's
/// cgroup memory limit leaves (v2 `memory.max`, v1
/// `memory.limit_in_bytes`).
fn available_memory() -> Option<(u64, &'static str)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let mut best = (kib * 1024, "MemAvailable");
    if let Some(left) = cgroup_memory_left() {
        if left < best.0 {
            best = (left, "its cgroup's memory limit");
        }
    }
    Some(best)
}

/// What the process's cgroup memory limit leaves (limit minus usage), if
/// it has one.
fn cgroup_memory_left() -> Option<u64> {
    let read = |p: String| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (limit, usage) = if controllers.is_empty() {
            let dir = format!("/sys/fs/cgroup{path}");
            (
                read(format!("{dir}/memory.max")),
                read(format!("{dir}/memory.current")),
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            let dir = format!("/sys/fs/cgroup/memory{path}");
            (
                read(format!("{dir}/memory.limit_in_bytes")),
                read(format!("{dir}/memory.usage_in_bytes")),
            )
        } else {
            continue;
        };
        // "max" (v2) does not parse; v1 reports a huge number instead.
        if let Some(limit) = limit.filter(|&l| l < 1 << 60) {
            return Some(limit.saturating_sub(usage.unwrap_or(0)));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::options::test_job as job;

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
    }
}
