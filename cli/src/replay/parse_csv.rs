//! The CSV trace format of the shared traces: `time_ns,op,offset_bytes,
//! len_bytes`, op `R`/`W`/`F`/`D`, an optional header line.
//!
//! Invariant: a line is either the header (before the first IO; its
//! fields trimmed and in any case), blank, or an IO; anything else is an
//! error naming the line.

use super::error::ReplayError;
use super::trace::{printable, Sink, TraceOp};

/// The header line.
pub const HEADER: &str = "time_ns,op,offset_bytes,len_bytes";

/// Whether `line` is [`HEADER`], its fields trimmed and in any case (as
/// IO rows may have spaces after their commas).
pub(crate) fn is_header(line: &str) -> bool {
    let mut fields = line.split(',').map(str::trim);
    HEADER
        .split(',')
        .all(|want| fields.next().is_some_and(|f| f.eq_ignore_ascii_case(want)))
        && fields.next().is_none()
}

/// Parses CSV text into `sink`.
pub(crate) fn parse(text: &str, sink: &mut Sink<'_>) -> Result<(), ReplayError> {
    let mut seen_io = false;
    for (i, raw) in text.lines().enumerate() {
        if sink.full() {
            break;
        }
        let line = raw.trim();
        if line.is_empty() {
            sink.skip();
            continue;
        }
        if is_header(line) {
            if seen_io {
                return Err(sink.error(
                    i,
                    "a header line after IO lines (two traces joined?): keep one header, \
                     before the first IO"
                        .to_string(),
                ));
            }
            sink.skip();
            continue;
        }
        if is_header(&crate::shown::visible(line)) {
            return Err(sink.error(
                i,
                format!(
                    "'{}' looks like the header ({HEADER}) but holds characters that draw \
                     nothing: remove them",
                    printable(line)
                ),
            ));
        }
        seen_io = true;
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [time, op, offset, len] = fields[..] else {
            return Err(sink.error(
                i,
                format!(
                    "expected 4 comma-separated fields ({HEADER}), found {}: '{}'",
                    fields.len(),
                    printable(line)
                ),
            ));
        };
        let op = match op {
            "R" => TraceOp::Read,
            "W" => TraceOp::Write,
            "F" => TraceOp::Flush,
            "D" => TraceOp::Discard,
            other => {
                return Err(sink.error(
                    i,
                    format!("unknown op '{}': use R, W, F or D", printable(other)),
                ))
            }
        };
        let number = |what: &str, s: &str| {
            s.parse::<u64>().map_err(|_| {
                sink.error(
                    i,
                    format!("{what} '{}' is not a whole number", printable(s)),
                )
            })
        };
        let time_ns = number("time_ns", time)?;
        let offset_bytes = number("offset_bytes", offset)?;
        let len_bytes = number("len_bytes", len)?;
        if op == TraceOp::Flush && len_bytes != 0 {
            return Err(sink.error(
                i,
                format!("F row with length {len_bytes}: flushes carry no data"),
            ));
        }
        sink.push(i, time_ns, op, offset_bytes, len_bytes)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::replay::load::parse;
    use crate::replay::trace::{ParseOptions, TraceFormat, TraceIo};

    use super::*;

    fn csv(text: &str) -> Result<Vec<TraceIo>, ReplayError> {
        let opts = ParseOptions {
            format: Some(TraceFormat::Csv),
            ..ParseOptions::default()
        };
        parse(text, "t.csv", &opts).map(|t| t.ios)
    }

    #[test]
    fn the_header_may_follow_blank_lines_a_bom_and_have_spaces_or_capitals() {
        let auto = ParseOptions::default();
        for text in [
            "\n\ntime_ns,op,offset_bytes,len_bytes\n0,R,0,4096\n",
            "\u{feff}time_ns,op,offset_bytes,len_bytes\n0,R,0,4096\n",
            "TIME_NS, OP, Offset_Bytes, len_bytes\n0,R,0,4096\n",
        ] {
            let t = parse(text, "t.csv", &auto).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!((t.format, t.ios.len()), (TraceFormat::Csv, 1), "{text:?}");
        }
    }

    #[test]
    fn a_header_after_ios_is_refused_by_line() {
        let e = csv(
            "time_ns,op,offset_bytes,len_bytes\n0,R,0,4096\ntime_ns,op,offset_bytes,len_bytes\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(":3:") && e.contains("header line after IO lines"),
            "{e}"
        );
    }

    #[test]
    fn rows_become_ios_with_their_line_numbers() {
        let ios = csv("time_ns,op,offset_bytes,len_bytes\n0,R,4096,8192\n\n10,F,0,0\n20,D,0,512\n")
            .unwrap();
        assert_eq!(ios.len(), 3);
        assert_eq!(
            ios[0],
            TraceIo {
                time_ns: 0,
                op: TraceOp::Read,
                offset_bytes: 4096,
                len_bytes: 8192,
                line: 2
            }
        );
        assert_eq!((ios[1].op, ios[1].line), (TraceOp::Flush, 4));
        assert_eq!((ios[2].op, ios[2].time_ns), (TraceOp::Discard, 20));
    }

    #[test]
    fn malformed_rows_are_errors_naming_the_line() {
        let cases = [
            ("0,R,0,4096\n1,X,0,4096\n", "t.csv:2: unknown op 'X'"),
            ("0,R,0\n", "t.csv:1: expected 4 comma-separated fields"),
            ("0,R,zero,4096\n", "t.csv:1: offset_bytes 'zero'"),
            ("0,W,100,4096\n", "t.csv:1: write at byte 100"),
            ("0,R,0,0\n", "t.csv:1: read of length 0"),
            ("0,F,0,8\n", "t.csv:1: F row with length 8"),
            ("-1,R,0,512\n", "t.csv:1: time_ns '-1'"),
            ("0,R,0,17179869184\n", "t.csv:1: read of 17179869184 bytes"),
            (
                "0,W,9223372036854775808,512\n",
                "t.csv:1: write at byte 9223372036854775808",
            ),
            ("\u{7}\0,R\n", "t.csv:1: expected 4 comma-separated fields"),
            // A byte-order mark (or another invisible character) inside the
            // file is shown escaped, else the message names a field that
            // looks right.
            (
                "0,R,0,512\n\u{feff}1,R,0,512\n",
                "t.csv:2: time_ns '\\u{feff}1' is not a whole number",
            ),
            ("0,R,\u{200b}0,512\n", "t.csv:1: offset_bytes '\\u{200b}0'"),
        ];
        for (text, want) in cases {
            let e = csv(text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
            assert!(!e.chars().any(char::is_control), "raw bytes echoed: {e:?}");
        }
    }
}
