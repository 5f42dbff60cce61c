//! Reading a trace: [`load`] a file (plain or zstd, told apart by the zstd
//! magic number; `-` is standard input), refusing binary input with what
//! to do instead, and [`parse`] its text with the parser of its format
//! (given, or detected from the first meaningful line) into a [`Trace`].
//!
//! Invariants: a trace is parsed completely (up to the limit) or not at
//! all; an error names the first malformed line, and never echoes control
//! characters.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::error::ReplayError;
use super::trace::{printable, ParseOptions, Sink, Trace, TraceFormat};
use super::{parse_blkparse, parse_csv, parse_iolog};

/// The first four bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// How messages name the trace at `path`: `<stdin>` for `-`, else the
/// path made safe to echo.
pub(crate) fn trace_name(path: &Path) -> String {
    if path.as_os_str() == "-" {
        "<stdin>".to_owned()
    } else {
        crate::shown::path(path)
    }
}

/// Reads and parses the trace at `path` (zstd-compressed or plain); `-`
/// reads it from standard input.
///
/// # Errors
/// [`ReplayError::BadTrace`] when the trace cannot be read or decompressed
/// or is binary (a blktrace file); a line is malformed
/// ([`ReplayError::Parse`] with its line number).
pub fn load(path: &Path, opts: &ParseOptions) -> Result<Trace, ReplayError> {
    let stdin = path.as_os_str() == "-";
    let name = trace_name(path);
    let bad = |message: String| ReplayError::BadTrace {
        trace: name.clone(),
        message,
    };
    let read_failed = if stdin {
        "cannot read standard input"
    } else {
        "cannot read it"
    };
    let mut input: Box<dyn Read> = if stdin {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(File::open(path).map_err(|e| bad(format!("{read_failed}: {e}")))?)
    };
    // The first bytes tell zstd from text; they are read again after.
    let mut head = Vec::with_capacity(4);
    (&mut input)
        .take(4)
        .read_to_end(&mut head)
        .map_err(|e| bad(format!("{read_failed}: {e}")))?;
    let zstd = is_zstd(&head);
    let chained = std::io::Cursor::new(head).chain(input);
    let mut reader: Box<dyn Read> = if zstd {
        Box::new(zstd::stream::Decoder::new(chained).map_err(|e| bad(format!("zstd: {e}")))?)
    } else {
        Box::new(chained)
    };
    let read_error = |e: std::io::Error| {
        if zstd {
            bad(format!(
                "cannot decompress it (zstd: {e}): the file is damaged or truncated"
            ))
        } else {
            bad(format!("{read_failed}: {e}"))
        }
    };
    let cap_bytes = text_cap_bytes();
    let mut bytes = Vec::new();
    // With a limit, the text read so far is parsed once it holds enough
    // lines for the limit's IOs (a guess, doubled while it falls short),
    // so that a large trace, or an endless standard input, is read only as
    // far as the IOs replayed.
    let mut parse_at_lines = opts
        .limit
        .map(|l| l.saturating_mul(LINES_PER_IO_GUESS).saturating_add(64));
    let mut lines = 0usize;
    loop {
        let before = bytes.len();
        let got = (&mut reader)
            .take(READ_CHUNK_BYTES)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        if bytes.len() as u64 > cap_bytes {
            return Err(bad(format!(
                "its text is larger than {} MiB, a sixteenth of the memory available, which \
                 its parsed IOs would outgrow: replay a part of it with --limit N",
                cap_bytes >> 20
            )));
        }
        if got == 0 {
            break;
        }
        let Some(want) = parse_at_lines else { continue };
        lines += bytes[before..].iter().filter(|&&b| b == b'\n').count();
        if lines < want {
            continue;
        }
        let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let trace = parse_bytes(&bytes[..end], &name, opts, &bad)?;
        if trace.truncated {
            return Ok(trace);
        }
        parse_at_lines = Some(want.saturating_mul(2));
    }
    parse_bytes(&bytes, &name, opts, &bad)
}

/// Lines read per IO of `--limit` before a first parse: blkparse text
/// holds about five lines per queued bio (Q, G, I, D, C).
const LINES_PER_IO_GUESS: usize = 8;

/// How much is read at a time.
const READ_CHUNK_BYTES: u64 = 1 << 20;

/// The most trace text held: a sixteenth of the memory available (a
/// parsed IO takes about four times its shortest CSV line, and the text
/// and the IOs are held together while it is parsed), or no bound when
/// the machine does not say.
fn text_cap_bytes() -> u64 {
    crate::machine::available_memory().map_or(u64::MAX, |(bytes, _)| bytes / 16)
}

/// Refuses binary input, then parses `bytes` as text.
fn parse_bytes(
    bytes: &[u8],
    name: &str,
    opts: &ParseOptions,
    bad: &dyn Fn(String) -> ReplayError,
) -> Result<Trace, ReplayError> {
    if let Some(what) = binary_kind(bytes) {
        return Err(bad(what.to_owned()));
    }
    let text = String::from_utf8_lossy(bytes);
    parse(&text, name, opts)
}

