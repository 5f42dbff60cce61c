//! The replay's latency histograms (completion latency per op, schedule
//! lag): ns, 1 ns to [`MAX_TRACKED_NS`], 3 significant digits, and their
//! JSON summary.
//!
//! Invariants: a value outside the range is clamped into it, never
//! dropped; an empty histogram has no summary (`None`: "n/a", not 0).

use hdrhistogram::Histogram;

use crate::json::LatencySummary;

/// Highest latency the histograms track: 100 s in ns (larger values are
/// clamped).
pub const MAX_TRACKED_NS: u64 = 100_000_000_000;

/// A latency histogram in ns, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_TRACKED_NS, 3).expect("static histogram bounds are valid")
}

/// Records `ns` (clamped into the histogram's range).
pub fn record(h: &mut Histogram<u64>, ns: u64) {
    h.saturating_record(ns.clamp(1, MAX_TRACKED_NS));
}

/// The summary of `h`; `None` when it is empty.
pub fn summary(h: &Histogram<u64>) -> Option<LatencySummary> {
    (!h.is_empty()).then(|| LatencySummary::of(h, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_clamped_and_empty_has_no_summary() {
        let mut h = new_histogram();
        assert!(summary(&h).is_none());
        for v in 1..=100u64 {
            record(&mut h, v * 1000);
        }
        record(&mut h, 0);
        let l = summary(&h).unwrap();
        assert_eq!(l.samples, 101);
        assert!(l.p50_ns <= l.p99_ns && l.p99_ns <= l.max_ns);
        assert!((99_000..=100_100).contains(&l.max_ns));
        record(&mut h, u64::MAX);
        let l = summary(&h).unwrap();
        assert_eq!(
            l.samples, 102,
            "a value past the range is clamped, not dropped"
        );
        assert!(l.max_ns >= MAX_TRACKED_NS / 1000 * 999);
    }
}
