//! The grid evaluation (`mutex-exp --sweep-grid`, spec §7.1, issue #10 item 5): the grid-aware
//! algorithm against Bouabdallah–Laforest on processes grouped in clusters, with a **logical**
//! (latency-weighted causal) and a **simulated-wall** waiting time, remote and local message
//! counts and preemptions; CSV rows and PNG charts.
//!
//! # Logical clock ([`LogicalClock`], spec §6)
//! Measurement only: a wrapper around any [`MultiSystem`] that piggybacks a stamp on every
//! message and never changes what the algorithm does. Process `q`'s **logical waiting time** for
//! a request is the weight of the **longest causal chain of messages from its request to its
//! grant**, each message weighing its link's nominal latency (`x_local` inside a cluster,
//! `x_remote` between clusters); CS and think times count 0, as in \[VN\]'s logical-clock runs.
//! Each process keeps, per origin `q`, `(epoch, distance)`: the request number of `q` it knows
//! of and the longest weighted chain from that request to here; a request starts a new epoch at
//! distance 0 (the reset "at each new request" of §6), a receipt over a link of weight `x`
//! takes `max(own, stamp + x)` per origin (newer epochs win), a grant reads the process's own
//! entry. Decisions \[D\]: `x_local` = 1 (the local latency of the setup, not 0) and
//! `x_remote` = L; every message kind counts (request forwarding is part of the wait; \[VN\]
//! follows only CT and ACK messages, arguing CT requests follow the same path), and a single
//! chain replaces \[VN\]'s two vectors (CT wait + token wait) so both algorithms are measured the
//! same way.
//!
//! The wrapper also computes \[VN\]'s **literal** Alg. 15 ([`LogicalClock::vn_waits`], CSV column
//! `vn_logical_wait_mean`): two n-entry vectors per process, one riding on control-token
//! messages and one on ACK messages ([`vn_channel`] classifies by message kind); sending adds the
//! link weight to every entry of the sender's vector (R.2); receiving a CT sets the CT wait to
//! the received entry of the receiver, an ACK raises the token wait to it, both merge by maximum
//! and zero the receiver's own entry (R.1). Wait = CT wait + token wait; \[D\] both accumulators
//! reset at each request (a request served without the CT has CT wait 0). It measures the CT's
//! travel since the receiver last held it, which is not bounded by the request's own wait.
//!
//! # Setup (decisions \[D\] for what §7.1 leaves open)
//! - Latency: local 1 ms, inter-cluster L ∈ {1, 250, 500, 750} ms (constant), FIFO links.
//! - α = β = 500 ms (CS and think time, constant); 10 CS per process; 10 seeds per point.
//! - Requests: a random subset of 1 to `min(3, types)` types, uniformly; for a type with `k`
//!   instances the count is uniform in `[1, k]` (the driver's generator). In E1–E4 each process
//!   repeats its first request in all its CSs (the same resources every time, differing between
//!   processes, as in \[VN\]'s logical-clock runs; the physical runs E2/E4 share the parameters);
//!   in E5–E7 every request is drawn afresh ("random subset per request").
//! - E1/E3 (`latency-v1`, `latency-v2`): 48 processes in 3 clusters of 16, 10 types; v1 one
//!   instance each; v2 "up to 10 copies": type `r` has `1 + (3r mod 10)` instances (each of
//!   1..10 once). E5 (`types`): 1, 5, 10, 20 types × 10 instances. E6 (`processes`): 12, 24, 48,
//!   60 processes in 3 clusters. E7 (`clusters`): 1, 3, 6, 12 clusters of 48 processes.
//!   E5–E7: 10 types × 10 instances where not varied, L = 500 ms.
//! - `MAX_PREEMPT` = half the processes per cluster (8 for 16); list-C threshold 2.
//! - Algorithms: `grid-aware` ([`GridAware`]); `bouabdallah-laforest`
//!   ([`BouabdallahLaforest`], default configuration: no fast path, every process initially
//!   pointing at process 0); `bouabdallah-laforest-fp` (the same with its optional local-token
//!   fast path, which \[VN\] describes for its own algorithm); and `grid-plain`
//!   ([`GridMode::Plain`](super::grid_aware::GridMode::Plain): the grid-aware code with every grid feature off but the fast path
//!   kept, §5.11's reading of \[VN\]'s baseline — an ablation that separates the grid features
//!   from the fast path, and a cross-check of the independent BL implementation).
//! - Simulated-wall waiting time: per CS entry, request to grant, in simulated ms (mean and
//!   standard deviation over all CS entries of a run).
//!
//! This module owns the setups (points, runs, the sweep and its options); `clock` the
//! logical clock, `charts` the table and charts.

