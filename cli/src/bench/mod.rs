//! `plugio bench`: runs one IO job on one engine (plugio or a baseline)
//! and reports IOPS, bandwidth, ring-call and plug figures each second,
//! then a summary with latency percentiles (text or JSON).
//!
//! Files: [`options`] (command line, [`Job`]), [`error`] ([`BenchError`],
//! exit codes), [`target`] (file or device, temporary file), [`stats`]
//! (counters, IO pattern, latency), [`output`] (what an engine hands back,
//! why a run stopped), [`report`] (lines, the run's timeline, summary,
//! JSON), one file per engine, and [`compare`] (the peer-comparison report
//! and plots that `benches/compare.sh` drives, over the grouped results of
//! `runs`).
//!
//! Invariants:
//! - Bad input is refused before any IO with a [`BenchError`] of exit code
//!   2; nothing panics on user input.
//! - The engine runs on its own threads; this thread only prints and
//!   decides when to stop, so the figures cost the engine two relaxed
//!   stores per IO.
//! - `bytes == ios * bs` for data engines (the target is a multiple of
//!   `bs` and every IO is full); NOP engines move no bytes.
//! - The temporary file is removed when the run ends, failed or not,
//!   interrupted (SIGINT, SIGTERM) or cut off by a closed standard output;
//!   these stop the IO and end the command by the signal (see
//!   `crate::signals`), after the summary so far is printed for SIGINT and
//!   SIGTERM.
//! - The summary's rates are its IO and byte counts over its elapsed time,
//!   all three as printed (`iops == ios / runtime_s`).

pub mod alloc_count;
pub mod compare;
pub mod engine_compio;
pub mod engine_glommio;
pub mod engine_monoio;
pub mod engine_plugio;
pub mod engine_psync;
pub mod engine_raw;
pub mod engine_tokio;
pub mod engine_tokio_uring;
pub mod error;
pub mod limits;
pub mod options;
pub mod output;
pub mod peers;
mod plots;
pub mod report;
mod runs;
pub mod stats;
pub mod target;
mod units;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use error::BenchError;
pub use options::{BenchArgs, EngineKind, Job};
pub use report::BenchResult;

use output::{EngineOutput, StopReason};
use report::Timeline;
use stats::Counters;
use target::Target;

/// Runs the job the command line describes and prints its report.
///
/// # Errors
/// See [`BenchError`]; its exit code says whether the input was bad (2)
/// or the run failed (1).
pub fn main(args: BenchArgs) -> Result<BenchResult, BenchError> {
    let job = args.into_job()?;
    let warnings = limits::check(&job)?;
    if job.engine == EngineKind::Glommio {
        // Before the temporary file's fill: a limit it cannot raise is
        // refused at once (it came after a 2 GiB fill; found by a
        // new-user helper). The engine raises it again; that is a no-op.
        engine_glommio::raise_memlock()?;
    }
    crate::signals::catch_interrupts()
        .map_err(|e| BenchError::io("catching SIGINT and SIGTERM", e))?;
    // After the target's checks, before the temporary file's fill: a job
    // the target refuses (a --bs below its logical block size) gets no
    // warnings about a run that never happens (found by a break-it
    // helper).
    let print_warnings = || {
        for warning in warnings {
            eprintln!("plugio: warning: {warning}");
        }
    };
    let target = if job.engine == EngineKind::Raw && job.nop && job.filename.is_none() {
        print_warnings();
        None
    } else {
        Some(target::prepare(&job, print_warnings)?)
    };
    let result = run(&job, target.as_ref())?;
    if result.stopped_by == Some(StopReason::StdoutClosed) {
        return Err(BenchError::StdoutClosed);
    }
    report::print_result(&job, &result)?;
    if let Some(StopReason::Signal(sig)) = result.stopped_by {
        return Err(BenchError::Interrupted(sig));
    }
    Ok(result)
}

/// Workers (counter slots) an engine uses.
fn workers(job: &Job) -> usize {
    match job.engine {
        EngineKind::Psync => job.cores * job.iodepth as usize,
        _ => job.cores,
    }
}

