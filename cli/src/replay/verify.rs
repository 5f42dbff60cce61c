//! `--verify`: which write each sector should hold ([`BlockMap`]), the check
//! of replayed reads as they complete, and the final read-back of every
//! written sector through the engine ([`verify_all`]).
//!
//! Invariants:
//! - The map is updated when a write or discard is *issued*, in trace
//!   order. The dispatcher never lets an IO overlap an in-flight write or
//!   discard (nor a write overlap an in-flight read), so when a read
//!   completes, the map still says what it must have seen.
//! - A discarded sector is unchecked afterwards (its contents are the
//!   device's choice); a never-written sector is checked against zeros only
//!   when the target was created by the replay ([`Unwritten::Zeros`]).

use std::ops::Range;

use futures::stream::{FuturesUnordered, StreamExt};
use plugio_engine::Device;
use rangemap::RangeMap;
use serde::Serialize;

use super::error::ReplayError;
use super::pattern::{self, Found};
use super::trace::{TraceIo, TraceOp, SECTOR_BYTES};

/// The largest read of the final read-back, bytes.
const VERIFY_READ_BYTES: u64 = 1 << 20;

/// Mismatches described in full (the rest are only counted).
const MAX_DESCRIBED: usize = 10;

/// Marks a discarded sector in the map.
const DISCARDED: u64 = u64::MAX;

/// What sectors no replayed write touched should hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unwritten {
    /// Anything: they are not checked (an existing target).
    Unchecked,
    /// Zeros: the target was created (sparse) by the replay.
    Zeros,
}

/// What verification found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyStats {
    /// Sectors compared in replayed reads as they completed.
    pub read_sectors_checked: u64,
    /// Sectors compared in the final read-back.
    pub final_sectors_checked: u64,
    /// Sectors that did not hold what they should.
    pub mismatched_sectors: u64,
    /// The first mismatches, described.
    pub first_mismatches: Vec<String>,
}

impl VerifyStats {
    /// `Err(ReplayError::Verify)` when anything mismatched.
    ///
    /// # Errors
    /// See above.
    pub fn into_result(self) -> Result<VerifyStats, ReplayError> {
        if self.mismatched_sectors == 0 {
            Ok(self)
        } else {
            Err(ReplayError::Verify {
                mismatched_sectors: self.mismatched_sectors,
                first: self.first_mismatches,
            })
        }
    }
}

/// The last write (trace index) issued to each sector, as ranges of
/// sectors: one entry per write or discard however long it is (neighbours
/// with the same value are joined), so a trace's 2 GiB discards cost a few
/// bytes, not one entry per sector (they had cost 1.7 GB for eight).
#[derive(Debug)]
pub struct BlockMap {
    last: RangeMap<u64, u64>,
    unwritten: Unwritten,
}

/// What one sector should hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Write(u64),
    Zeros,
    Unchecked,
}

impl BlockMap {
    /// An empty map.
    pub fn new(unwritten: Unwritten) -> Self {
        BlockMap {
            last: RangeMap::new(),
            unwritten,
        }
    }

    /// Records trace IO `seq` as issued: a write becomes each of its
    /// sectors' last write, a discard makes them unchecked.
    pub fn record(&mut self, seq: u64, io: &TraceIo) {
        let value = match io.op {
            TraceOp::Write => seq,
            TraceOp::Discard => DISCARDED,
            TraceOp::Read | TraceOp::Flush => return,
        };
        let sectors = sectors_of(io.offset_bytes, io.len_bytes);
        if !sectors.is_empty() {
            self.last.insert(sectors, value);
        }
    }

    /// Entries of the map (ranges of sectors with one value).
    #[cfg(test)]
    fn ranges(&self) -> usize {
        self.last.iter().count()
    }

    fn expect(&self, sector: u64) -> Expect {
        match self.last.get(&sector) {
            Some(&DISCARDED) => Expect::Unchecked,
            Some(&seq) => Expect::Write(seq),
            None if self.unwritten == Unwritten::Zeros => Expect::Zeros,
            None => Expect::Unchecked,
        }
    }

    /// Compares `data`, read at `offset_bytes`, with what each of its
    /// sectors should hold; returns the sectors compared. `what` names the
    /// read in mismatch messages.
    pub fn check(
        &self,
        data: &[u8],
        offset_bytes: u64,
        ios: &[TraceIo],
        what: &str,
        stats: &mut VerifyStats,
    ) -> u64 {
        let first = offset_bytes / SECTOR_BYTES;
        let mut checked = 0;
        for (i, chunk) in data.chunks_exact(SECTOR_BYTES as usize).enumerate() {
            let sector = first + i as u64;
            let want = self.expect(sector);
            let found = match want {
                Expect::Unchecked => continue,
                _ => pattern::decode(chunk, sector),
            };
            checked += 1;
            let ok = match want {
                Expect::Write(seq) => found == Found::Write(seq),
                _ => found == Found::Zeros,
            };
            if !ok {
                stats.mismatched_sectors += 1;
                if stats.first_mismatches.len() < MAX_DESCRIBED {
                    stats
                        .first_mismatches
                        .push(describe(sector, want, found, ios, what));
                }
            }
        }
        checked
    }

