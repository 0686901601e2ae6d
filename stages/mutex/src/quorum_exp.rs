//! Experiments of the crash-tolerant quorum protocol (issue #9 item 5, spec
//! `specs/mutex-vcube-quorum.md` §9): one run of [`FtQuorumNode`] over a quorum generator,
//! with random crashes, as a CSV row with the columns of [`crate::experiment::CSV_HEADER`] plus
//! three more; and the sweep N ∈ {8, …, 512} × {one, all} × {0, 1, 2, N/2 crashes} × {grid,
//! tree, VCube} with its summary table ([`summarize`]) and charts ([`crate::quorum_chart`]).
//!
//! Decisions the spec leaves open (§9 \[D\]), fixed here:
//!
//! - **Requesters.** As in [`crate::experiment`]: `one` is one outstanding request at a time,
//!   each from a random live node with requests left (so the single requester varies and the
//!   average covers every process's quorum); `all` is every node requesting concurrently.
//! - **Workload.** Constant one-hop latency 10 ticks (the unit T), CS time 5, think time 0,
//!   FIFO links (the protocol needs them). CS per node: [`auto_cs`] (`max(1, 64 / N)`, so at
//!   least 64 CS per run and `N` CS for large `N`) unless `--cs` says otherwise.
//! - **Crash schedule.** A function of `(seed, N, requesters, CS count, failures)` only — never
//!   of the generator — so the three generators face the same victims at the same times
//!   ([`QuorumExperiment::crash_schedule`]). Victims are distinct random nodes; times are uniform
//!   in the first half of the run's expected length (`CS total × (2 latency + CS time + think)`),
//!   so crashes land while requests are still being served. A crash scheduled after the run
//!   ended never happens; the `crashes` column counts those that did.
//! - **Detector.** The simulator's perfect detector ([`crate::sim::Crash`]): every live node is
//!   told after a delay drawn from `notice` (default constant 20 ticks: about two VCube test
//!   hops); a non-constant distribution staggers the views.
//! - **No quorum (tree).** As the source did (§9), a crash set under which the tree can form no
//!   quorum is drawn again (for every generator alike, so they still share their crashes), and
//!   the rejections are counted (`redrawn`; about half the random N/2 crash sets at every N).
//!   Should [`MAX_REDRAWS`] draws all fail, the run is flagged (`no_quorum = 1`), its unserved
//!   requests are expected, and it is counted apart in [`summarize`].
//! - **Metric.** Messages are logical messages, one per destination, messages to self counted
//!   (spec §6: `3|Q|` at light load); crash notices are not messages of the protocol. Per run,
//!   [`Metrics::msgs_per_cs_mean_std`]: with `one`, the exact cost of each CS from its request to
//!   the next request (CANCELs and re-REQUESTs caused by a crash are charged to the CS in
//!   progress); with `all`, all messages over all CS, the deviation being that of the messages
//!   sent between consecutive grants. A sweep cell pools its runs: x̄ = messages ÷ CS entries,
//!   σ = the standard deviation of the pooled per-CS samples. Runs without a quorum are left out
//!   of x̄ and σ and counted in `no_quorum_runs`.

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::algorithm::Algorithm;
use crate::chart::ChartError;
use crate::checker::Verdict;
use crate::error::MutexError;
use crate::experiment::{CSV_HEADER, Engine, Experiment, Requesters, Row, latency_mean};
use crate::ft_quorum::protocol::{FtQuorumConfig, FtQuorumNode};
use crate::ft_quorum::tree::tree_part;
use crate::ft_quorum::{CorrectSet, Generator};
use crate::metrics::Metrics;
use crate::quorum_chart;
use crate::rng::SplitMix64;
use crate::sim::{Channels, Crash, Latency, Schedule, SimConfig, Simulation, Workload};

/// How many processes crash in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Failures {
    /// Exactly this many (capped at `N − 1`).
    Count(usize),
    /// `N / 2`.
    Half,
}

impl Failures {
    /// The spec's four failure scenarios: 0, 1, 2 and N/2 crashes.
    pub const SWEEP: [Failures; 4] = [
        Failures::Count(0),
        Failures::Count(1),
        Failures::Count(2),
        Failures::Half,
    ];

    /// The number of crashes for a group of `n`.
    pub fn count(self, n: usize) -> usize {
        match self {
            Failures::Count(k) => k.min(n.saturating_sub(1)),
            Failures::Half => n / 2,
        }
    }

    /// `0`, `1`, `2`, …, or `half`.
    pub fn name(self) -> String {
        match self {
            Failures::Count(k) => k.to_string(),
            Failures::Half => "half".to_owned(),
        }
    }
}

