//! [`DeviceShared`]: what all cores share about one open device: its
//! backend, options and limits ([`MAX_IO_BYTES`]), its tag sets, its
//! counters, the count of [`Device`](crate::Device) handles (the last
//! [`DeviceShared::drop_handle`] closes it), and the bios whose futures
//! were dropped on another thread, which their core adopts
//! ([`DeviceShared::adopt_remote_orphans`], on that core's thread, with its
//! bio table).
//!
//! Invariants: immutable after open except for the tag sets (lock-free),
//! the counters, the handle count and the remote orphans (a `Mutex` and a
//! flag); `max_request_bytes` is a positive multiple of the device's
//! logical block size and at most [`MAX_IO_BYTES`]. Each lock of a device
//! (its cores' counters, the cores to wake at close, the remote orphans)
//! is a [`ForkLocal`]: a forked child that reads an inherited device's
//! iostats or drops it never waits for a lock a thread of the parent held
//! at the fork. A device is used only in the fork generation it was opened
//! in ([`DeviceShared::inherited`]): a child's IO on its parent's device
//! is refused (its tags may be held by the parent's requests, which only
//! the parent completes).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError, Weak};

use plugio_device::{Backend, DmaBuf, Error, Geometry};
use plugio_executor::fork::ForkLocal;

use crate::bio::{bury_kept, drop_kept, BioId, BioTable, Keep};
use crate::options::{DeviceOptions, TagSharing};
use crate::stats::{CoreCounters, IoStats};
use crate::tag::{TagOptions, TagSet, TagStats};

/// The largest single IO in bytes (what one `pread` may move, rounded down
/// to 4 KiB): `0x7fff_f000`. Larger IOs are refused; IOs above the
/// device's request limit but below this are split into several requests.
pub const MAX_IO_BYTES: u64 = plugio_device::MAX_RW_BYTES;

/// A bio whose future was dropped on another thread: its core's uid, its
/// id, and the memory the kernel may still use.
pub(crate) type RemoteOrphan = (u64, BioId, Option<Keep>);

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

impl Drop for DeviceShared {
    /// Frees the memory of this fork generation's remote orphans (a
    /// forked child's drop leaves the parent's alone: the parent's IO may
    /// still use it there).
    fn drop(&mut self) {
        let orphans = std::mem::take(
            &mut *self
                .remote_orphans
                .get()
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (_, _, keep) in orphans {
            drop_kept(keep);
        }
    }
}

/// [`DeviceShared::core_wakers`]: one waker per core that used the device,
/// and the fork generation they belong to.
///
/// Dropped with the device state, after its backend (declared later in
/// [`DeviceShared`]), it wakes those cores once more: each core's ring
/// unregisters a closed backend's file only at a park after the backend
/// is gone, and the cores that let go of the device before the last one
/// did had parked already. Without this wake their rings kept the file
/// open until they next ran (found by a break-it helper: a file used by
/// two cores stayed open 20 s after its last handle was dropped).
struct CoreWakers {
    generation: u64,
    /// Each core's waker, with its counters (a core whose counters only
    /// the device still holds is gone: see [`DeviceShared::register_core`]).
    list: Mutex<Vec<CoreWaker>>,
}

/// A core's counters (to tell whether it is gone) and its waker.
type CoreWaker = (Weak<CoreCounters>, Arc<dyn plugio_executor::Unpark>);

impl Default for CoreWakers {
    fn default() -> Self {
        Self {
            generation: plugio_executor::fork::generation(),
            list: Mutex::new(Vec::new()),
        }
    }
}

impl Drop for CoreWakers {
    fn drop(&mut self) {
        // A forked child never wakes its parent's cores (their wake
        // eventfds are shared with the parent).
        if self.generation != plugio_executor::fork::generation() {
            return;
        }
        let list = self.list.get_mut().unwrap_or_else(PoisonError::into_inner);
        for (_, core) in list.drain(..) {
            core.unpark();
        }
    }
}

impl std::fmt::Debug for CoreWakers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self
            .list
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        write!(f, "CoreWakers({n})")
    }
}

