//! The algorithms a multi node stage can run: the [`MultiNode`] state-machine interface,
//! its implementation for each algorithm of this crate, and [`MultiAlgorithm`], which
//! picks one by name and builds a group of nodes. Owns nothing of the stage itself
//! (events, ports, the request format): that is the parent module's.

use std::fmt;
use std::str::FromStr;

use crate::error::MutexError;
use crate::node::{Message, NodeId};

use super::super::bouabdallah::{BlConfig, BlMsg, BlNode};
use super::super::grid_aware::{GridConfig, GridMsg, GridNode};
use super::super::incremental::{IncrementalConfig, IncrementalMsg, IncrementalNode};
use super::super::lejeune::{Lejeune, LjConfig, LjMsg, LjNode};
use super::super::model::{MultiOutbox, MultiRequest, MultiSystem, ResourceSpace};
use super::{DynMultiNode, erase};

/// One process of a multi-resource algorithm: a pure state machine (no I/O, no clock), the
/// thing a [multi node stage](super::multi_node_stage) wraps.
pub trait MultiNode: Send + 'static {
    /// Protocol messages.
    type Msg: Message;

    /// This process's id.
    fn id(&self) -> NodeId;

    /// The local application asks for `req`; a [`MultiOutput::Grant`](crate::multi::MultiOutput::Grant) follows now or later.
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
    /// ([`crate::multi::incremental`]).
    Incremental,
    /// Bouabdallah–Laforest with its control token ([`crate::multi::bouabdallah`], default
    /// configuration: CT initially at process 0, no fast path).
    BouabdallahLaforest,
    /// Lejeune–Arantes–Sopena–Sens without loans ([`crate::multi::lejeune`]; single-instance
    /// resources only).
    Lejeune,
    /// Lejeune et al. with the loan mechanism, threshold 1.
    LejeuneLoan,
    /// Vieira Neto's grid-aware algorithm ([`crate::multi::grid_aware`]), with the processes split
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
