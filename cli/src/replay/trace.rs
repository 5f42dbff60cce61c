//! The trace model ([`Trace`], [`TraceIo`], [`TraceOp`]) and the check
//! that every IO fits a target. Reading a trace file and detecting its
//! format is [`load`](super::load)'s; the parsers fill a `Sink`.
//!
//! Invariants: every data IO of a parsed trace has a non-zero length of at
//! most [`MAX_IO_BYTES`] and ends at or before [`MAX_END_BYTES`], and
//! its offset and length are multiples of [`SECTOR_BYTES`]; flushes have
//! offset and length 0; `line` is the IO's 1-based line in the
//! decompressed text; IOs are in trace order (the order replay issues
//! them).

use std::path::Path;

use serde::Serialize;

use super::error::ReplayError;
pub(crate) use crate::shown::printable;

/// The unit of every trace format: a 512-byte sector.
pub const SECTOR_BYTES: u64 = 512;

/// The longest IO a trace line may ask for: what one IO of the engine
/// moves (`plugio_engine::MAX_IO_BYTES`, 2 GiB - 4 KiB). Checked while
/// parsing, so nothing is allocated or created for a longer one.
pub const MAX_IO_BYTES: u64 = plugio_engine::MAX_IO_BYTES;

/// The farthest byte an IO may reach: the largest file offset (`off_t`).
pub const MAX_END_BYTES: u64 = i64::MAX as u64;

/// What one trace IO does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum TraceOp {
    /// Read `len_bytes` at `offset_bytes`.
    Read,
    /// Write `len_bytes` at `offset_bytes`.
    Write,
    /// Make completed writes durable (`fdatasync`; no data).
    Flush,
    /// Discard (trim) `len_bytes` at `offset_bytes`.
    Discard,
}

impl TraceOp {
    /// Every op, in report order.
    pub const ALL: [TraceOp; 4] = [
        TraceOp::Read,
        TraceOp::Write,
        TraceOp::Flush,
        TraceOp::Discard,
    ];

    /// The one-letter name the CSV format uses (`R`, `W`, `F`, `D`).
    pub fn letter(self) -> char {
        match self {
            TraceOp::Read => 'R',
            TraceOp::Write => 'W',
            TraceOp::Flush => 'F',
            TraceOp::Discard => 'D',
        }
    }

    /// The lowercase name used in reports (`read`, `write`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TraceOp::Read => "read",
            TraceOp::Write => "write",
            TraceOp::Flush => "flush",
            TraceOp::Discard => "discard",
        }
    }

    /// True for ops that change the target's contents (write, discard).
    pub fn modifies(self) -> bool {
        matches!(self, TraceOp::Write | TraceOp::Discard)
    }

    /// Index in [`TraceOp::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One IO of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceIo {
    /// When the IO was issued, ns since the trace's time origin.
    pub time_ns: u64,
    /// What it does.
    pub op: TraceOp,
    /// Byte offset (0 for flushes).
    pub offset_bytes: u64,
    /// Length in bytes (0 for flushes).
    pub len_bytes: u64,
    /// 1-based line of the trace text it came from (decomposed flags give
    /// several IOs the same line).
    pub line: usize,
}

impl TraceIo {
    /// An IO at time 0 from line 1 (tests).
    #[cfg(test)]
    pub fn test(op: TraceOp, offset_bytes: u64, len_bytes: u64) -> Self {
        Self {
            time_ns: 0,
            op,
            offset_bytes,
            len_bytes,
            line: 1,
        }
    }

    /// One past the IO's last byte.
    pub fn end_bytes(&self) -> u64 {
        self.offset_bytes + self.len_bytes
    }
}

/// The formats `plugio replay` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    /// `time_ns,op,offset_bytes,len_bytes` with op R/W/F/D (the shared
    /// traces' `q.csv`/`d.csv`).
    Csv,
    /// fio's `read_iolog` text, version 2 or 3.
    Iolog,
    /// blkparse's default text output (`maj,min cpu seq time pid action
    /// rwbs sector + nsectors [proc]`).
    Blkparse,
}

/// Which blkparse action a blkparse trace keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum BlkAction {
    /// Q: bios as the file system queued them, before merging.
    #[value(name = "Q")]
    Q,
    /// D: requests issued to the driver, after the kernel merged them.
    #[value(name = "D")]
    D,
}

/// A parsed trace.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The format it was read as.
    pub format: TraceFormat,
    /// Its IOs, in trace order.
    pub ios: Vec<TraceIo>,
    /// Lines that were not IOs of the kept kind (other blkparse actions,
    /// fio file-management lines, headers, blank lines).
    pub skipped_lines: u64,
    /// True when parsing stopped early at the IO limit.
    pub truncated: bool,
    /// The 1-based line of the last IO when that line is the text's last
    /// and has no newline: a trace cut short (a killed producer on
    /// standard input) may have cut that IO too, which parses as a shorter
    /// one. `None` otherwise.
    pub unterminated_io_line: Option<usize>,
}

