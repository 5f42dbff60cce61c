//! Ring setup: the builder's options, flag probing with fallback, and the
//! probed features and opcodes.
//!
//! Invariant: a setup flag is reported in [`RingInfo`] only when the kernel
//! accepted it; a refused optional flag (`EINVAL`) is dropped and setup is
//! retried, never surfaced.

use std::fmt;
use std::time::Duration;

use io_uring::{opcode, IoUring, Probe};

use crate::error::{Error, Result};

/// How to build a core's ring.
#[derive(Debug, Clone)]
pub struct RingConfig {
    /// SQ entries (rounded up to a power of two by the kernel): 1 to
    /// [`MAX_SQ_ENTRIES`]. Default 256.
    pub sq_entries: u32,
    /// CQ entries; `None` = twice the SQ (the kernel default). Given, at
    /// least the SQ's size (both rounded up to powers of two) and at most
    /// [`MAX_CQ_ENTRIES`] (see [`RingConfig::validate`]).
    pub cq_entries: Option<u32>,
    /// Try `IORING_SETUP_SINGLE_ISSUER` + `DEFER_TASKRUN` (6.1+), falling
    /// back to `COOP_TASKRUN` (5.19+), then to none. Default true.
    pub taskrun_flags: bool,
    /// With `taskrun_flags`, try `SINGLE_ISSUER` + `DEFER_TASKRUN` first;
    /// false starts at `COOP_TASKRUN` (to run or compare the cooperative
    /// mode on a kernel that has both). No effect without `taskrun_flags`.
    /// Default true.
    pub defer_taskrun: bool,
    /// Use a kernel SQ polling thread idling after this many milliseconds
    /// (`IORING_SETUP_SQPOLL`); needs `sq_entries` of at least
    /// [`MIN_SQPOLL_SQ_ENTRIES`]. Default `None`.
    pub sqpoll_idle_ms: Option<u32>,
    /// Busy-poll completions (`IORING_SETUP_IOPOLL`; O_DIRECT on devices
    /// with poll queues only). Default false.
    ///
    /// Such a ring takes only pollable ops. IO on a file or block device
    /// whose queue has no poll queues (`queue/io_poll` 0: a loop device, a
    /// virtio disk, NVMe without `nvme.poll_queues=N`) may complete at once
    /// with `ErrorKind::Unsupported` (the kernel's `EOPNOTSUPP`; reads did
    /// on a virtio disk, where O_DIRECT writes went through): build the
    /// core's ring without `iopoll` for those devices. Whatever the
    /// device, the kernel takes no fsync or fallocate on such a ring
    /// (`Device::sync_all`, `sync_data`, `fallocate` fail with
    /// `Unsupported`, said so, as does a write with `IoFlags::PREFLUSH`,
    /// whose linked fsync the kernel refuses, before it is sent) and no
    /// buffered IO: make files durable from a core without `iopoll`. File-level operations
    /// (`OpenOptions::open`, `fs::metadata`, `rename`...) run on the
    /// runtime's blocking pool on such a core. The ring arms no eventfd
    /// read for cross-thread wakes (not pollable either); its park never
    /// sleeps, so the core busy-polls and sees a wake in its next tick.
    pub iopoll: bool,
    /// Size of the sparse registered-file table (0 disables registered
    /// files). Default 64.
    pub registered_files: u32,
    /// Longest time a park waits for a batch of up to 32 CQEs (and at most
    /// half of the ops in flight) before it
    /// takes whatever arrived (the latency batching may add to an IO that
    /// completed early; the ring uses less when completions come fast, see
    /// the `ring` module docs). Default 100 µs. `Duration::ZERO` disables
    /// batching: every park wakes on the first CQE. Longer values buy
    /// fewer context switches on devices whose completions trickle in
    /// (zram reads run on io-wq) at the price of latency.
    ///
    /// When the bound is armed as a kernel timer is
    /// [`RingConfig::batch_wait_timer`]'s choice.
    pub batch_wait: Duration,
    /// When a batched wait arms its bound (`batch_wait`, or less) as a
    /// kernel timer. Default [`BatchWaitTimer::WhenLate`].
    pub batch_wait_timer: BatchWaitTimer,
}

