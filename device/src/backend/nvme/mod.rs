//! The NVMe passthrough backend: IO to an NVMe namespace through its
//! generic character device `/dev/ngXnY` with `IORING_OP_URING_CMD`,
//! bypassing the kernel block layer (the path fio's `io_uring_cmd` engine
//! and `t/io_uring -u1` take; Linux 5.19+, "io_uring passthrough support").
//!
//! # Design
//!
//! - Each core has its own passthrough ring (`IORING_SETUP_SQE128 |
//!   IORING_SETUP_CQE32`, [`CmdRing`](crate::ring::CmdRing)), built on the
//!   first passthrough submit and owned by the core's main ring, which
//!   drives it inside the same park: the passthrough ring's registered
//!   eventfd is read by an SQE kept armed on the main ring, so a passthrough
//!   completion wakes the core's one blocking `io_uring_enter`; each park
//!   submits the passthrough SQEs and reaps both CQs. One passthrough ring
//!   serves every namespace the core talks to, as fio does.
//! - One [`IoOp`] = one NVMe command: Read (0x02) and Write (0x01) with FUA
//!   in cdw12 bit 30, Flush (0x00, also for `Fsync`), Write Zeroes (0x08,
//!   Deallocate bit 25 when [`NvmeOptions::write_zeroes_deallocate`]),
//!   Dataset Management deallocate (0x09) for `Discard` with a one-range
//!   list the slot keeps alive until the CQE. slba goes in cdw10/11, the
//!   0-based block count in cdw12. A single segment uses
//!   `NVME_URING_CMD_IO` (with `IORING_URING_CMD_FIXED` when the buffer is
//!   in the core's registered arena), several use `NVME_URING_CMD_IO_VEC`.
//!   `PREFLUSH` links a Flush ahead of the op (`IOSQE_IO_LINK`). `Nop`
//!   completes through the main ring.
//! - Completions: `res == 0` is success for the whole command (the handler
//!   gets the byte length for reads and writes, 0 otherwise); `res > 0` is
//!   an NVMe status, delivered as [`nvme_status_result`](crate::error::nvme_status_result)
//!   so `Error::from_errno` gives [`ErrorKind::Nvme`];
//!   `res < 0` is an errno.
//! - Geometry: LBA size, capacity and MDTS from admin Identify (Namespace
//!   CNS 0, Controller CNS 1), with sysfs `max_hw_sectors_kb` as a cap, so
//!   `max_sectors_kb`/`max_hw_sectors_kb` make the engine split IOs into
//!   commands the controller accepts (1 MiB on a 256 KiB MDTS = 4
//!   commands).
//! - `IOPOLL`: with [`NvmeOptions::iopoll`], and only when the namespace's
//!   queue has poll queues (`queue/io_poll` is 1; `nvme.poll_queues=N`), the
//!   core uses a second, polled passthrough ring for it; otherwise the
//!   interrupt-driven one. Only on Linux 6.5+ ([`MIN_KERNEL_FOR_IOPOLL`]):
//!   6.1-6.4 polled passthrough can fault in the kernel.
//! - Registered buffers: where the kernel refuses `IORING_URING_CMD_FIXED`
//!   for a buffer (`-EINVAL`, as Linux 6.1 does), the command is resent
//!   with the plain address and the core stops using fixed buffers for
//!   passthrough.
//! - Not carried: the IO priority in [`IoFlags`] (the `UringCmd80` SQE
//!   builder has no `ioprio`) and metadata (namespaces with separate
//!   metadata are used without it).
//!
//! # Invariants
//!
//! - Nothing is queued for an op that fails a check or fails to build: the
//!   submit returns the error and no slot is taken.
//! - The namespace node stays open while any command on it is in flight
//!   (each slot holds the descriptor).
//! - Offsets and lengths are multiples of the LBA size (a 512-byte IO on a
//!   4 KiB namespace is refused before submission).

pub mod cmd;
pub mod identify;

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use io_uring::{opcode, squeue, types};

use self::cmd::{DsmRange, NvmeCmd, NVME_URING_CMD_IO, NVME_URING_CMD_IO_VEC};
use self::identify::{NsInfo, SysfsDirs};
use super::{check_op, Backend, BackendKind};
use crate::core::HandlerId;
use crate::error::{Error, ErrorKind, InvalidInput, Result};
use crate::geometry::{DeviceKind, Geometry};
use crate::op::{IoFlags, IoOp, OpKind};
use crate::ring::{self, CmdSlot};

