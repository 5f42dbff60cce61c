//! The small ranges of the interval index (within two chunks): linked into
//! the hash bucket of each chunk they touch.
//!
//! Invariants (checked by [`Chunks::check`]):
//! - Every small range is in the buckets of its one or two chunks (link 0
//!   for its first chunk, link 1 for its second) exactly once each; `len`
//!   counts the ranges (their links 0).
//! - Each list is doubly linked: the `prev` of an entry's `next` is the
//!   entry; a head's `prev` is `NIL`.
//! - A query reports each overlapping range once: from the bucket of the
//!   first chunk that the range and the query share; a query of as many
//!   chunks as there are buckets, or more, reads every bucket once and
//!   reports each range from its link 0.

#[cfg(any(test, debug_assertions))]
use super::node::Node;
use super::node::{Nodes, NIL};

/// Link `k` of slot `slot`, as the lists store it.
#[inline]
fn entry(slot: u32, k: usize) -> u32 {
    debug_assert!(slot < (NIL >> 1), "slot {slot} too large for the index");
    (slot << 1) | k as u32
}

/// The slot and link number of list entry `e`.
#[inline]
fn unentry(e: u32) -> (u32, usize) {
    (e >> 1, (e & 1) as usize)
}

/// The buckets.
#[derive(Debug)]
pub(super) struct Chunks {
    buckets: Box<[u32]>,
    len: u32,
    chunk_shift: u32,
}

impl Chunks {
    /// `buckets` buckets (a power of two) over chunks of `2^chunk_shift`
    /// bytes.
    pub(super) fn new(chunk_shift: u32, buckets: usize) -> Self {
        debug_assert!(buckets.is_power_of_two());
        Chunks {
            buckets: vec![NIL; buckets].into_boxed_slice(),
            len: 0,
            chunk_shift,
        }
    }

    pub(super) fn len(&self) -> u32 {
        self.len
    }

    /// The first and last chunk of `[start, end)` (an empty range is in
    /// the chunk of its start).
    #[inline]
    pub(super) fn chunks(&self, start: u64, end: u64) -> (u64, u64) {
        (
            start >> self.chunk_shift,
            end.saturating_sub(1).max(start) >> self.chunk_shift,
        )
    }

