//! A deterministic discrete-event simulator for the state machines, with the checker built in.
//!
//! `n` nodes of one algorithm exchange messages over simulated links with a per-message latency
//! drawn from a [`Latency`] distribution; links are FIFO or not ([`Channels`]). A client per node
//! issues requests following a [`Workload`] (requests per node, CS duration, think time; all
//! concurrently, or one at a time for exact per-CS message counts). Everything random comes from
//! one seeded [`SplitMix64`] and events at the same virtual instant run in the order they were
//! scheduled, so the same configuration and seed always produce the same trace.
//!
//! Fault injection: [`DropRule`] drops the `nth` message of a given kind (Misra's token loss).
//!
//! Every grant, release and (for token algorithms) token count is fed to the [`Checker`]; the run
//! stops at the first violation, or when all requests were served ([`Verdict::Ok`]), or when
//! nothing is left to happen ([`Verdict::Deadlock`]), or at the time/event bound
//! ([`Verdict::Stall`]).

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::checker::{Checker, Verdict, Violation};
use crate::error::MutexError;
use crate::metrics::Metrics;
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, Output};
use crate::rng::SplitMix64;

/// A distribution of virtual durations (ticks).
#[derive(Debug, Clone, PartialEq)]
pub enum Latency {
    /// Always this value.
    Constant(u64),
    /// Uniform in `[min, max]`.
    Uniform {
        /// Lower bound (inclusive).
        min: u64,
        /// Upper bound (inclusive).
        max: u64,
    },
    /// `min` plus an exponential with mean `mean` (rounded).
    Exponential {
        /// Minimum value.
        min: u64,
        /// Mean of the exponential part.
        mean: f64,
    },
}

impl Latency {
    /// Draws one value.
    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        match *self {
            Latency::Constant(c) => c,
            Latency::Uniform { min, max } => rng.range_inclusive(min, max),
            Latency::Exponential { min, mean } => min + rng.exponential(mean),
        }
    }
}

/// Link ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channels {
    /// Messages between a pair of nodes arrive in sending order.
    Fifo,
    /// Each message's latency is independent; later messages may overtake earlier ones.
    NonFifo,
}

impl Channels {
    /// FIFO when algorithm `A` requires it, non-FIFO (the weaker assumption) otherwise.
    pub fn weakest_for<A: MutexNode>() -> Self {
        if A::REQUIRES_FIFO {
            Channels::Fifo
        } else {
            Channels::NonFifo
        }
    }
}

/// How clients issue their requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Every requesting node runs its own loop: think, request, CS, release, ...
    Concurrent,
    /// Only one request exists at a time: after each release (and a think time) a random node
    /// with requests left issues the next one. Gives exact per-CS message counts.
    Serial,
}

/// The client workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Critical sections each requesting node asks for.
    pub requests_per_node: usize,
    /// Nodes that request; `None` = all.
    pub requesters: Option<Vec<NodeId>>,
    /// Time spent in the CS.
    pub cs_duration: Latency,
    /// Time between a release (or the start) and the node's next request.
    pub think_time: Latency,
    /// Concurrent or serial requests.
    pub schedule: Schedule,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            requests_per_node: 3,
            requesters: None,
            cs_duration: Latency::Constant(5),
            think_time: Latency::Exponential { min: 0, mean: 20.0 },
            schedule: Schedule::Concurrent,
        }
    }
}

/// Drop the `nth` (1-based) network message of kind `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropRule {
    /// Message kind, as [`Message::kind`] names it.
    pub kind: &'static str,
    /// Which one (1 = the first sent).
    pub nth: u64,
}

/// Crash-stop fault injection: `node` crashes at virtual time `at` (it handles nothing after
/// that, messages to it are lost, and if it was in the CS the checker counts it as having left).
/// Every other live node then gets a failure notice ([`MutexNode::on_failure`]) after its own
/// delay drawn from `notice`: a perfect detector (accurate and complete) with configurable
/// latency; a non-constant `notice` gives staggered, transiently inconsistent views. Over FIFO
/// links a notice never overtakes a message the dead node sent to that observer before crashing.
#[derive(Debug, Clone, PartialEq)]
pub struct Crash {
    /// The node that crashes.
    pub node: NodeId,
    /// When it crashes.
    pub at: u64,
    /// Detection latency, drawn per observer.
    pub notice: Latency,
}

