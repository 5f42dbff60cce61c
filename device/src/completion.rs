//! What a completion is, below the ring and the core: the handler trait
//! and its id, one completion, and the list of completions a reap
//! collected ([`Reaped`]). The ring fills a [`Reaped`] and hands it to
//! whatever delivers batches ([`DeliverBatch`], the core), so the ring
//! does not depend on the core.
//!
//! Invariant: a [`Reaped`]'s runs cover its pairs exactly (the lengths sum
//! to the number of pairs; debug builds check at delivery), and
//! consecutive runs name different handlers.

/// Where a [`Reaped`] list is delivered: the core's handler table.
pub(crate) trait DeliverBatch {
    /// Hands `completions` to `id`'s handler in one call.
    fn deliver_batch(&self, id: HandlerId, completions: &[(u64, i32)]);
}

/// Receives completions on the core where it was registered.
///
/// `result` is the byte count transferred (`>= 0`; 0 on a read means end of
/// file) or a negative errno, exactly like a CQE's `res`. Map it with
/// [`Error::from_errno`](crate::Error::from_errno). Transient errnos
/// (`EAGAIN`, `EINTR`, `EBUSY`) never reach a handler.
pub trait CompletionHandler {
    /// Called once per submitted op, on the core's thread, inside `park`.
    /// The handler may submit new ops; they are queued for the next enter.
    fn complete(&self, token: u64, result: i32);

    /// Called with several completions at once: each `(token, result)`
    /// pair is one submitted op's completion, exactly as
    /// [`complete`](Self::complete) would receive it, in CQE order. The
    /// ring calls this once per reap for each run of consecutive CQEs of
    /// this handler (usually one call per park), so a handler can take its
    /// per-core state once per batch. The slice is only valid for the call.
    /// The default calls `complete` for each pair.
    fn complete_batch(&self, completions: &[(u64, i32)]) {
        for &(token, result) in completions {
            self.complete(token, result);
        }
    }
}

/// Names a [`CompletionHandler`] registered on one core. Only meaningful on
/// the thread that registered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandlerId(pub(crate) u32);

/// One completion waiting to be delivered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completion {
    pub handler: HandlerId,
    pub token: u64,
    pub result: i32,
}

/// Completions reaped from a ring and not yet delivered: the
/// `(token, result)` pairs in order, and the handler of each run of
/// consecutive pairs (run-length encoded: one entry per handler change),
/// so a run is a slice [`complete_batch`] takes as it is.
///
/// [`complete_batch`]: CompletionHandler::complete_batch
#[derive(Default)]
pub(crate) struct Reaped {
    done: Vec<(u64, i32)>,
    /// `(handler, length)` of each run of `done`, in order.
    runs: Vec<(HandlerId, usize)>,
}

impl Reaped {
    #[inline]
    pub fn push(&mut self, c: Completion) {
        match self.runs.last_mut() {
            Some((h, n)) if *h == c.handler => *n += 1,
            _ => self.runs.push((c.handler, 1)),
        }
        self.done.push((c.token, c.result));
    }

    pub fn len(&self) -> usize {
        self.done.len()
    }

    pub fn is_empty(&self) -> bool {
        self.done.is_empty()
    }

    pub fn clear(&mut self) {
        self.done.clear();
        self.runs.clear();
    }

    pub fn capacity(&self) -> usize {
        self.done.capacity()
    }

    /// Calls each handler once per run of its consecutive completions.
    #[inline]
    pub fn deliver<D: DeliverBatch>(&self, core: &D) {
        debug_assert_eq!(
            self.runs.iter().map(|&(_, n)| n).sum::<usize>(),
            self.done.len()
        );
        let mut start = 0;
        for &(handler, n) in &self.runs {
            core.deliver_batch(handler, &self.done[start..start + n]);
            start += n;
        }
    }
}
