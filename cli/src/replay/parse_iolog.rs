//! fio's iolog text (`read_iolog`/`write_iolog`), versions 2 and 3.
//!
//! v2: `filename action [offset length]`, time advanced only by `wait`
//! lines (microseconds in the offset field). v3: `timestamp filename
//! action [offset length]` with the timestamp in microseconds since the
//! start (fio's `write_iolog` writes `utime_since_now`). Actions `read`,
//! `write`, `trim` become IOs; `sync`, `datasync` flushes; `add`, `open`,
//! `close` are skipped. Every file's IO goes to the one target (as fio's
//! `replay_redirect`).
//!
//! Invariant: the first non-blank line is the version header; any other
//! unrecognised line is an error naming it.

use super::error::ReplayError;
use super::trace::{printable, Sink, TraceOp};

/// Parses iolog text into `sink`.
pub(crate) fn parse(text: &str, sink: &mut Sink<'_>) -> Result<(), ReplayError> {
    let mut version = None;
    let mut wait_us: u64 = 0;
    for (i, raw) in text.lines().enumerate() {
        if sink.full() {
            break;
        }
        let line = raw.trim();
        if line.is_empty() {
            sink.skip();
            continue;
        }
        let Some(v) = version else {
            version = Some(match line {
                "fio version 2 iolog" => 2,
                "fio version 3 iolog" => 3,
                _ => {
                    return Err(sink.error(
                        i,
                        format!(
                            "expected 'fio version 2 iolog' or 'fio version 3 iolog', found \
                             '{}'",
                            printable(line)
                        ),
                    ))
                }
            });
            sink.skip();
            continue;
        };
        let mut fields: Vec<&str> = line.split_whitespace().collect();
        let time_us = if v == 3 {
            let t = fields.remove(0);
            t.parse::<u64>().map_err(|_| {
                sink.error(
                    i,
                    format!("timestamp '{}' is not a whole number", printable(t)),
                )
            })?
        } else {
            wait_us
        };
        let action = match fields.len() {
            2 | 4 => fields[1],
            n => {
                return Err(sink.error(
                    i,
                    format!(
                        "expected '{}filename action [offset length]', found {} fields",
                        if v == 3 { "timestamp " } else { "" },
                        n + usize::from(v == 3)
                    ),
                ))
            }
        };
        if fields.len() == 2 {
            match action {
                "add" | "open" | "close" => {
                    sink.skip();
                    continue;
                }
                _ => {
                    return Err(sink.error(
                        i,
                        format!(
                            "action '{}' needs an offset and a length",
                            printable(action)
                        ),
                    ))
                }
            }
        }
        let number = |what: &str, s: &str| {
            s.parse::<u64>().map_err(|_| {
                sink.error(
                    i,
                    format!("{what} '{}' is not a whole number", printable(s)),
                )
            })
        };
        let offset = number("offset", fields[2])?;
        let len = number("length", fields[3])?;
        let op = match action {
            "read" => TraceOp::Read,
            "write" => TraceOp::Write,
            "trim" => TraceOp::Discard,
            "sync" | "datasync" => TraceOp::Flush,
            "wait" if v == 2 => {
                wait_us = wait_us.saturating_add(offset);
                sink.skip();
                continue;
            }
            other => {
                return Err(sink.error(
                    i,
                    format!(
                        "unknown action '{}': use read, write, trim, sync, datasync{}",
                        printable(other),
                        if v == 2 { ", wait" } else { "" }
                    ),
                ))
            }
        };
        sink.push(i, time_us.saturating_mul(1000), op, offset, len)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::replay::load::parse;
    use crate::replay::trace::{ParseOptions, TraceFormat, TraceIo};

    use super::*;

    fn iolog(text: &str) -> Result<Vec<TraceIo>, ReplayError> {
        let opts = ParseOptions {
            format: Some(TraceFormat::Iolog),
            ..ParseOptions::default()
        };
        parse(text, "t.log", &opts).map(|t| t.ios)
    }

    #[test]
    fn v3_lines_from_fio_write_iolog_become_ios_at_their_microsecond() {
        let text = "fio version 3 iolog\n21 /tmp/f add\n126 /tmp/f open\n\
                    129 /tmp/f read 61440 4096\n753 /tmp/f write 491520 4096\n\
                    800 /tmp/f sync 0 0\n900 /tmp/f trim 0 4096\n1026 /tmp/f close\n";
        let ios = iolog(text).unwrap();
        let ops: Vec<_> = ios.iter().map(|io| (io.op, io.time_ns, io.line)).collect();
        assert_eq!(
            ops,
            [
                (TraceOp::Read, 129_000, 4),
                (TraceOp::Write, 753_000, 5),
                (TraceOp::Flush, 800_000, 6),
                (TraceOp::Discard, 900_000, 7)
            ]
        );
        assert_eq!(ios[0].offset_bytes, 61440);
    }

    #[test]
    fn v2_time_advances_by_wait_lines() {
        let text = "fio version 2 iolog\n/f add\n/f open\n/f read 0 512\n/f wait 250 0\n\
                    /f datasync 0 0\n/f write 512 512\n";
        let ios = iolog(text).unwrap();
        let times: Vec<_> = ios.iter().map(|io| (io.op, io.time_ns)).collect();
        assert_eq!(
            times,
            [
                (TraceOp::Read, 0),
                (TraceOp::Flush, 250_000),
                (TraceOp::Write, 250_000)
            ]
        );
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        let cases = [
            ("fio version 9 iolog\n", "t.log:1: expected 'fio version 2"),
            (
                "fio version 2 iolog\n/f read 0\n",
                "t.log:2: expected 'filename",
            ),
            (
                "fio version 2 iolog\n/f peek 0 512\n",
                "t.log:2: unknown action 'peek'",
            ),
            (
                "fio version 3 iolog\nx /f read 0 512\n",
                "t.log:2: timestamp 'x'",
            ),
            (
                "fio version 3 iolog\n1 /f wait 5 0\n",
                "t.log:2: unknown action 'wait'",
            ),
            (
                "fio version 2 iolog\n/f read\n",
                "t.log:2: action 'read' needs",
            ),
            (
                "fio version 2 iolog\n/f read 0 4k\n",
                "t.log:2: length '4k'",
            ),
        ];
        for (text, want) in cases {
            let e = iolog(text).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
    }
}
