//! What `plugio bench` prints: the header, one line per second in the
//! style of fio's t/io_uring, the summary with latency percentiles, and the
//! JSON result ([`BenchResult`]).
//!
//! Invariants: figures that the engine cannot give are `null` in JSON and
//! "n/a" in text, never zero or a guess; progress goes to stderr when
//! stdout carries JSON.

use std::io::Write;
use std::time::Duration;

use hdrhistogram::Histogram;
use plugio_cli::json::{LatencySummary, RunMeta};
use plugio_engine::IoStats;
use serde::{Deserialize, Serialize};

use super::error::BenchError;
use super::options::{Ablation, EngineKind, Job};
use super::output::{EngineOutput, StopReason};
use super::stats::{Counters, CpuTimes, Snapshot};
use super::target::Target;
use super::units::fmt_bytes;

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
        Ablation::Iostats => "iostats",
        Ablation::FastLane => "fast-lane",
        Ablation::UntimedWait => "untimed-wait",
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
        EngineKind::Monoio => "monoio",
        EngineKind::TokioUring => "tokio-uring",
        EngineKind::Compio => "compio",
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
    /// Bios merged into another bio's request (plugio engines).
    pub merges: Option<u64>,
    /// Requests per plug flush.
    pub requests_per_flush: Option<f64>,
    /// Mean tags per batch get.
    pub tags_per_batch: Option<f64>,
    /// Batch gets that got fewer tags than asked.
    pub partial_batches: Option<u64>,
    /// Times a flush waited for tags.
    pub tag_waits: Option<u64>,
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// The plug figures of an iostats delta (or of a whole run).
#[derive(Debug, Clone, Copy, Default)]
struct PlugDelta {
    merges: u64,
    plug_flushes: u64,
    requests: u64,
    batch_calls: u64,
    batch_tags: u64,
    partial_batches: u64,
    waits: u64,
}

impl PlugDelta {
    fn of(s: &IoStats) -> PlugDelta {
        PlugDelta {
            merges: s.read.merges + s.write.merges + s.discard.merges,
            plug_flushes: s.plug_flushes,
            requests: s.requests,
            batch_calls: s.tags.batch_calls,
            batch_tags: s.tags.batch_tags,
            partial_batches: s.tags.partial_batches,
            waits: s.tags.waits,
        }
    }

    fn since(&self, b: &PlugDelta) -> PlugDelta {
        PlugDelta {
            merges: self.merges.saturating_sub(b.merges),
            plug_flushes: self.plug_flushes.saturating_sub(b.plug_flushes),
            requests: self.requests.saturating_sub(b.requests),
            batch_calls: self.batch_calls.saturating_sub(b.batch_calls),
            batch_tags: self.batch_tags.saturating_sub(b.batch_tags),
            partial_batches: self.partial_batches.saturating_sub(b.partial_batches),
            waits: self.waits.saturating_sub(b.waits),
        }
    }
}

/// SQEs per enter: the engine's requests (one SQE each) when it keeps
/// iostats, else the SQEs the engine counted itself.
fn submit_per_call(delta: &Snapshot, plug: Option<&PlugDelta>) -> Option<f64> {
    match plug {
        Some(p) if p.requests > 0 => ratio(p.requests, delta.enters),
        _ if delta.submitted > 0 => ratio(delta.submitted, delta.enters),
        _ => None,
    }
}

impl Second {
    /// The figures of a second from its counter delta and the iostats at
    /// its end and start.
    pub fn new(delta: &Snapshot, now: Option<&IoStats>, before: Option<&IoStats>) -> Second {
        let plug = now.map(|n| {
            let n = PlugDelta::of(n);
            before.map_or(n, |b| n.since(&PlugDelta::of(b)))
        });
        Second {
            ios: delta.ios,
            bytes: delta.bytes,
            submit_per_call: submit_per_call(delta, plug.as_ref()),
            reap_per_call: ratio(delta.reaped, delta.enters),
            merges: plug.map(|p| p.merges),
            requests_per_flush: plug.and_then(|p| ratio(p.requests, p.plug_flushes)),
            tags_per_batch: plug.and_then(|p| ratio(p.batch_tags, p.batch_calls)),
            partial_batches: plug.map(|p| p.partial_batches),
            tag_waits: plug.map(|p| p.waits),
        }
    }
}

