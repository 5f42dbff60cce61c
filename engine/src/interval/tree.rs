//! The large ranges of the interval index (more than two chunks): a treap,
//! a binary search tree ordered by `(start, slot)` whose shape is a heap
//! on random priorities, augmented with the largest end of each subtree
//! (the textbook interval tree, CLRS 14.3): a subtree whose largest end is
//! at or before a query's start holds nothing that overlaps it and is
//! skipped. `O(log n + k)` expected time for `n` ranges and `k` found.
//!
//! Invariants (checked by [`Tree::check`]):
//! - Every node of the tree is reachable from the root exactly once.
//! - In-order traversal is sorted by `(start, slot)`; each node's priority
//!   is at least its children's.
//! - `max_end` of a node is the largest end in its subtree.
//!
//! Insertion and removal walk down without recursion (insertion raises
//! `max_end` on the way; removal keeps the path and lowers `max_end` on
//! the way back up, stopping where it no longer changes), and so does a
//! query; only the split and merge below the node inserted or removed
//! recurse, and with random priorities they are expected to be a constant
//! number of levels deep.

use super::node::{Node, Nodes, NIL};

/// The tree: a root and a priority generator.
#[derive(Debug)]
pub(super) struct Tree {
    root: u32,
    len: u32,
    rng: u32,
}

impl Default for Tree {
    fn default() -> Self {
        Tree {
            root: NIL,
            len: 0,
            rng: 0x9e37_79b9,
        }
    }
}

/// The deepest path [`Tree::remove`] keeps without recursing; a
/// deeper one (never expected: a treap of `n` nodes is about `2 ln n`
/// deep) takes the recursive walk.
const MAX_PATH: usize = 64;

impl Tree {
    /// Nodes linked.
    pub(super) fn len(&self) -> u32 {
        self.len
    }

    /// Links slot `i` (not linked) with its current range.
    pub(super) fn insert<N: Nodes>(&mut self, nodes: &mut N, i: u32) {
        debug_assert!(!nodes.node(i).linked, "slot {i} indexed twice");
        // xorshift32: priorities need only be independent of the keys.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 17;
        self.rng ^= self.rng << 5;
        let prio = self.rng;
        let (start, end) = nodes.range(i);
        let key = (start, i);
        // Down to where `i` belongs: below every node of a higher (or
        // equal) priority, each of which gains `i` in its subtree.
        let (mut parent, mut left) = (NIL, false);
        let mut t = self.root;
        while t != NIL {
            let n = nodes.node_mut(t);
            if prio > n.prio {
                break;
            }
            n.max_end = n.max_end.max(end);
            parent = t;
            left = key < (n.start, t);
            t = if left { n.left } else { n.right };
        }
        // `i` takes `t`'s place, with `t`'s subtree split around it.
        let (l, r) = split(nodes, t, key);
        *nodes.node_mut(i) = Node {
            left: l,
            right: r,
            prio,
            linked: true,
            large: true,
            start,
            end,
            max_end: end.max(max_end(nodes, l)).max(max_end(nodes, r)),
            ..Node::default()
        };
        self.set_child(nodes, parent, left, i);
        self.len += 1;
    }

    /// Moves the end of linked slot `i` to its range's end now, which
    /// starts where it did and ends no earlier (a bio joined its back):
    /// the key stays, so the node stays where it is, and the nodes on its
    /// path from the root take the new end into their `max_end`.
    pub(super) fn extend_end<N: Nodes>(&mut self, nodes: &mut N, i: u32) {
        let (start, end) = nodes.range(i);
        debug_assert_eq!(start, nodes.node(i).start, "slot {i}: its start moved");
        debug_assert!(end >= nodes.node(i).end, "slot {i}: its end moved back");
        let key = (start, i);
        let mut t = self.root;
        loop {
            assert!(t != NIL, "slot {i} is not in the interval tree");
            let n = nodes.node_mut(t);
            n.max_end = n.max_end.max(end);
            if t == i {
                n.end = end;
                return;
            }
            t = if key < (n.start, t) { n.left } else { n.right };
        }
    }

    /// Unlinks slot `i` (linked, with the range it was linked with).
    pub(super) fn remove<N: Nodes>(&mut self, nodes: &mut N, i: u32) {
        self.remove_with_path::<N, MAX_PATH>(nodes, i);
    }

