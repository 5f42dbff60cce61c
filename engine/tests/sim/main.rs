//! The seeded crash and fault simulator (after TigerBeetle's VOPR and
//! FoundationDB's simulation testing): each seed is one run of a random,
//! database-like workload through [`plugio_engine::Device`] on the mem
//! device, from 1 or 2 cores, with faults injected, the power cut at a
//! random point while IO is in flight, and a checker over what happened.
//!
//! A seed draws (`config.rs`): the cores, the device (size, channels,
//! latency, whether a cut loses or tears unflushed blocks), the engine's
//! options (queue depth, plug limit, `nomerges`, request size,
//! `overlap_order`, buffer cache), the workload length and the IO after
//! which the power is cut. Each core issues batches of writes of random
//! sizes and offsets (half of them in a small hot zone, so they overlap),
//! FUA writes, reads, flushes, write zeroes and discards; some futures
//! are dropped mid-flight; between IOs, faults (EIO on blocks, short
//! reads, ENOSPC, per-op EAGAIN) are injected and cleared (`workload.rs`).
//! The checker (`checker.rs`) then requires that every write acknowledged
//! before an acknowledged flush, and every acknowledged FUA write, is
//! present after the cut with its bytes or overwritten by a write that is
//! not older; that no read was stale or saw a later write; that no byte
//! comes from nowhere; that results are whole and errors typed.
//!
//! Commands:
//! - `cargo test -p plugio-engine --test sim`: 500 seeds (CI).
//! - `PLUGIO_SIM_SEEDS=N PLUGIO_SIM_FIRST=S cargo test --release -p
//!   plugio-engine --test sim -- --exact seeds --nocapture`: seeds
//!   `S..S+N`, with a summary line (seeds per second, IOs, faults, bytes
//!   checked, failures); `benches/sim.sh --seeds N` runs it.
//! - A failing seed prints the one command that replays it:
//!   `PLUGIO_SIM_SEED=S cargo test --release -p plugio-engine --test sim
//!   -- --exact one_seed --nocapture`. A 1-core seed replays exactly; a
//!   2-core seed replays its workload, faults and cut point, while the
//!   interleaving of the two cores follows the machine.
//!
//! The mutation switch (`PLUGIO_SIM_MUTATE=lost-fua|stale-read|garbage|unordered`
//! with `one_seed`, and the `checker_catches_*` tests) breaks a run as a
//! broken device or engine would (`mutate.rs`): an acknowledged FUA write
//! lost at the cut, a read that returns the block's previous contents,
//! one flipped byte, the engine's ordering turned off. The tests show the
//! checker fails every seed where the mutation applied, with the kind of
//! violation it should report (for `unordered`: the seeds that have
//! overlapping IO in flight together).

mod checker;
mod config;
mod history;
mod mutate;
mod workload;

use std::time::Instant;

use checker::{Report, Violation};
use config::{Mutation, SimConfig};
use plugio_device::RingConfig;
use plugio_executor::{Runtime, ShutdownMode};

/// A seed that does not end within this many seconds is a hang.
const HANG_S: u64 = 120;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A 1-core and a 2-core runtime, reused by the seeds of one test.
struct Runtimes {
    one: Option<Runtime>,
    two: Option<Runtime>,
}

impl Runtimes {
    fn new() -> Runtimes {
        Runtimes {
            one: None,
            two: None,
        }
    }

    fn get(&mut self, cores: usize) -> &Runtime {
        let slot = if cores == 1 {
            &mut self.one
        } else {
            &mut self.two
        };
        slot.get_or_insert_with(|| {
            plugio_engine::runtime::builder(RingConfig::default())
                .cores(cores)
                .thread_name(format!("sim-{cores}c"))
                .build()
                .expect("runtime")
        })
    }
}

impl Drop for Runtimes {
    fn drop(&mut self) {
        for rt in [self.one.take(), self.two.take()].into_iter().flatten() {
            let _ = rt.shutdown(ShutdownMode::Wait);
        }
    }
}

