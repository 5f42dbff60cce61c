//! The replay's target (`--filename`): an existing regular file or block
//! device the trace fits in, or a new sparse file of the trace's extent.
//! When the path cannot be used, the message says why in the kernel's own
//! terms (the error of resolving the path) and what to change: a symbolic
//! link is named by the missing file its chain ends at, a loop by a link on
//! it, an unreachable name by the part of the path that stops it.
//!
//! Invariants: nothing is created unless the path resolves to no file at
//! all (`ENOENT`) and its last name is no symbolic link, so nothing is ever
//! created at the far end of a link given as the target (links to
//! directories on the way are followed, as any program does); a file that was created and
//! could not be sized is removed again; every path echoed in a message
//! goes through [`shown::path`].

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::error::ReplayError;
use super::trace::{Trace, TraceIo, TraceOp, SECTOR_BYTES};
use crate::shown;

/// The most symbolic links the kernel follows in one path resolution
/// (Linux's `MAXSYMLINKS`); one more fails with `ELOOP`.
pub const MAX_LINK_HOPS: usize = 40;

/// Creates the target (sparse, the trace's extent) when it does not exist;
/// returns whether it did. An existing target must be a regular file or a
/// block device that holds the trace's extent.
///
/// # Errors
/// [`ReplayError::Usage`] when the path cannot be resolved (a loop of
/// links, a file where a directory should be, a directory this user may
/// not search, a name too long), leads through a link to nothing, ends in
/// `/`, cannot be created, or is neither a file nor a block device;
/// [`ReplayError::TargetTooSmall`] when the trace does not fit.
pub fn prepare_target(path: &Path, trace: &Trace) -> Result<bool, ReplayError> {
    match std::fs::metadata(path) {
        Ok(meta) => {
            let size = target_size(path)?;
            // Extent first; alignment is checked once the device is open.
            trace.check_fits(path, size, 1)?;
            if meta.is_file() {
                check_file_size_limit(path, trace, false)?;
            }
            return Ok(false);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(usage(path, &unresolved(path, &e))),
    }
    // A link to nothing would make `create_new` fail with a bare "File
    // exists"; a name ending in '/' with "Is a directory".
    if let Some(why) = broken_link(path) {
        return Err(usage(path, &why));
    }
    if ends_in_slash(path) {
        return Err(usage(
            path,
            "ends in '/', which names a directory, and there is none: drop the '/' to \
             create a file of that name",
        ));
    }
    check_file_size_limit(path, trace, true)?;
    create(path, trace)
}

/// Refuses a target that is the trace's own file (the same device and
/// inode, through any name or link; `-` is checked through standard
/// input, which a shell redirect may make that file) when the trace
/// changes data: its writes would overwrite the trace (found by a
/// break-it helper: the replay succeeded and the trace was gone). A trace
/// of reads and flushes only may replay on it.
///
/// # Errors
/// [`ReplayError::Usage`] saying to give another `--filename`.
pub fn refuse_the_trace_itself(
    path: &Path,
    trace_path: &Path,
    trace: &Trace,
) -> Result<(), ReplayError> {
    if !trace.ios.iter().any(|io| io.op.modifies()) {
        return Ok(());
    }
    let trace_file = if trace_path.as_os_str() == "-" {
        Path::new("/dev/stdin")
    } else {
        trace_path
    };
    let (Ok(t), Ok(f)) = (std::fs::metadata(trace_file), std::fs::metadata(path)) else {
        return Ok(());
    };
    if t.dev() == f.dev() && t.ino() == f.ino() {
        return Err(usage(
            path,
            "is the trace's own file, which the trace's writes would overwrite: replay onto \
             a copy of it",
        ));
    }
    Ok(())
}

/// Refuses a trace that would write a regular file past the process's
/// file size limit (`RLIMIT_FSIZE`, `ulimit -f`), where the kernel refuses
/// the write and sends `SIGXFSZ`, which ends the process: its first write
/// that ends past the limit, or, for a file the replay `creates` (sized to
/// the trace's extent with `ftruncate`, held to the same limit), an
/// extent past it.
///
/// # Errors
/// [`ReplayError::Usage`] naming the limit, the line and what to change.
fn check_file_size_limit(path: &Path, trace: &Trace, creates: bool) -> Result<(), ReplayError> {
    let Some(limit) = crate::machine::file_size_limit_bytes() else {
        return Ok(());
    };
    let extent = trace.extent_bytes().max(SECTOR_BYTES);
    let why = if creates && extent > limit {
        format!("would be created with the trace's extent of {extent} bytes")
    } else if let Some(io) = trace
        .ios
        .iter()
        .find(|io| io.op == super::trace::TraceOp::Write && io.end_bytes() > limit)
    {
        format!(
            "would be written up to byte {} (trace line {})",
            io.end_bytes(),
            io.line
        )
    } else {
        return Ok(());
    };
    Err(ReplayError::usage(format!(
        "the target {} {why}, past this process's file size limit (RLIMIT_FSIZE, \
         `ulimit -f`) of {limit} bytes, where the kernel ends the process (SIGXFSZ): raise \
         the limit (`ulimit -f unlimited`), replay onto a block device, or --limit the trace",
        shown::path(path)
    )))
}

/// True when `path` ends in '/' (which asks for a directory).
fn ends_in_slash(path: &Path) -> bool {
    path.as_os_str().as_bytes().ends_with(b"/")
}

/// True when `path` without its trailing '/'s names something.
fn trimmed_exists(path: &Path) -> bool {
    let bytes = path.as_os_str().as_bytes();
    let end = bytes.iter().rposition(|&b| b != b'/').map_or(1, |i| i + 1);
    let trimmed = Path::new(std::ffi::OsStr::from_bytes(&bytes[..end]));
    std::fs::metadata(trimmed).is_ok()
}

/// "the target P {why}, or give --filename another path".
fn usage(path: &Path, why: &str) -> ReplayError {
    ReplayError::usage(format!(
        "the target {} {why}, or give --filename another path",
        shown::path(path)
    ))
}

/// Why `path` cannot be resolved (`error` is `stat`'s, not `ENOENT`) and
/// what to change.
fn unresolved(path: &Path, error: &std::io::Error) -> String {
    match error.raw_os_error() {
        // "x/" resolves the link x too: follow the name without the '/'.
        Some(libc::ELOOP) => match follow_links(&path.components().collect::<PathBuf>()) {
            Chain::Loop(at) => format!(
                "is a loop of symbolic links (through {}): break the loop",
                shown::path(&at)
            ),
            Chain::TooLong => format!(
                "is a chain of more than {MAX_LINK_HOPS} symbolic links, more than the \
                 kernel follows: point it at the file directly"
            ),
            Chain::End { .. } => format!(
                "cannot be resolved ({error}): a symbolic link on its path leads into a loop \
                 or past the {MAX_LINK_HOPS} links the kernel follows; fix that link"
            ),
        },
        Some(libc::ENOTDIR) if ends_in_slash(path) && trimmed_exists(path) => {
            "ends in '/', but names a file, not a directory: drop the '/'".to_owned()
        }
        Some(libc::ENOTDIR) => format!(
            "cannot be reached ({error}): a name on its path before the last is a file, not \
             a directory; use a path whose directories exist"
        ),
        Some(libc::EACCES) => format!(
            "cannot be reached ({error}): a directory on its path does not let this user \
             search it (it needs x permission); grant it"
        ),
        Some(libc::ENAMETOOLONG) => format!(
            "is too long ({error}): a name on it is over 255 bytes or the whole over 4096; \
             shorten it"
        ),
        _ => format!("cannot be examined ({error})"),
    }
}

/// Why `path`, which resolves to nothing, is a broken symbolic link (the
/// missing file at the end of its chain of links) and what to change.
/// `None` when `path` is no symbolic link.
fn broken_link(path: &Path) -> Option<String> {
    match follow_links(path) {
        Chain::End { hops: 0, .. } => None,
        Chain::End { at, hops } => {
            let missing = std::fs::symlink_metadata(&at)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
            let what = if hops == 1 {
                "a symbolic link to".to_string()
            } else {
                format!("a chain of {hops} symbolic links ending at")
            };
            Some(if missing {
                format!(
                    "is {what} {}, which does not exist: create that file (or device) first",
                    shown::path(&at)
                )
            } else {
                format!(
                    "is {what} {}, which cannot be reached: make it reachable",
                    shown::path(&at)
                )
            })
        }
        // `stat` said ENOENT, so the kernel found neither; kept for a
        // chain that changed meanwhile.
        Chain::Loop(at) => Some(format!(
            "is a loop of symbolic links (through {}): break the loop",
            shown::path(&at)
        )),
        Chain::TooLong => Some(format!(
            "is a chain of more than {MAX_LINK_HOPS} symbolic links: point it at the file \
             directly"
        )),
    }
}

/// Where a chain of symbolic links leads.
#[derive(Debug, PartialEq, Eq)]
enum Chain {
    /// `at` is no link (or cannot be read as one), reached after `hops`
    /// links.
    End { at: PathBuf, hops: usize },
    /// The chain comes back to the link `at` (the same inode, however the
    /// path spells it).
    Loop(PathBuf),
    /// More than [`MAX_LINK_HOPS`] links without an end or a loop.
    TooLong,
}

/// Follows the links of `path`'s last name, as the kernel does once it has
/// resolved the directories: a relative link is relative to the directory
/// that holds it. Links are told apart by their directory entry (see
/// [`entry_id`]), so a loop spelled through `..` or a linked directory is
/// still a loop, and a symbolic link hard-linked into two directories is
/// two links.
fn follow_links(path: &Path) -> Chain {
    let mut seen = Vec::new();
    let mut at = path.to_path_buf();
    loop {
        let Ok(to) = std::fs::read_link(&at) else {
            return Chain::End {
                at,
                hops: seen.len(),
            };
        };
        let id = entry_id(&at);
        if id.is_some() && seen.contains(&id) {
            return Chain::Loop(at);
        }
        if seen.len() == MAX_LINK_HOPS {
            return Chain::TooLong;
        }
        seen.push(id);
        at = at.parent().unwrap_or(Path::new("")).join(to);
    }
}

/// The directory entry `at` names: its directory's device and inode, and
/// its last name. `None` when it has no last name (`..`, `/`) or its
/// directory cannot be examined.
fn entry_id(at: &Path) -> Option<(u64, u64, OsString)> {
    let name = at.file_name()?;
    let dir = match at.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let meta = std::fs::metadata(dir).ok()?;
    Some((meta.dev(), meta.ino(), name.to_owned()))
}

/// Creates `path` (it resolves to nothing) as a sparse file of the trace's
/// extent.
fn create(path: &Path, trace: &Trace) -> Result<bool, ReplayError> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| {
            let why = if e.kind() == std::io::ErrorKind::AlreadyExists {
                format!(
                    "cannot be created ({e}): another process made it meanwhile; run again to \
                     replay onto it as it is"
                )
            } else {
                format!("cannot be created ({e}): its directory must exist and be writable")
            };
            usage(path, &why)
        })?;
    let extent = trace.extent_bytes().max(SECTOR_BYTES);
    if let Err(e) = file.set_len(extent) {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(ReplayError::usage(format!(
            "the file system of {} cannot hold a file of {extent} bytes, the trace's \
             extent ({e}): use a block device or another file system, or --limit",
            shown::path(path)
        )));
    }
    Ok(true)
}

