//! blkparse's default text output: `maj,min cpu seq time pid action rwbs
//! [sector + nsectors] [proc]`, keeping the events of one action (Q or D).
//!
//! The rwbs flags are decomposed as the shared traces' CSVs do, so that a
//! blkparse text and its `q.csv`/`d.csv` give the same IOs: a leading `F`
//! (REQ_PREFLUSH) becomes a flush before the data IO, an `F` after the op
//! letter (REQ_FUA) a flush after it, and an event with no data but an
//! `F` (an empty flush: `FWS` at Q, `FN` at D) a single flush. The kernel
//! builds rwbs in `blk_fill_rwbs` (`kernel/trace/blktrace.c`).
//!
//! Invariants: lines after the summary (`CPU...`/`Total...`) are ignored,
//! unless one is an event line (two outputs joined: an error naming it);
//! event lines of other actions are skipped; the kept events are of one
//! device (a replay has one target: events of a second are an error naming
//! the line); every other line is an error naming it.

use super::error::ReplayError;
use super::trace::{printable, BlkAction, Sink, TraceOp, SECTOR_BYTES};

/// True when `token` looks like blkparse's `maj,min` device field.
pub(crate) fn is_dev(token: &str) -> bool {
    let mut parts = token.split(',');
    let ok =
        |p: Option<&str>| p.is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// What an rwbs string asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rwbs {
    /// The data op (`None`: no data op letter, or `N`).
    op: Option<TraceOp>,
    preflush: bool,
    fua: bool,
}

fn parse_rwbs(s: &str) -> Result<Rwbs, String> {
    let mut r = Rwbs {
        op: None,
        preflush: false,
        fua: false,
    };
    let mut seen_op = false;
    for c in s.chars() {
        match c {
            'F' if !seen_op => r.preflush = true,
            'F' => r.fua = true,
            'R' | 'W' | 'D' | 'N' if !seen_op => {
                seen_op = true;
                r.op = match c {
                    'R' => Some(TraceOp::Read),
                    'W' => Some(TraceOp::Write),
                    'D' => Some(TraceOp::Discard),
                    _ => None,
                };
            }
            // Secure erase (DE), sync, meta, readahead, priority.
            'E' | 'S' | 'M' | 'A' | 'P' => {}
            _ => {
                return Err(format!(
                    "unknown rwbs flag '{}' in '{}'",
                    printable(&c.to_string()),
                    printable(s)
                ))
            }
        }
    }
    // A bare flush op shows as a lone 'F' (REQ_OP_FLUSH).
    if !seen_op && !r.preflush {
        return Err(format!("rwbs '{}' has no op letter", printable(s)));
    }
    Ok(r)
}

/// `seconds.nanoseconds` to ns.
fn parse_time(s: &str) -> Option<u64> {
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = secs.parse().ok()?;
    let frac_ns: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse::<u64>().ok()? * 10u64.pow(9 - frac.len() as u32)
    };
    secs.checked_mul(1_000_000_000)?.checked_add(frac_ns)
}

/// A line of the kernel's `blk` tracer as ftrace prints it (`trace_pipe`
/// or `trace` with `options/bin` 0: `TASK-PID [CPU] FLAGS SECONDS: MAJ,MIN
/// ACTION RWBS SECTOR + N [COMM]`) as blkparse's fields (`MAJ,MIN CPU SEQ
/// SECONDS PID ACTION RWBS ...`, the sequence number 0); `None` for any
/// other line. A task name may hold spaces: the timestamp is found as the
/// field before the device.
pub(crate) fn from_ftrace<'t>(fields: &[&'t str]) -> Option<Vec<&'t str>> {
    let at = fields.iter().position(|f| {
        f.strip_suffix(':')
            .is_some_and(|t| t.contains('.') && parse_time(t).is_some())
    })?;
    let dev = *fields.get(at + 1).filter(|d| is_dev(d))?;
    let cpu_at = fields[..at]
        .iter()
        .rposition(|f| f.starts_with('[') && f.ends_with(']'))?;
    let cpu = fields[cpu_at].trim_start_matches('[').trim_end_matches(']');
    let pid = fields[..cpu_at].last()?.rsplit('-').next()?;
    let time = fields[at].strip_suffix(':')?;
    let mut out = vec![dev, cpu, "0", time, pid];
    out.extend_from_slice(fields.get(at + 2..)?);
    Some(out)
}

