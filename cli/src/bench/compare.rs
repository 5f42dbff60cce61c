//! `plugio compare-report` (hidden; run by `benches/compare.sh`): reads the
//! JSON results of a comparison run (plugio's `--json` output and fio's
//! `--output-format=json`), writes the `## Peer comparison` section of
//! `benches/RESULTS.md` (medians with min–max, and the goal ratios) and
//! SVG plots.
//!
//! Result files are named `TARGET__ENGINE__WORKLOAD__qdN__rREP.json`; the
//! name gives the grouping, the file gives the figures.
//!
//! Invariants: only the `## Peer comparison` section of the markdown file
//! is replaced (up to the next `## ` heading); a figure with no result is
//! shown as "–", never invented; a goal with a missing side is reported as
//! "not measured".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;

use super::error::BenchError;
use super::runs::{engines_of, fmt_iops, median_of, stats, Key, Runs};

/// Options of `plugio compare-report`.
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Directory holding the JSON result files.
    #[arg(long)]
    pub results: PathBuf,
    /// The markdown file whose `## Peer comparison` section is rewritten.
    #[arg(long, default_value = "benches/RESULTS.md")]
    pub markdown: PathBuf,
    /// Directory for the SVG plots.
    #[arg(long, default_value = "benches/plots")]
    pub plots: PathBuf,
    /// One line describing the run (machine, kernel, runtime, repeats).
    #[arg(long, default_value = "")]
    pub context: String,
    /// The command that reproduces the section.
    #[arg(long, default_value = "benches/compare.sh")]
    pub command: String,
    /// A markdown file included verbatim after the tables (analysis).
    #[arg(long)]
    pub notes: Option<PathBuf>,
}

/// The distinct notes of all results, in order: a cell whose runs have
/// note `i` (0-based) is marked `[n{i+1}]` and the notes are listed
/// under the tables.
fn all_notes(map: &BTreeMap<Key, Runs>) -> Vec<String> {
    let mut all: Vec<String> = map.values().flat_map(|r| r.notes.iter().cloned()).collect();
    all.sort();
    all.dedup();
    all
}

/// Parses `TARGET__ENGINE__WORKLOAD__qdN__rREP.json`.
fn parse_name(path: &Path) -> Option<Key> {
    let stem = path.file_stem()?.to_str()?;
    let parts: Vec<&str> = stem.split("__").collect();
    if parts.len() != 5 || !parts[4].starts_with('r') {
        return None;
    }
    Some(Key {
        target: parts[0].to_owned(),
        engine: parts[1].to_owned(),
        workload: parts[2].to_owned(),
        qd: parts[3].strip_prefix("qd")?.parse().ok()?,
    })
}

/// IOPS and CPU ns/IO of one result file (plugio or fio JSON).
fn figures(v: &Value) -> Option<(f64, Option<f64>)> {
    if v.get("fio version").is_some() {
        let jobs = v.get("jobs")?.as_array()?;
        let iops: f64 = jobs
            .iter()
            .map(|j| {
                let side = |s: &str| j.get(s).and_then(|x| x.get("iops")).and_then(Value::as_f64);
                side("read").unwrap_or(0.0) + side("write").unwrap_or(0.0)
            })
            .sum();
        return Some((iops, None));
    }
    Some((
        v.get("iops")?.as_f64()?,
        v.get("cpu_ns_per_io").and_then(Value::as_f64),
    ))
}

fn load(dir: &Path) -> Result<BTreeMap<Key, Runs>, BenchError> {
    let mut map: BTreeMap<Key, Runs> = BTreeMap::new();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| BenchError::io(format!("reading {}", plugio_cli::shown::path(dir)), e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(key) = parse_name(&path) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).map_err(|e| {
            BenchError::io(format!("reading {}", plugio_cli::shown::path(&path)), e)
        })?;
        // fio may print warnings before its JSON: start at the first '{'.
        let json = text.find('{').map_or("", |i| &text[i..]);
        let Ok(v) = serde_json::from_str::<Value>(json) else {
            eprintln!(
                "compare-report: skipping {} (not JSON)",
                plugio_cli::shown::path(&path)
            );
            continue;
        };
        let Some((iops, cpu)) = figures(&v) else {
            eprintln!(
                "compare-report: skipping {} (no IOPS)",
                plugio_cli::shown::path(&path)
            );
            continue;
        };
        let runs = map.entry(key).or_default();
        runs.iops.push(iops);
        runs.cpu_ns_per_io.extend(cpu);
        for n in v
            .get("notes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !runs.notes.iter().any(|x| x == n) {
                runs.notes.push(n.to_owned());
            }
        }
    }
    Ok(map)
}

