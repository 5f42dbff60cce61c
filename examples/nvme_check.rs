//! `nvme_check`: drives the whole plugio engine over NVMe passthrough
//! (`/dev/ngXnY`, `IORING_OP_URING_CMD`) and checks every result, on a
//! controller whose namespaces hold the `LBA%08d` pattern at the start of
//! each of their first 65536 blocks (what `../shared/tools/nvme-vm/`
//! prefills). `tests/nvme/run.sh` runs it in that VM for several
//! configurations.
//!
//! ```text
//! nvme_check [--lba BYTES] [--mdts-kb KB] [--bench OPS] [--iopoll] [NG_PATH...]
//! ```
//!
//! Without paths it uses every `/dev/ng*n*`. `--lba`/`--mdts-kb` assert the
//! namespace's LBA size and command limit; `--bench OPS` adds a QD-32 4 KiB
//! random-read comparison of `/dev/ngXnY` against `/dev/nvmeXnY` through
//! the same engine. Exits 0 only when every check passed.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use futures::future::join_all;
use plugio_device::backend::nvme::{NvmeBackend, NvmeOptions};
use plugio_device::{
    register_handler, Backend, BackendKind, CompletionHandler, DmaBuf, Error, ErrorKind, Geometry,
    HandlerId, InvalidInput, IoOp, RingConfig,
};
use plugio_engine::{Device, DeviceOptions};

/// Bytes of the per-block pattern the VM image carries (`LBA%08d`).
const TAG_BYTES: usize = 11;
/// Blocks that carry the pattern.
const PATTERN_BLOCKS: u64 = 65536;

struct Args {
    paths: Vec<PathBuf>,
    lba: Option<u32>,
    mdts_kb: Option<u64>,
    bench_ops: usize,
    iopoll: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        paths: Vec::new(),
        lba: None,
        mdts_kb: None,
        bench_ops: 0,
        iopoll: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(format!("{name} needs a number"))
        };
        match a.as_str() {
            "--lba" => args.lba = Some(value("--lba")? as u32),
            "--mdts-kb" => args.mdts_kb = Some(value("--mdts-kb")?),
            "--bench" => args.bench_ops = value("--bench")? as usize,
            "--iopoll" => args.iopoll = true,
            p if !p.starts_with('-') => args.paths.push(PathBuf::from(p)),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if args.paths.is_empty() {
        let mut found: Vec<PathBuf> = std::fs::read_dir("/dev")
            .map_err(|e| e.to_string())?
            .flatten()
            .map(|e| e.path())
            .filter(|p| plugio_device::is_passthrough_path(p))
            .collect();
        found.sort();
        args.paths = found;
    }
    if args.paths.is_empty() {
        return Err("no /dev/ngXnY found".into());
    }
    Ok(args)
}

/// Records check results.
#[derive(Default)]
struct Report {
    failed: Cell<usize>,
    passed: Cell<usize>,
}

impl Report {
    fn check(&self, name: &str, ok: bool, detail: impl std::fmt::Display) {
        if ok {
            self.passed.set(self.passed.get() + 1);
            println!("PASS {name}: {detail}");
        } else {
            self.failed.set(self.failed.get() + 1);
            println!("FAIL {name}: {detail}");
        }
    }
}

/// Counts what the engine sends to the backend: commands and the largest.
#[derive(Debug)]
struct Counting {
    inner: NvmeBackend,
    commands: AtomicU64,
    max_len_bytes: AtomicU64,
}

impl Backend for Counting {
    fn geometry(&self) -> &Geometry {
        self.inner.geometry()
    }
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn check(&self, op: &IoOp<'_>) -> plugio_device::Result<()> {
        self.inner.check(op)
    }
    unsafe fn submit(&self, op: &IoOp<'_>, h: HandlerId, token: u64) -> plugio_device::Result<()> {
        // Relaxed: statistics read after the IO completed on this thread.
        self.commands.fetch_add(1, Ordering::Relaxed);
        self.max_len_bytes
            .fetch_max(op.len_bytes, Ordering::Relaxed);
        // SAFETY: forwarded to the engine's promise on this call.
        unsafe { self.inner.submit(op, h, token) }
    }
}

fn tag_of(lba: u64) -> Vec<u8> {
    format!("LBA{lba:08}").into_bytes()
}

