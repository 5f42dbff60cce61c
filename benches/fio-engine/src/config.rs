//! [`EngineConfig`]: the engine's options (fio's `--plugio_*` engine options
//! plus what the shim reads from the job), as the C shim passes them, and
//! how they map onto plugio's `DeviceOptions` and `RingConfig`.
//!
//! Invariant: the layout of [`EngineConfig`] is the one of
//! `struct plugio_fio_config` in `c/plugio_fio.h` (`#[repr(C)]`, the same
//! fields in the same order; the shim checks the size at compile time
//! against `PLUGIO_FIO_CONFIG_BYTES`, and a test here checks it too).

use std::time::Duration;

use plugio_device::{BatchWaitTimer, RingConfig};
use plugio_engine::options::DEFAULT_QUEUE_DEPTH;
use plugio_engine::DeviceOptions;

/// The size of [`EngineConfig`] in bytes, checked by the shim.
pub const CONFIG_BYTES: usize = 80;

/// The engine's settings for one fio job thread.
///
/// Defaults ([`EngineConfig::default`]) are plugio's own defaults, with at
/// least as many tags as the job can have IOs in flight.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// fio's `iodepth`: the most io_us in flight at once. At least 1.
    pub iodepth: u32,
    /// `plugio_queue_depth`: the device's tags (`DeviceOptions::queue_depth`);
    /// 0 means `iodepth × numjobs`, at least plugio's default 256 (at most
    /// 65536): the job threads of one job that share a file share its
    /// tags, and jobs whose depths all fit in 256 open it with equal
    /// options.
    pub queue_depth: u32,
    /// `plugio_nomerges`: 0 all merges, 1 the one-hit merge only, 2 none.
    pub nomerges: u32,
    /// `plugio_plug_max`: bios in the plug before an early flush
    /// (`plug_max_count`); 1 turns plugging off.
    pub plug_max: u32,
    /// `plugio_plug_flush_bytes`: bytes in the plug before an early flush;
    /// 0 disables the byte trigger.
    pub plug_flush_bytes: u64,
    /// `plugio_max_merge_bytes`: the largest request merging builds; 0
    /// means the request limit.
    pub max_merge_bytes: u64,
    /// `plugio_batch_wait_us`: the ring's `batch_wait` in microseconds.
    pub batch_wait_us: u32,
    /// `plugio_overlap_order`: keep overlapping IO in program order
    /// (`DeviceOptions::overlap_order`); nonzero is on.
    pub overlap_order: u32,
    /// `plugio_fixedbufs`: io_u memory from the core's registered arena, so
    /// IO on it goes out as `READ_FIXED`/`WRITE_FIXED`; nonzero is on.
    pub fixedbufs: u32,
    /// `plugio_registerfiles`: the ring's registered-file table (64 slots)
    /// when nonzero, none when 0.
    pub registerfiles: u32,
    /// `plugio_defer_taskrun`: try `SINGLE_ISSUER` + `DEFER_TASKRUN`
    /// (`RingConfig::taskrun_flags`); nonzero is on.
    pub defer_taskrun: u32,
    /// `plugio_sq_entries`: SQ entries; 0 means `max(256, iodepth)` rounded
    /// up to a power of two.
    pub sq_entries: u32,
    /// The io_u memory fio will ask `iomem_alloc` for, in bytes (0 when the
    /// job moves no data): the registered arena is sized to hold it.
    pub iomem_bytes: u64,
    /// `plugio_bounce_unaligned`: IO on io_u memory that is not aligned
    /// for direct IO (fio's `iomem_align`) goes through an aligned buffer
    /// and a copy (`DeviceOptions::bounce_unaligned`) when nonzero, and is
    /// refused with `EINVAL` when 0.
    pub bounce_unaligned: u32,
    /// fio's `numjobs` (0 counts as 1): how many job threads of this job
    /// may share a file (and its tags).
    pub numjobs: u32,
    /// `plugio_batch_wait_timer`: nonzero arms the batch wait's bound as a
    /// kernel timer on every batched wait (`BatchWaitTimer::Always`); 0
    /// only after a late batch (`WhenLate`, the ring's default).
    pub batch_wait_timer: u32,
    /// Padding to the C struct's size (a multiple of 8); always 0.
    pub pad: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let dev = DeviceOptions::default();
        let ring = RingConfig::default();
        Self {
            iodepth: 1,
            queue_depth: 0,
            nomerges: u32::from(dev.nomerges),
            plug_max: dev.plug_max_count as u32,
            plug_flush_bytes: dev.plug_flush_bytes,
            max_merge_bytes: 0,
            batch_wait_us: ring.batch_wait.as_micros() as u32,
            overlap_order: u32::from(dev.overlap_order),
            fixedbufs: 1,
            registerfiles: u32::from(ring.registered_files > 0),
            defer_taskrun: u32::from(ring.taskrun_flags),
            sq_entries: 0,
            iomem_bytes: 0,
            bounce_unaligned: u32::from(dev.bounce_unaligned),
            numjobs: 1,
            batch_wait_timer: u32::from(ring.batch_wait_timer == BatchWaitTimer::Always),
            pad: 0,
        }
    }
}

