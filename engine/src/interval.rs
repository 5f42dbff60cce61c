//! An interval index over request slots: which live requests of a device
//! overlap a byte range, with no allocation per request (the nodes are the
//! request slots themselves).
//!
//! The device's byte space is cut into chunks of `2^chunk_shift` bytes (1
//! MiB by default). A range that lies in one or two chunks (a small
//! request, the common case) is linked into the hash bucket of each of its
//! chunks; a longer one is linked into the list of large ranges. Every
//! linked range is also in the list of all. A query of a few chunks reads
//! the buckets of its chunks and the large list; a longer query reads the
//! list of all. Random IO then costs a few list links per request and a
//! bucket or two per query, whatever the queue depth; the price is a scan
//! of every large range live (ranges of more than a chunk, rare but for
//! big writes and discards) on each query. Lists are intrusive and doubly
//! linked through the nodes, so linking and unlinking are constant time.
//! The kernel needs no such index: it leaves the order of overlapping IO
//! to the file system; a userspace block layer that promises program
//! order for overlapping IO needs this lookup to stay cheap.
//!
//! Invariants (checked by [`IntervalIndex::check`] in the tests and the
//! debug builds' queue checks):
//! - Every linked node is in the list of all exactly once, and in the
//!   buckets of its one or two chunks (link 0 for its first chunk, link 1
//!   for its second) or in the large list (link 0), exactly once each;
//!   unlinked nodes have `linked == false` and are in no list.
//! - Each list is doubly linked: the `prev` of an entry's `next` is the
//!   entry; a head's `prev` is `NIL`.
//! - A node's range does not change while it is linked: callers unlink
//!   it, change the range, and link it again. The node keeps a copy of it
//!   (`start`, `end`, equal to [`Nodes::range`] while linked).
//! - A query reports each overlapping node once: from the bucket of the
//!   first chunk that the node and the query share.

/// No node (and no link).
pub(crate) const NIL: u32 = u32::MAX;

/// The chunk size of the default index: 1 MiB, so that a merged request
/// of up to 1 MiB stays a small range.
const CHUNK_SHIFT: u32 = 20;

/// Buckets of the default index (a power of two).
const BUCKETS: usize = 256;

/// A query of at most this many chunks reads their buckets; a longer one
/// reads the list of all.
const QUERY_CHUNKS: u64 = 4;

/// The list of all, in a node's links.
const ALL: usize = 2;

/// The index fields of one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Node {
    pub linked: bool,
    /// The range is in the large list (link 0), not in buckets.
    pub large: bool,
    /// The slot's range `[start, end)` as it was linked.
    pub start: u64,
    pub end: u64,
    /// Links 0 and 1 (bucket lists, or link 0 in the large list) and 2
    /// (the list of all): the next and previous entries, each a slot
    /// shifted left by 2 with the link's number in the low bits.
    pub next: [u32; 3],
    pub prev: [u32; 3],
}

impl Default for Node {
    fn default() -> Self {
        Node {
            linked: false,
            large: false,
            start: 0,
            end: 0,
            next: [NIL; 3],
            prev: [NIL; 3],
        }
    }
}

/// Storage of the nodes: the request slab.
pub(crate) trait Nodes {
    /// The index fields of slot `i`.
    fn node(&self, i: u32) -> &Node;
    /// The index fields of slot `i`, mutably.
    fn node_mut(&mut self, i: u32) -> &mut Node;
    /// The byte range `[start, end)` of slot `i`.
    fn range(&self, i: u32) -> (u64, u64);
}

/// Link `k` of slot `slot`, as the lists store it.
#[inline]
fn entry(slot: u32, k: usize) -> u32 {
    debug_assert!(slot < (NIL >> 2), "slot {slot} too large for the index");
    (slot << 2) | k as u32
}

/// The slot and link number of list entry `e`.
#[inline]
fn unentry(e: u32) -> (u32, usize) {
    (e >> 2, (e & 3) as usize)
}

/// Where a list starts.
#[derive(Clone, Copy)]
enum Head {
    Bucket(usize),
    Large,
    All,
}