impl fmt::Display for Failures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Failures {
    type Err = MutexError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "half" | "n/2" | "N/2" => Ok(Failures::Half),
            k => k.parse().map(Failures::Count).map_err(|_| {
                MutexError::Config(format!(
                    "failures must be a number of crashes or half, not {s:?}"
                ))
            }),
        }
    }
}

/// The group sizes of the quorum sweep (spec §9).
pub const SWEEP_NODES: [usize; 7] = [8, 16, 32, 64, 128, 256, 512];

/// Default critical sections per node for `n` nodes: `max(1, 64 / n)`.
pub fn auto_cs(n: usize) -> usize {
    (64 / n.max(1)).max(1)
}

/// One run of the quorum protocol.
#[derive(Debug, Clone)]
pub struct QuorumExperiment {
    /// The quorum generator.
    pub generator: Generator,
    /// Group size.
    pub nodes: usize,
    /// Who requests.
    pub requesters: Requesters,
    /// Critical sections per node (`None`: [`auto_cs`]).
    pub cs: Option<usize>,
    /// Seed of the run (workload, latencies) and of its crash schedule.
    pub seed: u64,
    /// One-hop latency (ticks).
    pub latency: Latency,
    /// Time in the CS (ticks).
    pub cs_time: Latency,
    /// Think time before each request (ticks).
    pub think_time: Latency,
    /// How many processes crash.
    pub failures: Failures,
    /// Crash-detection latency, drawn per observer.
    pub notice: Latency,
}

/// The most crash schedules [`QuorumExperiment::drawn_crash_schedule`] rejects for one run.
pub const MAX_REDRAWS: usize = 1000;

/// The CSV header of [`QuorumRow::csv`]: [`CSV_HEADER`] plus `crashes` (crashes that happened
/// during the run; `failures` holds the number scheduled), `no_quorum` (1 if a live process's
/// generator found no quorum), `notice_mean` (mean detection latency, ticks) and `redrawn`
/// (crash schedules rejected before this one).
pub fn csv_header() -> String {
    format!("{CSV_HEADER},crashes,no_quorum,notice_mean,redrawn")
}

impl QuorumExperiment {
    /// Defaults: constant latency 10, CS time 5, think time 0, [`auto_cs`], no crash, notices
    /// after a constant 20 ticks, seed 1.
    pub fn new(generator: Generator, nodes: usize, requesters: Requesters) -> Self {
        Self {
            generator,
            nodes,
            requesters,
            cs: None,
            seed: 1,
            latency: Latency::Constant(10),
            cs_time: Latency::Constant(5),
            think_time: Latency::Constant(0),
            failures: Failures::Count(0),
            notice: Latency::Constant(20),
        }
    }

    /// Critical sections per node.
    pub fn cs_per_node(&self) -> usize {
        self.cs.unwrap_or_else(|| auto_cs(self.nodes))
    }

    /// The crash schedule: a function of the seed, the group size, the workload and the number
    /// of failures only (never of the generator), so every generator faces the same crashes.
    pub fn crash_schedule(&self) -> Vec<Crash> {
        self.drawn_crash_schedule().0
    }

    /// The crash schedule, and how many schedules were drawn and rejected before it: as the
    /// spec's study did (§9: "a schedule under which quorums remain formable", rejections
    /// recorded), a crash set leaving the tree no quorum is drawn again, for every generator
    /// alike (tree quorum existence only shrinks as crashes add up, so the final set decides).
    /// After [`MAX_REDRAWS`] rejections the last draw stands (the run is then flagged
    /// `no_quorum` for the tree).
    pub fn drawn_crash_schedule(&self) -> (Vec<Crash>, usize) {
        let n = self.nodes;
        let k = self.failures.count(n);
        if k == 0 {
            return (Vec::new(), 0);
        }
        // A stream of its own: the schedule does not depend on how the run uses its RNG.
        let mut rng = SplitMix64::new(self.seed ^ 0xC4A5_11ED_5EED_0F0F);
        let per_cs = 2.0 * latency_mean(&self.latency)
            + latency_mean(&self.cs_time)
            + latency_mean(&self.think_time);
        let total_cs = (self.cs_per_node() * n) as f64;
        let horizon = ((total_cs * per_cs) / 2.0).max(1.0) as u64;
        let mut rejected = 0;
        loop {
            let mut crashes = Crash::random(&mut rng, n, k, horizon, &self.notice);
            crashes.sort_by_key(|c| (c.at, c.node));
            let formable = CorrectSet::with_crashed(n, crashes.iter().map(|c| c.node))
                .is_ok_and(|view| tree_part(&view).is_ok());
            if formable || rejected == MAX_REDRAWS {
                return (crashes, rejected);
            }
            rejected += 1;
        }
    }

