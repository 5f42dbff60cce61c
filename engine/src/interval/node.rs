//! The index fields of a request slot, and the slab's view of them
//! (shared by the two parts of the index).

/// No node (and no link).
pub(crate) const NIL: u32 = u32::MAX;

/// The index fields of one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Node {
    pub linked: bool,
    /// The range is in the tree (more than two chunks), not the buckets.
    pub large: bool,
    /// The slot's range `[start, end)` as it was linked.
    pub start: u64,
    pub end: u64,
    /// Bucket links 0 and 1, for a small range:
    /// the next and previous entries, each a slot shifted left by 2 with
    /// the link's number in the low bits.
    pub next: [u32; 2],
    pub prev: [u32; 2],
    /// Tree links, for a large range.
    pub left: u32,
    pub right: u32,
    pub prio: u32,
    /// The largest end offset (exclusive) in this node's subtree.
    pub max_end: u64,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            linked: false,
            large: false,
            start: 0,
            end: 0,
            next: [NIL; 2],
            prev: [NIL; 2],
            left: NIL,
            right: NIL,
            prio: 0,
            max_end: 0,
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

/// Nodes with ranges of their own, for the index's tests.
#[cfg(test)]
pub(super) struct Plain {
    pub nodes: Vec<Node>,
    pub ranges: Vec<(u64, u64)>,
}

#[cfg(test)]
impl Plain {
    /// `n` unlinked slots, all on `(0, 0)`.
    pub fn new(n: usize) -> Plain {
        Plain {
            nodes: vec![Node::default(); n],
            ranges: vec![(0, 0); n],
        }
    }
}

#[cfg(test)]
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