/// The command that replays `seed` (with its mutation).
fn replay_command(seed: u64, mutation: Option<Mutation>) -> String {
    let m = match mutation {
        None => String::new(),
        Some(Mutation::LostFua) => "PLUGIO_SIM_MUTATE=lost-fua ".into(),
        Some(Mutation::StaleRead) => "PLUGIO_SIM_MUTATE=stale-read ".into(),
        Some(Mutation::Garbage) => "PLUGIO_SIM_MUTATE=garbage ".into(),
        Some(Mutation::Unordered) => "PLUGIO_SIM_MUTATE=unordered ".into(),
    };
    format!(
        "{m}PLUGIO_SIM_SEED={seed} cargo test --release -p plugio-engine --test sim -- --exact one_seed --nocapture"
    )
}

/// One seed's result.
struct Run {
    report: Report,
    faults_injected: u64,
    /// The mutation applied (false when the run had nothing it applies to).
    mutated: bool,
}

fn run_seed(rts: &mut Runtimes, cfg: &SimConfig) -> Run {
    let rt = rts.get(cfg.cores);
    let Some(mut h) = workload::run(rt, cfg, HANG_S) else {
        panic!(
            "seed {}: hang (not finished after {HANG_S} s); replay: {}",
            cfg.seed,
            replay_command(cfg.seed, cfg.mutation)
        );
    };
    let mutated = cfg
        .mutation
        .is_some_and(|m| mutate::apply(m, &mut h, cfg.seed));
    Run {
        report: checker::check(&h, cfg.capacity_blocks),
        faults_injected: h.faults_injected,
        mutated,
    }
}

/// Totals over many seeds.
#[derive(Default)]
struct Totals {
    seeds: u64,
    ios: u64,
    faults_injected: u64,
    failed_ios: u64,
    bytes_checked: u64,
    failed_seeds: Vec<u64>,
}

fn print_failure(cfg: &SimConfig, run: &Run) {
    eprintln!(
        "seed {} FAILED ({} violations; {} cores, {:?})",
        cfg.seed,
        run.report.violations.len(),
        cfg.cores,
        cfg.opts
    );
    for (kind, detail) in run.report.violations.iter().take(5) {
        eprintln!("  {kind:?}: {detail}");
    }
    eprintln!("  replay: {}", replay_command(cfg.seed, cfg.mutation));
}

/// Runs seeds `first..first + count` and sums them up.
fn run_seeds(first: u64, count: u64) -> Totals {
    let mut rts = Runtimes::new();
    let mut t = Totals::default();
    for seed in first..first + count {
        let cfg = SimConfig::from_seed(seed);
        let run = run_seed(&mut rts, &cfg);
        t.seeds += 1;
        t.ios += run.report.ios;
        t.faults_injected += run.faults_injected;
        t.failed_ios += run.report.failed_ios;
        t.bytes_checked += run.report.bytes_checked;
        if !run.report.violations.is_empty() {
            print_failure(&cfg, &run);
            t.failed_seeds.push(seed);
        }
    }
    t
}

/// Seeds `PLUGIO_SIM_FIRST..+PLUGIO_SIM_SEEDS` (default `0..500`); fails if
/// any seed does, after printing each failing seed's replay command.
#[test]
fn seeds() {
    let first = env_u64("PLUGIO_SIM_FIRST").unwrap_or(0);
    let count = env_u64("PLUGIO_SIM_SEEDS").unwrap_or(500);
    let start = Instant::now();
    let t = run_seeds(first, count);
    let secs = start.elapsed().as_secs_f64();
    // The line benches/sim.sh reads.
    println!(
        "sim: seeds {first}..{}: {} seeds, {} IOs, {} faults injected, {} IOs failed by faults, {} bytes checked, {} failures, {:.1} s, {:.1} seeds/s",
        first + count,
        t.seeds,
        t.ios,
        t.faults_injected,
        t.failed_ios,
        t.bytes_checked,
        t.failed_seeds.len(),
        secs,
        t.seeds as f64 / secs
    );
    assert!(
        t.failed_seeds.is_empty(),
        "{} of {} seeds failed: {:?} (each printed its replay command above)",
        t.failed_seeds.len(),
        t.seeds,
        t.failed_seeds
    );
}

