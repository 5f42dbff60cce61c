//! What `plugio bench` prints: the header, one line per second in the
//! style of fio's t/io_uring, the summary with latency percentiles, and the
//! JSON result ([`BenchResult`]).
//!
//! Invariants: figures that the engine cannot give are `null` in JSON and
//! "n/a" in text, never zero or a guess; progress goes to stderr when
//! stdout carries JSON.

use std::io::Write;
use std::time::Duration;

use plugio_engine::tag::TagStats;
use serde::{Deserialize, Serialize};

use super::error::BenchError;
use super::options::{Ablation, EngineKind, Job};
use super::stats::{Counters, Snapshot};
use super::target::Target;
use super::{EngineOutput, Timeline};

/// The name `--ablate` takes for `a`.
pub fn ablation_name(a: Ablation) -> &'static str {
    match a {
        Ablation::TagBatch => "tag-batch",
        Ablation::TagBatchRetry => "tag-batch-retry",
        Ablation::Plug => "plug",
        Ablation::Merge => "merge",
        Ablation::BioCache => "bio-cache",
        Ablation::BufCache => "buf-cache",
        Ablation::CachedClock => "cached-clock",
    }
}

/// The engine's name as on the command line.
pub fn engine_name(e: EngineKind) -> &'static str {
    match e {
        EngineKind::Plugio => "plugio",
        EngineKind::Raw => "raw",
        EngineKind::Nop => "nop",
        EngineKind::Glommio => "glommio",
        EngineKind::Tokio => "tokio",
        EngineKind::Psync => "psync",
    }
}

/// One second of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Second {
    /// IOs completed in the second.
    pub ios: u64,
    /// Bytes moved in the second.
    pub bytes: u64,
    /// SQEs per `io_uring_enter` (`None` where the engine has no ring we
    /// can see).
    pub submit_per_call: Option<f64>,
    /// CQEs per `io_uring_enter`.
    pub reap_per_call: Option<f64>,
    /// Mean tags per batch get (plugio engines).
    pub tags_per_batch: Option<f64>,
    /// Batch gets that got fewer tags than asked.
    pub partial_batches: Option<u64>,
    /// Times a flush waited for tags.
    pub tag_waits: Option<u64>,
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

impl Second {
    /// The figures of a second from its counter delta and the tag totals
    /// at its end and start.
    pub fn new(delta: &Snapshot, tags: Option<&TagStats>, before: Option<&TagStats>) -> Second {
        let tag_delta = match (tags, before) {
            (Some(t), Some(b)) => Some(tag_since(t, b)),
            (Some(t), None) => Some(*t),
            _ => None,
        };
        Second {
            ios: delta.ios,
            bytes: delta.bytes,
            submit_per_call: ratio(delta.submitted, delta.enters),
            reap_per_call: ratio(delta.reaped, delta.enters),
            tags_per_batch: tag_delta.and_then(|t| ratio(t.batch_tags, t.batch_calls)),
            partial_batches: tag_delta.map(|t| t.partial_batches),
            tag_waits: tag_delta.map(|t| t.waits),
        }
    }
}

fn tag_since(now: &TagStats, before: &TagStats) -> TagStats {
    TagStats {
        single_calls: now.single_calls.saturating_sub(before.single_calls),
        single_tags: now.single_tags.saturating_sub(before.single_tags),
        batch_calls: now.batch_calls.saturating_sub(before.batch_calls),
        batch_tags: now.batch_tags.saturating_sub(before.batch_tags),
        partial_batches: now.partial_batches.saturating_sub(before.partial_batches),
        empty_batches: now.empty_batches.saturating_sub(before.empty_batches),
        short_allocs: now.short_allocs.saturating_sub(before.short_allocs),
        waits: now.waits.saturating_sub(before.waits),
        puts: now.puts.saturating_sub(before.puts),
    }
}

/// Latency percentiles in ns over the sampled IOs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    /// IOs whose latency was recorded.
    pub samples: u64,
    /// One IO in this many was recorded.
    pub sample_every: u32,
    /// Mean.
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest.
    pub max_ns: u64,
}

/// Plug and ring figures over the whole run (`None`: not available for
/// this engine or not yet in the engine).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PlugFigures {
    /// SQEs per `io_uring_enter`.
    pub submit_per_call: Option<f64>,
    /// CQEs per `io_uring_enter`.
    pub reap_per_call: Option<f64>,
    /// Mean tags per batch get.
    pub tags_per_batch: Option<f64>,
    /// Batch gets that returned fewer tags than asked.
    pub partial_batches: Option<u64>,
    /// Times a flush parked waiting for tags.
    pub tag_waits: Option<u64>,
    /// Bios merged into requests (engine iostats, issue 5).
    pub merges: Option<u64>,
    /// Requests per plug flush (engine iostats, issue 5).
    pub requests_per_flush: Option<f64>,
}

