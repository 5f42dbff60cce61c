//! Random streams of IO against a program-order model, shared by the
//! engine's model tests (`fast_lane_model.rs`, `lane_model.rs`): the ops,
//! the model that says what each read must see, running the ops over a
//! few ticks, and checking what they returned.

#![allow(dead_code)] // each model uses its own subset of the ops

use plugio_engine::{Device, IoFlags};

#[derive(Debug, Clone)]
pub enum Op {
    Read {
        off: u64,
        len: usize,
        flags: IoFlags,
    },
    Write {
        off: u64,
        len: usize,
        v: u8,
        flags: IoFlags,
    },
    Zeroes {
        off: u64,
        len: usize,
    },
    Discard {
        off: u64,
        len: usize,
    },
    Nop,
    Flush,
    DroppedRead {
        off: u64,
        len: usize,
        after: usize,
    },
}

impl Op {
    /// The op moved `base` bytes on (into its core's region).
    pub fn at(self, base: u64) -> Op {
        match self {
            Op::Read { off, len, flags } => Op::Read {
                off: off + base,
                len,
                flags,
            },
            Op::Write { off, len, v, flags } => Op::Write {
                off: off + base,
                len,
                v,
                flags,
            },
            Op::Zeroes { off, len } => Op::Zeroes {
                off: off + base,
                len,
            },
            Op::Discard { off, len } => Op::Discard {
                off: off + base,
                len,
            },
            Op::DroppedRead { off, len, after } => Op::DroppedRead {
                off: off + base,
                len,
                after,
            },
            op => op,
        }
    }
}

/// One op of a round: its device, the ticks it waits before it is
/// issued, and the op.
pub type Planned = (usize, usize, Op);

/// Runs `ops` on the models in program order (by tick, then as issued)
/// and returns what each read must see. A write that would leave a hole
/// becomes a read past the end; write zeroes and discards past the end
/// become NOPs.
pub fn apply(ops: &mut [Planned], models: &mut [Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let mut order: Vec<usize> = (0..ops.len()).collect();
    order.sort_by_key(|&i| (ops[i].1, i));
    let mut want = vec![None; ops.len()];
    for i in order {
        let m = &mut models[ops[i].0];
        let size = m.len();
        match ops[i].2 {
            Op::Read { off, len, .. } => {
                let s = (off as usize).min(size);
                let e = (off as usize + len).min(size).max(s);
                want[i] = Some(m[s..e].to_vec());
            }
            Op::Write { off, len, v, .. } => {
                let (s, e) = (off as usize, off as usize + len);
                if s > size {
                    ops[i].2 = Op::Read {
                        off,
                        len,
                        flags: IoFlags::NONE,
                    };
                    want[i] = Some(Vec::new());
                    continue;
                }
                if e > size {
                    m.resize(e, 0);
                }
                m[s..e].fill(v);
            }
            Op::Zeroes { off, len } | Op::Discard { off, len } => {
                let (s, e) = (off as usize, off as usize + len);
                if e > size {
                    ops[i].2 = Op::Nop;
                    continue;
                }
                m[s..e].fill(0);
            }
            _ => {}
        }
    }
    want
}

/// Runs the `ops` of round `round` (each moved `base` bytes on) on `devs`
/// and checks each read against `want` (from [`apply`]); panics with
/// `desc` on a difference or an error.
pub async fn run_and_check(
    devs: &[Device],
    ops: &[Planned],
    base: u64,
    want: Vec<Option<Vec<u8>>>,
    desc: &str,
    round: usize,
) {
    let futs = ops
        .iter()
        .map(|(dev, delay, op)| run_op(&devs[*dev], *delay, op.clone().at(base)));
    let got = futures::future::join_all(futs).await;
    for (i, (g, w)) in got.into_iter().zip(want).enumerate() {
        let g = g.unwrap_or_else(|e| panic!("{desc}: round {round} op {i} {:?}: {e}", ops[i]));
        let Some(w) = w else {
            continue;
        };
        let g = g.expect("read data");
        if g != w {
            let first = g.iter().zip(w.iter()).position(|(a, b)| a != b);
            panic!(
                "{desc}: round {round} op {i} {:?}: got {} bytes, want {}; first difference at {first:?}\nops: {ops:?}",
                ops[i], g.len(), w.len()
            );
        }
    }
}

/// Waits until every tag of `devs` is back ([`crate::common::settle`]);
/// checks nothing is left in flight.
pub async fn drain(devs: &[Device], desc: &str) {
    for dev in devs {
        crate::common::settle(dev, desc).await;
        assert_eq!(dev.iostats().in_flight, 0, "{desc}");
    }
}

/// Issues `op` on `dev` after `delay` ticks; a read's data, or `None`.
pub async fn run_op(dev: &Device, delay: usize, op: Op) -> Result<Option<Vec<u8>>, String> {
    for _ in 0..delay {
        plugio_executor::yield_now().await;
    }
    let e = |e: plugio_engine::Error| format!("{e:?}");
    match op {
        Op::Read { off, len, flags } => {
            let (r, b) = dev.read_at_with(dev.alloc_buf(len), off, flags).await;
            r.map(|n| Some(b.as_slice()[..n].to_vec())).map_err(e)
        }
        Op::Write { off, len, v, flags } => {
            let mut b = dev.alloc_buf(len);
            b.as_mut_slice().fill(v);
            let (r, _) = dev.write_at_with(b, off, flags).await;
            let n = r.map_err(e)?;
            assert_eq!(n, len, "a whole write");
            Ok(None)
        }
        Op::Zeroes { off, len } => dev
            .write_zeroes(off, len as u64)
            .await
            .map(|_| None)
            .map_err(e),
        Op::Discard { off, len } => dev.discard(off, len as u64).await.map(|_| None).map_err(e),
        Op::Nop => dev.nop().await.map(|_| None).map_err(e),
        Op::Flush => dev.sync_data().await.map(|_| None).map_err(e),
        Op::DroppedRead { off, len, after } => {
            let mut f = Box::pin(dev.read_alloc_at(off, len));
            if futures::poll!(f.as_mut()).is_ready() {
                return Ok(None);
            }
            for _ in 0..after {
                plugio_executor::yield_now().await;
            }
            drop(f);
            Ok(None)
        }
    }
}