impl Trace {
    /// One past the farthest byte any IO touches (0 for an empty trace).
    pub fn extent_bytes(&self) -> u64 {
        self.ios.iter().map(TraceIo::end_bytes).max().unwrap_or(0)
    }

    /// IOs of each op, indexed as [`TraceOp::ALL`].
    pub fn counts(&self) -> [u64; 4] {
        let mut c = [0u64; 4];
        for io in &self.ios {
            c[io.op.index()] += 1;
        }
        c
    }

    /// Checks that every IO ends within `capacity_bytes` and is aligned to
    /// `align_bytes` (the target's O_DIRECT block; 1 or 512 for buffered
    /// IO).
    ///
    /// # Errors
    /// [`ReplayError::TargetTooSmall`] or [`ReplayError::Misaligned`]
    /// naming the first offending line.
    pub fn check_fits(
        &self,
        path: &Path,
        capacity_bytes: u64,
        align_bytes: u64,
    ) -> Result<(), ReplayError> {
        let align = align_bytes.max(1);
        for io in &self.ios {
            if io.end_bytes() > capacity_bytes {
                return Err(ReplayError::TargetTooSmall {
                    path: path.to_path_buf(),
                    target_bytes: capacity_bytes,
                    needed_bytes: self.extent_bytes(),
                    line: io.line,
                });
            }
            if io.offset_bytes % align != 0 || io.len_bytes % align != 0 {
                return Err(ReplayError::Misaligned {
                    line: io.line,
                    offset_bytes: io.offset_bytes,
                    len_bytes: io.len_bytes,
                    align_bytes: align,
                });
            }
        }
        Ok(())
    }
}

/// How to read a trace.
#[derive(Debug, Clone, Copy)]
pub struct ParseOptions {
    /// The format; `None` detects it from the first meaningful line.
    pub format: Option<TraceFormat>,
    /// The blkparse action to keep.
    pub action: BlkAction,
    /// Stop after this many IOs (`None`: all).
    pub limit: Option<usize>,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions {
            format: None,
            action: BlkAction::Q,
            limit: None,
        }
    }
}

/// Where parsers put IOs: counts skipped lines, enforces the limit and the
/// sector-multiple rule.
#[derive(Debug)]
pub(crate) struct Sink<'a> {
    name: &'a str,
    limit: Option<usize>,
    pub(crate) ios: Vec<TraceIo>,
    pub(crate) skipped: u64,
}

impl<'a> Sink<'a> {
    pub(crate) fn new(name: &'a str, limit: Option<usize>) -> Self {
        Sink {
            name,
            limit,
            ios: Vec::new(),
            skipped: 0,
        }
    }

    /// True once the limit is reached: parsers stop reading.
    pub(crate) fn full(&self) -> bool {
        self.limit.is_some_and(|l| self.ios.len() >= l)
    }

    /// A parse error at 0-based line index `i`. The parsers echo parts of
    /// the line through [`printable`] (escaped, at most
    /// [`ECHO_CHARS`](crate::shown::ECHO_CHARS) characters each), so the
    /// message stays short and keeps its advice; it is escaped once more
    /// here, with the trace's name, for a piece that was not (found by the
    /// `trace_csv` fuzz target: a raw 0x1a reached the terminal).
    pub(crate) fn error(&self, i: usize, message: impl Into<String>) -> ReplayError {
        ReplayError::Parse {
            source: crate::shown::text(self.name),
            line: i + 1,
            message: crate::shown::text(&message.into()),
        }
    }

    /// Counts a line that holds no kept IO.
    pub(crate) fn skip(&mut self) {
        self.skipped += 1;
    }