    /// The simulator configuration of this run (crashes included).
    pub fn sim_config(&self) -> SimConfig {
        let mut cfg = SimConfig::new(self.nodes, self.seed);
        cfg.latency = self.latency.clone();
        cfg.channels = Channels::Fifo;
        cfg.workload = Workload {
            requests_per_node: self.cs_per_node(),
            requesters: None,
            cs_duration: self.cs_time.clone(),
            think_time: self.think_time.clone(),
            schedule: match self.requesters {
                Requesters::One => Schedule::Serial,
                Requesters::All => Schedule::Concurrent,
            },
        };
        cfg.crashes = self.crash_schedule();
        cfg.max_time = u64::MAX / 4;
        cfg.max_events = 500_000_000;
        cfg
    }

    /// The equivalent classic [`Experiment`] (used for the shared CSV columns).
    fn as_experiment(&self) -> Experiment {
        let mut e = Experiment::new(
            Algorithm::Quorum(self.generator),
            self.nodes,
            self.requesters,
        );
        e.cs = self.cs_per_node();
        e.seed = self.seed;
        e.latency = self.latency.clone();
        e.cs_time = self.cs_time.clone();
        e.think_time = self.think_time.clone();
        e.engine = Engine::StateMachines;
        e
    }

    /// Runs the experiment.
    pub fn run(&self) -> Result<QuorumRow, MutexError> {
        if self.nodes < 2 {
            return Err(MutexError::Config(
                "the quorum protocol needs at least 2 nodes".into(),
            ));
        }
        let cfg = self.sim_config();
        let crashes = cfg.crashes.clone();
        let redrawn = self.drawn_crash_schedule().1;
        let mut sim =
            Simulation::<FtQuorumNode>::new(cfg, &FtQuorumConfig::generator(self.generator))?;
        let report = sim.run();
        let (happened, no_quorum) = crash_tally(&sim, &crashes, report.metrics.end_time);
        Ok(QuorumRow {
            row: Row {
                exp: self.as_experiment(),
                verdict: report.verdict,
                metrics: report.metrics,
            },
            generator: self.generator,
            failures: self.failures,
            scheduled: crashes.len(),
            crashes: happened,
            no_quorum,
            redrawn,
            notice_mean: latency_mean(&self.notice),
        })
    }
}

/// After a run that ended at `end`: how many of the scheduled `crashes` happened, and
/// whether a surviving process was left without a quorum.
pub(crate) fn crash_tally(
    sim: &Simulation<FtQuorumNode>,
    crashes: &[Crash],
    end: u64,
) -> (usize, bool) {
    let mut dead = vec![false; sim.nodes().len()];
    let mut happened = 0;
    for c in crashes.iter().filter(|c| c.at <= end) {
        dead[c.node] = true;
        happened += 1;
    }
    let no_quorum = sim
        .nodes()
        .iter()
        .enumerate()
        .any(|(i, node)| !dead[i] && node.no_quorum());
    (happened, no_quorum)
}

/// One measured quorum run.
#[derive(Debug, Clone)]
pub struct QuorumRow {
    /// The shared columns (algorithm `quorum-<generator>`).
    pub row: Row,
    /// The generator.
    pub generator: Generator,
    /// The failure scenario.
    pub failures: Failures,
    /// Crashes scheduled.
    pub scheduled: usize,
    /// Crashes that happened before the run ended.
    pub crashes: usize,
    /// Whether a live process's generator found no quorum (its requests cannot be served).
    pub no_quorum: bool,
    /// Crash schedules drawn and rejected (the tree could form no quorum) before this run's.
    pub redrawn: usize,
    /// Mean detection latency (ticks).
    pub notice_mean: f64,
}

impl QuorumRow {
    /// The run's verdict.
    pub fn verdict(&self) -> &Verdict {
        &self.row.verdict
    }

    /// The run's measurements.
    pub fn metrics(&self) -> &Metrics {
        &self.row.metrics
    }

    /// Whether the run failed the checker: a safety violation or node error always; a deadlock
    /// or stall unless the run lacked a quorum (then unserved requests are expected).
    pub fn failed(&self) -> bool {
        match self.verdict() {
            Verdict::Ok => false,
            Verdict::Deadlock { .. } | Verdict::Stall { .. } => !self.no_quorum,
            Verdict::Violation(_) | Verdict::NodeError { .. } => true,
        }
    }