/// Defaults used where sysfs has no block device for the namespace.
const DEFAULT_MAX_SEGMENTS: u32 = 127;
const DEFAULT_NR_REQUESTS: u32 = 1023;

/// How to open a namespace for passthrough.
#[derive(Debug, Clone, Default)]
pub struct NvmeOptions {
    /// Use a polled (`IORING_SETUP_IOPOLL`) passthrough ring when the
    /// namespace has poll queues; ignored (interrupt-driven) otherwise.
    /// Default false.
    pub iopoll: bool,
    /// Set the Deallocate bit (cdw12 bit 25) on Write Zeroes, letting the
    /// controller unmap the range. Default false.
    pub write_zeroes_deallocate: bool,
}

/// True when `path` names an NVMe generic character device (`/dev/ngXnY`,
/// or any character device whose file name starts with `ng` and is
/// followed by `<ctrl>n<ns>`). Paths that do not exist are judged by name.
/// Only a path with such a name is looked up (a blocking `stat`); any
/// other name is answered from the name alone.
///
/// ```
/// assert!(!plugio_device::is_passthrough_path("/var/db/table.db"));
/// assert!(plugio_device::is_passthrough_path("/nonexistent/ng0n1"));
/// ```
pub fn is_passthrough_path(path: impl AsRef<Path>) -> bool {
    let path = path.as_ref();
    if !is_passthrough_name(path) {
        return false;
    }
    fs::metadata(path).map_or(true, |meta| meta.file_type().is_char_device())
}

/// True when the file name of `path` has the form of an NVMe generic
/// character device's, `ng<ctrl>n<ns>` (`ng0n1`), whatever the path is
/// (no lookup). A regular file may have such a name too.
///
/// ```
/// assert!(plugio_device::is_passthrough_name("/dev/ng0n1"));
/// assert!(!plugio_device::is_passthrough_name("/dev/nvme0n1"));
/// ```
pub fn is_passthrough_name(path: impl AsRef<Path>) -> bool {
    path.as_ref()
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(is_ng_name)
}

fn is_ng_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("ng") else {
        return false;
    };
    let mut parts = rest.splitn(2, 'n');
    let ctrl = parts.next().unwrap_or("");
    let ns = parts.next().unwrap_or("");
    !ctrl.is_empty()
        && !ns.is_empty()
        && ctrl.bytes().all(|b| b.is_ascii_digit())
        && ns.bytes().all(|b| b.is_ascii_digit())
}

/// The generic character device for block device `nvmeXnY` (the kernel
/// names it `ngXnY` in the same directory); `None` for other names
/// (partitions `nvmeXnYpZ` have none).
pub fn passthrough_path_for(block_path: impl AsRef<Path>) -> Option<PathBuf> {
    let path = block_path.as_ref();
    let name = path.file_name()?.to_str()?;
    let ng = format!("ng{}", name.strip_prefix("nvme")?);
    is_ng_name(&ng).then(|| path.with_file_name(ng))
}

/// A built command: the SQE (and its unfixed form), the result to deliver
/// on success, and the payload the SQE points to (kept alive by the slot
/// until the CQE).
struct Built {
    entry: squeue::Entry128,
    /// The same command without a registered buffer, when `entry` uses one.
    unfixed: Option<squeue::Entry128>,
    ok_result: i32,
    payload: Option<Box<dyn std::any::Any>>,
}

impl Built {
    fn plain(entry: squeue::Entry128, ok_result: i32) -> Self {
        Self {
            entry,
            unfixed: None,
            ok_result,
            payload: None,
        }
    }
}

/// An NVMe namespace opened for io_uring passthrough.
#[derive(Debug)]
pub struct NvmeBackend {
    fd: Arc<OwnedFd>,
    path: PathBuf,
    info: NsInfo,
    geometry: Geometry,
    polled: bool,
    options: NvmeOptions,
}

