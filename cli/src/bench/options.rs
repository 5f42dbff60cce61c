//! Command-line options of `plugio bench` (fio's names) and their
//! validation into a [`Job`].
//!
//! Invariants: every check that depends only on the command line happens in
//! [`BenchArgs::into_job`]; checks that need the target (size, block size,
//! O_DIRECT) happen in [`super::target`]. Both return a typed
//! [`BenchError`] with exit code 2, never a panic.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use plugio_cli::replay::cli::parse_whole;

use super::error::BenchError;

/// The default size of the temporary file: 1 GiB.
pub const DEFAULT_TEMP_SIZE_BYTES: u64 = 1 << 30;

/// The largest queue depth accepted (the engine's tag limit).
pub const MAX_IODEPTH: u32 = 65536;

/// Which implementation issues the IO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// plugio's full path: executor, plug, tags, dispatch, io_uring.
    Plugio,
    /// A plain io_uring loop (no executor), like fio's t/io_uring.
    Raw,
    /// plugio's full path issuing `Device::nop()` (IORING_OP_NOP).
    Nop,
    /// glommio 0.9 `DmaFile` (`BufferedFile` with `--direct 0`).
    Glommio,
    /// tokio: `spawn_blocking` positional reads/writes on its thread pool.
    Tokio,
    /// `pread`/`pwrite` on `iodepth` threads per job.
    Psync,
    /// monoio 0.2 `fs::File` positional IO on its io_uring driver.
    Monoio,
    /// tokio-uring 0.5 `fs::File` positional IO (fixed buffers with
    /// `--fixedbufs 1`).
    #[serde(rename = "tokio-uring")]
    TokioUring,
    /// compio 0.19 `fs::File` positional IO on its io_uring driver.
    Compio,
}

/// How a plugio core waits while nothing is in flight on its ring
/// (`--idle-wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IdleWait {
    /// `futex` when the process runs under valgrind (its `LD_PRELOAD`
    /// names valgrind's `vgpreload` library), else `ring`.
    Auto,
    /// Block in `io_uring_enter`, woken by the ring's eventfd read (what
    /// plugio does).
    Ring,
    /// Block in a futex wait (`std::thread::park`), woken by the runtime's
    /// unparker, then poll the ring. For tools that run one thread at a
    /// time and do not treat `io_uring_enter` as blocking, such as
    /// valgrind 3.19; parks with IO in flight still enter the ring.
    Futex,
}

/// The IO pattern, as fio's `rw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RwMode {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Uniform random reads.
    Randread,
    /// Uniform random writes.
    Randwrite,
    /// Uniform random mix; `--rwmixread` percent are reads.
    Randrw,
}

impl RwMode {
    /// True for the sequential patterns.
    pub fn is_sequential(self) -> bool {
        matches!(self, RwMode::Read | RwMode::Write)
    }

    /// True when the pattern writes at all.
    pub fn writes(self) -> bool {
        !matches!(self, RwMode::Read | RwMode::Randread)
    }

    /// The name `--rw` takes.
    pub fn name(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
            RwMode::Randread => "randread",
            RwMode::Randwrite => "randwrite",
            RwMode::Randrw => "randrw",
        }
    }
}

/// Mechanisms `--ablate` can switch off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ablation {
    /// One tag get per request instead of a batch (`tag_batch = false`).
    TagBatch,
    /// One batch try per flush, no retry loop (`tag_batch_retry = false`).
    TagBatchRetry,
    /// Flush the plug after every bio (`plug_max_count = 1`).
    Plug,
    /// Bio merging (`nomerges = 2`).
    Merge,
    /// The once-per-batch cached clock (`cached_clock = false`).
    CachedClock,
    /// iostats accounting (`iostats = false`; the plug figures then read 0).
    Iostats,
    /// The per-core bio cache (`bio_cache = false`: a bio is allocated
    /// and freed per IO).
    BioCache,
    /// The per-core buffer cache (`buffer_cache = false`); it matters with
    /// `--buf-per-io`, where each IO takes a fresh buffer.
    BufCache,
    /// The fast lane (`fast_lane = false`: a request is built for every
    /// IO).
    FastLane,
    /// The untimed batched wait (`RingConfig::batch_wait_timer =
    /// BatchWaitTimer::Always`: every park that waits for a batch arms its
    /// short bound as a kernel timer).
    UntimedWait,
}

