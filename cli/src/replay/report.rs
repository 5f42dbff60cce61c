//! What a replay reports ([`ReplayReport`]): IOs and bytes by op, IOPS,
//! bandwidth, latency percentiles per op, the engine's figures (requests
//! after merging, merges, IOS/call), schedule lag for `--timing original`,
//! and verification; as text or JSON.
//!
//! Invariants: a figure the run cannot give is `null` in JSON and "n/a" in
//! text, never 0 or a guess; latencies are in ns, rates per second of the
//! replay's wall time.

use std::fmt::Write as _;

use plugio_engine::IoStats;
use serde::Serialize;

use super::timing::Timing;
use super::trace::TraceOp;
use super::verify::VerifyStats;

/// Percentiles of a latency histogram, ns: the JSON vocabulary's summary,
/// shared with `plugio bench` (every replayed IO is recorded:
/// `sample_every` is 1).
pub use crate::json::LatencySummary;

/// One op's figures.
#[derive(Debug, Clone, Serialize)]
pub struct OpReport {
    /// `read`, `write`, `flush` or `discard`.
    pub op: &'static str,
    /// IOs completed.
    pub ios: u64,
    /// Bytes they moved (discards: bytes discarded).
    pub bytes: u64,
    /// Completion latency, issue to completion (`None`: no IO).
    pub latency: Option<LatencySummary>,
}

/// The engine's own figures over the replay (iostats deltas).
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineFigures {
    /// Bios issued: one per replayed trace IO (the final verification
    /// reads are not counted: the figures stop at the last replayed
    /// completion).
    pub bios: u64,
    /// Requests sent to the backend after merging and splitting.
    pub requests: u64,
    /// Read requests.
    pub read_requests: u64,
    /// Write requests.
    pub write_requests: u64,
    /// Flush requests.
    pub flush_requests: u64,
    /// Discard requests.
    pub discard_requests: u64,
    /// Bios merged into another bio's request (all ops).
    pub merges: u64,
    /// Plug flushes that sent requests.
    pub plug_flushes: u64,
    /// Requests per plug flush.
    pub requests_per_flush: Option<f64>,
    /// `io_uring_enter` calls on the replay's cores (`None`: not known,
    /// e.g. a runtime the caller built).
    pub enters: Option<u64>,
    /// Requests (SQEs) per `io_uring_enter`; below 1 when the cores often
    /// enter only to wait for completions.
    pub ios_per_call: Option<f64>,
}

impl EngineFigures {
    /// The figures between two iostats snapshots of one device.
    pub fn between(before: &IoStats, after: &IoStats) -> EngineFigures {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let requests = d(after.requests, before.requests);
        let plug_flushes = d(after.plug_flushes, before.plug_flushes);
        EngineFigures {
            bios: d(after.bios, before.bios),
            requests,
            read_requests: d(after.read.ios, before.read.ios),
            write_requests: d(after.write.ios, before.write.ios),
            flush_requests: d(after.flush.ios, before.flush.ios),
            discard_requests: d(after.discard.ios, before.discard.ios),
            merges: d(
                after.read.merges + after.write.merges + after.discard.merges,
                before.read.merges + before.write.merges + before.discard.merges,
            ),
            plug_flushes,
            requests_per_flush: (plug_flushes > 0).then(|| requests as f64 / plug_flushes as f64),
            enters: None,
            ios_per_call: None,
        }
    }

    /// Sets the enter count and IOS/call.
    pub fn set_enters(&mut self, enters: u64) {
        self.enters = Some(enters);
        self.ios_per_call = (enters > 0).then(|| self.requests as f64 / enters as f64);
    }

    /// Data requests (reads, writes, discards).
    pub fn data_requests(&self) -> u64 {
        self.read_requests + self.write_requests + self.discard_requests
    }
}

/// How deep the replay kept the queue, sampled each time its loop waited
/// for a completion after issuing every IO the rules allowed. An IO the
/// replay has issued but that holds no engine tag waits inside the engine
/// (for an ordering barrier of the engine, or for a tag).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DepthFigures {
    /// Samples: how many times the loop waited.
    pub waits: u64,
    /// Most IOs in flight at once (issued by the replay, not yet back).
    pub max_in_flight: u64,
    /// Mean IOs in flight when the loop waited (at most `iodepth`).
    pub mean_in_flight: f64,
    /// Mean engine tags held (requests sent to the device) when the loop
    /// waited.
    pub mean_tags_in_use: f64,
}

/// The result of one replay.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// How IOs were timed.
    pub timing: Timing,
    /// Most IOs in flight.
    pub iodepth: u32,
    /// Cores the IO was spread over.
    pub cores: usize,
    /// Flushes were barriers (false: queued like other IOs).
    pub flush_barrier: bool,
    /// Overlapping IOs were kept in trace order.
    pub overlap_order: bool,
    /// Trace IOs replayed (all ops).
    pub ios: u64,
    /// Bytes moved by reads and writes.
    pub bytes: u64,
    /// Wall time from the first issue to the last completion, seconds
    /// (the final verification read-back excluded).
    pub elapsed_s: f64,
    /// `ios / elapsed_s`.
    pub iops: f64,
    /// Read and write bytes per second.
    pub bandwidth_bytes_per_s: f64,
    /// Per op, in the order read, write, flush, discard.
    pub ops: Vec<OpReport>,
    /// The engine's figures.
    pub engine: EngineFigures,
    /// How late IOs were issued against their recorded time (`--timing
    /// original` only).
    pub lag: Option<LatencySummary>,
    /// IOs that waited for an earlier overlapping IO (each counted once).
    pub overlap_waits: u64,
    /// IOs that waited at a flush barrier: a flush for the writes before
    /// it, or an IO for the flush before it (each counted once).
    pub flush_waits: u64,
    /// How deep the queue was kept.
    pub depth: DepthFigures,
    /// Verification (`None` without `--verify`).
    pub verify: Option<VerifyStats>,
    /// The replay was stopped before the end of the trace (a SIGINT or
    /// SIGTERM): no new IO was issued after it, those in flight were
    /// waited for, and `--verify`'s final read-back was skipped.
    pub interrupted: bool,
}