/// Runs `job` on `target` (`None` only for `raw --nop` without a file),
/// printing per-second lines unless quiet.
///
/// # Errors
/// The engine's setup or IO failed.
pub fn run(job: &Job, target: Option<&Target>) -> Result<BenchResult, BenchError> {
    let counters = Counters::new(workers(job));
    let cpu_before = stats::cpu_times();
    let allocs_before = alloc_count::allocations();
    let mut printer = report::Printer::new(job);
    printer.header(job, target);
    if printer.stdout_closed() {
        return Err(BenchError::StdoutClosed);
    }
    if let Some(e) = printer.take_write_error() {
        return Err(BenchError::io("writing the output", e));
    }
    let (output, timeline) = std::thread::scope(|s| {
        let engine_counters = counters.clone();
        let engine = std::thread::Builder::new()
            .name("plugio-bench-engine".into())
            .spawn_scoped(s, move || {
                let out = run_engine(job, target, &engine_counters);
                // When the last IO had completed: the end of the summary's
                // window.
                let ended = Instant::now();
                // Unblocks the clock below if the engine failed before
                // starting.
                engine_counters.mark_started();
                engine_counters.request_stop();
                (out, ended)
            })
            .map_err(|e| BenchError::io("starting the engine thread", e))?;
        let mut timeline = clock(job, &counters, &mut printer, &engine);
        let (output, ended) = engine
            .join()
            .map_err(|_| BenchError::engine("bench", "the engine thread panicked"))?;
        let output = output?;
        // The engine's own end mark, before its teardown, when it made one.
        let ended = counters.ended().map_or(ended, |m| m.at);
        if let Some(start) = counters.started_at() {
            timeline.elapsed = ended.saturating_duration_since(start);
        }
        Ok::<_, BenchError>((output, timeline))
    })?;
    // Between the engine's start and end marks where it made them, so its
    // setup and teardown (128 buffers of 16 MiB filled with random bytes,
    // then unmapped, take seconds) are not counted per IO; from before
    // the engine and after it otherwise.
    let (cpu_base, allocs_base) = counters
        .started()
        .map_or((cpu_before, allocs_before), |s| (s.cpu, s.allocations));
    let (cpu_end, allocs_end) = counters.ended().map_or_else(
        || (stats::cpu_times(), alloc_count::allocations()),
        |e| (e.cpu, e.allocations),
    );
    let cpu = cpu_end.since(cpu_base);
    let allocs = allocs_end.saturating_sub(allocs_base);
    let stopped_by = timeline.stopped_by;
    let mut result = report::BenchResult::new(job, target, &counters, output, timeline, cpu);
    result.allocs_per_io = (result.ios > 0).then(|| allocs as f64 / result.ios as f64);
    result.stopped_by = stopped_by;
    Ok(result)
}

fn run_engine(
    job: &Job,
    target: Option<&Target>,
    counters: &Arc<Counters>,
) -> Result<EngineOutput, BenchError> {
    match job.engine {
        EngineKind::Plugio | EngineKind::Nop => engine_plugio::run(job, need(target)?, counters),
        EngineKind::Raw => engine_raw::run(job, target, counters),
        EngineKind::Glommio => engine_glommio::run(job, need(target)?, counters),
        EngineKind::Tokio => engine_tokio::run(job, need(target)?, counters),
        EngineKind::Monoio => engine_monoio::run(job, need(target)?, counters),
        EngineKind::TokioUring => engine_tokio_uring::run(job, need(target)?, counters),
        EngineKind::Compio => engine_compio::run(job, need(target)?, counters),
        EngineKind::Psync => engine_psync::run(job, need(target)?, counters),
    }
}

/// The target, for engines that need one.
fn need(t: Option<&Target>) -> Result<&Target, BenchError> {
    t.ok_or_else(|| BenchError::usage("this engine needs a target file: pass --filename"))
}

