//! Multi node stages ([`super::stage`]) under leda-core's deterministic simulated executor, with
//! the [`MultiChecker`] watching.
//!
//! [`MultiStageSim`] builds the stage graph of a group (one cluster per process: its multi node
//! stage and a workload client), maps cluster `i` to simulated process `node<i>:1`, and runs it
//! with [`leda_core::sim::Simulation`]: virtual time, a seeded network model, and optionally
//! [`Clusters`] whose inter-cluster links take their own (larger) latency. A [`MultiMonitor`],
//! the [`MultiObserver`] of every stage, feeds the checker: per-instance exclusion, grants
//! matching requests, fences increasing per instance, and for token algorithms token
//! uniqueness per instance (held plus in flight is exactly one after every handler). One
//! virtual tick is one microsecond.
//!
//! The workload is the one of the state-machine driver ([`MultiWorkload`]): request sizes
//! uniform in `[1, size_req]`, types drawn without replacement, counts uniform in `[1, k]`, CS
//! time rising with the request size.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leda_core::prelude::*;
use leda_core::sim::{Latency as NetLatency, NetModel, Simulation};

use crate::error::MutexError;
use crate::node::NodeId;
use crate::rng::SplitMix64;
use crate::stage::connect_peers;
use crate::stage_sim::{StageSim, sim_addr};

use super::checker::{MultiChecker, MultiVerdict, MultiViolation};
use super::model::MultiRequest;
use super::sim::{Clusters, MultiWorkload};
use super::stage::{
    MultiAlgorithm, MultiNodeEvent, MultiNodeSpec, MultiObserver, NamedSpace, multi_node_stage,
};

/// Measurements of a stage run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MultiStageStats {
    /// Requests granted.
    pub grants: u64,
    /// Messages sent.
    pub messages: u64,
    /// Messages sent, per kind.
    pub messages_by_kind: BTreeMap<&'static str, u64>,
    /// Token messages sent.
    pub token_messages: u64,
    /// Messages between processes of one cluster (all of them without clusters).
    pub messages_local: u64,
    /// Messages between clusters.
    pub messages_remote: u64,
    /// Sum of the waiting times (request to grant), µs.
    pub wait_total: u64,
    /// Withdrawn or ordinary releases seen.
    pub releases: u64,
}

#[derive(Debug)]
struct MonitorState {
    checker: MultiChecker,
    /// Per process, per flat instance: holds the token (token algorithms).
    tokens: Vec<Vec<bool>>,
    inflight: Vec<usize>,
    token_based: bool,
    requested_at: Vec<u64>,
    /// Cluster of each process (empty: one cluster).
    cluster_of: Vec<usize>,
    stats: MultiStageStats,
    verdict: Option<MultiVerdict>,
}

/// The checker fed by multi node stages.
#[derive(Debug)]
pub struct MultiMonitor {
    space: NamedSpace,
    state: Mutex<MonitorState>,
}

impl MultiMonitor {
    /// A monitor for `n` processes of `algorithm` over `space`; the initial token placement is
    /// read from freshly built nodes.
    pub fn new(algorithm: MultiAlgorithm, n: usize, space: NamedSpace) -> Result<Self, MutexError> {
        let total = space.space().total_instances();
        let mut tokens = Vec::with_capacity(n);
        let mut token_based = false;
        for i in 0..n {
            let node = algorithm.node(i, n, space.space())?;
            token_based = node.token_based();
            tokens.push((0..total).map(|t| node.holds_token(t)).collect());
        }
        Ok(Self {
            state: Mutex::new(MonitorState {
                checker: MultiChecker::new(n, space.space().clone()),
                tokens,
                inflight: vec![0; total],
                token_based,
                requested_at: vec![0; n],
                cluster_of: Vec::new(),
                stats: MultiStageStats::default(),
                verdict: None,
            }),
            space,
        })
    }

