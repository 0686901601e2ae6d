//! `mutex-exp --sweep-lejeune`: the evaluation setup of Lejeune et al. (spec §7.2) for the
//! incremental algorithm, Bouabdallah–Laforest, Lejeune without and with loan, and the
//! omniscient reference; CSV and PNG charts.
//!
//! ```text
//! cargo run --release -p leda-mutex --bin mutex-exp -- --sweep-lejeune --out docs
//! ```
//!
//! Setup and decisions \[D\]:
//! - N = 32 processes, M = 80 single-instance resources; request size `x` uniform in
//!   `[1, SizeReq]`, resources uniform without replacement (the driver's \[LJ\] generator).
//! - **Time unit:** 1 tick = 0.1 ms. Message latency γ = 0.6 ms = 6 ticks, constant, reliable
//!   FIFO links (\[LJ\]'s network).
//! - **CS time α rising with request size:** `α(x) = 4.6 ms + 0.4 ms · x`, i.e. 5 ms for one
//!   resource up to 36.6 ms for 80: a linear version of \[LJ\]'s "5, 15, 25 or 35 ms depending on
//!   the number of resources requested" (the exact mapping is not given).
//! - **Load:** `ρ = β / (α + γ)` with ρ = 0.1·N/M = 0.04 (high) and 30·N/M = 12 (medium). The
//!   think time β is exponential with mean `ρ · (ᾱ + γ)`, ᾱ the mean CS time under the point's
//!   size distribution (β does not depend on the request just finished).
//! - **Run length:** a fixed number of requests per process (default 40, so 1280 CS per run)
//!   instead of \[LJ\]'s 30 s; use rate = Σ held resource-time / (M · end of run), so the drain at
//!   the end (the last requests) weighs the same for every algorithm.
//! - **Initial tokens:** each algorithm's own documented placement (incremental: `r mod N`;
//!   BL: all free in the control token at process 0; Lejeune: `r mod N`). No warm-up removed.
//! - **Seeds:** `--lejeune-seeds` per point (default 3), seeds `seed..seed+k`; the same seed
//!   gives every algorithm the same workload draw sequence (the draws interleave with message
//!   latencies, so workloads coincide only statistically).
//! - **SizeReq steps:** every value 1..=80 (a run takes well under a second in release;
//!   `--lejeune-sizes` picks a subset).
//!
//! Outputs in `--out`: `multi-lejeune.csv` (one row per run), `multi-lejeune-wait-by-size.csv`
//! (waiting time per request size), `multi-lejeune-use-{high,medium}.png`,
//! `multi-lejeune-wait-{high,medium}.png` (vs SizeReq) and
//! `multi-lejeune-wait-by-size-{high,medium}.png` (per request size at SizeReq = 80).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::chart::{COLORS, ChartError, draw_err, draw_legend, ensure_font};
use crate::error::MutexError;
use crate::sim::{Channels, Latency};

use super::bouabdallah::{BlConfig, BouabdallahLaforest};
use super::checker::MultiVerdict;
use super::incremental::{Incremental, IncrementalConfig};
use super::lejeune::{Lejeune, LjConfig};
use super::model::{MultiSystem, ResourceSpace};
use super::omniscient::Omniscient;
use super::sim::{
    MultiReport, MultiSim, MultiSimConfig, MultiStats, MultiWorkload, WaitAcc, simulate_multi,
};

/// The algorithms of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LjAlgo {
    /// One Naimi–Tréhel per resource, locked in order.
    Incremental,
    /// Bouabdallah–Laforest (control token).
    BouabdallahLaforest,
    /// Lejeune et al. without loan.
    Lejeune,
    /// Lejeune et al. with loan (threshold 1).
    LejeuneLoan,
    /// The omniscient centralised reference (FIFO with backfilling).
    Omniscient,
    /// The omniscient reference in strict FIFO order (no backfilling).
    OmniscientFifo,
}

