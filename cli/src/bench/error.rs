//! [`BenchError`]: everything `plugio bench` can fail with, each with a
//! message that says what to change and an exit code (2: bad input, 1: the
//! run itself failed).

use std::fmt;
use std::io;
use std::path::PathBuf;

/// A failed benchmark.
#[derive(Debug)]
pub enum BenchError {
    /// An option is out of range or options conflict.
    Usage(String),
    /// `--filename` does not exist.
    MissingTarget {
        /// The path given.
        path: PathBuf,
    },
    /// The target is smaller than `--size` (or than one block).
    TargetTooSmall {
        /// The target.
        path: PathBuf,
        /// Its size in bytes.
        target_bytes: u64,
        /// Bytes needed.
        needed_bytes: u64,
        /// The kernel name of the zram device the target is or links to
        /// (`zram0`) when it holds 0 bytes: an unconfigured one, told how
        /// to size it. Set by [`BenchError::target_too_small`].
        unsized_zram: Option<String>,
    },
    /// The file system refused `O_DIRECT`.
    DirectRefused {
        /// The target.
        path: PathBuf,
    },
    /// `--bs` is not a multiple of the target's logical block size.
    Misaligned {
        /// The block size asked for, bytes.
        bs_bytes: u64,
        /// The target's logical block size, bytes.
        logical_block_bytes: u32,
    },
    /// The job writes but the target cannot be written: it cannot be
    /// opened for writing, or it is a read-only block device.
    NotWritable {
        /// The target.
        path: PathBuf,
        /// The pattern (`write`, `randwrite`, `randrw`).
        rw: &'static str,
        /// Why the open for writing failed.
        source: io::Error,
    },
    /// The job needs more memory or threads than the machine gives this
    /// process, or a temporary file larger than its file system's free
    /// space allows (checked before anything starts).
    TooBig(String),
    /// A caught signal (see `crate::signals`) stopped the run (the summary so far was printed,
    /// the temporary file removed); the command ends by the same signal.
    Interrupted(nix::sys::signal::Signal),
    /// SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2 or SIGXCPU came before the run started
    /// (during the temporary file's fill): nothing was measured or printed
    /// but the message, the file is removed; the command ends by the same
    /// signal.
    InterruptedBeforeRun(nix::sys::signal::Signal),
    /// Standard output was closed (`plugio bench | head -1`): the run was
    /// stopped and its temporary file removed; the command ends by SIGPIPE.
    StdoutClosed,
    /// An operating-system call failed.
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: io::Error,
    },
    /// The engine under test failed (setup or an IO).
    Engine {
        /// The engine's name.
        engine: &'static str,
        /// What went wrong.
        message: String,
    },
}

impl BenchError {
    /// A [`BenchError::Usage`].
    pub fn usage(message: impl Into<String>) -> Self {
        BenchError::Usage(message.into())
    }

