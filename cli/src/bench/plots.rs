//! The SVG plots of `plugio compare-report` (`benches/plots/`): IOPS
//! against queue depth per target, and bar charts of the sequential-read
//! and NOP workloads.
//!
//! Invariants: an engine has the same colour in every plot
//! ([`engine_color`]); every bar and point is the median of its runs, with
//! a min–max error bar and its value written beside it; both axes are
//! titled.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::error::BenchError;
use super::runs::{engines_of, fmt_iops, median_of, stats, targets_of, Key, Runs};

/// Engines in the order of their fixed colours.
const ENGINE_COLORS: [(&str, RGBColor); 11] = [
    ("plugio", RGBColor(31, 119, 180)),
    ("plugio-nomerges", RGBColor(158, 202, 225)),
    ("nop", RGBColor(31, 119, 180)),
    ("raw", RGBColor(44, 44, 44)),
    ("raw-nop", RGBColor(44, 44, 44)),
    ("glommio", RGBColor(255, 127, 14)),
    ("monoio", RGBColor(44, 160, 44)),
    ("tokio-uring", RGBColor(214, 39, 40)),
    ("compio", RGBColor(148, 103, 189)),
    ("tokio", RGBColor(140, 86, 75)),
    ("psync", RGBColor(227, 119, 194)),
];

/// The colour `engine` has in every plot (a fixed table; an engine not in
/// it gets a palette colour picked by its name, also stable).
pub fn engine_color(engine: &str) -> RGBColor {
    if let Some((_, c)) = ENGINE_COLORS.iter().find(|(e, _)| *e == engine) {
        return *c;
    }
    let h = engine
        .bytes()
        .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
    let (r, g, b) = Palette99::pick(h).rgb();
    RGBColor(r, g, b)
}

fn plot_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::engine("plot", e)
}

/// Writes every plot the results allow into `dir`; returns their paths.
///
/// # Errors
/// A plot could not be drawn or written.
pub(super) fn plot_all(dir: &Path, map: &BTreeMap<Key, Runs>) -> Result<Vec<PathBuf>, BenchError> {
    let mut written = Vec::new();
    for target in targets_of(map, "randread4k") {
        let mut qds: Vec<u32> = map
            .keys()
            .filter(|k| k.workload == "randread4k" && k.target == target)
            .map(|k| k.qd)
            .collect();
        qds.sort_unstable();
        qds.dedup();
        if qds.len() < 2 {
            continue;
        }
        let path = dir.join(format!("iops_vs_qd_{target}.svg"));
        qd_plot(&path, &target, map, &qds)?;
        written.push(path);
    }
    for (workload, title, file, cpu) in [
        (
            "seqread4k",
            "Sequential 4 KiB reads, 32 tasks (plugio-nomerges: merging off)",
            "seqread",
            false,
        ),
        ("nop", "NOP: CPU per IO (lower is better)", "nop_cpu", true),
    ] {
        for target in targets_of(map, workload) {
            let bars: Vec<Bar> = map
                .iter()
                .filter(|(k, _)| k.workload == workload && k.target == target)
                .filter_map(|(k, r)| {
                    let v = if cpu { &r.cpu_ns_per_io } else { &r.iops };
                    stats(v).map(|(median, min, max)| Bar {
                        engine: k.engine.clone(),
                        median,
                        min,
                        max,
                    })
                })
                .collect();
            if bars.is_empty() {
                continue;
            }
            let path = dir.join(format!("{file}_{target}.svg"));
            let (unit, axis): (fn(f64) -> String, &str) = if cpu {
                (
                    |v| format!("{v:.0} ns"),
                    "CPU ns per IO (median; bar: min-max)",
                )
            } else {
                (fmt_iops, "IOPS (median; bar: min-max)")
            };
            bar_plot(&path, &format!("{title}, {target}"), &bars, unit, axis)?;
            written.push(path);
        }
    }
    Ok(written)
}

/// One bar: an engine's median with the range of its runs.
struct Bar {
    engine: String,
    median: f64,
    min: f64,
    max: f64,
}

/// (log2 queue depth, median, min, max) of `engine`'s runs on `target`.
fn qd_points(
    map: &BTreeMap<Key, Runs>,
    target: &str,
    engine: &str,
    qds: &[u32],
) -> Vec<(f64, f64, f64, f64)> {
    qds.iter()
        .filter_map(|q| {
            let key = Key {
                target: target.into(),
                engine: engine.into(),
                workload: "randread4k".into(),
                qd: *q,
            };
            let (_, min, max) = map.get(&key).and_then(|r| stats(&r.iops))?;
            let median = median_of(map, target, engine, "randread4k", *q)?;
            Some((f64::from(*q).log2(), median, min, max))
        })
        .collect()
}

