//! The checker: what a database may rely on, checked block by block over
//! one run's history.
//!
//! Writes are whole blocks (O_DIRECT), and a torn power cut tears at
//! block granularity, so every block holds exactly what one write (or
//! write zeroes, discard, or nothing yet) put there. A block's possible
//! contents are the writes that cover it; the checker decides which of
//! them may be there.
//!
//! "`a` before `b`" (`precedes`): `a` was acknowledged before `b` was
//! issued, or (with `overlap_order`) both come from one core, `a` was
//! issued first and one of the two writes (the engine keeps program order
//! between the overlapping IO of one core).
//!
//! Rules:
//! - Durable: a write is *required* when it was acknowledged and is a FUA
//!   write acknowledged before the cut, or is covered by a flush
//!   acknowledged before the cut (acknowledged before the flush was
//!   issued, or issued before it on the same core with `overlap_order`).
//!   After the cut a block holds a required write, or a write that is not
//!   before it; never anything older (*lost*), and zeroes only when no
//!   write of it is required.
//! - Reads (acknowledged before the cut): each block holds a write that
//!   was issued before the read ended and is not after it, and that no
//!   acknowledged write before the read overwrote (*stale*); zeroes only
//!   when no acknowledged write of the block came before the read.
//! - No byte from nowhere: a block that no write could have produced is
//!   garbage, wherever it is seen.
//! - Results: a successful read or write moves all its bytes (the device
//!   has no end of file inside it); errors are the typed ones the
//!   injected faults cause; every tag is back at the end; the image read
//!   through the engine is the device's own.

use plugio_device::ErrorKind;

use crate::config::BLOCK_BYTES;
use crate::history::{History, Kind, Outcome, Rec};

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A required write is missing after the cut (an older one is there).
    Lost,
    /// A read returned contents that an acknowledged write had replaced.
    Stale,
    /// A read returned a write issued after it (an ordering violation).
    Future,
    /// Bytes that no write produced.
    FromNowhere,
    /// A successful read or write that moved fewer bytes than asked.
    ShortResult,
    /// An error no injected fault explains.
    UnexpectedError,
    /// Tags held after everything ended.
    TagsLeft,
    /// The image read back through the engine is not the device's.
    ReadBack,
}

/// The checker's findings and counts.
#[derive(Debug, Default)]
pub struct Report {
    /// Every violation, with a description.
    pub violations: Vec<(Violation, String)>,
    /// IOs issued.
    pub ios: u64,
    /// IOs that ended with an error.
    pub failed_ios: u64,
    /// Bytes compared (reads before the cut and the image after it).
    pub bytes_checked: u64,
}

impl Report {
    fn add(&mut self, v: Violation, detail: String) {
        self.violations.push((v, detail));
    }

    /// Whether a violation of kind `v` was found.
    pub fn has(&self, v: Violation) -> bool {
        self.violations.iter().any(|(k, _)| *k == v)
    }
}

struct Checker<'a> {
    h: &'a History,
    /// Per block, the indices (in `h.recs`) of the writes covering it.
    writers: Vec<Vec<usize>>,
    /// Per record, whether it is a required write.
    required: Vec<bool>,
}

/// Checks one run.
pub fn check(h: &History, capacity_blocks: u64) -> Report {
    let mut writers = vec![Vec::new(); capacity_blocks as usize];
    for (i, r) in h.recs.iter().enumerate() {
        if r.kind.is_write() {
            for lba in r.lba..r.lba + r.blocks {
                writers[lba as usize].push(i);
            }
        }
    }
    let mut c = Checker {
        h,
        writers,
        required: Vec::new(),
    };
    c.required = h.recs.iter().map(|r| c.is_required(r)).collect();
    let mut report = Report {
        ios: h.recs.len() as u64,
        ..Report::default()
    };
    c.results(&mut report);
    for r in h.recs.iter().filter(|r| r.kind == Kind::Read) {
        c.read(r, &mut report);
    }
    c.image(&mut report);
    if h.tags_left != 0 {
        report.add(
            Violation::TagsLeft,
            format!("{} tags held at the end", h.tags_left),
        );
    }
    if h.image != h.durable {
        let at = h.image.iter().zip(&h.durable).position(|(a, b)| a != b);
        report.add(
            Violation::ReadBack,
            format!(
                "the engine read back other bytes than the device holds (first at byte {at:?})"
            ),
        );
    }
    report
}