impl Crash {
    /// `k` crashes of distinct random processes among `n`, each at a random time in
    /// `[0, horizon]`, detected after `notice` (victims and times drawn alternately from
    /// `rng`, in crash order as drawn).
    pub fn random(
        rng: &mut SplitMix64,
        n: usize,
        k: usize,
        horizon: u64,
        notice: &Latency,
    ) -> Vec<Crash> {
        let mut ids: Vec<NodeId> = (0..n).collect();
        (0..k.min(n))
            .map(|j| {
                let pick = j + rng.index(n - j);
                ids.swap(j, pick);
                Crash {
                    node: ids[j],
                    at: rng.range_inclusive(0, horizon),
                    notice: notice.clone(),
                }
            })
            .collect()
    }
}

/// Simulator configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Number of nodes.
    pub n: usize,
    /// RNG seed.
    pub seed: u64,
    /// Per-message latency.
    pub latency: Latency,
    /// Link ordering.
    pub channels: Channels,
    /// Client workload.
    pub workload: Workload,
    /// Injected message losses.
    pub drops: Vec<DropRule>,
    /// Virtual-time bound: reaching it with requests unserved is a [`Verdict::Stall`].
    pub max_time: u64,
    /// Event-count bound, likewise.
    pub max_events: u64,
    /// Whether to record the trace.
    pub record_trace: bool,
    /// Keep processing events up to this virtual time even after every request was served
    /// (e.g. to let Misra's tokens circulate and detect a loss). Default 0.
    pub run_until: u64,
    /// Injected crashes (default none). Only algorithms that implement
    /// [`MutexNode::on_failure`] tolerate them.
    pub crashes: Vec<Crash>,
}

impl SimConfig {
    /// A configuration for `n` nodes and `seed`, with the default workload, uniform latency in
    /// `[1, 10]`, FIFO links and generous bounds.
    pub fn new(n: usize, seed: u64) -> Self {
        Self {
            n,
            seed,
            latency: Latency::Uniform { min: 1, max: 10 },
            channels: Channels::Fifo,
            workload: Workload::default(),
            drops: Vec::new(),
            max_time: 1_000_000,
            max_events: 2_000_000,
            record_trace: false,
            run_until: 0,
            crashes: Vec::new(),
        }
    }
}

/// What happened, as recorded in the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceKind {
    /// A client asked for the CS.
    Request {
        /// The node.
        node: NodeId,
    },
    /// A node was granted the CS.
    Grant {
        /// The node.
        node: NodeId,
        /// The fence.
        fence: Fence,
    },
    /// A client left the CS.
    Release {
        /// The node.
        node: NodeId,
    },
    /// A message was sent.
    Send {
        /// Sender.
        from: NodeId,
        /// Destination.
        to: NodeId,
        /// Message kind.
        kind: &'static str,
    },
    /// A message was delivered.
    Deliver {
        /// Sender.
        from: NodeId,
        /// Destination.
        to: NodeId,
        /// Message kind.
        kind: &'static str,
    },
    /// A node handled a message it sent to itself (see [`crate::Output::Local`]).
    Local {
        /// The node.
        node: NodeId,
        /// Message kind.
        kind: &'static str,
    },
    /// A node crashed (see [`Crash`]).
    Crash {
        /// The node.
        node: NodeId,
    },
    /// A node was told that `failed` crashed.
    Notice {
        /// The node told.
        node: NodeId,
        /// The crashed node.
        failed: NodeId,
    },
    /// A message was dropped by fault injection.
    Drop {
        /// Sender.
        from: NodeId,
        /// Destination.
        to: NodeId,
        /// Message kind.
        kind: &'static str,
    },
}

/// One trace entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    /// Virtual time.
    pub time: u64,
    /// What happened.
    pub what: TraceKind,
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The checker's verdict.
    pub verdict: Verdict,
    /// Measurements.
    pub metrics: Metrics,
    /// The trace (empty unless [`SimConfig::record_trace`]).
    pub trace: Vec<TraceEvent>,
}

#[derive(Debug)]
enum Ev<M> {
    Request(NodeId),
    Release(NodeId),
    Deliver { from: NodeId, to: NodeId, msg: M },
    Crash(NodeId),
    Notice { node: NodeId, failed: NodeId },
}

/// An event scheduled at a virtual time; `seq` breaks ties in scheduling order, so the
/// queue pops in (time, seq) order. Shared with the multi-resource simulator.
#[derive(Debug)]
pub(crate) struct Entry<E> {
    pub(crate) time: u64,
    pub(crate) seq: u64,
    pub(crate) ev: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.time, self.seq).cmp(&(other.time, other.seq))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Waiting { since: u64 },
    InCs,
}

