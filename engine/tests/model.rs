//! Property test: random streams of reads and writes, issued concurrently
//! through the engine onto the simulated `mem` device, give the same read
//! results and final contents as applying them one at a time to a plain
//! byte array, with every mechanism (merging at each `nomerges` level, the
//! bio and buffer caches, the cached clock, iostats, small queue depths and
//! request limits that force splits and tag waits) switched on or off at
//! random.

use std::sync::Arc;
use std::time::Duration;

use plugio_device::backend::mem::{Latency, MemClock, MemConfig, MemDevice};
use plugio_device::RingConfig;
use plugio_engine::{Device, DeviceOptions};
use proptest::prelude::*;

const BLOCK: u64 = 512;
const CAPACITY_BYTES: u64 = 256 * 1024;

#[derive(Debug, Clone)]
enum Op {
    Read { lba: u64, blocks: u64 },
    Write { lba: u64, blocks: u64, fill: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    let max_lba = CAPACITY_BYTES / BLOCK;
    prop_oneof![
        (0..max_lba - 64, 1..64u64).prop_map(|(lba, blocks)| Op::Read { lba, blocks }),
        (0..max_lba - 64, 1..64u64, any::<u8>()).prop_map(|(lba, blocks, fill)| Op::Write {
            lba,
            blocks,
            fill
        }),
    ]
}

fn bytes_of(fill: u8, lba: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            fill.wrapping_add((lba as u8).wrapping_mul(3))
                .wrapping_add(i as u8 / 7)
        })
        .collect()
}

/// Applies `ops` one at a time to a byte array: the expected read results
/// and final contents.
fn model(ops: &[Op]) -> (Vec<Option<Vec<u8>>>, Vec<u8>) {
    let mut disk = vec![0u8; CAPACITY_BYTES as usize];
    let reads = ops
        .iter()
        .map(|op| match *op {
            Op::Read { lba, blocks } => {
                let (s, e) = ((lba * BLOCK) as usize, ((lba + blocks) * BLOCK) as usize);
                Some(disk[s..e].to_vec())
            }
            Op::Write { lba, blocks, fill } => {
                let s = (lba * BLOCK) as usize;
                let data = bytes_of(fill, lba, (blocks * BLOCK) as usize);
                disk[s..s + data.len()].copy_from_slice(&data);
                None
            }
        })
        .collect();
    (reads, disk)
}

/// Runs `ops` through the engine, all issued in program order in one go.
fn engine(ops: &[Op], opts: DeviceOptions, seed: u64) -> (Vec<Option<Vec<u8>>>, Vec<u8>) {
    let mem = MemDevice::new(MemConfig {
        capacity_bytes: CAPACITY_BYTES,
        latency: Latency::Uniform {
            min: Duration::from_micros(1),
            max: Duration::from_micros(200),
        },
        clock: MemClock::Virtual,
        seed,
        ..Default::default()
    });
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("executor");
    let ops = ops.to_vec();
    ex.run(async move {
        let dev = Device::with_backend(Arc::new(mem), None, opts).expect("device");
        let handles: Vec<_> = ops
            .into_iter()
            .map(|op| {
                let dev = dev.clone();
                plugio_executor::spawn_local(async move {
                    match op {
                        Op::Read { lba, blocks } => {
                            let b = dev
                                .read_alloc_at(lba * BLOCK, (blocks * BLOCK) as usize)
                                .await
                                .expect("read");
                            Some(b.as_slice().to_vec())
                        }
                        Op::Write { lba, blocks, fill } => {
                            let mut b = dev.alloc_buf((blocks * BLOCK) as usize);
                            let data = bytes_of(fill, lba, b.len());
                            b.as_mut_slice().copy_from_slice(&data);
                            let (r, _) = dev.write_at(b, lba * BLOCK).await;
                            assert_eq!(r.expect("write") as u64, blocks * BLOCK);
                            None
                        }
                    }
                })
            })
            .collect();
        let mut reads = Vec::new();
        for h in handles {
            reads.push(h.await.expect("io task"));
        }
        let all = dev
            .read_alloc_at(0, CAPACITY_BYTES as usize)
            .await
            .expect("final read");
        assert_eq!(dev.tags_in_use(), 0);
        (reads, all.as_slice().to_vec())
    })
}

proptest! {
    // 48 cases by default; PROPTEST_CASES overrides (ProptestConfig::default reads it).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        ..ProptestConfig::default()
    })]

    #[test]
    fn concurrent_stream_matches_sequential_model(
        ops in prop::collection::vec(op(), 1..120),
        depth in 1u32..48,
        max_count in 1usize..40,
        max_request_kb in prop_oneof![Just(None), (1u64..32).prop_map(Some)],
        nomerges in 0u8..3,
        switches in any::<[bool; 5]>(),
        seed in any::<u64>(),
    ) {
        let opts = DeviceOptions {
            queue_depth: depth,
            plug_max_count: max_count,
            max_request_bytes: max_request_kb.map(|kb| kb * 1024),
            nomerges,
            bio_cache: switches[0],
            buffer_cache: switches[1],
            cached_clock: switches[2],
            iostats: switches[3],
            fast_lane: switches[4],
            ..Default::default()
        };
        let (want_reads, want_disk) = model(&ops);
        let (tx, rx) = std::sync::mpsc::channel();
        let ops2 = ops.clone();
        std::thread::spawn(move || {
            let _ = tx.send(engine(&ops2, opts, seed));
        });
        let res = rx.recv_timeout(Duration::from_secs(20));
        prop_assert!(res.is_ok(), "the engine hung or panicked on this stream");
        let (got_reads, got_disk) = res.unwrap();
        for (i, (w, g)) in want_reads.iter().zip(&got_reads).enumerate() {
            prop_assert!(w == g, "op {} ({:?}) read different bytes", i, ops[i]);
        }
        prop_assert!(want_disk == got_disk, "final contents differ");
    }
}