/// One open device, shared by every handle and core.
#[derive(Debug)]
pub(crate) struct DeviceShared {
    /// Unique for the life of the process.
    pub id: u64,
    pub path: Option<PathBuf>,
    /// Declared before `core_wakers`, so dropped before them (their drop
    /// wakes the cores to unregister its file).
    pub backend: Arc<dyn Backend>,
    pub geometry: Geometry,
    /// The backend's check is `check_op` on `geometry` alone
    /// (`Backend::checks_geometry_only`): the engine runs it inline.
    pub geometry_check_only: bool,
    pub opts: DeviceOptions,
    /// One tag set (shared tags) or one per core slice.
    pub tag_sets: Vec<TagSet>,
    /// Largest request in bytes (multiple of the logical block size).
    pub max_request_bytes: u64,
    /// Largest request merging may build (at most `max_request_bytes`).
    pub max_merge_bytes: u64,
    /// Largest request of a range op without memory (discard, write
    /// zeroes, fallocate): where the backend takes the range whole (a
    /// file's `fallocate`, a block device's ioctl, whose kernel splits it
    /// itself) [`MAX_IO_BYTES`] in blocks, else (an NVMe namespace, whose
    /// commands have limits, or a `max_request_bytes` option)
    /// `max_request_bytes`. Splitting a 1 GiB discard at a file's 1 MiB
    /// read/write limit built 1,024 requests for one `fallocate`'s work.
    pub max_range_request_bytes: u64,
    /// Set when a `write_zeroes` whose support was unknown came back
    /// `Unsupported`: later calls write the zeroes in program order at
    /// once (`crate::zeroes`). Relaxed: a hint, not an order.
    pub zeroes_refused: AtomicBool,
    /// Handles ([`Device`](crate::Device) values) alive; 0 = closed.
    pub handles: AtomicUsize,
    /// The fork generation the device was opened in
    /// (`plugio_executor::fork::generation`); see
    /// [`DeviceShared::inherited`].
    pub fork_generation: u64,
    /// The iostats counters of every core that used the device. A forked
    /// child's instance starts with the parent's (their counts as of the
    /// fork), unless a thread of the parent held the lock then.
    counters: ForkLocal<Mutex<Vec<Arc<CoreCounters>>>>,
    /// How to wake each core that used the device: the last handle's drop
    /// wakes them, so that an idle core lets go of the device (and closes
    /// its file) at the end of the tick the wake brings, not when it next
    /// happens to run. Empty in a forked child (the parent's cores are not
    /// there).
    core_wakers: ForkLocal<CoreWakers>,
    /// Bios of this device whose futures were dropped on a thread other
    /// than their core's: `(core uid, bio, the memory it keeps)`. Their
    /// core takes its own at its next completion batch or plug flush on
    /// this device. Empty in a forked child (the parent's cores, which
    /// alone could finish those bios, are not there).
    remote_orphans: ForkLocal<Mutex<Vec<RemoteOrphan>>>,
    /// `remote_orphans` is not empty (one load per batch to check).
    remote_orphans_pending: AtomicBool,
    /// `(memory, block)` alignments a caller's buffer must meet to be used
    /// as is; `None` when any memory goes (buffered IO) or bouncing is off
    /// (`DeviceOptions::bounce_unaligned`: the check then refuses it).
    pub bounce_align: Option<(usize, usize)>,
    /// The device's `tracing` span (`plugio_device`, with `dev`, `path`,
    /// `backend`): the parent of the engine's events about this device.
    /// Disabled (a few words, nothing recorded) when no subscriber is
    /// interested at `info` when the device opens.
    pub span: tracing::Span,
}

