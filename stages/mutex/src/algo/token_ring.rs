//! Token ring ("Algoritmo de Token Circulante", spec §4, \[DK\]).
//!
//! Nodes form the ring `i → (i+1) mod n`. A single token circulates forever, even when nobody
//! wants it; a node that wants the CS waits for the token, keeps it during the CS (the spec's
//! blocking `recv(appl, exit_region)` becomes a `holding` state, \[D\]) and forwards it on release.
//! Service is in ring order, not request order.
//!
//! Decisions:
//! - **Start:** the initial holder (config, default 0) forwards the token on START. With `n = 1`
//!   the single node keeps the token for ever and is granted at once, with no messages.
//! - **Fencing:** the token carries a counter, incremented by each node that enters the CS; the
//!   new value is the grant's fence. The token is unique, so fences strictly increase.
//! - **Channels:** one message type and one token, so FIFO is irrelevant.

use serde::{Deserialize, Serialize};

use crate::error::MutexError;
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, check_group, check_node, protocol};

/// Configuration of the token ring.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenRingConfig {
    /// The node that holds the token initially (default 0).
    pub initial_holder: NodeId,
}

/// Messages of the token ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TokenRingMsg {
    /// The token, carrying the last fence handed out.
    Token {
        /// Fence of the last grant made with this token.
        fence: Fence,
    },
}

impl Message for TokenRingMsg {
    fn kind(&self) -> &'static str {
        "token"
    }

    fn is_token(&self) -> bool {
        true
    }
}

/// One node of the token ring.
#[derive(Debug, Clone)]
pub struct TokenRing {
    id: NodeId,
    n: usize,
    waiting: bool,
    in_cs: bool,
    /// `Some(last fence)` while this node holds the token.
    token: Option<Fence>,
}

impl TokenRing {
    fn next(&self) -> NodeId {
        (self.id + 1) % self.n
    }
}

impl MutexNode for TokenRing {
    type Msg = TokenRingMsg;
    type Config = TokenRingConfig;
    const NAME: &'static str = "token_ring";
    const REQUIRES_FIFO: bool = false;
    const TOKEN_BASED: bool = true;

    fn new(id: NodeId, n: usize, config: &Self::Config) -> Result<Self, MutexError> {
        check_group(id, n)?;
        check_node(config.initial_holder, n)?;
        Ok(Self {
            id,
            n,
            waiting: false,
            in_cs: false,
            token: (id == config.initial_holder).then_some(0),
        })
    }

    fn id(&self) -> NodeId {
        self.id
    }

    fn on_start(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if self.n > 1
            && !self.in_cs
            && let Some(fence) = self.token.take()
        {
            out.send(self.next(), TokenRingMsg::Token { fence });
        }
        Ok(())
    }

    fn on_request(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if self.waiting || self.in_cs {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        match self.token.as_mut() {
            // Only with n = 1 (or before START) is an idle token held here.
            Some(fence) => {
                *fence += 1;
                self.in_cs = true;
                out.grant(*fence);
            }
            None => self.waiting = true,
        }
        Ok(())
    }

    fn on_release(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if !self.in_cs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.in_cs = false;
        if self.n > 1 {
            let fence = self
                .token
                .take()
                .ok_or_else(|| protocol(self.id, "in the CS without the token"))?;
            out.send(self.next(), TokenRingMsg::Token { fence });
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
        let TokenRingMsg::Token { fence } = msg;
        if self.token.is_some() {
            return Err(protocol(self.id, "received a second token"));
        }
        if self.waiting {
            self.waiting = false;
            self.in_cs = true;
            self.token = Some(fence + 1);
            out.grant(fence + 1);
        } else {
            out.send(self.next(), TokenRingMsg::Token { fence });
        }
        Ok(())
    }

    fn holds_token(&self) -> bool {
        self.token.is_some()
    }
}
