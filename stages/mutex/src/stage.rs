//! The algorithms as Leda stages.
//!
//! A node of the group is one serial **node stage** (`mutex<i>`) holding one state machine per
//! configured resource ([`DynNode`], so the algorithm is chosen by configuration). Its inputs
//! are events on its queue, its outputs are ports:
//!
//! | input event                               | meaning                                   |
//! |-------------------------------------------|-------------------------------------------|
//! | `("start")`                               | START (autostart event of the stage)      |
//! | `("request", resource)`                   | the application asks for the CS           |
//! | `("request", resource, true)`             | try: granted now, or withdrawn (`would-block`) |
//! | `("release", resource)`                   | the application leaves the CS             |
//! | `("cancel", resource)`                    | withdraw the request (or release if granted) |
//! | `("msg", from, resource, kind, body)`     | a protocol message from node `from`       |
//! | `("failure", j)`                          | a failure detector's notice: node `j` crashed (every resource's state machine gets it; see [`crate::ft_quorum::detector`]) |
//!
//! | output port | event                                   |
//! |-------------|-----------------------------------------|
//! | `peer<j>`   | `("msg", me, resource, kind, body)` to node `j`'s stage |
//! | `grant`     | to the application: `("grant", resource, fence)`; `("released", resource)` once a release (or a withdrawn grant) was handled; `("would-block", resource)` for a try that cannot be granted at once; `("refused", resource, why)` for a request while one is pending or a release without a grant |
//!
//! Events on `grant` carry the node's seal ([`NodeSeal`], a local attachment): connect `grant`
//! with a local connector (attachments do not cross decoupled ones).
//!
//! A withdrawn request (refused try, cancellation) stays in the algorithm, which has no way to
//! take a request back; when its grant comes, the node stage releases at once and reports
//! `released`. The algorithms allow one outstanding request per node and resource; several
//! local clients are multiplexed in front of the node stage (the lock service's front stage).
//!
//! The application side is another stage of the node's cluster: the workload [`client_stage`]
//! in simulation and experiments, the lock service's front end in `examples/lock-service`.
//! Node stages are joined pairwise by decoupled connectors, so the graph partitions into one
//! cluster per node and runs unchanged under leda-core's simulated executor, in one process, or
//! across processes over leda-net. A node stage can also be built from attributes
//! ([`node_stage_from_attrs`], kind [`NODE_KIND`]) so a daemon's registry can resolve it.
//!
//! A node stage is **fail-stop** ([`Stage::fail_stop`]): if its handler fails (a malformed
//! message, a full `grant` queue), the node is crashed for the rest of the run, as the
//! crash-tolerant algorithms assume; it is never rebuilt with fresh state (a second
//! token, fences counted from 0 again). Events sent to it then fail to the senders'
//! view (counted, `error` port).
//!
//! An [`Observer`] (the [`crate::stage_sim::Monitor`] in simulation) sees every request, grant,
//! release, message and token change as the node stage handles it, in virtual time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leda_core::port::Port;
use leda_core::prelude::*;

use crate::algorithm::{Algorithm, DynNode, Effect};
use crate::error::MutexError;
use crate::node::{Fence, NodeId};
use crate::rng::SplitMix64;
use crate::sim::Latency;

/// The registry kind of node stages.
pub const NODE_KIND: &str = "mutex.node";

/// The mark a node stage puts on every event it sends to its application (port `grant`):
/// a local attachment that only this crate can make, so the application side can tell the
/// node's replies from anything a client stage sends it ([`from_node`]). The node and its
/// application must share a process (a local connector): attachments do not cross processes.
#[derive(Debug)]
pub struct NodeSeal(());

/// Sends `ev` to the application, sealed ([`NodeSeal`]).
pub(crate) fn to_app(ctx: &mut Ctx, ev: impl Into<Event>) -> HandlerResult {
    ctx.send("grant", ev.into().attach(NodeSeal(())))?;
    Ok(())
}

/// `true` if `ev` was sent by a node stage on its `grant` port; takes the seal off.
pub fn from_node(ev: &mut Event) -> bool {
    ev.take_attachment::<NodeSeal>().is_some()
}

