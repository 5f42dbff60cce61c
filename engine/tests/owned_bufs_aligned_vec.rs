//! A `Vec<u8>` whose memory happens to be aligned for O_DIRECT goes to the
//! kernel as is, with no bounce. This test binary's allocator puts every
//! allocation of 4096 bytes or more on a 4096 boundary, so a `Vec` of
//! 8192 bytes is aligned.

use std::alloc::{GlobalAlloc, Layout, System};

use plugio_device::RingConfig;
use plugio_engine::{Device, DeviceOptions};

/// The system allocator with page alignment for allocations of a page or
/// more (the same rule on alloc and dealloc, so layouts always match).
struct PageAligned;

fn layout_for(layout: Layout) -> Layout {
    if layout.size() >= 4096 && layout.align() < 4096 {
        Layout::from_size_align(layout.size(), 4096).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: forwards to `System` with a layout derived the same way for
// every call on one block, so each dealloc matches its alloc.
unsafe impl GlobalAlloc for PageAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the layout has the caller's non-zero size.
        unsafe { System.alloc(layout_for(layout)) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: allocated by `alloc` above with `layout_for(layout)`.
        unsafe { System.dealloc(ptr, layout_for(layout)) }
    }
}

#[global_allocator]
static ALLOC: PageAligned = PageAligned;

#[test]
fn an_aligned_vec_is_not_bounced() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let path = dir.path().join("aligned-vec");
    std::fs::write(&path, vec![0u8; 65536]).expect("fixture");
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async {
        let dev = Device::open(&path, DeviceOptions::default()).expect("open O_DIRECT");
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(data.as_ptr() as usize % 4096, 0, "the allocator aligned it");
        let (r, _) = dev.write_at(data.clone(), 8192).await;
        assert_eq!(r.expect("write"), 8192);
        let into = Vec::with_capacity(8192);
        assert_eq!(into.as_ptr() as usize % 4096, 0);
        let (r, back) = dev.read_at(into, 8192).await;
        assert_eq!(r.expect("read"), 8192);
        assert_eq!(back, data);
        assert_eq!(dev.iostats().bounce_ios, 0, "aligned memory is used as is");
    });
}