/// The default largest request of a device (`DeviceOptions::
/// max_request_bytes: None`). Where plugio hands reads and writes to the
/// kernel's block layer (a block device through io_uring or the sync
/// pool), the kernel splits each op at the device's `max_sectors_kb`
/// itself, per bio, at no cost of another SQE, io-wq item or CQE; so a
/// request stops at the larger of that limit and the regular-file default
/// (1 MiB, [`FILE_MAX_SECTORS_KB`](plugio_device::geometry::FILE_MAX_SECTORS_KB)),
/// not at the device's limit: zram's 124 KiB would cut each tick's 32
/// merged 4 KiB reads into a 124 KiB request and a lone 4 KiB one. Where
/// plugio talks to the device itself (NVMe passthrough: the device's MDTS)
/// and for the simulated device, the device's limit holds.
fn default_request_bytes(geometry: &Geometry, backend: plugio_device::BackendKind) -> u64 {
    use plugio_device::geometry::{DeviceKind, FILE_MAX_SECTORS_KB};
    use plugio_device::BackendKind;
    let device = geometry.max_request_bytes();
    match (backend, geometry.kind) {
        (BackendKind::Uring | BackendKind::Sync, DeviceKind::BlockDevice) => {
            device.max(u64::from(FILE_MAX_SECTORS_KB) * 1024)
        }
        _ => device,
    }
}

impl DeviceShared {
    /// Builds the shared state over an opened backend.
    pub fn new(
        backend: Arc<dyn Backend>,
        path: Option<PathBuf>,
        opts: DeviceOptions,
    ) -> Result<Self, Error> {
        opts.validate()?;
        let geometry = backend.geometry().clone();
        // The depth of each slice: an even split, the remainder one more
        // each to the first slices (a truncated split lost it: depth 10
        // over 4 cores gave 8 tags; found by a docs audit).
        let slices = match opts.tag_sharing {
            TagSharing::Shared => 1,
            TagSharing::PerCore { cores } => cores,
        };
        let depth_of =
            |slice: u32| opts.queue_depth / slices + u32::from(slice < opts.queue_depth % slices);
        let tag_opts = TagOptions {
            batch: opts.tag_batch,
            batch_retry: opts.tag_batch_retry,
            ..TagOptions::default()
        };
        let tag_sets = (0..slices)
            .map(|slice| TagSet::new(depth_of(slice), tag_opts.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| crate::options::invalid(format!("tag set: {e:?}")))?;
        // Splits happen at multiples of this, so every part stays aligned
        // for direct IO (offset, length and buffer address alike).
        let block = u64::from(
            geometry
                .logical_block_bytes
                .max(geometry.mem_align_bytes())
                .max(geometry.offset_align_bytes())
                .max(1),
        )
        .next_power_of_two();
        let limit = opts
            .max_request_bytes
            .unwrap_or_else(|| default_request_bytes(&geometry, backend.kind()))
            .min(MAX_IO_BYTES);
        let max_request_bytes = (limit / block * block).max(block);
        let max_merge_bytes = opts
            .max_merge_bytes
            .unwrap_or(max_request_bytes)
            .min(max_request_bytes);
        let max_range_request_bytes = if opts.max_request_bytes.is_none()
            && backend.kind() != plugio_device::BackendKind::NvmePassthrough
        {
            (MAX_IO_BYTES / block * block).max(max_request_bytes)
        } else {
            max_request_bytes
        };
        let bounce_align = bounce_align(&geometry, &opts);
        // Relaxed: a unique counter; no other memory depends on it.
        let id = NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed);
        let span = tracing::info_span!(
            "plugio_device",
            dev = id,
            path = ?path,
            backend = ?backend.kind()
        );
        tracing::debug!(
            parent: &span,
            queue_depth = opts.queue_depth,
            max_request_bytes,
            logical_block_bytes = geometry.logical_block_bytes,
            "device opened"
        );
        Ok(Self {
            id,
            span,
            path,
            geometry_check_only: backend.checks_geometry_only(),
            backend,
            geometry,
            opts,
            tag_sets,
            max_request_bytes,
            max_merge_bytes,
            max_range_request_bytes,
            zeroes_refused: AtomicBool::new(false),
            // The first entry: the sums of the cores that are gone.
            counters: ForkLocal::new(|| Mutex::new(vec![Arc::default()])),
            core_wakers: ForkLocal::new(CoreWakers::default),
            handles: AtomicUsize::new(1),
            fork_generation: {
                // Counted from here on: a fork after the open is seen.
                plugio_executor::fork::install();
                plugio_executor::fork::generation()
            },
            remote_orphans: ForkLocal::new(|| Mutex::new(Vec::new())),
            remote_orphans_pending: AtomicBool::new(false),
            bounce_align,
        })
    }