impl LjAlgo {
    /// Every algorithm, in chart order.
    pub const ALL: [LjAlgo; 6] = [
        LjAlgo::Incremental,
        LjAlgo::BouabdallahLaforest,
        LjAlgo::Lejeune,
        LjAlgo::LejeuneLoan,
        LjAlgo::Omniscient,
        LjAlgo::OmniscientFifo,
    ];

    /// CSV / legend name.
    pub fn name(self) -> &'static str {
        match self {
            LjAlgo::Incremental => "incremental",
            LjAlgo::BouabdallahLaforest => "bouabdallah-laforest",
            LjAlgo::Lejeune => "lejeune",
            LjAlgo::LejeuneLoan => "lejeune-loan",
            LjAlgo::Omniscient => "omniscient",
            LjAlgo::OmniscientFifo => "omniscient-fifo",
        }
    }
}

/// The two loads of \[LJ\].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LjLoad {
    /// ρ = 0.1 · N / M.
    High,
    /// ρ = 30 · N / M.
    Medium,
}

impl LjLoad {
    /// Both loads.
    pub const ALL: [LjLoad; 2] = [LjLoad::High, LjLoad::Medium];

    /// `high` or `medium`.
    pub fn name(self) -> &'static str {
        match self {
            LjLoad::High => "high",
            LjLoad::Medium => "medium",
        }
    }

    /// ρ for `n` processes and `m` resources.
    pub fn rho(self, n: usize, m: usize) -> f64 {
        let f = match self {
            LjLoad::High => 0.1,
            LjLoad::Medium => 30.0,
        };
        f * n as f64 / m as f64
    }
}

/// The sweep's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct LjSweep {
    /// Processes.
    pub n: usize,
    /// Resources.
    pub m: usize,
    /// SizeReq values.
    pub size_reqs: Vec<usize>,
    /// Seeds per point.
    pub seeds: u64,
    /// First seed.
    pub seed: u64,
    /// Requests per process.
    pub requests_per_node: usize,
    /// Message latency (ticks).
    pub latency: u64,
    /// CS time of a request for `x` resources: `cs_base + cs_per_resource · x` (ticks).
    pub cs_base: u64,
    /// See `cs_base`.
    pub cs_per_resource: u64,
    /// Algorithms to run.
    pub algos: Vec<LjAlgo>,
    /// Loads to run.
    pub loads: Vec<LjLoad>,
    /// Measure inside this window of ticks only, the processes requesting until its end (the
    /// spec's fixed-length run), instead of `requests_per_node` requests each.
    pub window: Option<(u64, u64)>,
}

impl Default for LjSweep {
    fn default() -> Self {
        Self {
            n: 32,
            m: 80,
            size_reqs: (1..=80).collect(),
            seeds: 3,
            seed: 1,
            requests_per_node: 40,
            latency: 6,
            cs_base: 46,
            cs_per_resource: 4,
            algos: LjAlgo::ALL.to_vec(),
            loads: LjLoad::ALL.to_vec(),
            window: None,
        }
    }
}

impl LjSweep {
    /// Mean think time β (ticks) at `load` for SizeReq `size_req`.
    pub fn think_mean(&self, load: LjLoad, size_req: usize) -> f64 {
        let mean_x = (1 + size_req.clamp(1, self.m)) as f64 / 2.0;
        let alpha = self.cs_base as f64 + self.cs_per_resource as f64 * mean_x;
        load.rho(self.n, self.m) * (alpha + self.latency as f64)
    }

    /// The simulation configuration of one run.
    pub fn config(
        &self,
        load: LjLoad,
        size_req: usize,
        seed: u64,
    ) -> Result<MultiSimConfig, MutexError> {
        let space = ResourceSpace::single(self.m)?;
        let mut cfg = MultiSimConfig::new(self.n, space, seed);
        cfg.latency = Latency::Constant(self.latency);
        cfg.channels = Channels::Fifo;
        cfg.workload = MultiWorkload {
            requests_per_node: self.requests_per_node,
            size_req,
            cs_duration: Latency::Constant(self.cs_base),
            cs_per_resource: self.cs_per_resource,
            think_time: Latency::Exponential {
                min: 0,
                mean: self.think_mean(load, size_req),
            },
        };
        cfg.max_time = u64::MAX / 4;
        cfg.max_events = 500_000_000;
        if let Some(w) = self.window {
            cfg.window = Some(w);
            cfg.workload.requests_per_node = usize::MAX;
        }
        Ok(cfg)
    }