    /// The bucket of chunk `c`.
    #[inline]
    fn bucket(&self, c: u64) -> usize {
        (c.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & (self.buckets.len() - 1)
    }

    /// Links slot `i`, whose node holds its range (within two chunks).
    #[inline]
    pub(super) fn insert<N: Nodes>(&mut self, nodes: &mut N, i: u32) {
        let n = nodes.node(i);
        let (first, last) = self.chunks(n.start, n.end);
        debug_assert!(last - first <= 1, "slot {i}: a large range in the buckets");
        self.push(nodes, self.bucket(first), i, 0);
        if last != first {
            self.push(nodes, self.bucket(last), i, 1);
        }
        self.len += 1;
    }

    /// Unlinks slot `i`.
    #[inline]
    pub(super) fn remove<N: Nodes>(&mut self, nodes: &mut N, i: u32) {
        let n = nodes.node(i);
        let (first, last) = self.chunks(n.start, n.end);
        self.unlink(nodes, self.bucket(first), i, 0);
        if last != first {
            self.unlink(nodes, self.bucket(last), i, 1);
        }
        self.len -= 1;
    }

    /// Puts link `k` of slot `i` at the front of bucket `b`.
    #[inline]
    fn push<N: Nodes>(&mut self, nodes: &mut N, b: usize, i: u32, k: usize) {
        let e = entry(i, k);
        let old = std::mem::replace(&mut self.buckets[b], e);
        let n = nodes.node_mut(i);
        n.next[k] = old;
        n.prev[k] = NIL;
        if old != NIL {
            let (j, kj) = unentry(old);
            nodes.node_mut(j).prev[kj] = e;
        }
    }

    /// Takes link `k` of slot `i` out of bucket `b`.
    #[inline]
    fn unlink<N: Nodes>(&mut self, nodes: &mut N, b: usize, i: u32, k: usize) {
        let n = nodes.node(i);
        let (next, prev) = (n.next[k], n.prev[k]);
        if prev == NIL {
            self.buckets[b] = next;
        } else {
            let (j, kj) = unentry(prev);
            nodes.node_mut(j).next[kj] = next;
        }
        if next != NIL {
            let (j, kj) = unentry(next);
            nodes.node_mut(j).prev[kj] = prev;
        }
    }

    /// Reports each small range that overlaps `[start, end)` (not empty)
    /// once.
    #[inline]
    pub(super) fn for_overlaps<N: Nodes>(
        &self,
        nodes: &N,
        start: u64,
        end: u64,
        f: &mut impl FnMut(u32),
    ) {
        if self.len == 0 {
            return;
        }
        let (first, last) = self.chunks(start, end);
        if last - first >= self.buckets.len() as u64 - 1 {
            // As many chunks as buckets, or more: every bucket once, each
            // range reported from its first chunk's link.
            for &head in self.buckets.iter() {
                let mut e = head;
                while e != NIL {
                    let (j, k) = unentry(e);
                    let n = nodes.node(j);
                    if k == 0 && n.start < end && start < n.end {
                        f(j);
                    }
                    e = n.next[k];
                }
            }
            return;
        }
        // A plain loop, not an inclusive range (whose iterator keeps a
        // flag): most queries read one chunk.
        let mut c = first;
        loop {
            let mut e = self.buckets[self.bucket(c)];
            while e != NIL {
                let (j, k) = unentry(e);
                let n = nodes.node(j);
                // The link's chunk is the range's first chunk plus `k`
                // (others share the bucket); the range is reported from
                // the first chunk it shares with the query.
                let own_first = n.start >> self.chunk_shift;
                let own = own_first + k as u64;
                if own == c && n.start < end && start < n.end && c == first.max(own_first) {
                    f(j);
                }
                e = n.next[k];
            }
            if c == last {
                break;
            }
            c += 1;
        }
    }

    /// Checks the invariants of the module docs; panics on a violation.
    /// Returns the number of ranges linked.
    #[cfg(any(test, debug_assertions))]
    pub(super) fn check<N: Nodes>(&self, nodes: &N) -> u32 {
        let (mut firsts, mut seconds, mut want_seconds) = (0, 0, 0);
        for (b, &head) in self.buckets.iter().enumerate() {
            self.check_list(
                nodes,
                head,
                |n, k| {
                    let (first, last) = self.chunks(n.start, n.end);
                    (k == 0 || (k == 1 && last != first)) && self.bucket(first + k as u64) == b
                },
                "bucket",
            );
            let mut e = head;
            while e != NIL {
                let (j, k) = unentry(e);
                let n = nodes.node(j);
                let (first, last) = self.chunks(n.start, n.end);
                assert!(last - first <= 1, "slot {j}: a large range in the buckets");
                if k == 0 {
                    firsts += 1;
                    want_seconds += u32::from(last != first);
                } else {
                    seconds += 1;
                }
                e = n.next[k];
            }
        }
        assert_eq!(firsts, self.len, "interval buckets' length");
        assert_eq!(seconds, want_seconds, "bucket links of second chunks");
        firsts
    }

    /// Walks list `head`, checking its links, that each entry is a linked
    /// small range and that `ok` holds for it; returns its length.
    #[cfg(any(test, debug_assertions))]
    fn check_list<N: Nodes>(
        &self,
        nodes: &N,
        head: u32,
        ok: impl Fn(&Node, usize) -> bool,
        what: &str,
    ) -> u32 {
        let mut prev = NIL;
        let mut e = head;
        let mut len = 0;
        while e != NIL {
            let (j, k) = unentry(e);
            let n = nodes.node(j);
            assert!(
                n.linked && !n.large,
                "slot {j} in the {what} list but not a linked small range"
            );
            assert_eq!(
                (n.start, n.end),
                nodes.range(j),
                "slot {j}'s range changed while it was linked"
            );
            assert_eq!(
                n.prev[k], prev,
                "slot {j} link {k}: prev in the {what} list"
            );
            assert!(
                ok(n, k),
                "slot {j} link {k} does not belong in this {what} list"
            );
            len += 1;
            assert!(len <= 1 << 30, "a cycle in the {what} list");
            prev = e;
            e = n.next[k];
        }
        len
    }
}