/// The result of one run (`--json` prints it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchResult {
    /// `--tag`, if given.
    pub tag: Option<String>,
    /// Engine name.
    pub engine: String,
    /// Pattern (`randread`...).
    pub rw: String,
    /// Percent reads.
    pub rwmixread: u32,
    /// Bytes per IO.
    pub bs: u64,
    /// IOs in flight per core.
    pub iodepth: u32,
    /// Cores (jobs).
    pub numjobs: usize,
    /// O_DIRECT.
    pub direct: bool,
    /// `--nomerges` as asked.
    pub nomerges: Option<u8>,
    /// Registered buffers asked for.
    pub fixedbufs: bool,
    /// Registered files asked for.
    pub registerfiles: bool,
    /// NOP IO.
    pub nop: bool,
    /// `--ablate` values.
    pub ablate: Vec<String>,
    /// Target path (`null` for `raw --nop` without a file).
    pub filename: Option<String>,
    /// "temporary file", "file" or "block device".
    pub target_kind: Option<String>,
    /// Bytes of the target used.
    pub size_bytes: u64,
    /// The target's logical block size in bytes.
    pub logical_block_bytes: Option<u32>,
    /// Seconds from start to the stop request.
    pub runtime_s: f64,
    /// IOs completed (including those in flight at the stop).
    pub ios: u64,
    /// Bytes moved (including those in flight at the stop).
    pub bytes: u64,
    /// IOs completed before the stop / runtime.
    pub iops: f64,
    /// MiB/s over the same window.
    pub bw_mib_s: f64,
    /// Process CPU time (all threads) per IO, ns.
    pub cpu_ns_per_io: Option<f64>,
    /// Latency percentiles.
    pub latency: Latency,
    /// Plug and ring figures.
    pub plug: PlugFigures,
    /// Per-second samples.
    pub seconds: Vec<Second>,
    /// What could not be done as asked.
    pub notes: Vec<String>,
}

impl BenchResult {
    /// Builds the result from the run's pieces.
    pub fn new(
        job: &Job,
        target: Option<&Target>,
        counters: &Counters,
        output: EngineOutput,
        timeline: Timeline,
        cpu: Duration,
    ) -> BenchResult {
        let total = counters.total();
        let secs = timeline.elapsed.as_secs_f64().max(1e-9);
        let h = &output.latency;
        let latency = Latency {
            samples: h.len(),
            sample_every: job.clat_sample,
            mean_ns: if h.is_empty() { 0.0 } else { h.mean() },
            p50_ns: h.value_at_quantile(0.50),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            max_ns: h.max(),
        };
        let tags = output.tag_stats;
        let plug = PlugFigures {
            submit_per_call: ratio(total.submitted, total.enters),
            reap_per_call: ratio(total.reaped, total.enters),
            tags_per_batch: tags.and_then(|t| ratio(t.batch_tags, t.batch_calls)),
            partial_batches: tags.map(|t| t.partial_batches),
            tag_waits: tags.map(|t| t.waits),
            merges: None,
            requests_per_flush: None,
        };
        BenchResult {
            tag: job.tag.clone(),
            engine: engine_name(job.engine).to_owned(),
            rw: format!("{:?}", job.rw).to_lowercase(),
            rwmixread: job.read_pct,
            bs: job.bs_bytes,
            iodepth: job.iodepth,
            numjobs: job.cores,
            direct: job.direct,
            nomerges: job.nomerges,
            fixedbufs: job.fixed_bufs,
            registerfiles: job.register_files,
            nop: job.nop,
            ablate: job
                .ablate
                .iter()
                .map(|a| ablation_name(*a).to_owned())
                .collect(),
            filename: target.map(|t| t.path.display().to_string()),
            target_kind: target.map(|t| t.kind.to_owned()),
            size_bytes: target.map_or(0, |t| t.size_bytes),
            logical_block_bytes: target.map(|t| t.logical_block_bytes),
            runtime_s: secs,
            ios: total.ios,
            bytes: total.bytes,
            iops: timeline.at_stop.ios as f64 / secs,
            bw_mib_s: timeline.at_stop.bytes as f64 / secs / (1u64 << 20) as f64,
            cpu_ns_per_io: ratio(cpu.as_nanos() as u64, total.ios),
            latency,
            plug,
            seconds: timeline.seconds,
            notes: output.notes,
        }
    }
}