/// A cell: median (min–max), marked `[nK]` for each note of its runs
/// (`notes` from [`all_notes`]).
fn cell(runs: Option<&Runs>, notes: &[String]) -> String {
    match runs.and_then(|r| stats(&r.iops).map(|s| (r, s))) {
        Some((r, (m, lo, hi))) => {
            let mut c = format!("{} ({}–{})", fmt_iops(m), fmt_iops(lo), fmt_iops(hi));
            for n in &r.notes {
                if let Some(i) = notes.iter().position(|x| x == n) {
                    c.push_str(&format!(" [n{}]", i + 1));
                }
            }
            c
        }
        None => "–".to_owned(),
    }
}

fn table(out: &mut String, map: &BTreeMap<Key, Runs>, workload: &str, qd_rows: bool) {
    let engines = engines_of(map, workload);
    if engines.is_empty() {
        return;
    }
    let notes = all_notes(map);
    let first = if qd_rows { "target, QD" } else { "target" };
    out.push_str(&format!("| {first} | {} |\n", engines.join(" | ")));
    out.push_str(&format!("|---|{}\n", "---|".repeat(engines.len())));
    let mut rows: Vec<(String, u32)> = map
        .keys()
        .filter(|k| k.workload == workload)
        .map(|k| (k.target.clone(), k.qd))
        .collect();
    rows.sort();
    rows.dedup();
    for (target, qd) in rows {
        let label = if qd_rows {
            format!("{target}, {qd}")
        } else {
            target.clone()
        };
        let cells: Vec<String> = engines
            .iter()
            .map(|e| {
                cell(
                    map.get(&Key {
                        target: target.clone(),
                        engine: e.clone(),
                        workload: workload.into(),
                        qd,
                    }),
                    &notes,
                )
            })
            .collect();
        out.push_str(&format!("| {label} | {} |\n", cells.join(" | ")));
    }
    out.push('\n');
}

