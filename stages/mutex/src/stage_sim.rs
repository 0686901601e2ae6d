//! The node stages ([`crate::stage`]) under leda-core's deterministic simulated executor, with
//! the checker watching.
//!
//! [`StageSim`] builds the stage graph of a group (one cluster per node: its node stage and a
//! workload client), maps cluster `i` to simulated process `node<i>:1`, and runs it with
//! [`leda_core::sim::Simulation`]: virtual time, a seeded network model (latency distribution,
//! FIFO or not, loss, duplication, delay spikes) and process crashes. A [`Monitor`], the
//! [`Observer`] of every node stage, feeds the same [`Checker`] as the state-machine simulator
//! and collects the same [`Metrics`]. One virtual tick is one microsecond.
//!
//! With [`StageSim::detector`] set, every node also runs the VCube failure detector's stages
//! ([`crate::ft_quorum::detector`]), which send crash notices into the node stages: the run
//! of a crash-tolerant algorithm then goes on after crashes, and only the clients of nodes that
//! do not crash count towards the end of the run. The checker learns of each crash at its
//! virtual time (a holder that crashes inside the CS leaves it).
//!
//! The verdict: a safety violation as soon as one happens; otherwise [`Verdict::Ok`] when every
//! client got all its critical sections, [`Verdict::Stall`] when the time bound was reached
//! first, and [`Verdict::Deadlock`] when nothing was left to happen.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leda_core::prelude::*;
use leda_core::sim::{Latency as NetLatency, NetModel, SimEnd, Simulation};

use crate::algorithm::Algorithm;
use crate::checker::{Checker, Verdict};
use crate::error::MutexError;
use crate::ft_quorum::detector::{
    DetectorConfig, DetectorSpec, Evidence, NoticeObserver, connect_detectors, wire_detector,
};
use crate::metrics::Metrics;
use crate::node::NodeId;
use crate::sim::Latency;
use crate::stage::{
    ClientWorkload, NodeEvent, NodeSpec, Observer, client_stage, connect_peers, node_stage,
};

/// The resource the simulated clients contend for.
pub const SIM_RESOURCE: &str = "r";

/// The simulated process address of node `i` (`node<i>:1`).
pub fn sim_addr(i: NodeId) -> String {
    format!("node{i}:1")
}

/// Checker and metrics fed by node stages.
#[derive(Debug)]
pub struct Monitor {
    state: Mutex<MonitorState>,
}

#[derive(Debug)]
struct MonitorState {
    checker: Checker,
    metrics: Metrics,
    waiting_since: Vec<Option<u64>>,
    holds: Vec<bool>,
    inflight_tokens: i64,
    token_based: bool,
    tokens_may_vanish: bool,
    pending_sync: Option<u64>,
    verdict: Option<Verdict>,
    /// Crashes not yet told to the checker: (virtual time µs, node), latest first.
    crashes: Vec<(u64, NodeId)>,
    /// Crash notices of the detector stages: (time µs, observer, crashed).
    notices: Vec<(u64, NodeId, NodeId)>,
}

impl Monitor {
    /// A monitor for `n` nodes of `algorithm`. `lossy` tells whether the network may lose
    /// messages (or processes crash), in which case a vanished token is not a violation.
    pub fn new(algorithm: Algorithm, n: usize, lossy: bool) -> Self {
        Monitor {
            state: Mutex::new(MonitorState {
                checker: Checker::new(),
                metrics: Metrics::default(),
                waiting_since: vec![None; n],
                holds: vec![false; n],
                inflight_tokens: 0,
                token_based: algorithm.token_based(),
                tokens_may_vanish: lossy,
                pending_sync: None,
                verdict: None,
                crashes: Vec::new(),
                notices: Vec::new(),
            }),
        }
    }

    /// Tells the checker of each crash (node, virtual time µs) once the run reaches its time.
    pub fn with_crashes(self, crashes: &[(NodeId, u64)]) -> Self {
        {
            let mut s = self.lock();
            s.crashes = crashes.iter().map(|&(node, at)| (at, node)).collect();
            s.crashes.sort_unstable_by(|a, b| b.cmp(a));
        }
        self
    }

    /// The detector stages' crash notices so far: (virtual time µs, observer, crashed).
    pub fn notices(&self) -> Vec<(u64, NodeId, NodeId)> {
        self.lock().notices.clone()
    }