impl NvmeBackend {
    /// Opens `path` (`/dev/ngXnY`, or `/dev/nvmeXnY`, which is mapped to its
    /// generic character device) with default [`NvmeOptions`].
    ///
    /// # Errors
    /// See [`NvmeBackend::open_with`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, &NvmeOptions::default())
    }

    /// Opens `path` with `options`: reads the nsid (`NVME_IOCTL_ID`), the
    /// LBA format, size and MDTS (admin Identify), and the sysfs queue
    /// limits where the block device exists.
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] when there is no generic character device
    /// (kernel before 5.13, or not an NVMe namespace);
    /// [`ErrorKind::PermissionDenied`] without read/write access to the node
    /// (root or `CAP_SYS_ADMIN`, or a node made accessible) — the message
    /// names the block device path that works without passthrough;
    /// [`ErrorKind::Unsupported`] for a namespace with inline metadata or
    /// an unusable LBA format; the ioctl errors otherwise. Each error
    /// carries the path.
    pub fn open_with(path: impl AsRef<Path>, options: &NvmeOptions) -> Result<Self> {
        let path = resolve_path(path.as_ref())?;
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| open_error(&e, &path))?;
        let ng_name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let dirs = identify::sysfs_dirs(Path::new("/sys"), &ng_name);
        let info = identify::read_ns_info(file.as_raw_fd(), dirs.ctrl.as_deref())
            .map_err(|e| permission_hint(e).with_path(&path))?;
        let geometry = geometry_of(&info, &dirs);
        cross_check_sysfs(&path, &geometry, &dirs);
        let polled = options.iopoll && can_poll(&path, &dirs);
        Ok(Self {
            fd: Arc::new(OwnedFd::from(file)),
            path,
            info,
            geometry,
            polled,
            options: options.clone(),
        })
    }

    /// The generic character device path in use.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace's identity and limits.
    pub fn info(&self) -> &NsInfo {
        &self.info
    }

    /// The namespace id.
    pub fn nsid(&self) -> u32 {
        self.info.nsid
    }

    /// True when commands go through the polled (`IOPOLL`) ring.
    pub fn is_polled(&self) -> bool {
        self.polled
    }

    /// Whether this core's passthrough ring for this namespace can use the
    /// core's registered buffers (`IORING_URING_CMD_FIXED` for ops whose
    /// `fixed_buf` is set); builds the ring if needed.
    ///
    /// # Errors
    /// [`ErrorKind::NoDriver`] off a core with a ring; the ring setup error.
    pub fn fixed_buffers_here(&self) -> Result<bool> {
        Ok(current_ring()?.cmd_ring(self.polled)?.fixed_buffers())
    }

    /// The raw descriptor of the namespace node.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Checks like [`Backend::check`] but without the capacity check, so a
    /// command past the end of the namespace reaches the controller (which
    /// answers with an NVMe "LBA Out of Range" status). For testing the
    /// device's own error path.
    ///
    /// # Errors
    /// As [`Backend::check`], less the range error.
    pub fn check_unbounded(&self, op: &IoOp<'_>) -> Result<()> {
        let mut unbounded = self.geometry.clone();
        unbounded.capacity_bytes = None;
        check_op(&unbounded, op)?;
        self.check_command(op)
    }

    /// [`Backend::submit`] without the capacity check (see
    /// [`NvmeBackend::check_unbounded`]).
    ///
    /// # Safety
    /// As [`Backend::submit`].
    ///
    /// # Errors
    /// As [`Backend::submit`], less the range error.
    pub unsafe fn submit_unbounded(
        &self,
        op: &IoOp<'_>,
        handler: HandlerId,
        token: u64,
    ) -> Result<()> {
        self.check_unbounded(op)?;
        check_command_size(&self.geometry, self.info.lba_shift, op)?;
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.queue(op, handler, token) }
    }

    /// The NVMe-specific checks: supported op kinds. (The per-command size
    /// limit is checked at submit: [`Backend::check`] also vets whole IOs
    /// the engine is about to split.)
    fn check_command(&self, op: &IoOp<'_>) -> Result<()> {
        let unsupported =
            |what: &'static str| Err(Error::new(ErrorKind::Unsupported).with_context(what));
        match op.kind {
            OpKind::Fallocate { .. } => return unsupported("fallocate on an NVMe namespace"),
            OpKind::WriteZeroes if !self.info.write_zeroes => {
                return unsupported("the controller has no Write Zeroes (ONCS bit 3)")
            }
            OpKind::Discard if !self.info.dsm => {
                return unsupported("the controller has no Dataset Management (ONCS bit 2)")
            }
            _ => {}
        }
        Ok(())
    }

    /// Builds the command(s) and queues them on this core's passthrough
    /// ring. Nothing is queued on error.
    ///
    /// # Safety
    /// As [`Backend::submit`]; `op` has passed the checks.
    unsafe fn queue(&self, op: &IoOp<'_>, handler: HandlerId, token: u64) -> Result<()> {
        let main = current_ring()?;
        if op.kind == OpKind::Nop {
            main.push(
                opcode::Nop::new().build(),
                None,
                ring::NO_FILE,
                handler,
                token,
            );
            return Ok(());
        }
        let cmd_ring = main
            .cmd_ring(self.polled)
            .map_err(|e| e.with_path(&self.path))?;
        let built = self.build(op, cmd_ring.fixed_buffers())?;
        let preflush = op
            .flags
            .contains(IoFlags::PREFLUSH)
            .then(|| self.uring_cmd(NVME_URING_CMD_IO, &NvmeCmd::flush(self.info.nsid), None));
        cmd_ring.push(CmdSlot {
            handler,
            token,
            entry: built.entry,
            ok_result: built.ok_result,
            preflush,
            preflush_result: 0,
            unfixed: built.unfixed,
            _payload: built.payload,
            _file: Arc::clone(&self.fd),
        });
        Ok(())
    }

    fn uring_cmd(&self, cmd_op: u32, cmd: &NvmeCmd, buf_index: Option<u16>) -> squeue::Entry128 {
        opcode::UringCmd80::new(types::Fd(self.fd.as_raw_fd()), cmd_op)
            .cmd(cmd.to_sqe_cmd())
            .buf_index(buf_index)
            .build()
    }

    /// The SQE, the result to deliver on success, and any payload the
    /// command points to.
    fn build(&self, op: &IoOp<'_>, fixed_ok: bool) -> Result<Built> {
        let nsid = self.info.nsid;
        let shift = self.info.lba_shift;
        let slba = op.offset_bytes >> shift;
        let nlb = (op.len_bytes >> shift) as u32;
        let io = |cmd: &NvmeCmd| self.uring_cmd(NVME_URING_CMD_IO, cmd, None);
        match op.kind {
            OpKind::Read | OpKind::Write => self.build_rw(op, slba, nlb, fixed_ok),
            OpKind::Flush | OpKind::Fsync => Ok(Built::plain(io(&NvmeCmd::flush(nsid)), 0)),
            OpKind::WriteZeroes => {
                let deac = self.options.write_zeroes_deallocate;
                let cmd = NvmeCmd::write_zeroes(nsid, slba, nlb, deac);
                Ok(Built::plain(io(&cmd), 0))
            }
            OpKind::Discard => {
                let ranges: Box<[DsmRange]> = Box::new([DsmRange {
                    cattr: 0,
                    nlb: (op.len_bytes >> shift) as u32,
                    slba,
                }]);
                let cmd = NvmeCmd::deallocate(nsid, ranges.as_ptr() as u64, 1);
                let mut built = Built::plain(io(&cmd), 0);
                built.payload = Some(Box::new(ranges));
                Ok(built)
            }
            OpKind::Nop | OpKind::Fallocate { .. } => {
                Err(Error::new(ErrorKind::Unsupported).with_context("no NVMe command for this op"))
            }
        }
    }

    /// Read or Write: one segment with `NVME_URING_CMD_IO` (on a registered
    /// buffer when possible), several with `NVME_URING_CMD_IO_VEC`.
    fn build_rw(&self, op: &IoOp<'_>, slba: u64, nlb: u32, fixed_ok: bool) -> Result<Built> {
        let len = i32::try_from(op.len_bytes).map_err(|_| {
            Error::invalid(InvalidInput::Length {
                len_bytes: op.len_bytes,
                max_bytes: i32::MAX as u64,
            })
        })?;
        let write = op.kind == OpKind::Write;
        let fua = op.flags.contains(IoFlags::FUA);
        let mut cmd = NvmeCmd::rw(write, self.info.nsid, slba, nlb, fua);
        if let [seg] = op.segments {
            cmd.addr = seg.iov_base as u64;
            cmd.data_len = seg.iov_len as u32;
            let plain = self.uring_cmd(NVME_URING_CMD_IO, &cmd, None);
            return Ok(match op.fixed_buf.filter(|&i| fixed_ok && i == 0) {
                Some(index) => Built {
                    entry: self.uring_cmd(NVME_URING_CMD_IO, &cmd, Some(index)),
                    unfixed: Some(plain),
                    ok_result: len,
                    payload: None,
                },
                None => Built::plain(plain, len),
            });
        }
        cmd.addr = op.segments.as_ptr() as u64;
        cmd.data_len = op.segments.len() as u32;
        Ok(Built::plain(
            self.uring_cmd(NVME_URING_CMD_IO_VEC, &cmd, None),
            len,
        ))
    }
}