/// Latency percentiles in ns over the sampled IOs: the JSON vocabulary's
/// [`LatencySummary`] (shared with `plugio replay`).
pub type Latency = LatencySummary;

/// The figures of one direction (fio's `read:` and `write:` sections).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DirFigures {
    /// IOs completed.
    pub ios: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// `ios / runtime_s`.
    pub iops: f64,
    /// `bytes / runtime_s`, in MiB/s.
    pub bw_mib_s: f64,
    /// Latency of this direction's sampled IOs.
    pub latency: Latency,
}

impl DirFigures {
    fn new(ios: u64, bytes: u64, secs: f64, h: &Histogram<u64>, every: u32) -> DirFigures {
        DirFigures {
            ios,
            bytes,
            iops: ios as f64 / secs,
            bw_mib_s: bytes as f64 / secs / (1u64 << 20) as f64,
            latency: LatencySummary::of(h, every),
        }
    }
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
    /// Bios merged into another bio's request.
    pub merges: Option<u64>,
    /// Requests per plug flush.
    pub requests_per_flush: Option<f64>,
    /// Bios per request (1.0 without merging).
    pub bios_per_request: Option<f64>,
    /// Requests that went out on a registered buffer (`READ_FIXED` /
    /// `WRITE_FIXED`, the vectored `READV_FIXED` / `WRITEV_FIXED`, or an
    /// NVMe passthrough command with `IORING_URING_CMD_FIXED`), per request.
    #[serde(default)]
    pub fixed_buf_share: Option<f64>,
    /// Requests issued again after a short or failed completion.
    #[serde(default)]
    pub requeues: Option<u64>,
    /// The device's counters as a `/proc/diskstats` line.
    pub diskstats: Option<String>,
}

/// The result of one run (`--json` prints it, in the vocabulary of
/// [`plugio_cli::json`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchResult {
    /// `schema_version`, `command`, `plugio_version`, `kernel`, `machine`.
    #[serde(flatten)]
    pub meta: RunMeta,
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
    /// Seconds from the start of IO until the last IO completed (the
    /// window `iops` and `bw_mib_s` are computed over).
    pub runtime_s: f64,
    /// `--number_ios` (IOs per job), if given.
    pub number_ios: Option<u64>,
    /// How an idle core waited (`ring` or `futex`; plugio engines only).
    pub idle_wait: Option<String>,
    /// IOs completed (including those in flight at the stop).
    pub ios: u64,
    /// Bytes moved (including those in flight at the stop).
    pub bytes: u64,
    /// `ios / runtime_s`.
    pub iops: f64,
    /// `bytes / runtime_s`, in MiB/s.
    pub bw_mib_s: f64,
    /// Process CPU time (all threads) per IO, ns.
    pub cpu_ns_per_io: Option<f64>,
    /// The user-space part of `cpu_ns_per_io`: what the engine's own code
    /// costs (the kernel's part is `cpu_system_ns_per_io`). The kernel
    /// splits a process's CPU time by sampling at the timer tick (unless
    /// it accounts precisely, `CONFIG_VIRT_CPU_ACCOUNTING_GEN`), so the
    /// split is reliable over runs of seconds, not for very short ones;
    /// the total is exact.
    #[serde(default)]
    pub cpu_user_ns_per_io: Option<f64>,
    /// The kernel's part of `cpu_ns_per_io` (syscalls, and the IO the
    /// kernel runs inline in them).
    #[serde(default)]
    pub cpu_system_ns_per_io: Option<f64>,
    /// Heap allocations (all threads) per IO, over the window of
    /// `cpu_ns_per_io`: from the start of IO (the engine's start mark)
    /// until plugio's last IO is counted, or until a peer engine returns.
    pub allocs_per_io: Option<f64>,
    /// Latency percentiles, reads and writes together.
    pub latency: Latency,
    /// Reads (and NOPs) alone.
    pub read: DirFigures,
    /// Writes alone.
    pub write: DirFigures,
    /// Plug and ring figures.
    pub plug: PlugFigures,
    /// Per-second samples.
    pub seconds: Vec<Second>,
    /// What could not be done as asked.
    pub notes: Vec<String>,
    /// The signal that stopped the run early (`"SIGINT"`, `"SIGTERM"`),
    /// if one did: the figures cover the run until then.
    #[serde(default)]
    pub interrupted_by: Option<String>,
    /// Why the run stopped early, if it did (not in the JSON).
    #[serde(skip)]
    pub stopped_by: Option<StopReason>,
}

