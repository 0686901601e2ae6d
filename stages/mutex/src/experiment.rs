//! Experiments (spec §3, §17; issue item 4): one run of an algorithm under a workload, measured
//! and printed as a CSV row, and the sweep over group sizes and loads.
//!
//! Requesters: `one` means **one outstanding request at a time** (light load): after each
//! release a random node issues the next request, so each CS's cost is counted exactly, request
//! to release. `all` means every node requests concurrently (think time then request, `cs`
//! times each), which is heavy load when the think time is small.
//!
//! Messages per CS count every message the algorithm sends, messages to self included where
//! the algorithm sends them (Maekawa's `P_i ∈ S_i`); messages sent before the first request
//! (a ring's idle token) are left out.

use std::fmt::Write as _;
use std::str::FromStr;

use crate::algorithm::{Algorithm, Load};
use crate::checker::Verdict;
use crate::error::MutexError;
use crate::metrics::Metrics;
use crate::sim::{Channels, DropRule, Latency, Schedule, SimConfig, Workload};
use crate::stage_sim::StageSim;

/// Who requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requesters {
    /// One outstanding request at a time, random node.
    One,
    /// Every node, concurrently.
    All,
}

impl Requesters {
    /// `one` or `all`.
    pub fn name(self) -> &'static str {
        match self {
            Requesters::One => "one",
            Requesters::All => "all",
        }
    }

    /// The load the theory calls this.
    pub fn load(self) -> Load {
        match self {
            Requesters::One => Load::Light,
            Requesters::All => Load::Heavy,
        }
    }
}

impl FromStr for Requesters {
    type Err = MutexError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "one" => Ok(Requesters::One),
            "all" => Ok(Requesters::All),
            other => Err(MutexError::Config(format!(
                "requesters must be one or all, not {other:?}"
            ))),
        }
    }
}

/// Parses a duration distribution in ticks: `10` or `const:10`, `uniform:MIN:MAX`,
/// `exp:MEAN` or `exp:MIN:MEAN`.
pub fn parse_latency(s: &str) -> Result<Latency, MutexError> {
    let bad = || {
        MutexError::Config(format!(
            "bad distribution {s:?}: use N, const:N, uniform:MIN:MAX, exp:MEAN or exp:MIN:MEAN"
        ))
    };
    let parts: Vec<&str> = s.split(':').collect();
    let int = |x: &str| x.trim().parse::<u64>().map_err(|_| bad());
    let float = |x: &str| {
        x.trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .ok_or_else(bad)
    };
    match parts.as_slice() {
        [c] => Ok(Latency::Constant(int(c)?)),
        ["const" | "constant", c] => Ok(Latency::Constant(int(c)?)),
        ["uniform", a, b] => {
            let (min, max) = (int(a)?, int(b)?);
            if min > max {
                return Err(bad());
            }
            Ok(Latency::Uniform { min, max })
        }
        ["exp" | "exponential", m] => Ok(Latency::Exponential {
            min: 0,
            mean: float(m)?,
        }),
        ["exp" | "exponential", a, m] => Ok(Latency::Exponential {
            min: int(a)?,
            mean: float(m)?,
        }),
        _ => Err(bad()),
    }
}

/// The mean of a distribution, in ticks.
pub fn latency_mean(l: &Latency) -> f64 {
    match *l {
        Latency::Constant(c) => c as f64,
        Latency::Uniform { min, max } => (min + max) as f64 / 2.0,
        Latency::Exponential { min, mean } => min as f64 + mean,
    }
}

/// Which simulator runs an experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// The state machines alone ([`crate::sim`]): fastest.
    StateMachines,
    /// The stage graph under leda-core's simulated executor ([`crate::stage_sim`]).
    Stages,
}

/// One experiment.
#[derive(Debug, Clone)]
pub struct Experiment {
    /// Algorithm.
    pub algorithm: Algorithm,
    /// Group size.
    pub nodes: usize,
    /// Who requests.
    pub requesters: Requesters,
    /// Critical sections per node.
    pub cs: usize,
    /// Seed.
    pub seed: u64,
    /// One-hop latency (ticks).
    pub latency: Latency,
    /// Time in the CS (ticks).
    pub cs_time: Latency,
    /// Think time before each request (ticks).
    pub think_time: Latency,
    /// Injected message losses (`kind`, `nth`), e.g. a Misra token loss.
    pub drops: Vec<DropRule>,
    /// Simulator.
    pub engine: Engine,
}