impl EngineConfig {
    /// Checks the engine options against their ranges (those of the shim's
    /// option table). fio checks a value against its `minval` only when
    /// that is not 0, so a negative value of an option whose minimum is 0
    /// reaches the engine as a huge unsigned one; it is refused here.
    ///
    /// # Errors
    /// A message naming the option, its value and its range.
    pub fn check(&self) -> Result<(), String> {
        let ranges: [(&str, u32, u32, u32); 5] = [
            ("plugio_queue_depth", self.queue_depth, 0, 65536),
            ("plugio_nomerges", self.nomerges, 0, 2),
            ("plugio_plug_max", self.plug_max, 1, 65536),
            ("plugio_batch_wait_us", self.batch_wait_us, 0, 1_000_000),
            ("plugio_sq_entries", self.sq_entries, 0, 32768),
        ];
        for (name, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                // A negative value came as its two's complement.
                let shown = if value > i32::MAX as u32 {
                    i64::from(value as i32)
                } else {
                    i64::from(value)
                };
                return Err(format!(
                    "{name}={shown} is out of range: use {min} to {max}"
                ));
            }
        }
        Ok(())
    }

    /// The device options for a file opened by this job: `direct` and
    /// `read_only` come from the job (`direct=`, whether it writes).
    pub fn device_options(&self, direct: bool, read_only: bool) -> DeviceOptions {
        let queue_depth = if self.queue_depth == 0 {
            let depth = u64::from(self.iodepth.max(1)) * u64::from(self.numjobs.max(1));
            depth.clamp(u64::from(DEFAULT_QUEUE_DEPTH), 65536) as u32
        } else {
            self.queue_depth
        };
        DeviceOptions {
            queue_depth,
            nomerges: self.nomerges.min(2) as u8,
            plug_max_count: self.plug_max as usize,
            plug_flush_bytes: self.plug_flush_bytes,
            max_merge_bytes: (self.max_merge_bytes != 0).then_some(self.max_merge_bytes),
            overlap_order: self.overlap_order != 0,
            bounce_unaligned: self.bounce_unaligned != 0,
            direct,
            read_only,
            ..DeviceOptions::default()
        }
    }

    /// The ring of the job thread's core.
    pub fn ring_config(&self) -> RingConfig {
        let sq_entries = if self.sq_entries == 0 {
            self.iodepth.max(256).next_power_of_two().min(32768)
        } else {
            self.sq_entries
        };
        RingConfig {
            sq_entries,
            registered_files: if self.registerfiles != 0 { 64 } else { 0 },
            taskrun_flags: self.defer_taskrun != 0,
            batch_wait: Duration::from_micros(u64::from(self.batch_wait_us)),
            batch_wait_timer: if self.batch_wait_timer != 0 {
                BatchWaitTimer::Always
            } else {
                BatchWaitTimer::WhenLate
            },
            ..RingConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_matches_the_c_header() {
        assert_eq!(std::mem::size_of::<EngineConfig>(), CONFIG_BYTES);
        assert_eq!(std::mem::align_of::<EngineConfig>(), 8);
    }

    #[test]
    fn options_out_of_range_are_refused_with_their_name() {
        assert_eq!(EngineConfig::default().check(), Ok(()));
        let negative = EngineConfig {
            nomerges: -1i32 as u32,
            ..EngineConfig::default()
        };
        assert_eq!(
            negative.check(),
            Err("plugio_nomerges=-1 is out of range: use 0 to 2".into())
        );
        let wait = EngineConfig {
            batch_wait_us: -5i32 as u32,
            ..EngineConfig::default()
        };
        assert!(wait
            .check()
            .unwrap_err()
            .starts_with("plugio_batch_wait_us=-5 "));
        let no_plug = EngineConfig {
            plug_max: 0,
            ..EngineConfig::default()
        };
        assert!(no_plug.check().unwrap_err().contains("use 1 to 65536"));
    }

    #[test]
    fn defaults_are_plugio_defaults_with_tags_from_iodepth() {
        let cfg = EngineConfig {
            iodepth: 128,
            ..EngineConfig::default()
        };
        let dev = cfg.device_options(true, false);
        let plain = DeviceOptions::default();
        assert_eq!(dev.queue_depth, plain.queue_depth, "256 covers QD128");
        let deep = EngineConfig {
            iodepth: 128,
            numjobs: 4,
            ..EngineConfig::default()
        };
        assert_eq!(deep.device_options(true, false).queue_depth, 512);
        assert_eq!(dev.nomerges, plain.nomerges);
        assert_eq!(dev.plug_max_count, plain.plug_max_count);
        assert_eq!(dev.plug_flush_bytes, plain.plug_flush_bytes);
        assert_eq!(dev.overlap_order, plain.overlap_order);
        assert_eq!(dev.max_merge_bytes, None);
        assert_eq!(dev.bounce_unaligned, plain.bounce_unaligned);
        let ring = cfg.ring_config();
        assert_eq!(ring.sq_entries, 256);
        assert_eq!(ring.batch_wait, RingConfig::default().batch_wait);
        assert_eq!(ring.batch_wait_timer, BatchWaitTimer::WhenLate);
        assert_eq!(ring.registered_files, 64);
    }

    #[test]
    fn options_reach_the_device_and_the_ring() {
        let cfg = EngineConfig {
            iodepth: 1000,
            queue_depth: 64,
            nomerges: 7,
            plug_max: 1,
            plug_flush_bytes: 0,
            max_merge_bytes: 65536,
            batch_wait_us: 0,
            overlap_order: 0,
            registerfiles: 0,
            defer_taskrun: 0,
            bounce_unaligned: 0,
            batch_wait_timer: 1,
            ..EngineConfig::default()
        };
        let dev = cfg.device_options(false, true);
        assert!(!dev.bounce_unaligned);
        assert_eq!(dev.queue_depth, 64);
        assert_eq!(dev.nomerges, 2, "values above 2 act as 2");
        assert_eq!(dev.plug_max_count, 1);
        assert_eq!(dev.plug_flush_bytes, 0);
        assert_eq!(dev.max_merge_bytes, Some(65536));
        assert!(!dev.overlap_order && !dev.direct && dev.read_only);
        let ring = cfg.ring_config();
        assert_eq!(ring.sq_entries, 1024);
        assert_eq!(ring.batch_wait, Duration::ZERO);
        assert_eq!(ring.batch_wait_timer, BatchWaitTimer::Always);
        assert_eq!(ring.registered_files, 0);
        assert!(!ring.taskrun_flags);
    }
}
