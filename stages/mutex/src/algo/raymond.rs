//! Raymond's static-tree token algorithm (1989; spec §6, \[DK\]).
//!
//! Nodes are arranged in a fixed spanning tree; `curr_dir` points to the neighbour in the
//! direction of the token. Every node keeps a FIFO `reqQ` of neighbours (or itself) that asked for
//! the token through it, and sends one REQ in its own name towards the token when its queue
//! becomes non-empty. The token travels back along the heads of the queues.
//!
//! Decisions:
//! - **Tree \[D\]:** the `arity`-ary heap tree rooted at node 0 (`parent(i) = (i − 1) / arity`,
//!   default arity 2, i.e. a balanced binary tree). Node 0 holds the token initially and every
//!   `curr_dir` points to the parent, i.e. towards the root.
//! - **Atomic grant:** when the token arrives and the head of `reqQ` is this node, the CS is
//!   granted in the same handler, so no REQ can take the token away in between (spec note).
//! - **Fencing:** the token carries a counter incremented at each CS entry; token uniqueness makes
//!   fences strictly increasing.
//! - **Channels:** FIFO is not required: if the REQ that follows a TOKEN on the same edge
//!   overtakes it, the receiver (which is still waiting) just queues it. The tests run non-FIFO.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::error::MutexError;
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, check_group, check_node, protocol};

/// Configuration of Raymond's algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaymondConfig {
    /// Arity of the heap-shaped spanning tree rooted at node 0 (at least 1; 1 gives a line).
    pub arity: usize,
}

impl Default for RaymondConfig {
    fn default() -> Self {
        Self { arity: 2 }
    }
}

/// Messages of Raymond's algorithm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaymondMsg {
    /// The sender asks for the token (in its own name).
    Request,
    /// The token.
    Token {
        /// Fence of the last grant made with this token.
        fence: Fence,
    },
}

impl Message for RaymondMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Token { .. } => "token",
        }
    }

    fn is_token(&self) -> bool {
        matches!(self, Self::Token { .. })
    }
}

/// One node of Raymond's algorithm.
#[derive(Debug, Clone)]
pub struct Raymond {
    id: NodeId,
    n: usize,
    neighbours: Vec<NodeId>,
    /// `Some(last fence)` while holding the token.
    token: Option<Fence>,
    in_cs: bool,
    requesting: bool,
    curr_dir: NodeId,
    req_q: VecDeque<NodeId>,
}

impl Raymond {
    /// The tree neighbours of this node.
    pub fn neighbours(&self) -> &[NodeId] {
        &self.neighbours
    }

    fn enter(&mut self, fence: Fence, out: &mut Outbox<RaymondMsg>) {
        self.token = Some(fence + 1);
        self.in_cs = true;
        self.curr_dir = self.id;
        out.grant(fence + 1);
    }
}

impl MutexNode for Raymond {
    type Msg = RaymondMsg;
    type Config = RaymondConfig;
    const NAME: &'static str = "raymond";
    const REQUIRES_FIFO: bool = false;
    const TOKEN_BASED: bool = true;

    fn new(id: NodeId, n: usize, config: &Self::Config) -> Result<Self, MutexError> {
        check_group(id, n)?;
        if config.arity == 0 {
            return Err(MutexError::Config(
                "raymond: tree arity must be at least 1".into(),
            ));
        }
        let a = config.arity;
        let parent = (id > 0).then(|| (id - 1) / a);
        let mut neighbours: Vec<NodeId> = parent.into_iter().collect();
        neighbours.extend((1..=a).map(|k| id * a + k).filter(|&c| c < n));
        Ok(Self {
            id,
            n,
            neighbours,
            token: (id == 0).then_some(0),
            in_cs: false,
            requesting: false,
            curr_dir: parent.unwrap_or(id),
            req_q: VecDeque::new(),
        })
    }

    fn id(&self) -> NodeId {
        self.id
    }

    fn on_request(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if self.requesting || self.in_cs {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        if let Some(fence) = self.token {
            // An idle holder always has an empty reqQ (spec note).
            self.enter(fence, out);
            return Ok(());
        }
        self.requesting = true;
        if self.req_q.is_empty() {
            out.send(self.curr_dir, RaymondMsg::Request);
        }
        self.req_q.push_back(self.id);
        Ok(())
    }

    fn on_release(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if !self.in_cs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.in_cs = false;
        if let Some(next) = self.req_q.pop_front() {
            let fence = self
                .token
                .take()
                .ok_or_else(|| protocol(self.id, "in the CS without the token"))?;
            self.curr_dir = next;
            out.send(next, RaymondMsg::Token { fence });
            if !self.req_q.is_empty() {
                out.send(next, RaymondMsg::Request);
            }
        }
        Ok(())
    }

    fn on_message(
        &mut self,
        from: NodeId,
        msg: Self::Msg,
        out: &mut Outbox<Self::Msg>,
    ) -> Result<(), MutexError> {
        check_node(from, self.n)?;
        if !self.neighbours.contains(&from) {
            return Err(protocol(
                self.id,
                format!("message from non-neighbour {from}"),
            ));
        }
        match msg {
            RaymondMsg::Request => {
                if self.req_q.contains(&from) {
                    return Err(protocol(self.id, format!("duplicate REQ from {from}")));
                }
                match self.token {
                    Some(_) if self.in_cs => self.req_q.push_back(from),
                    Some(fence) => {
                        self.token = None;
                        self.curr_dir = from;
                        out.send(from, RaymondMsg::Token { fence });
                    }
                    None => {
                        if self.req_q.is_empty() {
                            out.send(self.curr_dir, RaymondMsg::Request);
                        }
                        self.req_q.push_back(from);
                    }
                }
            }
            RaymondMsg::Token { fence } => {
                if self.token.is_some() {
                    return Err(protocol(self.id, "received a second token"));
                }
                let head = self
                    .req_q
                    .pop_front()
                    .ok_or_else(|| protocol(self.id, "TOKEN with an empty request queue"))?;
                if head == self.id {
                    self.requesting = false;
                    self.enter(fence, out);
                } else {
                    self.curr_dir = head;
                    out.send(head, RaymondMsg::Token { fence });
                    if !self.req_q.is_empty() {
                        out.send(head, RaymondMsg::Request);
                    }
                }
            }
        }
        Ok(())
    }

    fn holds_token(&self) -> bool {
        self.token.is_some()
    }
}