impl BenchResult {
    /// Builds the result from the run's pieces.
    pub fn new(
        job: &Job,
        target: Option<&Target>,
        counters: &Counters,
        output: EngineOutput,
        timeline: Timeline,
        cpu: CpuTimes,
    ) -> BenchResult {
        let total = counters.total();
        let secs = timeline.elapsed.as_secs_f64().max(1e-9);
        let lat = &output.latency;
        let every = job.clat_sample;
        let latency = LatencySummary::of(&lat.all(), every);
        let read = DirFigures::new(
            total.ios - total.write_ios,
            total.bytes - total.write_bytes,
            secs,
            &lat.read,
            every,
        );
        let write = DirFigures::new(total.write_ios, total.write_bytes, secs, &lat.write, every);
        let io = output.iostats;
        let d = io.as_ref().map(PlugDelta::of);
        let plug = PlugFigures {
            submit_per_call: submit_per_call(&total, d.as_ref()),
            reap_per_call: ratio(total.reaped, total.enters),
            tags_per_batch: d.and_then(|t| ratio(t.batch_tags, t.batch_calls)),
            partial_batches: d.map(|t| t.partial_batches),
            tag_waits: d.map(|t| t.waits),
            merges: d.map(|t| t.merges),
            requests_per_flush: d.and_then(|t| ratio(t.requests, t.plug_flushes)),
            bios_per_request: io.as_ref().and_then(|s| ratio(s.bios, s.requests)),
            fixed_buf_share: io
                .as_ref()
                .and_then(|s| ratio(s.fixed_buf_requests, s.requests + s.requeues)),
            requeues: io.as_ref().map(|s| s.requeues),
            diskstats: io.as_ref().map(|s| s.diskstats_line("plugio")),
        };
        BenchResult {
            meta: RunMeta::now("bench"),
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
            number_ios: job.number_ios,
            idle_wait: matches!(job.engine, EngineKind::Plugio | EngineKind::Nop)
                .then(|| format!("{:?}", job.idle_wait).to_lowercase()),
            ios: total.ios,
            bytes: total.bytes,
            // The same count and window the summary prints.
            iops: total.ios as f64 / secs,
            bw_mib_s: total.bytes as f64 / secs / (1u64 << 20) as f64,
            cpu_ns_per_io: ratio(cpu.total().as_nanos() as u64, total.ios),
            cpu_user_ns_per_io: ratio(cpu.user.as_nanos() as u64, total.ios),
            cpu_system_ns_per_io: ratio(cpu.system.as_nanos() as u64, total.ios),
            allocs_per_io: None,
            latency,
            read,
            write,
            plug,
            seconds: timeline.seconds,
            notes: output.notes,
            interrupted_by: match timeline.stopped_by {
                Some(StopReason::Signal(sig)) => Some(sig.as_str().to_owned()),
                _ => None,
            },
            stopped_by: timeline.stopped_by,
        }
    }
}

/// Prints the header and the per-second lines (to stdout, or stderr with
/// `--json`; nothing with `--quiet`). A write that fails because standard
/// output was closed is remembered ([`Printer::stdout_closed`]), not a
/// panic; another failed write (a full disk, `/dev/full`) is kept for
/// [`Printer::take_write_error`], so the run can stop at the header instead
/// of failing only when it writes the result (found by a break-it helper).
pub struct Printer {
    quiet: bool,
    to_stderr: bool,
    closed: std::cell::Cell<bool>,
    write_error: std::cell::RefCell<Option<std::io::Error>>,
}

impl Printer {
    /// A printer for `job`.
    pub fn new(job: &Job) -> Printer {
        Printer {
            quiet: job.quiet,
            to_stderr: job.json,
            closed: std::cell::Cell::new(false),
            write_error: std::cell::RefCell::new(None),
        }
    }