/// The size of a regular file or block device.
///
/// # Errors
/// [`ReplayError::Io`] when it cannot be examined; [`ReplayError::Usage`]
/// when it is neither a regular file nor a block device.
pub fn target_size(path: &Path) -> Result<u64, ReplayError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| ReplayError::io(format!("stat {}", shown::path(path)), e))?;
    if meta.file_type().is_block_device() {
        let mut f = std::fs::File::open(path).map_err(|e| match e.raw_os_error() {
            // Bad input, as for a file target (`open_device`'s text).
            Some(libc::EACCES | libc::EPERM) => usage(
                path,
                &format!(
                    "cannot be read (permission denied): {}",
                    crate::permission_hint(nix::unistd::geteuid().is_root())
                ),
            ),
            _ => ReplayError::io(format!("open {}", shown::path(path)), e),
        })?;
        f.seek(SeekFrom::End(0))
            .map_err(|e| ReplayError::io(format!("size of {}", shown::path(path)), e))
    } else if meta.is_file() {
        Ok(meta.len())
    } else {
        Err(ReplayError::usage(format!(
            "{} is {}: pass a regular file or a block device to --filename",
            shown::path(path),
            plugio_device::path_kind::describe(path).unwrap_or("neither a file nor a device")
        )))
    }
}