    /// The CSV row (see [`csv_header`]): the shared columns with `failures` = crashes
    /// scheduled, then `crashes`, `no_quorum`, `notice_mean`, `redrawn`.
    pub fn csv(&self, by_type: bool) -> String {
        let shared = self.row.csv(by_type);
        // Column 5 (`failures`) of the shared row counts dropped messages (none here).
        let mut cols: Vec<&str> = shared.splitn(6, ',').collect();
        let scheduled = self.scheduled.to_string();
        if cols.len() == 6 {
            cols[4] = &scheduled;
        }
        format!(
            "{},{},{},{:.3},{}",
            cols.join(","),
            self.crashes,
            u8::from(self.no_quorum),
            self.notice_mean,
            self.redrawn
        )
    }
}

/// The think time of the sweep's one-requester rows: at least two hops, so that the next
/// request leaves after the previous RELEASE has arrived. With less, the two race at the
/// members both quorums share, which answer FAILED to a request that finds them still
/// locked — contention the spec's "one requester, no contention" rows do not have (it
/// added 0.3–0.5 messages per CS at N = 16).
fn one_requester_think(base: &QuorumExperiment) -> Latency {
    let two_hops = (2.0 * latency_mean(&base.latency)).ceil() as u64;
    if latency_mean(&base.think_time) >= two_hops as f64 {
        base.think_time.clone()
    } else {
        Latency::Constant(two_hops)
    }
}