use std::fmt::Write as _;
use std::path::Path;

use crate::chart::ChartError;
use crate::error::MutexError;
use crate::sim::{Channels, Latency};

use super::bouabdallah::{BlConfig, BouabdallahLaforest};
use super::checker::MultiVerdict;
use super::grid_aware::{GridAware, GridConfig};
use super::model::{MultiSystem, ResourceSpace};
use super::sim::{Clusters, MultiSim, MultiSimConfig, MultiStats, MultiWorkload};

mod charts;
mod clock;

pub use charts::{grid_charts, summary_table};
pub use clock::{LogicalClock, LogicalWaits, Stamped, VnChannel, vn_channel};

/// The algorithms of the grid sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridAlgo {
    /// \[VN\]'s grid-aware algorithm.
    GridAware,
    /// Bouabdallah–Laforest ([`super::bouabdallah`]).
    BouabdallahLaforest,
    /// Bouabdallah–Laforest with its optional local-token fast path.
    BouabdallahLaforestFastPath,
    /// The grid-aware code with the grid features off (ablation).
    GridPlain,
}

impl GridAlgo {
    /// Every algorithm of the sweep.
    pub const ALL: [GridAlgo; 4] = [
        GridAlgo::GridAware,
        GridAlgo::BouabdallahLaforest,
        GridAlgo::BouabdallahLaforestFastPath,
        GridAlgo::GridPlain,
    ];

    /// The CSV name.
    pub fn name(self) -> &'static str {
        match self {
            GridAlgo::GridAware => "grid-aware",
            GridAlgo::BouabdallahLaforest => "bouabdallah-laforest",
            GridAlgo::BouabdallahLaforestFastPath => "bouabdallah-laforest-fp",
            GridAlgo::GridPlain => "grid-plain",
        }
    }
}

/// One configuration of the sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct GridPoint {
    /// `latency-v1`, `latency-v2`, `types`, `processes` or `clusters`.
    pub experiment: &'static str,
    /// Processes.
    pub nodes: usize,
    /// Clusters.
    pub clusters: usize,
    /// Instances per resource type.
    pub capacities: Vec<u32>,
    /// Inter-cluster latency (ms).
    pub remote_latency: u64,
    /// Intra-cluster latency (ms).
    pub local_latency: u64,
    /// `MAX_PREEMPT`.
    pub max_preempt: u32,
    /// CS per process.
    pub cs_per_node: usize,
    /// CS time α (ms).
    pub alpha: u64,
    /// Think time β (ms).
    pub beta: u64,
    /// Largest number of types per request.
    pub size_req: usize,
    /// Every algorithm keeps the CT until CS exit (sensitivity; default: it leaves once
    /// every ACK1 is in).
    pub ct_at_exit: bool,
    /// Each process repeats its first request ([`MultiSimConfig::repeat_requests`]).
    pub repeat_requests: bool,
}

impl GridPoint {
    fn new(
        experiment: &'static str,
        nodes: usize,
        clusters: usize,
        capacities: Vec<u32>,
        remote: u64,
        local: u64,
    ) -> Self {
        Self {
            experiment,
            nodes,
            clusters,
            size_req: capacities.len().min(3),
            capacities,
            remote_latency: remote,
            local_latency: local,
            max_preempt: ((nodes / clusters) / 2).max(1) as u32,
            cs_per_node: 10,
            alpha: 500,
            beta: 500,
            repeat_requests: experiment.starts_with("latency"),
            ct_at_exit: false,
        }
    }

    /// The varied parameter's value (the x axis of the charts).
    pub fn x(&self) -> f64 {
        match self.experiment {
            "types" => self.capacities.len() as f64,
            "processes" => self.nodes as f64,
            "clusters" => self.clusters as f64,
            _ => self.remote_latency as f64,
        }
    }
}

/// Inter-cluster latencies of E1–E4 (ms).
pub const LATENCIES: [u64; 4] = [1, 250, 500, 750];

/// The network model of the sweep: local latency, the inter-cluster latencies of E1–E4, and
/// the inter-cluster latency of E5–E7 (all constant, ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GridNet {
    /// Intra-cluster latency.
    pub local: u64,
    /// Inter-cluster latencies swept by `latency-v1` / `latency-v2`.
    pub latencies: Vec<u64>,
    /// Inter-cluster latency of `types`, `processes` and `clusters`.
    pub remote: u64,
}

