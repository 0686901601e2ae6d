//! A deterministic multi-resource simulation driver.
//!
//! `n` processes, each running a client loop (think, request, critical section, release) for
//! [`MultiWorkload::requests_per_node`] requests, over a [`MultiSystem`]. Request sizes are
//! uniform in `[1, size_req]`, the resource types drawn uniformly without replacement from the
//! `m` types, and for a type with `k` instances the count is uniform in `[1, k]`. CS time is a
//! [`Latency`] draw plus `cs_per_resource` per type requested (CS times rising with request
//! size, as in \[LJ\]). Message latency is a [`Latency`] draw per message, over FIFO or non-FIFO
//! links ([`Channels`]); with [`Clusters`], messages between clusters draw from a separate
//! (larger) latency and are counted as remote.
//!
//! Everything random comes from one seeded [`SplitMix64`] and same-instant events run in the
//! order they were scheduled, so a configuration and seed always replay the same run. The
//! [`MultiChecker`] sees every request, grant and release; the run stops at the first violation,
//! when all requests were served ([`MultiVerdict::Ok`]), when nothing is left to happen
//! ([`MultiVerdict::Deadlock`]), or at the time/event bound ([`MultiVerdict::Stall`]).
//!
//! For token algorithms ([`MultiSystem::tokens_held`]) it also checks, after every event, that
//! each resource instance has exactly one token, held or in flight.
//!
//! Reused from the single-resource simulator unchanged: [`Latency`], [`Channels`] and the RNG.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::error::MutexError;
use crate::node::{Message, NodeId};
use crate::rng::SplitMix64;
use crate::sim::{Channels, Entry, Latency};

use super::checker::{MultiChecker, MultiVerdict, MultiViolation};
use super::model::{MultiOutbox, MultiOutput, MultiRequest, MultiSystem, ResourceSpace};

/// The client workload of a multi-resource run.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiWorkload {
    /// Requests each process issues.
    pub requests_per_node: usize,
    /// Largest number of resource types per request (`SizeReq`), clamped to `[1, m]`.
    pub size_req: usize,
    /// Base CS duration.
    pub cs_duration: Latency,
    /// Extra CS time per resource type requested.
    pub cs_per_resource: u64,
    /// Think time before each request.
    pub think_time: Latency,
}

impl Default for MultiWorkload {
    fn default() -> Self {
        Self {
            requests_per_node: 3,
            size_req: 4,
            cs_duration: Latency::Uniform { min: 1, max: 10 },
            cs_per_resource: 1,
            think_time: Latency::Exponential { min: 0, mean: 10.0 },
        }
    }
}

/// Processes grouped in clusters (\[VN\]'s grid): messages between clusters take the `remote`
/// latency, messages inside a cluster the run's ordinary [`MultiSimConfig::latency`].
#[derive(Debug, Clone, PartialEq)]
pub struct Clusters {
    /// `of[p]`: the cluster of process `p` (one entry per process).
    pub of: Vec<usize>,
    /// Inter-cluster latency.
    pub remote: Latency,
}

impl Clusters {
    /// `n` processes in `c` clusters of contiguous ids, as even as possible (`p * c / n`).
    pub fn even(n: usize, c: usize, remote: Latency) -> Result<Self, MutexError> {
        if c == 0 || c > n {
            return Err(MutexError::Config(format!(
                "{c} clusters for {n} processes: need 1 <= clusters <= processes"
            )));
        }
        Ok(Self {
            of: (0..n).map(|p| p * c / n).collect(),
            remote,
        })
    }
}

