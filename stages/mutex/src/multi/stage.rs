//! Multi-resource algorithms as Leda stages.
//!
//! A process of the group is one serial **multi node stage** (`multi<i>`) holding one
//! per-process state machine ([`MultiNode`], erased to [`DynMultiNode`] so the algorithm is
//! chosen by name, [`MultiAlgorithm`]). Resources are named: the stage is configured with a
//! list of `(name, instances)` ([`NamedSpace`]); type `r` of the algorithm's
//! [`ResourceSpace`] is the `r`-th name.
//!
//! | input event                    | meaning                                               |
//! |--------------------------------|-------------------------------------------------------|
//! | `("request", items)`           | the application asks for `items` (see [`NamedSpace::parse_request`]) |
//! | `("request", items, true)`     | try: granted now, or withdrawn (`multi-would-block`)  |
//! | `("release")`                  | the application leaves its CS, releasing everything   |
//! | `("cancel")`                   | withdraw the pending request (or release if granted)  |
//! | `("msg", from, body)`          | a protocol message from process `from`                |
//!
//! | output port | event                                                             |
//! |-------------|-------------------------------------------------------------------|
//! | `peer<j>`   | `("msg", me, body)` to process `j`'s stage                        |
//! | `grant`     | `("multi-grant", holds)` with `holds` an array of `[name, instance, fence]`; `("multi-released")` once a release (or a withdrawn grant) was handled; `("multi-would-block")` for a try that cannot be granted at once; `("multi-refused", why)` for a malformed request, a request while one is pending, a release without a grant |
//!
//! The tags differ from the single-resource node stage's ([`crate::stage`]) so one front stage
//! can talk to both. A withdrawn request stays in the algorithm (none of them can take a
//! request back); when its grant comes the stage releases at once and reports
//! `multi-released`. One outstanding request per process: several local clients are
//! multiplexed in front (the lock service's front stage).
//!
//! Stages are joined pairwise by decoupled connectors ([`crate::stage::connect_peers`]), so the
//! graph partitions into one cluster per process and runs under leda-core's simulated executor
//! ([`super::stage_sim`]), in one process, or over leda-net. A [`MultiObserver`] sees every
//! request, grant, release, message and token change, in (virtual) time.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use leda_core::port::Port;
use leda_core::prelude::*;

use crate::error::MutexError;
use crate::node::{Message, NodeId};
use crate::stage::peer_port;

use super::bouabdallah::{BlConfig, BlMsg, BlNode, BouabdallahLaforest};
use super::grid_aware::{GridConfig, GridMsg, GridNode};
use super::incremental::{IncrementalConfig, IncrementalMsg, IncrementalNode};
use super::lejeune::{Lejeune, LjConfig, LjMsg, LjNode};
use super::model::{Hold, MultiOutbox, MultiOutput, MultiRequest, MultiSystem, ResourceSpace};

/// The registry kind of multi node stages.
pub const MULTI_KIND: &str = "mutex.multi";

/// One process of a multi-resource algorithm: a pure state machine (no I/O, no clock), the
/// thing a [multi node stage](multi_node_stage) wraps.
pub trait MultiNode: Send + 'static {
    /// Protocol messages.
    type Msg: Message;

    /// This process's id.
    fn id(&self) -> NodeId;

    /// The local application asks for `req`; a [`MultiOutput::Grant`] follows now or later.
    fn on_request(
        &mut self,
        req: &MultiRequest,
        out: &mut MultiOutbox<Self::Msg>,
    ) -> Result<(), MutexError>;

    /// The local application leaves its CS and releases everything it holds.
    fn on_release(&mut self, out: &mut MultiOutbox<Self::Msg>) -> Result<(), MutexError>;

    /// A message from `from` arrived.
    fn on_message(
        &mut self,
        from: NodeId,
        msg: Self::Msg,
        out: &mut MultiOutbox<Self::Msg>,
    ) -> Result<(), MutexError>;

    /// For token algorithms: the flat instance ([`ResourceSpace::flat`]) whose token `msg`
    /// carries. Default: none.
    fn token_instance(msg: &Self::Msg) -> Option<usize> {
        let _ = msg;
        None
    }

    /// Whether the algorithm has one token per resource instance (then [`Self::holds_token`]
    /// and [`Self::token_instance`] are meaningful). Default: no.
    fn token_based(&self) -> bool {
        false
    }

    /// Whether this process holds the token of flat instance `flat`. Default: no.
    fn holds_token(&self, flat: usize) -> bool {
        let _ = flat;
        false
    }
}

impl MultiNode for IncrementalNode {
    type Msg = IncrementalMsg;

    fn id(&self) -> NodeId {
        IncrementalNode::id(self)
    }

    fn on_request(
        &mut self,
        req: &MultiRequest,
        out: &mut MultiOutbox<IncrementalMsg>,
    ) -> Result<(), MutexError> {
        IncrementalNode::on_request(self, req, out)
    }

    fn on_release(&mut self, out: &mut MultiOutbox<IncrementalMsg>) -> Result<(), MutexError> {
        IncrementalNode::on_release(self, out)
    }

    fn on_message(
        &mut self,
        from: NodeId,
        msg: IncrementalMsg,
        out: &mut MultiOutbox<IncrementalMsg>,
    ) -> Result<(), MutexError> {
        IncrementalNode::on_message(self, from, msg, out)
    }

