//! Naimi–Tréhel, in the Li–Hudak `next` form (spec §7b, \[DK\]; ≈ Naimi–Tréhel 1987).
//!
//! A dynamic tree: `curr_dir` is a hint towards the tail of the waiting queue, and `next` is the
//! node to hand the token to after the CS. A requester sends `REQ(me)` to `curr_dir` and becomes
//! the new root (`curr_dir := me`, `next := NIL`). A node receiving `REQ(r)`:
//! - if it is requesting (waiting or in the CS) and `next = NIL`, it is the queue's tail: `next := r`;
//! - if it is requesting with `next` set, it forwards the REQ to `curr_dir`;
//! - if it holds the token idle, it sends the token to `r`;
//! - otherwise it forwards the REQ to `curr_dir`;
//!
//! and in every case then sets `curr_dir := r` (the \[R\] reading of the spec: every intermediary and
//! the last requester re-point to the new requester).
//!
//! Decisions:
//! - **Initial state:** node `initial_holder` (default 0) holds the token and every `curr_dir`
//!   points to it (standard start).
//! - **Fencing:** the token carries a counter incremented at each CS entry; token uniqueness makes
//!   fences strictly increasing.
//! - **Channels \[D\]:** the spec asks for FIFO channels and FIFO forwarding, and warns (slide 27)
//!   that a REQ overtaking another along a shared path can misroute. In this form that cannot
//!   happen: a node re-points `curr_dir` to the requester of *every* REQ it handles, so two
//!   consecutive REQs through a node leave on different edges (the second goes to the first's
//!   requester) and never race along one path; a REQ that reaches a requesting node whose `next`
//!   is taken is passed on to a later requester, never lost. Forwarding is FIFO anyway (each REQ
//!   is forwarded inside the handler that receives it). So `REQUIRES_FIFO` is `false`; the test
//!   suite runs this module over non-FIFO links (300 seeds, plus the slide-27 interleaving
//!   scripted), with the checker finding no violation. A node that gets its own REQ back, or must
//!   forward a REQ to itself, reports a protocol error instead of looping.

use serde::{Deserialize, Serialize};

use crate::error::MutexError;
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, check_group, check_node, protocol};

/// Configuration of Naimi–Tréhel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NaimiTrehelConfig {
    /// The node that holds the token initially (default 0).
    pub initial_holder: NodeId,
}

/// Messages of Naimi–Tréhel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NaimiTrehelMsg {
    /// A request of the original requester `requester`, possibly forwarded.
    Request {
        /// The node that wants the token.
        requester: NodeId,
    },
    /// The token.
    Token {
        /// Fence of the last grant made with this token.
        fence: Fence,
    },
}

impl Message for NaimiTrehelMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Request { .. } => "request",
            Self::Token { .. } => "token",
        }
    }

    fn is_token(&self) -> bool {
        matches!(self, Self::Token { .. })
    }
}

/// One node of Naimi–Tréhel.
#[derive(Debug, Clone)]
pub struct NaimiTrehel {
    id: NodeId,
    n: usize,
    /// `Some(last fence)` while holding the token.
    token: Option<Fence>,
    in_cs: bool,
    requesting: bool,
    curr_dir: NodeId,
    next: Option<NodeId>,
}

impl NaimiTrehel {
    fn enter(&mut self, fence: Fence, out: &mut Outbox<NaimiTrehelMsg>) {
        self.token = Some(fence + 1);
        self.in_cs = true;
        out.grant(fence + 1);
    }
}

impl MutexNode for NaimiTrehel {
    type Msg = NaimiTrehelMsg;
    type Config = NaimiTrehelConfig;
    const NAME: &'static str = "naimi_trehel";
    const REQUIRES_FIFO: bool = false;
    const TOKEN_BASED: bool = true;

    fn new(id: NodeId, n: usize, config: &Self::Config) -> Result<Self, MutexError> {
        check_group(id, n)?;
        check_node(config.initial_holder, n)?;
        Ok(Self {
            id,
            n,
            token: (id == config.initial_holder).then_some(0),
            in_cs: false,
            requesting: false,
            curr_dir: config.initial_holder,
            next: None,
        })
    }

    fn id(&self) -> NodeId {
        self.id
    }

    fn on_request(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if self.requesting {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        self.requesting = true;
        if let Some(fence) = self.token {
            self.enter(fence, out);
        } else {
            out.send(
                self.curr_dir,
                NaimiTrehelMsg::Request { requester: self.id },
            );
            self.curr_dir = self.id;
            self.next = None;
        }
        Ok(())
    }

    fn on_release(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if !self.in_cs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.in_cs = false;
        self.requesting = false;
        if let Some(next) = self.next.take() {
            let fence = self
                .token
                .take()
                .ok_or_else(|| protocol(self.id, "in the CS without the token"))?;
            out.send(next, NaimiTrehelMsg::Token { fence });
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
        match msg {
            NaimiTrehelMsg::Request { requester } => {
                check_node(requester, self.n)?;
                if requester == self.id {
                    return Err(protocol(self.id, "own REQ came back (cyclic hints)"));
                }
                if self.requesting && self.next.is_none() {
                    self.next = Some(requester);
                } else if !self.requesting && self.token.is_some() {
                    if let Some(fence) = self.token.take() {
                        out.send(requester, NaimiTrehelMsg::Token { fence });
                    }
                } else {
                    if self.curr_dir == self.id {
                        return Err(protocol(
                            self.id,
                            "REQ to forward but curr_dir points to self",
                        ));
                    }
                    out.send(self.curr_dir, NaimiTrehelMsg::Request { requester });
                }
                self.curr_dir = requester;
            }
            NaimiTrehelMsg::Token { fence } => {
                if self.token.is_some() || !self.requesting || self.in_cs {
                    return Err(protocol(self.id, "unexpected TOKEN"));
                }
                self.enter(fence, out);
            }
        }
        Ok(())
    }

    fn holds_token(&self) -> bool {
        self.token.is_some()
    }
}