impl Experiment {
    /// Defaults: constant latency 10, CS time 5, think time 0, 10 CS per node, state machines.
    pub fn new(algorithm: Algorithm, nodes: usize, requesters: Requesters) -> Self {
        Experiment {
            algorithm,
            nodes,
            requesters,
            cs: 10,
            seed: 1,
            latency: Latency::Constant(10),
            cs_time: Latency::Constant(5),
            think_time: Latency::Constant(0),
            drops: Vec::new(),
            engine: Engine::StateMachines,
        }
    }

    fn sim_config(&self) -> SimConfig {
        let mut cfg = SimConfig::new(self.nodes, self.seed);
        cfg.latency = self.latency.clone();
        cfg.channels = Channels::weakest_for_algorithm(self.algorithm);
        cfg.workload = Workload {
            requests_per_node: self.cs,
            requesters: None,
            cs_duration: self.cs_time.clone(),
            think_time: self.think_time.clone(),
            schedule: match self.requesters {
                Requesters::One => Schedule::Serial,
                Requesters::All => Schedule::Concurrent,
            },
        };
        cfg.drops = self.drops.clone();
        cfg.max_time = u64::MAX / 4;
        cfg.max_events = 200_000_000;
        cfg
    }

    /// Runs the experiment.
    pub fn run(&self) -> Result<Row, MutexError> {
        let (verdict, metrics) = match self.engine {
            Engine::StateMachines => {
                let r = self.algorithm.simulate(self.sim_config())?;
                (r.verdict, r.metrics)
            }
            Engine::Stages => {
                if self.requesters == Requesters::One {
                    return Err(MutexError::Config(
                        "the stage engine runs concurrent clients only (requesters all)".into(),
                    ));
                }
                let mut s = StageSim::new(self.algorithm, self.nodes, self.seed);
                s.net.latency = StageSim::net_latency(&self.latency);
                s.net.fifo = self.algorithm.requires_fifo();
                s.requests = self.cs;
                s.cs_time = self.cs_time.clone();
                s.think_time = self.think_time.clone();
                s.max_time = u64::MAX / 4;
                let r = s.run()?;
                (r.verdict, r.metrics)
            }
        };
        Ok(Row::new(self, verdict, metrics))
    }
}

impl Channels {
    /// FIFO when `algorithm` requires it, non-FIFO otherwise.
    pub fn weakest_for_algorithm(algorithm: Algorithm) -> Self {
        if algorithm.requires_fifo() {
            Channels::Fifo
        } else {
            Channels::NonFifo
        }
    }
}

/// One measured experiment.
#[derive(Debug, Clone)]
pub struct Row {
    /// The experiment.
    pub exp: Experiment,
    /// The checker's verdict.
    pub verdict: Verdict,
    /// Raw measurements.
    pub metrics: Metrics,
}

/// The CSV header of [`Row::csv`].
pub const CSV_HEADER: &str = "algorithm,quorum,nodes,requesters,failures,seed,cs,msgs_per_cs_mean,msgs_per_cs_std,wait_mean,wait_max,sync_delay_mean,violations,msgs_per_cs_theory,sync_delay_t,sync_delay_t_theory,wait_p99,latency_mean,engine,verdict,by_type";

fn opt(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.3}")).unwrap_or_default()
}

impl Row {
    fn new(exp: &Experiment, verdict: Verdict, metrics: Metrics) -> Self {
        Row {
            exp: exp.clone(),
            verdict,
            metrics,
        }
    }

    /// Mean messages per CS.
    pub fn msgs_per_cs(&self) -> Option<f64> {
        self.metrics.msgs_per_cs_mean_std().map(|m| m.0)
    }

    /// Mean response time (ticks).
    pub fn wait_mean(&self) -> Option<f64> {
        self.metrics.mean_wait()
    }

    /// The spec's messages per CS for this setup.
    pub fn theory(&self) -> Option<f64> {
        self.exp
            .algorithm
            .theory_msgs_per_cs(self.exp.nodes, self.exp.requesters.load())
    }

