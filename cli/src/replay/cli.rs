//! The `plugio replay TRACE --filename TARGET` command: options, target
//! preparation (created sparse at the trace's extent when missing), the
//! runtime, a progress bar, and the text or JSON report.
//!
//! Invariants: the whole trace is parsed and checked (each IO's length and
//! extent, then the target's size) before the target is created or any IO
//! issued, and a target this command created is removed if the O_DIRECT
//! alignment check refuses the trace; bad input (the trace included) exits
//! with code 2 and a message saying what to change, a failed run with 1;
//! the runtime is shut down after every device handle is dropped.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use plugio_device::{DeviceDriver, ErrorKind, RingConfig};
use plugio_engine::{Device, DeviceOptions};
use plugio_executor::{Driver, ShutdownMode, Unpark};
use serde::Serialize;

use super::dispatch::{replay, ReplayOptions};
use super::error::ReplayError;
use super::load;
use super::report::ReplayReport;
use super::target;
use super::timing::Timing;
use super::trace::{BlkAction, ParseOptions, Trace, TraceFormat, TraceIo, TraceOp};
use super::verify::Unwritten;

/// `plugio replay` options.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// The trace: CSV (`time_ns,op,offset_bytes,len_bytes`), fio iolog
    /// v2/v3, or blkparse text (or the blk tracer's ftrace text);
    /// zstd-compressed or plain; `-` reads it from standard input. (A
    /// blktrace binary: convert it with blkparse.)
    pub trace: PathBuf,
    /// File or block device to replay onto. Created (sparse, the trace's
    /// extent) when it does not exist. Its data is overwritten.
    #[arg(long)]
    pub filename: PathBuf,
    /// The trace's format (default: detected from its first line).
    #[arg(long, value_enum)]
    pub format: Option<TraceFormat>,
    /// blkparse traces: the action to replay (Q: bios before merging; D:
    /// requests after the kernel merged them). Default Q; refused for
    /// the other formats, which record IOs without actions.
    #[arg(long, value_enum)]
    pub action: Option<BlkAction>,
    /// original: each IO at its recorded time; none: as fast as possible
    /// with at most --iodepth in flight.
    #[arg(long, value_enum, default_value_t = Timing::Original)]
    pub timing: Timing,
    /// Most IOs in flight (all cores together); also the device's tags.
    #[arg(long, default_value_t = 32, value_parser = parse_whole::<u32>)]
    pub iodepth: u32,
    /// 1: a flush waits for the writes before it and holds back the IO
    /// after it until it completes (fdatasync's promise); 0: flushes are
    /// queued like other IOs (as fio's iolog replay does).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub flush_barrier: u8,
    /// 1: an IO overlapping an earlier write (or a write overlapping an
    /// earlier read) waits for it; 0: no such ordering, as fio (overlapping
    /// writes race; not allowed with --verify).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub overlap_order: u8,
    /// Cores to spread IO over (1 MiB regions per core).
    #[arg(long, default_value_t = 1, value_parser = parse_whole::<usize>)]
    pub cpus: usize,
    /// Check replayed reads and read every written sector back at the end.
    #[arg(long)]
    pub verify: bool,
    /// Replay only the first N IOs of the trace.
    #[arg(long, value_parser = parse_whole::<usize>)]
    pub limit: Option<usize>,
    /// 1: O_DIRECT; 0: buffered IO.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub direct: u8,
    /// Merging as sysfs `queue/nomerges`: 0 all, 1 one-hit only, 2 none.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub nomerges: u8,
    /// Print the result as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Asked while the replay runs; once it returns true the replay stops
    /// early (see [`ReplayOptions::stop`]). Not an option: the `plugio`
    /// command sets it to "a SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2 or SIGXCPU came".
    #[arg(skip)]
    pub stop: Option<fn() -> bool>,
    /// Told the path of a target the replay created while it may still
    /// remove it (`None` once it is kept or gone). Not an option: the
    /// `plugio` command has a second signal, which ends it before its
    /// cleanup, remove that file (two signals back to back left it:
    /// found by a break-it helper).
    #[arg(skip)]
    pub created_target: Option<fn(Option<&std::path::Path>)>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Parses a whole number option (`--iodepth 32`), saying plainly when the