    /// Runs one point.
    pub fn run_one(
        &self,
        algo: LjAlgo,
        load: LjLoad,
        size_req: usize,
        seed: u64,
    ) -> Result<LjRow, MutexError> {
        let cfg = self.config(load, size_req, seed)?;
        let (n, space) = (cfg.n, cfg.space.clone());
        let (rep, loans) = match algo {
            LjAlgo::Incremental => (
                run(
                    cfg,
                    Incremental::new(n, space, IncrementalConfig::default())?,
                )?,
                0,
            ),
            LjAlgo::BouabdallahLaforest => (
                run(
                    cfg,
                    BouabdallahLaforest::new(n, space, BlConfig::default())?,
                )?,
                0,
            ),
            LjAlgo::Lejeune | LjAlgo::LejeuneLoan => {
                let config = if algo == LjAlgo::LejeuneLoan {
                    LjConfig::with_loan()
                } else {
                    LjConfig::default()
                };
                let mut sim = MultiSim::new(cfg, Lejeune::new(n, space, config)?)?;
                let rep = sim.run();
                (rep, sim.system().loans())
            }
            LjAlgo::Omniscient => (run(cfg, Omniscient::new(n, space)?)?, 0),
            LjAlgo::OmniscientFifo => (run(cfg, Omniscient::strict_fifo(n, space)?)?, 0),
        };
        Ok(LjRow {
            algo,
            load,
            size_req,
            seed,
            n: self.n,
            m: self.m,
            latency: self.latency,
            verdict: rep.verdict,
            stats: rep.stats,
            loans,
        })
    }

    /// Runs every algorithm × load × SizeReq × seed, calling `progress` after each run.
    pub fn run(&self, mut progress: impl FnMut(&LjRow)) -> Result<Vec<LjRow>, MutexError> {
        let mut rows = Vec::new();
        for &load in &self.loads {
            for &size_req in &self.size_reqs {
                for &algo in &self.algos {
                    for s in 0..self.seeds {
                        let row = self.run_one(algo, load, size_req, self.seed + s)?;
                        progress(&row);
                        rows.push(row);
                    }
                }
            }
        }
        Ok(rows)
    }
}

fn run<S: MultiSystem>(cfg: MultiSimConfig, sys: S) -> Result<MultiReport, MutexError> {
    simulate_multi(cfg, sys)
}

/// One measured run.
#[derive(Debug, Clone)]
pub struct LjRow {
    /// Algorithm.
    pub algo: LjAlgo,
    /// Load.
    pub load: LjLoad,
    /// SizeReq.
    pub size_req: usize,
    /// Seed.
    pub seed: u64,
    /// Processes.
    pub n: usize,
    /// Resources.
    pub m: usize,
    /// Message latency (ticks).
    pub latency: u64,
    /// The checker's verdict.
    pub verdict: MultiVerdict,
    /// Measurements.
    pub stats: MultiStats,
    /// Loans granted (Lejeune with loan; 0 otherwise). `stats.preemptions` counts loans plus
    /// the tokens ceded by waiting sites to requests with priority.
    pub loans: u64,
}

/// The CSV header of [`LjRow::csv`]. Times are in ticks (0.1 ms).
pub const CSV_HEADER: &str = "algorithm,nodes,resources,load,size_req,seed,cs,use_rate,wait_mean,wait_std,msgs_per_cs,msgs_remote,msgs_local,preemptions,loans,end_time,latency_mean,verdict,by_type";

/// The CSV header of [`wait_by_size_csv`] (`seeds`: runs pooled).
pub const WAIT_BY_SIZE_HEADER: &str =
    "algorithm,nodes,resources,load,size_req,seeds,size,count,wait_mean,wait_std";