    /// Turns the token-uniqueness check off (for multi-threaded runs, see
    /// [`StageSim::run_in_process`]).
    pub fn without_token_check(self) -> Self {
        self.lock().token_based = false;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MonitorState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first violation or node error seen, if any.
    pub fn failure(&self) -> Option<Verdict> {
        self.lock().verdict.clone()
    }

    /// The metrics so far.
    pub fn metrics(&self) -> Metrics {
        self.lock().metrics.clone()
    }

    /// Nodes waiting for the CS now.
    pub fn waiting(&self) -> Vec<NodeId> {
        let s = self.lock();
        (0..s.waiting_since.len())
            .filter(|&i| s.waiting_since[i].is_some())
            .collect()
    }
}

impl Observer for Monitor {
    fn observe(&self, time: f64, node: NodeId, _resource: &str, ev: NodeEvent<'_>) {
        let t = (time * 1e6).round() as u64;
        let mut s = self.lock();
        if s.verdict.is_some() {
            return;
        }
        let s = &mut *s;
        while s.crashes.last().is_some_and(|&(at, _)| at < t) {
            if let Some((_, crashed)) = s.crashes.pop() {
                s.checker.on_crash(crashed);
            }
        }
        match ev {
            NodeEvent::Request => {
                if let Some(w) = s.waiting_since.get_mut(node) {
                    *w = Some(t);
                }
            }
            NodeEvent::Grant(fence) => {
                let since = s.waiting_since.get_mut(node).and_then(Option::take);
                if let Err(v) = s.checker.on_grant(t, node, fence, since.is_some()) {
                    s.verdict = Some(Verdict::Violation(v));
                    return;
                }
                s.metrics.cs_entries += 1;
                s.metrics.fences.push(fence);
                s.metrics.messages_at_grant.push(s.metrics.messages_total);
                if let Some(since) = since {
                    s.metrics.wait_times.push(t - since.min(t));
                }
                if let Some(r) = s.pending_sync.take() {
                    s.metrics.sync_delays.push(t - r.min(t));
                }
            }
            NodeEvent::Release => {
                s.checker.on_release(node);
                s.pending_sync = s.waiting_since.iter().any(Option::is_some).then_some(t);
            }
            NodeEvent::Send { kind, token, .. } => {
                *s.metrics.messages_by_kind.entry(kind).or_insert(0) += 1;
                s.metrics.messages_total += 1;
                if token {
                    // Sending the token gives it away (the node reports its own state right
                    // after; on a multi-threaded runtime the receiver may be observed first).
                    s.inflight_tokens += 1;
                    if let Some(h) = s.holds.get_mut(node) {
                        *h = false;
                    }
                }
            }
            NodeEvent::Local { kind } => {
                *s.metrics.messages_by_kind.entry(kind).or_insert(0) += 1;
                s.metrics.messages_total += 1;
                s.metrics.self_messages += 1;
            }
            NodeEvent::Deliver { token, .. } => {
                s.metrics.events += 1;
                if token {
                    s.inflight_tokens -= 1;
                }
            }
            NodeEvent::Holds(h) => {
                if let Some(x) = s.holds.get_mut(node) {
                    *x = h;
                }
                if s.token_based {
                    let held = s.holds.iter().filter(|&&h| h).count();
                    let count = held + s.inflight_tokens.max(0) as usize;
                    let dropped = u64::from(s.tokens_may_vanish);
                    if let Err(v) = s.checker.check_tokens(t, count, dropped) {
                        s.verdict = Some(Verdict::Violation(v));
                    }
                }
            }
            NodeEvent::Error(e) => {
                s.verdict = Some(Verdict::NodeError {
                    time: t,
                    node,
                    error: e.clone(),
                });
            }
        }
    }
}

impl NoticeObserver for Monitor {
    fn crashed(&self, time: f64, observer: NodeId, crashed: NodeId, _evidence: Evidence) {
        let t = (time * 1e6).round() as u64;
        self.lock().notices.push((t, observer, crashed));
    }
}

/// A simulated run of a group's stage graph.
#[derive(Debug, Clone)]
pub struct StageSim {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Group size.
    pub n: usize,
    /// Seed of the network model and of the clients.
    pub seed: u64,
    /// Network model (latency in virtual microseconds).
    pub net: NetModel,
    /// The nodes whose clients request, `None` for all.
    pub requesters: Option<Vec<NodeId>>,
    /// Critical sections per requesting client.
    pub requests: usize,
    /// Time in the CS (ticks = µs).
    pub cs_time: Latency,
    /// Think time before each request (ticks = µs).
    pub think_time: Latency,
    /// Crashes: (node, virtual time in µs).
    pub crashes: Vec<(NodeId, u64)>,
    /// Virtual-time bound in µs: reaching it with requests unserved is a [`Verdict::Stall`].
    pub max_time: u64,
    /// Run the VCube failure detector's stages beside every node (period and timeout in
    /// virtual time, 1 µs per tick), for crash-tolerant algorithms. With it, the clients of
    /// crashing nodes do not count towards the end of the run.
    pub detector: Option<DetectorConfig>,
}

/// The outcome of a [`StageSim`] run.
#[derive(Debug)]
pub struct StageReport {
    /// The checker's verdict.
    pub verdict: Verdict,
    /// Measurements (times in µs).
    pub metrics: Metrics,
    /// The simulator's trace: one line per send, delivery, loss, duplication and crash.
    pub trace: Vec<String>,
    /// Virtual time at the end, µs.
    pub end_time: u64,
    /// The detector stages' crash notices: (virtual time µs, observer, crashed), in order
    /// (empty without [`StageSim::detector`]).
    pub notices: Vec<(u64, NodeId, NodeId)>,
}

impl StageSim {
    /// `n` nodes of `algorithm`, every node requesting 3 times, 1–10 µs uniform FIFO links.
    pub fn new(algorithm: Algorithm, n: usize, seed: u64) -> Self {
        StageSim {
            algorithm,
            n,
            seed,
            net: NetModel {
                latency: NetLatency::Uniform(Duration::from_micros(1), Duration::from_micros(10)),
                fifo: true,
                ..NetModel::default()
            },
            requesters: None,
            requests: 3,
            cs_time: Latency::Constant(5),
            think_time: Latency::Exponential { min: 0, mean: 20.0 },
            crashes: Vec::new(),
            max_time: 10_000_000,
            detector: None,
        }
    }