/// One command's size limits: MDTS (data and Write Zeroes, via the
/// geometry's request limit) and the 32-bit DSM range length.
fn check_command_size(geometry: &Geometry, lba_shift: u32, op: &IoOp<'_>) -> Result<()> {
    let max = geometry.max_request_bytes();
    let limited = matches!(op.kind, OpKind::Read | OpKind::Write | OpKind::WriteZeroes);
    if limited && op.len_bytes > max {
        return Err(Error::invalid(InvalidInput::Length {
            len_bytes: op.len_bytes,
            max_bytes: max,
        }));
    }
    let blocks = op.len_bytes >> lba_shift;
    if op.kind == OpKind::Discard && blocks > u64::from(u32::MAX) {
        return Err(Error::invalid(InvalidInput::Length {
            len_bytes: op.len_bytes,
            max_bytes: u64::from(u32::MAX) << lba_shift,
        }));
    }
    Ok(())
}

impl Backend for NvmeBackend {
    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn write_zeroes_support(&self) -> Option<bool> {
        Some(self.info.write_zeroes)
    }

    fn kind(&self) -> BackendKind {
        BackendKind::NvmePassthrough
    }

    fn check(&self, op: &IoOp<'_>) -> Result<()> {
        check_op(&self.geometry, op)?;
        self.check_command(op)
    }

