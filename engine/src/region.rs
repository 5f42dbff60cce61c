//! [`Region`] and [`Page`]: one aligned allocation cut into owned,
//! disjoint pages, as a database buffer pool lays out its frames.
//!
//! Pages of one region are adjacent in memory, so reads of adjacent blocks
//! into adjacent frames merge into one request with one contiguous segment.
//!
//! Invariants:
//! - The pages of a region never overlap; each is owned by exactly one
//!   [`Page`] value (or by the bio it was lent to), so handing out `&mut`
//!   to a page's bytes is sound.
//! - The allocation lives until the last page is dropped (each page holds
//!   an `Arc` of it), so a page given to the kernel keeps its memory alive
//!   even if its future is dropped.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

/// The allocation behind a region's pages.
#[derive(Debug)]
struct RegionAlloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is plain memory; access to its bytes goes through
// pages, which are disjoint and uniquely owned.
unsafe impl Send for RegionAlloc {}
// SAFETY: as above; `RegionAlloc` itself exposes no access to the bytes.
unsafe impl Sync for RegionAlloc {}

impl Drop for RegionAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `Region::new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A zeroed, aligned allocation to be cut into pages.
#[derive(Debug)]
pub struct Region {
    alloc: Arc<RegionAlloc>,
    len_bytes: usize,
}

impl Region {
    /// Allocates `len_bytes` zeroed bytes aligned to `align_bytes` (rounded
    /// up to a power of two; use the device's `mem_align_bytes`, or 4096).
    ///
    /// # Panics
    /// When `len_bytes` is 0; when `align_bytes` has no power of two at or
    /// above it in a `usize`, or `len_bytes` rounded up to the alignment
    /// passes `isize::MAX` (checked before allocating); when the
    /// allocation fails (a panic, not the allocator's abort).
    pub fn new(len_bytes: usize, align_bytes: usize) -> Region {
        assert!(len_bytes > 0, "Region::new: a region needs at least 1 byte");
        let Some(align) = align_bytes.max(1).checked_next_power_of_two() else {
            panic!("Region::new: alignment {align_bytes} has no power of two above it in a usize");
        };
        let layout = Layout::from_size_align(len_bytes, align).unwrap_or_else(|_| {
            panic!("Region::new: {len_bytes} bytes aligned to {align} pass isize::MAX")
        });
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            panic!("Region::new: could not allocate {len_bytes} bytes aligned to {align}");
        };
        Region {
            alloc: Arc::new(RegionAlloc { ptr, layout }),
            len_bytes,
        }
    }

    /// Cuts the region into pages of `page_bytes` (the last one shorter if
    /// the length is not a multiple), in address order.
    ///
    /// # Panics
    /// When `page_bytes` is 0.
    pub fn into_pages(self, page_bytes: usize) -> Vec<Page> {
        assert!(page_bytes > 0, "Region::into_pages: page_bytes is 0");
        (0..self.len_bytes)
            .step_by(page_bytes)
            .map(|offset| Page {
                alloc: self.alloc.clone(),
                offset,
                len_bytes: page_bytes.min(self.len_bytes - offset),
            })
            .collect()
    }
}

/// One page of a [`Region`]: owned, disjoint from every other page.
#[derive(Debug)]
pub struct Page {
    alloc: Arc<RegionAlloc>,
    offset: usize,
    len_bytes: usize,
}

impl Page {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len_bytes
    }

    /// True for a zero-length page (never made by `into_pages`).
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// The page's first byte.
    pub fn as_ptr(&self) -> *const u8 {
        // SAFETY: `offset` is inside the allocation (made by `into_pages`).
        unsafe { self.alloc.ptr.as_ptr().add(self.offset) }
    }

    /// The page's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the range is inside the allocation, initialised (zeroed
        // at allocation), and no other page covers it.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len_bytes) }
    }

    /// The page's bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr().cast_mut(), self.len_bytes) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_adjacent_and_disjoint() {
        let mut pages = Region::new(16384 + 100, 4096).into_pages(4096);
        assert_eq!(pages.len(), 5);
        assert_eq!(pages[4].len(), 100);
        assert_eq!(pages[0].as_ptr() as usize % 4096, 0);
        for w in pages.windows(2) {
            assert_eq!(w[0].as_ptr() as usize + 4096, w[1].as_ptr() as usize);
        }
        pages[1].as_mut_slice().fill(7);
        assert!(pages[0].as_slice().iter().all(|&b| b == 0));
        assert!(pages[2].as_slice().iter().all(|&b| b == 0));
        drop(pages.remove(0));
        assert!(pages[0].as_slice().iter().all(|&b| b == 7));
    }

    /// Sizes no allocation can have panic with a message that says so,
    /// before allocating (an alignment of `usize::MAX` overflowed in a
    /// debug build: found by an API audit helper).
    #[test]
    fn impossible_sizes_panic_before_allocating() {
        for (len, align, says) in [
            (4096, usize::MAX, "no power of two"),
            (usize::MAX, 4096, "pass isize::MAX"),
            (0, 4096, "at least 1 byte"),
        ] {
            let e = std::panic::catch_unwind(|| Region::new(len, align)).expect_err("panics");
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            assert!(msg.contains(says), "{len} {align}: {msg}");
        }
    }
}
