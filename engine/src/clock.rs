//! The cached clock: one clock read per batch instead of one per IO.
//!
//! Idea: "block: cache current nsec time in struct blk_plug" and "update
//! cached timestamp post schedule/preemption" (the 2024 "cache issue side
//! time querying" series, Jens Axboe, 2024): the first user of the time in a
//! batch reads the clock and every later user of the same batch reuses it.
//!
//! Invariants:
//! - The cache is per thread (per core) and holds 0 when invalid.
//! - It is invalidated at the end of every tick, before the core parks, so
//!   time spent parked is never hidden: the completions reaped by the park
//!   read the clock once (one read per completion batch, as
//!   `blk_mq_end_request_batch` does) and the next tick's dispatches reuse
//!   that reading.
//! - Times are monotonic nanoseconds since a process-wide epoch.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    static CACHED_NS: Cell<u64> = const { Cell::new(0) };
    static READS: Cell<u64> = const { Cell::new(0) };
}

/// `CLOCK_MONOTONIC` at the first read, in ns (0: not read yet). An atomic
/// set once by compare-and-swap, not a `OnceLock`: a forked child never
/// waits for an initialiser that was running in a thread of the parent.
static EPOCH_NS: AtomicU64 = AtomicU64::new(0);

/// `CLOCK_MONOTONIC` in ns (the clock `std::time::Instant` reads).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call; the clock
    // id is one every Linux has, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Reads the monotonic clock (ns since the process-wide epoch, never 0).
fn read_ns() -> u64 {
    READS.with(|r| r.set(r.get() + 1));
    let now = monotonic_ns();
    // Relaxed: the epoch is the only value shared; every thread agrees on
    // it once one swap has won.
    let epoch = match EPOCH_NS.load(Ordering::Relaxed) {
        0 => EPOCH_NS
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            .map_or_else(|won| won, |_| now),
        epoch => epoch,
    };
    // Saturating: another thread's epoch may be a little after `now`.
    now.saturating_sub(epoch) + 1
}

/// The current time in ns: the cached value of this batch when `cached`
/// and one exists, else a fresh clock read (which is then cached).
pub(crate) fn now_ns(cached: bool) -> u64 {
    if !cached {
        return read_ns();
    }
    CACHED_NS.with(|c| match c.get() {
        0 => {
            let now = read_ns();
            c.set(now);
            now
        }
        now => now,
    })
}

/// Ends the batch: the next [`now_ns`] reads the clock.
pub(crate) fn invalidate() {
    CACHED_NS.with(|c| c.set(0));
}

/// How many times the calling thread (core) has read the clock for the
/// engine: with the cached clock, about one read per plug flush and one per
/// completion batch; without it, one per use.
pub fn reads() -> u64 {
    READS.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_reads_once_per_batch() {
        invalidate();
        let before = reads();
        let a = now_ns(true);
        let b = now_ns(true);
        assert_eq!(a, b);
        assert_eq!(reads() - before, 1);
        invalidate();
        let c = now_ns(true);
        assert!(c >= a);
        assert_eq!(reads() - before, 2);
        now_ns(false);
        now_ns(false);
        assert_eq!(reads() - before, 4);
    }
}