    unsafe fn submit(&self, op: &IoOp<'_>, handler: HandlerId, token: u64) -> Result<()> {
        self.check(op)?;
        check_command_size(&self.geometry, self.info.lba_shift, op)?;
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.queue(op, handler, token) }
    }
}

/// This core's main ring, which owns and drives the passthrough ring.
fn current_ring() -> Result<std::rc::Rc<ring::Ring>> {
    let ring = crate::core::current_ring().ok_or_else(|| {
        Error::new(ErrorKind::NoDriver).with_context(
            "NVMe passthrough needs this core's io_uring (a DeviceDriver with a ring; \
             io_uring may be disabled here); the block device /dev/nvmeXnY works without it",
        )
    })?;
    if ring.stale() {
        // The parent's ring, in a forked child: never touched.
        return Err(crate::fork::forked_error());
    }
    Ok(ring)
}

/// `/dev/nvmeXnY` -> `/dev/ngXnY`; other paths unchanged; a path that is
/// neither a generic character device nor mappable to one is refused.
fn resolve_path(path: &Path) -> Result<PathBuf> {
    let meta = fs::metadata(path).map_err(|e| Error::from_io(&e).with_path(path))?;
    if meta.file_type().is_char_device() {
        return Ok(path.to_path_buf());
    }
    if meta.file_type().is_block_device() {
        if let Some(ng) = passthrough_path_for(path) {
            if fs::metadata(&ng).is_ok_and(|m| m.file_type().is_char_device()) {
                return Ok(ng);
            }
            return Err(Error::new(ErrorKind::NotFound)
                .with_context(
                    "no NVMe generic character device /dev/ngXnY for this namespace (Linux 5.13+); \
                     open the block device with the file backend instead",
                )
                .with_path(ng));
        }
    }
    Err(Error::new(ErrorKind::Unsupported)
        .with_context("NVMe passthrough needs /dev/ngXnY or /dev/nvmeXnY")
        .with_path(path))
}

fn open_error(e: &std::io::Error, path: &Path) -> Error {
    permission_hint(Error::from_io(e)).with_path(path)
}

/// Adds what is missing and what still works to a permission error.
fn permission_hint(e: Error) -> Error {
    if *e.kind() == ErrorKind::PermissionDenied {
        e.with_context(
            "NVMe passthrough needs read/write access to /dev/ngXnY and, for admin Identify, \
             CAP_SYS_ADMIN (run as root); the block device /dev/nvmeXnY still works through \
             the file backend (Device::open)",
        )
    } else {
        e
    }
}