    /// Converts the state-machine simulator's latency (ticks) to the network model's.
    pub fn net_latency(latency: &Latency) -> NetLatency {
        match *latency {
            Latency::Constant(c) => NetLatency::Constant(Duration::from_micros(c)),
            Latency::Uniform { min, max } => {
                NetLatency::Uniform(Duration::from_micros(min), Duration::from_micros(max))
            }
            // The network model's exponential has no minimum; keep the mean.
            Latency::Exponential { min, mean } => {
                NetLatency::Exponential(Duration::from_micros(min + mean.round() as u64))
            }
        }
    }

    fn build(&self, monitor: &Arc<Monitor>, mapped: bool) -> Result<Built, MutexError> {
        let n = self.n;
        let requesting: Vec<bool> = (0..n)
            .map(|i| self.requesters.as_ref().is_none_or(|r| r.contains(&i)))
            .collect();
        // With a detector the run goes on after crashes: only nodes that do not crash count.
        let counts = |i: NodeId| self.detector.is_none() || !self.crashes.iter().any(|c| c.0 == i);
        let total = (0..n).filter(|&i| requesting[i] && counts(i)).count() * self.requests;
        let remaining = Arc::new(AtomicUsize::new(total));
        let mut detectors = Vec::new();
        let mut g = Graph::new(format!("mutex-{}", self.algorithm));
        let mut nodes = Vec::with_capacity(n);
        let mut clusters = Vec::with_capacity(n);
        for (i, &req) in requesting.iter().enumerate() {
            let node = node_stage(NodeSpec {
                algorithm: self.algorithm,
                id: i,
                n,
                resources: vec![SIM_RESOURCE.to_owned()],
                observer: Some(monitor.clone()),
            })?;
            let client = client_stage(
                i,
                ClientWorkload {
                    resource: SIM_RESOURCE.to_owned(),
                    requests: if req { self.requests } else { 0 },
                    cs_time: self.cs_time.clone(),
                    think_time: self.think_time.clone(),
                    seed: self.seed,
                },
                if counts(i) {
                    remaining.clone()
                } else {
                    Arc::new(AtomicUsize::new(usize::MAX))
                },
            );
            g.connect(&client, "mutex", &node).local();
            g.connect(&node, "grant", &client).local();
            let mut cluster = Cluster::of([&node, &client]);
            if let Some(config) = self.detector {
                let spec = DetectorSpec {
                    id: i,
                    n,
                    config,
                    observer: Some(monitor.clone()),
                };
                let (detector, timer) = wire_detector(&mut g, spec, &node)
                    .map_err(|e| MutexError::Config(e.to_string()))?;
                cluster.insert(&detector);
                cluster.insert(&timer);
                detectors.push(detector);
            }
            clusters.push(cluster);
            nodes.push(node);
        }
        connect_peers(&mut g, &nodes);
        connect_detectors(&mut g, &detectors);
        if mapped {
            let addrs: Vec<String> = (0..n).map(sim_addr).collect();
            let graph_err = |e: leda_core::graph::GraphError| MutexError::Config(e.to_string());
            g.part(clusters).map_err(graph_err)?;
            g.map(addrs.iter().map(String::as_str)).map_err(graph_err)?;
        }
        Ok(Built {
            graph: g,
            remaining,
        })
    }

