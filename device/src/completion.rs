//! What a completion is, below the ring and the core: the handler trait
//! and its id, one completion, and the list of completions a reap
//! collected ([`Reaped`]). The ring fills a [`Reaped`] and hands it to
//! whatever delivers batches ([`DeliverBatch`], the core), so the ring
//! does not depend on the core.
//!
//! Invariant: a [`Reaped`]'s runs cover its pairs exactly (the first
//! starts at the first pair, each at a later pair than the one before,
//! the last ends at the end; debug builds check at delivery), and
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
/// consecutive pairs (one entry per handler change, with the index of
/// its first pair), so a run is a slice [`complete_batch`] takes as it
/// is.
///
/// [`complete_batch`]: CompletionHandler::complete_batch
pub(crate) struct Reaped {
    done: Vec<(u64, i32)>,
    /// `(handler, start)` of each run of `done`, in order: the run goes
    /// from `start` to the next run's start (the last one, to the end).
    runs: Vec<(HandlerId, usize)>,
    /// The last run's handler, or [`NO_RUN`] when there is no run: a push
    /// of the same handler compares one word and counts nothing.
    last: u64,
}

/// [`Reaped::last`] with no run (above every `u32` handler id).
const NO_RUN: u64 = u64::MAX;

impl Default for Reaped {
    fn default() -> Self {
        Self {
            done: Vec::new(),
            runs: Vec::new(),
            last: NO_RUN,
        }
    }
}

impl Reaped {
    #[inline]
    pub fn push(&mut self, c: Completion) {
        if u64::from(c.handler.0) != self.last {
            self.start_run(c.handler);
        }
        self.done.push((c.token, c.result));
    }

    /// A run of `handler` begins at the next pair.
    #[inline(never)]
    fn start_run(&mut self, handler: HandlerId) {
        self.runs.push((handler, self.done.len()));
        self.last = u64::from(handler.0);
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
        self.last = NO_RUN;
    }

    pub fn capacity(&self) -> usize {
        self.done.capacity()
    }

    /// Calls each handler once per run of its consecutive completions.
    #[inline]
    pub fn deliver<D: DeliverBatch>(&self, core: &D) {
        debug_assert!(self.runs.first().is_none_or(|&(_, start)| start == 0));
        debug_assert!(self.runs.windows(2).all(|w| w[0].1 < w[1].1));
        for (i, &(handler, start)) in self.runs.iter().enumerate() {
            let end = self.runs.get(i + 1).map_or(self.done.len(), |r| r.1);
            core.deliver_batch(handler, &self.done[start..end]);
        }
    }
}
