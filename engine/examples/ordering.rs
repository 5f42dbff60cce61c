//! What exact write ordering costs (issue #13), side by side in one run:
//!
//! - `overlap`: `TASKS` one-block writes issued at once, to `TASKS /
//!   WRITERS` distinct offsets in a scattered order, so each offset is
//!   written by about `WRITERS` tasks (their writes must land in program
//!   order); against `distinct`: the same
//!   number of writes to as many distinct offsets (nothing to order), and
//!   `reads`: the overlapping offsets read instead (reads never wait).
//! - `mixed QD q`: 20,000 IOs, half writes, at random block offsets of the
//!   file, all issued at once with the device's queue depth `q`: the time
//!   must not grow with the queue depth.
//!
//! Usage: `ordering PATH [--rounds N] [--buffered] [--case PREFIX]` (PATH: a file of at
//! least 64 MiB on a file system that takes O_DIRECT, unless
//! `--buffered`). Prints one markdown table: medians of the rounds
//! (each round runs every case once, in turn), IOPS, and the ratios the
//! goals are stated in.

use std::time::Instant;

use plugio_device::RingConfig;
use plugio_engine::{Device, DeviceOptions};

const TASKS: u64 = 4000;
const WRITERS: u64 = 12;
const MIXED_IOS: u64 = 20_000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: ordering PATH [--rounds N] [--buffered]");
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let direct = !args.iter().any(|a| a == "--buffered");
    let blocks = std::fs::metadata(path).expect("stat").len() / 4096;
    assert!(
        blocks >= 2 * TASKS,
        "the file must hold at least {} blocks",
        2 * TASKS
    );
    let cases: Vec<(&str, Case)> = vec![
        (
            "overlap: 4000 writes, ~12 per offset, QD 128",
            Case::Writes {
                distinct: TASKS / WRITERS,
            },
        ),
        (
            "distinct: 4000 writes, 4000 offsets, QD 128",
            Case::Writes { distinct: TASKS },
        ),
        (
            "reads: 4000 reads, ~12 per offset, QD 128",
            Case::Reads {
                distinct: TASKS / WRITERS,
            },
        ),
        ("mixed, half writes, QD 256", Case::Mixed { qd: 256 }),
        ("mixed, half writes, QD 65536", Case::Mixed { qd: 65_536 }),
    ];
    // `--case PREFIX`: run only the cases whose name starts with it.
    let only = args
        .iter()
        .position(|a| a == "--case")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let cases: Vec<(&str, Case)> = cases
        .into_iter()
        .filter(|(name, _)| only.as_ref().is_none_or(|p| name.starts_with(p.as_str())))
        .collect();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, (_, case)) in cases.iter().enumerate() {
            times[i].push(run(path, direct, blocks, *case));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let med: Vec<f64> = times.iter_mut().map(median).collect();
    println!("| case | IOs | median s | IOPS |");
    println!("|---|---|---|---|");
    for (i, (name, case)) in cases.iter().enumerate() {
        let ios = case.ios();
        println!(
            "| {name} | {ios} | {:.3} | {:.0} |",
            med[i],
            ios as f64 / med[i]
        );
    }
    if med.len() == 5 {
        println!();
        println!(
            "overlapping writes / distinct writes (IOPS): {:.2} (goal >= 0.5)",
            med[1] / med[0]
        );
        println!(
            "mixed QD 65536 / QD 256 (time): {:.2} (goal: flat, ~1)",
            med[4] / med[3]
        );
    }
}

#[derive(Clone, Copy)]
enum Case {
    Writes { distinct: u64 },
    Reads { distinct: u64 },
    Mixed { qd: u32 },
}

impl Case {
    fn ios(self) -> u64 {
        match self {
            Case::Writes { .. } | Case::Reads { .. } => TASKS,
            Case::Mixed { .. } => MIXED_IOS,
        }
    }
}

/// Runs one case on a fresh runtime; returns its seconds (first issue to
/// last completion).
fn run(path: &str, direct: bool, blocks: u64, case: Case) -> f64 {
    let qd = match case {
        Case::Mixed { qd } => qd,
        _ => 128,
    };
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async move {
        let dev = Device::open(
            path,
            DeviceOptions {
                direct,
                queue_depth: qd,
                ..DeviceOptions::default()
            },
        )
        .expect("open");
        let start = Instant::now();
        let tasks: Vec<_> = (0..case.ios())
            .map(|i| {
                let dev = dev.clone();
                // Offsets in a scattered order (a multiplicative hash), so
                // writes to one offset are spread over the whole batch, as
                // independent tasks issue them.
                let x = (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                // Every other block, so that no two of them merge; all
                // distinct when there are as many offsets as tasks.
                let spot = |distinct: u64| {
                    2 * if distinct >= TASKS {
                        i
                    } else {
                        (x >> 20) % distinct
                    }
                };
                let (write, block) = match case {
                    Case::Writes { distinct } => (true, spot(distinct)),
                    Case::Reads { distinct } => (false, spot(distinct)),
                    Case::Mixed { .. } => (x >> 63 == 1, (x >> 20) % blocks),
                };
                plugio_executor::spawn_local(async move {
                    let mut buf = dev.alloc_buf(4096);
                    if write {
                        buf.as_mut_slice().fill(i as u8);
                        dev.write_at(buf, block * 4096).await.0.expect("write");
                    } else {
                        dev.read_at(buf, block * 4096).await.0.expect("read");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        start.elapsed().as_secs_f64()
    })
}