    /// Counts messages between processes of different clusters (`of[p]`: cluster of `p`) as
    /// remote.
    pub fn with_clusters(self, of: &[usize]) -> Self {
        self.lock().cluster_of = of.to_vec();
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MonitorState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first violation or node error seen, if any.
    pub fn failure(&self) -> Option<MultiVerdict> {
        self.lock().verdict.clone()
    }

    /// The measurements so far.
    pub fn stats(&self) -> MultiStageStats {
        self.lock().stats.clone()
    }

    /// Processes with a request pending now.
    pub fn waiting(&self) -> Vec<NodeId> {
        self.lock().checker.waiting()
    }
}

impl MultiObserver for MultiMonitor {
    fn observe(&self, time: f64, node: NodeId, ev: MultiNodeEvent<'_>) {
        let t = (time * 1e6).round() as u64;
        let mut guard = self.lock();
        let s = &mut *guard;
        if s.verdict.is_some() {
            return;
        }
        match ev {
            MultiNodeEvent::Request(req) => {
                s.checker.on_request(node, req);
                if let Some(r) = s.requested_at.get_mut(node) {
                    *r = t;
                }
            }
            MultiNodeEvent::Grant(holds) => {
                if let Err(v) = s.checker.on_grant(t, node, holds) {
                    s.verdict = Some(MultiVerdict::Violation(v));
                    return;
                }
                s.stats.grants += 1;
                let since = s.requested_at.get(node).copied().unwrap_or(t);
                s.stats.wait_total += t.saturating_sub(since);
            }
            MultiNodeEvent::Release => {
                s.stats.releases += 1;
                if let Err(v) = s.checker.on_release(t, node) {
                    s.verdict = Some(MultiVerdict::Violation(v));
                }
            }
            MultiNodeEvent::Send { to, kind, token } => {
                s.stats.messages += 1;
                let remote = match (s.cluster_of.get(node), s.cluster_of.get(to)) {
                    (Some(a), Some(b)) => a != b,
                    _ => false,
                };
                if remote {
                    s.stats.messages_remote += 1;
                } else {
                    s.stats.messages_local += 1;
                }
                *s.stats.messages_by_kind.entry(kind).or_insert(0) += 1;
                if let Some(f) = token {
                    s.stats.token_messages += 1;
                    if let Some(c) = s.inflight.get_mut(f) {
                        *c += 1;
                    }
                    if let Some(h) = s.tokens.get_mut(node).and_then(|v| v.get_mut(f)) {
                        *h = false;
                    }
                }
            }
            MultiNodeEvent::Deliver { token, .. } => {
                if let Some(c) = token.and_then(|f| s.inflight.get_mut(f)) {
                    *c = c.saturating_sub(1);
                }
            }
            MultiNodeEvent::Tokens(held) => {
                if let Some(v) = s.tokens.get_mut(node) {
                    v.clear();
                    v.extend_from_slice(held);
                }
                if s.token_based {
                    for (f, &inflight) in s.inflight.iter().enumerate() {
                        let count = inflight
                            + s.tokens
                                .iter()
                                .filter(|p| p.get(f).copied().unwrap_or(false))
                                .count();
                        if count != 1 {
                            let (resource, instance) =
                                self.space.space().unflat(f).unwrap_or((f, 0));
                            s.verdict = Some(MultiVerdict::Violation(MultiViolation::TokenCount {
                                time: t,
                                resource,
                                instance,
                                count,
                            }));
                            return;
                        }
                    }
                }
            }
            MultiNodeEvent::Error(e) => {
                s.verdict = Some(MultiVerdict::NodeError {
                    time: t,
                    error: e.clone(),
                });
            }
        }
    }
}

/// A simulated run of a group's multi node stages.
#[derive(Debug, Clone)]
pub struct MultiStageSim {
    /// The algorithm.
    pub algorithm: MultiAlgorithm,
    /// Group size.
    pub n: usize,
    /// The resources.
    pub resources: NamedSpace,
    /// Seed of the network model and of the clients.
    pub seed: u64,
    /// Network model (latency in virtual microseconds); inside a cluster when there are
    /// clusters.
    pub net: NetModel,
    /// Optional clusters: links between processes of different clusters draw from
    /// `remote` (ticks = µs). The grid-aware algorithm is told their number and assumes the
    /// even layout of [`Clusters::even`].
    pub clusters: Option<Clusters>,
    /// Client workload (times in ticks = µs).
    pub workload: MultiWorkload,
    /// Virtual-time bound in µs: reaching it with requests unserved is a stall.
    pub max_time: u64,
}

/// The outcome of a [`MultiStageSim`] run.
#[derive(Debug)]
pub struct MultiStageReport {
    /// The checker's verdict.
    pub verdict: MultiVerdict,
    /// Measurements.
    pub stats: MultiStageStats,
    /// The simulator's trace.
    pub trace: Vec<String>,
    /// Virtual time at the end, µs.
    pub end_time: u64,
}

impl MultiStageSim {
    /// `n` processes of `algorithm` over `resources`, the default workload, 1–10 µs uniform
    /// FIFO links.
    pub fn new(algorithm: MultiAlgorithm, n: usize, resources: NamedSpace, seed: u64) -> Self {
        Self {
            algorithm,
            n,
            resources,
            seed,
            net: NetModel {
                latency: NetLatency::Uniform(Duration::from_micros(1), Duration::from_micros(10)),
                fifo: true,
                ..NetModel::default()
            },
            clusters: None,
            workload: MultiWorkload::default(),
            max_time: 60_000_000,
        }
    }