    /// A buffer aligned for the device's direct IO (see
    /// [`Device::alloc_buf`](crate::Device::alloc_buf)).
    pub fn alloc_buf(&self, len_bytes: usize) -> DmaBuf {
        let align = self.geometry.mem_align_bytes() as usize;
        if self.opts.buffer_cache && align <= plugio_device::buf::cache::CACHE_ALIGN_BYTES {
            DmaBuf::registered(len_bytes, align).unwrap_or_else(|| DmaBuf::cached(len_bytes))
        } else {
            DmaBuf::heap(len_bytes, align)
        }
    }

    /// Records that the future of bio `id` of core `uid` was dropped on
    /// another thread (it cannot touch that core's bio table), with the
    /// memory the bio must keep until it completes.
    pub fn orphan_remote(&self, uid: u64, id: BioId, keep: Option<Keep>) {
        self.remote_orphans
            .get()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((uid, id, keep));
        // Release: the entry is visible to whoever sees the flag.
        self.remote_orphans_pending.store(true, Ordering::Release);
    }

    /// Takes the bios of core `uid` whose futures were dropped on another
    /// thread (see [`DeviceShared::orphan_remote`]): a finished one is
    /// freed with its buffer, an unfinished one is orphaned (freed when it
    /// finishes). Called by the core at each completion batch and plug
    /// flush on this device.
    #[inline]
    pub fn adopt_remote_orphans(&self, uid: u64, bios: &mut BioTable) {
        // The common case, inline: none pending (the flag is tested again
        // under the lock's path, `take_remote_orphans`).
        // Acquire pairs with the Release store in `orphan_remote`.
        if self.remote_orphans_pending.load(Ordering::Acquire) {
            self.adopt_pending_remote_orphans(uid, bios);
        }
    }

    /// [`DeviceShared::adopt_remote_orphans`] where some are pending.
    #[cold]
    #[inline(never)]
    fn adopt_pending_remote_orphans(&self, uid: u64, bios: &mut BioTable) {
        // No allocation unless there are some: `take_remote_orphans`
        // returns at once when none are pending.
        let mut orphans = Vec::new();
        self.take_remote_orphans(uid, &mut orphans);
        // The caller holds the core's tables: the buffers' drops wait for
        // `drop_buried`.
        for (_, id, keep) in orphans {
            if let Some(r) = bios.take_result(id) {
                drop(r);
                bury_kept(keep);
            } else if let Some(bio) = bios.get_mut(id) {
                // Its waker's drop waits for `drop_buried` too.
                if let Some(waker) = bio.orphan(keep) {
                    bury_kept(Some(Box::new(waker)));
                }
            } else {
                bury_kept(keep);
            }
        }
    }

    /// Moves the remote drops of core `uid` into `out` (for
    /// [`DeviceShared::adopt_remote_orphans`], its only caller).
    #[inline]
    fn take_remote_orphans(&self, uid: u64, out: &mut Vec<RemoteOrphan>) {
        // Acquire pairs with the Release store in `orphan_remote`.
        if !self.remote_orphans_pending.load(Ordering::Acquire) {
            return;
        }
        let mut q = self
            .remote_orphans
            .get()
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut i = 0;
        while i < q.len() {
            if q[i].0 == uid {
                out.push(q.swap_remove(i));
            } else {
                i += 1;
            }
        }
        if q.is_empty() {
            // Relaxed: under the lock that guards the queue.
            self.remote_orphans_pending.store(false, Ordering::Relaxed);
        }
    }

