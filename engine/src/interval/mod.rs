//! An interval index over request slots: which live requests of a device
//! overlap a byte range, with no allocation per request (the nodes are the
//! request slots themselves).
//!
//! The device's byte space is cut into chunks of `2^chunk_shift` bytes (16
//! KiB by default). A small range, within two chunks (the pages of random
//! IO), is linked into the hash bucket of each chunk it touches
//! ([`chunks`]): linking and unlinking take constant time, and a query
//! reads the buckets of its chunks (every bucket once, for a query of more
//! chunks than buckets), whatever the queue depth. A larger
//! range (merged sequential IO, big writes and discards) goes into an
//! interval tree ([`tree`], `O(log n)`). A query asks both, the tree only
//! when it holds something. The kernel needs no such index: it leaves the
//! order of overlapping IO to the file system; a userspace block layer
//! that promises program order for overlapping IO needs this lookup to
//! stay cheap.
//!
//! Invariants (checked by [`IntervalIndex::check`] in the tests and the
//! debug builds' queue checks, with those of the two parts):
//! - Every linked node is in exactly one part: the tree when `large`, the
//!   buckets otherwise; unlinked nodes have `linked == false` (their other
//!   fields are stale and never read).
//! - A node's range does not change while it is linked: callers unlink
//!   it, change the range, and link it again. The node keeps a copy of it
//!   (`start`, `end`, equal to [`Nodes::range`] while linked).

mod chunks;
mod node;
mod tree;

use chunks::Chunks;
pub(crate) use node::{Node, Nodes, NIL};
use tree::Tree;

/// The chunk size of the default index: 16 KiB, so that a database page
/// of up to 16 KiB is a small range.
const CHUNK_SHIFT: u32 = 14;

/// Buckets of the default index (a power of two).
const BUCKETS: usize = 256;

/// The index: the small ranges' buckets and the large ranges' tree.
#[derive(Debug)]
pub(crate) struct IntervalIndex {
    chunks: Chunks,
    tree: Tree,
}

impl Default for IntervalIndex {
    fn default() -> Self {
        IntervalIndex::with_geometry(CHUNK_SHIFT, BUCKETS)
    }
}

impl IntervalIndex {
    /// An index of `buckets` buckets (a power of two) over chunks of
    /// `2^chunk_shift` bytes.
    fn with_geometry(chunk_shift: u32, buckets: usize) -> Self {
        IntervalIndex {
            chunks: Chunks::new(chunk_shift, buckets),
            tree: Tree::default(),
        }
    }

    /// Nodes linked.
    pub fn len(&self) -> u32 {
        self.chunks.len() + self.tree.len()
    }

    /// Links slot `i` (not linked) with its current range.
    #[inline]
    pub fn insert<N: Nodes>(&mut self, nodes: &mut N, i: u32) {
        debug_assert!(!nodes.node(i).linked, "slot {i} indexed twice");
        let (start, end) = nodes.range(i);
        let (first, last) = self.chunks.chunks(start, end);
        if last - first > 1 {
            self.tree.insert(nodes, i);
            return;
        }
        // Only what a small range uses: its links are set as it is pushed
        // on each list (the tree's fields are the tree's to set).
        let n = nodes.node_mut(i);
        n.linked = true;
        n.large = false;
        n.start = start;
        n.end = end;
        self.chunks.insert(nodes, i);
    }

    /// Takes linked slot `i`'s range as it is now (it changed: a bio
    /// joined the request): the same as [`IntervalIndex::remove`] then
    /// [`IntervalIndex::insert`], but a large range that only grew at its
    /// back stays in its place in the tree.
    pub fn update_range<N: Nodes>(&mut self, nodes: &mut N, i: u32) {
        let n = *nodes.node(i);
        debug_assert!(n.linked, "slot {i} is not in the interval index");
        let (start, end) = nodes.range(i);
        if n.large && start == n.start && end >= n.end {
            self.tree.extend_end(nodes, i);
            return;
        }
        // The range the node was linked with is still in the node.
        self.remove(nodes, i);
        self.insert(nodes, i);
    }

    /// Unlinks slot `i` (linked, with the range it was linked with).
    #[inline]
    pub fn remove<N: Nodes>(&mut self, nodes: &mut N, i: u32) {
        let n = nodes.node(i);
        assert!(n.linked, "slot {i} is not in the interval index");
        if n.large {
            self.tree.remove(nodes, i);
        } else {
            self.chunks.remove(nodes, i);
        }
        // Links left in an unlinked node are never read: each insert sets
        // what its part uses.
        nodes.node_mut(i).linked = false;
    }

