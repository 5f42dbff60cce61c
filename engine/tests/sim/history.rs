//! What a run did, as the checker sees it: one record per IO, stamped on
//! one logical clock shared by the cores.
//!
//! Stamps: `issue` is taken just before the IO future's first poll (the
//! IO cannot take effect before it), `ack` just after it returned `Ready`
//! (the IO took effect before it). So `a.ack < b.issue` means that `a`
//! took effect before `b` did, whatever the cores.

use plugio_device::ErrorKind;

use crate::config::BLOCK_BYTES;

/// The kind of an IO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A plain write of generated data.
    Write,
    /// A FUA write of generated data (durable once acknowledged).
    FuaWrite,
    /// `write_zeroes`.
    Zeroes,
    /// `discard` (the mem device zeroes what it discards).
    Discard,
    /// A read.
    Read,
    /// `flush` (or `sync`).
    Flush,
}

impl Kind {
    /// Changes the device's contents.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Kind::Write | Kind::FuaWrite | Kind::Zeroes | Kind::Discard
        )
    }
}

/// How an IO ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its future was dropped before it completed (the IO itself may still
    /// have happened).
    Dropped,
    /// Bytes moved (0 for ops without data).
    Ok(usize),
    /// A typed error.
    Err(ErrorKind),
}

/// One IO.
#[derive(Debug, Clone)]
pub struct Rec {
    /// Unique over the run; names the data a write wrote.
    pub id: u32,
    /// The core that issued it.
    pub core: u8,
    /// What it was.
    pub kind: Kind,
    /// First block.
    pub lba: u64,
    /// Blocks covered (0 for a flush).
    pub blocks: u64,
    /// Logical time of the first poll.
    pub issue: u64,
    /// Logical time of completion (`None` when dropped).
    pub ack: Option<u64>,
    /// How it ended.
    pub outcome: Outcome,
    /// What a read returned.
    pub data: Vec<u8>,
}

impl Rec {
    /// Completed successfully.
    pub fn ok(&self) -> bool {
        matches!(self.outcome, Outcome::Ok(_))
    }

    /// Covers block `lba`.
    pub fn covers(&self, lba: u64) -> bool {
        self.lba <= lba && lba < self.lba + self.blocks
    }

    /// A successful write wrote block `lba`: it covers it, and it is
    /// inside the bytes the write returned (a write that filled the
    /// device part way returns fewer than it covers).
    pub fn wrote(&self, lba: u64) -> bool {
        match self.outcome {
            Outcome::Ok(n) => self.covers(lba) && lba < self.lba + n as u64 / BLOCK_BYTES,
            _ => false,
        }
    }

    /// Completed before logical time `t`.
    pub fn acked_before(&self, t: u64) -> bool {
        self.ack.is_some_and(|a| a < t)
    }

    /// The bytes this write put in block `lba` (zeroes for write zeroes
    /// and discard).
    pub fn block_bytes(&self, lba: u64) -> [u8; BLOCK_BYTES as usize] {
        let mut out = [0u8; BLOCK_BYTES as usize];
        if matches!(self.kind, Kind::Write | Kind::FuaWrite) {
            fill_block(self.id, lba, &mut out);
        }
        out
    }
}

/// The generated contents of block `lba` as write `id` writes it: every
/// 8-byte word is a hash of the write, the block and the word, so that no
/// two writes (and no two blocks of one write) hold the same bytes.
pub fn fill_block(id: u32, lba: u64, out: &mut [u8]) {
    for (i, word) in out.chunks_exact_mut(8).enumerate() {
        let x = splitmix64(u64::from(id) << 40 ^ lba << 8 ^ i as u64);
        word.copy_from_slice(&x.to_le_bytes());
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Everything the checker needs from one run.
#[derive(Debug, Default)]
pub struct History {
    /// Every IO of every core.
    pub recs: Vec<Rec>,
    /// Logical time just before the power cut.
    pub cut_start: u64,
    /// The device's contents after the run (a second power cut at the
    /// end, then read back through the engine).
    pub image: Vec<u8>,
    /// The durable image as the mem device holds it (must equal `image`).
    pub durable: Vec<u8>,
    /// Faults injected during the run.
    pub faults_injected: u64,
    /// Whether overlapping IO of one core is ordered (`overlap_order`).
    pub ordered: bool,
    /// Tags still held at the end.
    pub tags_left: u32,
}