    /// Whether this is a forked child's copy of a device its parent
    /// opened (the process forked since the open): its IO is refused with
    /// `ErrorKind::Forked`, its iostats show nothing in flight and its
    /// tags none in use (the parent's requests, which held them at the
    /// fork, complete in the parent only).
    #[inline]
    pub fn inherited(&self) -> bool {
        self.fork_generation != plugio_executor::fork::generation()
    }

    /// Whether every [`Device`](crate::Device) handle was dropped.
    pub fn is_closed(&self) -> bool {
        // Acquire pairs with the Release decrement in `drop_handle`.
        self.handles.load(Ordering::Acquire) == 0
    }

    /// Lets go of one handle's count (a [`Device`](crate::Device) drop);
    /// the last one closes the device.
    ///
    /// Returns, for the last handle, how to wake the cores that used the
    /// device: they let go of it at the end of the tick the wake brings.
    /// The caller wakes them once its own reference is dropped.
    #[must_use = "the last handle's drop must wake the cores, once the caller's reference is gone"]
    pub fn drop_handle(&self) -> Option<Vec<Arc<dyn plugio_executor::Unpark>>> {
        // Release pairs with the Acquire load in `is_closed`: what the
        // handle's holder did happens before a core sees the device closed.
        if self.handles.fetch_sub(1, Ordering::Release) != 1 {
            return None;
        }
        let wakers = self.core_wakers.get().list.lock();
        let wakers = wakers.unwrap_or_else(PoisonError::into_inner);
        Some(wakers.iter().map(|(_, w)| w.clone()).collect())
    }

    /// New counters for a core that starts using the device (called on
    /// that core's thread, which is also recorded to be woken when the
    /// device closes).
    ///
    /// The cores that are gone (their engine state, which held their
    /// counters, was dropped) leave first: their counts are added to the
    /// retired ones and their wakers forgotten. A device that outlived
    /// many executors kept about 300 bytes for each, and summed them all
    /// at every `iostats` (found by a break-it helper).
    pub fn register_core(&self) -> Arc<CoreCounters> {
        let c = Arc::new(CoreCounters::default());
        {
            let mut wakers = self
                .core_wakers
                .get()
                .list
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Held by the counters list alone (or by nothing): gone.
            wakers.retain(|(counters, _)| counters.strong_count() > 1);
            wakers.push((Arc::downgrade(&c), plugio_device::core_waker()));
        }
        let mut list = self
            .counters()
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (retired, live) = list
            .split_first_mut()
            .expect("the retired counters come first");
        let mut gone = Vec::new();
        for (i, counters) in live.iter().enumerate() {
            if Arc::strong_count(counters) == 1 {
                // `strong_count` is a Relaxed load: this Acquire fence
                // pairs with the Release decrement of the gone core's
                // `Arc` drop, so its last counts are seen (as
                // `Arc::into_inner` would do; found by a reviewer).
                std::sync::atomic::fence(Ordering::Acquire);
                retired.absorb(counters);
                gone.push(i + 1);
            }
        }
        for i in gone.into_iter().rev() {
            list.swap_remove(i);
        }
        list.push(c.clone());
        c
    }

