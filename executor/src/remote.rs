//! The remote wake path: a lock-free intrusive multi-producer queue of
//! nodes pushed by other threads, and the park gate that decides whether a
//! push must unpark the core.
//!
//! # Mechanism
//!
//! The queue is the kernel's `llist` (`llist_add` / `llist_del_all`, as used
//! by the scheduler's remote wake lists in `ttwu_queue` and by `irq_work`):
//! producers push onto a singly linked stack with one compare-and-swap on the
//! head; the consumer takes the whole list at once with one swap and reverses
//! it, so items come out in push (FIFO) order. There is no single-node pop,
//! so there is no ABA problem, and several consumers may take concurrently
//! (each gets a disjoint list). The link lives in the node (intrusive): a
//! push allocates nothing.
//!
//! # Invariants
//!
//! - A node is in at most one queue at a time; the caller guarantees it (for
//!   tasks, the `NOTIFIED` bit gates every enqueue).
//! - A node pushed stays valid until the consumer takes it out.
//! - Park handshake (a Dekker pair, both sides separated by a `SeqCst`
//!   fence): the core stores `parked = true`, fences, then looks at the queue
//!   head; a producer publishes its node, fences, then loads `parked`. At
//!   least one side sees the other, so either the core does not block or the
//!   producer unparks it. A producer only needs to do this when its push made
//!   the queue go from empty to non-empty: a non-empty queue already has a
//!   producer that did (or a core that will see it).

use crate::sync::{fence, AtomicBool, AtomicPtr};
use std::ptr::{self, NonNull};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

/// A node type that carries its own queue link.
///
/// # Safety
/// `link` must always return the same field of the node, used for nothing
/// else than this queue.
pub(crate) unsafe trait Linked: Sized {
    /// The node's link to the next node of the queue.
    fn link(&self) -> &AtomicPtr<Self>;
}

/// A lock-free multi-producer queue of intrusive nodes (`llist`).
pub(crate) struct RemoteQueue<T: Linked> {
    head: AtomicPtr<T>,
}

// SAFETY: the queue only moves node pointers between threads; what a node
// may be touched by is the node type's business (its `Linked` contract).
unsafe impl<T: Linked> Send for RemoteQueue<T> {}
// SAFETY: as above; every access to `head` is atomic.
unsafe impl<T: Linked> Sync for RemoteQueue<T> {}

impl<T: Linked> RemoteQueue<T> {
    /// Creates an empty queue.
    pub(crate) fn new() -> Self {
        Self {
            head: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// Pushes `node`; returns `true` when the queue was empty before, that
    /// is, when the caller must run the unpark handshake
    /// ([`ParkGate::needs_unpark`]).
    ///
    /// # Safety
    /// `node` must be valid until a consumer takes it out, and must not be in
    /// any queue now.
    pub(crate) unsafe fn push(&self, node: NonNull<T>) -> bool {
        let mut head = self.head.load(Relaxed);
        loop {
            // SAFETY: the caller guarantees `node` is valid and ours alone.
            let link = unsafe { node.as_ref() }.link();
            // Relaxed: published by the Release CAS below.
            link.store(head, Relaxed);
            // Release: pairs with the Acquire swap in `take_all`, so the
            // consumer sees the link and everything written to the node.
            match self
                .head
                .compare_exchange(head, node.as_ptr(), Release, Relaxed)
            {
                Ok(_) => return head.is_null(),
                Err(now) => head = now,
            }
        }
    }

    /// Whether the queue looks empty. Used by the core after
    /// [`ParkGate::prepare_park`]'s fence; Relaxed is enough there because
    /// the fence orders it (see the module invariants).
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Relaxed).is_null()
    }