/// What a node stage reports to its [`Observer`].
#[derive(Debug, Clone, PartialEq)]
pub enum NodeEvent<'a> {
    /// The application asked for the CS.
    Request,
    /// The CS was granted with this fence.
    Grant(Fence),
    /// The application left the CS.
    Release,
    /// A message was sent to `to`.
    Send {
        /// Destination.
        to: NodeId,
        /// Kind.
        kind: &'static str,
        /// Whether it carries the token.
        token: bool,
    },
    /// A message to self, handled inside the node.
    Local {
        /// Kind.
        kind: &'static str,
    },
    /// A message from `from` was delivered.
    Deliver {
        /// Sender.
        from: NodeId,
        /// Whether it carries the token.
        token: bool,
    },
    /// After a handler: whether the node holds the token now.
    Holds(bool),
    /// A handler failed (the input is dropped; the node refuses input from now on).
    Error(&'a MutexError),
}

/// Sees what node stages do. Called from inside the handlers, in the order they run.
pub trait Observer: Send + Sync + 'static {
    /// `node`'s stage handled something about `resource` at `time` (seconds, virtual in
    /// simulation).
    fn observe(&self, time: f64, node: NodeId, resource: &str, ev: NodeEvent<'_>);
}

/// How a node stage is built.
#[derive(Clone)]
pub struct NodeSpec {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// This node.
    pub id: NodeId,
    /// Group size.
    pub n: usize,
    /// The resources (one state machine each).
    pub resources: Vec<String>,
    /// Observer, if any.
    pub observer: Option<Arc<dyn Observer>>,
}

impl std::fmt::Debug for NodeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSpec")
            .field("algorithm", &self.algorithm)
            .field("id", &self.id)
            .field("n", &self.n)
            .field("resources", &self.resources)
            .finish()
    }
}

/// The name of node `i`'s stage.
pub fn node_name(i: NodeId) -> String {
    format!("mutex{i}")
}

/// The port of a node stage that leads to node `j`.
pub fn peer_port(j: NodeId) -> String {
    format!("peer{j}")
}

/// Where the local application stands with one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    /// Requested, not granted yet; `withdrawn`: the application gave up (a refused try, or a
    /// cancellation), so the grant, when it comes, is released at once.
    Requested {
        withdrawn: bool,
    },
    Held,
}

struct NodeState {
    spec: NodeSpec,
    nodes: BTreeMap<String, Box<dyn DynNode>>,
    phase: BTreeMap<String, Phase>,
    failed: bool,
    peers: Vec<Port>,
    effects: Vec<Effect>,
}

impl NodeState {
    fn new(spec: NodeSpec) -> Result<Self, MutexError> {
        if spec.resources.is_empty() {
            return Err(MutexError::Config(
                "a node needs at least one resource".into(),
            ));
        }
        let nodes = spec
            .resources
            .iter()
            .map(|r| Ok((r.clone(), spec.algorithm.node(spec.id, spec.n)?)))
            .collect::<Result<_, MutexError>>()?;
        let peers = (0..spec.n).map(|j| Port::from(peer_port(j))).collect();
        let phase = spec
            .resources
            .iter()
            .map(|r| (r.clone(), Phase::Idle))
            .collect();
        Ok(NodeState {
            spec,
            nodes,
            phase,
            failed: false,
            peers,
            effects: Vec::new(),
        })
    }

    fn observe(&self, ctx: &Ctx, resource: &str, ev: NodeEvent<'_>) {
        if let Some(o) = &self.spec.observer {
            o.observe(ctx.gettime(), self.spec.id, resource, ev);
        }
    }

