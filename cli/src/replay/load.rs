//! Reading a trace: [`load`] a file (plain or zstd, told apart by the zstd
//! magic number; `-` is standard input), refusing binary input with what
//! to do instead, and [`parse`] its text with the parser of its format
//! (given, or detected from the first meaningful line) into a [`Trace`].
//!
//! Invariants: a trace is parsed completely (up to the limit) or not at
//! all; an error names the first malformed line, and never echoes control
//! characters.

use std::path::Path;

use super::error::ReplayError;
use super::trace::{printable, ParseOptions, Sink, Trace, TraceFormat};
use super::{parse_blkparse, parse_csv, parse_iolog};

/// The first four bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Reads and parses the trace at `path` (zstd-compressed or plain); `-`
/// reads it from standard input.
///
/// # Errors
/// [`ReplayError::BadTrace`] when the trace cannot be read or decompressed
/// or is binary (a blktrace file); a line is malformed
/// ([`ReplayError::Parse`] with its line number).
pub fn load(path: &Path, opts: &ParseOptions) -> Result<Trace, ReplayError> {
    let stdin = path.as_os_str() == "-";
    let name = if stdin {
        "<stdin>".to_owned()
    } else {
        path.display().to_string()
    };
    let bad = |message: String| ReplayError::BadTrace {
        trace: name.clone(),
        message,
    };
    let raw = if stdin {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut raw)
            .map_err(|e| bad(format!("cannot read standard input: {e}")))?;
        raw
    } else {
        std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?
    };
    let bytes = if is_zstd(&raw) {
        zstd::stream::decode_all(&raw[..]).map_err(|e| {
            bad(format!(
                "cannot decompress it (zstd: {e}): the file is damaged or truncated"
            ))
        })?
    } else {
        raw
    };
    if let Some(what) = binary_kind(&bytes) {
        return Err(bad(what.to_owned()));
    }
    let text = String::from_utf8_lossy(&bytes);
    parse(&text, &name, opts)
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
            "this is a blktrace binary file, not text: convert it with \
             `blkparse -i <device>.blktrace.* -o trace.txt` and replay trace.txt \
             (or use the CSV trace beside it)",
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
            source: name.to_string(),
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
    if parse_blkparse::is_dev(first) && t.split_whitespace().count() >= 7 {
        return Ok(TraceFormat::Blkparse);
    }
    if t.split(',').count() == 4 {
        return Ok(TraceFormat::Csv);
    }
    Err(ReplayError::Parse {
        source: name.to_string(),
        line: i + 1,
        message: format!(
            "cannot tell the trace format from '{}': expected a CSV header \
             ({}), 'fio version 2|3 iolog', or a blkparse event line; pass --format",
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
