//! iostats: per-device counters in the shape of `/proc/diskstats`, plus the
//! plug's own figures.
//!
//! Invariants:
//! - Each core writes only its own `CoreCounters` (one per device it
//!   uses), with plain load + store: there is a single writer, so no
//!   read-modify-write is needed; readers on other threads sum the cores
//!   and may see a value a moment old, never a torn one.
//! - `in_flight`, `io_ticks` and `time_in_queue` are kept as the kernel's
//!   `part_stat` does (`update_io_ticks`, `part_in_flight`): at every start
//!   and end of a request, the time since the last event is added to
//!   `io_ticks` if anything was in flight, and times the number in flight
//!   to `time_in_queue`. They are per core, so with several cores using one
//!   device, `io_ticks` is the sum of the cores' busy times.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::tag::TagStats;

/// A counter written by one thread and read by any.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds `n` (single writer: the owning core).
    #[inline]
    pub fn add(&self, n: u64) {
        // Relaxed: a statistic; only the owning core writes it, so the load
        // sees its own last store; readers pair with nothing.
        self.0
            .store(self.0.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    /// Sets the value (gauges).
    #[inline]
    pub fn set(&self, v: u64) {
        // Relaxed: see `add`.
        self.0.store(v, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        // Relaxed: a statistic read; no other memory depends on it.
        self.0.load(Ordering::Relaxed)
    }
}

/// Counters of one op group (reads, writes, discards, flushes).
#[derive(Debug, Default)]
pub(crate) struct OpCounters {
    pub ios: Counter,
    pub merges: Counter,
    pub sectors: Counter,
    pub ticks_ns: Counter,
}

/// One core's counters for one device.
#[derive(Debug, Default)]
pub(crate) struct CoreCounters {
    pub read: OpCounters,
    pub write: OpCounters,
    pub discard: OpCounters,
    pub flush: OpCounters,
    pub in_flight: Counter,
    pub io_ticks_ns: Counter,
    pub time_in_queue_ns: Counter,
    pub plug_flushes: Counter,
    pub bios: Counter,
    pub requests: Counter,
    pub bio_cache_hits: Counter,
    pub bio_cache_misses: Counter,
    pub fixed_buf_requests: Counter,
    pub requeues: Counter,
    pub bounce_ios: Counter,
    pub bounce_bytes: Counter,
    pub fua_writes: Counter,
}

impl OpCounters {
    fn absorb(&self, gone: &OpCounters) {
        let OpCounters {
            ios,
            merges,
            sectors,
            ticks_ns,
        } = gone;
        self.ios.add(ios.get());
        self.merges.add(merges.get());
        self.sectors.add(sectors.get());
        self.ticks_ns.add(ticks_ns.get());
    }
}

impl CoreCounters {
    /// Adds the counts of `gone`, a core that will write no more, to
    /// these (the retired sums, written under their list's lock only:
    /// one writer at a time, as [`Counter::add`] needs). Its `in_flight`
    /// gauge is not taken: a gone core has nothing in flight.
    pub fn absorb(&self, gone: &CoreCounters) {
        // Every field named, so that a new counter cannot be left out
        // unnoticed (a compile error here instead).
        let CoreCounters {
            read,
            write,
            discard,
            flush,
            in_flight: _,
            io_ticks_ns,
            time_in_queue_ns,
            plug_flushes,
            bios,
            requests,
            bio_cache_hits,
            bio_cache_misses,
            fixed_buf_requests,
            requeues,
            bounce_ios,
            bounce_bytes,
            fua_writes,
        } = gone;
        self.read.absorb(read);
        self.write.absorb(write);
        self.discard.absorb(discard);
        self.flush.absorb(flush);
        let sums = [
            (&self.io_ticks_ns, io_ticks_ns),
            (&self.time_in_queue_ns, time_in_queue_ns),
            (&self.plug_flushes, plug_flushes),
            (&self.bios, bios),
            (&self.requests, requests),
            (&self.bio_cache_hits, bio_cache_hits),
            (&self.bio_cache_misses, bio_cache_misses),
            (&self.fixed_buf_requests, fixed_buf_requests),
            (&self.requeues, requeues),
            (&self.bounce_ios, bounce_ios),
            (&self.bounce_bytes, bounce_bytes),
            (&self.fua_writes, fua_writes),
        ];
        for (sum, part) in sums {
            sum.add(part.get());
        }
    }
}

/// The core-local side of `in_flight` / `io_ticks` / `time_in_queue`.
#[derive(Debug, Default)]
pub(crate) struct BusyClock {
    in_flight: u64,
    stamp_ns: u64,
}

impl BusyClock {
    /// Accounts the time since the last event, then changes the number in
    /// flight by `delta` (+1 at dispatch, -1 at completion).
    pub fn event(&mut self, now_ns: u64, delta: i64, c: &CoreCounters) {
        let since = now_ns.saturating_sub(self.stamp_ns);
        if self.in_flight > 0 {
            c.io_ticks_ns.add(since);
            c.time_in_queue_ns.add(since * self.in_flight);
        }
        self.stamp_ns = self.stamp_ns.max(now_ns);
        self.in_flight = self.in_flight.saturating_add_signed(delta);
        c.in_flight.set(self.in_flight);
    }
}

/// Totals of one op group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OpStats {
    /// Requests completed (after merging), as diskstats counts them. The
    /// remainder of a short read or write, which plugio sends again as a
    /// request of its own (see `requeues`), counts again here: one 8 KiB
    /// read of a 6 KiB file is 2 ios.
    pub ios: u64,
    /// Bios merged into another bio's request.
    pub merges: u64,
    /// 512-byte sectors asked for by the completed requests (a partial
    /// sector counts as one), not the sectors moved: a request that came
    /// back short counts what it asked for, and its resent remainder
    /// counts again (the kernel's diskstats counts the bytes completed).
    pub sectors: u64,
    /// Total time of the completed requests, dispatch to completion, ns.
    pub ticks_ns: u64,
}

impl OpStats {
    /// `ticks_ns` in milliseconds, the unit of `/proc/diskstats`.
    ///
    /// ```
    /// let s = plugio::engine::OpStats { ticks_ns: 2_500_000, ..Default::default() };
    /// assert_eq!(s.ticks_ms(), 2);
    /// ```
    pub fn ticks_ms(&self) -> u64 {
        self.ticks_ns / 1_000_000
    }

    /// The counts between the snapshot `earlier` and this one (`self -
    /// earlier`, field by field, 0 if `earlier` is in fact later).
    ///
    /// ```
    /// use plugio::engine::OpStats;
    ///
    /// let before = OpStats { ios: 10, sectors: 80, ..OpStats::default() };
    /// let now = OpStats { ios: 14, sectors: 112, ..OpStats::default() };
    /// assert_eq!(now.delta(&before), OpStats { ios: 4, sectors: 32, ..OpStats::default() });
    /// ```
    pub fn delta(&self, earlier: &OpStats) -> OpStats {
        OpStats {
            ios: self.ios.saturating_sub(earlier.ios),
            merges: self.merges.saturating_sub(earlier.merges),
            sectors: self.sectors.saturating_sub(earlier.sectors),
            ticks_ns: self.ticks_ns.saturating_sub(earlier.ticks_ns),
        }
    }

    fn sum(&mut self, c: &OpCounters) {
        self.ios += c.ios.get();
        self.merges += c.merges.get();
        self.sectors += c.sectors.get();
        self.ticks_ns += c.ticks_ns.get();
    }
}

/// A snapshot of a device's iostats, summed over the cores that used it
/// (see [`Device::iostats`](crate::Device::iostats)).
///
/// The first group of fields has the shape of `/proc/diskstats`; the rest
/// are the plug's figures. All zero (except the tag figures) when the
/// device was opened with `iostats: false`.
///
/// Counters only grow; sample the figures of an interval with
/// [`IoStats::delta`]. With the crate feature `serde` it is
/// `serde::Serialize` (field names as here, nested `read`/`write`/...
/// and `tags` objects).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct IoStats {
    /// Reads.
    pub read: OpStats,
    /// Writes and write-zeroes.
    pub write: OpStats,
    /// Discards (and other fallocate range ops).
    pub discard: OpStats,
    /// Flushes (fdatasync, fsync, and the preflush of each `PREFLUSH`
    /// write, timed with its write as the two are linked); `merges` and
    /// `sectors` stay 0.
    pub flush: OpStats,
    /// Requests in flight now.
    pub in_flight: u64,
    /// Time with at least one request in flight, ns (summed over cores).
    pub io_ticks_ns: u64,
    /// Time requests spent in flight, weighted by their number, ns.
    pub time_in_queue_ns: u64,
    /// Plug flushes that sent requests to this device.
    pub plug_flushes: u64,
    /// Bios issued.
    pub bios: u64,
    /// Requests built from them (after merging and splitting).
    pub requests: u64,
    /// Bios served from the per-core bio cache.
    pub bio_cache_hits: u64,
    /// Bios that had to be allocated.
    pub bio_cache_misses: u64,
    /// Requests dispatched on a registered buffer (`READ_FIXED` /
    /// `WRITE_FIXED` on an io_uring backend): every bio of the request in
    /// the core's registered arena, as [`Device::alloc_buf`](crate::Device::alloc_buf)
    /// hands out. A request of several segments (merged bios whose buffers
    /// are apart) counts only where the ring has `READV_FIXED` /
    /// `WRITEV_FIXED` (Linux 6.15); an NVMe passthrough command counts when
    /// it goes with `IORING_URING_CMD_FIXED`. Counted where the SQE is
    /// built, so a backend that does not use registered buffers (the mem
    /// device, the sync pool) or refuses the submit counts none. A request
    /// dispatched again (a requeue) counts again. Where the kernel refuses
    /// the fixed form of passthrough commands (they are then sent plain,
    /// and the command ring stops using the form), the refused commands
    /// still count: those in flight when a command ring's first refusal
    /// came back, so at most the queue depth, once per command ring (a
    /// core has two, polled and interrupt-driven).
    pub fixed_buf_requests: u64,
    /// Requests issued again after a short or failed completion: the
    /// uncovered rest of a short transfer, or each bio of a merged request
    /// whose completion was short or failed, alone (so merging never
    /// changes an IO's result).
    pub requeues: u64,
    /// IOs whose caller's buffer did not meet the device's direct-IO
    /// alignment and went through an aligned bounce buffer and a copy (see
    /// [`Device::read_at`](crate::Device::read_at) and
    /// [`DeviceOptions::bounce_unaligned`](crate::DeviceOptions::bounce_unaligned)).
    pub bounce_ios: u64,
    /// Bytes those IOs covered (copied in before a write, out after a
    /// read: at most this many).
    pub bounce_bytes: u64,
    /// Write requests completed with [`IoFlags::FUA`](crate::IoFlags::FUA)
    /// (force unit access): each was durable when it completed, with no
    /// flush of its own (a `PREFLUSH|FUA` write also counts its preflush
    /// in `flush`). Also counted in `write`; a FUA write split at the
    /// request limit counts once per part. diskstats has no such field
    /// (the kernel counts FUA writes as writes only): a commit made
    /// durable by FUA shows here, where `flush.ios` stays 0.
    pub fua_writes: u64,
    /// Tag allocation figures (batch sizes, partial batches, waits).
    pub tags: TagStats,
}