    fn token_instance(msg: &IncrementalMsg) -> Option<usize> {
        msg.is_token().then_some(msg.lock)
    }

    fn token_based(&self) -> bool {
        true
    }

    fn holds_token(&self, flat: usize) -> bool {
        IncrementalNode::holds_token(self, flat)
    }
}

impl MultiNode for BlNode {
    type Msg = BlMsg;

    fn id(&self) -> NodeId {
        BlNode::id(self)
    }

    fn on_request(
        &mut self,
        req: &MultiRequest,
        out: &mut MultiOutbox<BlMsg>,
    ) -> Result<(), MutexError> {
        BlNode::on_request(self, req, out)
    }

    fn on_release(&mut self, out: &mut MultiOutbox<BlMsg>) -> Result<(), MutexError> {
        BlNode::on_release(self, out)
    }

    fn on_message(
        &mut self,
        from: NodeId,
        msg: BlMsg,
        out: &mut MultiOutbox<BlMsg>,
    ) -> Result<(), MutexError> {
        BlNode::on_message(self, from, msg, out)
    }

    fn token_instance(msg: &BlMsg) -> Option<usize> {
        <BouabdallahLaforest as MultiSystem>::token_instance(msg)
    }

    // Not token based for the stage monitor: free tokens travel inside the control token,
    // many per message, which the one-token-per-message count cannot follow (the group-level
    // driver of `bouabdallah` checks token uniqueness).
}

impl MultiNode for LjNode {
    type Msg = LjMsg;

    fn id(&self) -> NodeId {
        LjNode::id(self)
    }

    fn on_request(
        &mut self,
        req: &MultiRequest,
        out: &mut MultiOutbox<LjMsg>,
    ) -> Result<(), MutexError> {
        LjNode::on_request(self, req, out)
    }

    fn on_release(&mut self, out: &mut MultiOutbox<LjMsg>) -> Result<(), MutexError> {
        LjNode::on_release(self, out)
    }

    fn on_message(
        &mut self,
        from: NodeId,
        msg: LjMsg,
        out: &mut MultiOutbox<LjMsg>,
    ) -> Result<(), MutexError> {
        LjNode::on_message(self, from, msg, out)
    }

    fn token_instance(msg: &LjMsg) -> Option<usize> {
        <Lejeune as MultiSystem>::token_instance(msg)
    }

    fn token_based(&self) -> bool {
        true
    }

    fn holds_token(&self, flat: usize) -> bool {
        LjNode::holds_token(self, flat)
    }
}

impl MultiNode for GridNode {
    type Msg = GridMsg;

    fn id(&self) -> NodeId {
        GridNode::id(self)
    }

    fn on_request(
        &mut self,
        req: &MultiRequest,
        out: &mut MultiOutbox<GridMsg>,
    ) -> Result<(), MutexError> {
        let result = GridNode::on_request(self, req, out);
        // Measurement events are for the simulator; a service would only accumulate them.
        self.take_events();
        result
    }

    fn on_release(&mut self, out: &mut MultiOutbox<GridMsg>) -> Result<(), MutexError> {
        let result = GridNode::on_release(self, out);
        // Measurement events are for the simulator; a service would only accumulate them.
        self.take_events();
        result
    }

    fn on_message(
        &mut self,
        from: NodeId,
        msg: GridMsg,
        out: &mut MultiOutbox<GridMsg>,
    ) -> Result<(), MutexError> {
        let result = GridNode::on_message(self, from, msg, out);
        // Measurement events are for the simulator; a service would only accumulate them.
        self.take_events();
        result
    }

    // Not token based for the stage monitor: the control token carries free tokens, several
    // per message (the group-level driver of `grid_aware` checks token uniqueness).
}

/// The multi-resource algorithms that run as stages, chosen by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MultiAlgorithm {
    /// One Naimi–Tréhel per resource instance, locked in a global order
    /// ([`super::incremental`]).
    Incremental,
    /// Bouabdallah–Laforest with its control token ([`super::bouabdallah`], default
    /// configuration: CT initially at process 0, no fast path).
    BouabdallahLaforest,
    /// Lejeune–Arantes–Sopena–Sens without loans ([`super::lejeune`]; single-instance
    /// resources only).
    Lejeune,
    /// Lejeune et al. with the loan mechanism, threshold 1.
    LejeuneLoan,
    /// Vieira Neto's grid-aware algorithm ([`super::grid_aware`]), with the processes split
    /// evenly into the configured number of clusters ([`GridConfig::even`]).
    GridAware,
}