/// Prints the header and the per-second lines (to stdout, or stderr with
/// `--json`; nothing with `--quiet`).
pub struct Printer {
    quiet: bool,
    to_stderr: bool,
}

impl Printer {
    /// A printer for `job`.
    pub fn new(job: &Job) -> Printer {
        Printer {
            quiet: job.quiet,
            to_stderr: job.json,
        }
    }

    fn line(&self, text: &str) {
        if self.quiet {
            return;
        }
        if self.to_stderr {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }

    /// The job's description.
    pub fn header(&self, job: &Job, target: Option<&Target>) {
        let what = if job.nop {
            "nop".to_owned()
        } else {
            format!(
                "{} bs={}",
                format!("{:?}", job.rw).to_lowercase(),
                fmt_bytes(job.bs_bytes)
            )
        };
        let on = match target {
            Some(t) => format!(
                "{} ({}, {})",
                t.path.display(),
                t.kind,
                fmt_bytes(t.size_bytes)
            ),
            None => "no file".to_owned(),
        };
        self.line(&format!(
            "plugio bench: engine={} {what} iodepth={} numjobs={} direct={} on {on}, {:.0} s",
            engine_name(job.engine),
            job.iodepth,
            job.cores,
            u8::from(job.direct),
            job.runtime.as_secs_f64()
        ));
    }

    /// One second's line: `IOPS=…, BW=…MiB/s, IOS/call=…/…` plus plug
    /// figures where the engine has them.
    pub fn second(&self, index: usize, s: &Second) {
        let mut line = format!(
            "[{index:>3}s] IOPS={}, BW={}MiB/s, IOS/call={}/{}",
            s.ios,
            s.bytes >> 20,
            opt_f(s.submit_per_call, 0),
            opt_f(s.reap_per_call, 0)
        );
        if let Some(t) = s.tags_per_batch {
            line += &format!(
                ", tags/batch={t:.1}, partial={}, tag waits={}",
                s.partial_batches.unwrap_or(0),
                s.tag_waits.unwrap_or(0)
            );
        }
        self.line(&line);
    }
}

fn opt_f(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(v) => format!("{v:.decimals$}"),
        None => "-".to_owned(),
    }
}

/// `n` bytes in the largest binary unit that divides it (`4KiB`,
/// `1024MiB`), else bytes.
pub fn fmt_bytes(n: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift && n % (1 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    format!("{n}B")
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

/// Prints the summary (text), or the JSON result with `--json`.
///
/// # Errors
/// Writing to stdout failed.
pub fn print_result(job: &Job, r: &BenchResult) -> Result<(), BenchError> {
    let mut out = std::io::stdout().lock();
    let io = |e| BenchError::io("writing the result", e);
    for n in &r.notes {
        eprintln!("note: {n}");
    }
    if job.json {
        serde_json::to_writer(&mut out, r)
            .map_err(|e| BenchError::io("writing the JSON result", e.into()))?;
        writeln!(out).map_err(io)?;
        return Ok(());
    }
    let l = &r.latency;
    let p = &r.plug;
    writeln!(
        out,
        "{}: IOPS={:.0}, BW={:.1}MiB/s ({} IOs, {} bytes in {:.2} s), CPU {} ns/IO",
        r.engine,
        r.iops,
        r.bw_mib_s,
        r.ios,
        r.bytes,
        r.runtime_s,
        opt_f(r.cpu_ns_per_io, 0)
    )
    .map_err(io)?;
    if l.samples > 0 {
        writeln!(
            out,
            "  clat (usec): p50={}, p99={}, p99.9={}, max={}, mean={:.1} ({} samples, 1 IO in {})",
            us(l.p50_ns),
            us(l.p99_ns),
            us(l.p999_ns),
            us(l.max_ns),
            l.mean_ns / 1000.0,
            l.samples,
            l.sample_every
        )
        .map_err(io)?;
    }
    writeln!(
        out,
        "  plug: IOS/call={}/{}, tags/batch={}, partial batches={}, tag waits={}, \
         merges=n/a, requests/flush=n/a (engine iostats: issue 5)",
        opt_f(p.submit_per_call, 1),
        opt_f(p.reap_per_call, 1),
        opt_f(p.tags_per_batch, 2),
        p.partial_batches.map_or("n/a".into(), |v| v.to_string()),
        p.tag_waits.map_or("n/a".into(), |v| v.to_string()),
    )
    .map_err(io)?;
    Ok(())
}