    /// A snapshot of the iostats, summed over cores.
    pub fn iostats(&self) -> IoStats {
        let mut s = IoStats::default();
        for c in self
            .counters()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            s.add_core(c);
        }
        if self.inherited() {
            // The parent's requests in flight at the fork: not the child's.
            s.in_flight = 0;
        }
        for t in &self.tag_sets {
            add_tag_stats(&mut s.tags, &t.stats());
        }
        s
    }

    /// This fork generation's list of the cores' counters: in a forked
    /// child's first use, the parent's list copied (their counts as of
    /// the fork), or none when a thread of the parent held its lock then.
    /// Its first entry holds the sums of the cores that are gone (see
    /// [`DeviceShared::register_core`]); no core writes it.
    fn counters(&self) -> &Mutex<Vec<Arc<CoreCounters>>> {
        let mut inherited = Vec::new();
        let current = self.counters.get_or_renew(|parent| {
            match parent.try_lock() {
                Ok(list) => inherited.clone_from(&list),
                Err(TryLockError::Poisoned(list)) => inherited.clone_from(&list.into_inner()),
                // Held by a thread of the parent at the fork.
                Err(TryLockError::WouldBlock) => {}
            }
        });
        if !inherited.is_empty() {
            current
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(inherited);
        }
        current
    }

    /// The tag set core `core` allocates from.
    pub fn tags_for(&self, core: usize) -> &TagSet {
        &self.tag_sets[core.min(self.tag_sets.len() - 1)]
    }
}

/// See [`DeviceShared::bounce_align`].
fn bounce_align(geometry: &Geometry, opts: &DeviceOptions) -> Option<(usize, usize)> {
    let mem = geometry.mem_align_bytes() as usize;
    let block = geometry.offset_align_bytes() as usize;
    (opts.bounce_unaligned && (mem > 1 || block > 1)).then_some((mem, block))
}

