//! The interval index through the engine: many overlapping writes with
//! different data and reads among them (queue depth 256, issued over two
//! ticks), of 4 KiB to 64 KiB (within two of the index's 16 KiB chunks, in
//! its buckets, or more, in its tree), 1 MiB and over 1 MiB, around spots
//! far apart in a sparse file (chunks that share hash buckets): each read
//! sees exactly the writes issued before it, and every tag comes back.
//! Fast lane on and off, `nomerges` 0 and 2, O_DIRECT and buffered. (From
//! a break-it pass on the index.)

mod common;

use common::{local, tmpdir, watchdog, Rng};
use plugio_engine::{Device, DeviceOptions};

const MIB: u64 = 1 << 20;

#[test]
fn overlapping_writes_across_chunks_keep_program_order() {
    for seed in 1..=12u64 {
        for (fl, nomerges, direct) in [(true, 0u8, true), (false, 2, true), (true, 2, false)] {
            watchdog(120, move || run(seed, fl, nomerges, direct));
        }
    }
}

fn run(seed: u64, fl: bool, nomerges: u8, direct: bool) {
    let mut rng = Rng(seed.wrapping_mul(0x9e3779b97f4a7c15) | 1);
    let dir = tmpdir();
    let path = dir.path().join("sparse");
    // Hot spots: around chunk boundaries near 0, and at far offsets.
    let spots: Vec<u64> = vec![
        2 * MIB + 4096,
        16 * MIB,
        33 * MIB,
        257 * MIB,
        513 * MIB,
        4096 * MIB,
        4096 * MIB + 256 * MIB,
    ];
    let size = spots.iter().max().unwrap() + 4 * MIB;
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(size).unwrap();
    drop(f);
    let o = DeviceOptions {
        fast_lane: fl,
        nomerges,
        direct,
        queue_depth: 256,
        ..DeviceOptions::default()
    };
    let desc = format!("seed {seed} fl {fl} nomerges {nomerges} direct {direct}");
    // Model: only the bytes around the spots (sparse map: spot -> 8 MiB window).
    let win = 6 * MIB;
    let mut model: Vec<Vec<u8>> = spots.iter().map(|_| vec![0u8; win as usize]).collect();
    local().run(async move {
        let dev = Device::open(&path, o).expect("open");
        for round in 0..6 {
            let n = 20 + rng.below(120) as usize;
            let mut ops = Vec::new(); // (spot, rel_off, len, Some(v) = write)
            for _ in 0..n {
                let s = rng.below(spots.len() as u64) as usize;
                // Relative to spot - 2 MiB: straddle the spot's boundary.
                let len = match rng.below(6) {
                    0 => (1 + rng.below(3)) * MIB + 4096 * rng.below(3), // large
                    1 => MIB,
                    _ => 4096 * (1 + rng.below(16)),
                };
                let center = 2 * MIB;
                let rel = (center - 8 * 4096 * 4).saturating_sub(len / 2) + 4096 * rng.below(64);
                let rel = rel.min(win - len);
                let w = if rng.below(2) == 0 { Some(rng.next() as u8 | 1) } else { None };
                let delay = rng.below(2) as usize;
                ops.push((s, rel, len, w, delay));
            }
            let mut order: Vec<usize> = (0..ops.len()).collect();
            order.sort_by_key(|&i| (ops[i].4, i));
            let mut want = vec![None; ops.len()];
            for &i in &order {
                let (s, rel, len, w, _) = ops[i];
                let m = &mut model[s][rel as usize..(rel + len) as usize];
                match w {
                    Some(v) => m.fill(v),
                    None => want[i] = Some(m.to_vec()),
                }
            }
            let futs = ops.iter().map(|&(s, rel, len, w, delay)| {
                let dev = &dev;
                let at = spots[s].saturating_sub(2 * MIB) + rel;
                async move {
                    for _ in 0..delay {
                        plugio_executor::yield_now().await;
                    }
                    match w {
                        Some(v) => {
                            let mut b = dev.alloc_buf(len as usize);
                            b.as_mut_slice().fill(v);
                            let (r, _) = dev.write_at(b, at).await;
                            assert_eq!(r.expect("write"), len as usize);
                            None
                        }
                        None => Some(dev.read_alloc_at(at, len as usize).await.expect("read").as_slice().to_vec()),
                    }
                }
            });
            let got = futures::future::join_all(futs).await;
            for (i, g) in got.into_iter().enumerate() {
                if let (Some(g), Some(w)) = (g, &want[i]) {
                    if g != *w {
                        let k = g.iter().zip(w.iter()).position(|(a, b)| a != b);
                        panic!("{desc}: round {round} op {i} {:?}: first diff at {k:?} (got {:?} want {:?})",
                            ops[i], k.map(|k| g[k]), k.map(|k| w[k]));
                    }
                }
            }
        }
        assert_eq!(dev.tags_in_use(), 0, "{desc}");
    });
}
