//! The mem backend: a simulated block device in memory, deterministic for a
//! seed, with latency, a queue depth, injected faults and power cuts.
//!
//! Model:
//! - Two images: `volatile` (what reads see) and `durable` (what survives a
//!   power cut). A write lands in `volatile` and marks its blocks dirty; a
//!   FUA write also lands in `durable`; `Flush`/`Fsync` (and PREFLUSH) copy
//!   every dirty block to `durable`.
//! - `queue_depth` service channels: an op starts on the channel that frees
//!   first, takes a latency drawn from the seeded RNG, and takes effect and
//!   completes at its deadline, on the submitting core (deadline heap).
//!   With [`MemClock::Virtual`] (the default) deadlines are virtual and the
//!   driver delivers one deadline per park, so the order of events depends
//!   only on the seed and the program, never on real timing.
//! - [`MemDevice::power_cut`] drops every dirty block (or, in
//!   [`PowerCutMode::Torn`], keeps a seeded random subset, so multi-block
//!   writes tear at block granularity); ops still in flight then fail with
//!   `ENODEV`, as the block layer fails the IO of a device that went
//!   offline (`BLK_STS_OFFLINE`): an error of the whole device at one
//!   instant, not of the blocks (those are `EIO`, [`Fault::Eio`]).
//!
//! Invariants: the op's effect happens exactly once, at its completion;
//! with the same seed, config and submission order, results and latencies
//! are identical run to run.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::sync::OwnedOp;
use super::{check_op, Backend, BackendKind};
use crate::core::{with_core, HandlerId};
use crate::error::Result;
use crate::geometry::{DeviceKind, Geometry, FILE_MAX_SECTORS_KB, FILE_MAX_SEGMENTS};
use crate::op::{IoFlags, IoOp, OpKind};

/// How long a simulated op takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Latency {
    /// Completes at the next park.
    Zero,
    /// Always this long.
    Fixed(Duration),
    /// Uniform in `[min, max]`.
    Uniform {
        /// Shortest.
        min: Duration,
        /// Longest.
        max: Duration,
    },
}

/// Which clock drives simulated latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemClock {
    /// Latencies are virtual: they order completions (a discrete event
    /// simulation; the driver delivers one deadline at a time) but nobody
    /// waits for them. Runs are deterministic for a seed whatever the real
    /// timing. The default.
    Virtual,
    /// Latencies are real: an op completes no earlier than its latency
    /// after it reached a free channel. Completion order then depends on
    /// real submission times.
    Real,
}

/// Which ops a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOn {
    /// Reads only.
    Read,
    /// Writes (including write zeroes and discard) only.
    Write,
    /// Both.
    Both,
}