/// Replays `PLUGIO_SIM_SEED` (default 0) with `PLUGIO_SIM_MUTATE`, if set,
/// and prints its configuration and every violation.
#[test]
fn one_seed() {
    let seed = env_u64("PLUGIO_SIM_SEED").unwrap_or(0);
    let mut cfg = SimConfig::from_seed(seed);
    if let Ok(m) = std::env::var("PLUGIO_SIM_MUTATE") {
        let m = Mutation::parse(&m)
            .expect("PLUGIO_SIM_MUTATE: lost-fua, stale-read, garbage or unordered");
        cfg = cfg.mutated(m);
    }
    println!("{cfg:#?}");
    let run = run_seed(&mut Runtimes::new(), &cfg);
    for (kind, detail) in &run.report.violations {
        println!("{kind:?}: {detail}");
    }
    println!(
        "seed {seed}: {} IOs, {} failed, {} faults injected, {} bytes checked, mutation applied: {}",
        run.report.ios, run.report.failed_ios, run.faults_injected, run.report.bytes_checked, run.mutated
    );
    if run.mutated {
        assert!(
            !run.report.violations.is_empty(),
            "the checker missed the mutation"
        );
    } else if !run.report.violations.is_empty() {
        print_failure(&cfg, &run);
        panic!("seed {seed} failed");
    }
}

/// Runs seeds with mutation `m` until it applied `want` times (at most
/// `max_seeds` seeds); every mutated seed must fail with `expect`.
fn mutation_is_caught(m: Mutation, expect: Violation, want: u32, max_seeds: u64) {
    let mut rts = Runtimes::new();
    let mut applied = 0;
    for seed in 0..max_seeds {
        let cfg = SimConfig::from_seed(seed).mutated(m);
        let run = run_seed(&mut rts, &cfg);
        if !run.mutated {
            continue;
        }
        applied += 1;
        assert!(
            run.report.has(expect),
            "seed {seed}: mutation {m:?} applied but the checker reported {:?}, not {expect:?}; replay: {}",
            run.report.violations,
            replay_command(seed, Some(m))
        );
        if applied == want {
            return;
        }
    }
    panic!("mutation {m:?} applied to only {applied} of {max_seeds} seeds (wanted {want})");
}

/// With the switch on, a FUA write acknowledged and then lost at the cut
/// is reported as lost.
#[test]
fn checker_catches_a_lost_fua_write() {
    mutation_is_caught(Mutation::LostFua, Violation::Lost, 10, 200);
}

/// With the switch on, a read that returns the block's previous contents
/// is reported as stale.
#[test]
fn checker_catches_a_stale_read() {
    mutation_is_caught(Mutation::StaleRead, Violation::Stale, 10, 200);
}

/// With the switch on, a flipped byte is reported as bytes from nowhere.
#[test]
fn checker_catches_garbage_bytes() {
    mutation_is_caught(Mutation::Garbage, Violation::FromNowhere, 10, 50);
}

/// With the engine's ordering off (and the checker expecting it), the
/// overlapping IO of one core in flight together completes out of order
/// in some seeds, and the checker reports stale reads or lost writes
/// there (not every seed has such IO: at least 10 of 100 must fail; 36 did
/// when this was written).
#[test]
fn checker_catches_io_the_engine_did_not_order() {
    let mut rts = Runtimes::new();
    let mut caught = 0;
    for seed in 0..100 {
        let cfg = SimConfig::from_seed(seed).mutated(Mutation::Unordered);
        let run = run_seed(&mut rts, &cfg);
        if run.report.has(Violation::Stale)
            || run.report.has(Violation::Lost)
            || run.report.has(Violation::Future)
        {
            caught += 1;
        }
        let other =
            run.report.violations.iter().find(|(v, _)| {
                !matches!(v, Violation::Stale | Violation::Lost | Violation::Future)
            });
        assert!(other.is_none(), "seed {seed}: unexpected {other:?}");
    }
    println!("unordered: {caught} of 100 seeds caught");
    assert!(
        caught >= 10,
        "only {caught} of 100 unordered seeds were caught"
    );
}
