//! What the machine leaves this process, read before a run starts so that
//! `plugio bench` and `plugio replay` refuse a job that cannot fit instead
//! of growing until the kernel kills it.
//!
//! Invariant: every figure is read fresh from /proc and /sys; `None` where
//! the machine does not say (the caller then checks nothing).

/// Bytes of memory this process can still use, and where the figure comes
/// from (for a message): `MemAvailable` of /proc/meminfo, lowered to what the process's
/// cgroup memory limit leaves (v2 `memory.max`, v1
/// `memory.limit_in_bytes`) and to what its address-space limit leaves
/// (`RLIMIT_AS`, `ulimit -v`, less the `VmSize` already mapped; past it an
/// allocation fails and the process aborts). `None` where /proc/meminfo
/// cannot be read.
///
/// ```
/// if let Some((bytes, source)) = plugio_cli::machine::available_memory() {
///     println!("{} MiB available ({source})", bytes >> 20);
///     assert!(["MemAvailable", "its cgroup's memory limit", "its address-space limit (ulimit -v)"]
///         .contains(&source));
/// }
/// ```
pub fn available_memory() -> Option<(u64, &'static str)> {
    let mut best = memory_for_files()?;
    if let Some(left) = address_space_left() {
        if left < best.0 {
            best = (left, "its address-space limit (ulimit -v)");
        }
    }
    Some(best)
}

/// Bytes of memory that files in memory (tmpfs, ramfs) may still take,
/// and where the figure comes from: `MemAvailable` of /proc/meminfo,
/// lowered to what the process's cgroup memory limit leaves (a tmpfs page
/// is charged to the cgroup of the process that writes it). Unlike
/// [`available_memory`], not held to the address-space limit: such a
/// file's pages are not mapped into the process. `None` where
/// /proc/meminfo cannot be read.
///
/// ```
/// if let Some((bytes, source)) = plugio_cli::machine::memory_for_files() {
///     assert!(["MemAvailable", "its cgroup's memory limit"].contains(&source));
///     println!("{} MiB for files in memory ({source})", bytes >> 20);
/// }
/// ```
pub fn memory_for_files() -> Option<(u64, &'static str)> {
    let kib = kib_field(
        &std::fs::read_to_string("/proc/meminfo").ok()?,
        "MemAvailable:",
    )?;
    let mut best = (kib * 1024, "MemAvailable");
    if let Some(left) = cgroup_memory_left() {
        if left < best.0 {
            best = (left, "its cgroup's memory limit");
        }
    }
    Some(best)
}

/// The process's file size limit in bytes (`RLIMIT_FSIZE`'s soft limit,
/// `ulimit -f`), if it has one: a write to a regular file at or past it
/// fails with `EFBIG` and sends the writing thread `SIGXFSZ`, whose
/// default action ends the process, as does extending a file past it
/// (`ftruncate`). Block devices are not held to it.
///
/// ```
/// if let Some(limit) = plugio_cli::machine::file_size_limit_bytes() {
///     println!("files may grow to {limit} bytes");
/// }
/// ```
pub fn file_size_limit_bytes() -> Option<u64> {
    let limit = plugio_device::file_size_limit::file_size_limit_bytes();
    (limit != u64::MAX).then_some(limit)
}

/// The value of the `key` line (`MemAvailable:`) of a /proc file in kB.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// What the process's address-space limit (`RLIMIT_AS`) leaves beside
/// what it has mapped (`VmSize` of /proc/self/status), if it has one.
fn address_space_left() -> Option<u64> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    let (soft, _) = getrlimit(Resource::RLIMIT_AS).ok()?;
    if soft == RLIM_INFINITY {
        return None;
    }
    let mapped_kib = kib_field(
        &std::fs::read_to_string("/proc/self/status").ok()?,
        "VmSize:",
    )?;
    Some(soft.saturating_sub(mapped_kib * 1024))
}

/// What the process's cgroup memory limit leaves (limit minus usage), if
/// it has one.
fn cgroup_memory_left() -> Option<u64> {
    let read = |p: String| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (limit, usage) = if controllers.is_empty() {
            let dir = format!("/sys/fs/cgroup{path}");
            (
                read(format!("{dir}/memory.max")),
                read(format!("{dir}/memory.current")),
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            let dir = format!("/sys/fs/cgroup/memory{path}");
            (
                read(format!("{dir}/memory.limit_in_bytes")),
                read(format!("{dir}/memory.usage_in_bytes")),
            )
        } else {
            continue;
        };
        // "max" (v2) does not parse; v1 reports a huge number instead.
        if let Some(limit) = limit.filter(|&l| l < 1 << 60) {
            return Some(limit.saturating_sub(usage.unwrap_or(0)));
        }
    }
    None
}