/// Parses blkparse text into `sink`, keeping `action` events. The
/// ftrace form of the same events is read too (see [`from_ftrace`]), and
/// ftrace's `#` header lines are skipped.
pub(crate) fn parse(text: &str, action: BlkAction, sink: &mut Sink<'_>) -> Result<(), ReplayError> {
    let keep = match action {
        BlkAction::Q => "Q",
        BlkAction::D => "D",
    };
    // The device of the first kept event, and its line.
    let mut device: Option<(&str, usize)> = None;
    let mut lines = text.lines().enumerate();
    while let Some((i, raw)) = lines.next() {
        if sink.full() {
            break;
        }
        let mut fields: Vec<&str> = raw.split_whitespace().collect();
        let Some(&first) = fields.first() else {
            sink.skip();
            continue;
        };
        if first.starts_with('#') {
            // ftrace's header.
            sink.skip();
            continue;
        }
        if !is_dev(first) {
            if let Some(normal) = from_ftrace(&fields) {
                fields = normal;
            }
        }
        let first = fields[0];
        if first.starts_with("CPU") || first == "Total" {
            // The per-CPU and total summary: the events are over, unless
            // another output was joined after it.
            return after_summary(lines, sink);
        }
        if !is_dev(first) || fields.len() < 7 {
            return Err(sink.error(
                i,
                format!(
                    "not a blkparse event line (expected 'maj,min cpu seq time pid action \
                     rwbs ...', or ftrace's 'task-pid [cpu] flags time: maj,min action rwbs \
                     ...'): '{}'",
                    printable(raw.trim())
                ),
            ));
        }
        if fields[5] != keep {
            if crate::shown::visible(fields[5]) != fields[5] {
                // Skipped as another action, the line would vanish unseen.
                return Err(sink.error(
                    i,
                    format!(
                        "action '{}' holds characters that draw nothing: remove them",
                        printable(fields[5])
                    ),
                ));
            }
            sink.skip();
            continue;
        }
        match device {
            None => device = Some((first, i)),
            Some((dev, at)) if dev != first => {
                return Err(sink.error(
                    i,
                    format!(
                        "an event of device {first} after events of device {dev} (line {}): a \
                         replay has one target; keep one device's events (blkparse -i on that \
                         device's files, or grep '^ *{dev} ')",
                        at + 1
                    ),
                ))
            }
            Some(_) => {}
        }
        event(i, &fields, sink)?;
    }
    Ok(())
}

/// The lines after the summary: ignored, unless one is an event line.
fn after_summary<'t>(
    lines: impl Iterator<Item = (usize, &'t str)>,
    sink: &mut Sink<'_>,
) -> Result<(), ReplayError> {
    for (i, raw) in lines {
        let fields: Vec<&str> = raw.split_whitespace().collect();
        if fields.first().is_some_and(|f| is_dev(f)) && fields.len() >= 7 {
            return Err(sink.error(
                i,
                "an event line after blkparse's summary (two outputs joined?): replay one \
                 output at a time",
            ));
        }
    }
    Ok(())
}