impl MultiAlgorithm {
    /// Every algorithm.
    pub const ALL: &'static [MultiAlgorithm] = &[
        MultiAlgorithm::Incremental,
        MultiAlgorithm::BouabdallahLaforest,
        MultiAlgorithm::Lejeune,
        MultiAlgorithm::LejeuneLoan,
        MultiAlgorithm::GridAware,
    ];

    /// The algorithm's name (`incremental`, `bouabdallah-laforest`, `lejeune`, `lejeune-loan`,
    /// `grid-aware`).
    pub fn name(self) -> &'static str {
        match self {
            MultiAlgorithm::Incremental => "incremental",
            MultiAlgorithm::BouabdallahLaforest => "bouabdallah-laforest",
            MultiAlgorithm::Lejeune => "lejeune",
            MultiAlgorithm::LejeuneLoan => "lejeune-loan",
            MultiAlgorithm::GridAware => "grid-aware",
        }
    }

    /// Whether the algorithm needs FIFO links.
    pub fn requires_fifo(self) -> bool {
        matches!(self, MultiAlgorithm::GridAware)
    }

    /// Whether the algorithm handles types with several instances.
    pub fn multi_instance(self) -> bool {
        !matches!(self, MultiAlgorithm::Lejeune | MultiAlgorithm::LejeuneLoan)
    }

    /// Process `id` of a group of `n` over `space` (one cluster), type-erased.
    pub fn node(
        self,
        id: NodeId,
        n: usize,
        space: &ResourceSpace,
    ) -> Result<Box<dyn DynMultiNode>, MutexError> {
        self.node_in_clusters(id, n, 1, space)
    }

    /// Process `id` of a group of `n` split evenly into `clusters` clusters (used by the
    /// grid-aware algorithm only), over `space`, type-erased.
    pub fn node_in_clusters(
        self,
        id: NodeId,
        n: usize,
        clusters: usize,
        space: &ResourceSpace,
    ) -> Result<Box<dyn DynMultiNode>, MutexError> {
        check_group(id, n)?;
        Ok(match self {
            MultiAlgorithm::Incremental => erase(IncrementalNode::new(
                id,
                n,
                space.clone(),
                &IncrementalConfig::default(),
            )?),
            MultiAlgorithm::BouabdallahLaforest => {
                erase(BlNode::new(id, n, space.clone(), &BlConfig::default())?)
            }
            MultiAlgorithm::Lejeune => erase(LjNode::new(id, n, space, &LjConfig::default())?),
            MultiAlgorithm::LejeuneLoan => {
                erase(LjNode::new(id, n, space, &LjConfig::with_loan())?)
            }
            MultiAlgorithm::GridAware => erase(GridNode::with_config(
                id,
                space,
                &GridConfig::even(n, clusters)?,
            )?),
        })
    }
}

fn check_group(id: NodeId, n: usize) -> Result<(), MutexError> {
    if n == 0 {
        return Err(MutexError::Config(
            "a group needs at least one process".into(),
        ));
    }
    if id >= n {
        return Err(MutexError::UnknownNode { node: id, n });
    }
    Ok(())
}

impl fmt::Display for MultiAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MultiAlgorithm {
    type Err = MutexError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MultiAlgorithm::ALL
            .iter()
            .copied()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = MultiAlgorithm::ALL.iter().map(|a| a.name()).collect();
                MutexError::Config(format!(
                    "unknown multi-resource algorithm {s:?}; known: {}",
                    names.join(", ")
                ))
            })
    }
}

/// One effect of a [`DynMultiNode`] handler.
#[derive(Debug, Clone)]
pub enum MultiEffect {
    /// Send `body` (a message of kind `kind`) to process `to`.
    Send {
        /// Destination.
        to: NodeId,
        /// Message kind.
        kind: &'static str,
        /// The flat instance whose token the message carries, if any.
        token: Option<usize>,
        /// The message as a dynamic value.
        body: Value,
    },
    /// The local application may enter its CS holding `holds`.
    Grant {
        /// Every instance held, with its fence.
        holds: Vec<Hold>,
    },
}

/// A type-erased [`MultiNode`]: messages as dynamic [`Value`]s.
pub trait DynMultiNode: Send {
    /// This process's id.
    fn id(&self) -> NodeId;
    /// The local application asks for `req`.
    fn request(&mut self, req: &MultiRequest, out: &mut Vec<MultiEffect>)
    -> Result<(), MutexError>;
    /// The local application releases everything.
    fn release(&mut self, out: &mut Vec<MultiEffect>) -> Result<(), MutexError>;
    /// A message `body` from `from` arrived.
    fn message(
        &mut self,
        from: NodeId,
        body: &Value,
        out: &mut Vec<MultiEffect>,
    ) -> Result<(), MutexError>;
    /// The flat instance whose token `body` carries, if it is a token message.
    fn token_of(&self, body: &Value) -> Option<usize>;
    /// Whether the algorithm has one token per instance.
    fn token_based(&self) -> bool;
    /// Whether this process holds the token of flat instance `flat`.
    fn holds_token(&self, flat: usize) -> bool;
}

struct Erased<N: MultiNode> {
    node: N,
    out: MultiOutbox<N::Msg>,
}

/// Erases a [`MultiNode`]'s message type.
pub fn erase<N: MultiNode>(node: N) -> Box<dyn DynMultiNode> {
    Box::new(Erased {
        node,
        out: MultiOutbox::new(),
    })
}

impl<N: MultiNode> Erased<N> {
    fn with(
        &mut self,
        out: &mut Vec<MultiEffect>,
        f: impl FnOnce(&mut N, &mut MultiOutbox<N::Msg>) -> Result<(), MutexError>,
    ) -> Result<(), MutexError> {
        let _ = self.out.drain();
        let r = f(&mut self.node, &mut self.out);
        let me = self.node.id();
        for o in self.out.drain() {
            out.push(match o {
                MultiOutput::Send { from, to, msg } => {
                    if from != me {
                        return Err(MutexError::Protocol {
                            node: me,
                            detail: format!("a message sent on behalf of process {from}"),
                        });
                    }
                    MultiEffect::Send {
                        to,
                        kind: msg.kind(),
                        token: N::token_instance(&msg),
                        body: Value::from_serde(&msg)
                            .map_err(|e| MutexError::Encoding(e.to_string()))?,
                    }
                }
                MultiOutput::Grant { node, holds } => {
                    if node != me {
                        return Err(MutexError::Protocol {
                            node: me,
                            detail: format!("a grant for process {node}"),
                        });
                    }
                    MultiEffect::Grant { holds }
                }
            });
        }
        r
    }
}

