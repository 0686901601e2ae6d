//! The CEP graph, its partitions (the thesis' scenarios) and how it is run.
//!
//! ```text
//! source1 ─> stamp1 ┐
//! source2 ─> stamp2 ┼─> window ─> copy ─┬─1─> persist
//! source3 ─> stamp3 ┘   (merge)         ├─2─> filter ────┐
//!                         │             └─3─> correlate ─┴─> alarm
//!                         └─late───────────────────────────> alarm
//! ```
//!
//! Each source runs with its `stamp` in its own process (next to "its web server");
//! the windows are cut by event time ([`crate::stages`]), so every scenario gives the
//! same windows and alarms. Scenario 1 puts
//! every processing stage in one more process; scenario 2 moves `correlate` to a
//! process of its own, splitting the processing threads equally. `local` runs the
//! whole graph in one process (tests, and the Lua comparison).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use leda_core::prelude::*;
use leda_net::Launcher;

use crate::stages;

/// Where the stages run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Everything in this process.
    Local,
    /// Sources in three processes, all processing stages in this one.
    One,
    /// As `One`, with `correlate` in a process of its own.
    Two,
}

impl std::str::FromStr for Scenario {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "local" | "0" => Ok(Scenario::Local),
            "1" => Ok(Scenario::One),
            "2" => Ok(Scenario::Two),
            _ => Err(format!("scenario '{s}': expected 1, 2 or local")),
        }
    }
}

/// One run's configuration.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The log files (one source each).
    pub files: Vec<PathBuf>,
    /// Output directory (persisted windows, `alarms.log`).
    pub out: PathBuf,
    /// Window size (entries).
    pub window: usize,
    /// Total processing threads (split equally in scenario 2).
    pub threads: usize,
    /// Instances of persist, filter and correlate.
    pub persist: usize,
    /// See `persist`.
    pub filter: usize,
    /// See `persist`.
    pub correlate: usize,
    /// The partition.
    pub scenario: Scenario,
}

/// The largest window (`--window`): a window is held whole in memory (about 220 bytes
/// a line) and `correlate` compares every pair of its lines, so a window of a million
/// lines is already 10^12 comparisons; beyond it no run ends in useful time.
pub const MAX_WINDOW: usize = 1_000_000;

/// Why a window size is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadWindow {
    /// Not a number.
    #[error("window '{0}': expected a number of lines")]
    NotANumber(String),
    /// Out of `1..=MAX_WINDOW`.
    #[error("window {0}: expected 1 to {MAX_WINDOW} lines")]
    OutOfRange(usize),
}

/// Checks a window size: 1 to [`MAX_WINDOW`] lines.
pub fn check_window(size: usize) -> Result<usize, BadWindow> {
    if (1..=MAX_WINDOW).contains(&size) {
        Ok(size)
    } else {
        Err(BadWindow::OutOfRange(size))
    }
}

/// Parses and checks a window size (`--window`).
pub fn window_size(s: &str) -> Result<usize, BadWindow> {
    let n = s
        .parse::<usize>()
        .map_err(|_| BadWindow::NotANumber(s.to_owned()))?;
    check_window(n)
}

pub use leda_core::stats::StageFailures;

/// A run in which events failed (each was logged as it failed): its outputs are
/// incomplete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} event(s) failed: {} (each logged above)", .0.iter().map(|f| f.count).sum::<u64>(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
pub struct EventsFailed(pub Vec<StageFailures>);

/// Removes an earlier run's outputs from `out` (`alarms.log`, every `persist-*`),
/// creating `out` if needed: every mode counts what is there when it ends.
pub fn clear_outputs(out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("{}", out.display()))?;
    for f in std::fs::read_dir(out).with_context(|| format!("{}", out.display()))? {
        let p = f?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "alarms.log" || name.starts_with("persist-") {
            std::fs::remove_file(&p).with_context(|| format!("{}", p.display()))?;
        }
    }
    Ok(())
}