/// An injected fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Ops touching any LBA in `lbas` fail with `EIO`.
    Eio {
        /// The failing logical blocks.
        lbas: Range<u64>,
        /// Which ops fail.
        on: FaultOn,
    },
    /// A read covering `lba` returns only the bytes before it (0 when it
    /// starts at `lba`).
    ShortRead {
        /// Where reads stop.
        lba: u64,
    },
    /// The next `ops` reads or writes (as `on` says; each uses one up,
    /// also one that then fails for another fault; `u64::MAX` for every
    /// one) move at most `bytes` bytes and return that partial count, as
    /// a device may: a read any count, a write whole logical blocks (its
    /// count rounded down to a multiple of the block: 0 when `bytes` is
    /// under one block).
    Partial {
        /// The most bytes one op moves.
        bytes: u64,
        /// Which ops it applies to.
        on: FaultOn,
        /// Ops left to cut short.
        ops: u64,
    },
    /// A write that would take the bytes written in total past `bytes`
    /// fails with `ENOSPC`, none of it written; writes that still fit go
    /// (a smaller one after the refusal may).
    EnospcAfter {
        /// Total bytes the device accepts.
        bytes: u64,
    },
    /// A file system that fills up: once `bytes` have been written in
    /// total, a write that does not fit writes the whole blocks that do
    /// and returns that short count, as `pwrite` does on a full file
    /// system; a write when no block fits fails with `ENOSPC`.
    FullAfter {
        /// Total bytes the device accepts.
        bytes: u64,
    },
    /// The next `ops` ops (of any kind) fail with `EAGAIN` without touching
    /// the device, as io_uring reports a per-op `-EAGAIN` for a direct
    /// submission ([`Backend::submit_direct`]); each failed op uses one up.
    Eagain {
        /// Ops left to fail.
        ops: u64,
    },
    /// Cuts the power (as [`MemDevice::power_cut`]) when the `writes`-th
    /// write from now is about to land: that write lands nowhere and fails
    /// with `ENODEV`, as does every op in flight then, and unflushed
    /// blocks are lost (or torn). One cut per fault, which stays in the
    /// list, spent; `writes: 0` never cuts. Several faults due at one
    /// write make one cut. A crash test aims a cut at a chosen IO this
    /// way, deterministically, where a cut from the test's own code lands
    /// wherever the scheduling put it. [`MemDevice::power_cuts`] says
    /// whether it happened.
    ///
    /// The device counts what reaches it: write, write-zeroes and discard
    /// requests, as each takes effect (1: the next one), not an attempt
    /// refused with `EAGAIN`. Through the engine a request is not a
    /// caller's IO: adjacent writes plugged together are merged into one
    /// request (counted once; `DeviceOptions::nomerges: 2` keeps them
    /// apart), and a write longer than the request limit is split into
    /// several (each counted).
    PowerCutAt {
        /// Writes left until the cut (the last one is cut).
        writes: u64,
    },
}

/// What a power cut does to unflushed writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerCutMode {
    /// Every unflushed block is lost.
    LoseUnflushed,
    /// Each unflushed block survives with probability 1/2 (seeded): writes
    /// tear at block granularity.
    Torn,
}

/// Configuration of a [`MemDevice`].
#[derive(Debug, Clone)]
pub struct MemConfig {
    /// Size in bytes (a multiple of the logical block). Default 64 MiB.
    pub capacity_bytes: u64,
    /// Logical block (LBA) size. Default 512.
    pub logical_block_bytes: u32,
    /// Physical block size. Default 4096.
    pub physical_block_bytes: u32,
    /// Required buffer address alignment. Default 512.
    pub mem_align_bytes: u32,
    /// Service channels (`nr_requests`). Default 32.
    pub queue_depth: u32,
    /// Latency of each op. Default [`Latency::Zero`].
    pub latency: Latency,
    /// Virtual (deterministic, default) or real latency.
    pub clock: MemClock,
    /// RNG seed. Default 0.
    pub seed: u64,
    /// Faults active from the start. Default none.
    pub faults: Vec<Fault>,
    /// Power-cut behaviour. Default [`PowerCutMode::LoseUnflushed`].
    pub power_cut_mode: PowerCutMode,
}

impl Default for MemConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 64 << 20,
            logical_block_bytes: 512,
            physical_block_bytes: 4096,
            mem_align_bytes: 512,
            queue_depth: 32,
            latency: Latency::Zero,
            clock: MemClock::Virtual,
            seed: 0,
            faults: Vec::new(),
            power_cut_mode: PowerCutMode::LoseUnflushed,
        }
    }
}

struct MemState {
    volatile: Vec<u8>,
    durable: Vec<u8>,
    dirty: BTreeSet<u64>,
    written_bytes: u64,
    rng: SmallRng,
    /// When each channel frees, as time since `epoch`.
    channels: Vec<Duration>,
    /// The virtual clock: the latest deadline that took effect.
    vnow: Duration,
    faults: Vec<Fault>,
    generation: u64,
}

struct MemInner {
    state: Mutex<MemState>,
    block: u64,
    power_cut_mode: PowerCutMode,
    clock: MemClock,
    epoch: Instant,
}

