//! Per-core tick statistics.
//!
//! Invariant: the core counts in a plain `Cell` and publishes a copy to
//! relaxed atomics once per tick; readers on other threads see a recent,
//! per-field consistent (not cross-field atomic) snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of one core since it started. All counts are totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickStats {
    /// Ticks run (one tick: drain remote wakes, fire timers, poll the ready
    /// batch, call the tick-end hooks, park or poll the driver).
    pub ticks: u64,
    /// Task polls (including polls that only cancelled an aborted task).
    pub tasks_polled: u64,
    /// Task polls in the most recent tick.
    pub last_tick_tasks_polled: u64,
    /// Most task polls in any one tick.
    pub max_tick_tasks_polled: u64,
    /// Blocking parks (calls to `Driver::park` with a non-zero timeout).
    pub parks: u64,
    /// Tasks that arrived through the remote wake queue (woken or spawned
    /// from another thread). A queue entry that only hands the core the
    /// drop of a waker cloned on it is not counted.
    pub remote_wakes: u64,
    /// Timers fired.
    pub timers_fired: u64,
    /// Ticks after which a tick-end hook reported pending work.
    pub hook_pending_ticks: u64,
}

impl TickStats {
    /// Mean task polls per tick (0 when no tick ran).
    pub fn tasks_polled_per_tick(&self) -> f64 {
        if self.ticks == 0 {
            0.0
        } else {
            self.tasks_polled as f64 / self.ticks as f64
        }
    }
}

/// The published copy of a core's [`TickStats`].
#[derive(Default)]
pub(crate) struct AtomicTickStats {
    fields: [AtomicU64; 8],
}

impl AtomicTickStats {
    pub(crate) fn store(&self, s: &TickStats) {
        let values = [
            s.ticks,
            s.tasks_polled,
            s.last_tick_tasks_polled,
            s.max_tick_tasks_polled,
            s.parks,
            s.remote_wakes,
            s.timers_fired,
            s.hook_pending_ticks,
        ];
        for (field, v) in self.fields.iter().zip(values) {
            // Relaxed: statistics only, no other data hangs on them.
            field.store(v, Relaxed);
        }
    }

    pub(crate) fn load(&self) -> TickStats {
        // Relaxed: statistics only.
        let f = |i: usize| self.fields[i].load(Relaxed);
        TickStats {
            ticks: f(0),
            tasks_polled: f(1),
            last_tick_tasks_polled: f(2),
            max_tick_tasks_polled: f(3),
            parks: f(4),
            remote_wakes: f(5),
            timers_fired: f(6),
            hook_pending_ticks: f(7),
        }
    }
}
