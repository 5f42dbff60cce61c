//! The results of a comparison run as `compare-report` and its plots read
//! them: runs grouped by [`Key`] (target, engine, workload, queue depth),
//! their figures ([`Runs`]), medians with min and max, and the order the
//! engines are shown in.
//!
//! Invariants: a median is taken only of what was measured (`None` for no
//! run, never 0); engines keep one fixed order in every table and plot.

use std::collections::BTreeMap;

/// The grouping key of a result.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    pub(super) target: String,
    pub(super) engine: String,
    pub(super) workload: String,
    pub(super) qd: u32,
}

/// The figures of the runs of one key.
#[derive(Debug, Clone, Default)]
pub(super) struct Runs {
    pub(super) iops: Vec<f64>,
    pub(super) cpu_ns_per_io: Vec<f64>,
    /// What the engine could not do as asked (its `notes`), each once.
    pub(super) notes: Vec<String>,
}

/// Median, min and max of `v` (`None` when empty).
pub(super) fn stats(v: &[f64]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    Some((median, s[0], s[n - 1]))
}

/// `1.23M`, `456K`, `789`.
pub(super) fn fmt_iops(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}K", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// The order engines are shown in (unknown ones last).
const ENGINES: &[&str] = &[
    "plugio",
    "plugio-nomerges",
    "nop",
    "raw",
    "rawnop",
    "glommio",
    "monoio",
    "tokio-uring",
    "compio",
    "tokio",
    "psync",
    "fio",
];

/// The median IOPS of one key's runs.
pub(super) fn median_of(
    map: &BTreeMap<Key, Runs>,
    target: &str,
    engine: &str,
    workload: &str,
    qd: u32,
) -> Option<f64> {
    let key = Key {
        target: target.into(),
        engine: engine.into(),
        workload: workload.into(),
        qd,
    };
    map.get(&key).and_then(|r| stats(&r.iops)).map(|s| s.0)
}

/// The targets of `workload`, in key order.
pub(super) fn targets_of(map: &BTreeMap<Key, Runs>, workload: &str) -> Vec<String> {
    let mut t: Vec<String> = map
        .keys()
        .filter(|k| k.workload == workload)
        .map(|k| k.target.clone())
        .collect();
    t.dedup();
    t
}

/// The engines of `workload`, in [`ENGINES`] order.
pub(super) fn engines_of(map: &BTreeMap<Key, Runs>, workload: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for k in map.keys().filter(|k| k.workload == workload) {
        if !found.contains(&k.engine) {
            found.push(k.engine.clone());
        }
    }
    let rank = |e: &String| ENGINES.iter().position(|x| x == e).unwrap_or(ENGINES.len());
    found.sort_by_key(rank);
    found
}
