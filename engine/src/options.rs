//! [`DeviceOptions`]: how a device handle batches, tags and dispatches.
//!
//! Invariants: every field has a documented default that matches the kernel
//! constant it comes from; [`DeviceOptions::validate`] is the one place where
//! a combination is refused, before anything is opened.

use plugio_device::{BackendKind, Error, InvalidInput};

/// The kernel's `BLK_MAX_REQUEST_COUNT`: requests in one plug before it is
/// flushed early (`block/blk.h`).
pub const DEFAULT_PLUG_MAX_COUNT: usize = 32;

/// The kernel's `BLK_PLUG_FLUSH_SIZE`: bytes in one plug before it is flushed
/// early (`block/blk.h`).
pub const DEFAULT_PLUG_FLUSH_BYTES: u64 = 128 * 1024;

/// Default number of tags (request slots) of a device: the queue depth.
pub const DEFAULT_QUEUE_DEPTH: u32 = 256;

/// How a device's tags are shared between the cores that use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TagSharing {
    /// One bitmap for all cores (blk-mq's shared tag set): any core may
    /// use any tag; per-core start hints keep cores on different words.
    #[default]
    Shared,
    /// The depth is split between `cores` cores, evenly where it divides
    /// (the first `queue_depth % cores` slices get one tag more, so every
    /// tag is used); each core allocates only from its own share (like one hardware queue per
    /// core, each with its own tags). Core indices at or above `cores`
    /// share the last slice.
    PerCore {
        /// Number of slices.
        cores: u32,
    },
}