/// `plugio bench` options. Sizes take fio's suffixes (`k`, `m`, `g`, `t`,
/// powers of 1024; `KiB`, `MiB` also accepted).
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// File or block device to use; write jobs (`--rw write`, `randwrite`,
    /// `randrw`) overwrite its data. Default: a temporary file of `--size`
    /// (1 GiB) filled with random data, removed afterwards (also on Ctrl-C).
    #[arg(long)]
    pub filename: Option<PathBuf>,
    /// IO pattern.
    #[arg(long, value_enum, default_value_t = RwMode::Randread)]
    pub rw: RwMode,
    /// Percent of reads in `--rw randrw` (0..=100; default 50). Refused
    /// with any other `--rw`, where it would do nothing.
    #[arg(long, value_parser = parse_whole::<u32>)]
    pub rwmixread: Option<u32>,
    /// Block size of each IO (bytes; `4k`, `1m`...).
    #[arg(long, default_value = "4k", value_parser = parse_size, allow_hyphen_values = true)]
    pub bs: u64,
    /// IOs in flight per job (core).
    #[arg(long, default_value_t = 128, value_parser = parse_whole::<u32>)]
    pub iodepth: u32,
    /// Jobs: one core (thread) each.
    #[arg(long, visible_alias = "cpus", default_value_t = 1, value_parser = parse_whole::<usize>)]
    pub numjobs: usize,
    /// Time to run: seconds (`10`, `2.5`), or with a unit as fio takes
    /// it (`500ms`, `2s`, `1m`, `1h`); from 1 ms to 24 h.
    #[arg(long, default_value = "10", value_parser = parse_seconds)]
    pub runtime: f64,
    /// Stop each job after this many IOs (fio's `number_ios`): the run ends
    /// at `--runtime` or when every job has done N IOs, whichever comes
    /// first. The IOs are counted when issued, so a job completes exactly N.
    #[arg(long = "number_ios", visible_alias = "number-ios", value_parser = parse_whole::<u64>)]
    pub number_ios: Option<u64>,
    /// Bytes of the target to use (default: the whole file or device; 1 GiB
    /// for the temporary file).
    #[arg(long, value_parser = parse_size, allow_hyphen_values = true)]
    pub size: Option<u64>,
    /// 1: O_DIRECT (bypass the page cache); 0: buffered IO.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub direct: u8,
    /// Merging as in sysfs `queue/nomerges`: 0 all merges, 1 only the
    /// one-hit merge with the newest request, 2 none (plugio engines;
    /// default 0).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub nomerges: Option<u8>,
    /// 1: registered (fixed) buffers where the engine supports them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub fixedbufs: u8,
    /// 1: registered files where the engine supports them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub registerfiles: u8,
    /// Which implementation issues the IO.
    #[arg(long, value_enum, default_value_t = EngineKind::Plugio)]
    pub engine: EngineKind,
    /// With `--engine raw`: issue IORING_OP_NOP instead of reads/writes.
    #[arg(long)]
    pub nop: bool,
    /// Print the result as one JSON object on stdout (progress lines go to
    /// stderr).
    #[arg(long)]
    pub json: bool,
    /// Switch a mechanism off (repeatable).
    #[arg(long, value_enum)]
    pub ablate: Vec<Ablation>,
    /// No progress bar and no per-second lines.
    #[arg(long, short)]
    pub quiet: bool,
    /// Engine plugio: take a fresh buffer per IO (`Device::alloc_buf`, from
    /// the core's buffer cache) instead of reusing one per task, as code
    /// using `Device::read_at` does.
    #[arg(long)]
    pub buf_per_io: bool,
    /// Record the latency of one IO in N (0: none). Default: 1, or 64 for
    /// NOP engines (two clock reads per IO would dominate a NOP).
    #[arg(long, value_parser = parse_whole::<u32>)]
    pub clat_sample: Option<u32>,
    /// Engines plugio and nop: how a core waits while nothing is in flight
    /// on its ring (at start and end of the run): `ring` blocks in
    /// `io_uring_enter`; `futex` blocks in a futex wait, which valgrind can
    /// follow (benches/instructions.sh uses it); `auto` (default) is
    /// `futex` under valgrind and `ring` otherwise. Waits with IO in
    /// flight are the same either way.
    #[arg(long, value_enum, default_value_t = IdleWait::Auto)]
    pub idle_wait: IdleWait,
    /// A label copied into the JSON result as `"tag"` (benches/compare.sh
    /// names each run's engine and settings with it).
    #[arg(long)]
    pub tag: Option<String>,
}