/// The simulated device. Cheap to share (`Arc` inside).
#[derive(Clone)]
pub struct MemDevice {
    inner: Arc<MemInner>,
    geometry: Geometry,
    latency: Latency,
}

impl std::fmt::Debug for MemDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemDevice")
            .field("capacity_bytes", &self.geometry.capacity_bytes)
            .field("latency", &self.latency)
            .finish_non_exhaustive()
    }
}

impl MemDevice {
    /// Creates a zero-filled device.
    ///
    /// # Panics
    /// When `logical_block_bytes` or a non-zero `mem_align_bytes` is not a
    /// power of two, or the capacity is not a multiple of the logical block
    /// (configuration errors).
    pub fn new(config: MemConfig) -> Self {
        let block = config.logical_block_bytes;
        assert!(
            block.is_power_of_two(),
            "logical block must be a power of two"
        );
        // The alignment checks use masks (see `backend`'s invariants).
        assert!(
            config.mem_align_bytes <= 1 || config.mem_align_bytes.is_power_of_two(),
            "mem_align_bytes must be a power of two"
        );
        assert!(
            config.capacity_bytes % u64::from(block) == 0,
            "capacity must be a multiple of the logical block"
        );
        let size = config.capacity_bytes as usize;
        let depth = config.queue_depth.max(1);
        let geometry = Geometry {
            kind: DeviceKind::Memory,
            direct: true,
            logical_block_bytes: block,
            physical_block_bytes: config.physical_block_bytes,
            dio_mem_align_bytes: config.mem_align_bytes,
            dio_offset_align_bytes: block,
            max_sectors_kb: FILE_MAX_SECTORS_KB,
            max_hw_sectors_kb: FILE_MAX_SECTORS_KB,
            max_segments: FILE_MAX_SEGMENTS,
            max_segment_bytes: u32::MAX,
            nr_requests: depth,
            rotational: false,
            nomerges: 0,
            capacity_bytes: Some(config.capacity_bytes),
            source: None,
        };
        let now = Instant::now();
        // Virtual deadlines are placed in the past so nobody waits for them;
        // their order alone matters.
        let epoch = match config.clock {
            MemClock::Real => now,
            MemClock::Virtual => [3600, 60, 1]
                .iter()
                .find_map(|&s| now.checked_sub(Duration::from_secs(s)))
                .unwrap_or(now),
        };
        Self {
            inner: Arc::new(MemInner {
                state: Mutex::new(MemState {
                    volatile: vec![0; size],
                    durable: vec![0; size],
                    dirty: BTreeSet::new(),
                    written_bytes: 0,
                    rng: SmallRng::seed_from_u64(config.seed),
                    channels: vec![Duration::ZERO; depth as usize],
                    vnow: Duration::ZERO,
                    faults: config.faults,
                    generation: 0,
                }),
                block: u64::from(block),
                power_cut_mode: config.power_cut_mode,
                clock: config.clock,
                epoch,
            }),
            geometry,
            latency: config.latency,
        }
    }

    /// A device whose contents (read and durable alike) are `image`: the
    /// disk a machine finds after a reboot, when `image` is another
    /// device's [`durable_bytes`](Self::durable_bytes) over its whole
    /// capacity. A crash test that cuts the power of the old device and
    /// recovers on the new one is safe from writes the crashed code still
    /// had in flight: those land on the old device only (after a
    /// [`power_cut`](Self::power_cut) the old device serves them again).
    ///
    /// ```
    /// use plugio::device::backend::mem::{MemConfig, MemDevice};
    /// let config = MemConfig { capacity_bytes: 1 << 20, ..MemConfig::default() };
    /// let old = MemDevice::new(config.clone());
    /// old.power_cut();
    /// let image = old.durable_bytes(0..1 << 20);
    /// let rebooted = MemDevice::from_image(config, image);
    /// assert_eq!(rebooted.durable_bytes(0..4096), vec![0; 4096]);
    /// assert_eq!(rebooted.dirty_blocks(), 0);
    /// ```
    ///
    /// # Panics
    /// As [`MemDevice::new`], and when `image` is not `capacity_bytes`
    /// long.
    pub fn from_image(config: MemConfig, image: Vec<u8>) -> Self {
        assert_eq!(
            image.len() as u64,
            config.capacity_bytes,
            "the image must be capacity_bytes long"
        );
        let dev = Self::new(config);
        {
            let mut st = dev.inner.lock();
            st.durable.clone_from(&image);
            st.volatile = image;
        }
        dev
    }