    /// The row, as CSV (see [`CSV_HEADER`]); `by_type` adds the per-type messages per CS.
    pub fn csv(&self, by_type: bool) -> String {
        let e = &self.exp;
        let m = &self.metrics;
        let (mean, std) = m
            .msgs_per_cs_mean_std()
            .map_or((None, None), |(a, b)| (Some(a), Some(b)));
        let t = latency_mean(&e.latency);
        let sync = m.mean_sync_delay();
        let violations = u8::from(matches!(
            self.verdict,
            Verdict::Violation(_) | Verdict::NodeError { .. }
        ));
        let mut types = String::new();
        if by_type {
            let counted = m.per_cs_messages.len().max(m.cs_entries as usize).max(1) as f64;
            for (k, v) in &m.messages_by_kind {
                let _ = write!(
                    types,
                    "{}{k}={:.3}",
                    if types.is_empty() { "" } else { ";" },
                    *v as f64 / counted
                );
            }
        }
        let verdict = match &self.verdict {
            Verdict::Ok => "ok".to_owned(),
            Verdict::Violation(_) => "violation".to_owned(),
            Verdict::Deadlock { .. } => "deadlock".to_owned(),
            Verdict::Stall { .. } => "stall".to_owned(),
            Verdict::NodeError { .. } => "node-error".to_owned(),
        };
        format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3},{},{},{}",
            e.algorithm,
            e.algorithm
                .quorum_size(e.nodes)
                .map(|k| k.to_string())
                .unwrap_or_default(),
            e.nodes,
            e.requesters.name(),
            e.drops.len(),
            e.seed,
            m.cs_entries,
            opt(mean),
            opt(std),
            opt(m.mean_wait()),
            m.wait_times
                .iter()
                .max()
                .map(u64::to_string)
                .unwrap_or_default(),
            opt(sync),
            violations,
            opt(self.theory()),
            opt(sync.filter(|_| t > 0.0).map(|s| s / t)),
            opt(e.algorithm.theory_sync_delay(e.nodes)),
            m.wait_percentile(99.0)
                .map(|x| x.to_string())
                .unwrap_or_default(),
            t,
            match e.engine {
                Engine::StateMachines => "state-machines",
                Engine::Stages => "stages",
            },
            verdict,
            types,
        )
    }
}

/// The group sizes of the sweep.
pub const SWEEP_NODES: [usize; 6] = [4, 8, 16, 32, 64, 128];

/// Runs `base` for every correct algorithm × [`SWEEP_NODES`] × {one, all} × `seeds`, calling
/// `progress` after each run.
pub fn sweep(
    base: &Experiment,
    seeds: u64,
    mut progress: impl FnMut(&Row),
) -> Result<Vec<Row>, MutexError> {
    let mut rows = Vec::new();
    for algorithm in Algorithm::correct() {
        for requesters in [Requesters::One, Requesters::All] {
            for &nodes in &SWEEP_NODES {
                for s in 0..seeds {
                    let mut e = base.clone();
                    e.algorithm = algorithm;
                    e.nodes = nodes;
                    e.requesters = requesters;
                    e.seed = base.seed + s;
                    let row = e.run()?;
                    progress(&row);
                    rows.push(row);
                }
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributions_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_latency("7").unwrap(), Latency::Constant(7));
        assert_eq!(parse_latency("const:7").unwrap(), Latency::Constant(7));
        assert_eq!(
            parse_latency("uniform:1:9").unwrap(),
            Latency::Uniform { min: 1, max: 9 }
        );
        assert_eq!(
            parse_latency("exp:2:5.5").unwrap(),
            Latency::Exponential { min: 2, mean: 5.5 }
        );
        for bad in ["", "uniform:9:1", "exp:-1", "gauss:1", "const:x"] {
            assert!(parse_latency(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_row_has_every_column_and_matches_the_theory_for_ra() {
        let mut e = Experiment::new(Algorithm::RicartAgrawala, 5, Requesters::One);
        e.cs = 4;
        let row = e.run().unwrap();
        let line = row.csv(true);
        assert_eq!(
            line.split(',').count(),
            CSV_HEADER.split(',').count(),
            "{line}"
        );
        assert_eq!(row.msgs_per_cs(), Some(8.0));
        assert_eq!(row.theory(), Some(8.0));
        assert!(
            line.starts_with("ricart-agrawala,,5,one,0,1,20,8.000,0.000,"),
            "{line}"
        );
        assert!(line.ends_with("reply=4.000;request=4.000"), "{line}");
    }
}