    /// Adds an IO from 0-based line index `i`, checking lengths and sector
    /// multiples. Ignored once the limit is reached.
    pub(crate) fn push(
        &mut self,
        i: usize,
        time_ns: u64,
        op: TraceOp,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), ReplayError> {
        if self.full() {
            return Ok(());
        }
        let (offset_bytes, len_bytes) = if op == TraceOp::Flush {
            (0, 0)
        } else {
            if len_bytes == 0 {
                return Err(self.error(i, format!("{} of length 0", op.name())));
            }
            if offset_bytes % SECTOR_BYTES != 0 || len_bytes % SECTOR_BYTES != 0 {
                return Err(self.error(
                    i,
                    format!(
                        "{} at byte {offset_bytes} of {len_bytes} bytes: offset and length \
                         must be multiples of {SECTOR_BYTES}",
                        op.name()
                    ),
                ));
            }
            if len_bytes > MAX_IO_BYTES {
                return Err(self.error(
                    i,
                    format!(
                        "{} of {len_bytes} bytes: one IO moves at most {MAX_IO_BYTES} bytes \
                         (2 GiB - 4 KiB); split the IO in the trace",
                        op.name()
                    ),
                ));
            }
            match offset_bytes.checked_add(len_bytes) {
                Some(end) if end <= MAX_END_BYTES => {}
                _ => {
                    return Err(self.error(
                        i,
                        format!(
                            "{} at byte {offset_bytes} of {len_bytes} bytes ends past byte \
                             {MAX_END_BYTES}, the largest file offset (2^63 - 1)",
                            op.name()
                        ),
                    ))
                }
            }
            (offset_bytes, len_bytes)
        };
        self.ios.push(TraceIo {
            time_ns,
            op,
            offset_bytes,
            len_bytes,
            line: i + 1,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::load::{load, parse};
    use super::*;

    fn parse_auto(text: &str) -> Result<Trace, ReplayError> {
        parse(text, "t", &ParseOptions::default())
    }

    #[test]
    fn formats_are_detected_from_the_first_line() {
        let csv = parse_auto("time_ns,op,offset_bytes,len_bytes\n0,R,0,4096\n").unwrap();
        assert_eq!(csv.format, TraceFormat::Csv);
        let iolog = parse_auto("fio version 2 iolog\n/f add\n/f read 0 4096\n").unwrap();
        assert_eq!(iolog.format, TraceFormat::Iolog);
        let blk =
            parse_auto("  7,1    0        1     0.000000000  7251  Q  RM 67848 + 8 [(null)]\n")
                .unwrap();
        assert_eq!(blk.format, TraceFormat::Blkparse);
        let e = parse_auto("\nhello world\n").unwrap_err();
        assert!(e.to_string().contains("t:2: cannot tell"), "{e}");
        assert!(parse_auto("").unwrap_err().to_string().contains("empty"));
    }

    /// Found by the `trace_csv` fuzz target: a field with a control byte
    /// was echoed raw in the error. Every parser's errors are escaped.
    #[test]
    fn parse_errors_echo_no_control_characters() {
        for (format, text) in [
            (TraceFormat::Csv, "t\u{1a}s0,R,0,4096\n"),
            (
                TraceFormat::Iolog,
                "fio version 2 iolog\n/f read x\u{7} 4096\n",
            ),
            (
                TraceFormat::Blkparse,
                "  7,1    0        1     0.000000000  7251  Q  R\u{1b}[2J 67848 + 8 [(null)]\n",
            ),
        ] {
            let opts = ParseOptions {
                format: Some(format),
                ..ParseOptions::default()
            };
            let e = parse(text, "t", &opts).unwrap_err().to_string();
            assert!(!e.chars().any(char::is_control), "{format:?}: {e:?}");
            assert!(
                e.contains("\\u{"),
                "{format:?}: the byte is shown escaped: {e}"
            );
        }
    }

    #[test]
    fn fit_check_names_the_first_line_past_the_end_or_misaligned() {
        let t = parse_auto("0,R,0,4096\n5,W,8192,4096\n").unwrap();
        assert_eq!(t.extent_bytes(), 12288);
        t.check_fits(Path::new("/x"), 12288, 4096).unwrap();
        match t.check_fits(Path::new("/x"), 8192, 512).unwrap_err() {
            ReplayError::TargetTooSmall {
                line, needed_bytes, ..
            } => assert_eq!((line, needed_bytes), (2, 12288)),
            e => panic!("{e}"),
        }
        let odd = parse_auto("0,R,512,512\n").unwrap();
        assert!(matches!(
            odd.check_fits(Path::new("/x"), 1 << 20, 4096),
            Err(ReplayError::Misaligned { line: 1, .. })
        ));
    }

    #[test]
    fn a_last_io_line_without_a_newline_is_named() {
        let cut = parse_auto("0,W,0,8192\n1,W,8192,4096").unwrap();
        assert_eq!(cut.unterminated_io_line, Some(2));
        for whole in ["0,W,0,8192\n1,W,8192,4096\n", "0,W,0,8192\n\n  "] {
            assert_eq!(
                parse_auto(whole).unwrap().unterminated_io_line,
                None,
                "{whole:?}"
            );
        }
    }

    #[test]
    fn the_limit_stops_parsing_before_later_bad_lines() {
        let opts = ParseOptions {
            limit: Some(1),
            ..ParseOptions::default()
        };
        let t = parse("0,R,0,4096\nbad line\n", "t", &opts).unwrap();
        assert_eq!(t.ios.len(), 1);
        assert!(t.truncated);
    }

    #[test]
    fn zstd_files_are_decompressed_by_magic_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        let text = "time_ns,op,offset_bytes,len_bytes\n0,W,512,1024\n1,F,0,0\n";
        std::fs::write(&path, zstd::encode_all(text.as_bytes(), 3).unwrap()).unwrap();
        let t = load(&path, &ParseOptions::default()).unwrap();
        assert_eq!(t.counts(), [0, 1, 1, 0]);
        assert_eq!(t.ios[0].line, 2);
    }
}