impl Checker<'_> {
    fn precedes(&self, a: &Rec, b: &Rec) -> bool {
        a.acked_before(b.issue)
            || (self.h.ordered
                && a.core == b.core
                && a.issue < b.issue
                && (a.kind.is_write() || b.kind.is_write()))
    }

    fn is_required(&self, w: &Rec) -> bool {
        if !w.kind.is_write() || !w.ok() {
            return false;
        }
        if w.kind == Kind::FuaWrite && w.acked_before(self.h.cut_start) {
            return true;
        }
        self.h.recs.iter().any(|f| {
            f.kind == Kind::Flush
                && f.ok()
                && f.acked_before(self.h.cut_start)
                && (w.acked_before(f.issue)
                    || (self.h.ordered && f.core == w.core && w.issue < f.issue))
        })
    }

    fn results(&self, report: &mut Report) {
        for r in &self.h.recs {
            let want = (r.blocks * BLOCK_BYTES) as usize;
            match &r.outcome {
                Outcome::Ok(n) if matches!(r.kind, Kind::Read | Kind::Write | Kind::FuaWrite) => {
                    // A write may stop short where the device filled up
                    // part way (a partial count, then ENOSPC on the rest):
                    // whole blocks, some of them. Nothing else is short.
                    let filled = r.kind.is_write()
                        && *n > 0
                        && *n < want
                        && *n % BLOCK_BYTES as usize == 0
                        && self.h.faults_injected > 0;
                    if *n != want && !filled {
                        report.add(
                            Violation::ShortResult,
                            format!(
                                "{} returned Ok({n}) for {want} bytes inside the device",
                                describe(r)
                            ),
                        );
                    }
                }
                Outcome::Ok(_) | Outcome::Dropped => {}
                Outcome::Err(kind) => {
                    report.failed_ios += 1;
                    if !expected_error(kind) {
                        report.add(
                            Violation::UnexpectedError,
                            format!("{} failed with {kind:?}", describe(r)),
                        );
                    }
                }
            }
        }
    }

    fn read(&self, r: &Rec, report: &mut Report) {
        let (Outcome::Ok(n), Some(ack)) = (&r.outcome, r.ack) else {
            return;
        };
        if ack >= self.h.cut_start {
            return;
        }
        let block = BLOCK_BYTES as usize;
        for (i, got) in r.data[..*n].chunks_exact(block).enumerate() {
            let lba = r.lba + i as u64;
            report.bytes_checked += block as u64;
            let hk = &self.writers[lba as usize];
            let recs = || hk.iter().map(|&i| &self.h.recs[i]);
            let zero_ok = !recs().any(|w| w.wrote(lba) && self.precedes(w, r));
            if zero_ok && got.iter().all(|&b| b == 0) {
                continue;
            }
            let superseded = |w: &Rec| {
                recs().any(|w2| {
                    w2.id != w.id && w2.wrote(lba) && self.precedes(w, w2) && self.precedes(w2, r)
                })
            };
            let makes = |w: &Rec| w.block_bytes(lba)[..] == *got;
            let fine =
                recs().any(|w| w.issue < ack && !self.precedes(r, w) && makes(w) && !superseded(w));
            if fine {
                continue;
            }
            let what = if recs().any(|w| makes(w) && w.issue < ack && !self.precedes(r, w))
                || got.iter().all(|&b| b == 0)
            {
                Violation::Stale
            } else if recs().any(makes) {
                Violation::Future
            } else {
                Violation::FromNowhere
            };
            report.add(
                what,
                format!("{} block {lba}: {}", describe(r), self.who(lba, got)),
            );
        }
    }

    fn image(&self, report: &mut Report) {
        let block = BLOCK_BYTES as usize;
        for (lba, got) in self.h.image.chunks_exact(block).enumerate() {
            report.bytes_checked += block as u64;
            let hk = &self.writers[lba];
            let recs = || hk.iter().map(|&i| &self.h.recs[i]);
            let required: Vec<&Rec> = hk
                .iter()
                .filter(|&&i| self.required[i] && self.h.recs[i].wrote(lba as u64))
                .map(|&i| &self.h.recs[i])
                .collect();
            if required.is_empty() && got.iter().all(|&b| b == 0) {
                continue;
            }
            let makes = |w: &Rec| w.block_bytes(lba as u64)[..] == *got;
            let allowed = |w: &Rec| required.iter().all(|q| !self.precedes(w, q));
            if recs().any(|w| makes(w) && allowed(w)) {
                continue;
            }
            let what = if recs().any(makes) || got.iter().all(|&b| b == 0) {
                Violation::Lost
            } else {
                Violation::FromNowhere
            };
            let req: Vec<String> = required.iter().map(|q| describe(q)).collect();
            report.add(
                what,
                format!(
                    "after the cut, block {lba}: {}; required: {}",
                    self.who(lba as u64, got),
                    req.join(", ")
                ),
            );
        }
    }

    /// Names the write whose bytes `got` are (for messages).
    fn who(&self, lba: u64, got: &[u8]) -> String {
        if got.iter().all(|&b| b == 0) {
            return "holds zeroes".into();
        }
        self.writers[lba as usize]
            .iter()
            .map(|&i| &self.h.recs[i])
            .find(|w| w.block_bytes(lba)[..] == *got)
            .map_or_else(
                || "holds bytes no write produced".into(),
                |w| format!("holds {}", describe(w)),
            )
    }
}

/// The errors the injected faults cause: EIO (bad blocks), ENODEV (IO in
/// flight at the power cut), ENOSPC, and IO that made no progress.
fn expected_error(kind: &ErrorKind) -> bool {
    matches!(kind, ErrorKind::Io { errno } if *errno == libc::EIO || *errno == libc::ENODEV)
        || matches!(kind, ErrorKind::OutOfSpace | ErrorKind::NoProgress { .. })
}

/// One IO, for messages.
pub fn describe(r: &Rec) -> String {
    format!(
        "{:?} #{} (core {}, blocks {}..{}, issued at {}, done at {:?}, {:?})",
        r.kind,
        r.id,
        r.core,
        r.lba,
        r.lba + r.blocks,
        r.issue,
        r.ack,
        r.outcome
    )
}