    fn handle(&mut self, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let tag: &str = ev.get(0)?;
        if tag == "start" {
            let resources: Vec<String> = self.nodes.keys().cloned().collect();
            for r in resources {
                self.step(&r, ctx, |n, out| n.start(out))?;
            }
            return Ok(());
        }
        if tag == "failure" {
            // A crash notice concerns the node, so every resource's state machine gets it.
            let failed: NodeId = ev.get(1)?;
            let resources: Vec<String> = self.nodes.keys().cloned().collect();
            for r in resources {
                self.step(&r, ctx, |n, out| n.failure(failed, out))?;
            }
            return Ok(());
        }
        let resource: String = ev.get(if tag == "msg" { 2 } else { 1 })?;
        if !self.nodes.contains_key(&resource) {
            let err = MutexError::UnknownResource(resource.clone());
            self.observe(ctx, &resource, NodeEvent::Error(&err));
            return Err(err.into());
        }
        let phase = self.phase.get(&resource).copied().unwrap_or(Phase::Idle);
        match tag {
            "request" => {
                if phase != Phase::Idle {
                    to_app(
                        ctx,
                        ("refused", resource, "a request is already pending or held"),
                    )?;
                    return Ok(());
                }
                let try_only = ev.arg(2).and_then(Value::as_bool).unwrap_or(false);
                self.set_phase(&resource, Phase::Requested { withdrawn: false });
                self.observe(ctx, &resource, NodeEvent::Request);
                self.step(&resource, ctx, |n, out| n.request(out))?;
                if try_only && self.phase.get(&resource) != Some(&Phase::Held) {
                    // Not grantable without waiting for other nodes: withdraw.
                    self.set_phase(&resource, Phase::Requested { withdrawn: true });
                    to_app(ctx, ("would-block", resource))?;
                }
                Ok(())
            }
            "release" => {
                if phase != Phase::Held {
                    to_app(ctx, ("refused", resource, "release without holding"))?;
                    return Ok(());
                }
                self.release(&resource, ctx)
            }
            "cancel" => match phase {
                Phase::Requested { .. } => {
                    self.set_phase(&resource, Phase::Requested { withdrawn: true });
                    Ok(())
                }
                Phase::Held => self.release(&resource, ctx),
                Phase::Idle => {
                    to_app(ctx, ("released", resource))?;
                    Ok(())
                }
            },
            "msg" => {
                let from: NodeId = ev.get(1)?;
                let body = ev
                    .arg(4)
                    .ok_or_else(|| MutexError::Encoding("message without a body".into()))?;
                let token = self.nodes.get(&resource).is_some_and(|n| n.is_token(body));
                self.observe(ctx, &resource, NodeEvent::Deliver { from, token });
                self.step(&resource, ctx, |n, out| n.message(from, body, out))
            }
            other => Err(format!("node stage: unknown event {other:?}").into()),
        }
    }

    fn set_phase(&mut self, resource: &str, phase: Phase) {
        if let Some(p) = self.phase.get_mut(resource) {
            *p = phase;
        }
    }

    fn release(&mut self, resource: &str, ctx: &mut Ctx) -> HandlerResult {
        self.set_phase(resource, Phase::Idle);
        self.observe(ctx, resource, NodeEvent::Release);
        self.step(resource, ctx, |n, out| n.release(out))?;
        to_app(ctx, ("released", resource))?;
        Ok(())
    }