/// Options of [`Device::open`](crate::Device::open).
///
/// Defaults: `queue_depth` 256, `plug_max_count` 32, `plug_flush_bytes`
/// 128 KiB, tags shared by all cores, batch tag allocation on with retries
/// (the 2025 "batch allocate tags multiple times" patch), O_DIRECT on.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceOptions {
    /// Number of tags: how many requests may be in flight on the device at
    /// once, from all cores together. Default 256. Must be 1..=65536.
    pub queue_depth: u32,
    /// Flush the plug early once it holds this many bios of this device
    /// (each device's options count its own bios in the core's plug; the
    /// flush takes the whole plug, as the kernel's does). Default 32
    /// (`BLK_MAX_REQUEST_COUNT`). Must be at least 1. An early flush only
    /// prepares its SQEs; the core's park sends the tick's SQEs to the
    /// kernel in one `io_uring_enter`. 1 turns plugging off: every IO is
    /// flushed and sent to the kernel on its own, as without a plug.
    pub plug_max_count: usize,
    /// Flush the plug early once it holds this many bytes of this device's
    /// bios. Default 128 KiB (`BLK_PLUG_FLUSH_SIZE`, which the kernel
    /// compares with one plugged request, merged at insert; plugio's bios
    /// merge at the flush, so their total counts). 0 disables the byte
    /// trigger: large sequential IO then merges up to `plug_max_count`
    /// bios.
    pub plug_flush_bytes: u64,
    /// How tags are shared between cores. Default [`TagSharing::Shared`].
    pub tag_sharing: TagSharing,
    /// Take all the tags a flush needs in one call (a mask from one bitmap
    /// word) instead of one tag per request. Default true.
    pub tag_batch: bool,
    /// Repeat the batch call until the flush has every tag it needs or the
    /// bitmap is empty (the 2025 retry patch). Default true; ignored when
    /// `tag_batch` is off.
    pub tag_batch_retry: bool,
    /// Largest request in bytes; larger IOs are split. Default `None`: the
    /// device's `max_sectors` (from its geometry) where plugio talks to
    /// the device itself (NVMe passthrough: its MDTS) or to a regular file
    /// (1 MiB); for a block device read and written through the kernel,
    /// at least 1 MiB, since the kernel splits an op at the device's
    /// `max_sectors_kb` itself without another SQE or CQE. A given value
    /// is capped at [`MAX_IO_BYTES`](crate::MAX_IO_BYTES) and rounded down
    /// to a multiple of the device's IO block (the largest of its logical
    /// block and direct-IO alignments, rounded up to a power of two), at
    /// least one block: `Some(1000)` on a 512-byte device is 512;
    /// [`Device::max_request_bytes`](crate::Device::max_request_bytes)
    /// tells the limit in force. 0 is refused.
    pub max_request_bytes: Option<u64>,
    /// Merging, as `/sys/block/*/queue/nomerges`: 0 (default) all merges
    /// (sort the plug, back and front merges), 1 only the simple one-hit
    /// merge with the newest request, 2 none. Values above 2 act as 2.
    pub nomerges: u8,
    /// Largest request merging may build, in bytes. Default `None`: the
    /// request limit (`max_request_bytes`, or its default above); a larger
    /// value is capped at that limit. A bio longer than this is not
    /// merged at all, so `Some(0)` turns merging off as `nomerges: 2`
    /// does.
    pub max_merge_bytes: Option<u64>,
    /// Keep freed bios on a per-core free list for the next IO (the
    /// kernel's per-cpu bio cache). Default true.
    pub bio_cache: bool,
    /// Take the buffers the device hands out
    /// ([`Device::alloc_buf`](crate::Device::alloc_buf), and through it
    /// [`Device::read_alloc_at`](crate::Device::read_alloc_at) and the
    /// bounce buffers of unaligned caller memory) from the per-core buffer
    /// cache (`DmaBuf::cached`) instead of the allocator. A caller's own
    /// buffer ([`Device::read_at`](crate::Device::read_at)) is used as it
    /// is. Default true.
    pub buffer_cache: bool,
    /// When a caller's buffer does not meet the device's direct-IO address
    /// alignment (`mem_align_bytes`; a `Vec<u8>`'s heap memory, usually),
    /// do the IO through an aligned buffer from
    /// [`Device::alloc_buf`](crate::Device::alloc_buf) and a copy, counted
    /// in [`IoStats::bounce_ios`](crate::IoStats::bounce_ios) and
    /// `bounce_bytes`. Default true. `false` refuses such IO before
    /// submission with
    /// [`InvalidInput::Alignment`]
    /// (`what: "buffer address"`), for callers that want every copy to be
    /// their own. Offsets and lengths must be aligned either way (a copy
    /// cannot fix them).
    pub bounce_unaligned: bool,
    /// Keep iostats (`/proc/diskstats`-shaped counters and the plug's
    /// figures). Default true.
    pub iostats: bool,
    /// Read the clock once per batch (the plug flush, the completion
    /// batch) instead of once per use. Default true.
    pub cached_clock: bool,
    /// Open with `O_DIRECT`. Default true. File systems that refuse it
    /// (tmpfs before Linux 6.6) need `false`.
    pub direct: bool,
    /// Open read-only. Default false.
    pub read_only: bool,
    /// Keep the overlapping IO of each core in program order: a request
    /// waits for the earlier requests it overlaps where one of the two
    /// writes, and a flush for the writes issued before it (see the
    /// engine's `order` module). Default true. `false` orders nothing, as
    /// the kernel's block layer and fio do: overlapping IO in flight
    /// together completes in any order, and a flush covers only the
    /// writes that completed before it was issued. For callers that never
    /// have overlapping IO in flight at once.
    pub overlap_order: bool,
    /// Send an IO that merges with nothing, needs no split, is no flush
    /// and has nothing to wait for without building a request for it: a
    /// read or NOP where no write it overlaps is live on this core, a
    /// plain write where nothing it overlaps is live. Its SQE is written
    /// from the bio, and its completion goes straight back to the bio
    /// (the fast lane; idea: the kernel's direct issue of a bio no merge
    /// or scheduler needs, `blk_mq_try_issue_directly`); overlapping IO
    /// keeps its program order. Default true. `false` builds a request
    /// for every IO. A write built while reads sent this way with no
    /// write live are in flight waits for all of them.
    pub fast_lane: bool,
    /// Which backend serves a path opened with
    /// [`Device::open`](crate::Device::open): [`BackendKind::Uring`]
    /// (default; falls back to the sync pool on cores without a ring) or
    /// [`BackendKind::Sync`] to force `pread`/`pwrite` on threads.
    pub backend: BackendKind,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            queue_depth: DEFAULT_QUEUE_DEPTH,
            plug_max_count: DEFAULT_PLUG_MAX_COUNT,
            plug_flush_bytes: DEFAULT_PLUG_FLUSH_BYTES,
            tag_sharing: TagSharing::Shared,
            tag_batch: true,
            tag_batch_retry: true,
            max_request_bytes: None,
            nomerges: 0,
            bio_cache: true,
            buffer_cache: true,
            bounce_unaligned: true,
            iostats: true,
            cached_clock: true,
            max_merge_bytes: None,
            direct: true,
            read_only: false,
            overlap_order: true,
            fast_lane: true,
            backend: BackendKind::Uring,
        }
    }
}