impl IoStats {
    /// Sums one core's counters into the snapshot.
    pub(crate) fn add_core(&mut self, c: &CoreCounters) {
        self.read.sum(&c.read);
        self.write.sum(&c.write);
        self.discard.sum(&c.discard);
        self.flush.sum(&c.flush);
        self.in_flight += c.in_flight.get();
        self.io_ticks_ns += c.io_ticks_ns.get();
        self.time_in_queue_ns += c.time_in_queue_ns.get();
        self.plug_flushes += c.plug_flushes.get();
        self.bios += c.bios.get();
        self.requests += c.requests.get();
        self.bio_cache_hits += c.bio_cache_hits.get();
        self.bio_cache_misses += c.bio_cache_misses.get();
        self.fixed_buf_requests += c.fixed_buf_requests.get();
        self.requeues += c.requeues.get();
        self.bounce_ios += c.bounce_ios.get();
        self.bounce_bytes += c.bounce_bytes.get();
        self.fua_writes += c.fua_writes.get();
    }

    /// The figures of the interval between the snapshot `earlier` and this
    /// one (iostat's "per interval" view): every counter is `self -
    /// earlier` (saturating at 0, so a swapped pair gives zeros, not a
    /// wrap); the gauge `in_flight` is this snapshot's. Both snapshots
    /// must be of one device.
    ///
    /// ```
    /// use plugio::engine::{IoStats, OpStats};
    ///
    /// let earlier = IoStats { read: OpStats { ios: 100, ..Default::default() }, bios: 100, ..Default::default() };
    /// let now = IoStats { read: OpStats { ios: 160, ..Default::default() }, bios: 170, in_flight: 3, ..Default::default() };
    /// let d = now.delta(&earlier);
    /// assert_eq!((d.read.ios, d.bios, d.in_flight), (60, 70, 3));
    /// ```
    ///
    /// A sampler on a live device: take a snapshot, run, take another.
    ///
    /// ```no_run
    /// # async fn f(dev: &plugio::Device) {
    /// let before = dev.iostats();
    /// // ... IO ...
    /// let interval = dev.iostats().delta(&before);
    /// println!("{} reads, {} merged", interval.read.ios, interval.read.merges);
    /// # }
    /// ```
    pub fn delta(&self, earlier: &IoStats) -> IoStats {
        let d = |now: u64, then: u64| now.saturating_sub(then);
        IoStats {
            read: self.read.delta(&earlier.read),
            write: self.write.delta(&earlier.write),
            discard: self.discard.delta(&earlier.discard),
            flush: self.flush.delta(&earlier.flush),
            in_flight: self.in_flight,
            io_ticks_ns: d(self.io_ticks_ns, earlier.io_ticks_ns),
            time_in_queue_ns: d(self.time_in_queue_ns, earlier.time_in_queue_ns),
            plug_flushes: d(self.plug_flushes, earlier.plug_flushes),
            bios: d(self.bios, earlier.bios),
            requests: d(self.requests, earlier.requests),
            bio_cache_hits: d(self.bio_cache_hits, earlier.bio_cache_hits),
            bio_cache_misses: d(self.bio_cache_misses, earlier.bio_cache_misses),
            fixed_buf_requests: d(self.fixed_buf_requests, earlier.fixed_buf_requests),
            requeues: d(self.requeues, earlier.requeues),
            bounce_ios: d(self.bounce_ios, earlier.bounce_ios),
            bounce_bytes: d(self.bounce_bytes, earlier.bounce_bytes),
            fua_writes: d(self.fua_writes, earlier.fua_writes),
            tags: self.tags.delta(&earlier.tags),
        }
    }