fn verdict_name(v: &MultiVerdict) -> &'static str {
    match v {
        MultiVerdict::Ok => "ok",
        MultiVerdict::Violation(_) => "violation",
        MultiVerdict::Deadlock { .. } => "deadlock",
        MultiVerdict::Stall { .. } => "stall",
        MultiVerdict::NodeError { .. } => "node-error",
    }
}

impl LjRow {
    /// Messages per CS (0 without grants).
    pub fn msgs_per_cs(&self) -> f64 {
        if self.stats.grants == 0 {
            0.0
        } else {
            self.stats.messages as f64 / self.stats.grants as f64
        }
    }

    /// The use rate.
    pub fn use_rate(&self) -> f64 {
        self.stats.use_rate(self.m)
    }

    /// The row as CSV ([`CSV_HEADER`]).
    pub fn csv(&self) -> String {
        let s = &self.stats;
        let counted = s.grants.max(1) as f64;
        let mut types = String::new();
        for (k, v) in &s.messages_by_kind {
            let _ = write!(
                types,
                "{}{k}={:.3}",
                if types.is_empty() { "" } else { ";" },
                *v as f64 / counted
            );
        }
        format!(
            "{},{},{},{},{},{},{},{:.4},{:.3},{:.3},{:.3},{},{},{},{},{},{:.3},{},{}",
            self.algo.name(),
            self.n,
            self.m,
            self.load.name(),
            self.size_req,
            self.seed,
            s.grants,
            self.use_rate(),
            s.wait_mean(),
            s.wait_std(),
            self.msgs_per_cs(),
            s.messages_remote,
            s.messages_local,
            s.preemptions,
            self.loans,
            s.end_time,
            self.latency as f64,
            verdict_name(&self.verdict),
            types
        )
    }
}

/// The SizeReq values whose waiting time per request size goes to the CSV: \[LJ\]'s 4 and 80,
/// and 20, 40, 60 (all swept values if none of these was swept).
pub const BY_SIZE_REQS: [usize; 5] = [4, 20, 40, 60, 80];

/// (load, algorithm, SizeReq, size) -> (runs, pooled waits, a run for the labels).
type Pooled<'a> =
    std::collections::BTreeMap<(usize, usize, usize, usize), (u64, WaitAcc, &'a LjRow)>;

/// Waiting time per request size, pooled over seeds, one line per (algorithm, load, SizeReq,
/// size) for the SizeReq values of [`BY_SIZE_REQS`] ([`WAIT_BY_SIZE_HEADER`]).
pub fn wait_by_size_csv(rows: &[LjRow]) -> String {
    let mut pooled: Pooled<'_> = Default::default();
    let any = rows.iter().any(|r| BY_SIZE_REQS.contains(&r.size_req));
    for r in rows {
        if any && !BY_SIZE_REQS.contains(&r.size_req) {
            continue;
        }
        let algo = LjAlgo::ALL.iter().position(|&a| a == r.algo).unwrap_or(0);
        let load = LjLoad::ALL.iter().position(|&l| l == r.load).unwrap_or(0);
        for (&size, w) in &r.stats.wait_by_size {
            let e =
                pooled
                    .entry((load, algo, r.size_req, size))
                    .or_insert((0, WaitAcc::default(), r));
            e.0 += 1;
            e.1.count += w.count;
            e.1.sum += w.sum;
            e.1.sum_sq += w.sum_sq;
        }
    }
    let mut csv = String::from(WAIT_BY_SIZE_HEADER);
    csv.push('\n');
    for ((_, _, size_req, size), (seeds, w, r)) in pooled {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{:.3},{:.3}",
            r.algo.name(),
            r.n,
            r.m,
            r.load.name(),
            size_req,
            seeds,
            size,
            w.count,
            w.mean(),
            w.std()
        );
    }
    csv
}