impl DeviceOptions {
    /// The options that differ between `self` (an open device's) and
    /// `asked`, as `name: self vs asked`. Every field is compared: the
    /// pattern below lists them all without `..`, so a new field that is
    /// not added here does not compile (`bounce_unaligned` was missing,
    /// and the refusal named no option; found by a new-user helper).
    pub(crate) fn differences(&self, asked: &DeviceOptions) -> Vec<String> {
        let mut out = Vec::new();
        macro_rules! cmp {
            ($($field:ident),*) => {
                let DeviceOptions { $($field: _),* } = self;
                $(
                if self.$field != asked.$field {
                    out.push(format!(
                        "{}: {:?} vs {:?}",
                        stringify!($field),
                        self.$field,
                        asked.$field
                    ));
                }
            )*};
        }
        cmp!(
            queue_depth,
            plug_max_count,
            plug_flush_bytes,
            tag_sharing,
            tag_batch,
            tag_batch_retry,
            max_request_bytes,
            nomerges,
            max_merge_bytes,
            bio_cache,
            buffer_cache,
            bounce_unaligned,
            iostats,
            cached_clock,
            direct,
            read_only,
            overlap_order,
            fast_lane,
            backend
        );
        out
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](plugio_device::ErrorKind::InvalidInput) naming the field and the allowed range.
    pub fn validate(&self) -> Result<(), Error> {
        if self.queue_depth == 0 || self.queue_depth > 65536 {
            return Err(invalid(format!(
                "queue_depth {} is out of range: use 1..=65536",
                self.queue_depth
            )));
        }
        if self.plug_max_count == 0 {
            return Err(invalid("plug_max_count is 0: use at least 1".into()));
        }
        if let TagSharing::PerCore { cores } = self.tag_sharing {
            if cores == 0 || cores > self.queue_depth {
                return Err(invalid(format!(
                    "tag_sharing PerCore {{ cores: {cores} }} needs 1..=queue_depth ({}) cores",
                    self.queue_depth
                )));
            }
        }
        if self.max_request_bytes == Some(0) {
            return Err(invalid(
                "max_request_bytes is 0: use None or a positive size".into(),
            ));
        }
        Ok(())
    }
}

/// An [`InvalidInput::Config`] error with `detail`.
pub(crate) fn invalid(detail: String) -> Error {
    Error::invalid(InvalidInput::Config { detail })
}

#[cfg(test)]
mod tests {
    use super::DeviceOptions;

    /// Each option that is not a default shows in the differences by its
    /// name: one case per field, so a field left out of the comparison
    /// (as `bounce_unaligned` once was) gives an empty list here.
    #[test]
    fn every_option_that_differs_is_named() {
        let base = DeviceOptions::default();
        let cases: Vec<(&str, DeviceOptions)> = vec![
            (
                "queue_depth",
                DeviceOptions {
                    queue_depth: 8,
                    ..base.clone()
                },
            ),
            (
                "bounce_unaligned",
                DeviceOptions {
                    bounce_unaligned: !base.bounce_unaligned,
                    ..base.clone()
                },
            ),
            (
                "fast_lane",
                DeviceOptions {
                    fast_lane: !base.fast_lane,
                    ..base.clone()
                },
            ),
            (
                "overlap_order",
                DeviceOptions {
                    overlap_order: !base.overlap_order,
                    ..base.clone()
                },
            ),
            (
                "read_only",
                DeviceOptions {
                    read_only: !base.read_only,
                    ..base.clone()
                },
            ),
        ];
        for (name, asked) in cases {
            let diff = base.differences(&asked);
            assert_eq!(diff.len(), 1, "{name}: {diff:?}");
            assert!(
                diff[0].starts_with(&format!("{name}: ")),
                "{name}: {diff:?}"
            );
        }
        assert!(base.differences(&base.clone()).is_empty());
    }
}