    /// Builds the graph, runs it under the simulated executor, and judges it.
    pub fn run(&self) -> Result<MultiStageReport, MutexError> {
        let n = self.n;
        if self.algorithm.requires_fifo() && !self.net.fifo {
            return Err(MutexError::Config(format!(
                "{} requires FIFO links",
                self.algorithm
            )));
        }
        if let Some(c) = &self.clusters
            && c.of.len() != n
        {
            return Err(MutexError::Config(format!(
                "cluster map has {} entries for {n} processes",
                c.of.len()
            )));
        }
        // The grid-aware algorithm assumes the even layout of `Clusters::even`.
        let n_clusters = self
            .clusters
            .as_ref()
            .and_then(|c| c.of.iter().max())
            .map_or(1, |&c| c + 1);
        let mut monitor = MultiMonitor::new(self.algorithm, n, self.resources.clone())?;
        if let Some(c) = &self.clusters {
            monitor = monitor.with_clusters(&c.of);
        }
        let monitor = Arc::new(monitor);
        let remaining = Arc::new(AtomicUsize::new(n * self.workload.requests_per_node));
        let mut g = Graph::new(format!("multi-{}", self.algorithm));
        let mut nodes = Vec::with_capacity(n);
        let mut clusters = Vec::with_capacity(n);
        for i in 0..n {
            let node = multi_node_stage(MultiNodeSpec {
                algorithm: self.algorithm,
                id: i,
                n,
                resources: self.resources.clone(),
                clusters: n_clusters,
                observer: Some(monitor.clone()),
            })?;
            let client = multi_client_stage(
                i,
                self.resources.clone(),
                self.workload.clone(),
                self.seed,
                remaining.clone(),
            );
            g.connect(&client, "mutex", &node).local();
            g.connect(&node, "grant", &client).local();
            clusters.push(Cluster::of([&node, &client]));
            nodes.push(node);
        }
        connect_peers(&mut g, &nodes);
        let addrs: Vec<String> = (0..n).map(sim_addr).collect();
        let graph_err = |e: leda_core::graph::GraphError| MutexError::Config(e.to_string());
        g.part(clusters).map_err(graph_err)?;
        g.map(addrs.iter().map(String::as_str)).map_err(graph_err)?;
        let mut sim = Simulation::new(self.seed)
            .net(self.net.clone())
            .until(Duration::from_micros(self.max_time));
        if let Some(c) = &self.clusters {
            let remote = NetModel {
                latency: StageSim::net_latency(&c.remote),
                ..self.net.clone()
            };
            for i in 0..n {
                for j in 0..n {
                    if c.of[i] != c.of[j] {
                        sim = sim.link(&addrs[i], &addrs[j], remote.clone());
                    }
                }
            }
        }
        let report = sim
            .run(&g)
            .map_err(|e| MutexError::Config(format!("simulation failed: {e}")))?;
        let end_time = report.time.as_micros() as u64;
        let verdict = if let Some(v) = monitor.failure() {
            v
        } else if remaining.load(Ordering::SeqCst) == 0 {
            MultiVerdict::Ok
        } else if let Some(bound) = crate::stage_sim::bound_reached(&report.end) {
            MultiVerdict::Stall {
                time: end_time,
                waiting: monitor.waiting(),
                bound,
            }
        } else {
            MultiVerdict::Deadlock {
                time: end_time,
                waiting: monitor.waiting(),
            }
        };
        Ok(MultiStageReport {
            verdict,
            stats: monitor.stats(),
            trace: report.trace,
            end_time,
        })
    }
}

/// Draws a request as the state-machine driver does: size uniform in `[1, size_req]`, types
/// without replacement, count per type uniform in `[1, k]`.
fn draw_request(
    rng: &mut SplitMix64,
    space: &NamedSpace,
    size_req: usize,
) -> Result<MultiRequest, MutexError> {
    let s = space.space();
    let m = s.types();
    let size = rng.range_inclusive(1, size_req.clamp(1, m) as u64) as usize;
    let mut types: Vec<usize> = (0..m).collect();
    for i in 0..size {
        let j = i + rng.index(m - i);
        types.swap(i, j);
    }
    let items = types[..size]
        .iter()
        .map(|&r| (r, rng.range_inclusive(1, u64::from(s.capacity(r))) as u32))
        .collect();
    MultiRequest::new(items, s)
}

/// A workload client of process `id` (stage `client<id>`, serial, autostarted): it asks its
/// multi node stage (port `mutex`) for drawn resource sets, holds each grant for the CS time,
/// releases, and once the release is confirmed counts down `remaining` (shared by all clients
/// of the run); the client that brings it to zero quits the run.
pub fn multi_client_stage(
    id: NodeId,
    space: NamedSpace,
    work: MultiWorkload,
    seed: u64,
    remaining: Arc<AtomicUsize>,
) -> Stage {
    struct Client {
        space: NamedSpace,
        work: MultiWorkload,
        rng: SplitMix64,
        left: usize,
        size: usize,
        remaining: Arc<AtomicUsize>,
    }
    impl Client {
        fn ask(&mut self, ctx: &mut Ctx) -> HandlerResult {
            let think = Duration::from_micros(self.work.think_time.sample(&mut self.rng));
            let req = draw_request(&mut self.rng, &self.space, self.work.size_req)?;
            self.size = req.size();
            let ev = Event::new()
                .with("request")
                .with(self.space.request_value(&req));
            let mut ctx2 = ctx.clone();
            ctx.wait(async move {
                ctx2.sleep(think).await;
                ctx2.send("mutex", ev)?;
                Ok(())
            });
            Ok(())
        }
    }
    let seed = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(id as u64 + 1);
    Stage::stateful(
        format!("client{id}"),
        move |_: &Attrs| -> Result<Client, BoxError> {
            Ok(Client {
                space: space.clone(),
                work: work.clone(),
                rng: SplitMix64::new(seed),
                left: work.requests_per_node,
                size: 0,
                remaining: remaining.clone(),
            })
        },
        move |c: &mut Client, ev: Event, ctx: &mut Ctx| {
            let tag: &str = ev.get(0)?;
            match tag {
                "start" if c.left > 0 => c.ask(ctx)?,
                "start" => {}
                "multi-grant" => {
                    let cs = c.work.cs_duration.sample(&mut c.rng)
                        + c.work.cs_per_resource * c.size as u64;
                    let mut ctx2 = ctx.clone();
                    ctx.wait(async move {
                        ctx2.sleep(Duration::from_micros(cs)).await;
                        ctx2.send("mutex", "release")?;
                        Ok(())
                    });
                }
                "multi-released" => {
                    c.left = c.left.saturating_sub(1);
                    if c.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
                        ctx.quit("done");
                    } else if c.left > 0 {
                        c.ask(ctx)?;
                    }
                }
                "multi-refused" => {
                    let why: String = ev.get(1).unwrap_or_default();
                    return Err(format!("client {id}: request refused: {why}").into());
                }
                other => return Err(format!("client {id}: unexpected event {other:?}").into()),
            }
            Ok(())
        },
    )
    .serial()
    .autostart("start")
}

/// Convenience: `m` single-instance resources named `r0..r{m-1}`, or with `capacities` given,
/// types `r<i>` with those numbers of instances.
pub fn named_space(capacities: &[u32]) -> Result<NamedSpace, MutexError> {
    let items: Vec<(String, u32)> = capacities
        .iter()
        .enumerate()
        .map(|(i, &k)| (format!("r{i}"), k))
        .collect();
    NamedSpace::new(&items)
}