/// A validated benchmark job.
#[derive(Debug, Clone)]
pub struct Job {
    /// The engine.
    pub engine: EngineKind,
    /// The pattern.
    pub rw: RwMode,
    /// Percent reads for `randrw`; 100 for read-only patterns, 0 for
    /// write-only ones.
    pub read_pct: u32,
    /// Bytes per IO.
    pub bs_bytes: u64,
    /// IOs in flight per core.
    pub iodepth: u32,
    /// Cores (threads) issuing IO.
    pub cores: usize,
    /// How long to run.
    pub runtime: Duration,
    /// IOs per job after which the job stops (`None`: until `runtime`).
    pub number_ios: Option<u64>,
    /// Requested bytes of the target (`None`: whole target).
    pub size_bytes: Option<u64>,
    /// O_DIRECT.
    pub direct: bool,
    /// sysfs-style nomerges value asked for.
    pub nomerges: Option<u8>,
    /// Registered buffers.
    pub fixed_bufs: bool,
    /// Registered files.
    pub register_files: bool,
    /// The IO is IORING_OP_NOP (engines `nop` and `raw --nop`).
    pub nop: bool,
    /// Engine plugio: a fresh buffer per IO (`Device::alloc_buf`) instead
    /// of one reused buffer per task.
    pub buf_per_io: bool,
    /// Mechanisms switched off.
    pub ablate: Vec<Ablation>,
    /// Explicit target path.
    pub filename: Option<PathBuf>,
    /// Record one IO's latency in this many (0: none).
    pub clat_sample: u32,
    /// How an idle plugio core waits (`Ring` or `Futex`, never `Auto`).
    pub idle_wait: IdleWait,
    /// No progress output.
    pub quiet: bool,
    /// JSON output.
    pub json: bool,
    /// Free-form label for the JSON result.
    pub tag: Option<String>,
}

impl Job {
    /// True when the job issues writes: a writing pattern with reads below
    /// 100 % (`--rw randrw --rwmixread 100` only reads, so it runs on a
    /// target it may not write, as a read pattern does), and not NOPs
    /// (`--engine nop`, `raw --nop`: they touch no data, whatever `--rw`
    /// says).
    pub fn writes(&self) -> bool {
        self.rw.writes() && self.read_pct < 100 && !self.nop
    }

    /// True when the job issues reads: a reading pattern, or `randrw`
    /// with reads above 0 %, and not NOPs.
    pub fn reads(&self) -> bool {
        let pattern = match self.rw {
            RwMode::Read | RwMode::Randread => true,
            RwMode::Write | RwMode::Randwrite => false,
            RwMode::Randrw => self.read_pct > 0,
        };
        pattern && !self.nop
    }
}