    /// The first write error other than a closed output, if one happened
    /// since the last call.
    pub fn take_write_error(&self) -> Option<std::io::Error> {
        self.write_error.borrow_mut().take()
    }

    /// True once a line could not be written because standard output (or
    /// standard error, with `--json`) was closed.
    pub fn stdout_closed(&self) -> bool {
        self.closed.get()
    }

    fn line(&self, text: &str) {
        if self.quiet || self.closed.get() {
            return;
        }
        let written = if self.to_stderr {
            writeln!(std::io::stderr(), "{text}")
        } else {
            writeln!(std::io::stdout(), "{text}")
        };
        match written {
            Err(e) if crate::signals::is_broken_pipe(&e) => self.closed.set(true),
            Err(e) => {
                self.write_error.borrow_mut().get_or_insert(e);
            }
            Ok(()) => {}
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
                plugio_cli::shown::path(&t.path),
                t.kind,
                fmt_bytes(t.size_bytes)
            ),
            None => "no file".to_owned(),
        };
        let ios = job
            .number_ios
            .map_or(String::new(), |n| format!(" or {n} IOs per job"));
        self.line(&format!(
            "plugio bench: engine={} {what} iodepth={} numjobs={} direct={} on {on}, {} s{ios}",
            engine_name(job.engine),
            job.iodepth,
            job.cores,
            u8::from(job.direct),
            // As given: 0.5 stays 0.5 (`{:.0}` printed 0), 2 stays 2.
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
        if let Some(m) = s.merges {
            line += &format!(
                ", merges={m}, rq/flush={}, tags/batch={}, partial={}, tag waits={}",
                opt_f(s.requests_per_flush, 1),
                opt_f(s.tags_per_batch, 1),
                s.partial_batches.unwrap_or(0),
                s.tag_waits.unwrap_or(0)
            );
        }
        self.line(&line);
    }
}

/// The elapsed time as printed: two decimals, more below a tenth of a
/// second, so that the IOPS printed beside it can be checked against it
/// (a 1 ms run said "in 0.00 s": found by a break-it helper).
fn elapsed_s(secs: f64) -> String {
    if secs < 0.1 {
        format!("{secs:.5}")
    } else {
        format!("{secs:.2}")
    }
}

fn opt_f(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(v) => format!("{v:.decimals$}"),
        None => "-".to_owned(),
    }
}

/// `p50=…, p90=…, p99=…, p99.9=…, max=…, mean=…` in microseconds.
fn percentiles_us(l: &Latency) -> String {
    format!(
        "p50={}, p90={}, p99={}, p99.9={}, max={}, mean={:.1}",
        us(l.p50_ns),
        us(l.p90_ns),
        us(l.p99_ns),
        us(l.p999_ns),
        us(l.max_ns),
        l.mean_ns / 1000.0
    )
}

/// The names of the fields of a `/proc/diskstats` line after major, minor
/// and device name (Documentation/admin-guide/iostats.rst).
const DISKSTATS_FIELDS: [&str; 17] = [
    "reads",
    "reads_merged",
    "sectors_read",
    "read_ms",
    "writes",
    "writes_merged",
    "sectors_written",
    "write_ms",
    "in_flight",
    "io_ms",
    "weighted_ms",
    "discards",
    "discards_merged",
    "sectors_discarded",
    "discard_ms",
    "flushes",
    "flush_ms",
];

