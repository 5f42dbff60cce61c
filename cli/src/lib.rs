//! The library half of the `plugio` command (the unpublished `plugio-cli`
//! crate): [`replay`], IO traces replayed through the engine, and [`json`],
//! the JSON vocabulary every subcommand's `--json` shares. The command
//! itself (`bench`, `info`, `replay`) is `src/main.rs`.
//!
//! Invariants: nothing here is part of the `plugio` library a database
//! depends on; `tests/deps.rs` checks that the library's dependency tree
//! names none of this crate's tools (clap, plotters, zstd, the peers).

pub mod json;
pub mod machine;
pub mod replay;
pub mod shown;

/// The note a `bench` or `replay` run gets when io_uring was refused and
/// plugio's sync thread pool did the IO (the fallback is announced in the
/// text and in the JSON `notes`, not silent).
pub const FALLBACK_NOTE: &str = "io_uring was refused on this machine (seccomp, io_uring_disabled \
     or an old kernel): plugio ran on its sync thread pool (pread/pwrite), so these figures \
     measure that path; `plugio info PATH` says why";

/// Why a `bench` job that writes, or a `replay` whose trace writes, refuses
/// a read-only block device (`BLKROGET`), and how each way of making one
/// read-only is undone.
pub const READ_ONLY_DEVICE: &str = "the block device is read-only: `blockdev --setrw` undoes \
     `blockdev --setro`; a loop device set up with `losetup -r` must be set up again without -r; \
     a partition is read-only while its disk is";

/// What to do about a path the kernel refused to open for reading
/// (`EACCES`, `EPERM`). Root passes the file modes, so what refuses root
/// is not them: "run as root" would send it in a circle.
///
/// ```
/// assert!(plugio_cli::permission_hint(false).contains("run as root"));
/// assert!(!plugio_cli::permission_hint(true).contains("run as root"));
/// ```
pub fn permission_hint(is_root: bool) -> &'static str {
    if is_root {
        "refused although this process runs as root: a security module (SELinux, \
         AppArmor), a container's device rules or a seccomp filter forbids it; run where \
         the device is allowed"
    } else {
        "give this user read access to it (a block device: run as root, or join its \
         group, `disk` on most systems)"
    }
}
