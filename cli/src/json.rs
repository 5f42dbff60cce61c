//! The one JSON vocabulary of `plugio bench --json`, `plugio replay --json`
//! and `plugio info --json`: every document opens with the same
//! [`RunMeta`] fields (`schema_version`, `command`, `plugio_version`,
//! `kernel`, `machine`), latencies are [`LatencySummary`] objects (ns, with
//! p50/p90/p99/p99.9), and a failed run still prints one JSON object, with
//! an `error` ([`ErrorDoc`]).
//!
//! Invariants: a field keeps its name and meaning within a
//! `schema_version`; a change that renames or drops one bumps it.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// The version of the JSON vocabulary (bumped when a field is renamed,
/// removed or changes meaning; adding a field keeps it).
pub const SCHEMA_VERSION: u32 = 1;

/// What opens every JSON document: which command, which plugio, which
/// machine and kernel.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunMeta {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `bench`, `replay` or `info`.
    pub command: String,
    /// The plugio crate version that ran.
    pub plugio_version: String,
    /// The kernel release (`uname -r`), or `unknown`.
    pub kernel: String,
    /// The machine.
    pub machine: Machine,
}

/// The machine a run was on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    /// CPU architecture (`x86_64`).
    pub arch: String,
    /// CPUs this process may run on.
    pub cpus: usize,
    /// Physical memory, bytes (`None` when it cannot be read).
    pub memory_bytes: Option<u64>,
}

impl RunMeta {
    /// The fields for `command` on this machine, now.
    pub fn now(command: &str) -> RunMeta {
        let uname = nix::sys::utsname::uname().ok();
        let kernel = uname.as_ref().map_or_else(
            || "unknown".to_owned(),
            |u| u.release().to_string_lossy().into_owned(),
        );
        let cpus = plugio_executor::allowed_cpus()
            .map(|c| c.len())
            .unwrap_or(0)
            .max(1);
        let memory_bytes = nix::sys::sysinfo::sysinfo().ok().map(|s| s.ram_total());
        RunMeta {
            schema_version: SCHEMA_VERSION,
            command: command.to_owned(),
            plugio_version: env!("CARGO_PKG_VERSION").to_owned(),
            kernel,
            machine: Machine {
                arch: std::env::consts::ARCH.to_owned(),
                cpus,
                memory_bytes,
            },
        }
    }
}

/// Latency percentiles of the sampled IOs, ns.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    /// IOs whose latency was recorded.
    pub samples: u64,
    /// One IO in this many was recorded (1: all).
    pub sample_every: u32,
    /// Mean.
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest.
    pub max_ns: u64,
}

impl LatencySummary {
    /// The percentiles of `h`, whose samples are one IO in `sample_every`
    /// (all zero when `h` is empty).
    pub fn of(h: &Histogram<u64>, sample_every: u32) -> LatencySummary {
        if h.is_empty() {
            return LatencySummary {
                sample_every,
                ..LatencySummary::default()
            };
        }
        LatencySummary {
            samples: h.len(),
            sample_every,
            mean_ns: h.mean(),
            p50_ns: h.value_at_quantile(0.50),
            p90_ns: h.value_at_quantile(0.90),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            max_ns: h.max(),
        }
    }
}

/// The document a failed `--json` run prints on standard output (the
/// message also goes to standard error, and the exit status is unchanged).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorDoc {
    /// The common fields.
    #[serde(flatten)]
    pub meta: RunMeta,
    /// What went wrong.
    pub error: ErrorBody,
}

/// The `error` object of an [`ErrorDoc`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    /// `usage` (bad input, exit status 2), `run` (the run failed, exit
    /// status 1) or `interrupted` (a signal came before the run had
    /// figures, as during the temporary file's fill: exit status 128 + the
    /// signal's number, as the process then dies of it).
    pub kind: String,
    /// The message printed on standard error.
    pub message: String,
    /// The process's exit status.
    pub exit_code: u8,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_names_this_machine_and_version() {
        let m = RunMeta::now("bench");
        assert_eq!(m.schema_version, SCHEMA_VERSION);
        assert_eq!(m.plugio_version, env!("CARGO_PKG_VERSION"));
        assert!(m.machine.cpus >= 1);
        assert_ne!(m.kernel, "");
    }

    #[test]
    fn latency_summary_orders_its_percentiles() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).expect("bounds");
        for v in 1..=1000u64 {
            h.record(v * 1000).expect("record");
        }
        let s = LatencySummary::of(&h, 4);
        assert_eq!((s.samples, s.sample_every), (1000, 4));
        assert!(s.p50_ns <= s.p90_ns && s.p90_ns <= s.p99_ns && s.p99_ns <= s.p999_ns);
        assert!(s.p999_ns <= s.max_ns);
        assert!((s.p90_ns as f64 - 900_000.0).abs() < 1_000.0, "{s:?}");
        assert_eq!(
            LatencySummary::of(&Histogram::new(3).expect("h"), 1).samples,
            0
        );
    }
}
