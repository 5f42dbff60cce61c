//! What every trace-parser target checks: the parser never panics, and
//! what it returns keeps the trace model's invariants (cli
//! `replay::trace`): data IOs have a non-zero length of at most
//! `MAX_IO_BYTES`, end at or before `MAX_END_BYTES`, are multiples of a
//! sector; flushes are 0 and 0; lines are 1-based, within the text and in
//! order; the IO limit holds; an error names a line of the text and
//! echoes no control character.

use plugio_cli::replay::load::parse;
use plugio_cli::replay::trace::{
    BlkAction, ParseOptions, TraceFormat, TraceOp, MAX_END_BYTES, MAX_IO_BYTES, SECTOR_BYTES,
};
use plugio_cli::replay::ReplayError;

/// Parses `data` as the CLI does (lossy UTF-8) in `format` (the first
/// byte picks: detection or the format, the blkparse action, a limit) and
/// checks the result.
pub fn check(data: &[u8], format: TraceFormat) {
    let (pick, body) = data.split_first().map_or((0, data), |(p, b)| (*p, b));
    let text = String::from_utf8_lossy(body);
    let opts = ParseOptions {
        format: (pick & 1 == 0).then_some(format),
        action: if pick & 2 == 0 {
            BlkAction::Q
        } else {
            BlkAction::D
        },
        limit: (pick & 4 != 0).then_some(usize::from(pick >> 3)),
    };
    let lines = text.lines().count().max(1);
    match parse(&text, "fuzz", &opts) {
        Ok(trace) => {
            if let Some(limit) = opts.limit {
                assert!(
                    trace.ios.len() <= limit,
                    "limit {limit}: {} IOs",
                    trace.ios.len()
                );
            }
            let mut last_line = 0;
            for io in &trace.ios {
                assert!(
                    io.line >= 1 && io.line <= lines,
                    "line {} of {lines}",
                    io.line
                );
                assert!(io.line >= last_line, "IOs out of trace order");
                last_line = io.line;
                if io.op == TraceOp::Flush {
                    assert_eq!((io.offset_bytes, io.len_bytes), (0, 0), "{io:?}");
                    continue;
                }
                assert!(io.len_bytes > 0 && io.len_bytes <= MAX_IO_BYTES, "{io:?}");
                assert!(io.offset_bytes % SECTOR_BYTES == 0, "{io:?}");
                assert!(io.len_bytes % SECTOR_BYTES == 0, "{io:?}");
                let end = io.offset_bytes.checked_add(io.len_bytes);
                assert!(end.is_some_and(|e| e <= MAX_END_BYTES), "{io:?}");
            }
            let _ = (trace.extent_bytes(), trace.counts());
        }
        Err(e) => {
            if let ReplayError::Parse { line, .. } = &e {
                assert!(
                    *line >= 1 && *line <= lines,
                    "error at line {line} of {lines}"
                );
            }
            let msg = e.to_string();
            assert!(
                !msg.chars().any(|c| c.is_control() && c != '\n'),
                "a control character in the message: {msg:?}"
            );
        }
    }
}