/// One goal: `num / den >= want`.
struct Goal {
    what: &'static str,
    num: (&'static str, &'static str, &'static str, u32),
    den: (&'static str, &'static str, &'static str, u32),
    want: f64,
}

const GOALS: &[Goal] = &[
    Goal {
        what: "plugio ≥ 1.0× raw, zram, 4 KiB random reads, QD128",
        num: ("zram", "plugio", "randread4k", 128),
        den: ("zram", "raw", "randread4k", 128),
        want: 1.0,
    },
    Goal {
        what: "plugio ≥ 1.0× raw, cached buffered 4 KiB random reads, QD128",
        num: ("cache", "plugio", "randread4k", 128),
        den: ("cache", "raw", "randread4k", 128),
        want: 1.0,
    },
    Goal {
        what: "plugio nop ≥ 0.75× raw nop",
        num: ("none", "nop", "nop", 128),
        den: ("none", "rawnop", "nop", 128),
        want: 0.75,
    },
    Goal {
        what: "plugio ≥ 2× glommio, zram, 4 KiB random reads, QD128",
        num: ("zram", "plugio", "randread4k", 128),
        den: ("zram", "glommio", "randread4k", 128),
        want: 2.0,
    },
    Goal {
        what: "plugio ≥ 4× tokio, zram, 4 KiB random reads, QD128",
        num: ("zram", "plugio", "randread4k", 128),
        den: ("zram", "tokio", "randread4k", 128),
        want: 4.0,
    },
];

fn goals(out: &mut String, map: &BTreeMap<Key, Runs>) {
    out.push_str("| goal | measured | status |\n|---|---|---|\n");
    for g in GOALS {
        let n = median_of(map, g.num.0, g.num.1, g.num.2, g.num.3);
        let d = median_of(map, g.den.0, g.den.1, g.den.2, g.den.3);
        let (ratio, status) = match (n, d) {
            (Some(n), Some(d)) if d > 0.0 => {
                let r = n / d;
                (
                    format!("{r:.2}×"),
                    if r >= g.want { "met" } else { "**missed**" },
                )
            }
            _ => ("–".to_owned(), "not measured"),
        };
        out.push_str(&format!("| {} | {ratio} | {status} |\n", g.what));
    }
    out.push('\n');
}

/// plugio's ratio to each other engine: median IOPS of 4 KiB random
/// reads at QD128 on each target, `plugio / engine`.
fn ratio_table(out: &mut String, map: &BTreeMap<Key, Runs>) {
    const QD: u32 = 128;
    let engines: Vec<String> = engines_of(map, "randread4k")
        .into_iter()
        .filter(|e| e != "plugio")
        .collect();
    let mut targets: Vec<String> = map
        .keys()
        .filter(|k| k.workload == "randread4k" && k.qd == QD && k.engine == "plugio")
        .map(|k| k.target.clone())
        .collect();
    targets.dedup();
    if engines.is_empty() || targets.is_empty() {
        return;
    }
    out.push_str(&format!("| target | {} |\n", engines.join(" | ")));
    out.push_str(&format!("|---|{}\n", "---|".repeat(engines.len())));
    for t in &targets {
        let p = median_of(map, t, "plugio", "randread4k", QD);
        let cells: Vec<String> = engines
            .iter()
            .map(|e| match (p, median_of(map, t, e, "randread4k", QD)) {
                (Some(p), Some(d)) if d > 0.0 => format!("{:.2}×", p / d),
                _ => "–".to_owned(),
            })
            .collect();
        out.push_str(&format!("| {t} | {} |\n", cells.join(" | ")));
    }
    out.push('\n');
}

/// The numbered notes that mark cells (`[nK]`).
fn notes_list(out: &mut String, map: &BTreeMap<Key, Runs>) {
    let notes = all_notes(map);
    if notes.is_empty() {
        return;
    }
    out.push_str("### Marked cells: what the engine could not do as asked (from its `notes`)\n\n");
    for (i, n) in notes.iter().enumerate() {
        out.push_str(&format!("- [n{}] {n}\n", i + 1));
    }
    out.push('\n');
}

fn nop_table(out: &mut String, map: &BTreeMap<Key, Runs>) {
    let rows: Vec<(&Key, &Runs)> = map.iter().filter(|(k, _)| k.workload == "nop").collect();
    if rows.is_empty() {
        return;
    }
    out.push_str("| engine | IOPS (one core) | CPU ns/IO (median) |\n|---|---|---|\n");
    let notes = all_notes(map);
    for (k, r) in rows {
        let cpu = stats(&r.cpu_ns_per_io).map_or("–".into(), |s| format!("{:.0}", s.0));
        out.push_str(&format!(
            "| {} | {} | {cpu} |\n",
            k.engine,
            cell(Some(r), &notes)
        ));
    }
    out.push('\n');
}

/// Builds the section text.
fn section(
    args: &CompareArgs,
    map: &BTreeMap<Key, Runs>,
    plots: &[PathBuf],
) -> Result<String, BenchError> {
    let mut out = String::from("## Peer comparison\n\n");
    out.push_str(&format!(
        "Reproduce with `{}`. {}\nEach cell: median IOPS of the repeats (min–max). \
         Targets: `cache` = temporary file in the page cache (`--direct 0`), `zram` = \
         a zram device (O_DIRECT), `loop` = loop device over a file in /dev/shm (O_DIRECT), \
         `none` = no file (NOP). `raw` is our t/io_uring-like loop; `fio` is Debian's fio with \
         ioengine=io_uring (t/io_uring-like settings). \
         Every engine runs on one pinned CPU.\n\n",
        args.command, args.context
    ));
    out.push_str("### 4 KiB random reads, one core\n\n");
    table(&mut out, map, "randread4k", true);
    out.push_str(
        "### Sequential 4 KiB reads, 32 tasks, one core (`plugio-nomerges`: `--nomerges 2`)\n\n",
    );
    table(&mut out, map, "seqread4k", true);
    out.push_str("### NOP through the whole path (per-IO CPU cost)\n\n");
    nop_table(&mut out, map);
    out.push_str("### Goals (ratios of medians in this run)\n\n");
    goals(&mut out, map);
    out.push_str("### plugio's ratio to each engine (median IOPS, 4 KiB random reads, QD128)\n\n");
    ratio_table(&mut out, map);
    notes_list(&mut out, map);
    if !plots.is_empty() {
        out.push_str("### Plots\n\n");
        let base = args.markdown.parent().unwrap_or(Path::new("."));
        for p in plots {
            let rel = p.strip_prefix(base).unwrap_or(p);
            out.push_str(&format!("![{}]({})\n\n", rel.display(), rel.display()));
        }
    }
    if let Some(notes) = &args.notes {
        let text = std::fs::read_to_string(notes).map_err(|e| {
            BenchError::io(format!("reading {}", plugio_cli::shown::path(notes)), e)
        })?;
        out.push_str(text.trim_end());
        out.push_str("\n\n");
    }
    Ok(out)
}

/// Replaces (or appends) the `## Peer comparison` section of `doc`.
pub fn replace_section(doc: &str, section: &str) -> String {
    let mut lines: Vec<&str> = doc.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_end() == "## Peer comparison");
    let mut out = String::new();
    match start {
        Some(s) => {
            let end = lines[s + 1..]
                .iter()
                .position(|l| l.starts_with("## "))
                .map_or(lines.len(), |e| s + 1 + e);
            let tail = lines.split_off(end);
            lines.truncate(s);
            for l in &lines {
                out.push_str(l);
                out.push('\n');
            }
            out.push_str(section);
            for l in &tail {
                out.push_str(l);
                out.push('\n');
            }
        }
        None => {
            out.push_str(doc.trim_end());
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str(section);
        }
    }
    out
}

/// Runs the report.
///
/// # Errors
/// Unreadable results, unwritable markdown or plots.
pub fn main(args: &CompareArgs) -> Result<(), BenchError> {
    let map = load(&args.results)?;
    if map.is_empty() {
        return Err(BenchError::usage(format!(
            "no result files (TARGET__ENGINE__WORKLOAD__qdN__rREP.json) in {}",
            plugio_cli::shown::path(&args.results)
        )));
    }
    std::fs::create_dir_all(&args.plots).map_err(|e| {
        BenchError::io(
            format!("creating {}", plugio_cli::shown::path(&args.plots)),
            e,
        )
    })?;
    let plots = super::plots::plot_all(&args.plots, &map)?;
    let text = section(args, &map, &plots)?;
    let doc =
        std::fs::read_to_string(&args.markdown).unwrap_or_else(|_| "# Benchmark results\n".into());
    std::fs::write(&args.markdown, replace_section(&doc, &text)).map_err(|e| {
        BenchError::io(
            format!("writing {}", plugio_cli::shown::path(&args.markdown)),
            e,
        )
    })?;
    println!(
        "wrote {} and {} plot(s) in {}",
        plugio_cli::shown::path(&args.markdown),
        plots.len(),
        plugio_cli::shown::path(&args.plots)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_replacement_keeps_other_sections() {
        let doc = "# R\n\n## Micro\nkeep me\n\n## Peer comparison\nold\n\n## Other\nalso keep\n";
        let out = replace_section(doc, "## Peer comparison\n\nnew\n\n");
        assert!(out.contains("keep me") && out.contains("also keep") && out.contains("new"));
        assert!(!out.contains("old"));
        let appended = replace_section("# R\n", "## Peer comparison\n\nx\n");
        assert!(appended.starts_with("# R\n\n## Peer comparison"));
    }

    fn key(target: &str, engine: &str) -> Key {
        Key {
            target: target.into(),
            engine: engine.into(),
            workload: "randread4k".into(),
            qd: 128,
        }
    }

    #[test]
    fn cells_with_notes_are_marked_and_ratios_are_plugio_over_peer() {
        let mut map = BTreeMap::new();
        let runs = |iops: f64, notes: &[&str]| Runs {
            iops: vec![iops],
            cpu_ns_per_io: Vec::new(),
            notes: notes.iter().map(|n| (*n).to_owned()).collect(),
        };
        map.insert(key("zram", "plugio"), runs(300e3, &[]));
        map.insert(
            key("zram", "monoio"),
            runs(150e3, &["monoio: no fixed buffers"]),
        );
        map.insert(key("zram", "compio"), runs(100e3, &[]));
        let notes = all_notes(&map);
        assert_eq!(notes, vec!["monoio: no fixed buffers".to_owned()]);
        assert_eq!(
            cell(map.get(&key("zram", "monoio")), &notes),
            "150K (150K–150K) [n1]"
        );
        assert_eq!(
            cell(map.get(&key("zram", "plugio")), &notes),
            "300K (300K–300K)"
        );
        let mut out = String::new();
        table(&mut out, &map, "randread4k", true);
        assert!(out.contains("| plugio | monoio | compio |"), "{out}");
        assert!(out.contains("[n1]"), "{out}");
        let mut out = String::new();
        ratio_table(&mut out, &map);
        assert!(out.contains("| zram | 2.00× | 3.00× |"), "{out}");
        let mut out = String::new();
        notes_list(&mut out, &map);
        assert!(out.contains("- [n1] monoio: no fixed buffers"), "{out}");
    }

    #[test]
    fn medians_and_names_parse() {
        assert_eq!(stats(&[3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(stats(&[]), None);
        let k = parse_name(Path::new("zram__plugio__randread4k__qd128__r1.json")).expect("name");
        assert_eq!(
            (k.target.as_str(), k.engine.as_str(), k.qd),
            ("zram", "plugio", 128)
        );
        assert!(parse_name(Path::new("junk.json")).is_none());
    }
}