/// How many of the trace's reads, of how many, read a range the trace
/// had not written whole before them, or had discarded since (in trace
/// order): on a target the replay created, those read holes of a sparse
/// file, which costs the device little. `(unwritten_reads, reads)`.
pub fn reads_before_writes(ios: &[TraceIo]) -> (usize, usize) {
    // Written byte ranges, merged: start -> end (exclusive).
    let mut written: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut unwritten, mut reads) = (0, 0);
    for io in ios {
        let (start, end) = (
            io.offset_bytes,
            io.offset_bytes.saturating_add(io.len_bytes),
        );
        match io.op {
            TraceOp::Read => {
                reads += 1;
                let covered = written
                    .range(..=start)
                    .next_back()
                    .is_some_and(|(_, &e)| e >= end);
                if !covered {
                    unwritten += 1;
                }
            }
            TraceOp::Write if end > start => insert_range(&mut written, start, end),
            TraceOp::Discard if end > start => remove_range(&mut written, start, end),
            _ => {}
        }
    }
    (unwritten, reads)
}

/// Adds `[start, end)` to the merged ranges of `set`.
fn insert_range(set: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
    // A range that starts before `start` and reaches it joins.
    if let Some((&s, &e)) = set.range(..=start).next_back() {
        if e >= start {
            start = s;
            end = end.max(e);
        }
    }
    // Ranges that start within the new one join it.
    let inside: Vec<(u64, u64)> = set.range(start..=end).map(|(&s, &e)| (s, e)).collect();
    for (s, e) in inside {
        set.remove(&s);
        end = end.max(e);
    }
    set.insert(start, end);
}

