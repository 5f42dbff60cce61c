//! The merge planner (plug sort, runs, back and front merges, splits at
//! the request limits, overlap ordering), driven through the engine's
//! `Device` on the mem device against the simplest model: a device that
//! runs the IOs one at a time in program order. A random batch of reads,
//! writes, FUA writes and flushes (overlapping, adjacent or apart) is
//! issued in one tick under an explicit plug, with random `nomerges` and
//! request limits; every result, every byte read, and the device's final
//! contents must be the model's, and every tag must come back.

#![no_main]

use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use plugio_device::backend::mem::{MemConfig, MemDevice};
use plugio_device::{IoFlags, RingConfig};
use plugio_engine::{Device, DeviceOptions};
use plugio_executor::LocalExecutor;

const BLOCK: usize = 512;
const BLOCKS: usize = 256;

#[derive(Debug, Arbitrary)]
enum Op {
    Read { lba: u8, n: u8 },
    Write { lba: u8, n: u8, fill: u8, fua: bool },
    Flush,
}

#[derive(Debug, Arbitrary)]
struct Input {
    nomerges: u8,
    /// 0: no limit; else the request limit in 512-byte blocks.
    max_request_blocks: u8,
    max_merge_blocks: u8,
    queue_depth: u8,
    ops: Vec<Op>,
}

thread_local! {
    static EX: LocalExecutor = plugio_engine::runtime::local(RingConfig::default()).expect("executor");
}

/// `[lba, lba + n)` clipped to the device, at least one block.
fn range(lba: u8, n: u8) -> (usize, usize) {
    let lba = usize::from(lba) % BLOCKS;
    let n = (usize::from(n) % 16 + 1).min(BLOCKS - lba);
    (lba * BLOCK, n * BLOCK)
}

fn limit(blocks: u8) -> Option<u64> {
    (blocks != 0).then(|| u64::from(blocks.max(8)) * BLOCK as u64)
}

#[derive(Debug, PartialEq)]
enum Out {
    Read(Vec<u8>),
    Write(usize),
    Flush,
}

fn model(ops: &[Op]) -> (Vec<Out>, Vec<u8>) {
    let mut img = vec![0u8; BLOCKS * BLOCK];
    let out = ops
        .iter()
        .map(|op| match *op {
            Op::Read { lba, n } => {
                let (off, len) = range(lba, n);
                Out::Read(img[off..off + len].to_vec())
            }
            Op::Write { lba, n, fill, .. } => {
                let (off, len) = range(lba, n);
                img[off..off + len].fill(fill);
                Out::Write(len)
            }
            Op::Flush => Out::Flush,
        })
        .collect();
    (out, img)
}

fn run(input: &Input) {
    let ops = &input.ops[..input.ops.len().min(64)];
    let (want, want_img) = model(ops);
    let mem = Arc::new(MemDevice::new(MemConfig {
        capacity_bytes: (BLOCKS * BLOCK) as u64,
        ..MemConfig::default()
    }));
    let opts = DeviceOptions {
        nomerges: input.nomerges % 3,
        queue_depth: u32::from(input.queue_depth % 64) + 1,
        max_request_bytes: limit(input.max_request_blocks),
        max_merge_bytes: limit(input.max_merge_blocks),
        ..DeviceOptions::default()
    };
    let dev = Device::with_backend(mem, None, opts).expect("options");
    let (got, img) = EX.with(|ex| {
        ex.run(async {
            let guard = dev.plug(ops.len()).expect("plug");
            let ios = ops.iter().map(|op| {
                let dev = &dev;
                async move {
                    match *op {
                        Op::Read { lba, n } => {
                            let (off, len) = range(lba, n);
                            Out::Read(
                                dev.read_alloc_at(off as u64, len)
                                    .await
                                    .expect("read")
                                    .as_slice()
                                    .to_vec(),
                            )
                        }
                        Op::Write { lba, n, fill, fua } => {
                            let (off, len) = range(lba, n);
                            let mut b = dev.alloc_buf(len);
                            b.as_mut_slice().fill(fill);
                            let flags = if fua { IoFlags::FUA } else { IoFlags::NONE };
                            Out::Write(
                                dev.write_at_with(b, off as u64, flags)
                                    .await
                                    .0
                                    .expect("write"),
                            )
                        }
                        Op::Flush => {
                            dev.sync_data().await.expect("flush");
                            Out::Flush
                        }
                    }
                }
            });
            let all = futures::future::join_all(ios);
            let mut all = std::pin::pin!(all);
            // The first poll plugs every IO; the guard's end flushes them.
            let first = futures::poll!(all.as_mut());
            drop(guard);
            let got = match first {
                std::task::Poll::Ready(v) => v,
                std::task::Poll::Pending => all.await,
            };
            let img = dev
                .read_alloc_at(0, BLOCKS * BLOCK)
                .await
                .expect("read all");
            (got, img.as_slice().to_vec())
        })
    });
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g == w, "IO {i} ({:?}) differs from the model", ops[i]);
    }
    assert!(img == want_img, "final contents differ from the model");
    assert_eq!(dev.tags_in_use(), 0, "tags left in use");
}

fuzz_target!(|input: Input| run(&input));