impl Default for GridNet {
    /// \[VN\]'s: local 1 ms, L ∈ {1, 250, 500, 750} ms, 500 ms for E5–E7.
    fn default() -> Self {
        Self {
            local: 1,
            latencies: LATENCIES.to_vec(),
            remote: 500,
        }
    }
}

/// The points of the sweep with \[VN\]'s network ([`GridNet::default`]).
pub fn grid_points() -> Vec<GridPoint> {
    grid_points_with(&GridNet::default())
}

/// The points of the sweep (module docs) over the network `net`.
pub fn grid_points_with(net: &GridNet) -> Vec<GridPoint> {
    let v2: Vec<u32> = (0..10).map(|r| 1 + (3 * r) % 10).collect();
    let (lo, rem) = (net.local, net.remote);
    let mut pts = Vec::new();
    for &l in &net.latencies {
        pts.push(GridPoint::new("latency-v1", 48, 3, vec![1; 10], l, lo));
    }
    for &l in &net.latencies {
        pts.push(GridPoint::new("latency-v2", 48, 3, v2.clone(), l, lo));
    }
    for t in [1, 5, 10, 20] {
        pts.push(GridPoint::new("types", 48, 3, vec![10; t], rem, lo));
    }
    for n in [12, 24, 48, 60] {
        pts.push(GridPoint::new("processes", n, 3, vec![10; 10], rem, lo));
    }
    for c in [1, 3, 6, 12] {
        pts.push(GridPoint::new("clusters", 48, c, vec![10; 10], rem, lo));
    }
    pts
}

/// One run of the sweep.
#[derive(Debug, Clone)]
pub struct GridRow {
    /// The configuration.
    pub point: GridPoint,
    /// The algorithm.
    pub algo: GridAlgo,
    /// The seed.
    pub seed: u64,
    /// The checker's verdict.
    pub verdict: MultiVerdict,
    /// Driver measurements (wall waiting time, messages, preemptions, use rate).
    pub stats: MultiStats,
    /// Logical waiting times.
    pub logical: LogicalWaits,
    /// Waiting times by \[VN\]'s literal Alg. 15.
    pub vn_logical: LogicalWaits,
}

/// The CSV header of [`GridRow::csv`].
pub const GRID_CSV_HEADER: &str = "algorithm,experiment,nodes,clusters,types,instances,remote_latency,local_latency,max_preempt,seed,cs,use_rate,wait_mean,wait_std,logical_wait_mean,logical_wait_std,vn_logical_wait_mean,msgs_per_cs,msgs_remote,msgs_local,preemptions,verdict,wait_by_size";

impl GridRow {
    fn per_cs(&self, x: u64) -> f64 {
        x as f64 / self.stats.grants.max(1) as f64
    }

    /// Messages per CS.
    pub fn msgs_per_cs(&self) -> f64 {
        self.per_cs(self.stats.messages)
    }

    /// Remote messages per CS.
    pub fn remote_per_cs(&self) -> f64 {
        self.per_cs(self.stats.messages_remote)
    }

    /// Local messages per CS.
    pub fn local_per_cs(&self) -> f64 {
        self.per_cs(self.stats.messages_local)
    }

    /// The row as CSV ([`GRID_CSV_HEADER`]); `wait_by_size` is `size=mean/std` pairs.
    pub fn csv(&self) -> String {
        let p = &self.point;
        let s = &self.stats;
        let instances: u32 = p.capacities.iter().sum();
        let verdict = match &self.verdict {
            MultiVerdict::Ok => "ok",
            MultiVerdict::Violation(_) => "violation",
            MultiVerdict::Deadlock { .. } => "deadlock",
            MultiVerdict::Stall { .. } => "stall",
            MultiVerdict::NodeError { .. } => "node-error",
        };
        let mut by_size = String::new();
        for (k, w) in &s.wait_by_size {
            let _ = write!(
                by_size,
                "{}{k}={:.1}/{:.1}",
                if by_size.is_empty() { "" } else { ";" },
                w.mean(),
                w.std()
            );
        }
        format!(
            "{},{},{},{},{},{},{},{},{},{},{},{:.4},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{},{},{},{}",
            self.algo.name(),
            p.experiment,
            p.nodes,
            p.clusters,
            p.capacities.len(),
            instances,
            p.remote_latency,
            p.local_latency,
            p.max_preempt,
            self.seed,
            s.grants,
            s.use_rate(instances as usize),
            s.wait_mean(),
            s.wait_std(),
            self.logical.mean(),
            self.logical.std(),
            self.vn_logical.mean(),
            self.msgs_per_cs(),
            s.messages_remote,
            s.messages_local,
            s.preemptions,
            verdict,
            by_size,
        )
    }
}