/// Takes `[start, end)` out of the merged ranges of `set`.
fn remove_range(set: &mut BTreeMap<u64, u64>, start: u64, end: u64) {
    // Every range that overlaps: the one starting before `start`, and
    // those starting inside.
    let first = set.range(..start).next_back().map(|(&s, _)| s);
    let hit: Vec<(u64, u64)> = first
        .into_iter()
        .chain(set.range(start..end).map(|(&s, _)| s))
        .filter_map(|s| set.get(&s).map(|&e| (s, e)))
        .filter(|&(s, e)| s < end && e > start)
        .collect();
    for (s, e) in hit {
        set.remove(&s);
        if s < start {
            set.insert(s, start);
        }
        if e > end {
            set.insert(end, e);
        }
    }
}

#[cfg(test)]
mod tests {
    fn io(op: TraceOp, offset_bytes: u64, len_bytes: u64) -> TraceIo {
        TraceIo::test(op, offset_bytes, len_bytes)
    }

    #[test]
    fn reads_before_writes_counts_reads_of_ranges_not_yet_written_whole() {
        use TraceOp::{Read, Write};
        let ios = [
            io(Read, 0, 4096), // nothing written yet
            io(Write, 0, 4096),
            io(Write, 8192, 4096), // a gap at 4096..8192
            io(Read, 0, 4096),     // written
            io(Read, 0, 12288),    // crosses the gap
            io(Write, 4096, 4096), // fills it: 0..12288 in one range
            io(Read, 0, 12288),    // written
            io(Read, 2048, 2048),  // inside
            io(Read, 12288, 512),  // past the end
        ];
        assert_eq!(reads_before_writes(&ios), (3, 6));
        let mut set = BTreeMap::new();
        for (s, e) in [(10, 20), (30, 40), (50, 60), (15, 55)] {
            insert_range(&mut set, s, e);
        }
        assert_eq!(
            set.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(),
            vec![(10, 60)]
        );
        for (s, e) in [(20, 30), (5, 12), (55, 70), (40, 41)] {
            remove_range(&mut set, s, e);
        }
        assert_eq!(
            set.into_iter().collect::<Vec<_>>(),
            vec![(12, 20), (30, 40), (41, 55)]
        );
        // A discard makes a written range unwritten again.
        let ios = [
            io(TraceOp::Write, 0, 8192),
            io(TraceOp::Discard, 0, 4096),
            io(TraceOp::Read, 0, 4096),
            io(TraceOp::Read, 4096, 4096),
        ];
        assert_eq!(reads_before_writes(&ios), (1, 2));
    }