/// Waits for the engine to start, prints a line each second, and stops the
/// engine after the runtime (or returns early if the engine ended, even
/// before it started, a caught signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2 or SIGXCPU) came, or standard output was
/// closed).
fn clock<T>(
    job: &Job,
    counters: &Arc<Counters>,
    printer: &mut report::Printer,
    engine: &std::thread::ScopedJoinHandle<'_, T>,
) -> Timeline {
    let mut timeline = Timeline::default();
    let start = loop {
        if let Some(t) = counters.started_at() {
            break t;
        }
        if engine.is_finished() {
            // It ended (or panicked) before starting: nothing to time; the
            // caller's join reports why.
            break Instant::now();
        }
        if let Some(sig) = crate::signals::interrupted() {
            // Setting up takes long with many jobs: stop it too.
            timeline.stopped_by = Some(StopReason::Signal(sig));
            counters.request_stop();
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut last = counters.total();
    let mut last_stats = counters.iostats();
    let mut next = start + Duration::from_secs(1);
    let end = start + job.runtime;
    while !engine.is_finished() && timeline.stopped_by.is_none() {
        if let Some(sig) = crate::signals::interrupted() {
            timeline.stopped_by = Some(StopReason::Signal(sig));
            break;
        }
        if printer.stdout_closed() {
            timeline.stopped_by = Some(StopReason::StdoutClosed);
            break;
        }
        let now = Instant::now();
        if now >= next && next <= end {
            let snap = counters.total();
            let stats = counters.iostats();
            let second =
                report::Second::new(&snap.since(&last), stats.as_ref(), last_stats.as_ref());
            printer.second(timeline.seconds.len() + 1, &second);
            timeline.seconds.push(second);
            last = snap;
            last_stats = stats;
            next += Duration::from_secs(1);
            continue;
        }
        if now >= end {
            break;
        }
        std::thread::sleep((next.min(end) - now).min(Duration::from_millis(50)));
    }
    counters.request_stop();
    timeline.elapsed = start.elapsed();
    timeline
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_returns_when_the_engine_ends_before_it_starts() {
        // An engine thread that panics in its setup never marks the start:
        // the clock used to wait for it forever (SIGTERM included).
        let job = options::test_job(&["--quiet", "--runtime", "3600"]);
        let counters = Counters::new(1);
        let mut printer = report::Printer::new(&job);
        std::thread::scope(|s| {
            let engine = s.spawn(|| ());
            let timeline = clock(&job, &counters, &mut printer, &engine);
            assert!(timeline.seconds.is_empty());
            assert!(counters.started_at().is_none());
            engine.join().expect("the thread ended");
        });
    }

    /// Every engine closes the measured window itself, after its last IO
    /// and before it returns (its buffers, rings and runtime torn down
    /// after the mark). Only plugio's did; the peers' windows held their
    /// teardown.
    #[test]
    fn every_engine_marks_its_end_before_it_returns() {
        let mut engines = vec!["plugio", "nop", "raw", "psync", "tokio", "glommio"];
        if cfg!(feature = "peers") {
            engines.extend(["monoio", "tokio-uring", "compio"]);
        }
        for engine in engines {
            // A NOP job takes no --size.
            let size: &[&str] = if engine == "nop" {
                &[]
            } else {
                &["--size", "1m"]
            };
            let job = options::test_job(
                &[
                    &["--engine", engine, "--iodepth", "4", "--number_ios", "64"][..],
                    size,
                    &["--direct", "0", "--quiet"],
                ]
                .concat(),
            );
            let t = target::prepare(&job, || {}).expect("target");
            let counters = Counters::new(workers(&job));
            match run_engine(&job, Some(&t), &counters) {
                Ok(_) => {}
                // glommio alone may be stopped by a memlock limit that
                // cannot be raised (its own test checks the message).
                Err(e) if engine == "glommio" && e.to_string().contains("RLIMIT_MEMLOCK") => {
                    continue
                }
                Err(e) => panic!("{engine}: {e}"),
            }
            let returned = Instant::now();
            let started = counters.started().expect("a start mark").at;
            let ended = counters.ended().map(|m| m.at);
            let Some(ended) = ended else {
                panic!("{engine}: no end mark")
            };
            assert!(started <= ended && ended <= returned, "{engine}");
            assert_eq!(counters.total().ios, 64, "{engine}");
        }
    }
}