impl BenchArgs {
    /// Refuses the options of plugio's own path (`--ablate`, `--nomerges`,
    /// `--buf-per-io`, `--idle-wait`) with another engine: its JSON said
    /// `"ablate":["plug"]` for a raw run that switched nothing off (found
    /// by a helper trying the suite).
    fn check_plugio_only(&self) -> Result<(), BenchError> {
        if matches!(self.engine, EngineKind::Plugio | EngineKind::Nop) {
            return Ok(());
        }
        let given: Vec<&str> = [
            (!self.ablate.is_empty(), "--ablate"),
            (self.nomerges.is_some(), "--nomerges"),
            (self.buf_per_io, "--buf-per-io"),
            (self.idle_wait != IdleWait::Auto, "--idle-wait"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        if given.is_empty() {
            return Ok(());
        }
        let engine = clap::ValueEnum::to_possible_value(&self.engine)
            .map_or_else(|| format!("{:?}", self.engine), |v| v.get_name().to_owned());
        Err(BenchError::usage(format!(
            "{} set{} plugio's own path (--engine plugio or nop), which --engine {engine} \
             does not run: drop {}",
            given.join(", "),
            if given.len() == 1 { "s" } else { "" },
            if given.len() == 1 { "it" } else { "them" }
        )))
    }

    /// Refuses a peer engine that this build left out (the `peers`
    /// feature off) before the target is opened or filled: it was refused
    /// only when its run began, after the 1 GiB temporary file was
    /// written (found by a helper trying the README).
    fn check_peer_built(&self) -> Result<(), BenchError> {
        #[cfg(not(feature = "peers"))]
        if matches!(
            self.engine,
            EngineKind::Monoio | EngineKind::TokioUring | EngineKind::Compio
        ) {
            let engine = clap::ValueEnum::to_possible_value(&self.engine)
                .map_or_else(|| format!("{:?}", self.engine), |v| v.get_name().to_owned());
            return Err(peer_not_built(&engine));
        }
        Ok(())
    }

    /// Checks what the command line alone decides.
    ///
    /// # Errors
    /// [`BenchError::Usage`] naming the option and what to change.
    pub fn into_job(self) -> Result<Job, BenchError> {
        if self.iodepth == 0 || self.iodepth > MAX_IODEPTH {
            return Err(BenchError::usage(format!(
                "--iodepth {} is out of range: use 1..={MAX_IODEPTH}",
                self.iodepth
            )));
        }
        if self.numjobs == 0 {
            return Err(BenchError::usage("--numjobs (or --cpus) 0: use at least 1"));
        }
        if self.bs == 0 || self.bs > plugio_engine::MAX_IO_BYTES {
            return Err(BenchError::usage(format!(
                "--bs {} is out of range: use 1 up to {} bytes (2 GiB - 4 KiB, the most one \
                 IO moves; a multiple of 512 with O_DIRECT), e.g. --bs 4k or --bs 1g",
                self.bs,
                plugio_engine::MAX_IO_BYTES
            )));
        }
        // At least 1 ms: a shorter run is no measurement (1e-30 ran for
        // 0 s).
        if !(self.runtime >= 1e-3 && self.runtime <= 86_400.0) {
            return Err(BenchError::usage(format!(
                "--runtime {} is out of range: use seconds from 0.001 to 86400",
                shown_seconds(self.runtime)
            )));
        }
        match self.rwmixread {
            Some(pct) if pct > 100 => {
                return Err(BenchError::usage(format!(
                    "--rwmixread {pct} is out of range: use 0..=100"
                )));
            }
            Some(pct) if self.rw != RwMode::Randrw => {
                return Err(BenchError::usage(format!(
                    "--rwmixread {pct} applies only to --rw randrw (this run is --rw {}): \
                     add --rw randrw or drop --rwmixread",
                    self.rw.name()
                )));
            }
            _ => {}
        }
        if self.nop && self.engine != EngineKind::Raw {
            return Err(BenchError::usage(
                "--nop only applies to --engine raw; use --engine nop for plugio's NOP path",
            ));
        }
        let nop = self.nop || self.engine == EngineKind::Nop;
        if let (true, Some(size)) = (nop, self.size) {
            // It was silently ignored (the temporary file is 1 MiB).
            return Err(BenchError::usage(format!(
                "--size {size}: NOPs move no data and touch no range of the target: drop \
                 --size (the run opens its target, a 1 MiB temporary file without --filename, \
                 only to have a device)"
            )));
        }
        self.check_plugio_only()?;
        self.check_peer_built()?;
        if self.number_ios == Some(0) {
            return Err(BenchError::usage(
                "--number_ios 0: give at least 1 (or leave it out to run for --runtime)",
            ));
        }
        if self.size == Some(0) {
            return Err(BenchError::usage("--size 0: give a size such as 16M"));
        }
        if let Some(size) = self.size.filter(|&size| size < self.bs) {
            return Err(BenchError::usage(format!(
                "--size {size} is smaller than one block (--bs {}): give at least --size {}",
                self.bs, self.bs
            )));
        }
        let read_pct = match self.rw {
            RwMode::Read | RwMode::Randread => 100,
            RwMode::Write | RwMode::Randwrite => 0,
            RwMode::Randrw => self.rwmixread.unwrap_or(50),
        };
        let mut ablate = self.ablate;
        ablate.dedup();
        Ok(Job {
            engine: self.engine,
            rw: self.rw,
            read_pct,
            bs_bytes: self.bs,
            iodepth: self.iodepth,
            cores: self.numjobs,
            runtime: Duration::from_secs_f64(self.runtime),
            number_ios: self.number_ios,
            size_bytes: self.size,
            direct: self.direct == 1,
            nomerges: self.nomerges,
            fixed_bufs: self.fixedbufs == 1,
            buf_per_io: self.buf_per_io,
            register_files: self.registerfiles == 1,
            nop,
            ablate,
            filename: self.filename,
            clat_sample: self.clat_sample.unwrap_or(if nop { 64 } else { 1 }),
            idle_wait: match self.idle_wait {
                IdleWait::Auto if under_valgrind() => IdleWait::Futex,
                IdleWait::Auto => IdleWait::Ring,
                explicit => explicit,
            },
            quiet: self.quiet,
            json: self.json,
            tag: self.tag,
        })
    }
}

/// True when the process runs under valgrind, which preloads its
/// `vgpreload_*.so` into the program it runs.
fn under_valgrind() -> bool {
    std::env::var_os("LD_PRELOAD").is_some_and(|p| p.to_string_lossy().contains("vgpreload"))
}

/// Parses a size with fio's suffixes: `4096`, `4k`, `4K`, `4KiB`, `16m`,
/// `1g`, `2t` (powers of 1024), with a decimal part where the size is a
/// whole number of bytes (`1.5g`, `23.5G`; not `0.3k`).
///
/// # Errors
/// A message naming the bad text.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.strip_prefix('-')
        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
    {
        return Err(format!("'{text}' is negative: give a size such as 4k"));
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, rest) = t.split_at(split);
    let not_a_size = || format!("'{text}' is not a size: use e.g. 4096, 4k, 16M, 1.5G");
    let (fraction, suffix) = match rest.strip_prefix('.') {
        Some(r) => r.split_at(r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len())),
        None => ("", rest),
    };
    if rest.starts_with('.') && fraction.is_empty() {
        // "1." or "1.k": a point with no decimals.
        return Err(not_a_size());
    }
    let number: u64 = digits.parse().map_err(|_| not_a_size())?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "'{text}': unknown size suffix '{suffix}' (use k, m, g or t)"
            ))
        }
    };
    let too_large = || format!("'{text}' is too large");
    // Trailing zeros change nothing ("1.000g" is 1 GiB).
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        return number.checked_mul(1u64 << shift).ok_or_else(too_large);
    }
    // number.fraction × 2^shift in whole bytes, exactly, every step
    // checked (an unchecked shift dropped high bits: a size near 2^65
    // read as 2 MiB; found by a break-it helper).
    let scale = u32::try_from(fraction.len())
        .ok()
        .filter(|&n| n <= 19)
        .map(|n| 10u128.pow(n))
        .ok_or_else(|| format!("'{text}': too many decimals (19 at most)"))?;
    let tenths: u128 = fraction.parse().map_err(|_| not_a_size())?;
    let scaled = u128::from(number)
        .checked_mul(scale)
        .and_then(|n| n.checked_add(tenths))
        .and_then(|n| n.checked_mul(1u128 << shift))
        .ok_or_else(too_large)?;
    if scaled % scale != 0 {
        let hint = if shift == 0 {
            ""
        } else {
            ": give it in a smaller unit (e.g. 1536k for 1.5m)"
        };
        return Err(format!("'{text}' is not a whole number of bytes{hint}"));
    }
    u64::try_from(scaled / scale).map_err(|_| too_large())
}