impl<N: MultiNode> DynMultiNode for Erased<N> {
    fn id(&self) -> NodeId {
        self.node.id()
    }

    fn request(
        &mut self,
        req: &MultiRequest,
        out: &mut Vec<MultiEffect>,
    ) -> Result<(), MutexError> {
        self.with(out, |n, o| n.on_request(req, o))
    }

    fn release(&mut self, out: &mut Vec<MultiEffect>) -> Result<(), MutexError> {
        self.with(out, |n, o| n.on_release(o))
    }

    fn message(
        &mut self,
        from: NodeId,
        body: &Value,
        out: &mut Vec<MultiEffect>,
    ) -> Result<(), MutexError> {
        let msg: N::Msg = body.to().map_err(|e| MutexError::Protocol {
            node: self.node.id(),
            detail: format!("undecodable message from {from}: {e}"),
        })?;
        self.with(out, |n, o| n.on_message(from, msg, o))
    }

    fn token_of(&self, body: &Value) -> Option<usize> {
        body.to::<N::Msg>().ok().and_then(|m| N::token_instance(&m))
    }

    fn token_based(&self) -> bool {
        self.node.token_based()
    }

    fn holds_token(&self, flat: usize) -> bool {
        self.node.holds_token(flat)
    }
}

/// Why a multi-resource request is refused before it reaches the algorithm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MultiRequestError {
    /// The request names no resource.
    #[error("a multi-resource request must name at least one resource")]
    Empty,
    /// A name the group was not configured with.
    #[error("unknown resource {0:?}")]
    UnknownResource(String),
    /// A resource named twice in one request.
    #[error("resource {0:?} is named twice in one request")]
    Duplicate(String),
    /// A count outside `1..=capacity`.
    #[error("{count} instances of {resource:?} asked for, it has {capacity}")]
    Count {
        /// The resource.
        resource: String,
        /// The count asked for.
        count: i64,
        /// Its number of instances.
        capacity: u32,
    },
    /// The request is not a list of names or of `[name, count]` pairs.
    #[error("malformed multi-resource request: {0}")]
    Malformed(String),
}

impl MultiRequestError {
    /// A short stable name of the error (`empty`, `unknown`, `duplicate`, `count`,
    /// `malformed`), for the wire and for Lua.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::UnknownResource(_) => "unknown",
            Self::Duplicate(_) => "duplicate",
            Self::Count { .. } => "count",
            Self::Malformed(_) => "malformed",
        }
    }

    /// The error as event arguments: `kind, resource, count, capacity, message` (unused fields
    /// are `""` or 0).
    pub fn to_values(&self) -> Vec<Value> {
        let (resource, count, capacity) = match self {
            Self::Empty => (String::new(), 0, 0),
            Self::UnknownResource(r) | Self::Duplicate(r) => (r.clone(), 0, 0),
            Self::Count {
                resource,
                count,
                capacity,
            } => (resource.clone(), *count, i64::from(*capacity)),
            Self::Malformed(m) => (m.clone(), 0, 0),
        };
        vec![
            Value::from(self.kind()),
            Value::Str(resource),
            Value::Int(count),
            Value::Int(capacity),
            Value::Str(self.to_string()),
        ]
    }

    /// Rebuilds an error from [`Self::to_values`]'s arguments.
    pub fn from_values(args: &[Value]) -> Result<Self, MutexError> {
        let text = |i: usize| {
            args.get(i)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_default()
        };
        let int = |i: usize| args.get(i).and_then(Value::as_int).unwrap_or(0);
        Ok(match args.first().and_then(Value::as_str) {
            Some("empty") => Self::Empty,
            Some("unknown") => Self::UnknownResource(text(1)),
            Some("duplicate") => Self::Duplicate(text(1)),
            Some("count") => Self::Count {
                resource: text(1),
                count: int(2),
                capacity: u32::try_from(int(3)).unwrap_or(0),
            },
            Some("malformed") => Self::Malformed(text(1)),
            other => {
                return Err(MutexError::Encoding(format!(
                    "unknown request error kind {other:?}"
                )));
            }
        })
    }
}

/// Named resource types with their numbers of instances: the configuration of a multi node
/// stage and of the lock service's multi-resource locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedSpace {
    names: Vec<String>,
    space: ResourceSpace,
}

impl NamedSpace {
    /// Resources `(name, instances)`; fails on an empty list, an empty or repeated name, or
    /// zero instances.
    pub fn new(resources: &[(String, u32)]) -> Result<Self, MutexError> {
        let mut seen = std::collections::BTreeSet::new();
        for (name, _) in resources {
            if name.is_empty() {
                return Err(MutexError::Config("a resource has an empty name".into()));
            }
            if !seen.insert(name.as_str()) {
                return Err(MutexError::Config(format!(
                    "resource {name:?} is configured twice"
                )));
            }
        }
        let space = ResourceSpace::with_capacities(resources.iter().map(|(_, k)| *k).collect())?;
        Ok(Self {
            names: resources.iter().map(|(n, _)| n.clone()).collect(),
            space,
        })
    }

