//! [`Tag`] and [`TagBatch`]: a request slot number and an inline list of them.
//!
//! Invariants: a `TagBatch` holds at most [`MAX_BATCH_TAGS`] tags, inline (no
//! allocation), and is plain data: dropping it frees nothing. The holder puts
//! every tag back with [`TagSet::put`](super::TagSet::put) or
//! [`TagSet::put_batch`](super::TagSet::put_batch) when the request completes.

use std::fmt;
use std::ops::Deref;

/// The most tags one [`TagBatch`] holds, and so the most one
/// [`TagSet::acquire`](super::TagSet::acquire) asks for: one word's worth.
pub const MAX_BATCH_TAGS: usize = 64;

/// A tag: a request's slot index in its device's request array, in
/// `0..depth`, also used as the SQE `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct Tag(u32);

impl Tag {
    /// The tag with slot index `index` (e.g. rebuilt from a CQE's
    /// `user_data`). Only tags handed out by a [`TagSet`](super::TagSet) may
    /// be put back into it.
    pub const fn new(index: u32) -> Self {
        Self(index)
    }

    /// The slot index as a `usize`, for indexing the request array.
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The slot index as a `u32`.
    pub const fn as_u32(self) -> u32 {
        self.0
    }
}

impl From<Tag> for u64 {
    /// The tag as an SQE `user_data` value.
    fn from(tag: Tag) -> u64 {
        u64::from(tag.0)
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tag {}", self.0)
    }
}

/// Tags `offset + i` for each set bit `i` of `mask` (a batch get's result).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MaskTags {
    pub(crate) offset: u32,
    pub(crate) mask: u64,
}

impl Iterator for MaskTags {
    type Item = Tag;

    fn next(&mut self) -> Option<Tag> {
        if self.mask == 0 {
            return None;
        }
        let bit = self.mask.trailing_zeros();
        self.mask &= self.mask - 1;
        Some(Tag(self.offset + bit))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let len = self.mask.count_ones() as usize;
        (len, Some(len))
    }
}

/// Up to [`MAX_BATCH_TAGS`] tags, stored inline: what
/// [`TagSet::acquire`](super::TagSet::acquire) resolves to. Derefs to
/// `[Tag]`.
#[derive(Clone)]
pub struct TagBatch {
    tags: [Tag; MAX_BATCH_TAGS],
    len: usize,
}

impl TagBatch {
    /// An empty batch.
    pub const fn new() -> Self {
        Self {
            tags: [Tag(0); MAX_BATCH_TAGS],
            len: 0,
        }
    }

    /// The tags held, in the order they were taken.
    pub fn as_slice(&self) -> &[Tag] {
        &self.tags[..self.len]
    }

    /// Room left, in tags.
    pub fn remaining_capacity(&self) -> usize {
        MAX_BATCH_TAGS - self.len
    }
}

impl Default for TagBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl Deref for TagBatch {
    type Target = [Tag];

    fn deref(&self) -> &[Tag] {
        self.as_slice()
    }
}

impl fmt::Debug for TagBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Extend<Tag> for TagBatch {
    /// Appends tags.
    ///
    /// # Panics
    /// If the batch would hold more than [`MAX_BATCH_TAGS`] tags (a dropped
    /// tag would leak its slot, so this is refused loudly). The tag set's own
    /// calls never ask for more than the room left.
    fn extend<I: IntoIterator<Item = Tag>>(&mut self, iter: I) {
        for tag in iter {
            assert!(
                self.len < MAX_BATCH_TAGS,
                "TagBatch holds at most {MAX_BATCH_TAGS} tags"
            );
            self.tags[self.len] = tag;
            self.len += 1;
        }
    }
}

impl<'a> IntoIterator for &'a TagBatch {
    type Item = &'a Tag;
    type IntoIter = std::slice::Iter<'a, Tag>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}