/// The index: the bucket heads and the two lists' heads.
#[derive(Debug)]
pub(crate) struct IntervalIndex {
    buckets: Box<[u32]>,
    large: u32,
    all: u32,
    len: u32,
    chunk_shift: u32,
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
        debug_assert!(buckets.is_power_of_two());
        IntervalIndex {
            buckets: vec![NIL; buckets].into_boxed_slice(),
            large: NIL,
            all: NIL,
            len: 0,
            chunk_shift,
        }
    }

    /// Nodes linked.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// The chunks of `[start, end)`: the first and the last (an empty
    /// range is in the chunk of its start).
    #[inline]
    fn chunks(&self, start: u64, end: u64) -> (u64, u64) {
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

    #[inline]
    fn head(&mut self, h: Head) -> &mut u32 {
        match h {
            Head::Bucket(b) => &mut self.buckets[b],
            Head::Large => &mut self.large,
            Head::All => &mut self.all,
        }
    }

    /// Links slot `i` (not linked) with its current range.
    pub fn insert<N: Nodes>(&mut self, nodes: &mut N, i: u32) {
        debug_assert!(!nodes.node(i).linked, "slot {i} indexed twice");
        let (start, end) = nodes.range(i);
        let (first, last) = self.chunks(start, end);
        let large = last - first > 1;
        *nodes.node_mut(i) = Node {
            linked: true,
            large,
            start,
            end,
            ..Node::default()
        };
        if large {
            self.push(nodes, Head::Large, i, 0);
        } else {
            self.push(nodes, Head::Bucket(self.bucket(first)), i, 0);
            if last != first {
                self.push(nodes, Head::Bucket(self.bucket(last)), i, 1);
            }
        }
        self.push(nodes, Head::All, i, ALL);
        self.len += 1;
    }

    /// Unlinks slot `i` (linked, with the range it was linked with).
    pub fn remove<N: Nodes>(&mut self, nodes: &mut N, i: u32) {
        let n = *nodes.node(i);
        assert!(n.linked, "slot {i} is not in the interval index");
        let (first, last) = self.chunks(n.start, n.end);
        if n.large {
            self.unlink(nodes, Head::Large, i, 0);
        } else {
            self.unlink(nodes, Head::Bucket(self.bucket(first)), i, 0);
            if last != first {
                self.unlink(nodes, Head::Bucket(self.bucket(last)), i, 1);
            }
        }
        self.unlink(nodes, Head::All, i, ALL);
        *nodes.node_mut(i) = Node::default();
        self.len -= 1;
    }

    /// Puts link `k` of slot `i` at the front of list `h`.
    #[inline]
    fn push<N: Nodes>(&mut self, nodes: &mut N, h: Head, i: u32, k: usize) {
        let e = entry(i, k);
        let old = std::mem::replace(self.head(h), e);
        let n = nodes.node_mut(i);
        n.next[k] = old;
        n.prev[k] = NIL;
        if old != NIL {
            let (j, kj) = unentry(old);
            nodes.node_mut(j).prev[kj] = e;
        }
    }

    /// Takes link `k` of slot `i` out of list `h`.
    #[inline]
    fn unlink<N: Nodes>(&mut self, nodes: &mut N, h: Head, i: u32, k: usize) {
        let n = nodes.node(i);
        let (next, prev) = (n.next[k], n.prev[k]);
        if prev == NIL {
            *self.head(h) = next;
        } else {
            let (j, kj) = unentry(prev);
            nodes.node_mut(j).next[kj] = next;
        }
        if next != NIL {
            let (j, kj) = unentry(next);
            nodes.node_mut(j).prev[kj] = prev;
        }
    }

    /// Calls `f` for every linked slot whose range overlaps `[start,
    /// end)` (an empty range overlaps nothing), each once, in no
    /// particular order.
    pub fn for_overlaps<N: Nodes>(&self, nodes: &N, start: u64, end: u64, f: &mut impl FnMut(u32)) {
        if start >= end || self.len == 0 {
            return;
        }
        let (first, last) = self.chunks(start, end);
        if last - first >= QUERY_CHUNKS {
            self.scan(nodes, self.all, start, end, f);
            return;
        }
        for c in first..=last {
            let mut e = self.buckets[self.bucket(c)];
            while e != NIL {
                let (j, k) = unentry(e);
                let n = nodes.node(j);
                // The link's chunk is the node's first chunk plus `k`; it is
                // reported from the first chunk it shares with the query.
                let own = (n.start >> self.chunk_shift) + k as u64;
                if own == c && n.start < end && start < n.end && c == first.max(own - k as u64) {
                    f(j);
                }
                e = n.next[k];
            }
        }
        self.scan(nodes, self.large, start, end, f);
    }

    /// Reports the nodes of list `e` (the large list or the list of all)
    /// that overlap `[start, end)`.
    #[inline]
    fn scan<N: Nodes>(&self, nodes: &N, mut e: u32, start: u64, end: u64, f: &mut impl FnMut(u32)) {
        while e != NIL {
            let (j, k) = unentry(e);
            let n = nodes.node(j);
            if n.start < end && start < n.end {
                f(j);
            }
            e = n.next[k];
        }
    }

    /// Checks the invariants of the module docs; panics on a violation.
    /// Returns the number of nodes linked.
    #[cfg(any(test, debug_assertions))]
    pub fn check<N: Nodes>(&self, nodes: &N) -> u32 {
        let all = self.check_list(nodes, self.all, |_, k| k == ALL, "all");
        assert_eq!(all, self.len, "interval index length");
        let large = self.check_list(nodes, self.large, |n, k| k == 0 && n.large, "large");
        let mut links = 0;
        for (b, &head) in self.buckets.iter().enumerate() {
            links += self.check_list(
                nodes,
                head,
                |n, k| {
                    let (first, last) = self.chunks(n.start, n.end);
                    !n.large
                        && (k == 0 || (k == 1 && last != first))
                        && self.bucket(first + k as u64) == b
                },
                "bucket",
            );
        }
        // Every node counted in the list of all has its links: one in the
        // large list, or one or two in buckets.
        let mut e = self.all;
        let mut want_large = 0;
        let mut want_links = 0;
        while e != NIL {
            let (j, _) = unentry(e);
            let n = nodes.node(j);
            assert_eq!(
                (n.start, n.end),
                nodes.range(j),
                "slot {j}'s range changed while it was linked"
            );
            let (first, last) = self.chunks(n.start, n.end);
            assert_eq!(n.large, last - first > 1, "slot {j}: large flag");
            if n.large {
                want_large += 1;
            } else {
                want_links += 1 + u32::from(last != first);
            }
            e = n.next[ALL];
        }
        assert_eq!(large, want_large, "large list length");
        assert_eq!(links, want_links, "bucket links");
        all
    }

    /// Walks list `head`, checking its links, that each entry is linked
    /// and that `ok` holds for it; returns its length.
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
                n.linked,
                "slot {j} in the {what} list but not marked linked"
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Nodes with ranges, for the tests.
    struct Plain {
        nodes: Vec<Node>,
        ranges: Vec<(u64, u64)>,
    }

    impl Nodes for Plain {
        fn node(&self, i: u32) -> &Node {
            &self.nodes[i as usize]
        }
        fn node_mut(&mut self, i: u32) -> &mut Node {
            &mut self.nodes[i as usize]
        }
        fn range(&self, i: u32) -> (u64, u64) {
            self.ranges[i as usize]
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u32, u64, u64),
        Remove(u32),
        Query(u64, u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u32..64, 0u64..200, 0u64..40).prop_map(|(i, s, l)| Step::Insert(i, s, s + l)),
            (0u32..64).prop_map(Step::Remove),
            (0u64..240, 0u64..60).prop_map(|(s, l)| Step::Query(s, s + l)),
        ]
    }

    proptest! {
        /// Against a plain list: every query finds exactly the linked
        /// ranges that overlap it, each once, and the lists stay well
        /// formed; with chunks of 1 to 64 bytes (ranges of one, two or
        /// more chunks, queries of few or many) and 1 to 16 buckets (chunks
        /// sharing a bucket), or the default geometry (one chunk for all).
        #[test]
        fn matches_a_linear_scan(
            geometry in prop_oneof![
                (0u32..7, 0u32..5).prop_map(|(shift, b)| Some((shift, 1usize << b))),
                Just(None),
            ],
            steps in proptest::collection::vec(step(), 1..300),
        ) {
            let mut p = Plain { nodes: vec![Node::default(); 64], ranges: vec![(0, 0); 64] };
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