/// Runs `base` for every generator × [`SWEEP_NODES`] × {one, all} × [`Failures::SWEEP`] ×
/// `seeds` (seeds `base.seed ..`), on `threads` worker threads (biggest runs first), calling
/// `progress` after each run. Rows come back in a fixed order (generator, requesters, N,
/// failures, seed), whatever the threads did.
pub fn sweep(
    base: &QuorumExperiment,
    nodes: &[usize],
    seeds: u64,
    threads: usize,
    progress: impl FnMut(&QuorumRow) + Send,
) -> Result<Vec<QuorumRow>, MutexError> {
    let mut jobs = Vec::new();
    for generator in Generator::ALL {
        for requesters in [Requesters::One, Requesters::All] {
            for &n in nodes {
                for failures in Failures::SWEEP {
                    for s in 0..seeds {
                        let mut e = base.clone();
                        e.generator = generator;
                        e.nodes = n;
                        e.requesters = requesters;
                        e.failures = failures;
                        e.seed = base.seed + s;
                        if requesters == Requesters::One {
                            e.think_time = one_requester_think(base);
                        }
                        jobs.push(e);
                    }
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    // Largest first, so that the long n = 512 runs do not end the sweep on one thread.
    order.sort_by_key(|&j| std::cmp::Reverse(jobs[j].nodes));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<QuorumRow, MutexError>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let progress = Mutex::new(progress);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&j) = order.get(k) else { break };
                    let r = jobs[j].run();
                    if let Ok(row) = &r
                        && let Ok(mut p) = progress.lock()
                    {
                        (*p)(row);
                    }
                    let failed = r.is_err();
                    if let Ok(mut res) = results.lock() {
                        res[j] = Some(r);
                    }
                    if failed {
                        // Stop the other workers early: the sweep fails anyway.
                        next.store(order.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| MutexError::Config("a sweep worker panicked".into()))?;
    let mut rows = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Some(r) => rows.push(r?),
            None => return Err(MutexError::Config("a sweep run did not complete".into())),
        }
    }
    Ok(rows)
}

/// One cell of the sweep: a generator × N × requesters × failures, over its seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// Generator.
    pub generator: Generator,
    /// Group size.
    pub nodes: usize,
    /// Who requests.
    pub requesters: Requesters,
    /// Failure scenario.
    pub failures: Failures,
    /// Runs in the cell.
    pub runs: usize,
    /// Runs where a live process had no quorum (tree); left out of the statistics below.
    pub no_quorum_runs: usize,
    /// Crash schedules rejected (the tree could form no quorum), over all runs.
    pub redrawn: usize,
    /// Runs that failed the checker ([`QuorumRow::failed`]).
    pub failed_runs: usize,
    /// Crashes that happened, over all runs.
    pub crashes: usize,
    /// CS entries, over the runs with a quorum.
    pub cs_entries: u64,
    /// Messages per CS, pooled (`None` without CS entries).
    pub mean: Option<f64>,
    /// Standard deviation of the pooled per-CS samples.
    pub std: Option<f64>,
    /// Standard deviation across runs of the runs' messages per CS.
    pub std_runs: Option<f64>,
    /// Messages per CS by message type.
    pub by_type: BTreeMap<&'static str, f64>,
}

impl Cell {
    /// Messages per CS of the spec's seven types only, without crash settlement's
    /// ([`SETTLEMENT_TYPES`]).
    pub fn mean_without_settlement(&self) -> Option<f64> {
        let extra: f64 = SETTLEMENT_TYPES
            .iter()
            .map(|t| self.by_type.get(t).copied().unwrap_or(0.0))
            .sum();
        Some(self.mean? - extra)
    }
}

impl Cell {
    /// The deviation the summary table and charts show: with `one`, that of the exact per-CS
    /// costs ([`Cell::std`]); with `all`, where a CS's own cost is not separable, that across
    /// runs ([`Cell::std_runs`]).
    pub fn sigma(&self) -> Option<f64> {
        match self.requesters {
            Requesters::One => self.std,
            Requesters::All => self.std_runs,
        }
    }
}

/// The per-CS samples of a run's cost, as [`Metrics::msgs_per_cs_mean_std`] defines them.
fn samples(m: &Metrics) -> Vec<f64> {
    if !m.per_cs_messages.is_empty() {
        return m.per_cs_messages.iter().map(|&x| x as f64).collect();
    }
    let mut prev = 0;
    m.messages_at_grant
        .iter()
        .map(|&x| {
            let d = x.saturating_sub(prev);
            prev = x;
            d as f64
        })
        .collect()
}

/// Groups rows into [`Cell`]s (in first-seen order) and pools their statistics.
pub fn summarize(rows: &[QuorumRow]) -> Vec<Cell> {
    type Key = (Generator, usize, Requesters, Failures);
    let mut keys: Vec<Key> = Vec::new();
    let mut groups: BTreeMap<usize, Vec<&QuorumRow>> = BTreeMap::new();
    for r in rows {
        let key = (
            r.generator,
            r.row.exp.nodes,
            r.row.exp.requesters,
            r.failures,
        );
        let idx = keys.iter().position(|k| *k == key).unwrap_or_else(|| {
            keys.push(key);
            keys.len() - 1
        });
        groups.entry(idx).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|(idx, rs)| {
            let (generator, nodes, requesters, failures) = keys[idx];
            let good: Vec<&&QuorumRow> = rs.iter().filter(|r| !r.no_quorum).collect();
            let cs_entries: u64 = good.iter().map(|r| r.metrics().cs_entries).sum();
            let messages: u64 = good.iter().map(|r| r.metrics().messages_total).sum();
            let pooled: Vec<f64> = good.iter().flat_map(|r| samples(r.metrics())).collect();
            let mean = (cs_entries > 0).then(|| messages as f64 / cs_entries as f64);
            let std = mean.filter(|_| !pooled.is_empty()).map(|m| {
                (pooled.iter().map(|x| (x - m).powi(2)).sum::<f64>() / pooled.len() as f64).sqrt()
            });
            let run_means: Vec<f64> = good.iter().filter_map(|r| r.row.msgs_per_cs()).collect();
            let std_runs = (!run_means.is_empty()).then(|| {
                let m = run_means.iter().sum::<f64>() / run_means.len() as f64;
                (run_means.iter().map(|x| (x - m).powi(2)).sum::<f64>() / run_means.len() as f64)
                    .sqrt()
            });
            let mut by_type: BTreeMap<&'static str, f64> = BTreeMap::new();
            if cs_entries > 0 {
                for r in &good {
                    for (k, v) in &r.metrics().messages_by_kind {
                        *by_type.entry(k).or_insert(0.0) += *v as f64 / cs_entries as f64;
                    }
                }
            }
            Cell {
                generator,
                nodes,
                requesters,
                failures,
                runs: rs.len(),
                no_quorum_runs: rs.iter().filter(|r| r.no_quorum).count(),
                redrawn: rs.iter().map(|r| r.redrawn).sum(),
                failed_runs: rs.iter().filter(|r| r.failed()).count(),
                crashes: rs.iter().map(|r| r.crashes).sum(),
                cs_entries,
                mean,
                std,
                std_runs,
                by_type,
            }
        })
        .collect()
}

/// The message types of the protocol: the spec's seven, then the four of crash settlement
/// ([`crate::ft_quorum::protocol`]; [`SETTLEMENT_TYPES`]).
pub const MESSAGE_TYPES: [&str; 11] = [
    "request", "reply", "failed", "inquire", "yield", "release", "cancel", "flush", "refresh",
    "lock", "revoke",
];

/// The message types crash settlement adds to the spec's seven: FLUSH, the REPLYs re-sent
/// once a crash is settled, and LOCK/REVOKE for quorum changes inside a CS.
pub const SETTLEMENT_TYPES: [&str; 4] = ["flush", "refresh", "lock", "revoke"];

/// The summary as a CSV (one line per cell).
pub fn summary_csv(cells: &[Cell]) -> String {
    let mut s = String::from(
        "generator,nodes,requesters,failures,runs,no_quorum_runs,redrawn,failed_runs,crashes,cs_entries,msgs_per_cs_mean,msgs_per_cs_std,msgs_per_cs_std_runs",
    );
    for t in MESSAGE_TYPES {
        let _ = write!(s, ",{t}");
    }
    s.push('\n');
    let f = |x: Option<f64>| x.map(|v| format!("{v:.3}")).unwrap_or_default();
    for c in cells {
        let _ = write!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
            c.generator.name(),
            c.nodes,
            c.requesters.name(),
            c.failures,
            c.runs,
            c.no_quorum_runs,
            c.redrawn,
            c.failed_runs,
            c.crashes,
            c.cs_entries,
            f(c.mean),
            f(c.std),
            f(c.std_runs)
        );
        for t in MESSAGE_TYPES {
            let _ = write!(s, ",{}", f(Some(c.by_type.get(t).copied().unwrap_or(0.0))));
        }
        s.push('\n');
    }
    s
}