    /// Takes every queued node, oldest first.
    pub(crate) fn take_all(&self) -> Drain<T> {
        // Relaxed: a look first, so that taking from an empty queue (every
        // tick of a core with no remote wakes) costs no RMW. A node pushed
        // after it is taken by the next call: the core's callers re-check
        // after a `SeqCst` fence before blocking or giving up (`park`,
        // `close`), and a pusher that sees the core closed takes its own.
        if self.head.load(Relaxed).is_null() {
            return Drain {
                next: ptr::null_mut(),
            };
        }
        // Acquire: pairs with the Release CAS in `push`.
        let mut cur = self.head.swap(ptr::null_mut(), Acquire);
        let mut prev: *mut T = ptr::null_mut();
        while let Some(node) = NonNull::new(cur) {
            // SAFETY: nodes stay valid until taken out; this swap made us
            // their only consumer.
            let link = unsafe { node.as_ref() }.link();
            // Relaxed: the swap above already synchronized with the push.
            cur = link.load(Relaxed);
            link.store(prev, Relaxed);
            prev = node.as_ptr();
        }
        Drain { next: prev }
    }
}

/// The nodes taken by [`RemoteQueue::take_all`], in push order.
pub(crate) struct Drain<T: Linked> {
    next: *mut T,
}

impl<T: Linked> Iterator for Drain<T> {
    type Item = NonNull<T>;

    fn next(&mut self) -> Option<NonNull<T>> {
        let node = NonNull::new(self.next)?;
        // SAFETY: the node is still ours; read its link before handing it
        // out, since the caller may free or re-queue it.
        self.next = unsafe { node.as_ref() }.link().load(Relaxed);
        Some(node)
    }
}

/// The core's "I am about to block" flag (see the module invariants).
pub(crate) struct ParkGate {
    parked: AtomicBool,
}

impl ParkGate {
    /// A gate of a running (not parked) core.
    pub(crate) fn new() -> Self {
        Self {
            parked: AtomicBool::new(false),
        }
    }

    /// Core side, before it blocks: announce it, then (after the fence) the
    /// caller re-checks every wake source and blocks only if all are empty.
    pub(crate) fn prepare_park(&self) {
        self.parked.store(true, Relaxed);
        // SeqCst fence: pairs with the fence in `needs_unpark` (Dekker).
        fence(SeqCst);
    }

    /// Core side, after it woke up.
    pub(crate) fn finish_park(&self) {
        // Relaxed: a producer that still sees `true` only unparks once more,
        // which costs one spurious wakeup and is never wrong.
        self.parked.store(false, Relaxed);
    }

