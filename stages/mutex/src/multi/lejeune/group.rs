//! A group of `n` Lejeune et al. sites as one [`MultiSystem`] for the drivers
//! (simulator, checker, experiments): routes messages between the nodes. Owns no
//! algorithm logic.

use crate::error::MutexError;
use crate::multi::model::{MultiOutbox, MultiRequest, MultiSystem, ResourceSpace};
use crate::node::NodeId;

use super::{LjConfig, LjMsg, LjNode};

/// The Lejeune et al. algorithm for a group of `n` sites.
#[derive(Debug, Clone)]
pub struct Lejeune {
    nodes: Vec<LjNode>,
    loan: bool,
}

impl Lejeune {
    /// Builds the `n` sites over `space` (single-instance resources).
    pub fn new(n: usize, space: ResourceSpace, config: LjConfig) -> Result<Self, MutexError> {
        if n == 0 {
            return Err(MutexError::Config(
                "a group needs at least one process".into(),
            ));
        }
        let nodes = (0..n)
            .map(|id| LjNode::new(id, n, &space, &config))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            nodes,
            loan: config.loan,
        })
    }

    /// The sites.
    pub fn nodes(&self) -> &[LjNode] {
        &self.nodes
    }

    /// Whether the loan mechanism is on.
    pub fn loan(&self) -> bool {
        self.loan
    }

    /// Loans granted by all sites.
    pub fn loans(&self) -> u64 {
        self.nodes.iter().map(LjNode::loans_granted).sum()
    }

    /// Tokens ceded by waiting sites to requests with priority.
    pub fn cessions(&self) -> u64 {
        self.nodes.iter().map(LjNode::cessions).sum()
    }

    fn node(&mut self, id: NodeId) -> Result<&mut LjNode, MutexError> {
        let n = self.nodes.len();
        self.nodes
            .get_mut(id)
            .ok_or(MutexError::UnknownNode { node: id, n })
    }
}

impl MultiSystem for Lejeune {
    type Msg = LjMsg;
    const NAME: &'static str = "lejeune";
    const REQUIRES_FIFO: bool = false;

    fn token_instance(msg: &LjMsg) -> Option<usize> {
        match msg {
            LjMsg::Token { token, .. } => Some(token.r),
            _ => None,
        }
    }

    fn tokens_held(&self) -> Option<Vec<usize>> {
        let m = self.nodes.first().map_or(0, |p| p.m);
        let mut held = vec![0; m];
        for p in &self.nodes {
            for &r in p.owned.keys() {
                held[r] += 1;
            }
        }
        Some(held)
    }

    fn preemptions(&self) -> u64 {
        self.loans() + self.cessions()
    }

    fn request(
        &mut self,
        node: NodeId,
        req: &MultiRequest,
        out: &mut MultiOutbox<LjMsg>,
    ) -> Result<(), MutexError> {
        self.node(node)?.on_request(req, out)
    }

    fn release(&mut self, node: NodeId, out: &mut MultiOutbox<LjMsg>) -> Result<(), MutexError> {
        self.node(node)?.on_release(out)
    }

    fn deliver(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: LjMsg,
        out: &mut MultiOutbox<LjMsg>,
    ) -> Result<(), MutexError> {
        self.node(to)?.on_message(from, msg, out)
    }
}