fn run_system<S: MultiSystem>(
    cfg: MultiSimConfig,
    system: S,
    point: &GridPoint,
    cluster: Vec<usize>,
) -> Result<(MultiVerdict, MultiStats, LogicalWaits, LogicalWaits), MutexError> {
    let wrapped = LogicalClock::new(system, cluster, point.local_latency, point.remote_latency);
    let mut sim = MultiSim::new(cfg, wrapped)?;
    let report = sim.run();
    let clock = sim.system();
    Ok((
        report.verdict,
        report.stats,
        clock.waits(),
        clock.vn_waits(),
    ))
}

/// Runs `algo` at `point` with `seed`.
pub fn run_point(point: &GridPoint, algo: GridAlgo, seed: u64) -> Result<GridRow, MutexError> {
    let space = ResourceSpace::with_capacities(point.capacities.clone())?;
    let clusters = Clusters::even(
        point.nodes,
        point.clusters,
        Latency::Constant(point.remote_latency),
    )?;
    let cluster = clusters.of.clone();
    let mut cfg = MultiSimConfig::new(point.nodes, space.clone(), seed);
    cfg.latency = Latency::Constant(point.local_latency);
    cfg.clusters = Some(clusters);
    cfg.channels = Channels::Fifo;
    cfg.repeat_requests = point.repeat_requests;
    // Constant think times would start every process at the same instant, served in
    // id order: cluster by cluster (see `MultiSimConfig::random_start`).
    cfg.random_start = true;
    cfg.workload = MultiWorkload {
        requests_per_node: point.cs_per_node,
        size_req: point.size_req,
        cs_duration: Latency::Constant(point.alpha),
        cs_per_resource: 0,
        think_time: Latency::Constant(point.beta),
    };
    let mut grid = GridConfig::even(point.nodes, point.clusters)?;
    grid.max_preempt = point.max_preempt;
    grid.ct_at_exit = point.ct_at_exit;
    let bl = BlConfig {
        ct_at_exit: point.ct_at_exit,
        ..BlConfig::default()
    };
    let (verdict, stats, logical, vn_logical) = match algo {
        GridAlgo::GridAware => run_system(cfg, GridAware::new(space, grid)?, point, cluster)?,
        GridAlgo::GridPlain => {
            run_system(cfg, GridAware::new(space, grid.plain())?, point, cluster)?
        }
        GridAlgo::BouabdallahLaforest => run_system(
            cfg,
            BouabdallahLaforest::new(point.nodes, space, bl)?,
            point,
            cluster,
        )?,
        GridAlgo::BouabdallahLaforestFastPath => run_system(
            cfg,
            BouabdallahLaforest::new(
                point.nodes,
                space,
                BlConfig {
                    fast_path: true,
                    ..bl
                },
            )?,
            point,
            cluster,
        )?,
    };
    Ok(GridRow {
        point: point.clone(),
        algo,
        seed,
        verdict,
        stats,
        logical,
        vn_logical,
    })
}