/// One kept event line.
fn event(i: usize, f: &[&str], sink: &mut Sink<'_>) -> Result<(), ReplayError> {
    let time_ns = parse_time(f[3]).ok_or_else(|| {
        sink.error(
            i,
            format!("time '{}' is not seconds.nanoseconds", printable(f[3])),
        )
    })?;
    let rwbs = parse_rwbs(f[6]).map_err(|m| sink.error(i, m))?;
    let (sector, nsectors) = match f.get(7..10) {
        Some([s, "+", n]) => {
            let num = |what: &str, v: &str| {
                v.parse::<u64>().map_err(|_| {
                    sink.error(
                        i,
                        format!("{what} '{}' is not a whole number", printable(v)),
                    )
                })
            };
            (num("sector", s)?, num("sector count", n)?)
        }
        _ if f.get(7).is_none_or(|p| p.starts_with('[')) => (0, 0),
        _ => {
            return Err(sink.error(
                i,
                format!(
                    "expected 'sector + nsectors' after rwbs '{}'",
                    printable(f[6])
                ),
            ))
        }
    };
    let offset = sector
        .checked_mul(SECTOR_BYTES)
        .ok_or_else(|| sink.error(i, "sector out of range"))?;
    let len = nsectors
        .checked_mul(SECTOR_BYTES)
        .ok_or_else(|| sink.error(i, "sector count out of range"))?;
    match rwbs.op {
        Some(op) if len > 0 => {
            if rwbs.preflush {
                sink.push(i, time_ns, TraceOp::Flush, 0, 0)?;
            }
            sink.push(i, time_ns, op, offset, len)?;
            if rwbs.fua {
                sink.push(i, time_ns, TraceOp::Flush, 0, 0)?;
            }
        }
        _ if rwbs.preflush || rwbs.fua => sink.push(i, time_ns, TraceOp::Flush, 0, 0)?,
        _ => {
            return Err(sink.error(
                i,
                format!(
                    "rwbs '{}' with no data and no flush: nothing to replay",
                    printable(f[6])
                ),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::replay::load::parse;
    use crate::replay::trace::{ParseOptions, Trace, TraceFormat};

    use super::*;

    /// Lines as blkparse printed them for the shared sqlite trace.
    const SAMPLE: &str = "\
  7,1    0        1     0.000000000  7251  Q  RM 67848 + 8 [(null)]
  7,1    0        2     0.000028082  7251  G  RM 67848 + 8 [(null)]
  7,1    0        3     0.000029495  7251  P   N [(null)]
  7,1    0        4     0.000030526  7251  U   N [(null)] 1
  7,1    0        5     0.000031889  7251  D  RM 67848 + 8 [(null)]
  7,1    1        1     0.000092199    22  C  RM 67848 + 8 [0]
  7,1    0      160    36.858101465  7206  Q  FWS [(null)]
  7,1    0      172    36.858192374  7206  Q FWFSM 2104816 + 8 [(null)]
  7,1    0      174    36.858201381    10  D  FN [(null)]
  7,1    1      155    36.858254292    44  I WSM 2104816 + 8 [(null)]
  7,1    1      156    36.858256286    44  D WSM 2104816 + 8 [(null)]
CPU0 (7,1):
 Reads Queued:       31384,   150440KiB\t Writes Queued:        2642,    52152KiB
";

    fn blk(text: &str, action: BlkAction) -> Result<Trace, ReplayError> {
        let opts = ParseOptions {
            format: Some(TraceFormat::Blkparse),
            action,
            limit: None,
        };
        parse(text, "t.txt", &opts)
    }

    #[test]
    fn events_of_a_second_device_or_after_the_summary_are_refused_by_line() {
        let two = "\
  7,1    0        1     0.000000000  7251  Q  RM 0 + 8 [x]
  8,0    0        2     0.000001000  7251  A  RM 8 + 8 <- (7,1) 0
  8,0    0        3     0.000002000  7251  Q  RM 8 + 8 [x]
";
        let e = blk(two, BlkAction::Q).unwrap_err().to_string();
        assert!(
            e.contains(":3:") && e.contains("device 8,0") && e.contains("line 1"),
            "{e}"
        );
        let joined =
            format!("{SAMPLE}  7,1    0        1     0.000000000  7251  Q  RM 0 + 8 [x]\n");
        let e = blk(&joined, BlkAction::Q).unwrap_err().to_string();
        assert!(e.contains("after blkparse's summary"), "{e}");
        // The summary's own lines and a remap line of another device pass.
        assert!(blk(SAMPLE, BlkAction::Q).is_ok());
    }

    fn rows(t: &Trace) -> Vec<(char, u64, u64, u64)> {
        t.ios
            .iter()
            .map(|io| (io.op.letter(), io.time_ns, io.offset_bytes, io.len_bytes))
            .collect()
    }

    /// The blk tracer's events as ftrace prints them (`options/bin` 0:
    /// what `trace_pipe` gives without blktrace or debugfs), header
    /// included, read as the blkparse lines they stand for (found by a
    /// fresh user: the book's ftrace route gave nothing blkparse could
    /// read). Captured on a loop device with dd; a task name may hold a
    /// space.
    #[test]
    fn ftrace_text_reads_as_blkparse() {
        let ftrace = "\
# tracer: blk
#
              dd-16271   [000] d..1. 70659.960756:   7,0    Q  RS 0 + 8 [dd]
              dd-16271   [000] d..1. 70659.960769:   7,0    G  RS 0 + 8 [dd]
              dd-16271   [000] d..1. 70659.960770:   7,0    P   N [dd]
              dd-16271   [000] d..1. 70659.960770:   7,0    U   N [dd] 1
              dd-16271   [000] d..1. 70659.960772:   7,0    D  RS 0 + 8 [dd]
     ksoftirqd/0-14      [000] d.s1. 70659.960811:   7,0    C  RS 0 + 8 [0]
     Web Content-16272   [001] d..1. 70659.964307:   7,0    Q WFS 8 + 8 [Web Content]
";
        let t = blk(ftrace, BlkAction::Q).unwrap();
        let at = |us: u64| 70_659_960_756_000 + us * 1000;
        assert_eq!(
            rows(&t),
            vec![
                ('R', at(0), 0, 4096),
                ('W', at(3551), 4096, 4096),
                ('F', at(3551), 0, 0),
            ]
        );
        let d = blk(ftrace, BlkAction::D).unwrap();
        assert_eq!(rows(&d), vec![('R', at(16), 0, 4096)]);
        // Found without --format.
        let opts = ParseOptions {
            format: None,
            action: BlkAction::Q,
            limit: None,
        };
        assert_eq!(rows(&parse(ftrace, "t.txt", &opts).unwrap()), rows(&t));
        let no_header = ftrace.lines().skip(2).collect::<Vec<_>>().join("\n");
        assert_eq!(rows(&parse(&no_header, "t.txt", &opts).unwrap()), rows(&t));
    }

    #[test]
    fn q_events_decompose_preflush_and_fua_as_the_csv_does() {
        let t = blk(SAMPLE, BlkAction::Q).unwrap();
        assert_eq!(
            rows(&t),
            [
                ('R', 0, 67848 * 512, 4096),
                ('F', 36_858_101_465, 0, 0),
                ('F', 36_858_192_374, 0, 0),
                ('W', 36_858_192_374, 2104816 * 512, 4096),
                ('F', 36_858_192_374, 0, 0),
            ]
        );
        assert_eq!(t.ios[3].line, 8);
    }

    #[test]
    fn d_events_are_kept_with_action_d() {
        let t = blk(SAMPLE, BlkAction::D).unwrap();
        assert_eq!(
            rows(&t),
            [
                ('R', 31_889, 67848 * 512, 4096),
                ('F', 36_858_201_381, 0, 0),
                ('W', 36_858_256_286, 2104816 * 512, 4096),
            ]
        );
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        let ok = "  7,1 0 1 0.5 1 Q R 8 + 8 [p]\n";
        let cases = [
            ("garbage here\n", "t.txt:1: not a blkparse event line"),
            ("  7,1 0 1 x.5 1 Q R 8 + 8 [p]\n", "t.txt:1: time 'x.5'"),
            (
                "  7,1 0 1 0.5 1 Q R 8 - 8 [p]\n",
                "t.txt:1: expected 'sector + nsectors'",
            ),
            (
                "  7,1 0 1 0.5 1 Q R 8 + y [p]\n",
                "t.txt:1: sector count 'y'",
            ),
            (
                "  7,1 0 1 0.5 1 Q RQ 8 + 8 [p]\n",
                "t.txt:1: unknown rwbs flag 'Q'",
            ),
            (
                "  7,1 0 1 0.5 1 Q N [p]\n",
                "t.txt:1: rwbs 'N' with no data",
            ),
            (
                "  7,1 0 1 0.5 1 Q R 3 + 0 [p]\n",
                "t.txt:1: rwbs 'R' with no data",
            ),
            (
                "  7,1 0 1 0.5 1 Q\u{200b} R 8 + 8 [p]\n",
                "t.txt:1: action 'Q\\u{200b}' holds characters that draw nothing",
            ),
        ];
        for (text, want) in cases {
            let all = format!("{ok}{text}");
            let e = blk(text, BlkAction::Q).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
            let e = blk(&all, BlkAction::Q).unwrap_err().to_string();
            assert!(e.starts_with(&want.replace(":1:", ":2:")), "{all:?}: {e}");
        }
    }

    #[test]
    fn time_and_dev_helpers() {
        assert_eq!(parse_time("36.858101465"), Some(36_858_101_465));
        assert_eq!(parse_time("1.5"), Some(1_500_000_000));
        assert_eq!(parse_time("2"), Some(2_000_000_000));
        assert_eq!(parse_time("1.1234567890"), None);
        assert!(is_dev("259,0") && !is_dev("7,") && !is_dev("7,1,2") && !is_dev("a,1"));
    }
}