/// text is negative, not a number or too large; `plugio bench` uses it too.
///
/// # Errors
/// A message naming the text and what to give instead.
pub fn parse_whole<T: TryFrom<u64>>(text: &str) -> Result<T, String> {
    let t = text.trim();
    if t.starts_with('-') && t.len() > 1 {
        return Err(format!(
            "'{text}' is negative: give a whole number of 0 or more"
        ));
    }
    let n: u64 = t.parse().map_err(|e: std::num::ParseIntError| {
        if *e.kind() == std::num::IntErrorKind::PosOverflow {
            format!("'{text}' is too large")
        } else {
            format!("'{text}' is not a whole number")
        }
    })?;
    T::try_from(n).map_err(|_| format!("'{text}' is too large"))
}

/// The JSON result: the run's settings and its [`ReplayReport`].
#[derive(Debug, Serialize)]
pub struct CliReport {
    /// `schema_version`, `command`, `plugio_version`, `kernel`, `machine`
    /// (the vocabulary of [`crate::json`]).
    #[serde(flatten)]
    pub meta: crate::json::RunMeta,
    /// The trace path.
    pub trace: String,
    /// Its format.
    pub format: TraceFormat,
    /// The blkparse action kept; `None` (JSON `null`) for the formats
    /// without actions.
    pub action: Option<BlkAction>,
    /// The target path.
    pub filename: String,
    /// True when the replay created the target.
    pub created: bool,
    /// O_DIRECT.
    pub direct: bool,
    /// sysfs-style nomerges.
    pub nomerges: u8,
    /// IOs per op in the replayed part of the trace: read, write, flush,
    /// discard.
    pub trace_ios: [u64; 4],
    /// Trace lines that held no replayed IO.
    pub skipped_lines: u64,
    /// What could not be done as asked (also printed as `note:` lines on
    /// standard error), as `plugio bench`'s `notes`.
    pub notes: Vec<String>,
    /// The replay.
    #[serde(flatten)]
    pub report: ReplayReport,
}

/// Runs the command and prints its result (text, or JSON with `--json`).
///
/// # Errors
/// See [`ReplayError`]; [`ReplayError::StdoutClosed`] when standard output
/// was closed before the report was written (the caller ends the process
/// by SIGPIPE); [`ReplayError::Interrupted`] when the stop probe stopped
/// the replay, after the report so far was printed and a target the run
/// created was removed (the caller ends the process by the signal).
pub fn main(args: ReplayArgs) -> Result<(), ReplayError> {
    let r = run(&args);
    // A target the run keeps (it ended, or failed after it began) is no
    // longer the second signal's to remove, while the report is written
    // (a second signal then removed a finished replay's target: found by
    // a break-it helper).
    if !matches!(&r, Ok(r) if r.report.interrupted) {
        if let Some(tell) = args.created_target {
            tell(None);
        }
    }
    let r = r?;
    for n in &r.notes {
        eprintln!("note: {n}");
    }
    let text = if args.json {
        let mut j = serde_json::to_string(&r)
            .map_err(|e| ReplayError::io("writing the JSON report", e.into()))?;
        j.push('\n');
        j
    } else {
        r.report.to_text()
    };
    let mut out = std::io::stdout().lock();
    let written = match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(ReplayError::StdoutClosed),
        Err(e) => Err(ReplayError::io("writing the report to standard output", e)),
    };
    if r.report.interrupted {
        // A partly replayed target the run made is of no use: removed.
        if r.created {
            let _ = std::fs::remove_file(&args.filename);
        }
        return Err(ReplayError::Interrupted);
    }
    written
}