/// Configuration of a multi-resource run.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiSimConfig {
    /// Number of processes.
    pub n: usize,
    /// The resources.
    pub space: ResourceSpace,
    /// RNG seed.
    pub seed: u64,
    /// Per-message latency (inside a cluster, when there are clusters).
    pub latency: Latency,
    /// Optional clusters with a separate inter-cluster latency.
    pub clusters: Option<Clusters>,
    /// Link ordering.
    pub channels: Channels,
    /// Client workload.
    pub workload: MultiWorkload,
    /// Virtual-time bound.
    pub max_time: u64,
    /// Event-count bound.
    pub max_events: u64,
    /// Each process repeats its first drawn request in every CS (\[VN\]'s logical-clock runs:
    /// the same resources each time, differing between processes). Default: a fresh draw per
    /// request.
    pub repeat_requests: bool,
    /// Each process makes its first request at a random phase, uniform in `[0, t]` for its
    /// first think time `t`, instead of at `t` itself. With constant think times every
    /// process would otherwise ask at the same instant and be served in process-id
    /// order, which, with clusters of consecutive ids, hands tokens from neighbour to
    /// neighbour inside a cluster: a locality no algorithm asked for. Default: off.
    pub random_start: bool,
    /// Measure inside `[start, end)` only (ticks), as a fixed-length run does: processes keep
    /// requesting until `end` (`requests_per_node` is then only an upper bound), the use rate
    /// counts the held time inside the window over its length, and the waits are those of
    /// requests issued inside it. Start-up and drain weigh nothing. Default: `None`, the
    /// whole run (every process makes `requests_per_node` requests).
    pub window: Option<(u64, u64)>,
}

impl MultiSimConfig {
    /// `n` processes over `space` with the default workload, latency uniform in `[1, 10]`,
    /// non-FIFO links and generous bounds.
    pub fn new(n: usize, space: ResourceSpace, seed: u64) -> Self {
        Self {
            n,
            space,
            seed,
            latency: Latency::Uniform { min: 1, max: 10 },
            clusters: None,
            channels: Channels::NonFifo,
            workload: MultiWorkload::default(),
            max_time: 10_000_000,
            max_events: 5_000_000,
            repeat_requests: false,
            random_start: false,
            window: None,
        }
    }
}

/// Measurements of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MultiStats {
    /// Requests granted.
    pub grants: u64,
    /// Messages sent.
    pub messages: u64,
    /// Messages between processes of the same cluster (all of them without clusters).
    pub messages_local: u64,
    /// Messages between clusters.
    pub messages_remote: u64,
    /// Messages sent, per kind.
    pub messages_by_kind: BTreeMap<&'static str, u64>,
    /// Grants whose waiting time is measured (all of them without a window).
    pub waits: u64,
    /// Sum over measured grants of the waiting time (request to grant).
    pub wait_total: u64,
    /// Sum over grants of the squared waiting time (for the standard deviation).
    pub wait_sq_total: f64,
    /// Waiting times per request size (number of resource types named).
    pub wait_by_size: BTreeMap<usize, WaitAcc>,
    /// Sum over granted instances of the time held (instance-time).
    pub busy_instance_time: u64,
    /// Preemptions (loans, CT preemptions) the algorithm reports ([`MultiSystem::preemptions`]).
    pub preemptions: u64,
    /// Virtual time of the last event.
    pub end_time: u64,
    /// The measured span for the use rate: `end_time`, or the window's length.
    pub measured_time: u64,
    /// Events processed.
    pub events: u64,
}

impl MultiStats {
    /// Mean waiting time per grant (0 if none).
    pub fn wait_mean(&self) -> f64 {
        if self.waits == 0 {
            0.0
        } else {
            self.wait_total as f64 / self.waits as f64
        }
    }

    /// Standard deviation of the waiting time (population; 0 if no grant).
    pub fn wait_std(&self) -> f64 {
        std_of(self.waits, self.wait_total as f64, self.wait_sq_total)
    }

    /// Use rate: held instance-time over `instances × measured_time` (0 for an empty run).
    pub fn use_rate(&self, instances: usize) -> f64 {
        let denom = instances as f64 * self.measured_time as f64;
        if denom == 0.0 {
            0.0
        } else {
            self.busy_instance_time as f64 / denom
        }
    }
}

/// Waiting times of the grants of one request size.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WaitAcc {
    /// Grants of this size.
    pub count: u64,
    /// Sum of their waiting times.
    pub sum: u64,
    /// Sum of their squared waiting times.
    pub sum_sq: f64,
}

impl WaitAcc {
    fn add(&mut self, wait: u64) {
        self.count += 1;
        self.sum += wait;
        self.sum_sq += (wait as f64) * (wait as f64);
    }

