//! Ricart & Agrawala (1981; spec §8, \[DK\]).
//!
//! A requester stamps its request with its Lamport clock and sends REQUEST to the N−1 others; it
//! enters once it has a REPLY from all of them. A node in the CS, or requesting with an earlier
//! `(ts, pid)`, defers its REPLY until it leaves. 2(N−1) messages per CS at any load.
//!
//! Decisions:
//! - The clock ticks before stamping (\[D\] in the spec) and the `(ts, pid)` tie-break is used; the
//!   raw "not_requesting my_timestamp gt req_TS" is read as `¬requesting ∨ mine > theirs`.
//! - **Fencing:** the request stamp encoded as `ts · n + pid` ([`crate::clock::Stamp::fence`]).
//!   RA grants in `(ts, pid)` order (a node that replied before stamping its own request has
//!   already observed the other's timestamp), so fences strictly increase; the checker's fence
//!   check is also the ordered-service check of spec §16.
//! - **Channels:** reliable; FIFO is not required.

use serde::{Deserialize, Serialize};

use crate::clock::{LamportClock, Stamp};
use crate::error::MutexError;
use crate::node::{Message, MutexNode, NodeId, Outbox, check_group, check_node, protocol};

/// Ricart–Agrawala needs no configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RicartAgrawalaConfig;

/// Messages of Ricart–Agrawala.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RicartAgrawalaMsg {
    /// Request, stamped `ts`.
    Request {
        /// Request timestamp.
        ts: u64,
    },
    /// Permission, stamped with the sender's clock.
    Reply {
        /// Sender's clock.
        ts: u64,
    },
}

impl Message for RicartAgrawalaMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Request { .. } => "request",
            Self::Reply { .. } => "reply",
        }
    }
}

/// One node of Ricart–Agrawala.
#[derive(Debug, Clone)]
pub struct RicartAgrawala {
    id: NodeId,
    n: usize,
    clock: LamportClock,
    my_req: Option<Stamp>,
    in_cs: bool,
    replied: Vec<bool>,
    replies_pending: usize,
    deferred: Vec<bool>,
}

impl RicartAgrawala {
    fn try_enter(&mut self, out: &mut Outbox<RicartAgrawalaMsg>) {
        if let Some(mine) = self.my_req
            && !self.in_cs
            && self.replies_pending == 0
        {
            self.in_cs = true;
            out.grant(mine.fence(self.n));
        }
    }
}

impl MutexNode for RicartAgrawala {
    type Msg = RicartAgrawalaMsg;
    type Config = RicartAgrawalaConfig;
    const NAME: &'static str = "ricart_agrawala";
    const REQUIRES_FIFO: bool = false;
    const TOKEN_BASED: bool = false;

    fn new(id: NodeId, n: usize, _config: &Self::Config) -> Result<Self, MutexError> {
        check_group(id, n)?;
        Ok(Self {
            id,
            n,
            clock: LamportClock::new(),
            my_req: None,
            in_cs: false,
            replied: vec![false; n],
            replies_pending: 0,
            deferred: vec![false; n],
        })
    }

    fn id(&self) -> NodeId {
        self.id
    }

    fn on_request(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if self.my_req.is_some() {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        let ts = self.clock.tick();
        self.my_req = Some(Stamp::new(ts, self.id));
        self.replies_pending = self.n - 1;
        self.replied.iter_mut().for_each(|r| *r = false);
        for j in (0..self.n).filter(|&j| j != self.id) {
            out.send(j, RicartAgrawalaMsg::Request { ts });
        }
        self.try_enter(out);
        Ok(())
    }

    fn on_release(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if !self.in_cs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.in_cs = false;
        self.my_req = None;
        let ts = self.clock.now();
        for j in 0..self.n {
            if std::mem::take(&mut self.deferred[j]) {
                out.send(j, RicartAgrawalaMsg::Reply { ts });
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
        if from == self.id {
            return Err(protocol(self.id, "message from itself"));
        }
        match msg {
            RicartAgrawalaMsg::Request { ts } => {
                self.clock.observe(ts);
                let theirs = Stamp::new(ts, from);
                let defer = matches!(self.my_req, Some(mine) if self.in_cs || mine < theirs);
                if defer {
                    if self.deferred[from] {
                        return Err(protocol(self.id, format!("duplicate REQUEST from {from}")));
                    }
                    self.deferred[from] = true;
                } else {
                    out.send(
                        from,
                        RicartAgrawalaMsg::Reply {
                            ts: self.clock.now(),
                        },
                    );
                }
            }
            RicartAgrawalaMsg::Reply { ts } => {
                self.clock.observe(ts);
                if self.my_req.is_none() || self.in_cs || self.replied[from] {
                    return Err(protocol(self.id, format!("unexpected REPLY from {from}")));
                }
                self.replied[from] = true;
                self.replies_pending -= 1;
                self.try_enter(out);
            }
        }
        Ok(())
    }
}