    /// Adds a fault.
    pub fn inject(&self, fault: Fault) {
        self.inner.lock().faults.push(fault);
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.inner.lock().faults.clear();
    }

    /// Cuts the power: unflushed blocks are lost (or torn, per
    /// [`PowerCutMode`]), reads then see the durable image, and ops still
    /// in flight complete with `ENODEV` (the device went away under them;
    /// ops submitted after the cut are served again).
    pub fn power_cut(&self) {
        self.inner.cut(&mut self.inner.lock());
    }

    /// Power cuts so far: by [`power_cut`](Self::power_cut) and by
    /// [`Fault::PowerCutAt`].
    pub fn power_cuts(&self) -> u64 {
        self.inner.lock().generation
    }

    /// Bytes accepted by writes so far (for `EnospcAfter`).
    pub fn written_bytes(&self) -> u64 {
        self.inner.lock().written_bytes
    }

    /// A copy of the durable image in `range` (what a power cut would keep).
    ///
    /// # Panics
    /// When `range` is beyond the capacity.
    pub fn durable_bytes(&self, range: Range<u64>) -> Vec<u8> {
        self.inner.lock().durable[range.start as usize..range.end as usize].to_vec()
    }

    /// Blocks written but not yet durable.
    pub fn dirty_blocks(&self) -> usize {
        self.inner.lock().dirty.len()
    }

    /// The simulated time: with [`MemClock::Virtual`], the deadline of the
    /// latest op executed so far (the device's own clock, which no load on
    /// the machine moves); with [`MemClock::Real`], the time since the
    /// device was created. Tests measure how much IO overlapped with it.
    pub fn now(&self) -> Duration {
        match self.inner.clock {
            MemClock::Virtual => self.inner.lock().vnow,
            MemClock::Real => self.inner.epoch.elapsed(),
        }
    }

    /// The op's deadline as time since the epoch: it starts on the channel
    /// that frees first, no earlier than the current (virtual or real) time.
    fn deadline(&self, st: &mut MemState) -> Duration {
        let latency = match self.latency {
            Latency::Zero => Duration::ZERO,
            Latency::Fixed(d) => d,
            Latency::Uniform { min, max } if max > min => {
                let ns = st
                    .rng
                    .gen_range(min.as_nanos() as u64..=max.as_nanos() as u64);
                Duration::from_nanos(ns)
            }
            Latency::Uniform { min, .. } => min,
        };
        let now = match self.inner.clock {
            MemClock::Virtual => st.vnow,
            MemClock::Real => self.inner.epoch.elapsed(),
        };
        let (channel, free_at) = st
            .channels
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|&(_, t)| t)
            .unwrap_or((0, now));
        let deadline = free_at.max(now) + latency;
        if let Some(c) = st.channels.get_mut(channel) {
            *c = deadline;
        }
        deadline
    }
}

impl MemInner {
    fn lock(&self) -> MutexGuard<'_, MemState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`MemDevice::power_cut`] under the caller's lock.
    fn cut(&self, st: &mut MemState) {
        let block = self.block as usize;
        let dirty = std::mem::take(&mut st.dirty);
        for b in dirty {
            let keep = self.power_cut_mode == PowerCutMode::Torn && st.rng.gen_bool(0.5);
            let r = b as usize * block..(b as usize + 1) * block;
            if keep {
                st.durable[r.clone()].copy_from_slice(&st.volatile[r]);
            } else {
                st.volatile[r.clone()].copy_from_slice(&st.durable[r]);
            }
        }
        st.generation += 1;
    }