/// Why the sweep failed.
#[derive(Debug, thiserror::Error)]
pub enum LjSweepError {
    /// A run could not be set up.
    #[error(transparent)]
    Mutex(#[from] MutexError),
    /// Writing an output failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A chart could not be drawn.
    #[error(transparent)]
    Chart(#[from] ChartError),
    /// Some runs did not pass the checker.
    #[error("{0} runs of the Lejeune sweep did not pass the checker (see the verdict column)")]
    Failed(usize),
}

/// The options of `mutex-exp` for this sweep (flattened into its arguments).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LejeuneArgs {
    /// Run the Lejeune et al. sweep (spec §7.2: N = 32, M = 80, SizeReq 1..80, high and medium
    /// load) for incremental, Bouabdallah–Laforest, Lejeune without and with loan and the
    /// omniscient reference; write `multi-lejeune*.csv` and `multi-lejeune-*.png` to --out.
    #[arg(long)]
    pub sweep_lejeune: bool,
    /// Seeds per point of --sweep-lejeune.
    #[arg(long, default_value_t = 3)]
    pub lejeune_seeds: u64,
    /// Requests per process in each run of --sweep-lejeune.
    #[arg(long, default_value_t = 40)]
    pub lejeune_requests: usize,
    /// SizeReq values of --sweep-lejeune, comma-separated (default: every value 1..=80).
    #[arg(long, value_delimiter = ',')]
    pub lejeune_sizes: Vec<usize>,
    /// Measure a fixed window of this many milliseconds (after --lejeune-warmup-ms), the
    /// processes requesting until its end, as the spec's 30 s runs do, instead of
    /// --lejeune-requests requests per process (whose start-up and drain then weigh in).
    #[arg(long, value_name = "MS")]
    pub lejeune_window_ms: Option<u64>,
    /// Warm-up before the measured window of --lejeune-window-ms, milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub lejeune_warmup_ms: u64,
}

/// Runs the sweep of `args` and writes its CSVs and charts to `out`; returns the rows.
/// Progress goes to stderr through `progress`.
pub fn run_lejeune_sweep(
    out: &Path,
    seed: u64,
    args: &LejeuneArgs,
    mut progress: impl FnMut(&LjRow),
) -> Result<Vec<LjRow>, LjSweepError> {
    let mut sweep = LjSweep {
        seed,
        seeds: args.lejeune_seeds.max(1),
        requests_per_node: args.lejeune_requests.max(1),
        // Ticks of 0.1 ms.
        window: args.lejeune_window_ms.map(|w| {
            let start = args.lejeune_warmup_ms * 10;
            (start, start + w.max(1) * 10)
        }),
        ..LjSweep::default()
    };
    if !args.lejeune_sizes.is_empty() {
        if let Some(bad) = args.lejeune_sizes.iter().find(|&&s| s == 0 || s > sweep.m) {
            return Err(
                MutexError::Config(format!("SizeReq {bad} is outside [1, {}]", sweep.m)).into(),
            );
        }
        sweep.size_reqs = args.lejeune_sizes.clone();
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LjSweepError::Io { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    let rows = sweep.run(&mut progress)?;
    let csv_path = out.join("multi-lejeune.csv");
    let mut csv = String::from(CSV_HEADER);
    csv.push('\n');
    let by_size_path = out.join("multi-lejeune-wait-by-size.csv");
    let by_size = wait_by_size_csv(&rows);
    for r in &rows {
        csv.push_str(&r.csv());
        csv.push('\n');
    }
    std::fs::write(&csv_path, csv).map_err(io(&csv_path))?;
    std::fs::write(&by_size_path, by_size).map_err(io(&by_size_path))?;
    for load in LjLoad::ALL {
        let l = load.name();
        let use_series = series(&rows, load, LjRow::use_rate);
        line_chart(
            &out.join(format!("multi-lejeune-use-{l}.png")),
            &format!("Use rate vs SizeReq, {l} load (N = 32, M = 80)"),
            "SizeReq",
            "use rate",
            &use_series,
            false,
        )?;
        let wait_series = series(&rows, load, |r| r.stats.wait_mean() / 10.0);
        line_chart(
            &out.join(format!("multi-lejeune-wait-{l}.png")),
            &format!("Mean waiting time vs SizeReq, {l} load (ms, log scale)"),
            "SizeReq",
            "ms",
            &wait_series,
            true,
        )?;
        let max = sweep.size_reqs.iter().copied().max().unwrap_or(sweep.m);
        let by_size_series = wait_by_size_series(&rows, load, max);
        line_chart(
            &out.join(format!("multi-lejeune-wait-by-size-{l}.png")),
            &format!("Mean waiting time per request size, SizeReq = {max}, {l} load (ms, log)"),
            "request size",
            "ms",
            &by_size_series,
            true,
        )?;
    }
    let failed = rows
        .iter()
        .filter(|r| r.verdict != MultiVerdict::Ok)
        .count();
    if failed > 0 {
        return Err(LjSweepError::Failed(failed));
    }
    Ok(rows)
}

type Series = Vec<(&'static str, Vec<(f64, f64)>)>;

/// Per algorithm: mean over seeds of `f` for each SizeReq, at `load`.
fn series(rows: &[LjRow], load: LjLoad, f: impl Fn(&LjRow) -> f64) -> Series {
    LjAlgo::ALL
        .iter()
        .map(|&algo| {
            let mut sizes: Vec<usize> = rows
                .iter()
                .filter(|r| r.algo == algo && r.load == load)
                .map(|r| r.size_req)
                .collect();
            sizes.sort_unstable();
            sizes.dedup();
            let points = sizes
                .into_iter()
                .map(|s| {
                    let vals: Vec<f64> = rows
                        .iter()
                        .filter(|r| r.algo == algo && r.load == load && r.size_req == s)
                        .map(&f)
                        .collect();
                    (
                        s as f64,
                        vals.iter().sum::<f64>() / vals.len().max(1) as f64,
                    )
                })
                .collect();
            (algo.name(), points)
        })
        .filter(|(_, p): &(_, Vec<_>)| !p.is_empty())
        .collect()
}

/// Per algorithm: mean waiting time (ms) per request size at SizeReq `size_req`, at `load`,
/// sizes pooled over seeds in bins of 5.
fn wait_by_size_series(rows: &[LjRow], load: LjLoad, size_req: usize) -> Series {
    LjAlgo::ALL
        .iter()
        .map(|&algo| {
            let mut bins: std::collections::BTreeMap<usize, (u64, u64)> = Default::default();
            for r in rows
                .iter()
                .filter(|r| r.algo == algo && r.load == load && r.size_req == size_req)
            {
                for (&size, w) in &r.stats.wait_by_size {
                    let b = bins.entry(size.div_ceil(5)).or_default();
                    b.0 += w.count;
                    b.1 += w.sum;
                }
            }
            let points = bins
                .into_iter()
                .filter(|(_, (c, _))| *c > 0)
                .map(|(b, (c, s))| ((b * 5) as f64 - 2.0, s as f64 / c as f64 / 10.0))
                .collect();
            (algo.name(), points)
        })
        .filter(|(_, p): &(_, Vec<_>)| !p.is_empty())
        .collect()
}

fn line_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &Series,
    log_y: bool,
) -> Result<(), ChartError> {
    ensure_font()?;
    let err = draw_err(path);
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let ys = || series.iter().flat_map(|(_, s)| s.iter().map(|p| p.1));
    let xmax = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root);
    chart
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64);
    macro_rules! finish {
        ($chart:expr) => {{
            let mut c = $chart;
            c.configure_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| {
                    if *y >= 10.0 || (log_y && *y >= 1.0) {
                        format!("{y:.0}")
                    } else if log_y {
                        format!("{y:.1}")
                    } else {
                        format!("{y:.2}")
                    }
                })
                .label_style(("sans-serif", 13))
                .light_line_style(WHITE)
                .draw()
                .map_err(|e| err(&e))?;
            for (i, (name, s)) in series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()].to_rgba();
                let pts: Vec<(f64, f64)> =
                    s.iter().copied().filter(|p| !log_y || p.1 > 0.0).collect();
                c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(*name)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                c.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| err(&e))?;
            }
            draw_legend(&mut c, 13, &err)?;
        }};
    }
    if log_y {
        let ymax = ys().fold(1.0f64, f64::max) * 1.5;
        let ymin = ys().filter(|&y| y > 0.0).fold(ymax, f64::min).max(0.01) / 1.5;
        finish!(
            chart
                .build_cartesian_2d(0.0..xmax * 1.02, (ymin..ymax).log_scale())
                .map_err(|e| err(&e))?
        );
    } else {
        let ymax = ys().fold(0.0f64, f64::max).max(0.01) * 1.1;
        finish!(
            chart
                .build_cartesian_2d(0.0..xmax * 1.02, 0.0..ymax)
                .map_err(|e| err(&e))?
        );
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_follow_the_spec_formulas() {
        assert!((LjLoad::High.rho(32, 80) - 0.04).abs() < 1e-12);
        assert!((LjLoad::Medium.rho(32, 80) - 12.0).abs() < 1e-12);
        let s = LjSweep::default();
        // SizeReq 1: α = 5 ms = 50 ticks, γ = 6 ticks: β = 0.04 · 56 and 12 · 56.
        assert!((s.think_mean(LjLoad::High, 1) - 2.24).abs() < 1e-9);
        assert!((s.think_mean(LjLoad::Medium, 1) - 672.0).abs() < 1e-9);
    }

    #[test]
    fn a_small_sweep_runs_every_algorithm_and_rows_have_every_column() {
        let sweep = LjSweep {
            n: 6,
            m: 10,
            size_reqs: vec![1, 5],
            seeds: 1,
            requests_per_node: 3,
            ..LjSweep::default()
        };
        let rows = sweep.run(|_| {}).expect("sweep");
        assert_eq!(rows.len(), LjAlgo::ALL.len() * 2 * 2);
        for r in &rows {
            assert_eq!(r.verdict, MultiVerdict::Ok, "{}", r.csv());
            assert_eq!(r.stats.grants, 18);
            let line = r.csv();
            assert_eq!(
                line.split(',').count(),
                CSV_HEADER.split(',').count(),
                "{line}"
            );
            assert!(r.use_rate() > 0.0 && r.use_rate() <= 1.0, "{line}");
        }
        let by_size = wait_by_size_csv(&rows);
        let lines: Vec<&str> = by_size.lines().collect();
        assert_eq!(lines[0], WAIT_BY_SIZE_HEADER);
        assert!(lines.len() > 1 + 5 * 2, "{by_size}");
        for l in &lines[1..] {
            assert_eq!(
                l.split(',').count(),
                WAIT_BY_SIZE_HEADER.split(',').count(),
                "{l}"
            );
        }
        let omni = rows
            .iter()
            .find(|r| r.algo == LjAlgo::Omniscient)
            .expect("row");
        assert_eq!(omni.stats.messages, 0);
    }

    /// The spec's fixed-length run: processes request until the window's end, the use rate
    /// is over the window alone, only requests issued inside it count for the waits, and
    /// requests never issued after it are not a deadlock.
    #[test]
    fn a_windowed_run_measures_the_window_only() {
        let sweep = LjSweep {
            n: 6,
            m: 10,
            size_reqs: vec![3],
            seeds: 1,
            window: Some((500, 5_500)),
            ..LjSweep::default()
        };
        let rows = sweep.run(|_| {}).expect("sweep");
        for r in &rows {
            assert_eq!(r.verdict, MultiVerdict::Ok, "{}", r.csv());
            assert_eq!(r.stats.measured_time, 5_000, "{}", r.csv());
            assert!(r.stats.end_time >= 5_500, "{}", r.csv());
            assert!(
                r.stats.waits > 0 && r.stats.waits <= r.stats.grants,
                "{}",
                r.csv()
            );
            let busy_max = 10 * 5_000;
            assert!(r.stats.busy_instance_time <= busy_max, "{}", r.csv());
            assert!(r.use_rate() > 0.0 && r.use_rate() <= 1.0, "{}", r.csv());
        }
        // At high load requests start before the window: their waits are left out.
        let high = rows
            .iter()
            .find(|r| r.load == LjLoad::High)
            .expect("a high-load row");
        assert!(high.stats.waits < high.stats.grants, "{}", high.csv());
    }
}
