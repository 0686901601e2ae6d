//! PNG charts of a sweep (plotters): messages per CS against N, one panel per algorithm with
//! the spec's analytic value as a dashed line beside the measured series; and the mean waiting
//! time against N, all algorithms on one chart.
//!
//! Text needs a TrueType font; the first of a few usual system paths (DejaVu, Liberation) is
//! used, or the file named by `LEDA_CHART_FONT`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;

use crate::algorithm::Algorithm;
use crate::experiment::{Requesters, Row, SWEEP_NODES};

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// No usable font was found.
    #[error("no TrueType font found (set LEDA_CHART_FONT to a .ttf file)")]
    NoFont,
    /// Plotters failed.
    #[error("drawing {path}: {detail}")]
    Draw {
        /// The chart's file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
}

const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Eleven distinguishable colours (Tableau 10 and black: one per quorum message type).
pub(crate) const COLORS: [RGBColor; 11] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
];

pub(crate) fn ensure_font() -> Result<(), ChartError> {
    static FONT: OnceLock<bool> = OnceLock::new();
    let ok = *FONT.get_or_init(|| {
        let candidates = std::env::var("LEDA_CHART_FONT")
            .ok()
            .into_iter()
            .chain(FONT_PATHS.iter().map(|s| s.to_string()));
        for path in candidates {
            if let Ok(bytes) = std::fs::read(&path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    });
    if ok { Ok(()) } else { Err(ChartError::NoFont) }
}

pub(crate) fn draw_err(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> ChartError + '_ {
    move |e| ChartError::Draw {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

/// A white canvas of `size` pixels drawn to the PNG at `path`, with `title` on top at
/// `font_pt` points: the area under the title.
pub(crate) fn titled_canvas<'a>(
    path: &'a Path,
    size: (u32, u32),
    title: &str,
    font_pt: u32,
) -> Result<DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>, ChartError> {
    let err = draw_err(path);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    root.titled(title, ("sans-serif", font_pt))
        .map_err(|e| err(&e))
}

/// Draws `chart`'s legend in the style every sweep chart uses (upper left, on a translucent
/// white box with a black border), labels at `font_size` points.
pub(crate) fn draw_legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    font_size: u32,
    err: &dyn Fn(&dyn std::fmt::Display) -> ChartError,
) -> Result<(), ChartError>
where
    DB: DrawingBackend + 'a,
    CT: plotters::coord::CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", font_size))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(&e))
}

/// Mean over seeds of `f` for each N of the sweep, for one algorithm and requesters kind.
fn series(
    rows: &[Row],
    algorithm: Algorithm,
    requesters: Requesters,
    f: impl Fn(&Row) -> Option<f64>,
) -> Vec<(f64, f64)> {
    SWEEP_NODES
        .iter()
        .filter_map(|&n| {
            let vals: Vec<f64> = rows
                .iter()
                .filter(|r| {
                    r.exp.algorithm == algorithm
                        && r.exp.requesters == requesters
                        && r.exp.nodes == n
                })
                .filter_map(&f)
                .collect();
            (!vals.is_empty()).then(|| (n as f64, vals.iter().sum::<f64>() / vals.len() as f64))
        })
        .collect()
}

/// Messages per CS against N: one panel per algorithm, measured (blue, dots) and theory (red,
/// dashed).
pub fn msgs_per_cs_chart(
    rows: &[Row],
    requesters: Requesters,
    path: &Path,
) -> Result<(), ChartError> {
    ensure_font()?;
    let err = draw_err(path);
    let title = format!(
        "Messages per CS vs N, requesters = {} (blue: measured, red dashed: theory)",
        requesters.name()
    );
    let root = titled_canvas(path, (1600, 720), &title, 22)?;
    let algorithms: Vec<Algorithm> = Algorithm::correct().collect();
    let panels = root.split_evenly((2, algorithms.len().div_ceil(2)));
    let xs = (SWEEP_NODES[0] as f64)..(SWEEP_NODES[SWEEP_NODES.len() - 1] as f64 * 1.05);
    for (panel, &algorithm) in panels.iter().zip(&algorithms) {
        let measured = series(rows, algorithm, requesters, Row::msgs_per_cs);
        let theory = series(rows, algorithm, requesters, Row::theory);
        let ymax = measured
            .iter()
            .chain(&theory)
            .map(|p| p.1)
            .fold(1.0f64, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(panel)
            .caption(algorithm.name(), ("sans-serif", 16))
            .margin(6)
            .x_label_area_size(28)
            .y_label_area_size(48)
            .build_cartesian_2d(xs.clone().log_scale(), 0.0..ymax)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("N")
            .x_labels(6)
            .y_labels(6)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.1}"))
            .label_style(("sans-serif", 11))
            .draw()
            .map_err(|e| err(&e))?;
        chart
            .draw_series(DashedLineSeries::new(
                theory.iter().copied(),
                6,
                4,
                RED.stroke_width(2),
            ))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(LineSeries::new(
                measured.iter().copied(),
                BLUE.stroke_width(2),
            ))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(measured.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Mean waiting time (request to grant, ticks) against N, every algorithm, log scales.
pub fn wait_chart(rows: &[Row], requesters: Requesters, path: &Path) -> Result<(), ChartError> {
    ensure_font()?;
    let err = draw_err(path);
    let root = BitMapBackend::new(path, (1200, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let all: Vec<(Algorithm, Vec<(f64, f64)>)> = Algorithm::correct()
        .map(|a| (a, series(rows, a, requesters, Row::wait_mean)))
        .collect();
    let ymax = all
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.1))
        .fold(10.0f64, f64::max)
        * 1.5;
    let ymin = all
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.1))
        .filter(|&y| y > 0.0)
        .fold(ymax, f64::min)
        .max(0.1)
        / 1.5;
    let xs = (SWEEP_NODES[0] as f64)..(SWEEP_NODES[SWEEP_NODES.len() - 1] as f64 * 1.05);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Mean waiting time (request to grant, ticks) vs N, requesters = {}",
                requesters.name()
            ),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(xs.log_scale(), (ymin..ymax).log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("N")
        .y_desc("ticks")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (algorithm, s)) in all.iter().enumerate() {
        let color = COLORS[i % COLORS.len()].to_rgba();
        chart
            .draw_series(LineSeries::new(
                s.iter().copied().filter(|p| p.1 > 0.0),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(algorithm.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    draw_legend(&mut chart, 13, &err)?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