/// When a park's batched wait arms its short bound (at most
/// [`RingConfig::batch_wait`]) as a kernel timer.
///
/// A timer per wait is not free: `min_wait_usec` arms an hrtimer in the
/// enter and cancels it after, and when it is the CPU's next event each
/// of these reprograms the local APIC timer. In a virtual machine each
/// reprogramming and each timer interrupt is an exit to the hypervisor.
/// On this project's test VM (firecracker, HZ 250), zram random reads at
/// queue depth 128 armed one per 32 IOs and took about 3,500 extra timer
/// interrupts a second; without them plugio read 20-25 % faster, level
/// with a raw io_uring loop, and its latency percentiles fell with the
/// queueing (`benches/RESULTS.md`, `## Per-IO cost`, "The batched wait's
/// timer").
///
/// The bound matters when batches do not fill on time: a few fast ops
/// among many slow ones. [`BatchWaitTimer::WhenLate`] arms it only after
/// such a batch was seen; [`BatchWaitTimer::Always`] on every batched wait.
/// Waits for one CQE, or with a batch of one, never arm it. The idea is
/// the kernel's `IORING_ENTER_EXT_ARG` `min_wait_usec` (Linux 6.12, "io_uring:
/// add support for batch wait timeout"), used where it pays.
///
/// ```
/// use plugio::{BatchWaitTimer, RingConfig};
///
/// // A latency-first core: every batched wait is bounded by a timer.
/// let config = RingConfig {
///     batch_wait_timer: BatchWaitTimer::Always,
///     ..RingConfig::default()
/// };
/// assert_eq!(RingConfig::default().batch_wait_timer, BatchWaitTimer::WhenLate);
/// # let _ = config;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BatchWaitTimer {
    /// Arm the bound only after a late batch, for the next
    /// [`BATCH_WAITS_BOUNDED`] batched waits (twice as many after each
    /// further late untimed batch in a row, up to 65,536). A batch is late
    /// when a wait without the timer ended without filling after more than
    /// `batch_wait` (its limit, the park's timeout or a signal ended it),
    /// or filled after more than 4 times the fill time the ring expected
    /// for it and 4 times `batch_wait` (at most half its limit, at least
    /// `batch_wait`); or when a timed wait's bound (or the park's timeout,
    /// if sooner) ended it with less than
    /// a quarter of what the bound could gather at the ring's estimated
    /// completion rate (its batch, or less where `batch_wait` cut the
    /// bound short of the batch's expected fill time). Where timers or
    /// signals end waits more often than batches fill, untimed tries keep
    /// coming late by these rules and this acts almost as
    /// [`BatchWaitTimer::Always`], with one untimed try after each
    /// (doubling) timed period (the `ring` module docs). Other batched waits are bounded
    /// only by [`BATCH_WAIT_UNTIMED`] (or `batch_wait`, if longer) and by
    /// the park's own timeout; that is longer than a scheduler tick (HZ 100
    /// or more), so its timer does not reprogram the CPU's while the CPU is
    /// busy.
    ///
    /// What this costs in latency: where completions come evenly, an IO
    /// that completes early in a batch waits for the batch to fill, about
    /// half of an IO's latency at that queue depth (the batch is half of
    /// what is in flight), rather than at most `batch_wait`; a cross-thread
    /// unpark during such a wait waits for it too. Where fast completions
    /// come among ones that stay out, so that a batch cannot fill, an
    /// untimed wait holds them for its whole limit (10 ms): when that
    /// starts, and again at each try after a timed period, whose length
    /// doubles with each such stall (about the 1st, 66th, 195th, 452nd...
    /// batched wait). Where slow ops finish in bursts every few
    /// milliseconds with fast ones among them, the ring's interval
    /// estimate follows the bursts, and waits that hold the fast ops until
    /// the next burst (2-3 ms) can count as on time: the fast ops then wait
    /// for each burst. Use [`BatchWaitTimer::Always`] where no such stall
    /// is acceptable.
    #[default]
    WhenLate,
    /// Arm the bound on every batched wait (the policy before 2026-12-02
    /// 10:00 UTC): an early completion waits at most `batch_wait`, always,
    /// at the price of a timer per wait.
    Always,
}

/// Batched waits that arm their bound after a late batch
/// ([`BatchWaitTimer::WhenLate`]).
pub const BATCH_WAITS_BOUNDED: u32 = 64;

/// The bound of a batched wait that arms no timer of its own
/// ([`BatchWaitTimer::WhenLate`] while batches fill on time): 10 ms.
pub const BATCH_WAIT_UNTIMED: Duration = Duration::from_millis(10);

/// The most SQ entries a ring may have (the kernel's
/// `IORING_MAX_ENTRIES`).
pub const MAX_SQ_ENTRIES: u32 = 32_768;

/// The most CQ entries a ring may have (the kernel's
/// `IORING_MAX_CQ_ENTRIES`, twice [`MAX_SQ_ENTRIES`]).
pub const MAX_CQ_ENTRIES: u32 = 2 * MAX_SQ_ENTRIES;

