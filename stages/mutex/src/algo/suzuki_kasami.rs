//! Suzuki–Kasami broadcast token (1985; spec §10, \[STD\]).
//!
//! A requester without the token increments its sequence number `RN[me]` and broadcasts
//! REQUEST(me, n). The token carries `LN[j]` (the last served request of each node) and a FIFO
//! queue `Q`. An idle holder hands the token straight to an outstanding request; on exit the
//! holder appends every node with an outstanding request (`RN[j] = LN[j] + 1`) to `Q` and sends
//! the token to its head. Outdated requests are recognised by their sequence numbers.
//! 0 messages if the requester holds the token, otherwise N (N−1 REQUEST + 1 TOKEN).
//!
//! Decisions:
//! - **Initial holder:** configurable, default node 0.
//! - **Queue order \[D\]:** on exit, outstanding requesters are appended in ring order starting at
//!   `me + 1`, so no node is systematically favoured.
//! - **Fencing:** the token carries a counter incremented at each CS entry. Token uniqueness makes
//!   the fences strictly increasing.
//! - **Channels:** FIFO not required.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::error::MutexError;
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, check_group, check_node, protocol};

/// Configuration of Suzuki–Kasami.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SuzukiKasamiConfig {
    /// The node that holds the token initially (default 0).
    pub initial_holder: NodeId,
}

/// The Suzuki–Kasami token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkToken {
    /// `LN[j]`: sequence number of the last request of `j` that was served.
    pub ln: Vec<u64>,
    /// Nodes waiting for the token, in service order.
    pub queue: VecDeque<NodeId>,
    /// Fence of the last grant made with this token.
    pub fence: Fence,
}

/// Messages of Suzuki–Kasami.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SuzukiKasamiMsg {
    /// Broadcast request: the sender's `seq`-th request.
    Request {
        /// The sender's request sequence number.
        seq: u64,
    },
    /// The token.
    Token(SkToken),
}

impl Message for SuzukiKasamiMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Request { .. } => "request",
            Self::Token(_) => "token",
        }
    }

    fn is_token(&self) -> bool {
        matches!(self, Self::Token(_))
    }
}

/// One node of Suzuki–Kasami.
#[derive(Debug, Clone)]
pub struct SuzukiKasami {
    id: NodeId,
    n: usize,
    rn: Vec<u64>,
    token: Option<SkToken>,
    requesting: bool,
    in_cs: bool,
}

impl SuzukiKasami {
    fn enter(&mut self, out: &mut Outbox<SuzukiKasamiMsg>) -> Result<(), MutexError> {
        let token = self
            .token
            .as_mut()
            .ok_or_else(|| protocol(self.id, "entering without the token"))?;
        token.fence += 1;
        self.in_cs = true;
        out.grant(token.fence);
        Ok(())
    }
}

impl MutexNode for SuzukiKasami {
    type Msg = SuzukiKasamiMsg;
    type Config = SuzukiKasamiConfig;
    const NAME: &'static str = "suzuki_kasami";
    const REQUIRES_FIFO: bool = false;
    const TOKEN_BASED: bool = true;

    fn new(id: NodeId, n: usize, config: &Self::Config) -> Result<Self, MutexError> {
        check_group(id, n)?;
        check_node(config.initial_holder, n)?;
        Ok(Self {
            id,
            n,
            rn: vec![0; n],
            token: (id == config.initial_holder).then(|| SkToken {
                ln: vec![0; n],
                queue: VecDeque::new(),
                fence: 0,
            }),
            requesting: false,
            in_cs: false,
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
        if self.token.is_some() {
            return self.enter(out);
        }
        self.rn[self.id] += 1;
        let seq = self.rn[self.id];
        for j in (0..self.n).filter(|&j| j != self.id) {
            out.send(j, SuzukiKasamiMsg::Request { seq });
        }
        Ok(())
    }

    fn on_release(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if !self.in_cs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.in_cs = false;
        self.requesting = false;
        let me = self.id;
        let n = self.n;
        let rn = &self.rn;
        let token = self
            .token
            .as_mut()
            .ok_or_else(|| protocol(me, "in the CS without the token"))?;
        token.ln[me] = rn[me];
        for k in 1..n {
            let j = (me + k) % n;
            if rn[j] == token.ln[j] + 1 && !token.queue.contains(&j) {
                token.queue.push_back(j);
            }
        }
        if let Some(j) = token.queue.pop_front()
            && let Some(t) = self.token.take()
        {
            out.send(j, SuzukiKasamiMsg::Token(t));
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
        if from == self.id {
            return Err(protocol(self.id, "message from itself"));
        }
        match msg {
            SuzukiKasamiMsg::Request { seq } => {
                self.rn[from] = self.rn[from].max(seq);
                let idle_holder_owes = matches!(
                    &self.token,
                    Some(t) if !self.requesting && self.rn[from] == t.ln[from] + 1
                );
                if idle_holder_owes && let Some(t) = self.token.take() {
                    out.send(from, SuzukiKasamiMsg::Token(t));
                }
                Ok(())
            }
            SuzukiKasamiMsg::Token(t) => {
                if self.token.is_some() || !self.requesting || self.in_cs {
                    return Err(protocol(self.id, "unexpected TOKEN"));
                }
                if t.ln.len() != self.n {
                    return Err(protocol(self.id, "TOKEN for a group of another size"));
                }
                self.token = Some(t);
                self.enter(out)
            }
        }
    }

    fn holds_token(&self) -> bool {
        self.token.is_some()
    }
}