/// The summary as Markdown tables, one per requesters kind: a row per N and failure scenario,
/// `x̄ ± σ` per generator, and the tree's no-quorum runs.
pub fn summary_markdown(cells: &[Cell]) -> String {
    let mut s = String::new();
    let find = |g: Generator, n: usize, r: Requesters, f: Failures| {
        cells
            .iter()
            .find(|c| c.generator == g && c.nodes == n && c.requesters == r && c.failures == f)
    };
    let mut nodes: Vec<usize> = cells.iter().map(|c| c.nodes).collect();
    nodes.sort_unstable();
    nodes.dedup();
    for r in [Requesters::One, Requesters::All] {
        if !cells.iter().any(|c| c.requesters == r) {
            continue;
        }
        let _ = writeln!(
            s,
            "\nMessages per CS, x̄ ± σ (σ {}; in brackets: x̄ of the spec's seven message types, without crash settlement's), requesters = {}\n\n| N | crashes | grid | tree | vcube | crash sets redrawn (tree without quorum) / runs | tree runs without quorum | failed runs |\n|---|---|---|---|---|---|---|---|",
            match r {
                Requesters::One => "of the per-CS costs",
                Requesters::All => "across runs",
            },
            r.name()
        );
        for &n in &nodes {
            for f in Failures::SWEEP {
                let mut line = format!("| {n} | {f} |");
                let mut failed = 0;
                for g in Generator::ALL {
                    let cell = find(g, n, r, f);
                    failed += cell.map_or(0, |c| c.failed_runs);
                    let v = match cell
                        .and_then(|c| Some((c.mean?, c.sigma()?, c.mean_without_settlement()?)))
                    {
                        Some((m, sd, p)) if m > p => format!(" {m:.1} ± {sd:.1} ({p:.1}) |"),
                        Some((m, sd, _)) => format!(" {m:.1} ± {sd:.1} |"),
                        None => " – |".to_owned(),
                    };
                    line.push_str(&v);
                }
                let tree = find(Generator::Tree, n, r, f);
                let redrawn = tree
                    .map(|c| format!("{}/{}", c.redrawn, c.runs))
                    .unwrap_or_default();
                let nq = tree
                    .map(|c| format!("{}/{}", c.no_quorum_runs, c.runs))
                    .unwrap_or_default();
                let _ = writeln!(s, "{line} {redrawn} | {nq} | {failed} |");
            }
        }
    }
    s
}

/// Everything that can stop a quorum experiment from the command line.
#[derive(Debug, thiserror::Error)]
pub enum QuorumExpError {
    /// A bad option or a failed run.
    #[error(transparent)]
    Mutex(#[from] MutexError),
    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A chart could not be drawn.
    #[error(transparent)]
    Chart(#[from] ChartError),
}

/// The quorum options of `mutex-exp` (flattened into its arguments).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct QuorumArgs {
    /// Quorum generator of `--algorithm quorum`: grid, tree or vcube (default vcube, or the one
    /// the algorithm names: quorum-grid, quorum-tree, quorum-vcube).
    #[arg(long)]
    pub quorum: Option<String>,
    /// Crashes per quorum run: a number, or `half` for N/2.
    #[arg(long, default_value = "0")]
    pub failures: String,
    /// Crash-detection latency of the quorum runs (a distribution, drawn per observer).
    #[arg(long, default_value = "const:20")]
    pub notice: String,
    /// Run the quorum sweep: N ∈ {8..512} × {one, all} × {0, 1, 2, half} crashes × {grid,
    /// tree, vcube}; write CSVs, a Markdown summary and PNG charts to --out.
    #[arg(long)]
    pub sweep_quorum: bool,
    /// Group sizes of --sweep-quorum (comma-separated; default 8,16,32,64,128,256,512).
    #[arg(long, value_delimiter = ',')]
    pub quorum_nodes: Vec<usize>,
    /// Worker threads of --sweep-quorum (default: the available parallelism).
    #[arg(long)]
    pub quorum_threads: Option<usize>,
}

impl QuorumArgs {
    /// Whether `mutex-exp` should run the quorum experiments for `--algorithm algorithm`.
    pub fn wanted(&self, algorithm: &str) -> bool {
        self.sweep_quorum
            || algorithm
                .parse::<Algorithm>()
                .is_ok_and(|a| a.generator().is_some())
    }