fn add_tag_stats(a: &mut TagStats, b: &TagStats) {
    a.single_calls += b.single_calls;
    a.single_tags += b.single_tags;
    a.batch_calls += b.batch_calls;
    a.batch_tags += b.batch_tags;
    a.partial_batches += b.partial_batches;
    a.empty_batches += b.empty_batches;
    a.short_allocs += b.short_allocs;
    a.waits += b.waits;
    a.puts += b.puts;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, DeviceOptions};
    use plugio_device::geometry::DeviceKind;
    use plugio_device::testing::{in_forked_child, while_another_thread_holds};
    use plugio_device::{BackendKind, RingConfig};

    /// A device with one 4 KiB read done through a runtime (so one core's
    /// counters are registered), and the runtime gone.
    fn device_with_a_read(file: &tempfile::NamedTempFile) -> Device {
        file.as_file().set_len(8192).unwrap();
        let dev = Device::open(file.path(), DeviceOptions::default()).unwrap();
        let ex = crate::runtime::local(RingConfig::default()).expect("runtime");
        let (r, _buf) = ex.run(dev.read_at(dev.alloc_buf(4096), 0));
        assert_eq!(r.expect("read"), 4096);
        drop(ex);
        assert_eq!(dev.iostats().read.ios, 1);
        dev
    }

    /// A device that outlives many executors keeps the counts of those
    /// that are gone in one retired entry and forgets their wakers; it
    /// kept about 300 bytes for each (50,000 executors: 15 MB).
    #[test]
    fn a_device_that_outlives_its_executors_keeps_their_counts_not_their_entries() {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(8192).unwrap();
        let dev = Device::open(file.path(), DeviceOptions::default()).unwrap();
        for _ in 0..50 {
            let ex = crate::runtime::local(RingConfig::default()).expect("runtime");
            let (r, _buf) = ex.run(dev.read_at(dev.alloc_buf(4096), 0));
            assert_eq!(r.expect("read"), 4096);
        }
        let s = dev.iostats();
        assert_eq!((s.read.ios, s.bios, s.in_flight), (50, 50, 0));
        let shared = dev.shared();
        // The retired sums, the last executor's (gone too, not yet
        // folded: that happens at the next registration).
        assert!(shared.counters().lock().unwrap().len() <= 2);
        assert!(shared.core_wakers.get().list.lock().unwrap().len() <= 1);
    }

    /// A per-core split of a depth that does not divide keeps every tag:
    /// the first slices get one more (it truncated: 10 over 4 gave 8).
    #[test]
    fn a_per_core_split_keeps_every_tag_of_the_depth() {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(8192).unwrap();
        for (depth, cores, want) in [
            (10, 4, vec![3, 3, 2, 2]),
            (256, 3, vec![86, 85, 85]),
            (8, 2, vec![4, 4]),
        ] {
            let opts = DeviceOptions {
                queue_depth: depth,
                tag_sharing: crate::TagSharing::PerCore { cores },
                ..DeviceOptions::default()
            };
            let dev = Device::open(file.path(), opts).unwrap();
            let got: Vec<u32> = dev.shared().tag_sets.iter().map(TagSet::depth).collect();
            assert_eq!(got, want, "depth {depth} over {cores} cores");
            assert_eq!(got.iter().sum::<u32>(), depth);
        }
    }

    /// The device's own locks (its cores' counters, the cores to wake at
    /// close, the remote orphans), each held by another thread at a fork,
    /// as a core registering itself, a handle's drop or a future dropped
    /// off its core holds them for a moment: a child that reads the
    /// inherited device's iostats, looks for its remote orphans and drops
    /// it waits for none of them (before, it waited for ever: the child
    /// inherits a lock but not its holder).
    #[test]
    fn a_devices_locks_held_at_the_fork_do_not_stop_the_child() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let dev = device_with_a_read(&file);
        let shared = &dev.shared().clone();
        // Acquire/Release as `orphan_remote`: the child then takes the
        // orphans' lock.
        shared.remote_orphans_pending.store(true, Ordering::Release);
        let hold = move || {
            (
                shared.counters.get().lock().unwrap(),
                shared.core_wakers.get().list.lock().unwrap(),
                shared.remote_orphans.get().lock().unwrap(),
            )
        };
        // Taken by the child only: the parent drops it once the locks are
        // free.
        let dev = std::cell::Cell::new(Some(dev));
        let child = while_another_thread_holds(hold, || {
            in_forked_child(20, || {
                let dev = dev.take().ok_or("no device")?;
                // The parent's counters were locked: the child's start empty.
                let reads = dev.iostats().read.ios;
                shared.take_remote_orphans(1, &mut Vec::new());
                drop(dev);
                (reads == 0 && shared.is_closed())
                    .then_some(())
                    .ok_or(format!("{reads} reads in the child's iostats"))
            })
        });
        child.unwrap();
    }

    /// A forked child's iostats of an inherited device start from the
    /// parent's counts at the fork (when no thread held their lock).
    #[test]
    fn a_childs_iostats_of_an_inherited_device_start_from_the_parents() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let dev = device_with_a_read(&file);
        let child = in_forked_child(20, || {
            let stats = dev.iostats();
            (stats.read.ios == 1 && stats.read.sectors == 8)
                .then_some(())
                .ok_or(format!("the child's iostats: {:?}", stats.read))
        });
        child.unwrap();
        assert_eq!(dev.iostats().read.ios, 1);
    }

    #[test]
    fn block_devices_through_the_kernel_are_not_cut_at_max_sectors() {
        // zram: max_sectors_kb 124.
        let mut zram = Geometry::file_defaults(4096, 4096, 4096, true);
        zram.kind = DeviceKind::BlockDevice;
        zram.max_sectors_kb = 124;
        assert_eq!(
            default_request_bytes(&zram, BackendKind::Uring),
            1 << 20,
            "the kernel splits at 124 KiB itself"
        );
        assert_eq!(default_request_bytes(&zram, BackendKind::Sync), 1 << 20);
        // Passthrough talks to the device: its limit holds.
        assert_eq!(
            default_request_bytes(&zram, BackendKind::NvmePassthrough),
            124 << 10
        );
        // A device whose limit is larger keeps it.
        let mut big = zram.clone();
        big.max_sectors_kb = 4096;
        assert_eq!(default_request_bytes(&big, BackendKind::Uring), 4 << 20);
        // Regular files: the file default.
        let file = Geometry::file_defaults(4096, 4096, 4096, true);
        assert_eq!(default_request_bytes(&file, BackendKind::Uring), 1 << 20);
    }
}