    /// The verdict of a run that ended at `end_time`, by reaching `bound` if it did.
    fn judge(
        &self,
        monitor: &Monitor,
        remaining: &AtomicUsize,
        end_time: u64,
        bound: Option<&'static str>,
    ) -> Verdict {
        if let Some(v) = monitor.failure() {
            v
        } else if remaining.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            Verdict::Ok
        } else if let Some(bound) = bound {
            Verdict::Stall {
                time: end_time,
                waiting: monitor.waiting(),
                bound,
            }
        } else {
            Verdict::Deadlock {
                time: end_time,
                waiting: monitor.waiting(),
            }
        }
    }

    /// Runs the same graph **in one process** on leda-core's real runtime (worker threads, real
    /// time; the network model and crashes do not apply; CS and think times are real
    /// microseconds). `timeout` bounds the run; reaching it is a [`Verdict::Stall`].
    pub fn run_in_process(
        &self,
        threads: usize,
        timeout: Duration,
    ) -> Result<StageReport, MutexError> {
        // Handlers run on several threads here, so a token in hand-over can be observed
        // neither held nor in flight (or both) for an instant: token uniqueness is checked
        // under the simulated executor only; exclusion and fencing are checked here too.
        let monitor = Arc::new(Monitor::new(self.algorithm, self.n, false).without_token_check());
        let built = self.build(&monitor, false)?;
        let started = std::time::Instant::now();
        built
            .graph
            .run(Run::default().threads(threads).timeout(timeout))
            .map_err(|e| MutexError::Config(format!("run failed: {e}")))?;
        let elapsed = started.elapsed().as_micros() as u64;
        let mut metrics = monitor.metrics();
        metrics.end_time = elapsed;
        let verdict = match self.judge(&monitor, &built.remaining, 0, None) {
            Verdict::Deadlock { waiting, .. } => Verdict::Stall {
                time: elapsed,
                waiting,
                bound: "timeout",
            },
            v => v,
        };
        Ok(StageReport {
            verdict,
            metrics,
            trace: Vec::new(),
            end_time: elapsed,
            notices: monitor.notices(),
        })
    }

    /// Builds the graph (one cluster per node, mapped to simulated processes `node<i>`), runs it
    /// under leda-core's simulated executor, and judges it.
    pub fn run(&self) -> Result<StageReport, MutexError> {
        let lossy = self.net.loss > 0.0 || !self.crashes.is_empty();
        let monitor =
            Arc::new(Monitor::new(self.algorithm, self.n, lossy).with_crashes(&self.crashes));
        let Built {
            graph: g,
            remaining,
        } = self.build(&monitor, true)?;
        let mut sim = Simulation::new(self.seed)
            .net(self.net.clone())
            .until(Duration::from_micros(self.max_time));
        for &(node, at) in &self.crashes {
            sim = sim.crash(&sim_addr(node), Duration::from_micros(at));
        }
        let report = sim
            .run(&g)
            .map_err(|e| MutexError::Config(format!("simulation failed: {e}")))?;
        let end_time = report.time.as_micros() as u64;
        let mut metrics = monitor.metrics();
        metrics.end_time = end_time;
        let verdict = self.judge(&monitor, &remaining, end_time, bound_reached(&report.end));
        Ok(StageReport {
            verdict,
            metrics,
            trace: report.trace,
            end_time,
            notices: monitor.notices(),
        })
    }
}

/// The bound a simulation reached, if it ended on one (a stall, not a deadlock).
pub(crate) fn bound_reached(end: &SimEnd) -> Option<&'static str> {
    match end {
        SimEnd::Until => Some("virtual-time bound"),
        SimEnd::StepBudget { .. } => Some("step budget"),
        SimEnd::ZeroTimeLoop { .. } => Some("zero-time loop (work that takes no virtual time)"),
        SimEnd::Quit { .. } | SimEnd::Idle | SimEnd::Stuck { .. } => None,
    }
}

struct Built {
    graph: Graph,
    remaining: Arc<AtomicUsize>,
}