/// The blocks of `data` (starting at block `first`) that do not begin with
/// their pattern tag.
fn pattern_mismatches(data: &[u8], first: u64, block: usize) -> Vec<u64> {
    data.chunks(block)
        .enumerate()
        .map(|(i, b)| (first + i as u64, b))
        .filter(|(lba, b)| *lba < PATTERN_BLOCKS && b[..TAG_BYTES] != tag_of(*lba)[..])
        .map(|(lba, _)| lba)
        .collect()
}

/// Fills a buffer with a pattern unique to (`seed`, block).
fn fill(buf: &mut DmaBuf, first_lba: u64, block: usize, seed: u8) {
    for (i, b) in buf.as_mut_slice().chunks_mut(block).enumerate() {
        let stamp = format!("plugio-{seed:03}-{:010}", first_lba + i as u64);
        b.fill(seed);
        b[..stamp.len()].copy_from_slice(stamp.as_bytes());
    }
}

/// A one-shot result slot completed by a registered handler.
#[derive(Default)]
struct Slot {
    result: Cell<Option<i32>>,
    waker: RefCell<Option<Waker>>,
}

struct SlotHandler(Rc<Slot>);

impl CompletionHandler for SlotHandler {
    fn complete(&self, _token: u64, result: i32) {
        self.0.result.set(Some(result));
        if let Some(w) = self.0.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

struct Wait(Rc<Slot>);

impl Future for Wait {
    type Output = i32;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<i32> {
        match self.0.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                *self.0.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Submits `op` to the backend directly (no engine) and waits for its
/// result; `unbounded` skips the capacity check.
async fn submit_direct(
    backend: &NvmeBackend,
    op: &IoOp<'_>,
    unbounded: bool,
) -> plugio_device::Result<i32> {
    let slot = Rc::new(Slot::default());
    let handler = register_handler(Rc::new(SlotHandler(slot.clone())));
    // SAFETY: the memory `op` describes outlives this call, which returns
    // only after the completion was delivered.
    let submitted = unsafe {
        if unbounded {
            backend.submit_unbounded(op, handler, 7)
        } else {
            backend.submit(op, handler, 7)
        }
    };
    let result = match submitted {
        Ok(()) => Ok(Wait(slot).await),
        Err(e) => Err(e),
    };
    plugio_device::unregister_handler(handler);
    result
}

/// Reads one block past the end of the namespace through the backend
/// directly (the engine refuses it before submission).
async fn read_past_end(backend: &NvmeBackend) -> plugio_device::Result<i32> {
    let block = backend.geometry().logical_block_bytes as usize;
    let mut buf = DmaBuf::new(block);
    let segs = [buf.iovec(block)];
    let end = backend.geometry().capacity_bytes.unwrap_or(0);
    submit_direct(backend, &IoOp::read(end, &segs), true).await
}

/// A read into a registered buffer (`IORING_URING_CMD_FIXED`), directly.
async fn check_fixed_buffer(ns: &Ns, report: &Report) {
    let backend = &ns.counting.inner;
    let fixed_ring = backend.fixed_buffers_here();
    let len = 8 * ns.block;
    let mut buf = DmaBuf::new(len);
    let index = buf.fixed_index();
    let segs = [buf.iovec(len)];
    let lba = 200u64;
    let op = IoOp::read(lba * ns.block as u64, &segs).with_fixed_buf(index);
    let counted_before = plugio_device::ring::current_fixed_buf_sqes();
    let r = submit_direct(backend, &op, false).await;
    let counted = plugio_device::ring::current_fixed_buf_sqes() - counted_before;
    let bad = pattern_mismatches(buf.as_slice(), lba, ns.block);
    // Where the kernel cannot map the registered buffer for passthrough
    // (EINVAL) the command is resent with a plain buffer and the core stops
    // using fixed buffers (so a later namespace on this core starts with
    // them off): the data must be right either way.
    let fixed_after = backend.fixed_buffers_here();
    // The ring's count of registered-buffer IO (`RingStats::fixed_buf_sqes`,
    // which the engine's `fixed_buf_requests` reads) takes the command
    // when it is queued in the fixed form: where the ring had fixed
    // buffers then (a refusal and plain resend later keeps it counted).
    let expect_counted = u64::from(fixed_ring == Ok(true));
    report.check(
        "registered-buffer read (URING_CMD_FIXED or its fallback)",
        fixed_ring.is_ok()
            && index.is_some()
            && r == Ok(len as i32)
            && bad.is_empty()
            && counted == expect_counted,
        format!(
            "fixed buffers before {fixed_ring:?} after {fixed_after:?}, buffer index {index:?}, result {r:?}, bad blocks {bad:?}, fixed commands counted {counted} (expected {expect_counted})"
        ),
    );
}

struct Ns {
    path: PathBuf,
    dev: Device,
    counting: Arc<Counting>,
    block: usize,
}

fn open_ns(path: &Path, args: &Args, report: &Report) -> Result<Ns, Error> {
    let options = NvmeOptions {
        iopoll: args.iopoll,
        write_zeroes_deallocate: false,
    };
    let backend = NvmeBackend::open_with(path, &options)?;
    let g = backend.geometry().clone();
    let info = backend.info().clone();
    println!(
        "{}: nsid {} lba {} B, {} blocks, mdts {:?} B (CAP.MPSMIN {:?}), max request {} KiB, max_segments {}, polled {}",
        path.display(),
        info.nsid,
        g.logical_block_bytes,
        info.nsze_blocks,
        info.mdts_bytes,
        info.cap_mpsmin,
        g.max_sectors_kb,
        g.max_segments,
        backend.is_polled()
    );
    if let Some(lba) = args.lba {
        report.check(
            "identify lba size",
            g.logical_block_bytes == lba,
            format!("{} (expected {lba})", g.logical_block_bytes),
        );
    }
    if let Some(kb) = args.mdts_kb {
        report.check(
            "identify mdts",
            u64::from(g.max_hw_sectors_kb) == kb,
            format!("max_hw_sectors_kb {} (expected {kb})", g.max_hw_sectors_kb),
        );
    }
    check_sysfs(path, &g, report);
    if args.iopoll {
        // Polled only where the kernel's passthrough IOPOLL is safe.
        let safe = kernel_version() >= plugio_device::backend::nvme::MIN_KERNEL_FOR_IOPOLL;
        report.check(
            "IOPOLL passthrough ring where the kernel allows it",
            backend.is_polled() == safe,
            format!(
                "polled {} on Linux {:?} (needs {:?}+)",
                backend.is_polled(),
                kernel_version(),
                plugio_device::backend::nvme::MIN_KERNEL_FOR_IOPOLL
            ),
        );
    }
    check_block_path_maps(path, &info, report);
    let counting = Arc::new(Counting {
        inner: backend,
        commands: AtomicU64::new(0),
        max_len_bytes: AtomicU64::new(0),
    });
    let dev = Device::with_backend(
        counting.clone(),
        Some(path.to_path_buf()),
        DeviceOptions::default(),
    )?;
    Ok(Ns {
        path: path.to_path_buf(),
        dev,
        counting,
        block: g.logical_block_bytes as usize,
    })
}

/// Opening `/dev/nvmeXnY` selects its generic character device.
fn check_block_path_maps(
    path: &Path,
    info: &plugio_device::backend::nvme::identify::NsInfo,
    report: &Report,
) {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let block = Path::new("/dev").join(format!("nvme{}", name.trim_start_matches("ng")));
    match NvmeBackend::open(&block) {
        Ok(b) => report.check(
            "block device path maps to its ng node",
            b.path() == path && b.info() == info,
            format!("{} -> {}", block.display(), b.path().display()),
        ),
        Err(e) => report.check("block device path maps to its ng node", false, e),
    }
}

/// Identify agrees with what the block layer reports in sysfs.
fn check_sysfs(path: &Path, g: &Geometry, report: &Report) {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(block_name) = name.strip_prefix("ng").map(|r| format!("nvme{r}")) else {
        return;
    };
    let dir = Path::new("/sys/block").join(&block_name);
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    if let (Some(lbs), Some(sectors)) = (read("queue/logical_block_size"), read("size")) {
        report.check(
            "identify matches sysfs",
            lbs == u64::from(g.logical_block_bytes) && Some(sectors * 512) == g.capacity_bytes,
            format!(
                "sysfs lbs {lbs} size {} B; identify {} B, {:?} B",
                sectors * 512,
                g.logical_block_bytes,
                g.capacity_bytes
            ),
        );
    }
}

async fn check_pattern_reads(ns: &Ns, report: &Report) {
    let block = ns.block as u64;
    // Many small concurrent reads of neighbouring blocks (one plug: merged
    // where the engine merges) plus scattered ones.
    let before = ns.counting.commands.load(Ordering::Relaxed);
    let lbas: Vec<u64> = (0..64)
        .chain((0..64).map(|i| (i * 997 + 13) % PATTERN_BLOCKS))
        .collect();
    let reads = lbas
        .iter()
        .map(|&lba| ns.dev.read_alloc_at(lba * block, ns.block));
    let results = join_all(reads).await;
    let mut bad = Vec::new();
    for (lba, r) in lbas.iter().zip(results) {
        match r {
            Ok(buf) if buf.len() == ns.block => {
                bad.extend(pattern_mismatches(buf.as_slice(), *lba, ns.block))
            }
            Ok(buf) => bad.push(*lba + 1_000_000 * buf.len() as u64),
            Err(e) => {
                report.check("concurrent pattern reads", false, format!("lba {lba}: {e}"));
                return;
            }
        }
    }
    let commands = ns.counting.commands.load(Ordering::Relaxed) - before;
    report.check(
        "concurrent pattern reads",
        bad.is_empty(),
        format!(
            "{} reads in {commands} NVMe commands, mismatching blocks {:?}",
            lbas.len(),
            bad
        ),
    );
}

async fn check_split(ns: &Ns, report: &Report) {
    let len = 1usize << 20;
    let max = ns.dev.max_request_bytes();
    let before = ns.counting.commands.load(Ordering::Relaxed);
    let r = ns.dev.read_alloc_at(0, len).await;
    let commands = ns.counting.commands.load(Ordering::Relaxed) - before;
    let largest = ns.counting.max_len_bytes.load(Ordering::Relaxed);
    match r {
        Ok(buf) => {
            let bad = pattern_mismatches(buf.as_slice(), 0, ns.block);
            let expected = (len as u64).div_ceil(max);
            report.check(
                "1 MiB read split at MDTS",
                bad.is_empty() && buf.len() == len && commands == expected && largest <= max,
                format!(
                    "{commands} commands (expected {expected}) of at most {largest} B (limit {max} B), {} bad blocks",
                    bad.len()
                ),
            );
        }
        Err(e) => report.check("1 MiB read split at MDTS", false, e),
    }
}

async fn check_writes(ns: &Ns, report: &Report, seed: u8) {
    let block = ns.block;
    let base_lba = 70_000u64;
    // Concurrent writes of 1..8 blocks to neighbouring ranges, one FUA.
    let mut lba = base_lba;
    let mut writes = Vec::new();
    for i in 0..24u64 {
        let nblocks = (i % 8 + 1) as usize;
        let mut buf = ns.dev.alloc_buf(nblocks * block);
        fill(&mut buf, lba, block, seed);
        let flags = if i == 5 {
            plugio_device::IoFlags::FUA
        } else {
            plugio_device::IoFlags::NONE
        };
        writes.push(ns.dev.write_at_with(buf, lba * block as u64, flags));
        lba += nblocks as u64;
    }
    let total_blocks = (lba - base_lba) as usize;
    let results = join_all(writes).await;
    let write_errors: Vec<String> = results
        .iter()
        .filter_map(|(r, _)| r.as_ref().err().map(|e| e.to_string()))
        .collect();
    report.check(
        "concurrent writes (one FUA)",
        write_errors.is_empty(),
        format!("{} writes, errors {write_errors:?}", results.len()),
    );
    // A multi-segment write (NVME_URING_CMD_IO_VEC) after them.
    let vec_lba = lba;
    let mut segs = Vec::new();
    for s in 0..3u64 {
        let mut b = ns.dev.alloc_buf(block * 2);
        fill(&mut b, vec_lba + s * 2, block, seed.wrapping_add(1));
        segs.push(b);
    }
    let (r, _) = ns.dev.writev_at(segs, vec_lba * block as u64).await;
    report.check(
        "vectored write",
        r.as_ref().is_ok_and(|&n| n == 6 * block),
        format!("{r:?}"),
    );
    match ns.dev.sync_data().await {
        Ok(()) => report.check("flush", true, "ok"),
        Err(e) => report.check("flush", false, e),
    }
    let (sync, nop) = (ns.dev.sync_all().await, ns.dev.nop().await);
    report.check(
        "sync (NVMe Flush) and nop",
        sync.is_ok() && nop.is_ok(),
        format!("{sync:?} {nop:?}"),
    );
    // PREFLUSH | FUA: a Flush linked ahead of a FUA write.
    let pre_lba = 99_000u64;
    let mut buf = ns.dev.alloc_buf(2 * block);
    fill(&mut buf, pre_lba, block, 88);
    let expect = buf.as_slice().to_vec();
    let flags = plugio_device::IoFlags::PREFLUSH | plugio_device::IoFlags::FUA;
    let (w, _) = ns
        .dev
        .write_at_with(buf, pre_lba * block as u64, flags)
        .await;
    let back = ns
        .dev
        .read_alloc_at(pre_lba * block as u64, 2 * block)
        .await;
    report.check(
        "PREFLUSH|FUA write read back",
        w.is_ok() && back.as_ref().is_ok_and(|b| b.as_slice() == &expect[..]),
        format!("{w:?}"),
    );
    // Read everything back, in one read and with a vectored read.
    let mut expect = ns.dev.alloc_buf(total_blocks * block);
    fill(&mut expect, base_lba, block, seed);
    let got = ns
        .dev
        .read_alloc_at(base_lba * block as u64, total_blocks * block)
        .await;
    report.check(
        "writes read back",
        got.as_ref()
            .is_ok_and(|b| b.as_slice() == expect.as_slice()),
        format!("{total_blocks} blocks"),
    );
    let bufs: Vec<DmaBuf> = (0..3).map(|_| ns.dev.alloc_buf(block * 2)).collect();
    let (r, bufs) = ns.dev.readv_at(bufs, vec_lba * block as u64).await;
    let mut expect = ns.dev.alloc_buf(6 * block);
    fill(&mut expect, vec_lba, block, seed.wrapping_add(1));
    let joined: Vec<u8> = bufs.iter().flat_map(|b| b.as_slice().to_vec()).collect();
    report.check(
        "vectored read back",
        r.is_ok() && joined == expect.as_slice(),
        format!("{r:?}"),
    );
    // A 1 MiB write, split into MDTS-sized commands, read back.
    let big_lba = 80_000u64;
    let len = 1usize << 20;
    let mut big = ns.dev.alloc_buf(len);
    fill(&mut big, big_lba, block, seed.wrapping_add(2));
    let expect = big.as_slice().to_vec();
    let (r, _) = ns.dev.write_at(big, big_lba * block as u64).await;
    let back = ns.dev.read_alloc_at(big_lba * block as u64, len).await;
    report.check(
        "1 MiB split write read back",
        r.is_ok() && back.as_ref().is_ok_and(|b| b.as_slice() == &expect[..]),
        format!("{r:?}"),
    );
}

async fn check_zeroes_and_discard(ns: &Ns, report: &Report) {
    let block = ns.block as u64;
    let lba = 90_000u64;
    let len = 16 * block;
    let mut buf = ns.dev.alloc_buf(len as usize);
    fill(&mut buf, lba, ns.block, 9);
    let (r, _) = ns.dev.write_at(buf, lba * block).await;
    let wz = ns.dev.write_zeroes(lba * block, len).await;
    let back = ns.dev.read_alloc_at(lba * block, len as usize).await;
    report.check(
        "write zeroes",
        r.is_ok()
            && wz.is_ok()
            && back
                .as_ref()
                .is_ok_and(|b| b.as_slice().iter().all(|&x| x == 0)),
        format!("{wz:?}"),
    );
    let dlba = 95_000u64;
    let mut buf = ns.dev.alloc_buf(8 * ns.block);
    fill(&mut buf, dlba, ns.block, 10);
    let (w, _) = ns.dev.write_at(buf, dlba * block).await;
    let d = ns.dev.discard(dlba * block, 8 * block).await;
    let back = ns.dev.read_alloc_at(dlba * block, 8 * ns.block).await;
    // After a deallocate the data is unspecified (zeroes on QEMU); the
    // command and a read of the range must succeed.
    report.check(
        "discard (dataset management deallocate)",
        w.is_ok() && d.is_ok() && back.is_ok(),
        format!("{d:?}"),
    );
}

async fn check_errors(ns: &Ns, report: &Report) {
    let block = ns.block as u64;
    let capacity = ns.dev.geometry().capacity_bytes.unwrap_or(0);
    let r = ns.dev.read_alloc_at(capacity, ns.block).await;
    report.check(
        "engine refuses a read past the end",
        matches!(&r, Err(e) if matches!(e.kind(), ErrorKind::InvalidInput(InvalidInput::Range { .. }))),
        format!("{:?}", r.as_ref().err()),
    );
    let small = if block == 4096 { 512 } else { 256 };
    let r = ns.dev.read_alloc_at(block, small).await;
    report.check(
        "unaligned length refused",
        matches!(&r, Err(e) if matches!(e.kind(), ErrorKind::InvalidInput(InvalidInput::Alignment { .. }))),
        format!("{small}-byte read on {block}-byte LBAs: {:?}", r.as_ref().err().map(|e| e.to_string())),
    );
    match read_past_end(&ns.counting.inner).await {
        Ok(result) => {
            let err = Error::from_errno(result);
            report.check(
                "NVMe status for an LBA past the end",
                result < 0
                    && matches!(
                        err.kind(),
                        ErrorKind::Nvme {
                            sct: 0,
                            sc: 0x80,
                            ..
                        }
                    ),
                format!("result {result}: {err}"),
            );
        }
        Err(e) => report.check("NVMe status for an LBA past the end", false, e),
    }
    // Nothing else was disturbed: a read right after still works.
    let r = ns.dev.read_alloc_at(0, ns.block).await;
    report.check(
        "IO after errors",
        r.as_ref().is_ok_and(|b| {
            b.as_slice()[..TAG_BYTES] == tag_of(0)[..]
                || b.as_slice()[..TAG_BYTES] == [0u8; TAG_BYTES]
        }),
        "read of LBA 0",
    );
}

/// A write and an overlapping read issued together: the read must see the
/// write (program order is kept for overlapping IO).
async fn check_overlap_order(ns: &Ns, report: &Report) {
    let block = ns.block;
    let lba = 100_000u64;
    let mut buf = ns.dev.alloc_buf(4 * block);
    fill(&mut buf, lba, block, 77);
    let expect = buf.as_slice().to_vec();
    let write = ns.dev.write_at(buf, lba * block as u64);
    let read = ns.dev.read_alloc_at(lba * block as u64, 4 * block);
    let ((w, _), r) = futures::join!(write, read);
    report.check(
        "overlapping write then read in one plug",
        w.is_ok() && r.as_ref().is_ok_and(|b| b.as_slice() == &expect[..]),
        format!("{w:?}"),
    );
}

/// IO futures dropped while their commands are in flight: the commands
/// still complete (their buffers stay alive), the tags come back, and IO
/// afterwards is correct.
async fn check_dropped_futures(ns: &Ns, report: &Report) {
    use futures::FutureExt;
    let block = ns.block as u64;
    for lba in 300..332u64 {
        // Polled once (submitted at the tick's plug flush), then dropped.
        let pending = ns
            .dev
            .read_alloc_at(lba * block, ns.block)
            .now_or_never()
            .is_none();
        if !pending {
            return report.check(
                "dropped IO futures",
                false,
                "a read completed on its first poll",
            );
        }
    }
    let start = Instant::now();
    while ns.dev.tags_in_use() > 0 && start.elapsed().as_secs() < 10 {
        plugio_executor::sleep(std::time::Duration::from_millis(5)).await;
    }
    let r = ns.dev.read_alloc_at(300 * block, ns.block).await;
    report.check(
        "dropped IO futures",
        ns.dev.tags_in_use() == 0
            && r.as_ref()
                .is_ok_and(|b| pattern_mismatches(b.as_slice(), 300, ns.block).is_empty()),
        format!(
            "tags in use afterwards {}, then {:?}",
            ns.dev.tags_in_use(),
            r.err()
        ),
    );
}

/// Two cores, each with its own passthrough ring, on one namespace at
/// once: disjoint ranges written and read back, shared ranges read.
fn check_multicore(path: &Path, options: &NvmeOptions, report: &Report) {
    let name = "two cores, one passthrough ring each";
    let runtime = match plugio_engine::runtime::builder(RingConfig::default())
        .cores(2)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return report.check(name, false, e),
    };
    let dev = match NvmeBackend::open_with(path, options).and_then(|b| {
        Device::with_backend(
            Arc::new(b),
            Some(path.to_path_buf()),
            DeviceOptions::default(),
        )
    }) {
        Ok(d) => d,
        Err(e) => return report.check(name, false, e),
    };
    let block = dev.geometry().logical_block_bytes as usize;
    let joins: Vec<_> = (0..2u64)
        .map(|core| {
            let dev = dev.clone();
            runtime.spawn_on(core as usize, async move {
                let base = 110_000 + core * 1000;
                let writes = (0..16u64).map(|i| {
                    let mut buf = dev.alloc_buf(4 * block);
                    fill(&mut buf, base + i * 4, block, 50 + core as u8);
                    dev.write_at(buf, (base + i * 4) * block as u64)
                });
                let failed_writes = join_all(writes)
                    .await
                    .iter()
                    .filter(|(r, _)| r.is_err())
                    .count();
                let back = dev.read_alloc_at(base * block as u64, 64 * block).await;
                let mut expect = dev.alloc_buf(64 * block);
                fill(&mut expect, base, block, 50 + core as u8);
                let reads = (0..64u64).map(|i| dev.read_alloc_at((400 + i) * block as u64, block));
                let shared_ok = join_all(reads).await.iter().enumerate().all(|(i, r)| {
                    r.as_ref().is_ok_and(|b| {
                        pattern_mismatches(b.as_slice(), 400 + i as u64, block).is_empty()
                    })
                });
                let own_ok = back.is_ok_and(|b| b.as_slice() == expect.as_slice());
                (failed_writes, own_ok, shared_ok)
            })
        })
        .collect();
    let results: Vec<_> = joins.into_iter().map(futures::executor::block_on).collect();
    let ok = results.iter().all(|r| matches!(r, Ok((0, true, true))));
    let _ = runtime.shutdown(plugio_executor::ShutdownMode::Wait);
    report.check(
        name,
        ok,
        format!("per core (failed writes, own range ok, shared reads ok): {results:?}"),
    );
}

/// Both namespaces at once on this core (one shared passthrough ring).
async fn check_multi(all: &[Ns], report: &Report) {
    if all.len() < 2 {
        return;
    }
    let reads = all.iter().flat_map(|ns| {
        (100..132u64).map(move |lba| async move {
            let r = ns.dev.read_alloc_at(lba * ns.block as u64, ns.block).await;
            r.map(|b| pattern_mismatches(b.as_slice(), lba, ns.block).is_empty())
        })
    });
    let results = join_all(reads).await;
    let ok = results.iter().all(|r| matches!(r, Ok(true)));
    report.check(
        "concurrent reads on every namespace",
        ok,
        format!("{} reads on {} namespaces", results.len(), all.len()),
    );
}

/// QD-32 random 4 KiB (or one-block) reads; returns (IOPS, mismatches).
async fn bench(dev: &Device, block: usize, ops: usize) -> (f64, usize) {
    let io = block.max(4096);
    let span = PATTERN_BLOCKS * block as u64 / io as u64;
    let next = Cell::new(0usize);
    let bad = Cell::new(0usize);
    let start = Instant::now();
    let workers = (0..32).map(|w| {
        let (next, bad) = (&next, &bad);
        async move {
            let mut x = 0x9e37_79b9u64 ^ w;
            while next.get() < ops {
                next.set(next.get() + 1);
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let off = (x % span) * io as u64;
                match dev.read_alloc_at(off, io).await {
                    Ok(b)
                        if pattern_mismatches(b.as_slice(), off / block as u64, block)
                            .is_empty() => {}
                    _ => bad.set(bad.get() + 1),
                }
            }
        }
    });
    join_all(workers).await;
    (ops as f64 / start.elapsed().as_secs_f64(), bad.get())
}

async fn check_bench(ns: &Ns, ops: usize, report: &Report) {
    let name = ns.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let block_path = PathBuf::from(format!("/dev/nvme{}", name.trim_start_matches("ng")));
    let bdev = match Device::open(&block_path, DeviceOptions::default()) {
        Ok(d) => d,
        Err(e) => return report.check("bench block device", false, e),
    };
    let io = ns.block.max(4096);
    // Alternate the two paths so drift on the host hits both alike.
    let (mut pt_sum, mut bd_sum, mut bad) = (0.0, 0.0, 0);
    const ROUNDS: usize = 3;
    for round in 0..ROUNDS {
        let (pt, pt_bad) = bench(&ns.dev, ns.block, ops).await;
        let (bd, bd_bad) = bench(&bdev, ns.block, ops).await;
        println!(
            "BENCH round {round}: qd32 randread {io} B x {ops}: {} {pt:.0} IOPS, {} {bd:.0} IOPS",
            ns.path.display(),
            block_path.display()
        );
        pt_sum += pt;
        bd_sum += bd;
        bad += pt_bad + bd_bad;
    }
    let (pt, bd) = (pt_sum / ROUNDS as f64, bd_sum / ROUNDS as f64);
    println!(
        "BENCH mean of {ROUNDS}: {} {pt:.0} IOPS, {} {bd:.0} IOPS, ratio {:.2}",
        ns.path.display(),
        block_path.display(),
        pt / bd
    );
    report.check(
        "bench data correct on both paths",
        bad == 0,
        format!("{bad} reads with wrong data"),
    );
}

/// Child mode (run as an unprivileged user, uid 65534): opening must fail
/// with a clear permission error that names the block device path, or
/// succeed when `expect_denied` is false.
fn unprivileged_child(path: &str, expect_denied: bool) -> ExitCode {
    match NvmeBackend::open(path) {
        Err(e)
            if expect_denied
                && *e.kind() == ErrorKind::PermissionDenied
                && e.to_string().contains("/dev/nvmeXnY") =>
        {
            println!("PASS open as an unprivileged user is refused clearly: {e}");
            ExitCode::SUCCESS
        }
        Ok(b) if !expect_denied => {
            println!("PASS open as an unprivileged user: nsid {}", b.nsid());
            ExitCode::SUCCESS
        }
        other => {
            println!(
                "FAIL open as an unprivileged user (expect denied {expect_denied}): {other:?}"
            );
            ExitCode::FAILURE
        }
    }
}

/// Kernel release `(major, minor)`.
fn kernel_version() -> (u32, u32) {
    let text = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = text
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// Runs the unprivileged child on `path` with the node's mode set to
/// `mode` (restored afterwards).
fn check_unprivileged(path: &Path, mode: u32, expect_denied: bool, report: &Report) {
    use std::os::unix::fs::PermissionsExt;
    let name = format!("unprivileged open, node mode {mode:o}");
    let old = match std::fs::metadata(path) {
        Ok(m) => m.permissions(),
        Err(e) => return report.check(&name, false, e),
    };
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        return report.check(&name, false, e);
    }
    let child = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .arg("--unprivileged-child")
            .arg(path)
            .arg(if expect_denied { "denied" } else { "allowed" })
            .uid(65534)
            .gid(65534)
            .output()
    });
    let _ = std::fs::set_permissions(path, old);
    match child {
        Ok(out) => {
            print!("{}", String::from_utf8_lossy(&out.stdout));
            report.check(
                &name,
                out.status.success(),
                "child as uid 65534 (no CAP_SYS_ADMIN)",
            );
        }
        Err(e) => report.check(&name, false, e),
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--unprivileged-child") {
        let path = argv.get(2).map_or("/dev/ng0n1", String::as_str);
        return unprivileged_child(path, argv.get(3).map(String::as_str) != Some("allowed"));
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nvme_check: {e}");
            return ExitCode::from(2);
        }
    };
    let report = Report::default();
    // A root-only node: the open itself is refused. A node opened up to
    // everyone: Linux before 6.2 still refuses every passthrough command
    // (admin Identify included) without CAP_SYS_ADMIN; 6.2+ allows
    // Identify and IO to a node opened for writing.
    check_unprivileged(&args.paths[0], 0o600, true, &report);
    check_unprivileged(&args.paths[0], 0o666, kernel_version() < (6, 2), &report);
    let rt = match plugio_engine::runtime::local(RingConfig::default()) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nvme_check: runtime: {e}");
            return ExitCode::from(2);
        }
    };
    rt.run(async {
        let mut all = Vec::new();
        for path in &args.paths {
            match open_ns(path, &args, &report) {
                Ok(ns) => all.push(ns),
                Err(e) => report.check("open", false, format!("{}: {e}", path.display())),
            }
        }
        for (i, ns) in all.iter().enumerate() {
            println!("--- {}", ns.path.display());
            check_pattern_reads(ns, &report).await;
            check_split(ns, &report).await;
            check_writes(ns, &report, 40 + i as u8).await;
            check_zeroes_and_discard(ns, &report).await;
            check_fixed_buffer(ns, &report).await;
            check_overlap_order(ns, &report).await;
            check_dropped_futures(ns, &report).await;
            check_errors(ns, &report).await;
        }
        check_multi(&all, &report).await;
        if args.bench_ops > 0 {
            if let Some(ns) = all.first() {
                check_bench(ns, args.bench_ops, &report).await;
            }
        }
    });
    drop(rt);
    let options = NvmeOptions {
        iopoll: args.iopoll,
        write_zeroes_deallocate: false,
    };
    check_multicore(&args.paths[0], &options, &report);
    println!(
        "nvme_check: {} passed, {} failed",
        report.passed.get(),
        report.failed.get()
    );
    if report.failed.get() == 0 && report.passed.get() > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