/// Parses, prepares the target and replays.
///
/// # Errors
/// See [`ReplayError`].
pub fn run(args: &ReplayArgs) -> Result<CliReport, ReplayError> {
    if args.iodepth == 0 || args.iodepth > 65536 {
        return Err(ReplayError::usage(format!(
            "--iodepth {} is out of range: use 1..=65536",
            args.iodepth
        )));
    }
    if args.cpus == 0 {
        return Err(ReplayError::usage("--cpus 0: use at least 1"));
    }
    if args.verify && args.overlap_order == 0 {
        return Err(ReplayError::usage(
            "--verify needs overlapping IOs kept in order: drop --overlap-order 0",
        ));
    }
    if args.limit == Some(0) {
        return Err(ReplayError::usage("--limit 0: replay at least one IO"));
    }
    let popts = ParseOptions {
        format: args.format,
        action: args.action.unwrap_or(BlkAction::Q),
        limit: args.limit,
    };
    // A format given is checked before the trace is read; a detected one
    // after.
    if let Some(format) = args.format {
        check_action(args, format)?;
    }
    let mut trace = load::load(&args.trace, &popts)?;
    check_action(args, trace.format)?;
    if trace.ios.is_empty() {
        let hint = if trace.format == TraceFormat::Blkparse {
            "; is --action right?"
        } else {
            ""
        };
        return Err(ReplayError::usage(format!(
            "{}: no IOs to replay ({} lines skipped{hint})",
            load::trace_name(&args.trace),
            trace.skipped_lines
        )));
    }
    let mut notes = fits_the_machine(args, &trace)?;
    if let Some(note) = long_span_note(args.timing, &trace) {
        notes.push(note);
    }
    if let Some(note) = out_of_order_note(args.timing, &trace) {
        notes.push(note);
    }
    if let Some(line) = trace.unterminated_io_line {
        notes.push(format!(
            "the trace's last line ({line}) has no newline: if the trace was cut short, the IO \
             of that line may be cut too (replayed as read)"
        ));
    }
    target::refuse_the_trace_itself(&args.filename, &args.trace, &trace)?;
    let created = target::prepare_target(&args.filename, &trace)?;
    if let Some(tell) = args.created_target.filter(|_| created) {
        tell(Some(&args.filename));
    }
    let dev = match open_checked(args, &trace) {
        Ok(dev) => dev,
        Err(e) => {
            // Refused before any IO: leave nothing behind.
            if created {
                let _ = std::fs::remove_file(&args.filename);
            }
            return Err(e);
        }
    };
    if created {
        notes.extend(created_target_note(&trace.ios));
    }
    let trace_ios = trace.counts();
    // The IOs move to the replay task: no copy of the list.
    let ios = std::mem::take(&mut trace.ios);
    let report = replay_on_runtime(args, ios, created, dev, &mut notes)?;
    Ok(CliReport {
        meta: crate::json::RunMeta::now("replay"),
        trace: args.trace.display().to_string(),
        format: trace.format,
        action: (trace.format == TraceFormat::Blkparse)
            .then(|| args.action.unwrap_or(BlkAction::Q)),
        filename: args.filename.display().to_string(),
        created,
        direct: args.direct == 1,
        nomerges: args.nomerges,
        trace_ios,
        skipped_lines: trace.skipped_lines,
        notes,
        report,
    })
}

/// Memory a replay core takes beside the IO buffers (its ring, tags, task
/// table, buffer arena and thread); a deliberate overestimate.
const PER_CORE_BYTES: u64 = 8 << 20;

/// Checks what the replay asks of the machine before anything is created:
/// refuses (exit code 2) one whose cores and IO buffers need more memory
/// than the process has, so that it never grows until the kernel kills it;
/// returns a note when `--cpus` is more than the CPUs it may run on (the
/// cores then share CPUs; it runs). The buffers counted are the most that
/// can be in flight: the `--iodepth` largest reads and writes of the trace.
fn fits_the_machine(args: &ReplayArgs, trace: &Trace) -> Result<Vec<String>, ReplayError> {
    let mut notes = Vec::new();
    if let Ok(cpus) = plugio_executor::allowed_cpus() {
        if args.cpus > cpus.len() {
            notes.push(format!(
                "--cpus {} is more than the {} CPUs this process may run on: the cores share CPUs",
                args.cpus,
                cpus.len()
            ));
        }
    }
    let mut lens: Vec<u64> = trace
        .ios
        .iter()
        .filter(|io| matches!(io.op, TraceOp::Read | TraceOp::Write))
        .map(|io| io.len_bytes)
        .collect();
    let depth = (args.iodepth as usize).min(lens.len());
    let buffers: u64 = if depth == 0 {
        0
    } else {
        lens.select_nth_unstable_by(depth - 1, |a, b| b.cmp(a));
        lens[..depth].iter().sum()
    };
    let needed = buffers.saturating_add((args.cpus as u64).saturating_mul(PER_CORE_BYTES));
    if let Some((available, source)) = crate::machine::available_memory() {
        if needed > available {
            return Err(ReplayError::usage(format!(
                "this replay needs about {} MiB ({} MiB of IO buffers for the {} largest IOs \
                 in flight at --iodepth {}, and {} MiB for --cpus {}), more than the {} MiB \
                 available ({source}): lower --iodepth or --cpus",
                needed >> 20,
                buffers >> 20,
                depth,
                args.iodepth,
                (args.cpus as u64 * PER_CORE_BYTES) >> 20,
                args.cpus,
                available >> 20,
            )));
        }
    }
    Ok(notes)
}