    /// Counts `op` against a [`Fault::PowerCutAt`]; true when it is the
    /// write the power is cut at (the cut is made).
    fn cut_at(&self, st: &mut MemState, op: &OwnedOp) -> bool {
        if !matches!(
            op.kind,
            OpKind::Write | OpKind::WriteZeroes | OpKind::Discard
        ) {
            return false;
        }
        // Every such fault counts the write (not only up to the first
        // that is due).
        let mut due = false;
        for f in &mut st.faults {
            if let Fault::PowerCutAt { writes } = f {
                if *writes > 0 {
                    *writes -= 1;
                    due |= *writes == 0;
                }
            }
        }
        if due {
            self.cut(st);
        }
        due
    }

    fn execute(&self, op: &OwnedOp, generation: u64, deadline: Duration) -> i32 {
        let mut st = self.lock();
        st.vnow = st.vnow.max(deadline);
        if st.generation != generation {
            return -libc::ENODEV;
        }
        let eagain = st.faults.iter_mut().find_map(|f| match f {
            Fault::Eagain { ops } if *ops > 0 => Some(ops),
            _ => None,
        });
        if let Some(ops) = eagain {
            *ops -= 1;
            return -libc::EAGAIN;
        }
        // After the EAGAIN: an attempt refused there never reached the
        // media, so it is no write to count (its retry counted twice).
        if self.cut_at(&mut st, op) {
            return -libc::ENODEV;
        }
        if op.flags.contains(IoFlags::PREFLUSH) {
            flush(&mut st, self.block);
        }
        let first = op.offset_bytes / self.block;
        let lbas = first..(op.offset_bytes + op.len_bytes).div_ceil(self.block);
        match op.kind {
            OpKind::Read => {
                let cap = take_partial(&mut st.faults, FaultOn::Read);
                self.read(&st, op, lbas, cap)
            }
            OpKind::Write => {
                let cap = take_partial(&mut st.faults, FaultOn::Write);
                self.write(&mut st, op, lbas, cap)
            }
            OpKind::Flush | OpKind::Fsync => {
                flush(&mut st, self.block);
                0
            }
            OpKind::WriteZeroes | OpKind::Discard => {
                if hits_eio(&st.faults, &lbas, FaultOn::Write) {
                    return -libc::EIO;
                }
                let r = op.offset_bytes as usize..(op.offset_bytes + op.len_bytes) as usize;
                st.volatile[r].fill(0);
                st.dirty.extend(lbas);
                0
            }
            OpKind::Fallocate { .. } | OpKind::Nop => 0,
        }
    }

    fn read(&self, st: &MemState, op: &OwnedOp, lbas: Range<u64>, cap: u64) -> i32 {
        if hits_eio(&st.faults, &lbas, FaultOn::Read) {
            return -libc::EIO;
        }
        let mut len = op.len_bytes.min(cap);
        for f in &st.faults {
            if let Fault::ShortRead { lba } = f {
                if lbas.contains(lba) {
                    len = len.min((lba - lbas.start) * self.block);
                }
            }
        }
        let mut pos = op.offset_bytes as usize;
        let mut left = len as usize;
        for iov in &op.iovecs {
            let n = iov.iov_len.min(left);
            // SAFETY: the iovec points to submitter memory valid and ours
            // until completion (Backend::submit contract); n <= iov_len and
            // pos + n <= capacity (checked at submit).
            unsafe {
                std::ptr::copy_nonoverlapping(st.volatile.as_ptr().add(pos), iov.iov_base.cast(), n)
            };
            pos += n;
            left -= n;
        }
        len as i32
    }