    use super::*;
    use std::os::unix::fs::symlink;

    /// `got` ends at `name` in `dir` after `hops` links.
    fn assert_ends(got: Chain, hops: usize, dir: &Path, name: &str) {
        let Chain::End { at: end, hops: n } = got else {
            panic!("{got:?}");
        };
        assert_eq!(n, hops, "{end:?}");
        let canonical = |p: &Path| std::fs::canonicalize(p).unwrap();
        assert_eq!(canonical(end.parent().unwrap()), canonical(dir));
        assert_eq!(end.file_name().unwrap(), name);
    }

    #[test]
    fn a_chain_is_followed_to_its_end_and_a_loop_is_found_by_its_directory_entry() {
        let dir = tempfile::tempdir().unwrap();
        let at = |n: &str| dir.path().join(n);
        std::fs::create_dir(at("d")).unwrap();
        // a -> d/../b -> c: the end is c, two links.
        symlink("d/../b", at("a")).unwrap();
        symlink("c", at("b")).unwrap();
        assert_ends(follow_links(&at("a")), 2, dir.path(), "c");
        // x -> d/../y -> x: a loop however it is spelled.
        symlink("d/../y", at("x")).unwrap();
        symlink("x", at("y")).unwrap();
        assert!(matches!(follow_links(&at("x")), Chain::Loop(_)));
        // A link hard-linked into two directories is two links, not a
        // loop: A/s -> next, B/s the same inode, A/next -> ../B/s; h -> A/s.
        std::fs::create_dir(at("A")).unwrap();
        std::fs::create_dir(at("B")).unwrap();
        symlink("next", at("A/s")).unwrap();
        std::fs::hard_link(at("A/s"), at("B/s")).unwrap();
        symlink("../B/s", at("A/next")).unwrap();
        symlink("A/s", at("h")).unwrap();
        // h, A/s, A/next, B/s; B/next is missing.
        assert_ends(follow_links(&at("h")), 4, &at("B"), "next");
        // Exactly 40 links is a chain the kernel follows; 41 is not.
        for n in [MAX_LINK_HOPS, MAX_LINK_HOPS + 1] {
            let name = |i: usize| format!("c{n}_{i}");
            for i in 0..n {
                symlink(name(i + 1), at(&name(i))).unwrap();
            }
            let got = follow_links(&at(&name(0)));
            if n == MAX_LINK_HOPS {
                assert_eq!(
                    got,
                    Chain::End {
                        at: at(&name(n)),
                        hops: n
                    }
                );
            } else {
                assert_eq!(got, Chain::TooLong);
            }
        }
        // A name that is no link is its own end.
        assert_eq!(
            follow_links(&at("d")),
            Chain::End {
                at: at("d"),
                hops: 0
            }
        );
    }
}