/// A trace spanning more than this at its recorded times gets a note with
/// `--timing original`.
const LONG_SPAN_NS: u64 = 24 * 3600 * 1_000_000_000;

/// A note for a target the replay created (sparse): its reads of ranges
/// the trace had not written before read holes, which cost the device
/// little, so their latencies say nothing of the data the trace was
/// taken from. Said when at least half the reads do (a new user's replay
/// of the shared PostgreSQL trace reported 14 µs reads, all of holes, with
/// no word of it).
fn created_target_note(ios: &[TraceIo]) -> Option<String> {
    let (unwritten, reads) = target::reads_before_writes(ios);
    if unwritten == 0 || unwritten * 2 < reads {
        return None;
    }
    let what = if unwritten == reads && !ios.iter().any(|io| io.op.modifies()) {
        "the trace never writes it: every read reads a hole".to_owned()
    } else {
        format!(
            "{unwritten} of its {reads} reads ({:.0}%) read ranges the trace had not written \
             before them (or had discarded since): they read holes",
            unwritten as f64 * 100.0 / reads as f64
        )
    };
    Some(format!(
        "the target was created for this replay and {what} of a sparse file, which costs the \
         device little; replay onto the data the trace was taken from (or a copy of it) for read \
         latencies that mean something"
    ))
}

/// A note when `--timing original` would take more than a day: the span,
/// and the line of the latest IO (a wrong time unit or a damaged time
/// field shows there).
fn long_span_note(timing: Timing, trace: &Trace) -> Option<String> {
    if timing != Timing::Original {
        return None;
    }
    let first = trace.ios.iter().map(|io| io.time_ns).min()?;
    let last = trace.ios.iter().max_by_key(|io| io.time_ns)?;
    let span_ns = last.time_ns - first;
    (span_ns > LONG_SPAN_NS).then(|| {
        format!(
            "at its recorded times the trace takes {:.1} days (its latest IO is on line {}): \
             --timing none replays it as fast as it can; Ctrl-C stops it with the report so far",
            span_ns as f64 / LONG_SPAN_NS as f64,
            last.line
        )
    })
}

/// A note when `--timing original` meets recorded times out of order: the
/// IOs still go in trace order, each no earlier than its time, so a line
/// whose time is earlier than a line above it is issued late (its lag
/// shows it). Names the first such line and counts them.
fn out_of_order_note(timing: Timing, trace: &Trace) -> Option<String> {
    if timing != Timing::Original {
        return None;
    }
    let mut latest = 0u64;
    let mut first_line = None;
    let mut count = 0u64;
    for io in &trace.ios {
        if io.time_ns < latest {
            count += 1;
            first_line.get_or_insert(io.line);
        }
        latest = latest.max(io.time_ns);
    }
    first_line.map(|line| {
        format!(
            "{count} IO(s) of the trace have a recorded time earlier than a line above them \
             (the first on line {line}): IOs go in trace order, each no earlier than its time, \
             so these are issued late and their lag shows it; sort the trace by time to replay \
             it at its recorded times"
        )
    })
}

/// A core's driver that publishes the ring's enter count after each park.
struct CountingDriver {
    inner: DeviceDriver,
    enters: Arc<AtomicU64>,
}

impl Driver for CountingDriver {
    fn park(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        let r = self.inner.park(timeout);
        if let Some(s) = self.inner.ring_stats() {
            // Relaxed: a display figure; pairs with the Relaxed loads of
            // the probe, nothing else is published through it.
            self.enters.store(s.enters, Ordering::Relaxed);
        }
        r
    }

    fn unparker(&self) -> Arc<dyn Unpark> {
        self.inner.unparker()
    }

    fn attach(&self, core_uid: u64) {
        self.inner.attach(core_uid);
    }
}

/// Refuses `--action` for a trace `format` without actions (CSV, fio
/// iolog): it was accepted and ignored.
fn check_action(args: &ReplayArgs, format: TraceFormat) -> Result<(), ReplayError> {
    if args.action.is_none() || format == TraceFormat::Blkparse {
        return Ok(());
    }
    let what = match format {
        TraceFormat::Csv => "a CSV trace",
        _ => "a fio iolog",
    };
    let name = load::trace_name(&args.trace);
    // A format given is what the trace is read as, whatever it holds.
    let is = if args.format.is_some() {
        format!("--format reads {name} as {what}")
    } else {
        format!("{name} is {what}")
    };
    Err(ReplayError::usage(format!(
        "--action applies to blkparse traces, and {is}: drop --action"
    )))
}