/// A `/proc/diskstats` line as `name=value` pairs, zero fields left out
/// (the raw line is in the JSON's `plug.diskstats`).
fn label_diskstats(line: &str) -> String {
    let values: Vec<&str> = line.split_whitespace().skip(3).collect();
    let pairs: Vec<String> = DISKSTATS_FIELDS
        .iter()
        .zip(&values)
        .filter(|(_, v)| **v != "0")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if pairs.is_empty() {
        "all zero".to_owned()
    } else {
        pairs.join(" ")
    }
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

/// Prints the summary (text), or the JSON result with `--json`.
///
/// # Errors
/// [`BenchError::StdoutClosed`] when standard output was closed, else
/// [`BenchError::Io`].
pub fn print_result(job: &Job, r: &BenchResult) -> Result<(), BenchError> {
    let mut out = std::io::stdout().lock();
    let io = |e: std::io::Error| {
        if crate::signals::is_broken_pipe(&e) {
            BenchError::StdoutClosed
        } else {
            BenchError::io("writing the result", e)
        }
    };
    for n in &r.notes {
        eprintln!("note: {n}");
    }
    if let Some(sig) = &r.interrupted_by {
        eprintln!(
            "plugio: interrupted by {sig} after {:.2} s: the summary covers the run so far",
            r.runtime_s
        );
    }
    if job.json {
        serde_json::to_writer(&mut out, r).map_err(|e| io(e.into()))?;
        writeln!(out).map_err(io)?;
        return out.flush().map_err(io);
    }
    let l = &r.latency;
    let p = &r.plug;
    writeln!(
        out,
        "{}: IOPS={:.0}, BW={:.1}MiB/s ({} IOs, {} bytes in {} s), CPU {} ns/IO, {} allocations/IO",
        r.engine,
        r.iops,
        r.bw_mib_s,
        r.ios,
        r.bytes,
        elapsed_s(r.runtime_s),
        opt_f(r.cpu_ns_per_io, 0),
        opt_f(r.allocs_per_io, 3)
    )
    .map_err(io)?;
    if l.samples > 0 {
        writeln!(
            out,
            "  clat (usec): {} ({} samples, 1 IO in {})",
            percentiles_us(l),
            l.samples,
            l.sample_every
        )
        .map_err(io)?;
    }
    // Mixed runs: each direction on its own, as fio's `read:`/`write:`.
    if r.read.ios > 0 && r.write.ios > 0 {
        for (name, d) in [("read", &r.read), ("write", &r.write)] {
            writeln!(
                out,
                "  {name}: IOPS={:.0}, BW={:.1}MiB/s ({} IOs), clat (usec): {}",
                d.iops,
                d.bw_mib_s,
                d.ios,
                percentiles_us(&d.latency)
            )
            .map_err(io)?;
        }
    }
    // Below 1 as printed (one decimal): 0.97 shows as 1.0 and gets no note.
    let below_one = [p.submit_per_call, p.reap_per_call]
        .iter()
        .any(|v| v.is_some_and(|v| v < 0.95));
    writeln!(
        out,
        "  ring: IOS/call={}/{} (SQEs submitted/CQEs reaped per io_uring_enter{})",
        opt_f(p.submit_per_call, 1),
        opt_f(p.reap_per_call, 1),
        if below_one {
            "; below 1: some enters only waited, as an idle or throttled core does"
        } else {
            ""
        }
    )
    .map_err(io)?;
    if let Some(m) = p.merges {
        writeln!(
            out,
            "  plug: merges={m}, requests/flush={}, bios/request={}, tags/batch={}, \
             partial batches={}, tag waits={}, fixed buffers={}, requeues={}",
            opt_f(p.requests_per_flush, 2),
            opt_f(p.bios_per_request, 2),
            opt_f(p.tags_per_batch, 2),
            p.partial_batches.unwrap_or(0),
            p.tag_waits.unwrap_or(0),
            opt_f(p.fixed_buf_share, 2),
            p.requeues.unwrap_or(0),
        )
        .map_err(io)?;
    }
    if let Some(d) = &p.diskstats {
        writeln!(out, "  diskstats: {}", label_diskstats(d)).map_err(io)?;
    }
    out.flush().map_err(io)
}

/// The run's timeline: when IO started and stopped, and the per-second
/// samples.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// From the start of IO until the engine stopped, its last IO
    /// completed (the summary's window).
    pub elapsed: Duration,
    /// One entry per whole second: the counters' delta over it.
    pub seconds: Vec<Second>,
    /// Set when a signal or a closed standard output stopped the run.
    pub stopped_by: Option<StopReason>,
}

#[cfg(test)]
mod tests {
    use super::elapsed_s;

    /// A short run's elapsed time keeps enough digits to check its IOPS.
    #[test]
    fn short_elapsed_times_keep_their_digits() {
        assert_eq!(elapsed_s(0.001_15), "0.00115");
        assert_eq!(elapsed_s(0.099), "0.09900");
        assert_eq!(elapsed_s(3.456), "3.46");
    }
}