/// The longest [`RingConfig::batch_wait`] a ring takes: 1 s. A batch
/// bound is a latency the park may add to an IO that completed early
/// (the default is 100 µs); past this it is a mistake of units, and the
/// ring's arithmetic on it (its late-batch rule multiplies it) would
/// overflow near 58 years (`Duration::MAX` panicked in a debug build, a
/// break-it helper found).
///
/// ```
/// use std::time::Duration;
/// use plugio::device::{RingConfig, MAX_BATCH_WAIT};
/// let slow = RingConfig { batch_wait: MAX_BATCH_WAIT, ..RingConfig::default() };
/// assert!(slow.validate().is_ok());
/// let max = RingConfig { batch_wait: Duration::MAX, ..RingConfig::default() };
/// assert!(max.validate().unwrap_err().to_string().contains("batch_wait"));
/// ```
pub const MAX_BATCH_WAIT: Duration = Duration::from_secs(1);

/// The smallest `sq_entries` of an SQPOLL ring
/// ([`RingConfig::sqpoll_idle_ms`]): with one entry, the ring's wake read
/// (the eventfd read armed when it is built) fills the SQ until the
/// kernel's poll thread takes it, so the first IO goes to the backlog;
/// the first IO hung there in most runs (a break-it helper's finding;
/// its likely cause, from the code: the submit that should make room
/// returns before the poll thread has taken the wake read, and the park
/// then waits for a completion that nothing in flight will give). A ring
/// without SQPOLL submits the wake read in its own enter and takes 1.
pub const MIN_SQPOLL_SQ_ENTRIES: u32 = 2;

impl RingConfig {
    /// Checks the sizes the kernel would refuse with a bare `EINVAL`
    /// (`io_uring_setup`'s checks in `io_uring/io_uring.c`): `sq_entries`
    /// in 1..=[`MAX_SQ_ENTRIES`] (with `sqpoll_idle_ms`, at least
    /// [`MIN_SQPOLL_SQ_ENTRIES`]); `cq_entries`, when given, not 0, at least the
    /// SQ's size once both are rounded up to powers of two, and at most
    /// [`MAX_CQ_ENTRIES`]; and `batch_wait` at most [`MAX_BATCH_WAIT`]. The
    /// runtimes call it before building a ring, so
    /// a bad size is an error that names the option rather than a ring
    /// refused and IO moved to the sync thread pool.
    ///
    /// # Errors
    /// [`InvalidInput::Config`](crate::InvalidInput::Config) naming the
    /// option, its value and the allowed range.
    ///
    /// ```
    /// use plugio::RingConfig;
    /// assert!(RingConfig::default().validate().is_ok());
    /// let e = RingConfig { sq_entries: 0, ..RingConfig::default() }.validate().unwrap_err();
    /// assert!(e.to_string().contains("sq_entries"), "{e}");
    /// let small_cq = RingConfig { sq_entries: 256, cq_entries: Some(64), ..RingConfig::default() };
    /// assert!(small_cq.validate().is_err());
    /// let tiny_sqpoll = RingConfig { sq_entries: 1, sqpoll_idle_ms: Some(10), ..RingConfig::default() };
    /// assert!(tiny_sqpoll.validate().unwrap_err().to_string().contains("SQPOLL ring needs at least 2"));
    /// ```
    pub fn validate(&self) -> Result<()> {
        let refuse = |detail: String| Err(Error::invalid(crate::InvalidInput::Config { detail }));
        if self.sq_entries == 0 || self.sq_entries > MAX_SQ_ENTRIES {
            return refuse(format!(
                "RingConfig::sq_entries is {}: use 1 to {MAX_SQ_ENTRIES} (the kernel rounds it up to a power of two)",
                self.sq_entries
            ));
        }
        if self.sqpoll_idle_ms.is_some() && self.sq_entries < MIN_SQPOLL_SQ_ENTRIES {
            return refuse(format!(
                "RingConfig::sq_entries is {} with sqpoll_idle_ms: an SQPOLL ring needs at least \
                 {MIN_SQPOLL_SQ_ENTRIES} (its wake read holds one entry until the kernel's poll \
                 thread takes it; with one, the first IO could hang)",
                self.sq_entries
            ));
        }
        if let Some(cq) = self.cq_entries {
            let sq = self.sq_entries.next_power_of_two();
            if cq == 0 || cq > MAX_CQ_ENTRIES || cq.next_power_of_two() < sq {
                return refuse(format!(
                    "RingConfig::cq_entries is {cq}: use {sq} (the SQ's {} entries rounded up to a power of two) to {MAX_CQ_ENTRIES}, or None for twice the SQ",
                    self.sq_entries
                ));
            }
        }
        if self.batch_wait > MAX_BATCH_WAIT {
            return refuse(format!(
                "RingConfig::batch_wait is {:?}: use at most {MAX_BATCH_WAIT:?} (a bound on the \
                 latency batching adds; the default is 100µs, Duration::ZERO turns batching off)",
                self.batch_wait
            ));
        }
        Ok(())
    }
}