/// Warns when the block layer's view (sysfs) disagrees with Identify (a
/// namespace reformatted behind the kernel's back); Identify wins.
fn cross_check_sysfs(path: &Path, g: &Geometry, dirs: &SysfsDirs) {
    let Some(block) = dirs.block.as_deref() else {
        return;
    };
    let lbs = identify::queue_limit(block, "logical_block_size");
    let size_bytes = fs::read_to_string(block.join("size"))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .map(|sectors| sectors * 512);
    if lbs.is_some_and(|l| l != u64::from(g.logical_block_bytes))
        || size_bytes.is_some_and(|s| Some(s) != g.capacity_bytes)
    {
        tracing::warn!(
            path = %path.display(),
            sysfs_lba_bytes = ?lbs,
            sysfs_size_bytes = ?size_bytes,
            identify_lba_bytes = g.logical_block_bytes,
            identify_size_bytes = ?g.capacity_bytes,
            "sysfs and Identify disagree; using Identify (rescan the controller to refresh the block device)"
        );
    }
}

/// The first kernel whose passthrough IOPOLL is safe: Linux 6.1 added
/// IOPOLL for `URING_CMD`, but until 6.5 ("nvme: improved uring polling",
/// which polls the request instead of a bio) the poll could touch a bio
/// already completed and freed. Seen here: a general protection fault in
/// `bio_poll` from `nvme_ns_head_chr_uring_cmd_iopoll` on Debian's 6.1.0-57
/// within seconds of polled passthrough IO.
pub const MIN_KERNEL_FOR_IOPOLL: (u32, u32) = (6, 5);

/// IOPOLL passthrough needs poll queues on the namespace's queue
/// (`queue/io_poll` = 1, from `nvme.poll_queues=N`) and a kernel at least
/// [`MIN_KERNEL_FOR_IOPOLL`].
fn can_poll(path: &Path, dirs: &SysfsDirs) -> bool {
    let poll_queues = dirs
        .block
        .as_deref()
        .and_then(|b| identify::queue_limit(b, "io_poll"))
        == Some(1);
    let kernel_ok = kernel_version() >= MIN_KERNEL_FOR_IOPOLL;
    if !poll_queues || !kernel_ok {
        tracing::info!(
            path = %path.display(),
            poll_queues,
            kernel_ok,
            "IOPOLL passthrough unavailable (needs nvme.poll_queues=N and Linux 6.5+): interrupt-driven"
        );
    }
    poll_queues && kernel_ok
}

