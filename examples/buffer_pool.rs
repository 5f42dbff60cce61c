//! Tutorial 2: a buffer pool (page cache) for a B-tree.
//!
//! The frames are the pages of one aligned `Region`; a page is read through
//! on a miss and evicted with the clock algorithm; dirty pages are written
//! back in batches, all issued under one explicit plug so that neighbouring
//! pages merge into few requests. Tasks scan and update pages concurrently;
//! at the end every page on disk is checked against a model.
//!
//! Run: `cargo run --release --example buffer_pool [PATH]` (default: a file
//! in a temporary directory under the current directory; PATH is
//! overwritten).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::error::Error as StdError;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use futures::channel::oneshot;
use futures::future::join_all;
use plugio::{Device, DeviceOptions, Error, OpenOptions, Page, Region, RingConfig};
use rand::{rngs::SmallRng, Rng, SeedableRng};

const PAGE_BYTES: usize = 4096;
const FRAMES: usize = 64;
const FILE_PAGES: u64 = 1024;
const UPDATERS: usize = 16;
const UPDATES_PER_TASK: usize = 400;

// ANCHOR: frame
/// One frame of the pool. `page` is `None` while the page is lent to an IO
/// (being read in or written back): nobody may touch the frame then.
struct Frame {
    page: Option<Page>,
    /// Which disk page the frame holds (`None`: free).
    page_no: Option<u64>,
    dirty: bool,
    /// The clock's second-chance bit, set on every hit.
    referenced: bool,
}

/// Tasks waiting for any frame to come back from an IO.
#[derive(Default)]
struct WaitList(RefCell<Vec<oneshot::Sender<()>>>);