    /// Producer side, after it published its wake: whether the core may be
    /// blocked and must be unparked.
    pub(crate) fn needs_unpark(&self) -> bool {
        // SeqCst fence: pairs with the fence in `prepare_park` (Dekker).
        fence(SeqCst);
        self.parked.load(Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct Node {
        value: usize,
        link: AtomicPtr<Node>,
    }

    // SAFETY: `link` is only this queue's link.
    unsafe impl Linked for Node {
        fn link(&self) -> &AtomicPtr<Node> {
            &self.link
        }
    }

    fn node(value: usize) -> NonNull<Node> {
        let boxed = Box::new(Node {
            value,
            link: AtomicPtr::new(ptr::null_mut()),
        });
        NonNull::from(Box::leak(boxed))
    }

    fn drain_values(q: &RemoteQueue<Node>) -> Vec<usize> {
        q.take_all()
            // SAFETY: taken nodes are ours; each was leaked from a Box.
            .map(|n| unsafe { Box::from_raw(n.as_ptr()) }.value)
            .collect()
    }

    #[test]
    fn fifo_and_empty_transitions() {
        let q = RemoteQueue::new();
        assert!(q.is_empty());
        // SAFETY: fresh nodes, valid until drained below.
        unsafe {
            assert!(q.push(node(1)));
            assert!(!q.push(node(2)));
            assert!(!q.push(node(3)));
        }
        assert!(!q.is_empty());
        assert_eq!(drain_values(&q), vec![1, 2, 3]);
        assert!(q.is_empty());
        // SAFETY: fresh node.
        assert!(unsafe { q.push(node(4)) });
        assert_eq!(drain_values(&q), vec![4]);
    }

    #[test]
    fn many_producers_lose_nothing() {
        let q = std::sync::Arc::new(RemoteQueue::new());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000 {
                        // SAFETY: fresh node.
                        unsafe { q.push(node(t * 100_000 + i)) };
                    }
                })
            })
            .collect();
        let mut seen = Vec::new();
        while seen.len() < 40_000 {
            seen.extend(drain_values(&q));
        }
        for t in threads {
            t.join().expect("producer panicked");
        }
        seen.extend(drain_values(&q));
        // Per producer, order is kept.
        for t in 0..4 {
            let mine: Vec<_> = seen.iter().filter(|v| **v / 100_000 == t).collect();
            assert_eq!(mine.len(), 10_000);
            assert!(mine.windows(2).all(|w| w[0] < w[1]));
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    struct Node {
        link: AtomicPtr<Node>,
    }

    // SAFETY: `link` is only this queue's link.
    unsafe impl Linked for Node {
        fn link(&self) -> &AtomicPtr<Node> {
            &self.link
        }
    }

    fn node() -> NonNull<Node> {
        NonNull::from(Box::leak(Box::new(Node {
            link: AtomicPtr::new(ptr::null_mut()),
        })))
    }

    struct Core {
        queue: RemoteQueue<Node>,
        gate: ParkGate,
    }

    /// Consumer loop of a core: drain, then park through the gate. Loom
    /// reports a deadlock if a wake is ever lost.
    fn consume(core: &Core, expected: usize) {
        let mut got = 0;
        loop {
            for n in core.queue.take_all() {
                // SAFETY: taken nodes are ours; leaked from a Box.
                drop(unsafe { Box::from_raw(n.as_ptr()) });
                got += 1;
            }
            if got == expected {
                return;
            }
            core.gate.prepare_park();
            if core.queue.is_empty() {
                loom::thread::park();
            }
            core.gate.finish_park();
        }
    }

    fn produce(core: &Core, consumer: &loom::thread::Thread, count: usize) {
        for _ in 0..count {
            // SAFETY: fresh node.
            let was_empty = unsafe { core.queue.push(node()) };
            if was_empty && core.gate.needs_unpark() {
                consumer.unpark();
            }
        }
    }

    fn new_core() -> Arc<Core> {
        Arc::new(Core {
            queue: RemoteQueue::new(),
            gate: ParkGate::new(),
        })
    }

    /// Runs the consumer on its own thread (loom's `unpark` would also
    /// disturb a thread blocked in `join`), then `producers` producers.
    fn run(producers: usize, pushes_each: usize) {
        let core = new_core();
        let consumer = {
            let core = core.clone();
            loom::thread::spawn(move || consume(&core, producers * pushes_each))
        };
        let target = consumer.thread().clone();
        let handles: Vec<_> = (0..producers)
            .map(|_| {
                let (core, target) = (core.clone(), target.clone());
                loom::thread::spawn(move || produce(&core, &target, pushes_each))
            })
            .collect();
        for h in handles {
            h.join().expect("producer");
        }
        consumer.join().expect("consumer");
    }

    /// Loom with a preemption bound of 3 (the usual setting: bugs of
    /// this kind need one or two preemptions; an unbounded search of
    /// several pushes does not finish).
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(f);
    }

    #[test]
    fn loom_remote_queue_park_handshake_two_producers() {
        model(|| run(2, 1));
    }

    #[test]
    fn loom_remote_queue_park_handshake_one_push() {
        model(|| run(1, 1));
    }

    #[test]
    fn loom_remote_queue_park_handshake_repeated_pushes() {
        model(|| run(1, 3));
    }

    #[test]
    fn loom_wake_flag_park_handshake() {
        // The main future's waker uses the same gate with a flag instead of
        // a queue.
        model(|| {
            let woken = Arc::new(AtomicBool::new(false));
            let gate = Arc::new(ParkGate::new());
            let core = {
                let (woken, gate) = (woken.clone(), gate.clone());
                loom::thread::spawn(move || loop {
                    if woken.swap(false, SeqCst) {
                        break;
                    }
                    gate.prepare_park();
                    if !woken.load(Relaxed) {
                        loom::thread::park();
                    }
                    gate.finish_park();
                })
            };
            if !woken.swap(true, SeqCst) && gate.needs_unpark() {
                core.thread().unpark();
            }
            core.join().expect("core");
        });
    }
}