/// The running kernel's `(major, minor)`; `(0, 0)` when unknown.
fn kernel_version() -> (u32, u32) {
    let text = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = text
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The geometry the engine splits and aligns by.
fn geometry_of(info: &NsInfo, dirs: &SysfsDirs) -> Geometry {
    let lba = 1u32 << info.lba_shift;
    let q = |name| {
        dirs.block
            .as_deref()
            .and_then(|b| identify::queue_limit(b, name))
    };
    let max_bytes = identify::max_command_bytes(info, q("max_hw_sectors_kb"));
    let max_kb = (max_bytes / 1024).max(1) as u32;
    let to_u32 = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    // dma_alignment is a mask (2^n - 1) and the LBA size a power of two:
    // the alignment checks use masks.
    debug_assert!(q("dma_alignment").is_none_or(|a| (a + 1).is_power_of_two()));
    Geometry {
        kind: DeviceKind::BlockDevice,
        direct: true,
        logical_block_bytes: lba,
        physical_block_bytes: q("physical_block_size").map_or(lba, to_u32),
        dio_mem_align_bytes: q("dma_alignment").map_or(4, |a| to_u32(a + 1)),
        dio_offset_align_bytes: lba,
        max_sectors_kb: max_kb,
        max_hw_sectors_kb: max_kb,
        max_segments: q("max_segments").map_or(DEFAULT_MAX_SEGMENTS, to_u32),
        max_segment_bytes: q("max_segment_size").map_or(u32::MAX, to_u32),
        nr_requests: q("nr_requests").map_or(DEFAULT_NR_REQUESTS, to_u32),
        rotational: false,
        nomerges: q("nomerges").map_or(0, |v| v.min(2) as u8),
        capacity_bytes: Some(info.nsze_blocks << info.lba_shift),
        source: dirs.block.as_ref().map(|b| b.join("queue")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(lba_shift: u32, mdts_bytes: Option<u64>) -> NsInfo {
        NsInfo {
            nsid: 1,
            nsze_blocks: 1 << 17,
            lba_shift,
            metadata_bytes: 0,
            mdts_bytes,
            cap_mpsmin: None,
            write_zeroes: true,
            dsm: true,
            volatile_cache: true,
        }
    }

    #[test]
    fn names_are_recognised_and_mapped() {
        assert!(is_passthrough_path("/nonexistent/ng0n1"));
        assert!(is_passthrough_path("/nonexistent/ng12n34"));
        assert!(!is_passthrough_path("/nonexistent/nvme0n1"));
        assert!(!is_passthrough_path("/nonexistent/ngx"));
        assert!(!is_passthrough_path("/dev/null"));
        assert_eq!(
            passthrough_path_for("/dev/nvme1n2"),
            Some(PathBuf::from("/dev/ng1n2"))
        );
        assert_eq!(passthrough_path_for("/dev/nvme0n1p1"), None);
        assert_eq!(passthrough_path_for("/dev/sda"), None);
    }

    #[test]
    fn geometry_follows_mdts_and_lba_size() {
        let g = geometry_of(&info(12, Some(256 << 10)), &SysfsDirs::default());
        assert_eq!(g.logical_block_bytes, 4096);
        assert_eq!(g.dio_offset_align_bytes, 4096);
        assert_eq!((g.max_sectors_kb, g.max_hw_sectors_kb), (256, 256));
        assert_eq!(g.max_request_bytes(), 256 << 10);
        assert_eq!(g.capacity_bytes, Some(512 << 20));
        // 1 MiB splits into 4 commands of 256 KiB.
        assert_eq!((1u64 << 20).div_ceil(g.max_request_bytes()), 4);
    }

    #[test]
    fn commands_above_mdts_are_refused_at_submit() {
        let g = geometry_of(&info(9, Some(256 << 10)), &SysfsDirs::default());
        let mut buf = crate::DmaBuf::new(512 << 10);
        let segs = [buf.iovec(512 << 10)];
        let big = IoOp::read(0, &segs);
        // The whole IO passes the generic checks (the engine splits it)...
        assert!(check_op(&g, &big).is_ok());
        // ...but is too large for one command.
        let err = check_command_size(&g, 9, &big).expect_err("above MDTS");
        assert!(matches!(
            err.kind(),
            ErrorKind::InvalidInput(InvalidInput::Length { max_bytes, .. }) if *max_bytes == 256 << 10
        ));
        let wz = IoOp::range(OpKind::WriteZeroes, 0, 256 << 10);
        assert!(check_command_size(&g, 9, &wz).is_ok());
        let discard = IoOp::range(OpKind::Discard, 0, 64 << 20);
        assert!(check_command_size(&g, 9, &discard).is_ok());
    }

    #[test]
    fn open_of_a_non_nvme_path_is_a_clear_error() {
        let err = NvmeBackend::open("/dev/null").expect_err("not nvme");
        let text = err.to_string();
        assert!(text.contains("/dev/null"), "{text}");
        let err = NvmeBackend::open("/nonexistent/ng0n1").expect_err("missing");
        assert_eq!(*err.kind(), ErrorKind::NotFound);
        let tmp = tempfile::NamedTempFile::new().expect("tmp");
        let err = NvmeBackend::open(tmp.path()).expect_err("regular file");
        assert_eq!(*err.kind(), ErrorKind::Unsupported, "{err}");
    }

    #[test]
    fn kernel_version_is_read() {
        let (major, minor) = kernel_version();
        assert!(major >= 3, "{major}.{minor}");
    }

    #[test]
    fn a_thread_without_a_ring_gets_a_clear_error() {
        let err = std::thread::spawn(|| current_ring().expect_err("no driver here"))
            .join()
            .expect("thread");
        assert_eq!(*err.kind(), ErrorKind::NoDriver);
        assert!(err.to_string().contains("/dev/nvmeXnY"), "{err}");
    }

    #[test]
    fn permission_errors_name_the_block_device_path() {
        let err = permission_hint(Error::from_errno(libc::EACCES));
        let text = err.to_string();
        assert!(
            text.contains("CAP_SYS_ADMIN") && text.contains("/dev/nvmeXnY"),
            "{text}"
        );
    }
}