    /// Calls `f` for every linked slot whose range overlaps `[start,
    /// end)` (an empty range overlaps nothing), each once, in no
    /// particular order.
    pub fn for_overlaps<N: Nodes>(&self, nodes: &N, start: u64, end: u64, f: &mut impl FnMut(u32)) {
        if start >= end {
            return;
        }
        self.chunks.for_overlaps(nodes, start, end, f);
        if self.tree.len() > 0 {
            self.tree.for_overlaps(nodes, start, end, f);
        }
    }

    /// Checks the invariants of the module docs and of both parts; panics
    /// on a violation. Returns the number of nodes linked.
    #[cfg(any(test, debug_assertions))]
    pub fn check<N: Nodes>(&self, nodes: &N) -> u32 {
        self.chunks.check(nodes) + self.tree.check(nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interval::node::Plain;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u32, u64, u64),
        Remove(u32),
        Query(u64, u64),
        /// A linked slot's range moves: its start by the first amount
        /// (back when negative), its end by the second (a back merge
        /// grows only the end).
        Update(u32, i64, u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u32..64, 0u64..200, 0u64..40).prop_map(|(i, s, l)| Step::Insert(i, s, s + l)),
            (0u32..64).prop_map(Step::Remove),
            (0u64..240, 0u64..60).prop_map(|(s, l)| Step::Query(s, s + l)),
            (0u32..64, prop_oneof![Just(0i64), -20i64..20], 0u64..30)
                .prop_map(|(i, ds, de)| Step::Update(i, ds, de)),
        ]
    }

    proptest! {
        /// Against a plain list: every query finds exactly the linked
        /// ranges that overlap it, each once, and the buckets, lists and
        /// tree stay well formed; with chunks of 1 to 64 bytes (ranges of
        /// one, two or more chunks, in the buckets or the tree; queries of
        /// fewer chunks than buckets, which read their chunks' buckets, or
        /// more, which read every bucket once) and 1 to 16 buckets (chunks
        /// sharing a bucket), or the default geometry (one chunk for all).
        #[test]
        fn matches_a_linear_scan(
            geometry in prop_oneof![
                (0u32..7, 0u32..5).prop_map(|(shift, b)| Some((shift, 1usize << b))),
                Just(None),
            ],
            steps in proptest::collection::vec(step(), 1..300),
        ) {
            let mut p = Plain::new(64);
            let mut ix = match geometry {
                Some((shift, buckets)) => IntervalIndex::with_geometry(shift, buckets),
                None => IntervalIndex::default(),
            };
            for s in steps {
                match s {
                    Step::Insert(i, a, b) => {
                        if !p.nodes[i as usize].linked {
                            p.ranges[i as usize] = (a, b);
                            ix.insert(&mut p, i);
                        }
                    }
                    Step::Remove(i) => {
                        if p.nodes[i as usize].linked {
                            ix.remove(&mut p, i);
                        }
                    }
                    Step::Update(i, ds, de) => {
                        if p.nodes[i as usize].linked {
                            let (s, e) = p.ranges[i as usize];
                            let s2 = s.saturating_add_signed(ds).min(e + de);
                            p.ranges[i as usize] = (s2, e + de);
                            ix.update_range(&mut p, i);
                        }
                    }
                    Step::Query(a, b) => {
                        let mut got = Vec::new();
                        ix.for_overlaps(&p, a, b, &mut |i| got.push(i));
                        got.sort_unstable();
                        let want: Vec<u32> = (0..64u32)
                            .filter(|&i| {
                                let (s, e) = p.ranges[i as usize];
                                p.nodes[i as usize].linked && a < b && s < b && a < e
                            })
                            .collect();
                        prop_assert_eq!(got, want);
                    }
                }
                ix.check(&p);
            }
        }
    }

    #[test]
    fn many_equal_starts_and_a_long_range() {
        let n = 1000u32;
        let mut p = Plain {
            nodes: vec![Node::default(); n as usize + 1],
            ranges: (0..n).map(|_| (4096, 8192)).collect(),
        };
        p.ranges.push((0, 1 << 40));
        let mut ix = IntervalIndex::default();
        for i in 0..=n {
            ix.insert(&mut p, i);
        }
        assert_eq!(ix.check(&p), n + 1);
        let mut hits = 0;
        ix.for_overlaps(&p, 8192, 9000, &mut |_| hits += 1);
        assert_eq!(hits, 1, "only the long range reaches past 8192");
        for i in (0..n).step_by(2) {
            ix.remove(&mut p, i);
        }
        hits = 0;
        ix.for_overlaps(&p, 5000, 5001, &mut |_| hits += 1);
        assert_eq!(hits, n / 2 + 1);
        ix.check(&p);
    }
}
