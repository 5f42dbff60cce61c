//! What exact write ordering costs (issue #13), side by side in one run:
//!
//! - `overlap`: `TASKS` one-block writes issued at once, `TASKS / WRITERS`
//!   distinct offsets, so each offset is written by `WRITERS` tasks in a
//!   row (they must land in program order); against `distinct`: the same
//!   number of writes to as many distinct offsets (nothing to order), and
//!   `reads`: the overlapping offsets read instead (reads never wait).
//! - `mixed QD q`: 20,000 IOs, half writes, at random block offsets of the
//!   file, all issued at once with the device's queue depth `q`: the time
//!   must not grow with the queue depth.
//!
//! Usage: `ordering PATH [--rounds N] [--buffered]` (PATH: a file of at
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
        blocks >= TASKS,
        "the file must hold at least {TASKS} blocks"
    );
    let cases: Vec<(&str, Case)> = vec![
        (
            "overlap: 4000 writes, 12 per offset, QD 128",
            Case::Writes {
                distinct: TASKS / WRITERS,
            },
        ),
        (
            "distinct: 4000 writes, 1 per offset, QD 128",
            Case::Writes { distinct: TASKS },
        ),
        (
            "reads: 4000 reads, 12 per offset, QD 128",
            Case::Reads {
                distinct: TASKS / WRITERS,
            },
        ),
        ("mixed, half writes, QD 256", Case::Mixed { qd: 256 }),
        ("mixed, half writes, QD 65536", Case::Mixed { qd: 65_536 }),
    ];
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
                let (write, block) = match case {
                    Case::Writes { distinct } => (true, i % distinct),
                    Case::Reads { distinct } => (false, i % distinct),
                    Case::Mixed { .. } => {
                        let x = (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                        (x >> 63 == 1, (x >> 20) % blocks)
                    }
                };
                plugio_executor::spawn_local(async move {
                    let mut buf = dev.alloc_buf(4096);
                    if write {
                        buf.as_mut_slice().fill(i as u8);
                        dev.write_at(buf, block * 4096).await.0.expect("write");
                    } else {
                        dev.read_into(buf, block * 4096).await.0.expect("read");
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
