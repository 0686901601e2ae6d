//! PNG charts of the quorum sweep ([`crate::quorum_exp`]), drawn with plotters like
//! [`crate::chart`]:
//!
//! - [`msgs_chart`]: messages per CS (x̄, with ±σ bars, σ as [`Cell::sigma`]) against N, one panel per failure
//!   scenario, one line per generator;
//! - [`types_chart`]: messages per CS by message type against N, one panel per generator ×
//!   failure scenario.
//!
//! Both use log scales (VCube quorums grow as N/2 + 1, tree quorums as log N).

use std::path::Path;

use plotters::prelude::*;

use crate::chart::{COLORS, ChartError, draw_err, draw_legend, ensure_font, titled_canvas};
use crate::experiment::Requesters;
use crate::ft_quorum::Generator;
use crate::quorum_exp::{Cell, Failures, MESSAGE_TYPES};

/// The x axis is log₂ N on a linear scale, so that every group size of the sweep gets a tick.
fn x_range(cells: &[Cell]) -> std::ops::Range<f64> {
    let lo = cells.iter().map(|c| c.nodes).min().unwrap_or(8).max(1) as f64;
    let hi = cells.iter().map(|c| c.nodes).max().unwrap_or(512).max(1) as f64;
    (lo.log2() - 0.2)..(hi.log2() + 0.2)
}

/// Position of group size `n` on the x axis.
fn x_of(n: usize) -> f64 {
    (n.max(1) as f64).log2()
}

/// Label of an x position: the group size `2^x`, at integer positions only.
fn x_label(x: &f64) -> String {
    if (x - x.round()).abs() < 1e-6 && *x >= 0.0 {
        format!("{:.0}", 2f64.powf(x.round()))
    } else {
        String::new()
    }
}

