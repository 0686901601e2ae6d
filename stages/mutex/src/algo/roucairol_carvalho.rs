//! Roucairol–Carvalho optimisation of Ricart–Agrawala (spec §8.1, \[STD\]).
//!
//! Each pair `{i, j}` shares one permission. A REPLY hands the permission over and it stays valid
//! for later requests until the other side asks for it back, so a node that holds every
//! permission enters with 0 messages. Cost: 0 … 2(N−1) messages per CS.
//!
//! Decisions:
//! - **Initial permissions \[D\]:** the lower id of each pair holds it (`authorized[j] = id < j`).
//! - **Re-request:** a requester that gives a permission away to an earlier request sends its own
//!   REQUEST to that node again, unless one is outstanding (spec).
//! - **Non-FIFO channels \[D\]:** a REQUEST from `j` may overtake the REPLY by which `j` handed
//!   this node the permission. That REQUEST is always stamped later than this node's pending
//!   request (`j` observed our REQUEST before replying), so it is deferred, and answered after our
//!   CS, when the permission is here. Hence a REQUEST that must be answered at once always finds
//!   the permission here; if it does not, the node reports a protocol error rather than create a
//!   second copy. FIFO is therefore not required, and the tests run FIFO and non-FIFO links.
//! - **Fencing:** request timestamps are *not* monotone in grant order here (a node holding every
//!   permission may enter with a later timestamp before an earlier pending request). Instead every
//!   node remembers the largest fence it has seen, every REPLY carries it, and a node entering the
//!   CS uses `max_seen + 1`. Between two consecutive CS entries of `a` then `b`, the `{a, b}`
//!   permission moves from `a` to `b` after `a` entered, so `b` has seen `a`'s fence.

use serde::{Deserialize, Serialize};

use crate::clock::{LamportClock, Stamp};
use crate::error::MutexError;
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, check_group, check_node, protocol};

/// Roucairol–Carvalho needs no configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoucairolCarvalhoConfig;

/// Messages of Roucairol–Carvalho.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoucairolCarvalhoMsg {
    /// Request for the pair's permission, stamped `ts`.
    Request {
        /// Request timestamp.
        ts: u64,
    },
    /// Hands the pair's permission over.
    Reply {
        /// Sender's clock.
        ts: u64,
        /// Largest fence the sender has seen.
        fence: Fence,
    },
}

impl Message for RoucairolCarvalhoMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Request { .. } => "request",
            Self::Reply { .. } => "reply",
        }
    }
}

/// One node of Roucairol–Carvalho.
#[derive(Debug, Clone)]
pub struct RoucairolCarvalho {
    id: NodeId,
    n: usize,
    clock: LamportClock,
    my_req: Option<Stamp>,
    in_cs: bool,
    authorized: Vec<bool>,
    requested: Vec<bool>,
    deferred: Vec<bool>,
    max_fence: Fence,
}

impl RoucairolCarvalho {
    /// Whether this node currently holds the permission shared with `j`.
    pub fn is_authorized(&self, j: NodeId) -> bool {
        self.authorized.get(j).copied().unwrap_or(false)
    }

    fn give(&mut self, j: NodeId, out: &mut Outbox<RoucairolCarvalhoMsg>) {
        self.authorized[j] = false;
        out.send(
            j,
            RoucairolCarvalhoMsg::Reply {
                ts: self.clock.now(),
                fence: self.max_fence,
            },
        );
        // Still waiting for the CS: ask for the permission back.
        if let Some(mine) = self.my_req
            && !self.in_cs
            && !self.requested[j]
        {
            self.requested[j] = true;
            out.send(j, RoucairolCarvalhoMsg::Request { ts: mine.ts });
        }
    }

    fn try_enter(&mut self, out: &mut Outbox<RoucairolCarvalhoMsg>) {
        if self.my_req.is_none() || self.in_cs {
            return;
        }
        if (0..self.n).all(|j| j == self.id || self.authorized[j]) {
            self.in_cs = true;
            self.max_fence += 1;
            out.grant(self.max_fence);
        }
    }
}

impl MutexNode for RoucairolCarvalho {
    type Msg = RoucairolCarvalhoMsg;
    type Config = RoucairolCarvalhoConfig;
    const NAME: &'static str = "roucairol_carvalho";
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
            authorized: (0..n).map(|j| id < j).collect(),
            requested: vec![false; n],
            deferred: vec![false; n],
            max_fence: 0,
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
        for j in (0..self.n).filter(|&j| j != self.id) {
            if !self.authorized[j] && !self.requested[j] {
                self.requested[j] = true;
                out.send(j, RoucairolCarvalhoMsg::Request { ts });
            }
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
        for j in 0..self.n {
            if std::mem::take(&mut self.deferred[j]) {
                self.give(j, out);
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
            RoucairolCarvalhoMsg::Request { ts } => {
                self.clock.observe(ts);
                if self.deferred[from] {
                    return Err(protocol(self.id, format!("duplicate REQUEST from {from}")));
                }
                let theirs = Stamp::new(ts, from);
                let defer = matches!(self.my_req, Some(mine) if self.in_cs || mine < theirs);
                if defer {
                    self.deferred[from] = true;
                } else if self.authorized[from] {
                    self.give(from, out);
                } else {
                    return Err(protocol(
                        self.id,
                        format!(
                            "REQUEST from {from} with priority, for a permission not held here"
                        ),
                    ));
                }
            }
            RoucairolCarvalhoMsg::Reply { ts, fence } => {
                self.clock.observe(ts);
                if self.authorized[from] || !self.requested[from] {
                    return Err(protocol(self.id, format!("unexpected REPLY from {from}")));
                }
                self.max_fence = self.max_fence.max(fence);
                self.authorized[from] = true;
                self.requested[from] = false;
                self.try_enter(out);
            }
        }
        Ok(())
    }
}
