//! `plugio info PATH --json`: what `plugio info PATH` prints, as one JSON
//! object in the vocabulary of [`plugio_cli::json`] (the [`RunMeta`]
//! fields first, then `path`, `direct`, `writable`, `write_refusal`,
//! `size_bytes`, `geometry` and `io_uring`).
//!
//! Invariant: like the text form, it opens the target read-only and leaves
//! no ring behind; the fields are the public fields of
//! [`plugio_device::Geometry`] and [`plugio_device::RingInfo`].

use std::path::Path;

use plugio_cli::json::RunMeta;
use plugio_device::ring::Ring;
use plugio_device::{Backend, DeviceKind, ErrorKind, Geometry, OpenOptions, RingConfig, RingInfo};
use serde::Serialize;
use serde_json::{json, Value};

/// The description of `path` as JSON.
///
/// # Errors
/// As [`plugio_device::describe`]: not a file, block device or NVMe
/// generic device; cannot be opened read-only; no geometry.
pub fn info_json(path: &Path) -> plugio_device::Result<InfoDoc> {
    plugio_device::check_path_kind(path)?;
    let mut options = OpenOptions::new();
    options.read(true).write(false);
    let (backend, direct) = match options.open(path) {
        Ok(b) => (b, "accepted"),
        Err(e) if *e.kind() == ErrorKind::DirectIoRefused => {
            (options.direct(false).open(path)?, "refused")
        }
        Err(e) => return Err(e),
    };
    let io_uring = match Ring::new(&RingConfig::default()) {
        Ok(ring) => ring_json(ring.info()),
        Err(e) => json!({
            "available": false,
            "error": e.to_string(),
            "fallback": "the sync thread pool (pread/pwrite)",
        }),
    };
    let write_refusal = plugio_device::write_refusal(path);
    Ok(InfoDoc {
        meta: RunMeta::now("info"),
        path: path.display().to_string(),
        direct,
        writable: write_refusal.is_none(),
        write_refusal,
        size_bytes: plugio_device::file_len_bytes(path),
        geometry: geometry_json(backend.geometry()),
        io_uring,
    })
}

/// The document `info --json` prints: the [`RunMeta`] fields first (a
/// struct, so serde keeps this order; a `serde_json::Value` map sorts its
/// keys).
#[derive(Debug, Serialize)]
pub struct InfoDoc {
    #[serde(flatten)]
    meta: RunMeta,
    path: String,
    direct: &'static str,
    /// Whether this process could open the target for writing.
    writable: bool,
    /// Why not (`plugio_device::write_refusal`); null when it could.
    write_refusal: Option<String>,
    /// A regular file's length in bytes; null for a device (its capacity
    /// is `geometry.capacity_bytes`).
    size_bytes: Option<u64>,
    geometry: Value,
    io_uring: Value,
}

fn geometry_json(g: &Geometry) -> Value {
    json!({
        "kind": match g.kind {
            DeviceKind::File => "file",
            DeviceKind::BlockDevice => "block device",
            DeviceKind::Memory => "memory",
            _ => "other",
        },
        "direct": g.direct,
        "logical_block_bytes": g.logical_block_bytes,
        "physical_block_bytes": g.physical_block_bytes,
        "dio_mem_align_bytes": g.dio_mem_align_bytes,
        "dio_offset_align_bytes": g.dio_offset_align_bytes,
        "max_sectors_kb": g.max_sectors_kb,
        "max_hw_sectors_kb": g.max_hw_sectors_kb,
        "max_segments": g.max_segments,
        "max_segment_bytes": g.max_segment_bytes,
        "nr_requests": g.nr_requests,
        "rotational": g.rotational,
        "nomerges": g.nomerges,
        "capacity_bytes": g.capacity_bytes,
        "source": g.source.as_ref().map(|p| p.display().to_string()),
    })
}

fn ring_json(r: &RingInfo) -> Value {
    json!({
        "available": true,
        "sq_entries": r.sq_entries,
        "cq_entries": r.cq_entries,
        "defer_taskrun": r.defer_taskrun,
        "coop_taskrun": r.coop_taskrun,
        "taskrun_flag": r.taskrun_flag,
        "min_timeout": r.min_timeout,
        "sqpoll": r.sqpoll,
        "iopoll": r.iopoll,
        "ext_arg": r.ext_arg,
        "nodrop": r.nodrop,
        "registered_files": r.registered_files,
        "supported_ops": r.supported_ops,
        "unsupported_ops": r.unsupported_ops,
    })
}