    fn step(
        &mut self,
        resource: &str,
        ctx: &mut Ctx,
        f: impl FnOnce(&mut dyn DynNode, &mut Vec<Effect>) -> Result<(), MutexError>,
    ) -> HandlerResult {
        if self.failed {
            return Err(format!("node {} stopped after an earlier error", self.spec.id).into());
        }
        let mut effects = std::mem::take(&mut self.effects);
        effects.clear();
        let Some(node) = self.nodes.get_mut(resource) else {
            return Err(MutexError::UnknownResource(resource.to_owned()).into());
        };
        let result = f(node.as_mut(), &mut effects);
        let holds = node.holds_token();
        let me = self.spec.id;
        let mut sent = Ok(());
        let mut auto_release = false;
        for e in effects.drain(..) {
            match e {
                Effect::Send {
                    to,
                    kind,
                    token,
                    body,
                } => {
                    self.observe(ctx, resource, NodeEvent::Send { to, kind, token });
                    let Some(port) = self.peers.get(to) else {
                        sent = Err(MutexError::UnknownNode {
                            node: to,
                            n: self.spec.n,
                        });
                        continue;
                    };
                    let ev = Event::new()
                        .with("msg")
                        .with(me as i64)
                        .with(resource)
                        .with(kind)
                        .with(body);
                    if let Err(e) = ctx.send(port, ev) {
                        // The network refused (queue full, peer gone): the algorithms assume
                        // reliable links, so this is reported, never hidden.
                        tracing::warn!(node = me, to, kind, error = %e, "mutex message not sent");
                    }
                }
                Effect::Local { kind } => self.observe(ctx, resource, NodeEvent::Local { kind }),
                Effect::Grant { fence } => {
                    self.observe(ctx, resource, NodeEvent::Grant(fence));
                    let withdrawn = matches!(
                        self.phase.get(resource),
                        Some(Phase::Requested { withdrawn: true })
                    );
                    self.set_phase(resource, Phase::Held);
                    if withdrawn {
                        auto_release = true;
                    } else {
                        to_app(ctx, ("grant", resource, fence as i64))?;
                    }
                }
            }
        }
        self.effects = effects;
        self.observe(ctx, resource, NodeEvent::Holds(holds));
        if auto_release && result.is_ok() && sent.is_ok() {
            // The application withdrew this request: give the CS back at once.
            return self.release(resource, ctx);
        }
        if let Err(e) = result.and(sent) {
            self.failed = true;
            self.observe(ctx, resource, NodeEvent::Error(&e));
            tracing::error!(node = me, resource, error = %e, "mutex node failed");
            return Err(e.into());
        }
        Ok(())
    }
}

/// A node stage (see the module docs): fail-stop, autostarted, named `mutex<id>`, of kind
/// [`NODE_KIND`] with attributes `algorithm`, `id`, `n` and `resources`.
pub fn node_stage(spec: NodeSpec) -> Result<Stage, MutexError> {
    // Validate now, so a bad configuration fails before the graph runs.
    NodeState::new(spec.clone())?;
    let resources: Vec<Value> = spec
        .resources
        .iter()
        .map(|r| Value::Str(r.clone()))
        .collect();
    let stage = Stage::stateful(
        node_name(spec.id),
        {
            let spec = spec.clone();
            move |_: &Attrs| -> Result<NodeState, BoxError> { Ok(NodeState::new(spec.clone())?) }
        },
        |state: &mut NodeState, ev: Event, ctx: &mut Ctx| state.handle(ev, ctx),
    )
    .fail_stop()
    .nonblocking()
    .autostart("start")
    .kind(NODE_KIND)
    .attr("algorithm", spec.algorithm.name())
    .attr("id", spec.id as i64)
    .attr("n", spec.n as i64)
    .attr("resources", Value::Array(resources));
    Ok(stage)
}

fn spec_from_attrs(attrs: &Attrs) -> Result<NodeSpec, MutexError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| MutexError::Config(format!("{what}: {e}"));
    let algorithm: String = attrs
        .get_as("algorithm")
        .map_err(|e| bad("attribute algorithm", &e))?;
    let id: usize = attrs.get_as("id").map_err(|e| bad("attribute id", &e))?;
    let n: usize = attrs.get_as("n").map_err(|e| bad("attribute n", &e))?;
    let resources: Vec<String> = attrs
        .get_as("resources")
        .map_err(|e| bad("attribute resources", &e))?;
    Ok(NodeSpec {
        algorithm: algorithm.parse()?,
        id,
        n,
        resources,
        observer: None,
    })
}

/// A node stage configured **by its attributes when it starts** (`algorithm`, `id`, `n`,
/// `resources`), for scripts that set them after building the stage (Lua:
/// `local m = leda.stage 'mutex0' (require 'leda.stage.mutex.node'); m.id = 0 ...`).
/// Fail-stop and autostarted like [`node_stage`].
pub fn node_stage_by_attrs(name: &str) -> Stage {
    Stage::stateful(
        name,
        |attrs: &Attrs| -> Result<NodeState, BoxError> {
            Ok(NodeState::new(spec_from_attrs(attrs)?)?)
        },
        |state: &mut NodeState, ev: Event, ctx: &mut Ctx| state.handle(ev, ctx),
    )
    .fail_stop()
    .autostart("start")
}

