//! Lamport's mutual exclusion (1978; spec §9, \[STD\]).
//!
//! Every node keeps a priority queue of requests ordered by `(timestamp, pid)`. A requester
//! broadcasts REQUEST, every receiver queues it and answers REPLY, and the requester enters when
//! its request heads its queue (L1) and it has received a message stamped later than its request
//! from every other node (L2). On exit it broadcasts RELEASE. 3(N−1) messages per CS.
//!
//! Decisions:
//! - **L2** uses the timestamp of *any* message from `j` (REQUEST, REPLY or RELEASE), as the spec
//!   notes. RELEASE carries the released request's timestamp plus the sender's clock.
//! - **Fencing:** the fence is the request's stamp encoded as `ts · n + pid`
//!   ([`crate::clock::Stamp::fence`]). Lamport's algorithm serves requests in total
//!   `(ts, pid)` order, so fences strictly increase; the checker's fence check is therefore also
//!   the "ordered service" check of spec §16.
//! - **Channels:** FIFO is required (a REPLY from `j` stamped after my request must imply that
//!   `j`'s earlier REQUEST is already in my queue).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::clock::{LamportClock, Stamp};
use crate::error::MutexError;
use crate::node::{Message, MutexNode, NodeId, Outbox, check_group, check_node, protocol};

/// Lamport's algorithm needs no configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LamportConfig;

/// Messages of Lamport's algorithm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LamportMsg {
    /// Broadcast request, stamped `ts`.
    Request {
        /// Request timestamp.
        ts: u64,
    },
    /// Acknowledgement of a request, stamped with the replier's clock.
    Reply {
        /// Sender's clock.
        ts: u64,
    },
    /// The sender left the CS; its request stamped `req_ts` leaves every queue.
    Release {
        /// Timestamp of the released request.
        req_ts: u64,
        /// Sender's clock.
        ts: u64,
    },
}

impl Message for LamportMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Request { .. } => "request",
            Self::Reply { .. } => "reply",
            Self::Release { .. } => "release",
        }
    }
}

/// One node of Lamport's algorithm.
#[derive(Debug, Clone)]
pub struct Lamport {
    id: NodeId,
    n: usize,
    clock: LamportClock,
    queue: BTreeSet<Stamp>,
    last_ts_from: Vec<u64>,
    my_req: Option<Stamp>,
    in_cs: bool,
}

impl Lamport {
    fn try_enter(&mut self, out: &mut Outbox<LamportMsg>) {
        let Some(mine) = self.my_req else { return };
        if self.in_cs || self.queue.first() != Some(&mine) {
            return;
        }
        let l2 = (0..self.n).all(|j| j == self.id || self.last_ts_from[j] > mine.ts);
        if l2 {
            self.in_cs = true;
            out.grant(mine.fence(self.n));
        }
    }
}

impl MutexNode for Lamport {
    type Msg = LamportMsg;
    type Config = LamportConfig;
    const NAME: &'static str = "lamport";
    const REQUIRES_FIFO: bool = true;
    const TOKEN_BASED: bool = false;

    fn new(id: NodeId, n: usize, _config: &Self::Config) -> Result<Self, MutexError> {
        check_group(id, n)?;
        Ok(Self {
            id,
            n,
            clock: LamportClock::new(),
            queue: BTreeSet::new(),
            last_ts_from: vec![0; n],
            my_req: None,
            in_cs: false,
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
        let mine = Stamp::new(ts, self.id);
        self.my_req = Some(mine);
        self.queue.insert(mine);
        for j in (0..self.n).filter(|&j| j != self.id) {
            out.send(j, LamportMsg::Request { ts });
        }
        self.try_enter(out);
        Ok(())
    }

    fn on_release(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        let mine = match self.my_req {
            Some(m) if self.in_cs => m,
            _ => return Err(MutexError::NotHolding { node: self.id }),
        };
        self.in_cs = false;
        self.my_req = None;
        self.queue.remove(&mine);
        let ts = self.clock.tick();
        for j in (0..self.n).filter(|&j| j != self.id) {
            out.send(
                j,
                LamportMsg::Release {
                    req_ts: mine.ts,
                    ts,
                },
            );
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
            LamportMsg::Request { ts } => {
                self.clock.observe(ts);
                if !self.queue.insert(Stamp::new(ts, from)) {
                    return Err(protocol(self.id, format!("duplicate REQUEST from {from}")));
                }
                self.last_ts_from[from] = self.last_ts_from[from].max(ts);
                let reply = self.clock.now();
                out.send(from, LamportMsg::Reply { ts: reply });
            }
            LamportMsg::Reply { ts } => {
                self.clock.observe(ts);
                self.last_ts_from[from] = self.last_ts_from[from].max(ts);
            }
            LamportMsg::Release { req_ts, ts } => {
                self.clock.observe(ts);
                if !self.queue.remove(&Stamp::new(req_ts, from)) {
                    return Err(protocol(
                        self.id,
                        format!("RELEASE of an unknown request of {from}"),
                    ));
                }
                self.last_ts_from[from] = self.last_ts_from[from].max(ts);
            }
        }
        self.try_enter(out);
        Ok(())
    }
}