impl WaitList {
    fn wait(&self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.0.borrow_mut().push(tx);
        rx
    }
    fn wake_all(&self) {
        for tx in self.0.borrow_mut().drain(..) {
            let _ = tx.send(());
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct PoolStats {
    hits: u64,
    misses: u64,
    evictions: u64,
    write_back_batches: u64,
    pages_written: u64,
}

/// A buffer pool over one device. Single-core: shared with `Rc`, no locks;
/// no `RefCell` borrow is ever held across an `.await`.
struct BufferPool {
    dev: Device,
    frames: RefCell<Vec<Frame>>,
    /// Disk page -> frame, for frames that hold (or are loading) a page.
    table: RefCell<HashMap<u64, usize>>,
    hand: Cell<usize>,
    io_done: WaitList,
    stats: Cell<PoolStats>,
}
// ANCHOR_END: frame

impl BufferPool {
    // ANCHOR: new
    /// A pool of `frames` frames of `PAGE_BYTES`, cut from one allocation
    /// aligned for the device's direct IO.
    fn new(dev: Device, frames: usize) -> BufferPool {
        let align = (dev.geometry().mem_align_bytes() as usize).max(PAGE_BYTES);
        let frames = Region::new(frames * PAGE_BYTES, align)
            .into_pages(PAGE_BYTES)
            .into_iter()
            .map(|page| Frame {
                page: Some(page),
                page_no: None,
                dirty: false,
                referenced: false,
            })
            .collect();
        BufferPool {
            dev,
            frames: RefCell::new(frames),
            table: RefCell::new(HashMap::new()),
            hand: Cell::new(0),
            io_done: WaitList::default(),
            stats: Cell::new(PoolStats::default()),
        }
    }
    // ANCHOR_END: new

    fn count(&self, f: impl FnOnce(&mut PoolStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    // ANCHOR: access
    /// Runs `f` on the bytes of disk page `page_no`, reading it in first on
    /// a miss.
    async fn with_page<R>(&self, page_no: u64, f: impl FnOnce(&[u8]) -> R) -> Result<R, Error> {
        let i = self.fetch(page_no).await?;
        let frames = self.frames.borrow();
        let page = frames[i]
            .page
            .as_ref()
            .expect("fetch returns a resident frame");
        Ok(f(page.as_slice()))
    }

    /// Runs `f` on the bytes of disk page `page_no` and marks it dirty.
    async fn modify<R>(&self, page_no: u64, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, Error> {
        let i = self.fetch(page_no).await?;
        let mut frames = self.frames.borrow_mut();
        let frame = &mut frames[i];
        frame.dirty = true;
        let page = frame.page.as_mut().expect("fetch returns a resident frame");
        Ok(f(page.as_mut_slice()))
    }
    // ANCHOR_END: access

    // ANCHOR: fetch
    /// The frame holding `page_no`, resident (not lent to an IO) when this
    /// returns. Nothing awaits between the return and the caller's use, so
    /// the frame cannot be evicted in between.
    async fn fetch(&self, page_no: u64) -> Result<usize, Error> {
        loop {
            let mapped = self.table.borrow().get(&page_no).copied();
            if let Some(i) = mapped {
                if self.hit(i) {
                    return Ok(i);
                }
                // Being read in or written back by another task.
                let _ = self.io_done.wait().await;
                continue;
            }
            if let Some(i) = self.clean_victim() {
                self.count(|s| s.misses += 1);
                return self.read_in(i, page_no).await;
            }
            if self.has_dirty_resident() {
                self.write_back().await?; // makes clean victims
            } else {
                let _ = self.io_done.wait().await; // every frame is in IO
            }
        }
    }

    /// Counts a hit on frame `i` if it is resident; `false` while it is
    /// lent to an IO.
    fn hit(&self, i: usize) -> bool {
        let mut frames = self.frames.borrow_mut();
        if frames[i].page.is_none() {
            return false;
        }
        frames[i].referenced = true;
        self.count(|s| s.hits += 1);
        true
    }

    /// The clock: sweeps the frames from the hand, giving referenced frames
    /// a second chance; returns a free or clean resident frame, or `None`
    /// when every candidate is dirty or in IO.
    fn clean_victim(&self) -> Option<usize> {
        let mut frames = self.frames.borrow_mut();
        let n = frames.len();
        for _ in 0..2 * n {
            let i = self.hand.get();
            self.hand.set((i + 1) % n);
            let frame = &mut frames[i];
            if frame.page.is_none() || frame.dirty {
                continue;
            }
            if frame.page_no.is_some() && frame.referenced {
                frame.referenced = false;
                continue;
            }
            return Some(i);
        }
        None
    }
    // ANCHOR_END: fetch

    fn has_dirty_resident(&self) -> bool {
        self.frames
            .borrow()
            .iter()
            .any(|f| f.dirty && f.page.is_some())
    }

    // ANCHOR: read_in
    /// Maps frame `i` to `page_no` and reads the page in. Other tasks asking
    /// for `page_no` meanwhile find the mapping and wait.
    async fn read_in(&self, i: usize, page_no: u64) -> Result<usize, Error> {
        let page = {
            let mut frames = self.frames.borrow_mut();
            let mut table = self.table.borrow_mut();
            if let Some(old) = frames[i].page_no.replace(page_no) {
                table.remove(&old);
                self.count(|s| s.evictions += 1);
            }
            table.insert(page_no, i);
            frames[i].referenced = true;
            frames[i].page.take().expect("victim is resident")
        };
        let (result, mut page) = self.dev.read_at(page, page_no * PAGE_BYTES as u64).await;
        let mut frames = self.frames.borrow_mut();
        if let Ok(n) = result {
            page.as_mut_slice()[n..].fill(0); // past the end of the file
        } else {
            frames[i].page_no = None;
            self.table.borrow_mut().remove(&page_no);
        }
        frames[i].page = Some(page);
        drop(frames);
        self.io_done.wake_all();
        result.map(|_| i)
    }
    // ANCHOR_END: read_in

    // ANCHOR: write_back
    /// Writes every dirty resident page back, as one batch: all the writes
    /// are issued in one tick under an explicit plug for exactly that many
    /// IOs, so the plug is not flushed early at `plug_max_count`, and
    /// neighbouring pages merge (sorted by offset) into few requests.
    async fn write_back(&self) -> Result<(), Error> {
        let mut batch: Vec<(usize, u64, Page)> = {
            let mut frames = self.frames.borrow_mut();
            frames
                .iter_mut()
                .enumerate()
                .filter(|(_, f)| f.dirty && f.page.is_some())
                .filter_map(|(i, f)| Some((i, f.page_no?, f.page.take()?)))
                .collect()
        };
        if batch.is_empty() {
            return Ok(());
        }
        batch.sort_unstable_by_key(|&(_, page_no, _)| page_no);
        let nr_ios = batch.len();
        let plug = self.dev.plug(nr_ios)?;
        let writes = batch.into_iter().map(|(i, page_no, page)| async move {
            let (result, page) = self.dev.write_at(page, page_no * PAGE_BYTES as u64).await;
            (i, result, page)
        });
        // `join_all` polls every write once in this tick: all `nr_ios` bios
        // enter the plug before the tick ends and the plug is flushed.
        let done = join_all(writes).await;
        drop(plug);
        let mut first_error = None;
        {
            let mut frames = self.frames.borrow_mut();
            for (i, result, page) in done {
                frames[i].page = Some(page);
                match result {
                    Ok(_) => frames[i].dirty = false,
                    Err(e) => {
                        first_error.get_or_insert(e); // stays dirty
                    }
                }
            }
        }
        self.io_done.wake_all();
        self.count(|s| {
            s.write_back_batches += 1;
            s.pages_written += nr_ios as u64;
        });
        first_error.map_or(Ok(()), Err)
    }
    // ANCHOR_END: write_back
}

/// A page as the B-tree stores it: its own number, then an update counter.
fn page_header(bytes: &[u8]) -> (u64, u64) {
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
    (word(0), word(8))
}

/// Writes the initial file through `dev`: page `n` holds `n` and a zero
/// counter; then makes it durable.
async fn create_file(dev: &Device) -> Result<(), plugio::Error> {
    let mut bytes = dev.alloc_buf(FILE_PAGES as usize * PAGE_BYTES);
    bytes.as_mut_slice().fill(0);
    for (n, page) in bytes.as_mut_slice().chunks_mut(PAGE_BYTES).enumerate() {
        page[0..8].copy_from_slice(&(n as u64).to_le_bytes());
    }
    let (written, _) = dev.write_all_at(bytes, 0).await;
    written?;
    dev.sync_all().await
}

// ANCHOR: workload
/// Scans and updates run together: a scanner reads leaves in key order,
/// updaters bump counters, mostly in a "hot" window of neighbouring pages
/// that moves forward (like inserts at the right edge of a B-tree), and
/// sometimes anywhere. Evictions of dirty pages trigger batched write-back.
async fn run(path: &Path) -> Result<(), Box<dyn StdError>> {
    let options = DeviceOptions {
        // A write-back batch may hold FRAMES pages (256 KiB): let it stay in
        // one plug instead of flushing at the default 128 KiB.
        plug_flush_bytes: (FRAMES * PAGE_BYTES) as u64,
        ..DeviceOptions::default()
    };
    // With `nomerges: 2` every page is its own request (the check below).
    let merging = options.nomerges < 2;
    let dev = OpenOptions::new()
        .create(true)
        .truncate(true)
        .device_options(options)
        .open(path)
        .await?;
    create_file(&dev).await?;
    // The pool's own writes are counted from here (not the file's fill).
    let at_start = dev.iostats();
    let pool = Rc::new(BufferPool::new(dev.clone(), FRAMES));
    let expected = Rc::new(RefCell::new(vec![0u64; FILE_PAGES as usize]));

    let scanner = {
        let pool = pool.clone();
        plugio::spawn_local(async move {
            for n in 0..FILE_PAGES {
                let (page_no, _) = pool.with_page(n, page_header).await?;
                assert_eq!(page_no, n, "page {n} holds page {page_no}");
            }
            Ok::<_, plugio::Error>(())
        })
    };
    let updaters: Vec<_> = (0..UPDATERS)
        .map(|t| {
            let (pool, expected) = (pool.clone(), expected.clone());
            plugio::spawn_local(async move {
                let mut rng = SmallRng::seed_from_u64(t as u64);
                for k in 0..UPDATES_PER_TASK {
                    let hot_start = (k as u64 * FILE_PAGES / UPDATES_PER_TASK as u64) / 2;
                    let n = if rng.gen_ratio(7, 8) {
                        hot_start + rng.gen_range(0..32)
                    } else {
                        rng.gen_range(0..FILE_PAGES)
                    };
                    pool.modify(n, |bytes| {
                        let (page_no, counter) = page_header(bytes);
                        assert_eq!(page_no, n, "page {n} holds page {page_no}");
                        bytes[8..16].copy_from_slice(&(counter + 1).to_le_bytes());
                    })
                    .await?;
                    expected.borrow_mut()[n as usize] += 1;
                }
                Ok::<_, plugio::Error>(())
            })
        })
        .collect();
    scanner.await??;
    for u in updaters {
        u.await??;
    }
    let before_checkpoint = dev.iostats();
    pool.write_back().await?; // the checkpoint
    let checkpoint = dev.iostats();
    dev.sync_data().await?;
    // ANCHOR_END: workload

    // ANCHOR: check
    let disk = dev
        .read_alloc_at(0, FILE_PAGES as usize * PAGE_BYTES)
        .await?;
    for (n, bytes) in disk.as_slice().chunks(PAGE_BYTES).enumerate() {
        let (page_no, counter) = page_header(bytes);
        assert_eq!(page_no, n as u64, "page {n} on disk");
        assert_eq!(counter, expected.borrow()[n], "update counter of page {n}");
    }
    let s = pool.stats.get();
    let io = dev.iostats();
    let total_updates = (UPDATERS * UPDATES_PER_TASK) as u64;
    assert_eq!(expected.borrow().iter().sum::<u64>(), total_updates);
    // A pool as large as the file never evicts: the checkpoint is its only
    // write-back.
    if (FRAMES as u64) < FILE_PAGES {
        assert!(s.evictions > 0 && s.write_back_batches > 1, "{s:?}");
    }
    let write_requests = io.write.ios - at_start.write.ios;
    let merged = io.write.merges - at_start.write.merges;
    if merging {
        assert!(
            write_requests < s.pages_written,
            "no write was merged: {io:?}"
        );
    } else {
        assert_eq!(write_requests, s.pages_written, "{io:?}");
    }
    println!(
        "buffer pool: {FRAMES} frames over {FILE_PAGES} pages; {} hits, {} misses, {} evictions",
        s.hits, s.misses, s.evictions
    );
    println!(
        "write-back: {} pages in {} batches became {} write requests ({} merged); \
         the checkpoint wrote {} pages as {} requests",
        s.pages_written,
        s.write_back_batches,
        write_requests,
        merged,
        checkpoint.bios - before_checkpoint.bios,
        checkpoint.write.ios - before_checkpoint.write.ios,
    );
    println!("{}", io.diskstats_line("pool"));
    Ok(())
}
// ANCHOR_END: check

fn main() -> std::process::ExitCode {
    match try_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("buffer_pool: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn try_main() -> Result<(), Box<dyn StdError>> {
    let dir = tempfile::tempdir_in(std::env::current_dir()?)?;
    let given = std::env::args().nth(1).map(PathBuf::from);
    // Without an argument the file lives in a temporary directory that is
    // deleted on exit: say so rather than print a path that will not exist.
    let shown = given.as_ref().map_or_else(
        || "a temporary file, deleted on exit".to_owned(),
        |p| p.display().to_string(),
    );
    let path = given.unwrap_or_else(|| dir.path().join("pool.db"));
    let ex = plugio::runtime::local(RingConfig::default())?;
    ex.run(run(&path))?;
    println!(
        "buffer_pool: every page on disk matches the model ({})",
        shown
    );
    Ok(())
}