    /// An [`BenchError::Io`] with `context`.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        BenchError::Io {
            context: context.into(),
            source,
        }
    }

    /// A [`BenchError::Engine`] from any displayable error.
    pub fn engine(engine: &'static str, message: impl fmt::Display) -> Self {
        BenchError::Engine {
            engine,
            message: message.to_string(),
        }
    }

    /// [`BenchError::TargetTooSmall`] for `path`, naming the zram device
    /// it is (or links to) when it holds 0 bytes (looked up here, once,
    /// not each time the error is shown).
    pub fn target_too_small(path: PathBuf, target_bytes: u64, needed_bytes: u64) -> Self {
        let unsized_zram = if target_bytes == 0 {
            plugio_device::zram_name(&path)
        } else {
            None
        };
        BenchError::TargetTooSmall {
            path,
            target_bytes,
            needed_bytes,
            unsized_zram,
        }
    }

    /// The process exit code: 2 for bad input (change the command line),
    /// 1 for a failed run.
    pub fn exit_code(&self) -> i32 {
        match self {
            BenchError::Usage(_)
            | BenchError::MissingTarget { .. }
            | BenchError::TargetTooSmall { .. }
            | BenchError::DirectRefused { .. }
            | BenchError::Misaligned { .. }
            | BenchError::NotWritable { .. }
            | BenchError::TooBig(_) => 2,
            BenchError::Io { .. } | BenchError::Engine { .. } => 1,
            // Exit statuses a shell gives a process killed by the signal
            // (the command raises the signal itself; see `signals::die_of`).
            BenchError::Interrupted(sig) | BenchError::InterruptedBeforeRun(sig) => {
                128 + *sig as i32
            }
            BenchError::StdoutClosed => 128 + libc::SIGPIPE,
        }
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Usage(m) => write!(f, "{m}"),
            BenchError::MissingTarget { path } => write!(
                f,
                "{} does not exist: create it, pass an existing file or block device to \
                 --filename, or omit --filename to use a temporary file",
                plugio_cli::shown::path(path)
            ),
            BenchError::TargetTooSmall {
                path,
                target_bytes,
                needed_bytes,
                unsized_zram,
            } => {
                // An unconfigured zram device has no size yet: the advice
                // is to give it one (found by a helper trying the suite).
                match unsized_zram {
                    Some(name) => write!(
                        f,
                        "{} holds 0 bytes: a zram device has no size until one is set: \
                         echo 1G > /sys/block/{name}/disksize (as root), then run again",
                        plugio_cli::shown::path(path)
                    ),
                    None => write!(
                        f,
                        "{} holds {target_bytes} bytes but the job needs {needed_bytes}: \
                         lower --size (or --bs) or use a larger target",
                        plugio_cli::shown::path(path)
                    ),
                }
            }
            BenchError::DirectRefused { path } => write!(
                f,
                "the file system of {} refuses O_DIRECT (tmpfs before Linux 6.6, ramfs, some FUSE file systems): \
                 use --direct 0 or a file on a disk-backed file system",
                plugio_cli::shown::path(path)
            ),
            BenchError::Misaligned {
                bs_bytes,
                logical_block_bytes,
            } => write!(
                f,
                "--bs {bs_bytes} is not a multiple of the target's logical block size \
                 ({logical_block_bytes} bytes): use e.g. --bs {}",
                (*bs_bytes)
                    .max(u64::from(*logical_block_bytes))
                    .next_multiple_of(u64::from(*logical_block_bytes))
            ),
            BenchError::NotWritable { path, rw, source } => write!(
                f,
                "--rw {rw} writes to {} but it cannot be written ({source}): \
                 use a writable file, or a read pattern such as --rw randread",
                plugio_cli::shown::path(path)
            ),
            BenchError::TooBig(m) => write!(f, "{m}"),
            BenchError::Interrupted(sig) => {
                write!(
                    f,
                    "interrupted by {sig}: IO stopped, temporary file removed"
                )
            }
            BenchError::InterruptedBeforeRun(sig) => write!(
                f,
                "interrupted by {sig} while filling the temporary file: nothing measured; \
                 the file is removed"
            ),
            BenchError::StdoutClosed => write!(
                f,
                "standard output was closed: IO stopped, temporary file removed"
            ),
            BenchError::Io { context, source } => write!(f, "{context}: {source}"),
            BenchError::Engine { engine, message } => write!(f, "engine {engine}: {message}"),
        }
    }
}

impl std::error::Error for BenchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BenchError::Io { source, .. } | BenchError::NotWritable { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_to_change_and_codes_split_input_from_failure() {
        let refused = BenchError::DirectRefused { path: "/x".into() };
        assert!(refused.to_string().contains("--direct 0"));
        assert_eq!(refused.exit_code(), 2);
        let misaligned = BenchError::Misaligned {
            bs_bytes: 1000,
            logical_block_bytes: 512,
        };
        assert!(misaligned.to_string().contains("--bs 1024"));
        let io = BenchError::io("open /x", io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(io.exit_code(), 1);
        assert_eq!(BenchError::engine("raw", "boom").exit_code(), 1);
    }

    /// An unconfigured zram device (0 bytes) is told how to size it;
    /// another small target, to lower the job.
    #[test]
    fn an_empty_zram_device_is_told_how_to_size_it() {
        let small = |path: &str, target_bytes| {
            BenchError::target_too_small(path.into(), target_bytes, 4096)
        };
        // A zram device (where this machine has one, configured or not)
        // and a link to it are told how to size it.
        if std::path::Path::new("/dev/zram0").exists() {
            let dir = tempfile::tempdir().expect("dir");
            let link = dir.path().join("myzram");
            std::os::unix::fs::symlink("/dev/zram0", &link).expect("link");
            for path in ["/dev/zram0", link.to_str().expect("utf-8")] {
                let zram = small(path, 0).to_string();
                assert!(
                    zram.contains("echo 1G > /sys/block/zram0/disksize"),
                    "{zram}"
                );
            }
        }
        // A file named like one is not.
        let dir = tempfile::tempdir().expect("dir");
        let named = dir.path().join("zram_notes.txt");
        std::fs::write(&named, b"").expect("file");
        let file = small(named.to_str().expect("utf-8"), 0).to_string();
        assert!(file.contains("lower --size"), "{file}");
        let sized = small("/dev/zram0", 512).to_string();
        assert!(sized.contains("lower --size"), "{sized}");
    }
}
