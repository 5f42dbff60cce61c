//! [`ReplayError`]: everything `plugio replay` can fail with, each with a
//! message that names the trace line or option to change, and an exit
//! code (2: bad input, change the command line or the trace; 1: the run
//! itself failed).

use std::fmt;
use std::io;
use std::path::PathBuf;

/// A failed replay.
#[derive(Debug)]
pub enum ReplayError {
    /// A trace line could not be parsed. Nothing was replayed.
    Parse {
        /// The trace's name (its path, or a label for in-memory text).
        source: String,
        /// 1-based line number in the (decompressed) trace text.
        line: usize,
        /// What is wrong with the line.
        message: String,
    },
    /// An option is out of range or options conflict.
    Usage(String),
    /// The target is smaller than the trace's extent.
    TargetTooSmall {
        /// The target.
        path: PathBuf,
        /// Its size in bytes.
        target_bytes: u64,
        /// Bytes the trace needs (the end of its farthest IO).
        needed_bytes: u64,
        /// Trace line of the first IO that does not fit.
        line: usize,
    },
    /// An IO is not aligned as the target needs (O_DIRECT block size).
    Misaligned {
        /// Trace line of the IO.
        line: usize,
        /// Its offset, bytes.
        offset_bytes: u64,
        /// Its length, bytes.
        len_bytes: u64,
        /// The alignment the target needs, bytes.
        align_bytes: u64,
    },
    /// An operating-system call failed.
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: io::Error,
    },
    /// The engine refused or failed an IO, or could not start.
    Engine {
        /// What was being done (names the trace line for an IO).
        context: String,
        /// The engine's error.
        source: plugio_device::Error,
    },
    /// The trace cannot be read or decompressed (missing, a directory,
    /// truncated zstd, a blktrace binary). Nothing was replayed.
    BadTrace {
        /// The trace's name (its path, or `<stdin>`).
        trace: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// Standard output was closed before the report was written (the
    /// command then ends by SIGPIPE, as other tools do).
    StdoutClosed,
    /// A SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2 or SIGXCPU stopped the replay (the report so far was
    /// printed and a target the run created was removed); the command then
    /// ends by that signal.
    Interrupted,
    /// `--verify` found blocks that do not hold their last write.
    Verify {
        /// Number of 512-byte sectors that did not match.
        mismatched_sectors: u64,
        /// The first mismatches, one line each.
        first: Vec<String>,
    },
}

impl ReplayError {
    /// A [`ReplayError::Usage`].
    pub fn usage(message: impl Into<String>) -> Self {
        ReplayError::Usage(message.into())
    }

    /// A [`ReplayError::Io`] with `context`.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        ReplayError::Io {
            context: context.into(),
            source,
        }
    }

    /// A [`ReplayError::Engine`] with `context`.
    pub fn engine(context: impl Into<String>, source: plugio_device::Error) -> Self {
        ReplayError::Engine {
            context: context.into(),
            source,
        }
    }

    /// The process exit code: 2 for bad input (change the command line or
    /// the trace), 1 for a failed run.
    pub fn exit_code(&self) -> u8 {
        match self {
            ReplayError::Parse { .. }
            | ReplayError::Usage(_)
            | ReplayError::TargetTooSmall { .. }
            | ReplayError::Misaligned { .. }
            | ReplayError::BadTrace { .. } => 2,
            ReplayError::Io { .. } | ReplayError::Engine { .. } | ReplayError::Verify { .. } => 1,
            // What a shell reports for a process killed by SIGPIPE.
            ReplayError::StdoutClosed => 128 + libc::SIGPIPE as u8,
            // What a shell reports for a process killed by SIGINT (the
            // command ends by the signal it caught, which sets the real
            // status).
            ReplayError::Interrupted => 128 + libc::SIGINT as u8,
        }
    }
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Parse {
                source,
                line,
                message,
            } => write!(f, "{source}:{line}: {message} (nothing was replayed)"),
            ReplayError::Usage(m) => write!(f, "{m}"),
            ReplayError::TargetTooSmall {
                path,
                target_bytes,
                needed_bytes,
                line,
            } => write!(
                f,
                "{} holds {target_bytes} bytes but the trace reaches byte {needed_bytes} \
                 (first IO past the end: trace line {line}): use a target of at least \
                 {needed_bytes} bytes, a path that does not exist yet (replay creates it), \
                 or --limit",
                crate::shown::path(path)
            ),
            ReplayError::Misaligned {
                line,
                offset_bytes,
                len_bytes,
                align_bytes,
            } => write!(
                f,
                "trace line {line}: IO at byte {offset_bytes} of {len_bytes} bytes is not a \
                 multiple of the target's {align_bytes}-byte O_DIRECT block: use --direct 0"
            ),
            ReplayError::BadTrace { trace, message } => write!(f, "trace {trace}: {message}"),
            ReplayError::StdoutClosed => write!(f, "standard output was closed"),
            ReplayError::Interrupted => write!(f, "interrupted"),
            ReplayError::Io { context, source } => write!(f, "{context}: {source}"),
            ReplayError::Engine { context, source } => write!(f, "{context}: {source}"),
            ReplayError::Verify {
                mismatched_sectors,
                first,
            } => {
                write!(
                    f,
                    "verify failed: {mismatched_sectors} sectors do not hold their last write"
                )?;
                for m in first {
                    write!(f, "\n  {m}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ReplayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReplayError::Io { source, .. } => Some(source),
            ReplayError::Engine { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_name_the_line_and_are_input_errors() {
        let e = ReplayError::Parse {
            source: "t.csv".into(),
            line: 7,
            message: "bad op 'X'".into(),
        };
        assert_eq!(e.to_string(), "t.csv:7: bad op 'X' (nothing was replayed)");
        assert_eq!(e.exit_code(), 2);
        let small = ReplayError::TargetTooSmall {
            path: "/x".into(),
            target_bytes: 4096,
            needed_bytes: 8192,
            line: 3,
        };
        assert!(small.to_string().contains("trace line 3"));
        assert_eq!(small.exit_code(), 2);
        let v = ReplayError::Verify {
            mismatched_sectors: 2,
            first: vec!["sector 1".into()],
        };
        assert_eq!(v.exit_code(), 1);
        assert!(v.to_string().contains("\n  sector 1"));
    }
}