impl ReplayReport {
    /// The figures of `op`.
    pub fn op(&self, op: TraceOp) -> &OpReport {
        &self.ops[op.index()]
    }

    /// The report as text, one item per line.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_text(&mut s);
        s
    }

    fn write_text(&self, s: &mut String) -> std::fmt::Result {
        if self.interrupted {
            writeln!(
                s,
                "interrupted: stopped early; the figures below are of the IOs replayed before"
            )?;
        }
        writeln!(
            s,
            "replayed {} IOs in {:.3} s (timing {}, iodepth {}, {} core{}, flushes {}{}): \
             {:.0} IOPS, {}/s",
            self.ios,
            self.elapsed_s,
            self.timing.name(),
            self.iodepth,
            self.cores,
            if self.cores == 1 { "" } else { "s" },
            if self.flush_barrier {
                "as barriers"
            } else {
                "queued"
            },
            if self.overlap_order {
                ""
            } else {
                ", overlaps unordered"
            },
            self.iops,
            human_bytes(self.bandwidth_bytes_per_s)
        )?;
        writeln!(
            s,
            "  {:<8} {:>9} {:>11} {:>10} {:>10} {:>10} {:>10}",
            "op", "ios", "bytes", "p50", "p99", "p99.9", "max"
        )?;
        for o in self.ops.iter().filter(|o| o.ios > 0) {
            let l = |f: fn(&LatencySummary) -> u64| {
                o.latency.as_ref().map_or("n/a".into(), |x| human_ns(f(x)))
            };
            writeln!(
                s,
                "  {:<8} {:>9} {:>11} {:>10} {:>10} {:>10} {:>10}",
                o.op,
                o.ios,
                human_bytes(o.bytes as f64),
                l(|x| x.p50_ns),
                l(|x| x.p99_ns),
                l(|x| x.p999_ns),
                l(|x| x.max_ns)
            )?;
        }
        let e = &self.engine;
        writeln!(
            s,
            "  engine: {} bios -> {} requests (read {}, write {}, flush {}, discard {}), \
             {} merges, {} requests/plug flush, IOS/call {}",
            e.bios,
            e.requests,
            e.read_requests,
            e.write_requests,
            e.flush_requests,
            e.discard_requests,
            e.merges,
            opt(e.requests_per_flush),
            opt(e.ios_per_call)
        )?;
        writeln!(
            s,
            "  ordering: {} IOs waited for an overlapping IO, {} at a flush barrier",
            self.overlap_waits, self.flush_waits
        )?;
        writeln!(
            s,
            "  depth: {:.1} IOs in flight on average when waiting (max {}), {:.1} holding an engine tag",
            self.depth.mean_in_flight, self.depth.max_in_flight, self.depth.mean_tags_in_use
        )?;
        if let Some(l) = &self.lag {
            writeln!(
                s,
                "  behind schedule: p50 {}, p99 {}, max {}",
                human_ns(l.p50_ns),
                human_ns(l.p99_ns),
                human_ns(l.max_ns)
            )?;
        }
        if let Some(v) = &self.verify {
            writeln!(
                s,
                "  verify: {} sectors checked in replayed reads, {} in the final read-back, {} \
                 mismatched",
                v.read_sectors_checked, v.final_sectors_checked, v.mismatched_sectors
            )?;
        }
        Ok(())
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |x| format!("{x:.2}"))
}

/// `1.5 ms`, `12 us`, `800 ns`.
pub fn human_ns(ns: u64) -> String {
    match ns {
        0..=9_999 => format!("{ns} ns"),
        10_000..=9_999_999 => format!("{:.1} us", ns as f64 / 1e3),
        10_000_000..=9_999_999_999 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

/// `1.5 MiB` style.
pub fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(human_ns(800), "800 ns");
        assert_eq!(human_ns(15_000), "15.0 us");
        assert_eq!(human_ns(25_000_000), "25.0 ms");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
        assert_eq!(human_bytes(100.0), "100 B");
    }

    #[test]
    fn engine_figures_are_deltas_with_ios_per_call() {
        let before = IoStats {
            requests: 10,
            write: plugio_engine::OpStats {
                merges: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut after = before;
        after.requests = 30;
        after.bios = 40;
        after.plug_flushes = 4;
        after.write.ios = 20;
        after.write.merges = 11;
        let mut e = EngineFigures::between(&before, &after);
        assert_eq!((e.requests, e.merges, e.write_requests), (20, 10, 20));
        assert_eq!(e.requests_per_flush, Some(5.0));
        assert_eq!(e.ios_per_call, None);
        e.set_enters(8);
        assert_eq!(e.ios_per_call, Some(2.5));
    }
}