impl Default for RingConfig {
    fn default() -> Self {
        Self {
            sq_entries: 256,
            cq_entries: None,
            taskrun_flags: true,
            defer_taskrun: true,
            sqpoll_idle_ms: None,
            iopoll: false,
            registered_files: 64,
            batch_wait: Duration::from_micros(100),
            batch_wait_timer: BatchWaitTimer::WhenLate,
        }
    }
}

/// The opcodes whose support is probed and reported.
const PROBED: &[(u8, &str)] = &[
    (opcode::Nop::CODE, "NOP"),
    (opcode::Readv::CODE, "READV"),
    (opcode::Writev::CODE, "WRITEV"),
    (opcode::Fsync::CODE, "FSYNC"),
    (opcode::ReadFixed::CODE, "READ_FIXED"),
    (opcode::WriteFixed::CODE, "WRITE_FIXED"),
    (opcode::Timeout::CODE, "TIMEOUT"),
    (opcode::AsyncCancel::CODE, "ASYNC_CANCEL"),
    (opcode::Fallocate::CODE, "FALLOCATE"),
    (opcode::Read::CODE, "READ"),
    (opcode::Write::CODE, "WRITE"),
    (opcode::MsgRingData::CODE, "MSG_RING"),
    (opcode::UringCmd16::CODE, "URING_CMD"),
    (opcode::ReadvFixed::CODE, "READV_FIXED"),
    (opcode::WritevFixed::CODE, "WRITEV_FIXED"),
];

/// What a ring was set up with and what its kernel supports.
#[derive(Debug, Clone, Default)]
pub struct RingInfo {
    /// SQ entries granted.
    pub sq_entries: u32,
    /// CQ entries granted.
    pub cq_entries: u32,
    /// `SINGLE_ISSUER` + `DEFER_TASKRUN` accepted.
    pub defer_taskrun: bool,
    /// `COOP_TASKRUN` accepted (when DEFER_TASKRUN was not).
    pub coop_taskrun: bool,
    /// `TASKRUN_FLAG` accepted (with DEFER_TASKRUN or COOP_TASKRUN): the
    /// kernel sets `IORING_SQ_TASKRUN` while task work that will post CQEs
    /// is pending, so a park can skip an enter when it is clear.
    pub taskrun_flag: bool,
    /// `IORING_FEAT_MIN_TIMEOUT` (6.12+): a wait for several CQEs can be
    /// cut short to "any CQE" after `min_wait_usec`.
    pub min_timeout: bool,
    /// `SQPOLL` accepted.
    pub sqpoll: bool,
    /// `IOPOLL` accepted.
    pub iopoll: bool,
    /// `IORING_FEAT_EXT_ARG`: enter takes a timeout argument.
    pub ext_arg: bool,
    /// `IORING_FEAT_NODROP`: CQEs are never dropped on overflow.
    pub nodrop: bool,
    /// Size of the registered-file table (0 when registration failed).
    pub registered_files: u32,
    /// Names of the probed opcodes the kernel supports.
    pub supported_ops: Vec<&'static str>,
    /// Names of the probed opcodes the kernel lacks.
    pub unsupported_ops: Vec<&'static str>,
    /// Raw supported-opcode bitmap (bit n = opcode n), for opcodes < 128.
    pub op_bitmap: u128,
}

impl RingInfo {
    /// True when the kernel supports opcode `code` (`IORING_OP_*`).
    pub fn supports(&self, code: u8) -> bool {
        code < 128 && self.op_bitmap & (1u128 << code) != 0
    }
}

