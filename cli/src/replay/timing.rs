//! When replayed IOs are issued ([`Timing`]) and how late they were
//! ([`Schedule`]).
//!
//! Invariants: an IO is never issued before its recorded time under
//! [`Timing::Original`]; the schedule is relative to the earliest recorded
//! time of the replayed IOs (so a trace that starts late, or a `--limit`
//! window, starts at once, and a trace whose times are out of order still
//! waits for its later times: the first line's time is not the origin);
//! lag is only recorded under [`Timing::Original`].

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::latency;
use super::trace::TraceIo;
use crate::json::LatencySummary;

/// How replayed IOs are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Timing {
    /// Each IO at its recorded time (later when the IOs it must follow,
    /// or the queue depth, hold it back).
    Original,
    /// As fast as possible, keeping at most `iodepth` IOs in flight.
    None,
}

impl Timing {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Timing::Original => "original",
            Timing::None => "none",
        }
    }
}

/// The recorded times mapped onto this run's clock, and the lag of each
/// issue against them.
#[derive(Debug)]
pub struct Schedule {
    timing: Timing,
    start: Instant,
    origin_ns: u64,
    lag: Histogram<u64>,
}

impl Schedule {
    /// When the schedule started: the trace's earliest recorded time is
    /// due then.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// A schedule that starts now, with the earliest recorded time of
    /// `ios` at `start`. (The first line's time was the origin, and an
    /// out-of-order trace whose first line was its latest time replayed
    /// at once; found by a break-it helper.)
    pub fn new(timing: Timing, ios: &[TraceIo]) -> Self {
        Schedule {
            timing,
            start: Instant::now(),
            origin_ns: ios.iter().map(|io| io.time_ns).min().unwrap_or(0),
            lag: latency::new_histogram(),
        }
    }

    /// When `io` is due (`None` under [`Timing::None`]: at once).
    pub fn due(&self, io: &TraceIo) -> Option<Instant> {
        match self.timing {
            Timing::None => None,
            Timing::Original => {
                let ns = io.time_ns.saturating_sub(self.origin_ns);
                Some(self.start + Duration::from_nanos(ns))
            }
        }
    }

    /// Records that `io` was issued at `now`.
    pub fn issued(&mut self, io: &TraceIo, now: Instant) {
        if let Some(due) = self.due(io) {
            let lag = now.saturating_duration_since(due);
            latency::record(
                &mut self.lag,
                lag.as_nanos().min(u128::from(u64::MAX)) as u64,
            );
        }
    }

    /// The lag percentiles (`None` under [`Timing::None`] or before any
    /// issue).
    pub fn lag(&self) -> Option<LatencySummary> {
        match self.timing {
            Timing::None => None,
            Timing::Original => latency::summary(&self.lag),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::trace::TraceOp;

    fn at(time_ns: u64) -> TraceIo {
        TraceIo {
            time_ns,
            op: TraceOp::Read,
            offset_bytes: 0,
            len_bytes: 512,
            line: 1,
        }
    }

    #[test]
    fn original_timing_is_relative_to_the_first_io_and_records_lag() {
        let ios = [at(5_000_000), at(7_000_000)];
        let mut s = Schedule::new(Timing::Original, &ios);
        let d0 = s.due(&ios[0]).unwrap();
        let d1 = s.due(&ios[1]).unwrap();
        assert_eq!(d1 - d0, Duration::from_millis(2));
        s.issued(&ios[1], d1 + Duration::from_millis(3));
        let lag = s.lag().unwrap();
        assert!((2_990_000..=3_010_000).contains(&lag.p99_ns), "{lag:?}");
        let none = Schedule::new(Timing::None, &ios);
        assert!(none.due(&ios[1]).is_none() && none.lag().is_none());
    }

    #[test]
    fn out_of_order_times_are_relative_to_the_earliest() {
        let ios = [at(5_000_000_000), at(1_000_000_000), at(3_000_000_000)];
        let s = Schedule::new(Timing::Original, &ios);
        assert_eq!(
            s.due(&ios[1]).unwrap(),
            s.start(),
            "the earliest is due at the start"
        );
        assert_eq!(s.due(&ios[0]).unwrap() - s.start(), Duration::from_secs(4));
        assert_eq!(s.due(&ios[2]).unwrap() - s.start(), Duration::from_secs(2));
    }
}
