//! Ordering between the requests of one device on one core: which requests
//! are barriers, and how many waiting requests may be dispatched now.
//!
//! Invariants:
//! - Overlapping IOs keep program order: a request that overlaps an
//!   earlier request of its device from this core (waiting or in flight),
//!   where one of the two writes, is a barrier and waits for everything
//!   before it.
//! - A flush (or fsync) is a barrier that waits only for the writes in
//!   flight before it (it covers them; reads do not hold it back).
//! - Reads with no write waiting or in flight take the fast path: no scan.
//! - A barrier is dispatched only from the front of the FIFO, and only
//!   when what it waits for is done.

use plugio_device::OpKind;

use crate::queue::CoreDev;

/// How a new request must be ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Barrier {
    /// It must wait for earlier requests.
    pub barrier: bool,
    /// It waits only for the writes in flight (a flush).
    pub writes_only: bool,
}

impl CoreDev {
    /// Whether a new request `op` on `[offset_bytes, offset_bytes +
    /// len_bytes)` must wait for the earlier requests of the device (slot
    /// `except`, the request itself, is skipped).
    pub(crate) fn barrier_for(
        &self,
        op: OpKind,
        offset_bytes: u64,
        len_bytes: u64,
        except: Option<u32>,
    ) -> Barrier {
        let writes_before = self.writes_in_flight > 0 || self.writes_waiting > 0;
        if matches!(op, OpKind::Flush | OpKind::Fsync) {
            return Barrier {
                barrier: writes_before,
                writes_only: true,
            };
        }
        let mut barrier = false;
        if op.is_write() || writes_before {
            barrier = self.rqs.iter().enumerate().any(|(i, rq)| {
                Some(i as u32) != except && rq.conflicts_with(op, offset_bytes, len_bytes)
            });
        }
        Barrier {
            barrier,
            writes_only: false,
        }
    }

    /// How many requests at the front of the FIFO may be dispatched now:
    /// up to the first barrier, which itself may go only from the front
    /// and when what it waits for is done (every request of this device
    /// from this core, or only the writes for a flush).
    pub(crate) fn dispatchable(&self) -> usize {
        if self.barriers_waiting == 0 {
            return self.waiting.len();
        }
        let mut n = 0;
        for &i in &self.waiting {
            let rq = self.rqs.get(i);
            if rq.barrier {
                let busy = if rq.writes_only {
                    self.writes_in_flight > 0
                } else {
                    self.tags_held > 0
                };
                if n > 0 || busy {
                    break;
                }
            }
            n += 1;
        }
        n
    }
}