    /// The algorithm's view: type `r` is the `r`-th name.
    pub fn space(&self) -> &ResourceSpace {
        &self.space
    }

    /// The names, in type order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The type of `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Whether `name` is configured.
    pub fn contains(&self, name: &str) -> bool {
        self.index(name).is_some()
    }

    /// `(name, instances)` pairs, in type order.
    pub fn resources(&self) -> Vec<(String, u32)> {
        self.names
            .iter()
            .cloned()
            .zip(self.space.capacities().iter().copied())
            .collect()
    }

    /// The configuration as a value: an array of `[name, instances]`.
    pub fn to_value(&self) -> Value {
        Value::Array(
            self.resources()
                .into_iter()
                .map(|(n, k)| Value::Array(vec![Value::Str(n), Value::Int(i64::from(k))]))
                .collect(),
        )
    }

    /// Reads a configuration value: an array of `[name, instances]` pairs or of names (one
    /// instance each), or a map `name → instances`.
    pub fn from_value(v: &Value) -> Result<Self, MutexError> {
        let pairs = name_counts(v).map_err(|e| MutexError::Config(format!("resources: {e}")))?;
        let mut out = Vec::with_capacity(pairs.len());
        for (name, k) in pairs {
            let k = u32::try_from(k)
                .map_err(|_| MutexError::Config(format!("resource {name:?}: {k} instances")))?;
            out.push((name, k));
        }
        Self::new(&out)
    }

    /// Validates a request given as `(name, count)` pairs.
    pub fn request(&self, items: &[(String, i64)]) -> Result<MultiRequest, MultiRequestError> {
        if items.is_empty() {
            return Err(MultiRequestError::Empty);
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut typed = Vec::with_capacity(items.len());
        for (name, count) in items {
            if !seen.insert(name.as_str()) {
                return Err(MultiRequestError::Duplicate(name.clone()));
            }
            let r = self
                .index(name)
                .ok_or_else(|| MultiRequestError::UnknownResource(name.clone()))?;
            let capacity = self.space.capacity(r);
            let c = u32::try_from(*count)
                .ok()
                .filter(|&c| c >= 1 && c <= capacity)
                .ok_or_else(|| MultiRequestError::Count {
                    resource: name.clone(),
                    count: *count,
                    capacity,
                })?;
            typed.push((r, c));
        }
        MultiRequest::new(typed, &self.space)
            .map_err(|e| MultiRequestError::Malformed(e.to_string()))
    }

    /// Reads a request's `(name, count)` items from a value (the forms of
    /// [`Self::parse_request`]) without checking them against any configuration.
    pub fn parse_items(v: &Value) -> Result<Vec<(String, i64)>, MultiRequestError> {
        name_counts(v).map_err(MultiRequestError::Malformed)
    }

    /// Validates a request given as a value: an array whose items are names (one instance) or
    /// `[name, count]` pairs, or a map `name → count`.
    pub fn parse_request(&self, v: &Value) -> Result<MultiRequest, MultiRequestError> {
        self.request(&name_counts(v).map_err(MultiRequestError::Malformed)?)
    }

    /// A request as a value: an array of `[name, count]`.
    pub fn request_value(&self, req: &MultiRequest) -> Value {
        Value::Array(
            req.items()
                .iter()
                .map(|&(r, c)| {
                    Value::Array(vec![
                        Value::from(self.names.get(r).map_or("", String::as_str)),
                        Value::Int(i64::from(c)),
                    ])
                })
                .collect(),
        )
    }

    /// Holds as a value: an array of `[name, instance, fence]`.
    pub fn holds_value(&self, holds: &[Hold]) -> Value {
        Value::Array(
            holds
                .iter()
                .map(|h| {
                    Value::Array(vec![
                        Value::from(self.names.get(h.resource).map_or("", String::as_str)),
                        Value::Int(i64::from(h.instance)),
                        Value::Int(h.fence as i64),
                    ])
                })
                .collect(),
        )
    }
}

/// Reads `[name | [name, count], ...]` or `{name = count}` into pairs (count 1 for a bare name).
fn name_counts(v: &Value) -> Result<Vec<(String, i64)>, String> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::Str(s) => Ok((s.clone(), 1)),
                Value::Array(pair) => match pair.as_slice() {
                    [Value::Str(s), c] => c
                        .as_int()
                        .map(|c| (s.clone(), c))
                        .ok_or_else(|| format!("count of {s:?} is a {}", c.type_name())),
                    _ => Err("a pair must be [name, count]".to_owned()),
                },
                other => Err(format!(
                    "an item must be a name or [name, count], not a {}",
                    other.type_name()
                )),
            })
            .collect(),
        Value::Map(entries) => {
            let mut out: Vec<(String, i64)> = entries
                .iter()
                .map(|(k, c)| match (k, c.as_int()) {
                    (Value::Str(s), Some(c)) => Ok((s.clone(), c)),
                    _ => Err("a map entry must be name = count".to_owned()),
                })
                .collect::<Result<_, _>>()?;
            // Lua tables have no order: make the result independent of it.
            out.sort();
            Ok(out)
        }
        // An empty Lua table may arrive as nil or as an empty map.
        Value::Nil => Ok(Vec::new()),
        other => Err(format!(
            "expected a list of resources, got a {}",
            other.type_name()
        )),
    }
}