#[derive(Debug, Clone, Copy)]
struct Client {
    remaining: usize,
    phase: Phase,
}

/// A simulation of `n` nodes of algorithm `A`.
#[derive(Debug)]
pub struct Simulation<A: MutexNode> {
    cfg: SimConfig,
    nodes: Vec<A>,
    clients: Vec<Client>,
    rng: SplitMix64,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Entry<Ev<A::Msg>>>>,
    link_clock: Vec<u64>,
    checker: Checker,
    metrics: Metrics,
    trace: Vec<TraceEvent>,
    inflight_tokens: usize,
    dropped_tokens: u64,
    pending_sync: Option<u64>,
    outbox: Outbox<A::Msg>,
    verdict: Option<Verdict>,
    crashed: Vec<bool>,
}

/// Builds and runs a simulation in one call.
pub fn simulate<A: MutexNode>(cfg: SimConfig, algo: &A::Config) -> Result<Report, MutexError> {
    Ok(Simulation::<A>::new(cfg, algo)?.run())
}

impl<A: MutexNode> Simulation<A> {
    /// Builds the nodes; fails if the algorithm rejects the configuration.
    pub fn new(cfg: SimConfig, algo: &A::Config) -> Result<Self, MutexError> {
        let n = cfg.n;
        if let Some(c) = cfg.crashes.iter().find(|c| c.node >= n) {
            return Err(MutexError::UnknownNode { node: c.node, n });
        }
        let nodes = (0..n)
            .map(|i| A::new(i, n, algo))
            .collect::<Result<Vec<_>, _>>()?;
        let mut clients = vec![
            Client {
                remaining: 0,
                phase: Phase::Idle,
            };
            n
        ];
        match &cfg.workload.requesters {
            Some(list) => {
                for &r in list {
                    let c = clients
                        .get_mut(r)
                        .ok_or(MutexError::UnknownNode { node: r, n })?;
                    c.remaining = cfg.workload.requests_per_node;
                }
            }
            None => clients
                .iter_mut()
                .for_each(|c| c.remaining = cfg.workload.requests_per_node),
        }
        Ok(Self {
            rng: SplitMix64::new(cfg.seed),
            cfg,
            nodes,
            clients,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            link_clock: vec![0; n * n],
            checker: Checker::new(),
            metrics: Metrics::default(),
            trace: Vec::new(),
            inflight_tokens: 0,
            dropped_tokens: 0,
            pending_sync: None,
            outbox: Outbox::new(),
            verdict: None,
            crashed: vec![false; n],
        })
    }

    /// The nodes (e.g. to inspect algorithm-specific counters after a run).
    pub fn nodes(&self) -> &[A] {
        &self.nodes
    }

    /// Runs to completion (or to the first failure) and reports.
    pub fn run(&mut self) -> Report {
        for i in 0..self.cfg.n {
            self.call(i, |node, out| node.on_start(out));
        }
        for c in self.cfg.crashes.clone() {
            self.push(c.at, Ev::Crash(c.node));
        }
        self.schedule_initial_requests();
        self.check_tokens();
        while self.verdict.is_none() {
            if self.all_done() {
                let more =
                    matches!(self.queue.peek(), Some(Reverse(e)) if e.time <= self.cfg.run_until);
                if !more {
                    self.verdict = Some(Verdict::Ok);
                    break;
                }
            }
            let Some(Reverse(entry)) = self.queue.pop() else {
                self.verdict = Some(Verdict::Deadlock {
                    time: self.now,
                    waiting: self.waiting_nodes(),
                });
                break;
            };
            let bound = if entry.time > self.cfg.max_time {
                Some("virtual-time bound")
            } else if self.metrics.events >= self.cfg.max_events {
                Some("event bound")
            } else {
                None
            };
            if let Some(bound) = bound {
                self.verdict = Some(Verdict::Stall {
                    time: self.now,
                    waiting: self.waiting_nodes(),
                    bound,
                });
                break;
            }
            self.now = entry.time;
            self.metrics.events += 1;
            match entry.ev {
                Ev::Request(i) | Ev::Release(i) if self.is_crashed(i) => {
                    // A crash inside the CS already passed the serial turn on (`crash`); a
                    // request that fires after its node crashed passes it on here.
                    if self.cfg.workload.schedule == Schedule::Serial
                        && matches!(entry.ev, Ev::Request(_))
                    {
                        self.schedule_next_serial();
                    }
                }
                Ev::Request(i) => self.request(i),
                Ev::Release(i) => self.release(i),
                Ev::Crash(i) => self.crash(i),
                Ev::Notice { node, failed } => {
                    if !self.is_crashed(node) {
                        self.record(TraceKind::Notice { node, failed });
                        self.call(node, |n, out| n.on_failure(failed, out));
                    }
                }
                Ev::Deliver { to, .. } if self.is_crashed(to) => {}
                Ev::Deliver { from, to, msg } => {
                    if msg.is_token() {
                        self.inflight_tokens = self.inflight_tokens.saturating_sub(1);
                    }
                    self.record(TraceKind::Deliver {
                        from,
                        to,
                        kind: msg.kind(),
                    });
                    self.call(to, |node, out| node.on_message(from, msg, out));
                }
            }
            self.check_tokens();
        }
        self.metrics.end_time = self.now;
        Report {
            verdict: self.verdict.clone().unwrap_or(Verdict::Ok),
            metrics: self.metrics.clone(),
            trace: std::mem::take(&mut self.trace),
        }
    }

