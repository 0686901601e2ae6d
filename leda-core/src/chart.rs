//! Offline charts of a run (feature `plot`): queue length and throughput per stage
//! over time, drawn from the statistics JSON-lines file that
//! [`Run::stats_file`](crate::runtime::Run::stats_file) writes (one
//! [`Snapshot`] per line).
//!
//! ```no_run
//! use std::path::Path;
//! leda_core::chart::plot_jsonl(Path::new("stats.jsonl"), Path::new("stats.png"))?;
//! # Ok::<(), leda_core::chart::ChartError>(())
//! ```
//!
//! The PNG has two panels sharing the time axis: queue length (events waiting) on
//! top, throughput (events handled per second) below, one coloured line per stage.
//! Text is drawn with a font compiled into the library (DejaVu Sans Mono, see
//! `assets/DejaVuSansMono.LICENSE`), so rendering needs no system fonts.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;

use crate::stats::Snapshot;

/// The font every chart uses, embedded.
const FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");
/// The family name it is registered under.
const FAMILY: &str = "leda-chart";
/// Image size, pixels.
const SIZE: (u32, u32) = (1200, 800);

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// The input could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The input file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A line is not a statistics snapshot.
    #[error("{path}:{line}: not a statistics snapshot: {source}")]
    Parse {
        /// The input file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The cause.
        source: serde_json::Error,
    },
    /// The input holds no snapshot.
    #[error("{0}: no statistics snapshot to plot")]
    Empty(PathBuf),
    /// Drawing or encoding the image failed.
    #[error("drawing {path}: {reason}")]
    Draw {
        /// The output file.
        path: PathBuf,
        /// What the drawing backend reported.
        reason: String,
    },
}

/// One stage's series: (time, queue length) and (time, throughput).
#[derive(Default)]
struct Series {
    queue: Vec<(f64, f64)>,
    throughput: Vec<(f64, f64)>,
}

/// Picks one of a stage's series.
type Pick = fn(&Series) -> &Vec<(f64, f64)>;

/// Reads the snapshots of a statistics file, in order (blank lines are skipped).
pub fn read_jsonl(input: &Path) -> Result<Vec<Snapshot>, ChartError> {
    let read = |source| ChartError::Read {
        path: input.to_owned(),
        source,
    };
    let file = std::fs::File::open(input).map_err(read)?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(read)?;
        if line.trim().is_empty() {
            continue;
        }
        let snap = serde_json::from_str(&line).map_err(|source| ChartError::Parse {
            path: input.to_owned(),
            line: i + 1,
            source,
        })?;
        out.push(snap);
    }
    Ok(out)
}

/// Renders queue length and throughput per stage over time from the statistics
/// JSON-lines file `input` into the PNG `output`.
pub fn plot_jsonl(input: &Path, output: &Path) -> Result<(), ChartError> {
    let snaps = read_jsonl(input)?;
    if snaps.is_empty() {
        return Err(ChartError::Empty(input.to_owned()));
    }
    plot_snapshots(&snaps, output)
}

/// Renders a sequence of snapshots (as [`plot_jsonl`] does) into the PNG `output`.
pub fn plot_snapshots(snaps: &[Snapshot], output: &Path) -> Result<(), ChartError> {
    let draw = |reason: String| ChartError::Draw {
        path: output.to_owned(),
        reason,
    };
    register_font().map_err(draw)?;
    // Stage order: first appearance.
    let mut order: Vec<String> = Vec::new();
    let mut series: BTreeMap<String, Series> = BTreeMap::new();
    for s in snaps {
        for st in &s.stages {
            let e = series.entry(st.name.clone()).or_insert_with(|| {
                order.push(st.name.clone());
                Series::default()
            });
            e.queue.push((s.time, st.queue_len as f64));
            e.throughput.push((s.time, st.throughput));
        }
    }
    let t0 = snaps.iter().map(|s| s.time).fold(f64::INFINITY, f64::min);
    let t1 = snaps
        .iter()
        .map(|s| s.time)
        .fold(f64::NEG_INFINITY, f64::max);
    let (t0, t1) = if t1 > t0 { (t0, t1) } else { (t0, t0 + 1.0) };
    let top = |f: Pick| {
        let m = series
            .values()
            .flat_map(|s| f(s).iter().map(|p| p.1))
            .fold(0.0, f64::max);
        if m > 0.0 { m * 1.05 } else { 1.0 }
    };
    let q_max = top(|s| &s.queue);
    let t_max = top(|s| &s.throughput);

    let root = BitMapBackend::new(output, SIZE).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| draw(e.to_string());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let panels = root.split_evenly((2, 1));
    let panel_specs: [(&str, &str, f64, Pick); 2] = [
        ("queue length", "events waiting", q_max, |s| &s.queue),
        ("throughput", "events/s", t_max, |s| &s.throughput),
    ];
    for (area, (title, ylabel, ymax, get)) in panels.iter().zip(panel_specs) {
        let mut chart = ChartBuilder::on(area)
            .caption(title, (FAMILY, 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(t0..t1, 0.0..ymax)
            .map_err(|x| e(&x))?;
        let y_fmt = |v: &f64| {
            if ymax >= 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        };
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc(ylabel)
            .y_label_formatter(&y_fmt)
            .label_style((FAMILY, 14))
            .axis_desc_style((FAMILY, 15))
            .draw()
            .map_err(|x| e(&x))?;
        for (i, name) in order.iter().enumerate() {
            let Some(s) = series.get(name) else { continue };
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    get(s).iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|x| e(&x))?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FAMILY, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// Registers the embedded font once for every style the charts use.
fn register_font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            plotters::style::register_font(FAMILY, style, FONT)
                .map_err(|_| "the embedded font is invalid".to_owned())?;
        }
        Ok(())
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::StageSnapshot;

    fn snap(t: f64, q: usize, tp: f64) -> Snapshot {
        Snapshot {
            time: t,
            stages: vec![
                StageSnapshot {
                    name: "a".into(),
                    queue_len: q,
                    throughput: tp,
                    ..Default::default()
                },
                StageSnapshot {
                    name: "b".into(),
                    queue_len: q / 2,
                    throughput: tp * 2.0,
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn draws_a_png_from_a_stats_file() {
        let dir = std::env::temp_dir().join(format!("leda-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("stats.jsonl");
        let lines: Vec<String> = (0..20)
            .map(|i| serde_json::to_string(&snap(i as f64 * 0.5, i * 3, i as f64 * 10.0)).unwrap())
            .collect();
        std::fs::write(&input, lines.join("\n") + "\n\n").unwrap();
        let output = dir.join("stats.png");
        plot_jsonl(&input, &output).unwrap();
        let png = std::fs::read(&output).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height, big-endian.
        let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
        let h = u32::from_be_bytes(png[20..24].try_into().unwrap());
        assert_eq!((w, h), SIZE);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("leda-chart-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("bad.jsonl");
        let good = serde_json::to_string(&snap(0.0, 1, 1.0)).unwrap();
        std::fs::write(&input, format!("{good}\nnot json\n")).unwrap();
        let out = dir.join("x.png");
        let err = plot_jsonl(&input, &out).unwrap_err();
        assert!(matches!(err, ChartError::Parse { line: 2, .. }), "{err}");
        assert!(!out.exists(), "nothing written on bad input");
        std::fs::write(&input, "\n").unwrap();
        assert!(matches!(
            plot_jsonl(&input, &out),
            Err(ChartError::Empty(_))
        ));
        assert!(matches!(
            plot_jsonl(&dir.join("missing.jsonl"), &out),
            Err(ChartError::Read { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