    /// Requests per plug flush (0 when nothing was flushed).
    pub fn requests_per_flush(&self) -> f64 {
        ratio(self.requests, self.plug_flushes)
    }

    /// Bios per request: 1.0 without merging, more with it; less than 1.0
    /// when bios are split at the request limit (each piece is a request)
    /// or short ones are resent.
    pub fn bios_per_request(&self) -> f64 {
        ratio(self.bios, self.requests)
    }

    /// The counters as one `/proc/diskstats` line (fields 1-17 after the
    /// major, minor and name columns), with `name` as the device name and
    /// 0 for major and minor.
    pub fn diskstats_line(&self, name: &str) -> String {
        let (r, w, d, f) = (&self.read, &self.write, &self.discard, &self.flush);
        format!(
            "   0       0 {name} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}",
            r.ios,
            r.merges,
            r.sectors,
            r.ticks_ms(),
            w.ios,
            w.merges,
            w.sectors,
            w.ticks_ms(),
            self.in_flight,
            self.io_ticks_ns / 1_000_000,
            self.time_in_queue_ns / 1_000_000,
            d.ios,
            d.merges,
            d.sectors,
            d.ticks_ms(),
            f.ios,
            f.ticks_ms(),
        )
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_clock_accounts_like_part_stat() {
        let c = CoreCounters::default();
        let mut b = BusyClock::default();
        b.event(100, 1, &c); // start A at 100
        b.event(150, 1, &c); // start B at 150: 50 ns busy with 1
        b.event(250, -1, &c); // A ends: 100 ns busy with 2
        b.event(300, -1, &c); // B ends: 50 ns with 1
        assert_eq!(c.io_ticks_ns.get(), 200);
        assert_eq!(c.time_in_queue_ns.get(), 50 + 200 + 50);
        assert_eq!(c.in_flight.get(), 0);
    }
}