/// Parses a time in seconds: a plain number (`10`, `2.5`), or one with
/// fio's units `ms`, `s`, `m` or `h` (`500ms`, `2s`, `1m`). A negative
/// time parses, for [`BenchArgs`]' range check to refuse by name.
///
/// # Errors
/// A message naming the bad text and the forms taken.
pub fn parse_seconds(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    // The unit comes off the end, so the number may take any form Rust
    // reads (`1e3`, `.5`, `inf`); "ms" before "m" and "s".
    let (number, scale) = [("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0)]
        .iter()
        .find_map(|&(unit, scale)| lower.strip_suffix(unit).map(|n| (n, scale)))
        .unwrap_or((lower.as_str(), 1.0));
    // NaN is no time; a sign is kept, for the job's check to refuse a
    // negative time by name.
    match number.trim_end().parse::<f64>() {
        Ok(n) if !n.is_nan() => Ok(n * scale),
        _ => Err(format!(
            "'{text}' is not a time: use seconds, e.g. 10 or 2.5, or a unit: 500ms, 2s, 1m"
        )),
    }
}

/// `seconds` as a message shows it: short (`1e30`, `1e-30`) where plain
/// digits would run long.
fn shown_seconds(seconds: f64) -> String {
    let a = seconds.abs();
    if a != 0.0 && !(1e-3..1e6).contains(&a) {
        format!("{seconds:e}")
    } else {
        seconds.to_string()
    }
}

/// The error of a peer engine (`name`: monoio, tokio-uring or compio) in
/// a build without the `peers` feature.
#[cfg(not(feature = "peers"))]
pub fn peer_not_built(name: &str) -> BenchError {
    BenchError::usage(format!(
        "--engine {name}: this plugio was built without the `peers` feature (the io_uring \
         runtimes the bench compares against); rebuild with default features or \
         `--features peers`"
    ))
}

/// The job `plugio bench ARGS...` would run (for tests).
///
/// # Panics
/// When the arguments do not parse or make no valid job.
#[cfg(test)]
pub(crate) fn test_job(args: &[&str]) -> Job {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }
    let mut argv = vec!["bench"];
    argv.extend_from_slice(args);
    Cli::parse_from(argv).args.into_job().expect("valid job")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs only in a build without the `peers` feature
    /// (`cargo test -p plugio-cli --no-default-features --bins peer_engine`).
    #[cfg(not(feature = "peers"))]
    #[test]
    fn a_peer_engine_left_out_is_refused_with_the_options() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: BenchArgs,
        }
        for engine in ["monoio", "tokio-uring", "compio"] {
            let cli = <Cli as clap::Parser>::try_parse_from(["bench", "--engine", engine]);
            let e = cli
                .expect("parses")
                .args
                .into_job()
                .expect_err("left out of this build");
            let e = e.to_string();
            assert!(e.contains(&format!("--engine {engine}:")), "{e}");
            assert!(e.contains("without the `peers` feature"), "{e}");
        }
        // A peer that is always built still makes a job.
        let cli = <Cli as clap::Parser>::try_parse_from(["bench", "--engine", "glommio"]);
        assert!(cli.expect("parses").args.into_job().is_ok());
    }

    #[test]
    fn sizes_parse_with_fio_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("4q").is_err());
        assert!(parse_size("k").is_err());
        assert!(parse_size("99999999999t").is_err());
        assert!(parse_size("-4k").unwrap_err().contains("negative"));
        // Decimals where the size is a whole number of bytes.
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("23.5G"), Ok(47 << 29));
        assert_eq!(parse_size("0.25k"), Ok(256));
        assert!(parse_size("0.3k")
            .unwrap_err()
            .contains("whole number of bytes"));
        assert!(parse_size("1.5")
            .unwrap_err()
            .contains("whole number of bytes"));
        assert!(parse_size("1.5x")
            .unwrap_err()
            .contains("unknown size suffix"));
        assert!(parse_size("1.x").unwrap_err().contains("not a size"));
        assert!(parse_size("17179869184.5t")
            .unwrap_err()
            .contains("too large"));
        // A product past 2^128 before the division (it read as 2 MiB).
        assert!(parse_size("30948500.9821364142211109181t")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_size("1.").unwrap_err().contains("not a size"));
        assert!(parse_size("1.k").unwrap_err().contains("not a size"));
        assert_eq!(parse_size("1.00000000000000000000g"), Ok(1 << 30));
        let half_byte = parse_size("0.5b").unwrap_err();
        assert!(
            half_byte.ends_with("not a whole number of bytes"),
            "{half_byte}"
        );
        assert!(parse_size("--json").unwrap_err().contains("not a size"));
    }

    #[test]
    fn times_parse_as_seconds_or_with_fio_units() {
        assert_eq!(parse_seconds("10"), Ok(10.0));
        assert_eq!(parse_seconds("2.5"), Ok(2.5));
        assert_eq!(parse_seconds("2s"), Ok(2.0));
        assert_eq!(parse_seconds("500ms"), Ok(0.5));
        assert_eq!(parse_seconds("1m"), Ok(60.0));
        assert_eq!(parse_seconds("1h"), Ok(3600.0));
        assert_eq!(parse_seconds("-1"), Ok(-1.0));
        // Read as numbers, for the job's range check to name (they were
        // "not a time").
        assert_eq!(parse_seconds("1e30"), Ok(1e30));
        assert_eq!(parse_seconds("2.5E1"), Ok(25.0));
        assert_eq!(parse_seconds("inf"), Ok(f64::INFINITY));
        // The unit comes off the end of any number form.
        assert_eq!(parse_seconds("1e3ms"), Ok(1.0));
        assert_eq!(parse_seconds("1E1s"), Ok(10.0));
        assert_eq!(parse_seconds("1e2m"), Ok(6000.0));
        assert_eq!(parse_seconds(" .5 s "), Ok(0.5));
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: BenchArgs,
        }
        for big in ["1e30", "inf", "-1e30", "1e-30", "-1e-30", "0.0005", "-0"] {
            let arg = format!("--runtime={big}");
            let cli = <Cli as clap::Parser>::try_parse_from(["bench", arg.as_str()]);
            let e = cli
                .expect("parses")
                .args
                .into_job()
                .expect_err("out of range");
            let e = e.to_string();
            assert!(
                e.contains("is out of range: use seconds from 0.001 to 86400"),
                "{e}"
            );
            assert!(e.len() < 100, "{e}");
        }
        for bad in [
            "", "s", "ms", "-", "2x", "1..2", "--json", "two", "nan", "5e", "0x10", "1_0",
        ] {
            assert!(
                parse_seconds(bad).unwrap_err().contains("not a time"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn rwmixread_defaults_to_half_and_only_goes_with_randrw() {
        assert_eq!(test_job(&["--rw", "randrw"]).read_pct, 50);
        assert_eq!(
            test_job(&["--rw", "randrw", "--rwmixread", "70"]).read_pct,
            70
        );
        assert_eq!(test_job(&["--rw", "read"]).read_pct, 100);
    }
}