/// Builds the ring, dropping optional flags the kernel refuses.
pub(super) fn build(config: &RingConfig) -> Result<(IoUring, RingInfo)> {
    config.validate()?;
    let mut attempts: Vec<u8> = Vec::new();
    if config.taskrun_flags {
        if config.defer_taskrun {
            attempts.push(2);
        }
        attempts.push(1);
    }
    attempts.push(0);
    let mut last_err = None;
    for level in attempts {
        let mut builder = IoUring::builder();
        // MADV_DONTFORK on the SQ, CQ and SQE mappings: a forked child
        // never shares them with this process (see `fork`).
        builder.dontfork();
        if let Some(cq) = config.cq_entries {
            builder.setup_cqsize(cq);
        }
        if let Some(idle) = config.sqpoll_idle_ms {
            builder.setup_sqpoll(idle);
        }
        if config.iopoll {
            builder.setup_iopoll();
        }
        match level {
            // TASKRUN_FLAG (5.19, like COOP_TASKRUN) with either: the kernel
            // sets IORING_SQ_TASKRUN when it queues task work that will post
            // CQEs (io_req_local_work_add for DEFER_TASKRUN, the normal
            // task-work add for COOP) and clears it when it runs that work.
            2 => {
                builder
                    .setup_single_issuer()
                    .setup_defer_taskrun()
                    .setup_taskrun_flag();
            }
            1 => {
                builder.setup_coop_taskrun().setup_taskrun_flag();
            }
            _ => {}
        }
        match builder.build(config.sq_entries) {
            Ok(uring) => return Ok(finish(uring, config, level)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && level > 0 => last_err = Some(e),
            Err(e) => return Err(Error::from_io(&e).with_context("io_uring_setup")),
        }
    }
    let e = last_err.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL));
    Err(Error::from_io(&e).with_context("io_uring_setup"))
}

fn finish(uring: IoUring, config: &RingConfig, level: u8) -> (IoUring, RingInfo) {
    let params = uring.params();
    let mut info = RingInfo {
        sq_entries: params.sq_entries(),
        cq_entries: params.cq_entries(),
        defer_taskrun: level == 2,
        coop_taskrun: level == 1,
        taskrun_flag: level > 0,
        min_timeout: params.is_feature_min_timeout(),
        sqpoll: params.is_setup_sqpoll(),
        iopoll: params.is_setup_iopoll(),
        ext_arg: params.is_feature_ext_arg(),
        nodrop: params.is_feature_nodrop(),
        ..RingInfo::default()
    };
    let mut probe = Probe::new();
    if uring.submitter().register_probe(&mut probe).is_ok() {
        for code in 0..128u8 {
            if probe.is_supported(code) {
                info.op_bitmap |= 1u128 << code;
            }
        }
    }
    for &(code, name) in PROBED {
        if info.supports(code) {
            info.supported_ops.push(name);
        } else {
            info.unsupported_ops.push(name);
        }
    }
    if config.registered_files > 0 {
        match uring
            .submitter()
            .register_files_sparse(config.registered_files)
        {
            Ok(()) => info.registered_files = config.registered_files,
            Err(e) => tracing::info!(error = %e, "registered files unavailable; using raw fds"),
        }
    }
    (uring, info)
}

impl RingInfo {
    /// The fields `plugio info` and [`fmt::Display`] show, in order, as
    /// (name, value): one place for both layouts.
    pub(crate) fn fields(&self) -> [(&'static str, String); 7] {
        let flags = [
            (self.defer_taskrun, "SINGLE_ISSUER|DEFER_TASKRUN"),
            (self.coop_taskrun, "COOP_TASKRUN"),
            (self.sqpoll, "SQPOLL"),
            (self.iopoll, "IOPOLL"),
        ];
        let flags: Vec<&str> = flags.iter().filter(|f| f.0).map(|f| f.1).collect();
        let unsupported = if self.unsupported_ops.is_empty() {
            "none".to_string()
        } else {
            self.unsupported_ops.join(" ")
        };
        [
            ("sq_entries", self.sq_entries.to_string()),
            ("cq_entries", self.cq_entries.to_string()),
            ("setup flags", flags.join(" ")),
            (
                "features",
                format!(
                    "EXT_ARG={} NODROP={} MIN_TIMEOUT={} TASKRUN_FLAG={}",
                    self.ext_arg, self.nodrop, self.min_timeout, self.taskrun_flag
                ),
            ),
            ("registered files", self.registered_files.to_string()),
            ("supported ops", self.supported_ops.join(" ")),
            ("unsupported ops", unsupported),
        ]
    }
}

impl fmt::Display for RingInfo {
    /// One `name: value` line per field, the values in one column (no
    /// newline after the last).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, value)) in self.fields().iter().enumerate() {
            let newline = if i == 0 { "" } else { "\n" };
            let name = format!("{name}:");
            write!(f, "{newline}{name:<21}{value}")?;
        }
        Ok(())
    }
}
