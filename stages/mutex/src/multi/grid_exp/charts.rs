//! The grid sweep's outputs for people: the Markdown summary table ([`summary_table`])
//! and the PNG charts ([`grid_charts`]), from the CSV rows. Reads [`GridRow`]s only.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::chart::{COLORS, ChartError, draw_err, draw_legend, ensure_font, titled_canvas};

use super::{GridAlgo, GridRow};

/// Mean over seeds of `f` per x value, for one experiment and algorithm.
pub(super) fn series(
    rows: &[GridRow],
    experiment: &str,
    algo: GridAlgo,
    f: impl Fn(&GridRow) -> f64,
) -> Vec<(f64, f64)> {
    let mut xs: Vec<f64> = rows
        .iter()
        .filter(|r| r.point.experiment == experiment)
        .map(|r| r.point.x())
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    xs.into_iter()
        .filter_map(|x| {
            let v: Vec<f64> = rows
                .iter()
                .filter(|r| r.point.experiment == experiment && r.algo == algo && r.point.x() == x)
                .map(&f)
                .collect();
            (!v.is_empty()).then(|| (x, v.iter().sum::<f64>() / v.len() as f64))
        })
        .collect()
}

/// A table of means over seeds: one line per experiment, x and algorithm (Markdown).
pub fn summary_table(rows: &[GridRow]) -> String {
    let mut s = String::from(
        "| experiment | x | algorithm | wait (ms) | wait SD (%) | logical wait (ms) | VN logical (ms) | msgs/CS | remote/CS | local/CS | preemptions | use rate |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut seen: Vec<(&str, f64)> = Vec::new();
    for r in rows {
        let key = (r.point.experiment, r.point.x());
        if !seen.contains(&key) {
            seen.push(key);
        }
    }
    for (exp, x) in seen {
        for algo in GridAlgo::ALL {
            let sel: Vec<&GridRow> = rows
                .iter()
                .filter(|r| r.point.experiment == exp && r.point.x() == x && r.algo == algo)
                .collect();
            if sel.is_empty() {
                continue;
            }
            let n = sel.len() as f64;
            let mean = |f: &dyn Fn(&GridRow) -> f64| sel.iter().map(|r| f(r)).sum::<f64>() / n;
            let wait = mean(&|r| r.stats.wait_mean());
            let sd = mean(&|r| r.stats.wait_std());
            let _ = writeln!(
                s,
                "| {exp} | {x} | {} | {wait:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {:.2} | {:.1} | {:.1} | {:.3} |",
                algo.name(),
                if wait > 0.0 { 100.0 * sd / wait } else { 0.0 },
                mean(&|r| r.logical.mean()),
                mean(&|r| r.vn_logical.mean()),
                mean(&|r| r.msgs_per_cs()),
                mean(&|r| r.remote_per_cs()),
                mean(&|r| r.local_per_cs()),
                mean(&|r| r.stats.preemptions as f64),
                mean(&|r| {
                    r.stats
                        .use_rate(r.point.capacities.iter().sum::<u32>() as usize)
                }),
            );
        }
    }
    s
}

pub(super) struct Line {
    label: String,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

pub(super) fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[Line],
) -> Result<(), ChartError> {
    let err = draw_err(path);
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let (xmin, xmax) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (xmin, xmax) = if xmin <= xmax {
        (xmin, xmax)
    } else {
        (0.0, 1.0)
    };
    let pad = ((xmax - xmin) * 0.05).max(0.5);
    let ymax = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(1e-9f64, f64::max)
        * (1.1 + 0.09 * lines.len() as f64);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 17))
        .margin(8)
        .x_label_area_size(34)
        .y_label_area_size(58)
        .build_cartesian_2d((xmin - pad)..(xmax + pad), 0.0..ymax)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| {
            if ymax < 10.0 {
                format!("{y:.1}")
            } else {
                format!("{y:.0}")
            }
        })
        .light_line_style(WHITE)
        .label_style(("sans-serif", 12))
        .draw()
        .map_err(|e| err(&e))?;
    for l in lines {
        let style = l.color.stroke_width(2);
        let pts = l.points.clone();
        if l.dashed {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))
                .map_err(|e| err(&e))?
                .label(l.label.clone())
                .legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (7, 0)], style)
                        + PathElement::new(vec![(11, 0), (18, 0)], style)
                });
        } else {
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(|e| err(&e))?
                .label(l.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        }
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, l.color.filled())))
            .map_err(|e| err(&e))?;
    }
    draw_legend(&mut chart, 12, &err)?;
    Ok(())
}