    fn is_crashed(&self, i: NodeId) -> bool {
        self.crashed.get(i).copied().unwrap_or(false)
    }

    fn crash(&mut self, i: NodeId) {
        if i >= self.cfg.n || self.crashed[i] {
            return;
        }
        self.crashed[i] = true;
        self.checker.on_crash(i);
        let busy = self.clients[i].phase != Phase::Idle;
        self.clients[i] = Client {
            remaining: 0,
            phase: Phase::Idle,
        };
        self.record(TraceKind::Crash { node: i });
        if busy && self.cfg.workload.schedule == Schedule::Serial {
            self.schedule_next_serial();
        }
        let notice = self
            .cfg
            .crashes
            .iter()
            .find(|c| c.node == i)
            .map_or(Latency::Constant(0), |c| c.notice.clone());
        for j in 0..self.cfg.n {
            if !self.crashed[j] {
                let mut t = self.now + notice.sample(&mut self.rng);
                if self.cfg.channels == Channels::Fifo {
                    // Like a closed connection's EOF: the notice follows the dead node's last
                    // messages on the link.
                    t = t.max(self.link_clock[i * self.cfg.n + j]);
                }
                self.push(t, Ev::Notice { node: j, failed: i });
            }
        }
    }

    fn all_done(&self) -> bool {
        self.clients
            .iter()
            .all(|c| c.remaining == 0 && c.phase == Phase::Idle)
    }

    fn waiting_nodes(&self) -> Vec<NodeId> {
        (0..self.cfg.n)
            .filter(|&i| matches!(self.clients[i].phase, Phase::Waiting { .. }))
            .collect()
    }

    fn push(&mut self, time: u64, ev: Ev<A::Msg>) {
        self.seq += 1;
        self.queue.push(Reverse(Entry {
            time,
            seq: self.seq,
            ev,
        }));
    }

    fn record(&mut self, what: TraceKind) {
        if self.cfg.record_trace {
            self.trace.push(TraceEvent {
                time: self.now,
                what,
            });
        }
    }

    fn schedule_initial_requests(&mut self) {
        match self.cfg.workload.schedule {
            Schedule::Concurrent => {
                for i in 0..self.cfg.n {
                    if self.clients[i].remaining > 0 {
                        let t = self.cfg.workload.think_time.sample(&mut self.rng);
                        self.push(t, Ev::Request(i));
                    }
                }
            }
            Schedule::Serial => self.schedule_next_serial(),
        }
    }

    fn schedule_next_serial(&mut self) {
        let candidates: Vec<NodeId> = (0..self.cfg.n)
            .filter(|&i| self.clients[i].remaining > 0)
            .collect();
        if candidates.is_empty() {
            return;
        }
        let pick = candidates[self.rng.index(candidates.len())];
        let t = self.now + self.cfg.workload.think_time.sample(&mut self.rng);
        self.push(t, Ev::Request(pick));
    }

    fn request(&mut self, i: NodeId) {
        let c = &mut self.clients[i];
        c.remaining = c.remaining.saturating_sub(1);
        c.phase = Phase::Waiting { since: self.now };
        if self.cfg.workload.schedule == Schedule::Serial {
            self.metrics.per_cs_messages.push(0);
        }
        self.record(TraceKind::Request { node: i });
        self.call(i, |node, out| node.on_request(out));
    }