    /// [`Tree::remove`] keeping a path of at most `P` nodes (the
    /// tests use a short one to run the recursive walk too).
    fn remove_with_path<N: Nodes, const P: usize>(&mut self, nodes: &mut N, i: u32) {
        debug_assert!(nodes.node(i).linked, "slot {i} not indexed");
        let key = (nodes.node(i).start, i);
        let mut path = [NIL; P];
        let mut depth = 0;
        let mut t = self.root;
        while t != i {
            assert!(t != NIL, "slot {i} is not in the interval index");
            if depth == P {
                self.root = remove_at(nodes, self.root, key, i);
                *nodes.node_mut(i) = Node::default();
                self.len -= 1;
                return;
            }
            path[depth] = t;
            depth += 1;
            let n = nodes.node(t);
            t = if key < (n.start, t) { n.left } else { n.right };
        }
        let n = *nodes.node(i);
        let joined = merge(nodes, n.left, n.right);
        let parent = if depth == 0 { NIL } else { path[depth - 1] };
        let left = parent != NIL && nodes.node(parent).left == i;
        self.set_child(nodes, parent, left, joined);
        // Back up the path: each ancestor lost `i`; once one's largest end
        // stays, so do those above it.
        for &a in path[..depth].iter().rev() {
            let was = nodes.node(a).max_end;
            if update(nodes, a) == was {
                break;
            }
        }
        *nodes.node_mut(i) = Node::default();
        self.len -= 1;
    }

    /// Makes `child` the root (`parent` NIL) or `parent`'s left or right
    /// child.
    #[inline]
    fn set_child<N: Nodes>(&mut self, nodes: &mut N, parent: u32, left: bool, child: u32) {
        if parent == NIL {
            self.root = child;
        } else if left {
            nodes.node_mut(parent).left = child;
        } else {
            nodes.node_mut(parent).right = child;
        }
    }

    /// Calls `f` for every linked slot whose range overlaps `[start,
    /// end)` (an empty range overlaps nothing).
    pub(super) fn for_overlaps<N: Nodes>(
        &self,
        nodes: &N,
        start: u64,
        end: u64,
        f: &mut impl FnMut(u32),
    ) {
        if start < end {
            visit::<N, MAX_PATH>(nodes, self.root, start, end, f);
        }
    }

    /// Checks the invariants of the module docs; panics on a violation.
    /// Returns the number of nodes reachable.
    #[cfg(any(test, debug_assertions))]
    pub(super) fn check<N: Nodes>(&self, nodes: &N) -> u32 {
        let mut last = None;
        let n = check_at(nodes, self.root, u32::MAX, &mut last);
        assert_eq!(n, self.len, "interval tree length");
        n
    }
}

#[inline]
fn key<N: Nodes>(nodes: &N, i: u32) -> (u64, u32) {
    (nodes.node(i).start, i)
}

#[inline]
fn max_end<N: Nodes>(nodes: &N, i: u32) -> u64 {
    if i == NIL {
        0
    } else {
        nodes.node(i).max_end
    }
}

/// Recomputes `max_end` of `i` from its range and its children; returns
/// it.
#[inline]
fn update<N: Nodes>(nodes: &mut N, i: u32) -> u64 {
    let n = *nodes.node(i);
    let m = n
        .end
        .max(max_end(nodes, n.left))
        .max(max_end(nodes, n.right));
    nodes.node_mut(i).max_end = m;
    m
}

/// Splits subtree `t` into keys `< k` and keys `>= k`.
fn split<N: Nodes>(nodes: &mut N, t: u32, k: (u64, u32)) -> (u32, u32) {
    if t == NIL {
        return (NIL, NIL);
    }
    if key(nodes, t) < k {
        let (l, r) = split(nodes, nodes.node(t).right, k);
        nodes.node_mut(t).right = l;
        update(nodes, t);
        (t, r)
    } else {
        let (l, r) = split(nodes, nodes.node(t).left, k);
        nodes.node_mut(t).left = r;
        update(nodes, t);
        (l, t)
    }
}

/// Joins subtrees `a` and `b` where every key of `a` is below every key
/// of `b`.
fn merge<N: Nodes>(nodes: &mut N, a: u32, b: u32) -> u32 {
    if a == NIL {
        return b;
    }
    if b == NIL {
        return a;
    }
    if nodes.node(a).prio > nodes.node(b).prio {
        let r = merge(nodes, nodes.node(a).right, b);
        nodes.node_mut(a).right = r;
        update(nodes, a);
        a
    } else {
        let l = merge(nodes, a, nodes.node(b).left);
        nodes.node_mut(b).left = l;
        update(nodes, b);
        b
    }
}

/// [`Tree::remove`] by recursion, for a path deeper than
/// [`MAX_PATH`].
#[cold]
fn remove_at<N: Nodes>(nodes: &mut N, t: u32, k: (u64, u32), i: u32) -> u32 {
    assert!(t != NIL, "slot {i} is not in the interval index");
    if t == i {
        let n = *nodes.node(t);
        return merge(nodes, n.left, n.right);
    }
    if k < key(nodes, t) {
        let l = remove_at(nodes, nodes.node(t).left, k, i);
        nodes.node_mut(t).left = l;
    } else {
        let r = remove_at(nodes, nodes.node(t).right, k, i);
        nodes.node_mut(t).right = r;
    }
    update(nodes, t);
    t
}