/// Whether `bytes` start a zstd stream: a zstd frame, or a skippable frame
/// (magic 0x184D2A50..=0x184D2A5F, little-endian), which pzstd writes
/// first and which the decoder passes over.
fn is_zstd(bytes: &[u8]) -> bool {
    if bytes.starts_with(&ZSTD_MAGIC) {
        return true;
    }
    bytes
        .get(..4)
        .is_some_and(|h| u32::from_le_bytes([h[0], h[1], h[2], h[3]]) & 0xffff_fff0 == 0x184d_2a50)
}

/// The first four bytes of a blktrace binary event: `BLK_IO_TRACE_MAGIC`
/// (0x65617400) with the version in the low byte, in the recording
/// machine's byte order.
fn is_blktrace(bytes: &[u8]) -> bool {
    let Some(head) = bytes.get(..4) else {
        return false;
    };
    let head: [u8; 4] = [head[0], head[1], head[2], head[3]];
    [u32::from_le_bytes(head), u32::from_be_bytes(head)]
        .iter()
        .any(|m| m & 0xffff_ff00 == 0x6561_7400)
}

/// Why `bytes` is not trace text, if it is binary: a blktrace file, or
/// anything with a NUL byte in its first 4 KiB.
fn binary_kind(bytes: &[u8]) -> Option<&'static str> {
    if is_blktrace(bytes) {
        return Some(
            "this is a blktrace binary file, not text: convert it with blkparse \
             (per-CPU files: `blkparse -i <device> -o trace.txt`, the base name; \
             a combined dump: `blkparse -i - -o trace.txt < dump.bin`, after `zstd -d` \
             if it is compressed) and replay trace.txt, or use the CSV trace beside it",
        );
    }
    bytes[..bytes.len().min(4096)].contains(&0).then_some(
        "this is a binary file, not a trace: give a CSV, fio iolog or blkparse text \
         trace (plain or zstd); convert blktrace files with blkparse",
    )
}

/// Parses trace text; `name` labels errors.
///
/// # Errors
/// [`ReplayError::Parse`] naming the first malformed line, or the first
/// line when the format cannot be detected.
pub fn parse(text: &str, name: &str, opts: &ParseOptions) -> Result<Trace, ReplayError> {
    // A UTF-8 byte order mark (some editors write one) is not part of the
    // first line.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let format = match opts.format {
        Some(f) => f,
        None => detect(text, name)?,
    };
    let mut sink = Sink::new(name, opts.limit);
    match format {
        TraceFormat::Csv => parse_csv::parse(text, &mut sink)?,
        TraceFormat::Iolog => parse_iolog::parse(text, &mut sink)?,
        TraceFormat::Blkparse => parse_blkparse::parse(text, opts.action, &mut sink)?,
    }
    let unterminated_io_line = match sink.ios.last() {
        Some(io) if !text.ends_with('\n') && io.line == text.lines().count() => Some(io.line),
        _ => None,
    };
    Ok(Trace {
        format,
        unterminated_io_line,
        truncated: sink.full(),
        ios: sink.ios,
        skipped_lines: sink.skipped,
    })
}

/// Guesses the format from the first non-blank line.
fn detect(text: &str, name: &str) -> Result<TraceFormat, ReplayError> {
    let Some((i, line)) = text.lines().enumerate().find(|(_, l)| !l.trim().is_empty()) else {
        return Err(ReplayError::Parse {
            source: crate::shown::text(name),
            line: 1,
            message: "the trace is empty".into(),
        });
    };
    let t = line.trim();
    if t.starts_with("fio version ") {
        return Ok(TraceFormat::Iolog);
    }
    if parse_csv::is_header(t) {
        return Ok(TraceFormat::Csv);
    }
    let first = t.split_whitespace().next().unwrap_or("");
    let fields: Vec<&str> = t.split_whitespace().collect();
    if (parse_blkparse::is_dev(first) && fields.len() >= 7)
        || t == "# tracer: blk"
        || parse_blkparse::from_ftrace(&fields).is_some()
    {
        return Ok(TraceFormat::Blkparse);
    }
    if t.split(',').count() == 4 {
        return Ok(TraceFormat::Csv);
    }
    Err(ReplayError::Parse {
        source: crate::shown::text(name),
        line: i + 1,
        message: format!(
            "cannot tell the trace format from '{}': expected a CSV header \
             ({}), 'fio version 2|3 iolog', or a blkparse or ftrace blk event line; pass \
             --format",
            printable(t),
            parse_csv::HEADER
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zstd_trace_may_open_with_a_skippable_frame_as_pzstd_writes() {
        let text = b"time_ns,op,offset_bytes,len_bytes\n0,R,0,4096\n";
        let frame = zstd::stream::encode_all(&text[..], 3).unwrap();
        // A skippable frame: magic 0x184D2A50 (little-endian), a 4-byte
        // length, that many bytes the decoder passes over.
        let mut bytes = vec![0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 1, 2, 3, 4];
        bytes.extend_from_slice(&frame);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv.zst");
        std::fs::write(&path, &bytes).unwrap();
        let t = load(&path, &ParseOptions::default()).unwrap();
        assert_eq!((t.format, t.ios.len()), (TraceFormat::Csv, 1));
    }
}