    fn release(&mut self, i: NodeId) {
        self.clients[i].phase = Phase::Idle;
        self.checker.on_release(i);
        self.record(TraceKind::Release { node: i });
        self.pending_sync = self
            .clients
            .iter()
            .any(|c| matches!(c.phase, Phase::Waiting { .. }))
            .then_some(self.now);
        self.call(i, |node, out| node.on_release(out));
        if self.clients[i].remaining > 0 && self.cfg.workload.schedule == Schedule::Concurrent {
            let t = self.now + self.cfg.workload.think_time.sample(&mut self.rng);
            self.push(t, Ev::Request(i));
        }
        if self.cfg.workload.schedule == Schedule::Serial {
            self.schedule_next_serial();
        }
    }

    fn call(
        &mut self,
        i: NodeId,
        f: impl FnOnce(&mut A, &mut Outbox<A::Msg>) -> Result<(), MutexError>,
    ) {
        if self.verdict.is_some() {
            return;
        }
        let mut out = std::mem::take(&mut self.outbox);
        out.clear();
        if let Err(error) = f(&mut self.nodes[i], &mut out) {
            self.verdict = Some(Verdict::NodeError {
                time: self.now,
                node: i,
                error,
            });
        }
        for o in out.drain() {
            if self.verdict.is_some() {
                break;
            }
            match o {
                Output::Send { to, msg } => self.send(i, to, msg),
                Output::Local { kind } => self.count_local(i, kind),
                Output::Grant { fence } => self.grant(i, fence),
            }
        }
        self.outbox = out;
    }

    fn count_message(&mut self, kind: &'static str) -> u64 {
        let count = {
            let c = self.metrics.messages_by_kind.entry(kind).or_insert(0);
            *c += 1;
            *c
        };
        self.metrics.messages_total += 1;
        match self.metrics.per_cs_messages.last_mut() {
            Some(w) => *w += 1,
            None => self.metrics.messages_before_first_request += 1,
        }
        count
    }

    fn count_local(&mut self, node: NodeId, kind: &'static str) {
        self.count_message(kind);
        self.metrics.self_messages += 1;
        self.record(TraceKind::Local { node, kind });
    }

    fn send(&mut self, from: NodeId, to: NodeId, msg: A::Msg) {
        let n = self.cfg.n;
        if to >= n {
            self.verdict = Some(Verdict::Violation(Violation::BadDestination {
                time: self.now,
                from,
                to,
            }));
            return;
        }
        let kind = msg.kind();
        let count = self.count_message(kind);
        self.record(TraceKind::Send { from, to, kind });
        if self
            .cfg
            .drops
            .iter()
            .any(|d| d.kind == kind && d.nth == count)
        {
            self.metrics.messages_dropped += 1;
            if msg.is_token() {
                self.dropped_tokens += 1;
            }
            self.record(TraceKind::Drop { from, to, kind });
            return;
        }
        let mut at = self.now + self.cfg.latency.sample(&mut self.rng);
        if self.cfg.channels == Channels::Fifo {
            let link = &mut self.link_clock[from * n + to];
            at = at.max(*link);
            *link = at;
        }
        if msg.is_token() {
            self.inflight_tokens += 1;
        }
        self.push(at, Ev::Deliver { from, to, msg });
    }

    fn grant(&mut self, i: NodeId, fence: Fence) {
        let since = match self.clients[i].phase {
            Phase::Waiting { since } => Some(since),
            _ => None,
        };
        if let Err(v) = self.checker.on_grant(self.now, i, fence, since.is_some()) {
            self.verdict = Some(Verdict::Violation(v));
            return;
        }
        self.record(TraceKind::Grant { node: i, fence });
        self.clients[i].phase = Phase::InCs;
        self.metrics.cs_entries += 1;
        self.metrics.fences.push(fence);
        self.metrics
            .messages_at_grant
            .push(self.metrics.messages_total);
        if let Some(since) = since {
            self.metrics.wait_times.push(self.now - since);
        }
        if let Some(t) = self.pending_sync.take() {
            self.metrics.sync_delays.push(self.now - t);
        }
        let d = self.cfg.workload.cs_duration.sample(&mut self.rng);
        self.push(self.now + d, Ev::Release(i));
    }

    fn check_tokens(&mut self) {
        if !A::TOKEN_BASED || self.verdict.is_some() {
            return;
        }
        let held = self.nodes.iter().filter(|n| n.holds_token()).count();
        if let Err(v) =
            self.checker
                .check_tokens(self.now, held + self.inflight_tokens, self.dropped_tokens)
        {
            self.verdict = Some(Verdict::Violation(v));
        }
    }
}