/// Reports the nodes of subtree `t` that overlap `[start, end)`, in key
/// order, without recursion: down the left side while a subtree's largest
/// end passes `start` (pushing the path), then each node popped, and its
/// right subtree the same way; the first node popped that starts at or
/// after `end` ends the walk (every node left on the path starts later).
/// A path deeper than `P` nodes ([`MAX_PATH`]; the tests use a short one)
/// goes on by recursion ([`visit_recursive`]).
fn visit<N: Nodes, const P: usize>(
    nodes: &N,
    mut t: u32,
    start: u64,
    end: u64,
    f: &mut impl FnMut(u32),
) {
    let mut path = [NIL; P];
    let mut depth = 0;
    loop {
        while t != NIL && nodes.node(t).max_end > start {
            if depth == P {
                visit_recursive(nodes, t, start, end, f);
                break;
            }
            path[depth] = t;
            depth += 1;
            t = nodes.node(t).left;
        }
        if depth == 0 {
            return;
        }
        depth -= 1;
        let i = path[depth];
        let n = nodes.node(i);
        if n.start >= end {
            return;
        }
        if n.end > start {
            f(i);
        }
        t = n.right;
    }
}

/// [`visit`] by recursion: the left subtree entered only where its
/// largest end passes `start`, the right one in the loop.
fn visit_recursive<N: Nodes>(nodes: &N, mut t: u32, start: u64, end: u64, f: &mut impl FnMut(u32)) {
    while t != NIL {
        let n = *nodes.node(t);
        if n.max_end <= start {
            return;
        }
        if max_end(nodes, n.left) > start {
            visit_recursive(nodes, n.left, start, end, f);
        }
        if n.start >= end {
            return;
        }
        if n.end > start {
            f(t);
        }
        t = n.right;
    }
}

#[cfg(any(test, debug_assertions))]
fn check_at<N: Nodes>(nodes: &N, t: u32, parent_prio: u32, last: &mut Option<(u64, u32)>) -> u32 {
    if t == NIL {
        return 0;
    }
    let n = *nodes.node(t);
    assert!(
        n.linked && n.large,
        "slot {t} in the tree but not marked linked and large"
    );
    assert!(n.prio <= parent_prio, "heap order broken at slot {t}");
    assert_eq!(
        (n.start, n.end),
        nodes.range(t),
        "slot {t}'s range changed while it was linked"
    );
    let left = check_at(nodes, n.left, n.prio, last);
    let k = key(nodes, t);
    assert!(
        last.is_none_or(|l| l < k),
        "search order broken at slot {t}"
    );
    *last = Some(k);
    let right = check_at(nodes, n.right, n.prio, last);
    let want = n
        .end
        .max(max_end(nodes, n.left))
        .max(max_end(nodes, n.right));
    assert_eq!(n.max_end, want, "max_end of slot {t}");
    left + right + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interval::node::Plain;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u32, u64, u64),
        /// The slot, and whether the removal keeps a path of two nodes at
        /// most (deeper ones take the recursive walk).
        Remove(u32, bool),
        /// The range, and whether the walk keeps a path of two nodes at
        /// most.
        Query(u64, u64, bool),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u32..64, 0u64..200, 1u64..40).prop_map(|(i, s, l)| Step::Insert(i, s, s + l)),
            (0u32..64, any::<bool>()).prop_map(|(i, short)| Step::Remove(i, short)),
            (0u64..240, 1u64..60, any::<bool>()).prop_map(|(s, l, short)| Step::Query(
                s,
                s + l,
                short
            )),
        ]
    }

    proptest! {
        /// The tree alone against a plain list, with its walks' paths cut
        /// short on random steps (so that the recursive fallbacks run):
        /// every query finds exactly the overlapping ranges, in key order,
        /// and the tree stays well formed.
        #[test]
        fn matches_a_linear_scan(steps in proptest::collection::vec(step(), 1..300)) {
            let mut p = Plain::new(64);
            let mut t = Tree::default();
            for s in steps {
                match s {
                    Step::Insert(i, a, b) => {
                        if !p.nodes[i as usize].linked {
                            p.ranges[i as usize] = (a, b);
                            t.insert(&mut p, i);
                        }
                    }
                    Step::Remove(i, short) => {
                        if p.nodes[i as usize].linked {
                            if short {
                                t.remove_with_path::<_, 2>(&mut p, i);
                            } else {
                                t.remove(&mut p, i);
                            }
                        }
                    }
                    Step::Query(a, b, short) => {
                        let mut got = Vec::new();
                        if short {
                            visit::<_, 2>(&p, t.root, a, b, &mut |i| got.push(i));
                        } else {
                            t.for_overlaps(&p, a, b, &mut |i| got.push(i));
                        }
                        let keys: Vec<(u64, u32)> = got.iter().map(|&i| (p.ranges[i as usize].0, i)).collect();
                        prop_assert!(keys.windows(2).all(|w| w[0] < w[1]), "not in key order: {:?}", keys);
                        got.sort_unstable();
                        let want: Vec<u32> = (0..64u32)
                            .filter(|&i| {
                                let (s, e) = p.ranges[i as usize];
                                p.nodes[i as usize].linked && s < b && a < e
                            })
                            .collect();
                        prop_assert_eq!(got, want);
                    }
                }
                t.check(&p);
            }
        }
    }
}