/// A series of a panel: label suffix, dashed, and the measure.
pub(super) type LineSpec<'a> = (&'a str, bool, &'a dyn Fn(&GridRow) -> f64);

pub(super) fn lines(rows: &[GridRow], experiment: &str, specs: &[LineSpec<'_>]) -> Vec<Line> {
    let mut out = Vec::new();
    for (i, algo) in GridAlgo::ALL.into_iter().enumerate() {
        for &(suffix, dashed, f) in specs {
            let points = series(rows, experiment, algo, f);
            if points.is_empty() {
                continue;
            }
            out.push(Line {
                label: format!("{}{suffix}", algo.name()),
                color: COLORS[i % COLORS.len()],
                dashed,
                points,
            });
        }
    }
    out
}

/// Writes the three charts of the sweep into `dir`: `multi-grid-latency.png` (logical and
/// simulated-wall waiting time vs L, v1 and v2), `multi-grid-messages.png` (remote and local
/// messages per CS vs L) and `multi-grid-scaling.png` (waiting time vs types, processes,
/// clusters). Returns their paths.
pub fn grid_charts(rows: &[GridRow], dir: &Path) -> Result<Vec<std::path::PathBuf>, ChartError> {
    ensure_font()?;
    let wall: &dyn Fn(&GridRow) -> f64 = &|r| r.stats.wait_mean() / 1000.0;
    let logical: &dyn Fn(&GridRow) -> f64 = &|r| r.logical.mean() / 1000.0;
    let remote: &dyn Fn(&GridRow) -> f64 = &|r| r.remote_per_cs();
    let local: &dyn Fn(&GridRow) -> f64 = &|r| r.local_per_cs();
    let mut written = Vec::new();

    let path = dir.join("multi-grid-latency.png");
    {
        let err = draw_err(&path);
        let root = titled_canvas(
            &path,
            (1000, 700),
            &format!(
                "Waiting time vs inter-cluster latency L (48 processes, 3 clusters, local {} ms)",
                rows.first().map_or(1, |r| r.point.local_latency)
            ),
            19,
        )?;
        let cells = root.split_evenly((2, 2));
        let specs = [
            (
                "latency-v1",
                "logical",
                logical,
                "v1 (1 instance/type): logical wait",
            ),
            ("latency-v1", "wall", wall, "v1: simulated-wall wait"),
            (
                "latency-v2",
                "logical",
                logical,
                "v2 (1-10 instances/type): logical wait",
            ),
            ("latency-v2", "wall", wall, "v2: simulated-wall wait"),
        ];
        for (cell, (exp, _, f, title)) in cells.iter().zip(specs) {
            let l = lines(rows, exp, &[("", false, f)]);
            panel(cell, &path, title, "L (ms)", "s per CS", &l)?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    written.push(path);

    let path = dir.join("multi-grid-messages.png");
    {
        let err = draw_err(&path);
        let root = titled_canvas(
            &path,
            (1000, 420),
            "Messages per CS vs L: remote (solid) and local (dashed)",
            19,
        )?;
        let cells = root.split_evenly((1, 2));
        for (cell, (exp, title)) in cells.iter().zip([
            ("latency-v1", "v1 (1 instance/type)"),
            ("latency-v2", "v2 (1-10 instances/type)"),
        ]) {
            let l = lines(
                rows,
                exp,
                &[(" remote", false, remote), (" local", true, local)],
            );
            panel(cell, &path, title, "L (ms)", "messages per CS", &l)?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    written.push(path);

    let path = dir.join("multi-grid-scaling.png");
    {
        let err = draw_err(&path);
        let root = titled_canvas(
            &path,
            (1300, 440),
            &format!(
                "Simulated-wall (solid) and logical (dashed) wait, L = {} ms, 10 instances/type",
                rows.iter()
                    .find(|r| r.point.experiment == "types")
                    .map_or(500, |r| r.point.remote_latency)
            ),
            19,
        )?;
        let cells = root.split_evenly((1, 3));
        for (cell, (exp, title, x)) in cells.iter().zip([
            (
                "types",
                "E5: resource types (48 proc., 3 clusters)",
                "types",
            ),
            ("processes", "E6: processes (3 clusters)", "processes"),
            ("clusters", "E7: clusters (48 processes)", "clusters"),
        ]) {
            let l = lines(rows, exp, &[("", false, wall), (" logical", true, logical)]);
            panel(cell, &path, title, x, "s per CS", &l)?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    written.push(path);
    Ok(written)
}