/// What a multi node stage reports to its [`MultiObserver`].
#[derive(Debug, Clone, PartialEq)]
pub enum MultiNodeEvent<'a> {
    /// The application asked for `req`.
    Request(&'a MultiRequest),
    /// The CS was granted holding these instances.
    Grant(&'a [Hold]),
    /// The application left the CS (or a withdrawn grant was given back).
    Release,
    /// A message was sent to `to`.
    Send {
        /// Destination.
        to: NodeId,
        /// Kind.
        kind: &'static str,
        /// The flat instance whose token it carries, if any.
        token: Option<usize>,
    },
    /// A message from `from` was delivered.
    Deliver {
        /// Sender.
        from: NodeId,
        /// The flat instance whose token it carries, if any.
        token: Option<usize>,
    },
    /// After a handler, for token algorithms: per flat instance, whether this process holds
    /// its token.
    Tokens(&'a [bool]),
    /// A handler failed (the process refuses input from now on).
    Error(&'a MutexError),
}

/// Sees what multi node stages do, from inside their handlers, in the order they run.
pub trait MultiObserver: Send + Sync + 'static {
    /// `node`'s stage did something at `time` (seconds; virtual in simulation).
    fn observe(&self, time: f64, node: NodeId, ev: MultiNodeEvent<'_>);
}

/// How a multi node stage is built.
#[derive(Clone)]
pub struct MultiNodeSpec {
    /// The algorithm.
    pub algorithm: MultiAlgorithm,
    /// This process.
    pub id: NodeId,
    /// Group size.
    pub n: usize,
    /// The resources.
    pub resources: NamedSpace,
    /// Number of clusters the group is split into evenly (`p * clusters / n`); only the
    /// grid-aware algorithm uses it. 1 unless set.
    pub clusters: usize,
    /// Observer, if any.
    pub observer: Option<Arc<dyn MultiObserver>>,
}

impl fmt::Debug for MultiNodeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiNodeSpec")
            .field("algorithm", &self.algorithm)
            .field("id", &self.id)
            .field("n", &self.n)
            .field("resources", &self.resources)
            .field("clusters", &self.clusters)
            .finish()
    }
}

/// The name of process `i`'s multi node stage (`multi<i>`).
pub fn multi_node_name(i: NodeId) -> String {
    format!("multi{i}")
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Idle,
    /// `withdrawn`: the application gave up; the grant is released when it comes.
    Requested {
        withdrawn: bool,
    },
    Held,
}

struct MultiState {
    spec: MultiNodeSpec,
    node: Box<dyn DynMultiNode>,
    phase: Phase,
    failed: bool,
    peers: Vec<Port>,
    effects: Vec<MultiEffect>,
    tokens: Vec<bool>,
}

impl MultiState {
    fn new(spec: MultiNodeSpec) -> Result<Self, MutexError> {
        let node = spec.algorithm.node_in_clusters(
            spec.id,
            spec.n,
            spec.clusters,
            spec.resources.space(),
        )?;
        let peers = (0..spec.n).map(|j| Port::from(peer_port(j))).collect();
        let tokens = vec![false; spec.resources.space().total_instances()];
        Ok(Self {
            spec,
            node,
            phase: Phase::Idle,
            failed: false,
            peers,
            effects: Vec::new(),
            tokens,
        })
    }

    fn observe(&self, ctx: &Ctx, ev: MultiNodeEvent<'_>) {
        if let Some(o) = &self.spec.observer {
            o.observe(ctx.gettime(), self.spec.id, ev);
        }
    }

    fn refuse(ctx: &mut Ctx, why: String) -> HandlerResult {
        ctx.send("grant", ("multi-refused", why))?;
        Ok(())
    }

    fn handle(&mut self, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let tag: &str = ev.get(0)?;
        match tag {
            "request" => {
                if self.phase != Phase::Idle {
                    return Self::refuse(ctx, "a request is already pending or held".into());
                }
                let req = match ev.arg(1) {
                    None => Err(MultiRequestError::Malformed("no resources given".into())),
                    Some(v) => self.spec.resources.parse_request(v),
                };
                let req = match req {
                    Ok(r) => r,
                    Err(e) => return Self::refuse(ctx, e.to_string()),
                };
                let try_only = ev.arg(2).and_then(Value::as_bool).unwrap_or(false);
                self.phase = Phase::Requested { withdrawn: false };
                self.observe(ctx, MultiNodeEvent::Request(&req));
                self.step(ctx, |n, out| n.request(&req, out))?;
                if try_only && self.phase != Phase::Held {
                    // Not grantable without waiting for other processes: withdraw.
                    self.phase = Phase::Requested { withdrawn: true };
                    ctx.send("grant", "multi-would-block")?;
                }
                Ok(())
            }
            "release" => {
                if self.phase != Phase::Held {
                    return Self::refuse(ctx, "release without holding".into());
                }
                self.release(ctx)
            }
            "cancel" => match self.phase {
                Phase::Requested { .. } => {
                    self.phase = Phase::Requested { withdrawn: true };
                    Ok(())
                }
                Phase::Held => self.release(ctx),
                Phase::Idle => {
                    ctx.send("grant", "multi-released")?;
                    Ok(())
                }
            },
            "msg" => {
                let from: NodeId = ev.get(1)?;
                let body = ev
                    .arg(2)
                    .ok_or_else(|| MutexError::Encoding("message without a body".into()))?;
                if self.spec.observer.is_some() {
                    let token = self.node.token_of(body);
                    self.observe(ctx, MultiNodeEvent::Deliver { from, token });
                }
                self.step(ctx, |n, out| n.message(from, body, out))
            }
            other => Err(format!("multi node stage: unknown event {other:?}").into()),
        }
    }

    fn release(&mut self, ctx: &mut Ctx) -> HandlerResult {
        self.phase = Phase::Idle;
        self.observe(ctx, MultiNodeEvent::Release);
        self.step(ctx, |n, out| n.release(out))?;
        ctx.send("grant", "multi-released")?;
        Ok(())
    }

    fn step(
        &mut self,
        ctx: &mut Ctx,
        f: impl FnOnce(&mut dyn DynMultiNode, &mut Vec<MultiEffect>) -> Result<(), MutexError>,
    ) -> HandlerResult {
        let me = self.spec.id;
        if self.failed {
            return Err(format!("multi node {me} stopped after an earlier error").into());
        }
        let mut effects = std::mem::take(&mut self.effects);
        effects.clear();
        let result = f(self.node.as_mut(), &mut effects);
        let mut sent = Ok(());
        let mut auto_release = false;
        for e in effects.drain(..) {
            match e {
                MultiEffect::Send {
                    to,
                    kind,
                    token,
                    body,
                } => {
                    self.observe(ctx, MultiNodeEvent::Send { to, kind, token });
                    let Some(port) = self.peers.get(to) else {
                        sent = Err(MutexError::UnknownNode {
                            node: to,
                            n: self.spec.n,
                        });
                        continue;
                    };
                    let ev = Event::new().with("msg").with(me as i64).with(body);
                    if let Err(e) = ctx.send(port, ev) {
                        // The algorithms assume reliable links: reported, never hidden.
                        tracing::warn!(node = me, to, kind, error = %e, "multi message not sent");
                    }
                }
                MultiEffect::Grant { holds } => {
                    self.observe(ctx, MultiNodeEvent::Grant(&holds));
                    let withdrawn = self.phase == Phase::Requested { withdrawn: true };
                    self.phase = Phase::Held;
                    if withdrawn {
                        auto_release = true;
                    } else {
                        let v = self.spec.resources.holds_value(&holds);
                        ctx.send("grant", ("multi-grant", v))?;
                    }
                }
            }
        }
        self.effects = effects;
        if self.spec.observer.is_some() && self.node.token_based() {
            for (t, h) in self.tokens.iter_mut().enumerate() {
                *h = self.node.holds_token(t);
            }
            self.observe(ctx, MultiNodeEvent::Tokens(&self.tokens));
        }
        if auto_release && result.is_ok() && sent.is_ok() {
            // The application withdrew this request: give everything back at once.
            return self.release(ctx);
        }
        if let Err(e) = result.and(sent) {
            self.failed = true;
            self.observe(ctx, MultiNodeEvent::Error(&e));
            tracing::error!(node = me, error = %e, "multi node failed");
            return Err(e.into());
        }
        Ok(())
    }
}

/// A multi node stage (see the module docs): serial, named `multi<id>`, of kind
/// [`MULTI_KIND`] with attributes `algorithm`, `id`, `n`, `clusters` and `resources`
/// (`[[name, k], ...]`).
pub fn multi_node_stage(spec: MultiNodeSpec) -> Result<Stage, MutexError> {
    // Validate now, so a bad configuration fails before the graph runs.
    MultiState::new(spec.clone())?;
    let stage = Stage::stateful(
        multi_node_name(spec.id),
        {
            let spec = spec.clone();
            move |_: &Attrs| -> Result<MultiState, BoxError> { Ok(MultiState::new(spec.clone())?) }
        },
        |state: &mut MultiState, ev: Event, ctx: &mut Ctx| state.handle(ev, ctx),
    )
    .serial()
    .kind(MULTI_KIND)
    .attr("algorithm", spec.algorithm.name())
    .attr("id", spec.id as i64)
    .attr("n", spec.n as i64)
    .attr("clusters", spec.clusters as i64)
    .attr("resources", spec.resources.to_value());
    Ok(stage)
}

fn spec_from_attrs(attrs: &Attrs) -> Result<MultiNodeSpec, MutexError> {
    let bad = |what: &str, e: &dyn fmt::Display| MutexError::Config(format!("{what}: {e}"));
    let algorithm: String = attrs
        .get_as("algorithm")
        .map_err(|e| bad("attribute algorithm", &e))?;
    let id: usize = attrs.get_as("id").map_err(|e| bad("attribute id", &e))?;
    let n: usize = attrs.get_as("n").map_err(|e| bad("attribute n", &e))?;
    let clusters: usize = match attrs.get("clusters") {
        None | Some(Value::Nil) => 1,
        Some(_) => attrs
            .get_as("clusters")
            .map_err(|e| bad("attribute clusters", &e))?,
    };
    let resources = attrs
        .get("resources")
        .ok_or_else(|| MutexError::Config("attribute resources is missing".into()))?;
    Ok(MultiNodeSpec {
        algorithm: algorithm.parse()?,
        id,
        n,
        resources: NamedSpace::from_value(resources)?,
        clusters,
        observer: None,
    })
}

/// A multi node stage configured **by its attributes when it starts** (`algorithm`, `id`, `n`,
/// `resources`, optionally `clusters`), for scripts that set them after building the stage (Lua:
/// `local m = leda.stage 'multi0' (require 'leda.stage.mutex.multi'); m.id = 0 ...`).
pub fn multi_node_stage_by_attrs(name: &str) -> Stage {
    Stage::stateful(
        name,
        |attrs: &Attrs| -> Result<MultiState, BoxError> {
            Ok(MultiState::new(spec_from_attrs(attrs)?)?)
        },
        |state: &mut MultiState, ev: Event, ctx: &mut Ctx| state.handle(ev, ctx),
    )
    .serial()
}

/// Rebuilds a multi node stage from the attributes [`multi_node_stage`] gives it (for a
/// daemon's registry).
pub fn multi_node_stage_from_attrs(attrs: &Attrs) -> Result<Stage, MutexError> {
    multi_node_stage(spec_from_attrs(attrs)?)
}

/// Decodes the holds of a `("multi-grant", holds)` event into `(name, instance, fence)`
/// triples.
pub fn decode_holds(v: &Value) -> Result<Vec<(String, u32, u64)>, MutexError> {
    let bad = || MutexError::Encoding("holds must be [[name, instance, fence], ...]".into());
    let items = v.as_array().ok_or_else(bad)?;
    items
        .iter()
        .map(|h| match h.as_array() {
            Some([name, inst, fence]) => Ok((
                name.as_str().ok_or_else(bad)?.to_owned(),
                inst.as_int()
                    .and_then(|i| u32::try_from(i).ok())
                    .ok_or_else(bad)?,
                fence
                    .as_int()
                    .and_then(|f| u64::try_from(f).ok())
                    .ok_or_else(bad)?,
            )),
            _ => Err(bad()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> NamedSpace {
        NamedSpace::new(&[("a".into(), 1), ("b".into(), 3)]).unwrap()
    }

    #[test]
    fn requests_parse_in_every_form_and_bad_ones_get_typed_errors() {
        let s = space();
        let names = Value::Array(vec!["b".into(), "a".into()]);
        assert_eq!(s.parse_request(&names).unwrap().items(), &[(0, 1), (1, 1)]);
        let pairs = Value::Array(vec![Value::Array(vec!["b".into(), Value::Int(3)])]);
        assert_eq!(s.parse_request(&pairs).unwrap().items(), &[(1, 3)]);
        let map = Value::Map(vec![
            ("b".into(), Value::Int(2)),
            ("a".into(), Value::Int(1)),
        ]);
        assert_eq!(s.parse_request(&map).unwrap().items(), &[(0, 1), (1, 2)]);
        assert_eq!(
            s.parse_request(&Value::Array(vec![])),
            Err(MultiRequestError::Empty)
        );
        assert_eq!(
            s.parse_request(&Value::Array(vec!["z".into()])),
            Err(MultiRequestError::UnknownResource("z".into()))
        );
        assert_eq!(
            s.parse_request(&Value::Array(vec!["a".into(), "a".into()])),
            Err(MultiRequestError::Duplicate("a".into()))
        );
        let four = Value::Array(vec![Value::Array(vec!["b".into(), Value::Int(4)])]);
        let err = s.parse_request(&four).unwrap_err();
        assert_eq!(
            err,
            MultiRequestError::Count {
                resource: "b".into(),
                count: 4,
                capacity: 3
            }
        );
        assert_eq!(
            MultiRequestError::from_values(&err.to_values()).unwrap(),
            err
        );
        assert!(matches!(
            s.parse_request(&Value::Int(3)),
            Err(MultiRequestError::Malformed(_))
        ));
    }

    #[test]
    fn configurations_are_validated_and_round_trip() {
        let s = space();
        assert_eq!(NamedSpace::from_value(&s.to_value()).unwrap(), s);
        assert!(NamedSpace::new(&[]).is_err());
        assert!(NamedSpace::new(&[("a".into(), 1), ("a".into(), 2)]).is_err());
        assert!(NamedSpace::new(&[("a".into(), 0)]).is_err());
        assert_eq!(
            "incremental".parse::<MultiAlgorithm>().unwrap(),
            MultiAlgorithm::Incremental
        );
        assert!("nope".parse::<MultiAlgorithm>().is_err());
        assert!(MultiAlgorithm::Incremental.node(3, 3, s.space()).is_err());
    }

    #[test]
    fn erased_nodes_exchange_values_and_grant_with_names() {
        let s = space();
        let mut a = MultiAlgorithm::Incremental.node(0, 2, s.space()).unwrap();
        let mut b = MultiAlgorithm::Incremental.node(1, 2, s.space()).unwrap();
        // Node 1 asks for `a` (instance token at node 0): it must ask node 0.
        let req = s.request(&[("a".into(), 1)]).unwrap();
        let mut out = Vec::new();
        b.request(&req, &mut out).unwrap();
        let Some(MultiEffect::Send { to: 0, body, .. }) = out.pop() else {
            panic!("a request to node 0 expected");
        };
        a.message(1, &body, &mut out).unwrap();
        let Some(MultiEffect::Send {
            to: 1,
            body,
            token: Some(0),
            ..
        }) = out.pop()
        else {
            panic!("the token of instance 0 expected");
        };
        b.message(0, &body, &mut out).unwrap();
        let Some(MultiEffect::Grant { holds }) = out.pop() else {
            panic!("a grant expected");
        };
        let decoded = decode_holds(&s.holds_value(&holds)).unwrap();
        assert_eq!(decoded.len(), 1);
        assert_eq!(decoded[0].0, "a");
        assert!(b.holds_token(0) && !a.holds_token(0));
    }
}