fn open_device(args: &ReplayArgs, writes: bool) -> Result<Device, ReplayError> {
    let opts = DeviceOptions {
        // A trace that only reads and flushes replays onto a target this
        // user may not write, or a read-only block device.
        read_only: !writes,
        queue_depth: args.iodepth,
        direct: args.direct == 1,
        nomerges: args.nomerges,
        // `--overlap-order 0`: no ordering below the replay either (fio's
        // behaviour).
        overlap_order: args.overlap_order == 1,
        ..DeviceOptions::default()
    };
    Device::open(&args.filename, opts).map_err(|e| {
        if matches!(e.kind(), ErrorKind::DirectIoRefused) {
            ReplayError::usage(format!(
                "the file system of {} refuses O_DIRECT (tmpfs before Linux 6.6, ramfs, some FUSE file systems): use --direct 0",
                crate::shown::path(&args.filename)
            ))
        } else if !writes && matches!(e.kind(), ErrorKind::PermissionDenied) {
            ReplayError::usage(format!(
                "{} cannot be read (permission denied): give a file or device this user may read",
                crate::shown::path(&args.filename)
            ))
        } else if matches!(
            e.kind(),
            ErrorKind::PermissionDenied
                | ErrorKind::Io {
                    errno: libc::EROFS | libc::ETXTBSY
                }
        ) {
            // A trace that writes: a target it may not write is bad input,
            // as bench's --rw randwrite on it is.
            let read_only_device = std::fs::File::open(&args.filename)
                .is_ok_and(|f| plugio_device::backend::file::is_read_only_block_device(&f));
            let why = if read_only_device {
                crate::READ_ONLY_DEVICE
            } else if matches!(e.kind(), ErrorKind::PermissionDenied) {
                "permission denied"
            } else if matches!(
                e.kind(),
                ErrorKind::Io {
                    errno: libc::ETXTBSY
                }
            ) {
                "a running program's file"
            } else {
                "its file system is read-only"
            };
            ReplayError::usage(format!(
                "{} cannot be written ({why}): this trace writes or discards; give a file or \
                 device this user may write",
                crate::shown::path(&args.filename)
            ))
        } else {
            ReplayError::engine(format!("open {}", crate::shown::path(&args.filename)), e)
        }
    })
}