    /// The written (not discarded) sectors as sorted runs of at most
    /// [`VERIFY_READ_BYTES`]: `(offset_bytes, len_bytes)`.
    fn written_runs(&self) -> Vec<(u64, u64)> {
        // Neighbouring ranges of different writes join into one run.
        let mut joined: Vec<Range<u64>> = Vec::new();
        for (r, _) in self.last.iter().filter(|(_, &v)| v != DISCARDED) {
            match joined.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => joined.push(r.clone()),
            }
        }
        let max = VERIFY_READ_BYTES / SECTOR_BYTES;
        let mut runs = Vec::new();
        for r in joined {
            let mut s = r.start;
            while s < r.end {
                let n = (r.end - s).min(max);
                runs.push((s * SECTOR_BYTES, n * SECTOR_BYTES));
                s += n;
            }
        }
        runs
    }
}

/// The sectors `[offset_bytes, offset_bytes + len_bytes)` covers (a trace
/// IO is whole sectors; the parsers check it).
fn sectors_of(offset_bytes: u64, len_bytes: u64) -> Range<u64> {
    let first = offset_bytes / SECTOR_BYTES;
    first..first + len_bytes / SECTOR_BYTES
}

fn write_name(seq: u64, ios: &[TraceIo]) -> String {
    match ios.get(seq as usize) {
        Some(io) => format!("write #{seq} (trace line {})", io.line),
        None => format!("write #{seq} (not in this replay)"),
    }
}

fn describe(sector: u64, want: Expect, found: Found, ios: &[TraceIo], what: &str) -> String {
    let want = match want {
        Expect::Write(seq) => write_name(seq, ios),
        _ => "zeros (never written)".to_string(),
    };
    let found = match found {
        Found::Write(seq) => write_name(seq, ios),
        Found::Zeros => "zeros".to_string(),
        Found::Other => "other bytes".to_string(),
    };
    format!(
        "{what}: sector {sector} (byte {}) should hold {want} but holds {found}",
        sector * SECTOR_BYTES
    )
}