/// Rebuilds a node stage from the attributes [`node_stage`] gives it (for a daemon's registry).
/// The stage comes without its autostart event: a deployment ships the initial events.
pub fn node_stage_from_attrs(attrs: &Attrs) -> Result<Stage, MutexError> {
    let stage = node_stage(spec_from_attrs(attrs)?)?;
    stage.take_pushed();
    Ok(stage)
}

/// Connects the node stages pairwise (`peer<j>` of node `i` to node `j`), decoupled.
pub fn connect_peers(graph: &mut Graph, nodes: &[Stage]) {
    for (i, a) in nodes.iter().enumerate() {
        for (j, b) in nodes.iter().enumerate() {
            if i != j {
                graph.connect(a, peer_port(j), b);
            }
        }
    }
}

/// What a simulated application does: `requests` critical sections on `resource`, thinking
/// before each request and holding the CS for a while. Times are in virtual microseconds.
#[derive(Debug, Clone)]
pub struct ClientWorkload {
    /// The resource.
    pub resource: String,
    /// Critical sections to ask for.
    pub requests: usize,
    /// Time in the CS.
    pub cs_time: Latency,
    /// Time before each request.
    pub think_time: Latency,
    /// Seed of the client's own generator (think and CS times).
    pub seed: u64,
}

fn micros(ticks: u64) -> Duration {
    Duration::from_micros(ticks)
}

/// A workload client of node `id` (stage `client<id>`, serial): it asks its node stage (port
/// `mutex`) for the CS, holds it, releases it, and once the node stage confirms the release,
/// counts down `remaining` (shared by all clients of the run); the client that brings it to
/// zero quits the run.
pub fn client_stage(id: NodeId, work: ClientWorkload, remaining: Arc<AtomicUsize>) -> Stage {
    struct Client {
        work: ClientWorkload,
        rng: SplitMix64,
        left: usize,
        remaining: Arc<AtomicUsize>,
    }
    let seed = work
        .seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(id as u64);
    Stage::stateful(
        format!("client{id}"),
        move |_: &Attrs| -> Result<Client, BoxError> {
            Ok(Client {
                left: work.requests,
                rng: SplitMix64::new(seed),
                work: work.clone(),
                remaining: remaining.clone(),
            })
        },
        |c: &mut Client, ev: Event, ctx: &mut Ctx| {
            let tag: &str = ev.get(0)?;
            let resource = c.work.resource.clone();
            match tag {
                "start" => {
                    if c.left == 0 {
                        return Ok(());
                    }
                    let think = micros(c.work.think_time.sample(&mut c.rng));
                    let mut ctx2 = ctx.clone();
                    ctx.wait(async move {
                        ctx2.sleep(think).await;
                        ctx2.send("mutex", ("request", resource))?;
                        Ok(())
                    });
                }
                "grant" => {
                    let hold = micros(c.work.cs_time.sample(&mut c.rng));
                    let mut ctx2 = ctx.clone();
                    ctx.wait(async move {
                        ctx2.sleep(hold).await;
                        ctx2.send("mutex", ("release", resource))?;
                        Ok(())
                    });
                }
                "released" => {
                    c.left = c.left.saturating_sub(1);
                    if c.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
                        // The last critical section of the run is over (its release handled).
                        ctx.quit("done");
                    } else if c.left > 0 {
                        let think = micros(c.work.think_time.sample(&mut c.rng));
                        let mut ctx2 = ctx.clone();
                        ctx.wait(async move {
                            ctx2.sleep(think).await;
                            ctx2.send("mutex", ("request", resource))?;
                            Ok(())
                        });
                    }
                }
                other => return Err(format!("client: unexpected event {other:?}").into()),
            }
            Ok(())
        },
    )
    .serial()
    .autostart("start")
}