    /// Mean waiting time (0 if none).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// Standard deviation of the waiting time (population; 0 if none).
    pub fn std(&self) -> f64 {
        std_of(self.count, self.sum as f64, self.sum_sq)
    }
}

fn std_of(count: u64, sum: f64, sum_sq: f64) -> f64 {
    if count == 0 {
        return 0.0;
    }
    let n = count as f64;
    let mean = sum / n;
    (sum_sq / n - mean * mean).max(0.0).sqrt()
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct MultiReport {
    /// The checker's verdict.
    pub verdict: MultiVerdict,
    /// Measurements.
    pub stats: MultiStats,
}

#[derive(Debug)]
enum Ev<M> {
    Request(NodeId),
    Release(NodeId),
    Deliver { from: NodeId, to: NodeId, msg: M },
}

#[derive(Debug, Clone, Copy)]
struct Client {
    remaining: usize,
    requested_at: u64,
    granted_at: u64,
    instances: u32,
    size: usize,
}

/// A multi-resource simulation of system `S`.
#[derive(Debug)]
pub struct MultiSim<S: MultiSystem> {
    cfg: MultiSimConfig,
    system: S,
    clients: Vec<Client>,
    rng: SplitMix64,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Entry<Ev<S::Msg>>>>,
    /// FIFO links: latest delivery time scheduled per (from, to).
    link_clock: Vec<u64>,
    checker: MultiChecker,
    /// Per flat instance: token messages in flight (token algorithms).
    inflight_tokens: Vec<usize>,
    stats: MultiStats,
    outbox: MultiOutbox<S::Msg>,
    /// Per process: its request, with [`MultiSimConfig::repeat_requests`].
    repeated: Vec<Option<MultiRequest>>,
}

impl<S: MultiSystem> MultiSim<S> {
    /// A run of `system` under `cfg`. Fails on an empty group, or if `S` needs FIFO links and
    /// `cfg` asks for non-FIFO ones.
    pub fn new(cfg: MultiSimConfig, system: S) -> Result<Self, MutexError> {
        if cfg.n == 0 {
            return Err(MutexError::Config(
                "a group needs at least one process".into(),
            ));
        }
        if S::REQUIRES_FIFO && cfg.channels == Channels::NonFifo {
            return Err(MutexError::Config(format!(
                "{} requires FIFO channels",
                S::NAME
            )));
        }
        if let Some(c) = &cfg.clusters
            && c.of.len() != cfg.n
        {
            return Err(MutexError::Config(format!(
                "cluster map has {} entries for {} processes",
                c.of.len(),
                cfg.n
            )));
        }
        let n = cfg.n;
        let clients = vec![
            Client {
                remaining: cfg.workload.requests_per_node,
                requested_at: 0,
                granted_at: 0,
                instances: 0,
                size: 0,
            };
            n
        ];
        Ok(Self {
            checker: MultiChecker::new(n, cfg.space.clone()),
            inflight_tokens: vec![0; cfg.space.total_instances()],
            rng: SplitMix64::new(cfg.seed),
            link_clock: vec![0; n * n],
            system,
            clients,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            stats: MultiStats::default(),
            outbox: MultiOutbox::new(),
            repeated: vec![None; n],
            cfg,
        })
    }

    /// The system under test (to inspect its final state).
    pub fn system(&self) -> &S {
        &self.system
    }

    fn push(&mut self, time: u64, ev: Ev<S::Msg>) {
        self.seq += 1;
        self.queue.push(Reverse(Entry {
            time,
            seq: self.seq,
            ev,
        }));
    }

    /// Draws a request following the workload.
    fn draw_request(&mut self) -> Result<MultiRequest, MutexError> {
        let m = self.cfg.space.types();
        let max = self.cfg.workload.size_req.clamp(1, m) as u64;
        let size = self.rng.range_inclusive(1, max) as usize;
        // Partial Fisher–Yates: `size` distinct types, uniformly.
        let mut types: Vec<usize> = (0..m).collect();
        for i in 0..size {
            let j = i + self.rng.index(m - i);
            types.swap(i, j);
        }
        let items = types[..size]
            .iter()
            .map(|&r| {
                let k = self.cfg.space.capacity(r) as u64;
                (r, self.rng.range_inclusive(1, k) as u32)
            })
            .collect();
        MultiRequest::new(items, &self.cfg.space)
    }

    /// Runs to the end and reports.
    pub fn run(&mut self) -> MultiReport {
        let verdict = self.run_inner();
        self.stats.end_time = self.now;
        self.stats.measured_time = match self.cfg.window {
            Some((start, end)) => end.saturating_sub(start),
            None => self.now,
        };
        self.stats.preemptions = self.system.preemptions();
        MultiReport {
            verdict,
            stats: self.stats.clone(),
        }
    }

    fn run_inner(&mut self) -> MultiVerdict {
        for node in 0..self.cfg.n {
            if self.clients[node].remaining > 0 {
                let mut t = self.cfg.workload.think_time.sample(&mut self.rng);
                if self.cfg.random_start {
                    t = (self.rng.next_f64() * (t as f64 + 1.0)) as u64;
                }
                self.push(t, Ev::Request(node));
            }
        }
        while let Some(Reverse(entry)) = self.queue.pop() {
            if entry.time > self.cfg.max_time {
                return self.stall("max_time");
            }
            if self.stats.events >= self.cfg.max_events {
                return self.stall("max_events");
            }
            self.now = entry.time;
            self.stats.events += 1;
            let step = match entry.ev {
                Ev::Request(node) => self.on_request(node),
                Ev::Release(node) => self.on_release(node),
                Ev::Deliver { from, to, msg } => {
                    if let Some(t) = S::token_instance(&msg)
                        && let Some(c) = self.inflight_tokens.get_mut(t)
                    {
                        *c = c.saturating_sub(1);
                    }
                    let mut out = std::mem::take(&mut self.outbox);
                    let r = self.system.deliver(from, to, msg, &mut out);
                    self.outbox = out;
                    r.map_err(|error| MultiVerdict::NodeError {
                        time: self.now,
                        error,
                    })
                }
            };
            if let Err(v) = step
                .and_then(|()| self.flush())
                .and_then(|()| self.check_tokens())
            {
                return v;
            }
            if self.queue.is_empty() {
                break;
            }
        }
        let waiting = self.checker.waiting();
        // With a window, requests left unissued at its end are not owed.
        let unissued = self.cfg.window.is_none() && self.clients.iter().any(|c| c.remaining > 0);
        if waiting.is_empty() && !unissued {
            MultiVerdict::Ok
        } else {
            MultiVerdict::Deadlock {
                time: self.now,
                waiting,
            }
        }
    }

    fn stall(&self, bound: &'static str) -> MultiVerdict {
        MultiVerdict::Stall {
            time: self.now,
            waiting: self.checker.waiting(),
            bound,
        }
    }

    /// Token uniqueness per instance: held plus in flight is exactly one (token algorithms).
    fn check_tokens(&self) -> Result<(), MultiVerdict> {
        let Some(held) = self.system.tokens_held() else {
            return Ok(());
        };
        for (t, (&h, &f)) in held.iter().zip(&self.inflight_tokens).enumerate() {
            if h + f != 1 {
                let (resource, instance) = self.cfg.space.unflat(t).unwrap_or((t, 0));
                return Err(MultiVerdict::Violation(MultiViolation::TokenCount {
                    time: self.now,
                    resource,
                    instance,
                    count: h + f,
                }));
            }
        }
        Ok(())
    }

    fn node_error(&self, error: MutexError) -> MultiVerdict {
        MultiVerdict::NodeError {
            time: self.now,
            error,
        }
    }

    fn on_request(&mut self, node: NodeId) -> Result<(), MultiVerdict> {
        if let Some((_, end)) = self.cfg.window
            && self.now >= end
        {
            // The measured run is over: this process stops asking.
            self.clients[node].remaining = 0;
            return Ok(());
        }
        let req = match self.repeated.get(node).cloned().flatten() {
            Some(r) => r,
            None => {
                let r = self.draw_request().map_err(|e| self.node_error(e))?;
                if self.cfg.repeat_requests
                    && let Some(slot) = self.repeated.get_mut(node)
                {
                    *slot = Some(r.clone());
                }
                r
            }
        };
        let c = &mut self.clients[node];
        c.remaining -= 1;
        c.requested_at = self.now;
        c.instances = req.instances();
        c.size = req.size();
        self.checker.on_request(node, &req);
        let mut out = std::mem::take(&mut self.outbox);
        let r = self.system.request(node, &req, &mut out);
        self.outbox = out;
        r.map_err(|e| self.node_error(e))
    }

    fn on_release(&mut self, node: NodeId) -> Result<(), MultiVerdict> {
        self.checker
            .on_release(self.now, node)
            .map_err(MultiVerdict::Violation)?;
        let c = self.clients[node];
        let (from, to) = match self.cfg.window {
            Some((start, end)) => (c.granted_at.max(start), self.now.min(end)),
            None => (c.granted_at, self.now),
        };
        self.stats.busy_instance_time += to.saturating_sub(from) * u64::from(c.instances);
        let mut out = std::mem::take(&mut self.outbox);
        let r = self.system.release(node, &mut out);
        self.outbox = out;
        r.map_err(|e| self.node_error(e))?;
        if self.clients[node].remaining > 0 {
            let t = self.now + self.cfg.workload.think_time.sample(&mut self.rng);
            self.push(t, Ev::Request(node));
        }
        Ok(())
    }

    /// Applies the outputs of the last handler.
    fn flush(&mut self) -> Result<(), MultiVerdict> {
        let outputs: Vec<MultiOutput<S::Msg>> = self.outbox.drain().collect();
        for o in outputs {
            match o {
                MultiOutput::Send { from, to, msg } => {
                    if to >= self.cfg.n || from >= self.cfg.n {
                        return Err(MultiVerdict::Violation(MultiViolation::BadDestination {
                            time: self.now,
                            from,
                            to,
                        }));
                    }
                    self.stats.messages += 1;
                    if let Some(t) = S::token_instance(&msg)
                        && let Some(c) = self.inflight_tokens.get_mut(t)
                    {
                        *c += 1;
                    }
                    *self.stats.messages_by_kind.entry(msg.kind()).or_insert(0) += 1;
                    let remote = self
                        .cfg
                        .clusters
                        .as_ref()
                        .filter(|c| c.of[from] != c.of[to])
                        .map(|c| &c.remote);
                    let latency = match remote {
                        Some(l) => {
                            self.stats.messages_remote += 1;
                            l.sample(&mut self.rng)
                        }
                        None => {
                            self.stats.messages_local += 1;
                            self.cfg.latency.sample(&mut self.rng)
                        }
                    };
                    let mut at = self.now + latency.max(1);
                    if self.cfg.channels == Channels::Fifo {
                        let link = &mut self.link_clock[from * self.cfg.n + to];
                        at = at.max(*link);
                        *link = at;
                    }
                    self.push(at, Ev::Deliver { from, to, msg });
                }
                MultiOutput::Grant { node, holds } => {
                    self.checker
                        .on_grant(self.now, node, &holds)
                        .map_err(MultiVerdict::Violation)?;
                    self.stats.grants += 1;
                    let c = &mut self.clients[node];
                    c.granted_at = self.now;
                    let wait = self.now - c.requested_at;
                    let measured = self
                        .cfg
                        .window
                        .is_none_or(|(start, end)| (start..end).contains(&c.requested_at));
                    if measured {
                        self.stats.waits += 1;
                        self.stats.wait_total += wait;
                        self.stats.wait_sq_total += (wait as f64) * (wait as f64);
                        self.stats.wait_by_size.entry(c.size).or_default().add(wait);
                    }
                    let size = self.clients[node].size as u64;
                    let cs = self.cfg.workload.cs_duration.sample(&mut self.rng)
                        + self.cfg.workload.cs_per_resource * size;
                    self.push(self.now + cs, Ev::Release(node));
                }
            }
        }
        Ok(())
    }
}

/// Builds and runs a simulation in one call.
pub fn simulate_multi<S: MultiSystem>(
    cfg: MultiSimConfig,
    system: S,
) -> Result<MultiReport, MutexError> {
    Ok(MultiSim::new(cfg, system)?.run())
}