/// Runs every point × algorithm × `seeds` seeds (from `first_seed`), calling `progress` after
/// each run.
pub fn sweep_grid(
    points: &[GridPoint],
    first_seed: u64,
    seeds: u64,
    mut progress: impl FnMut(&GridRow),
) -> Result<Vec<GridRow>, MutexError> {
    let mut rows = Vec::new();
    for point in points {
        for algo in GridAlgo::ALL {
            for s in 0..seeds {
                let row = run_point(point, algo, first_seed + s)?;
                progress(&row);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// The grid options of `mutex-exp` (flattened into its arguments).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GridArgs {
    /// Run the grid sweep (spec §7.1: latency v1/v2, resource types, processes, clusters) for
    /// grid-aware, Bouabdallah–Laforest and grid-plain; write `multi-grid.csv`,
    /// `multi-grid-summary.md` and `multi-grid-*.png` to --out.
    #[arg(long)]
    pub sweep_grid: bool,
    /// Seeds (executions) per point of --sweep-grid.
    #[arg(long, default_value_t = 10)]
    pub grid_seeds: u64,
    /// Intra-cluster latency of --sweep-grid (ms).
    #[arg(long, default_value_t = 1)]
    pub grid_local_latency: u64,
    /// Inter-cluster latencies of the latency experiments of --sweep-grid (ms, comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = LATENCIES)]
    pub grid_latencies: Vec<u64>,
    /// Inter-cluster latency of the types/processes/clusters experiments of --sweep-grid (ms).
    #[arg(long, default_value_t = 500)]
    pub grid_remote_latency: u64,
    /// Sensitivity run: every algorithm keeps the control token until CS exit (the literal
    /// reading) instead of passing it on once every ACK1 is in.
    #[arg(long)]
    pub grid_ct_at_exit: bool,
    /// Think time β of every point of --sweep-grid (ms; default 500, the spec's E5–E7 value,
    /// which E1–E4 leave open): a longer one lightens the load.
    #[arg(long)]
    pub grid_think_ms: Option<u64>,
}

impl GridArgs {
    /// The network model these options describe.
    pub fn net(&self) -> GridNet {
        GridNet {
            local: self.grid_local_latency,
            latencies: self.grid_latencies.clone(),
            remote: self.grid_remote_latency,
        }
    }
}

/// Why the grid sweep failed.
#[derive(Debug, thiserror::Error)]
pub enum GridSweepError {
    /// A run could not be set up.
    #[error(transparent)]
    Mutex(#[from] MutexError),
    /// Writing an output failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A chart could not be drawn.
    #[error(transparent)]
    Chart(#[from] ChartError),
    /// Some runs did not pass the checker.
    #[error("{0} runs of the grid sweep did not pass the checker (see the verdict column)")]
    Failed(usize),
}

/// Runs [`sweep_grid`] over [`grid_points_with`] `args.net()` with `args.grid_seeds` seeds from
/// `first_seed`, and writes `multi-grid.csv`, `multi-grid-summary.md` and the charts of
/// [`grid_charts`] into `dir`; progress goes to stderr. Returns the rows.
pub fn run_grid_sweep(
    dir: &Path,
    first_seed: u64,
    args: &GridArgs,
) -> Result<Vec<GridRow>, GridSweepError> {
    if args.grid_latencies.is_empty() || args.grid_seeds == 0 {
        return Err(MutexError::Config(
            "--sweep-grid needs at least one latency and one seed".into(),
        )
        .into());
    }
    let mut points = grid_points_with(&args.net());
    for p in &mut points {
        p.ct_at_exit = args.grid_ct_at_exit;
        if let Some(beta) = args.grid_think_ms {
            p.beta = beta;
        }
    }
    use std::io::Write as _;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| GridSweepError::Io {
            path: path.clone(),
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let started = std::time::Instant::now();
    let csv_path = dir.join("multi-grid.csv");
    let mut csv = std::io::BufWriter::new(std::fs::File::create(&csv_path).map_err(io(&csv_path))?);
    writeln!(csv, "{GRID_CSV_HEADER}").map_err(io(&csv_path))?;
    let mut io_err = None;
    let mut done = 0usize;
    let rows = sweep_grid(&points, first_seed, args.grid_seeds, |row| {
        done += 1;
        if let Err(e) = writeln!(csv, "{}", row.csv()) {
            io_err.get_or_insert(e);
        }
        if done.is_multiple_of(50) {
            eprintln!(
                "sweep-grid: {done} runs, {:.1}s",
                started.elapsed().as_secs_f64()
            );
        }
    })?;
    if let Some(e) = io_err {
        return Err(io(&csv_path)(e));
    }
    csv.flush().map_err(io(&csv_path))?;
    let md_path = dir.join("multi-grid-summary.md");
    std::fs::write(&md_path, summary_table(&rows)).map_err(io(&md_path))?;
    let charts = grid_charts(&rows, dir)?;
    eprintln!(
        "sweep-grid: {} runs in {:.1}s; wrote {}, {} and {} charts",
        rows.len(),
        started.elapsed().as_secs_f64(),
        csv_path.display(),
        md_path.display(),
        charts.len()
    );
    let failed = rows
        .iter()
        .filter(|r| r.verdict != MultiVerdict::Ok)
        .count();
    if failed > 0 {
        return Err(GridSweepError::Failed(failed));
    }
    Ok(rows)
}