fn qd_plot(
    path: &Path,
    target: &str,
    map: &BTreeMap<Key, Runs>,
    qds: &[u32],
) -> Result<(), BenchError> {
    let engines = engines_of(map, "randread4k");
    let max = map
        .iter()
        .filter(|(k, _)| k.workload == "randread4k" && k.target == target)
        .filter_map(|(_, r)| stats(&r.iops).map(|s| s.2))
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let x_max = f64::from(*qds.last().unwrap_or(&1)).log2().max(1.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("4 KiB random reads, {target}: IOPS vs queue depth"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(85)
        .build_cartesian_2d(-0.3f64..x_max + 0.3, 0f64..max * 1.15)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("queue depth (IOs in flight per core)")
        .y_desc("IOPS (median; bar: min-max)")
        // Ticks at whole log2 values only: 1, 2, 4, 8, ...
        .x_labels(x_max as usize + 3)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 && *x >= 0.0 {
                format!("{:.0}", 2f64.powf(x.round()))
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| fmt_iops(*y))
        .draw()
        .map_err(plot_err)?;
    for e in &engines {
        let color = engine_color(e);
        let pts = qd_points(map, target, e, qds);
        let line: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, p.1)).collect();
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
            .map_err(plot_err)?
            .label(e.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart
            .draw_series(line.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(plot_err)?;
        chart
            .draw_series(pts.iter().map(|(x, med, lo, hi)| {
                ErrorBar::new_vertical(*x, *lo, *med, *hi, color.stroke_width(1), 6)
            }))
            .map_err(plot_err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)
}

fn bar_plot(
    path: &Path,
    title: &str,
    bars: &[Bar],
    unit: fn(f64) -> String,
    axis: &str,
) -> Result<(), BenchError> {
    let max = bars.iter().map(|b| b.max.max(b.median)).fold(1.0, f64::max);
    let root = SVGBackend::new(path, (900, 140 + 50 * bars.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let n = bars.len() as i32;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(120)
        // Room on the right for the value labels.
        .build_cartesian_2d(0f64..max * 1.3, (0i32..(n - 1).max(0)).into_segmented())
        .map_err(plot_err)?;
    let labels: Vec<&str> = bars.iter().map(|b| b.engine.as_str()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len())
        .y_desc("engine")
        .x_desc(axis)
        // Segment centres carry the labels, so each sits beside its bar.
        .y_label_formatter(&|y| match y {
            SegmentValue::CenterOf(i) => labels
                .get(*i as usize)
                .map(|s| (*s).to_owned())
                .unwrap_or_default(),
            _ => String::new(),
        })
        .x_label_formatter(&|x| unit(*x))
        .draw()
        .map_err(plot_err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let i = i as i32;
            let mut r = Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(i)),
                    (b.median, SegmentValue::Exact(i + 1)),
                ],
                engine_color(&b.engine).filled(),
            );
            r.set_margin(6, 6, 0, 0);
            r
        }))
        .map_err(plot_err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            ErrorBar::new_horizontal(
                SegmentValue::CenterOf(i as i32),
                b.min,
                b.median,
                b.max,
                BLACK.stroke_width(1),
                10,
            )
        }))
        .map_err(plot_err)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let style = ("sans-serif", 14)
                .into_font()
                .into_text_style(&root)
                .pos(Pos::new(HPos::Left, VPos::Center));
            Text::new(
                format!("  {}", unit(b.median)),
                (b.max.max(b.median), SegmentValue::CenterOf(i as i32)),
                style,
            )
        }))
        .map_err(plot_err)?;
    root.present().map_err(plot_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_keeps_its_colour_and_engines_differ() {
        assert_eq!(engine_color("plugio"), engine_color("plugio"));
        assert_eq!(
            engine_color("some-new-engine"),
            engine_color("some-new-engine")
        );
        let peers = [
            "plugio",
            "raw",
            "glommio",
            "monoio",
            "tokio-uring",
            "compio",
            "tokio",
            "psync",
        ];
        for (i, a) in peers.iter().enumerate() {
            for b in &peers[i + 1..] {
                assert_ne!(engine_color(a), engine_color(b), "{a} and {b}");
            }
        }
    }
}