fn y_range<'a>(values: impl Iterator<Item = &'a f64>) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (f64::MAX, 1.0f64);
    for &v in values {
        if v > 0.0 {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    if lo > hi {
        lo = 1.0;
    }
    (lo / 1.6).max(0.01)..(hi * 1.6)
}

fn title(failures: Failures) -> String {
    match failures {
        Failures::Half => "N/2 crashes".to_owned(),
        Failures::Count(1) => "1 crash".to_owned(),
        Failures::Count(k) => format!("{k} crashes"),
    }
}

/// Messages per CS against N: one panel per failure scenario, one line per generator, bars of
/// ±σ (clipped at the bottom of the log axis). Cells without a quorum-forming run are skipped.
pub fn msgs_chart(cells: &[Cell], requesters: Requesters, path: &Path) -> Result<(), ChartError> {
    ensure_font()?;
    let err = draw_err(path);
    let root = titled_canvas(
        path,
        (1000, 700),
        &format!(
            "Quorum protocol: messages per CS (mean ± std; dashed: the spec's seven types only) vs N, requesters = {}",
            requesters.name()
        ),
        20,
    )?;
    let mine: Vec<&Cell> = cells
        .iter()
        .filter(|c| c.requesters == requesters)
        .collect();
    let ys = y_range(mine.iter().filter_map(|c| c.mean.as_ref()));
    let xs = x_range(cells);
    for (panel, failures) in root.split_evenly((2, 2)).iter().zip(Failures::SWEEP) {
        let mut chart = ChartBuilder::on(panel)
            .caption(title(failures), ("sans-serif", 15))
            .margin(6)
            .x_label_area_size(28)
            .y_label_area_size(48)
            .build_cartesian_2d(xs.clone(), ys.clone().log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .max_light_lines(0)
            .disable_x_mesh()
            .bold_line_style(BLACK.mix(0.12))
            .x_desc("N")
            .x_labels(((xs.end - xs.start).ceil() as usize + 1).max(2))
            .x_label_formatter(&x_label)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style(("sans-serif", 11))
            .draw()
            .map_err(|e| err(&e))?;
        for (gi, g) in Generator::ALL.into_iter().enumerate() {
            let color = COLORS[gi % COLORS.len()].to_rgba();
            let pts: Vec<(f64, f64, f64)> = mine
                .iter()
                .filter(|c| c.generator == g && c.failures == failures)
                .filter_map(|c| Some((x_of(c.nodes), c.mean?, c.sigma().unwrap_or(0.0))))
                .collect();
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|p| (p.0, p.1)),
                    color.stroke_width(2),
                ))
                .map_err(|e| err(&e))?
                .label(g.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    pts.iter()
                        .map(|&(x, m, _)| Circle::new((x, m), 3, color.filled())),
                )
                .map_err(|e| err(&e))?;
            // The spec's seven message types, without crash settlement's.
            let own: Vec<(f64, f64)> = mine
                .iter()
                .filter(|c| c.generator == g && c.failures == failures)
                .filter_map(|c| Some((x_of(c.nodes), c.mean_without_settlement()?)))
                .filter(|p| p.1 > 0.0)
                .collect();
            if failures != Failures::Count(0) {
                chart
                    .draw_series(DashedLineSeries::new(own, 6, 4, color.stroke_width(2)))
                    .map_err(|e| err(&e))?;
            }
            chart
                .draw_series(pts.iter().map(|&(x, m, sd)| {
                    let lo = (m - sd).max(ys.start);
                    let hi = (m + sd).min(ys.end);
                    PathElement::new(vec![(x, lo), (x, hi)], color.stroke_width(1))
                }))
                .map_err(|e| err(&e))?;
        }
        draw_legend(&mut chart, 12, &err)?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Messages per CS by message type against N: rows of panels per generator, columns per
/// failure scenario, one line per message type (types never sent are left out).
pub fn types_chart(cells: &[Cell], requesters: Requesters, path: &Path) -> Result<(), ChartError> {
    ensure_font()?;
    let err = draw_err(path);
    let root = titled_canvas(
        path,
        (1280, 860),
        &format!(
            "Quorum protocol: messages per CS by type vs N, requesters = {}",
            requesters.name()
        ),
        20,
    )?;
    let mine: Vec<&Cell> = cells
        .iter()
        .filter(|c| c.requesters == requesters)
        .collect();
    let ys = y_range(mine.iter().flat_map(|c| c.by_type.values()));
    let xs = x_range(cells);
    let panels = root.split_evenly((Generator::ALL.len(), Failures::SWEEP.len()));
    let combos = Generator::ALL
        .into_iter()
        .flat_map(|g| Failures::SWEEP.into_iter().map(move |f| (g, f)));
    for (k, (panel, (g, failures))) in panels.iter().zip(combos).enumerate() {
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{}, {}", g.name(), title(failures)),
                ("sans-serif", 14),
            )
            .margin(5)
            .x_label_area_size(24)
            .y_label_area_size(44)
            .build_cartesian_2d(xs.clone(), ys.clone().log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .max_light_lines(0)
            .disable_x_mesh()
            .bold_line_style(BLACK.mix(0.12))
            .x_labels(((xs.end - xs.start).ceil() as usize + 1).max(2))
            .x_label_formatter(&x_label)
            .y_label_formatter(&|y| {
                if *y >= 1.0 {
                    format!("{y:.0}")
                } else {
                    format!("{y:.2}")
                }
            })
            .label_style(("sans-serif", 10))
            .draw()
            .map_err(|e| err(&e))?;
        for (ti, t) in MESSAGE_TYPES.into_iter().enumerate() {
            let color = COLORS[ti % COLORS.len()].to_rgba();
            let pts: Vec<(f64, f64)> = mine
                .iter()
                .filter(|c| c.generator == g && c.failures == failures)
                .filter_map(|c| {
                    let v = c.by_type.get(t).copied()?;
                    (v > 0.0).then_some((x_of(c.nodes), v))
                })
                .collect();
            let series = chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(|e| err(&e))?;
            if k == 0 {
                series.label(t).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            }
        }
        if k == 0 {
            draw_legend(&mut chart, 10, &err)?;
        }
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