/// What a run produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Alarms raised by `filter`.
    pub filter_alarms: usize,
    /// Alarms raised by `correlate`.
    pub correlate_alarms: usize,
    /// Windows persisted.
    pub windows: usize,
    /// Entries persisted.
    pub entries: usize,
    /// Lines later than the lateness bound (recorded as `late` alarm lines).
    pub late: usize,
    /// The stages whose handlers failed (`run` and `lua`; empty for the baselines,
    /// which stop at their first error).
    pub failed: Vec<StageFailures>,
}

/// Counts the alarms in `<out>/alarms.log` and the windows persisted in `<out>`.
pub fn outcome(out: &Path) -> anyhow::Result<Outcome> {
    let mut o = Outcome::default();
    let alarms = out.join("alarms.log");
    if alarms.exists() {
        // As bytes: an alarm quotes its log line as it was read.
        for line in BufReader::new(std::fs::File::open(&alarms)?).split(b'\n') {
            let line = line?;
            match line.split(|&c| c == b'\t').next() {
                Some(b"filter") => o.filter_alarms += 1,
                Some(b"correlate") => o.correlate_alarms += 1,
                Some(b"late") => o.late += 1,
                _ => bail!("unexpected alarm line: {}", String::from_utf8_lossy(&line)),
            }
        }
    }
    for w in persisted_windows(out)? {
        o.windows += 1;
        o.entries += w.len();
    }
    Ok(o)
}

/// The windows persisted in `out` (every `persist-*.log`), each as its lines (bytes
/// that are not UTF-8 replaced).
pub fn persisted_windows(out: &Path) -> anyhow::Result<Vec<Vec<String>>> {
    let mut windows = Vec::new();
    for f in std::fs::read_dir(out)? {
        let p = f?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.starts_with("persist-") && name.ends_with(".log")) {
            continue;
        }
        let mut cur = Vec::new();
        for line in BufReader::new(std::fs::File::open(&p)?).split(b'\n') {
            let line = String::from_utf8_lossy(&line?).into_owned();
            if line.is_empty() {
                windows.push(std::mem::take(&mut cur));
            } else {
                cur.push(line);
            }
        }
        if !cur.is_empty() {
            bail!("{}: last window is not terminated", p.display());
        }
    }
    Ok(windows)
}

/// The graph's stages, by role.
pub struct Built {
    /// The graph.
    pub graph: Graph,
    /// The sources, one per file, each with its `stamp`.
    pub sources: Vec<(Stage, Stage)>,
    /// `correlate`.
    pub correlate: Stage,
}

/// Builds the graph for `s` (initial events pushed on the sources).
pub fn build(s: &Setup) -> Built {
    let out = s.out.to_string_lossy().into_owned();
    let window = stages::window(s.window, s.files.len());
    let copy = stages::copy();
    let persist = stages::persist()
        .attr("out", out.as_str())
        .maxpar(s.persist);
    let filter = stages::filter().maxpar(s.filter);
    let correlate = stages::correlate().maxpar(s.correlate);
    let alarm = stages::alarm().attr("out", out.as_str());
    let mut g = Graph::new("cep");
    let mut sources = Vec::new();
    for (i, f) in s.files.iter().enumerate() {
        let src = stages::source(&format!("source{}", i + 1));
        let stamp = stages::stamp(i);
        src.push(f.to_string_lossy().into_owned());
        g.connect(&src, "line", &stamp).local();
        g.connect(&src, "eof", &stamp).local();
        g.connect(&stamp, 1, &window);
        sources.push((src, stamp));
    }
    g.connect(&window, "late", &alarm);
    g.connect(&window, 1, &copy);
    g.connect(&copy, 1, &persist);
    g.connect(&copy, 2, &filter);
    g.connect(&copy, 3, &correlate);
    g.connect(&filter, 1, &alarm);
    g.connect(&correlate, 1, &alarm);
    Built {
        graph: g,
        sources,
        correlate,
    }
}