/// Reads back every written sector through `dev` (at most `iodepth`
/// reads in flight, on the calling core) and checks it.
///
/// # Errors
/// A read failed or came back short.
pub async fn verify_all(
    dev: &Device,
    map: &BlockMap,
    ios: &[TraceIo],
    iodepth: usize,
    stats: &mut VerifyStats,
) -> Result<(), ReplayError> {
    let runs = map.written_runs();
    let mut pending = runs.iter();
    let mut reads = FuturesUnordered::new();
    loop {
        while reads.len() < iodepth.max(1) {
            let Some(&(off, len)) = pending.next() else {
                break;
            };
            reads.push(async move { (off, len, dev.read_alloc_at(off, len as usize).await) });
        }
        let Some((off, len, res)) = reads.next().await else {
            break;
        };
        let buf = res.map_err(|e| match e.io() {
            // The error names its IO already.
            Some(_) => ReplayError::engine("verify".to_owned(), e),
            None => ReplayError::engine(format!("verify: read of {len} bytes at offset {off}"), e),
        })?;
        if buf.len() as u64 != len {
            return Err(ReplayError::usage(format!(
                "verify: read of {len} bytes at offset {off} returned {} bytes: the target \
                 shrank during the replay",
                buf.len()
            )));
        }
        let checked = map.check(buf.as_slice(), off, ios, "final read-back", stats);
        stats.final_sectors_checked += checked;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(op: TraceOp, offset_bytes: u64, len_bytes: u64) -> TraceIo {
        TraceIo::test(op, offset_bytes, len_bytes)
    }

    /// The map after recording `ios` in order.
    fn recorded(ios: &[TraceIo], unwritten: Unwritten) -> BlockMap {
        let mut map = BlockMap::new(unwritten);
        for (i, x) in ios.iter().enumerate() {
            map.record(i as u64, x);
        }
        map
    }

    #[test]
    fn the_map_keeps_the_last_write_and_forgets_discards() {
        let ios = [
            io(TraceOp::Write, 0, 2048),
            io(TraceOp::Write, 1024, 512),
            io(TraceOp::Discard, 1536, 512),
        ];
        let map = recorded(&ios, Unwritten::Zeros);
        assert_eq!(map.expect(0), Expect::Write(0));
        assert_eq!(map.expect(2), Expect::Write(1));
        assert_eq!(map.expect(3), Expect::Unchecked);
        assert_eq!(map.expect(4), Expect::Zeros);
        assert_eq!(map.written_runs(), [(0, 1536)]);

        let mut data = vec![0u8; 2048];
        pattern::fill(&mut data[..1024], 0, 0);
        pattern::fill(&mut data[1024..1536], 1024, 1);
        let mut stats = VerifyStats::default();
        assert_eq!(map.check(&data, 0, &ios, "r", &mut stats), 3);
        assert_eq!(stats.mismatched_sectors, 0);
        // Sector 2 holding write 0 instead of write 1 is caught.
        pattern::fill(&mut data[1024..1536], 1024, 0);
        map.check(&data, 0, &ios, "r", &mut stats);
        assert_eq!(stats.mismatched_sectors, 1);
        assert!(
            stats.first_mismatches[0]
                .contains("should hold write #1 (trace line 1) but holds write #0"),
            "{:?}",
            stats.first_mismatches
        );
        assert!(stats.into_result().is_err());
    }

    #[test]
    fn long_discards_and_writes_are_one_entry_each() {
        const GIB: u64 = 1 << 30;
        let mut ios: Vec<TraceIo> = (0..8)
            .map(|i| io(TraceOp::Discard, i * 2 * GIB, 2 * GIB))
            .collect();
        // A write inside the third discard, and one across the end of the
        // last, both 1 GiB.
        ios.push(io(TraceOp::Write, 4 * GIB + 4096, GIB));
        ios.push(io(TraceOp::Write, 16 * GIB - 512, GIB));
        let map = recorded(&ios, Unwritten::Zeros);
        // The eight discards join into one range, which the first write
        // splits in three and the second shortens: 4 entries for 18 GiB
        // of trace (one per sector was 35.7 million).
        assert_eq!(map.ranges(), 4);
        let sector = |b: u64| b / SECTOR_BYTES;
        assert_eq!(map.expect(sector(4 * GIB)), Expect::Unchecked);
        assert_eq!(map.expect(sector(4 * GIB + 4096)), Expect::Write(8));
        assert_eq!(map.expect(sector(5 * GIB + 4095)), Expect::Write(8));
        assert_eq!(map.expect(sector(5 * GIB + 4096)), Expect::Unchecked);
        assert_eq!(map.expect(sector(16 * GIB - 512)), Expect::Write(9));
        assert_eq!(map.expect(sector(17 * GIB - 513)), Expect::Write(9));
        assert_eq!(map.expect(sector(17 * GIB - 512)), Expect::Zeros);
        // The read-back covers both writes in reads of at most 1 MiB, in
        // order, and nothing discarded.
        let runs = map.written_runs();
        assert_eq!(runs.len(), 2048);
        assert_eq!(runs[0], (4 * GIB + 4096, VERIFY_READ_BYTES));
        assert_eq!(runs[1024], (16 * GIB - 512, VERIFY_READ_BYTES));
        assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), 2 * GIB);
        assert!(runs.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0));
    }

    #[test]
    fn the_range_map_agrees_with_a_map_per_sector_on_random_traces() {
        use rand::{Rng, SeedableRng};
        for seed in 0..200u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let ios: Vec<TraceIo> = (0..rng.gen_range(1..60))
                .map(|_| {
                    let op = match rng.gen_range(0..10) {
                        0..=5 => TraceOp::Write,
                        6..=7 => TraceOp::Discard,
                        8 => TraceOp::Read,
                        _ => TraceOp::Flush,
                    };
                    let len = if op == TraceOp::Flush {
                        0
                    } else {
                        rng.gen_range(1..40) * SECTOR_BYTES
                    };
                    io(op, rng.gen_range(0..200) * SECTOR_BYTES, len)
                })
                .collect();
            let unwritten = if seed % 2 == 0 {
                Unwritten::Zeros
            } else {
                Unwritten::Unchecked
            };
            let map = recorded(&ios, unwritten);
            // The model: the last write or discard of each sector.
            let mut last = std::collections::BTreeMap::new();
            for (i, x) in ios.iter().enumerate() {
                let v = match x.op {
                    TraceOp::Write => i as u64,
                    TraceOp::Discard => DISCARDED,
                    _ => continue,
                };
                for s in sectors_of(x.offset_bytes, x.len_bytes) {
                    last.insert(s, v);
                }
            }
            for s in 0..260 {
                let want = match last.get(&s) {
                    Some(&DISCARDED) => Expect::Unchecked,
                    Some(&v) => Expect::Write(v),
                    None if unwritten == Unwritten::Zeros => Expect::Zeros,
                    None => Expect::Unchecked,
                };
                assert_eq!(map.expect(s), want, "seed {seed}, sector {s}");
            }
            // The read-back covers exactly the written sectors, once each.
            let mut read: Vec<u64> = map
                .written_runs()
                .iter()
                .flat_map(|&(off, len)| sectors_of(off, len))
                .collect();
            let written: Vec<u64> = last
                .iter()
                .filter(|(_, &v)| v != DISCARDED)
                .map(|(&s, _)| s)
                .collect();
            read.sort_unstable();
            assert_eq!(read, written, "seed {seed}");
        }
    }

    #[test]
    fn neighbouring_writes_are_read_back_as_one_run() {
        let ios = [
            io(TraceOp::Write, 0, 512),
            io(TraceOp::Write, 512, 1024),
            io(TraceOp::Write, 4096, 512),
            io(TraceOp::Discard, 4096, 512),
            io(TraceOp::Write, 8192, 512),
        ];
        let map = recorded(&ios, Unwritten::Unchecked);
        assert_eq!(map.written_runs(), [(0, 1536), (8192, 512)]);
        assert_eq!(map.expect(9), Expect::Unchecked);
        assert_eq!(map.expect(17), Expect::Unchecked);
    }
}