    fn write(&self, st: &mut MemState, op: &OwnedOp, lbas: Range<u64>, cap: u64) -> i32 {
        if hits_eio(&st.faults, &lbas, FaultOn::Write) {
            return -libc::EIO;
        }
        let limit = st.faults.iter().find_map(|f| match f {
            Fault::EnospcAfter { bytes } => Some(*bytes),
            _ => None,
        });
        if limit.is_some_and(|limit| st.written_bytes + op.len_bytes > limit) {
            return -libc::ENOSPC;
        }
        let room = st.faults.iter().find_map(|f| match f {
            Fault::FullAfter { bytes } => Some(bytes.saturating_sub(st.written_bytes)),
            _ => None,
        });
        let cap = match room.map(|r| r - r % self.block) {
            Some(0) => return -libc::ENOSPC,
            Some(room) => cap.min(room),
            None => cap,
        };
        // A partial write moves whole blocks.
        let len = if cap < op.len_bytes {
            cap - cap % self.block
        } else {
            op.len_bytes
        };
        let lbas = lbas.start..lbas.start + len / self.block;
        let mut pos = op.offset_bytes as usize;
        let mut left = len as usize;
        for iov in &op.iovecs {
            let n = iov.iov_len.min(left);
            // SAFETY: as in read; the source memory is only read, n <=
            // iov_len.
            let src = unsafe { std::slice::from_raw_parts(iov.iov_base.cast::<u8>(), n) };
            st.volatile[pos..pos + n].copy_from_slice(src);
            if op.flags.contains(IoFlags::FUA) {
                st.durable[pos..pos + n].copy_from_slice(src);
            }
            pos += n;
            left -= n;
        }
        if op.flags.contains(IoFlags::FUA) {
            for b in lbas {
                st.dirty.remove(&b);
            }
        } else {
            st.dirty.extend(lbas);
        }
        st.written_bytes += len;
        len as i32
    }
}

fn flush(st: &mut MemState, block: u64) {
    let block = block as usize;
    let dirty = std::mem::take(&mut st.dirty);
    for b in dirty {
        let r = b as usize * block..(b as usize + 1) * block;
        let (vol, dur) = (&st.volatile, &mut st.durable);
        dur[r.clone()].copy_from_slice(&vol[r]);
    }
}

/// The most bytes this op moves: a `Partial` fault that applies to `kind`
/// uses up one of its ops and caps it; `u64::MAX` otherwise.
fn take_partial(faults: &mut [Fault], kind: FaultOn) -> u64 {
    let partial = faults.iter_mut().find_map(|f| match f {
        Fault::Partial { bytes, on, ops } if (*on == kind || *on == FaultOn::Both) && *ops > 0 => {
            Some((*bytes, ops))
        }
        _ => None,
    });
    match partial {
        Some((bytes, ops)) => {
            *ops = ops.saturating_sub(u64::from(*ops != u64::MAX));
            bytes
        }
        None => u64::MAX,
    }
}

fn hits_eio(faults: &[Fault], lbas: &Range<u64>, kind: FaultOn) -> bool {
    faults.iter().any(|f| match f {
        Fault::Eio { lbas: bad, on } => {
            (*on == kind || *on == FaultOn::Both) && bad.start < lbas.end && lbas.start < bad.end
        }
        _ => false,
    })
}

impl Backend for MemDevice {
    fn checks_geometry_only(&self) -> bool {
        true
    }

    fn write_zeroes_support(&self) -> Option<bool> {
        Some(true)
    }

    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Mem
    }

    unsafe fn submit(&self, op: &IoOp<'_>, handler: HandlerId, token: u64) -> Result<()> {
        check_op(&self.geometry, op)?;
        // As every backend: nothing through a core built before a fork.
        crate::fork::check()?;
        let (deadline, generation) = {
            let mut st = self.inner.lock();
            (self.deadline(&mut st), st.generation)
        };
        let owned = OwnedOp::from_op(op);
        let inner = self.inner.clone();
        with_core(|core| {
            core.schedule(
                self.inner.epoch + deadline,
                handler,
                token,
                Box::new(move || inner.execute(&owned, generation, deadline)),
            )
        });
        Ok(())
    }
}