/// A daemon child process (this binary, `daemon` subcommand); killed and reaped on
/// drop if still running.
pub(crate) struct DaemonChild {
    child: Child,
    pub(crate) addr: String,
}

impl DaemonChild {
    /// Starts `leda-cep <command> --listen 127.0.0.1:0 --threads <threads>` and reads
    /// its `listening ADDR` line. The daemon ends with the thread that starts it,
    /// however that ends ([`leda_net::daemon::end_with_parent`]): a launcher killed
    /// before it deploys leaves none waiting for a deployment for ever.
    pub(crate) fn spawn(command: &str, threads: usize) -> anyhow::Result<DaemonChild> {
        let exe = std::env::current_exe().context("locating this program")?;
        let mut child = leda_net::daemon::end_with_parent(&mut Command::new(exe))
            .args([command, "--listen", "127.0.0.1:0", "--threads"])
            .arg(threads.to_string())
            // A Rust daemon serves one deployment, then exits (the Lua one always does).
            .args((command == "daemon").then_some("--once"))
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .context("starting a daemon")?;
        let mut line = String::new();
        let stdout = child.stdout.take().context("daemon stdout")?;
        BufReader::new(stdout).read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("LISTENING ") else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("daemon did not report its address (got '{}')", line.trim());
        };
        Ok(DaemonChild {
            addr: addr.to_owned(),
            child,
        })
    }
}

impl Drop for DaemonChild {
    fn drop(&mut self) {
        // Daemons exit when the run ends; give them a moment, then make sure.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the CEP graph as `s` says; returns the outcome (with the stages whose
/// handlers failed, on any process) and the wall time.
pub fn run(s: &Setup) -> anyhow::Result<(Outcome, Duration)> {
    check_window(s.window)?;
    clear_outputs(&s.out)?;
    let mut b = build(s);
    let mut failed = Vec::new();
    let start = Instant::now();
    match s.scenario {
        Scenario::Local => {
            let report = b
                .graph
                .run(Run::default().threads(s.threads).until_idle())?;
            failed = report.stats.failures("this process");
        }
        Scenario::One | Scenario::Two => {
            let (mine, theirs) = match s.scenario {
                Scenario::Two => (s.threads.div_ceil(2), Some((s.threads / 2).max(1))),
                _ => (s.threads, None),
            };
            let mut daemons = Vec::new();
            for _ in &b.sources {
                daemons.push(DaemonChild::spawn("daemon", 1)?);
            }
            let corr = match theirs {
                Some(t) => Some(DaemonChild::spawn("daemon", t)?),
                None => None,
            };
            let me = "127.0.0.1:1".to_owned(); // an identity: the launcher does not listen
            let mut clusters = Vec::new();
            let mut procs = Vec::new();
            let mut rest = b.graph.all();
            for ((src, stamp), d) in b.sources.iter().zip(&daemons) {
                let c = Cluster::of([src, stamp]);
                rest = &rest - &c;
                clusters.push(c);
                procs.push(d.addr.clone());
            }
            if let Some(d) = &corr {
                let c = Cluster::of([&b.correlate]);
                rest = &rest - &c;
                clusters.push(c);
                procs.push(d.addr.clone());
            }
            clusters.push(rest);
            procs.push(me.clone());
            b.graph.part(clusters)?.map(procs)?;
            let report = Launcher::new(me)
                .until_idle()
                .run(&b.graph, Run::default().threads(mine))
                .context("running the CEP graph across processes")?;
            for peer in &report.peers {
                failed.extend(peer.snapshot.failures(&peer.name));
            }
            failed.extend(report.run.stats.failures("this process"));
            drop(corr);
            drop(daemons);
        }
    }
    let elapsed = start.elapsed();
    let mut o = outcome(&s.out)?;
    o.failed = failed;
    Ok((o, elapsed))
}