    /// The generator: `--quorum` if given, else the one `algorithm` names (VCube for `quorum`).
    pub fn generator(&self, algorithm: &str) -> Result<Generator, MutexError> {
        if let Some(q) = &self.quorum {
            return q
                .parse()
                .map_err(|e| MutexError::Config(format!("--quorum: {e}")));
        }
        Ok(algorithm
            .parse::<Algorithm>()
            .ok()
            .and_then(Algorithm::generator)
            .unwrap_or(Generator::VCube))
    }

    /// The failure scenario.
    pub fn failures(&self) -> Result<Failures, MutexError> {
        self.failures.parse()
    }

    /// The sweep's group sizes.
    pub fn sweep_nodes(&self) -> Vec<usize> {
        if self.quorum_nodes.is_empty() {
            SWEEP_NODES.to_vec()
        } else {
            self.quorum_nodes.clone()
        }
    }

    /// The sweep's worker threads.
    pub fn threads(&self) -> usize {
        self.quorum_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1)
    }
}

fn write_file(path: &Path, text: &str) -> Result<(), QuorumExpError> {
    std::fs::write(path, text).map_err(|source| QuorumExpError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a sweep's outputs into `dir` (created if needed): `quorum-sweep.csv` (every run),
/// `quorum-summary.csv` and `quorum-summary.md` (per cell), and the charts
/// `quorum-msgs-{one,all}.png` and `quorum-types-{one,all}.png`. Returns the cells and the
/// files written.
pub fn write_sweep(
    dir: &Path,
    rows: &[QuorumRow],
    by_type: bool,
) -> Result<(Vec<Cell>, Vec<PathBuf>), QuorumExpError> {
    std::fs::create_dir_all(dir).map_err(|source| QuorumExpError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();
    let mut csv = csv_header();
    csv.push('\n');
    for r in rows {
        csv.push_str(&r.csv(by_type));
        csv.push('\n');
    }
    let cells = summarize(rows);
    for (name, text) in [
        ("quorum-sweep.csv", csv),
        ("quorum-summary.csv", summary_csv(&cells)),
        ("quorum-summary.md", summary_markdown(&cells)),
    ] {
        let path = dir.join(name);
        write_file(&path, &text)?;
        files.push(path);
    }
    for r in [Requesters::One, Requesters::All] {
        if !cells.iter().any(|c| c.requesters == r) {
            continue;
        }
        let msgs = dir.join(format!("quorum-msgs-{}.png", r.name()));
        quorum_chart::msgs_chart(&cells, r, &msgs)?;
        files.push(msgs);
        let types = dir.join(format!("quorum-types-{}.png", r.name()));
        quorum_chart::types_chart(&cells, r, &types)?;
        files.push(types);
    }
    Ok((cells, files))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_parse_and_count() {
        assert_eq!("half".parse::<Failures>().unwrap().count(16), 8);
        assert_eq!("2".parse::<Failures>().unwrap().count(16), 2);
        assert_eq!(Failures::Count(9).count(4), 3);
        assert!("many".parse::<Failures>().is_err());
    }

    #[test]
    fn the_crash_schedule_depends_on_the_seed_only() {
        let mut a = QuorumExperiment::new(Generator::Grid, 16, Requesters::All);
        a.failures = Failures::Half;
        a.seed = 7;
        let mut b = a.clone();
        b.generator = Generator::Tree;
        let s = a.crash_schedule();
        assert_eq!(s, b.crash_schedule());
        assert_eq!(s.len(), 8);
        let mut victims: Vec<usize> = s.iter().map(|c| c.node).collect();
        victims.sort_unstable();
        victims.dedup();
        assert_eq!(victims.len(), 8, "distinct victims");
        b.seed = 8;
        assert_ne!(s, b.crash_schedule());
    }

    /// The sweep's one-requester rows have no contention (the spec's reading): without
    /// crashes they cost exactly three messages per quorum member, with the base think
    /// time of 0 (which made the next request race the previous RELEASE).
    #[test]
    fn the_sweeps_one_requester_rows_cost_three_messages_per_member() {
        let base = QuorumExperiment::new(Generator::Grid, 16, Requesters::One);
        let rows = sweep(&base, &[16], 1, 2, |_| {}).unwrap();
        for (g, want) in [(Generator::Grid, 21.0), (Generator::VCube, 27.0)] {
            let row = rows
                .iter()
                .find(|r| {
                    r.generator == g
                        && r.row.exp.requesters == Requesters::One
                        && r.failures == Failures::Count(0)
                })
                .expect("the fault-free one-requester row");
            assert_eq!(
                row.metrics().msgs_per_cs_mean_std(),
                Some((want, 0.0)),
                "{g:?}"
            );
        }
    }

    #[test]
    fn a_fault_free_light_run_costs_three_messages_per_member() {
        let mut e = QuorumExperiment::new(Generator::VCube, 8, Requesters::One);
        // Think time longer than a RELEASE's flight: no CS overlaps the previous one's tail.
        e.think_time = Latency::Constant(50);
        let row = e.run().unwrap();
        assert!(row.verdict().is_ok(), "{}", row.verdict());
        // Fault-free VCube quorums have n/2 + 1 = 5 members: 15 messages per CS.
        assert_eq!(row.metrics().msgs_per_cs_mean_std(), Some((15.0, 0.0)));
        let line = row.csv(true);
        assert_eq!(line.split(',').count(), csv_header().split(',').count());
        assert!(
            line.starts_with("quorum-vcube,5,8,one,0,1,64,15.000,0.000,"),
            "{line}"
        );
        assert!(line.ends_with(",0,0,20.000,0"), "{line}");
    }

    #[test]
    fn a_crash_set_leaving_the_tree_no_quorum_is_drawn_again_and_counted() {
        let mut redrawn = 0;
        for seed in 1..=20 {
            let mut e = QuorumExperiment::new(Generator::Grid, 8, Requesters::All);
            e.failures = Failures::Half;
            e.seed = seed;
            let (crashes, rejected) = e.drawn_crash_schedule();
            assert_eq!(crashes.len(), 4);
            let view = CorrectSet::with_crashed(8, crashes.iter().map(|c| c.node)).unwrap();
            assert!(tree_part(&view).is_ok(), "seed {seed}: {crashes:?}");
            assert_eq!(e.crash_schedule(), crashes, "one schedule per seed");
            redrawn += rejected;
        }
        // About half the random sets of 4 crashes among 8 leave the tree no quorum.
        assert!(redrawn >= 5, "{redrawn} redrawn over 20 seeds");
    }

    #[test]
    fn a_small_sweep_is_summarized_with_crashes_and_no_quorum_runs_counted() {
        let base = QuorumExperiment::new(Generator::Grid, 8, Requesters::One);
        let rows = sweep(&base, &[8], 2, 2, |_| {}).unwrap();
        assert_eq!(rows.len(), 3 * 2 * 4 * 2);
        let cells = summarize(&rows);
        assert_eq!(cells.len(), 3 * 2 * 4);
        for c in &cells {
            assert_eq!(c.failed_runs, 0, "{c:?}");
            if c.failures == Failures::Count(0) {
                assert_eq!(c.crashes, 0);
            }
            if c.failures == Failures::Half {
                assert!(c.crashes > 0, "{c:?}");
                assert_eq!(c.no_quorum_runs, 0, "crash sets are redrawn: {c:?}");
            }
            if c.no_quorum_runs < c.runs {
                assert!(
                    c.mean.is_some() && c.by_type.contains_key("request"),
                    "{c:?}"
                );
            }
        }
        // The files: CSVs always; the charts need a font (ChartError::NoFont without one).
        let dir = std::env::temp_dir().join(format!("leda-quorum-exp-{}", std::process::id()));
        match write_sweep(&dir, &rows, true) {
            Ok((_, files)) => {
                assert_eq!(files.len(), 3 + 4);
                for f in &files {
                    assert!(std::fs::metadata(f).is_ok_and(|m| m.len() > 0), "{f:?}");
                }
            }
            Err(QuorumExpError::Chart(ChartError::NoFont)) => {}
            Err(e) => panic!("write_sweep: {e}"),
        }
        let csv = std::fs::read_to_string(dir.join("quorum-sweep.csv")).unwrap();
        assert_eq!(csv.lines().count(), rows.len() + 1);
        let _ = std::fs::remove_dir_all(&dir);
        let table = summary_markdown(&cells);
        assert!(table.contains("| 8 | half |"), "{table}");
        let csv = summary_csv(&cells);
        assert_eq!(csv.lines().count(), cells.len() + 1);
    }
}
