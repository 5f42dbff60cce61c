//! One seed's configuration: everything a run does is drawn from its seed
//! here (device, engine options, workload shape, when the power is cut),
//! so that a seed names a run.

use std::time::Duration;

use plugio_device::backend::mem::{Latency, MemClock, MemConfig, PowerCutMode};
use plugio_engine::DeviceOptions;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The logical block of the simulated device, in bytes.
pub const BLOCK_BYTES: u64 = 512;

/// A deliberate corruption of what the checker is given, to show that it
/// catches each kind of bug (see `main.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// After the power cut, one acknowledged FUA write that nothing
    /// overwrote is replaced by the block's older contents, as a device
    /// that acknowledged FUA without making the write durable would leave.
    LostFua,
    /// One block of one acknowledged read is replaced by the contents the
    /// block had before the last write that completed before the read was
    /// issued.
    StaleRead,
    /// One byte of the image after the power cut is flipped.
    Garbage,
    /// The engine runs with `overlap_order` off while the checker holds
    /// it to program order, as an engine that lost its ordering would.
    Unordered,
}

impl Mutation {
    /// Parses `PLUGIO_SIM_MUTATE`'s value.
    pub fn parse(s: &str) -> Option<Mutation> {
        match s {
            "lost-fua" => Some(Mutation::LostFua),
            "stale-read" => Some(Mutation::StaleRead),
            "garbage" => Some(Mutation::Garbage),
            "unordered" => Some(Mutation::Unordered),
            _ => None,
        }
    }
}

/// What one seed runs.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The seed everything below was drawn from.
    pub seed: u64,
    /// 1 or 2 cores, each running its own workload on the one device.
    pub cores: usize,
    /// Device size in logical blocks.
    pub capacity_blocks: u64,
    /// The hot zone at the start of the device that about half the IO
    /// targets (so that IO overlaps often), in blocks.
    pub hot_blocks: u64,
    /// IOs each core issues (flushes included) before the run ends.
    pub ops_per_core: u32,
    /// The power is cut after this many IOs were issued in all (counted
    /// over the cores), while that IO's batch is in flight.
    pub cut_at_op: u32,
    /// The mem device's configuration.
    pub mem: MemConfig,
    /// The engine's options.
    pub opts: DeviceOptions,
    /// The corruption applied before checking (tests of the checker).
    pub mutation: Option<Mutation>,
}

impl SimConfig {
    /// Draws seed `seed`'s configuration.
    pub fn from_seed(seed: u64) -> SimConfig {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_c0f1_9000_0000);
        let cores = if rng.gen_bool(0.5) { 2 } else { 1 };
        let capacity_blocks = [256u64, 1024][rng.gen_range(0..2)];
        let ops_per_core = rng.gen_range(40..160);
        let total = ops_per_core * cores as u32;
        let max_us = [1u64, 20, 200][rng.gen_range(0..3)];
        let mem = MemConfig {
            capacity_bytes: capacity_blocks * BLOCK_BYTES,
            queue_depth: [1, 4, 32][rng.gen_range(0..3)],
            latency: Latency::Uniform {
                min: Duration::from_micros(1),
                max: Duration::from_micros(max_us),
            },
            clock: MemClock::Virtual,
            seed: rng.gen(),
            power_cut_mode: if rng.gen_bool(0.5) {
                PowerCutMode::Torn
            } else {
                PowerCutMode::LoseUnflushed
            },
            ..MemConfig::default()
        };
        let opts = DeviceOptions {
            queue_depth: [1, 2, 8, 32, 256][rng.gen_range(0..5)],
            plug_max_count: [1, 4, 32][rng.gen_range(0..3)],
            nomerges: rng.gen_range(0..3),
            max_request_bytes: [None, Some(4096), Some(8192)][rng.gen_range(0..3)],
            overlap_order: rng.gen_bool(0.85),
            buffer_cache: rng.gen_bool(0.5),
            ..DeviceOptions::default()
        };
        SimConfig {
            seed,
            cores,
            capacity_blocks,
            hot_blocks: 64,
            ops_per_core,
            cut_at_op: rng.gen_range(total / 4..total),
            mem,
            opts,
            mutation: None,
        }
    }

    /// This configuration with mutation `m`.
    pub fn mutated(mut self, m: Mutation) -> SimConfig {
        self.mutation = Some(m);
        if m == Mutation::Unordered {
            self.opts.overlap_order = false;
        }
        self
    }
}