fn progress_bar(args: &ReplayArgs, total: usize) -> ProgressBar {
    if args.quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("replay [{bar:40}] {pos}/{len} IOs ({per_sec}, {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

/// Opens the target and checks every IO of the trace against its
/// capacity and O_DIRECT alignment.
fn open_checked(args: &ReplayArgs, trace: &Trace) -> Result<Device, ReplayError> {
    let dev = open_device(args, trace.ios.iter().any(|io| io.op.modifies()))?;
    let g = dev.geometry();
    let align = if args.direct == 1 {
        u64::from(g.dio_offset_align_bytes.max(g.logical_block_bytes))
    } else {
        1
    };
    let capacity = g.capacity_bytes.unwrap_or(u64::MAX);
    trace.check_fits(&args.filename, capacity, align)?;
    Ok(dev)
}

/// Builds a runtime of `--cpus` cores, replays on core 0 through `dev`,
/// shuts down.
fn replay_on_runtime(
    args: &ReplayArgs,
    ios: Vec<TraceIo>,
    created: bool,
    dev: Device,
    notes: &mut Vec<String>,
) -> Result<ReplayReport, ReplayError> {
    let ring = RingConfig {
        sq_entries: args.iodepth.clamp(32, 4096).next_power_of_two(),
        ..RingConfig::default()
    };
    let counters: Arc<Vec<Arc<AtomicU64>>> = Arc::new(
        (0..args.cpus)
            .map(|_| Arc::new(AtomicU64::new(0)))
            .collect(),
    );
    let driver_counters = counters.clone();
    // Set by a core whose driver came up without io_uring (the sync pool
    // served its IO): the report says so.
    let fell_back = Arc::new(AtomicBool::new(false));
    let core_fell_back = fell_back.clone();
    let rt = plugio_executor::Builder::new()
        .cores(args.cpus)
        .thread_name("plugio-replay")
        .driver(move |core| {
            let enters = driver_counters[core.min(driver_counters.len() - 1)].clone();
            let inner = DeviceDriver::new(&ring)?;
            if inner.ring_info().is_none() {
                // Relaxed: read after the shutdown joined the cores.
                core_fell_back.store(true, Ordering::Relaxed);
            }
            Ok(Box::new(CountingDriver { inner, enters }) as Box<dyn Driver>)
        })
        .build()
        .map_err(|e| ReplayError::io("starting the replay runtime", e))?;
    let bar = progress_bar(args, ios.len());
    let bar_cb = bar.clone();
    let probe = counters.clone();
    let opts = ReplayOptions {
        timing: args.timing,
        iodepth: args.iodepth,
        cores: args.cpus,
        verify: args.verify,
        unwritten: if created {
            Unwritten::Zeros
        } else {
            Unwritten::Unchecked
        },
        flush_barrier: args.flush_barrier == 1,
        overlap_order: args.overlap_order == 1,
        progress: Some(Arc::new(move |n| bar_cb.set_position(n))),
        stop: args.stop,
        // Relaxed: see CountingDriver::park.
        enters: Some(Arc::new(move || {
            probe.iter().map(|c| c.load(Ordering::Relaxed)).sum()
        })),
    };
    let ios = Arc::new(ios);
    let task_dev = dev.clone();
    let handle = rt.spawn_on(0, async move { replay(&task_dev, &ios, &opts).await });
    let result = futures::executor::block_on(handle);
    bar.finish_and_clear();
    drop(dev);
    let shutdown = rt.shutdown(ShutdownMode::Wait);
    let report = result.map_err(|e| {
        ReplayError::io(
            "the replay task",
            std::io::Error::other(format!("ended abnormally: {e}")),
        )
    })??;
    shutdown.map_err(|e| {
        ReplayError::io(
            "shutting the runtime down",
            std::io::Error::other(e.to_string()),
        )
    })?;
    // Relaxed: see the store; the shutdown above joined the cores.
    if fell_back.load(Ordering::Relaxed) {
        notes.push(crate::FALLBACK_NOTE.to_owned());
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::{long_span_note, out_of_order_note, parse_whole, Timing};
    use crate::replay::load::parse;
    use crate::replay::trace::ParseOptions;

    #[test]
    fn a_trace_longer_than_a_day_at_its_recorded_times_gets_a_note() {
        let opts = ParseOptions::default();
        let huge = parse("0,R,0,4096\n18446744073709551615,R,0,4096\n", "t", &opts).unwrap();
        let note = long_span_note(Timing::Original, &huge).expect("a note");
        assert!(
            note.contains("line 2") && note.contains("--timing none"),
            "{note}"
        );
        assert_eq!(long_span_note(Timing::None, &huge), None);
        let hour = parse("0,R,0,4096\n3600000000000,R,0,4096\n", "t", &opts).unwrap();
        assert_eq!(long_span_note(Timing::Original, &hour), None);
    }

    #[test]
    fn times_out_of_order_get_a_note_naming_the_first_line() {
        let opts = ParseOptions::default();
        let rev = parse(
            "5000000000,R,0,4096\n0,R,4096,4096\n6,R,0,4096\n",
            "t",
            &opts,
        )
        .unwrap();
        let note = out_of_order_note(Timing::Original, &rev).expect("a note");
        assert!(
            note.starts_with("2 IO(s)") && note.contains("line 2"),
            "{note}"
        );
        assert_eq!(out_of_order_note(Timing::None, &rev), None);
        let sorted = parse("0,R,0,4096\n0,R,0,4096\n7,R,0,4096\n", "t", &opts).unwrap();
        assert_eq!(out_of_order_note(Timing::Original, &sorted), None);
    }

    #[test]
    fn whole_numbers_say_why_they_are_refused() {
        assert_eq!(parse_whole::<usize>(" 42 "), Ok(42));
        for (text, want) in [
            ("99999999999999999999", "is too large"),
            ("abc", "is not a whole number"),
            ("1.5", "is not a whole number"),
            ("-1", "is negative"),
        ] {
            let e = parse_whole::<usize>(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        assert!(parse_whole::<u8>("300")
            .unwrap_err()
            .contains("is too large"));
    }
}
