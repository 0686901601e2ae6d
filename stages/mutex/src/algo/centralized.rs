//! Centralised coordinator (spec §11, \[STD\]).
//!
//! A designated coordinator `C` keeps `busy`, `holder` and a FIFO queue; every other node sends
//! `REQUEST`, waits for `GRANT`, and sends `RELEASE` when it leaves. Service is in arrival order
//! at `C`. Three messages per CS, synchronisation delay 2T.
//!
//! Decisions:
//! - **Counting convention \[D\]:** the coordinator's own requests and releases are handled
//!   locally, with no message. A CS of `C` costs 0 messages; any other node's CS costs exactly 3
//!   (REQUEST, GRANT, RELEASE).
//! - **Fencing:** `C` keeps a counter and increments it on every grant; the value travels in the
//!   `GRANT` message. There is one coordinator, so fences are strictly increasing.
//! - **Channels:** FIFO is not needed. If a node's next REQUEST overtakes its RELEASE, `C` sees a
//!   request from the current holder and simply queues it; the RELEASE then frees the lock.
//! - `C` must not fail (single point of failure); failure notices are refused.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::error::MutexError;
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, check_group, check_node, protocol};

/// Configuration of the centralised algorithm.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CentralizedConfig {
    /// The coordinator's id (default 0).
    pub coordinator: NodeId,
}

/// Messages of the centralised algorithm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CentralizedMsg {
    /// Client → coordinator: I want the CS.
    Request,
    /// Coordinator → client: you have the CS, with this fence.
    Grant {
        /// The fencing token of the grant.
        fence: Fence,
    },
    /// Client → coordinator: I left the CS.
    Release,
}

impl Message for CentralizedMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Grant { .. } => "grant",
            Self::Release => "release",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    Idle,
    Waiting,
    InCs,
}

/// One node of the centralised algorithm (client, and coordinator when `id == coordinator`).
#[derive(Debug, Clone)]
pub struct Centralized {
    id: NodeId,
    n: usize,
    coordinator: NodeId,
    client: Client,
    // Coordinator state (used only at the coordinator).
    holder: Option<NodeId>,
    queue: VecDeque<NodeId>,
    last_fence: Fence,
}

impl Centralized {
    /// The coordinator's id.
    pub fn coordinator(&self) -> NodeId {
        self.coordinator
    }

    /// Coordinator side: node `j` requests.
    fn coord_request(
        &mut self,
        j: NodeId,
        out: &mut Outbox<CentralizedMsg>,
    ) -> Result<(), MutexError> {
        if self.queue.contains(&j) {
            return Err(protocol(self.id, format!("duplicate REQUEST from {j}")));
        }
        if self.holder.is_none() {
            self.grant_to(j, out);
        } else {
            self.queue.push_back(j);
        }
        Ok(())
    }

    /// Coordinator side: node `j` releases.
    fn coord_release(
        &mut self,
        j: NodeId,
        out: &mut Outbox<CentralizedMsg>,
    ) -> Result<(), MutexError> {
        if self.holder != Some(j) {
            return Err(protocol(
                self.id,
                format!("RELEASE from {j}, which does not hold the lock"),
            ));
        }
        self.holder = None;
        if let Some(next) = self.queue.pop_front() {
            self.grant_to(next, out);
        }
        Ok(())
    }

    fn grant_to(&mut self, j: NodeId, out: &mut Outbox<CentralizedMsg>) {
        self.last_fence += 1;
        self.holder = Some(j);
        if j == self.id {
            self.client = Client::InCs;
            out.grant(self.last_fence);
        } else {
            out.send(
                j,
                CentralizedMsg::Grant {
                    fence: self.last_fence,
                },
            );
        }
    }
}

impl MutexNode for Centralized {
    type Msg = CentralizedMsg;
    type Config = CentralizedConfig;
    const NAME: &'static str = "centralized";
    const REQUIRES_FIFO: bool = false;
    const TOKEN_BASED: bool = false;

    fn new(id: NodeId, n: usize, config: &Self::Config) -> Result<Self, MutexError> {
        check_group(id, n)?;
        check_node(config.coordinator, n)?;
        Ok(Self {
            id,
            n,
            coordinator: config.coordinator,
            client: Client::Idle,
            holder: None,
            queue: VecDeque::new(),
            last_fence: 0,
        })
    }

    fn id(&self) -> NodeId {
        self.id
    }

    fn on_request(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if self.client != Client::Idle {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        self.client = Client::Waiting;
        if self.id == self.coordinator {
            self.coord_request(self.id, out)
        } else {
            out.send(self.coordinator, CentralizedMsg::Request);
            Ok(())
        }
    }

    fn on_release(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if self.client != Client::InCs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.client = Client::Idle;
        if self.id == self.coordinator {
            self.coord_release(self.id, out)
        } else {
            out.send(self.coordinator, CentralizedMsg::Release);
            Ok(())
        }
    }

    fn on_message(
        &mut self,
        from: NodeId,
        msg: Self::Msg,
        out: &mut Outbox<Self::Msg>,
    ) -> Result<(), MutexError> {
        check_node(from, self.n)?;
        match msg {
            CentralizedMsg::Request | CentralizedMsg::Release if self.id != self.coordinator => {
                Err(protocol(
                    self.id,
                    "REQUEST/RELEASE sent to a non-coordinator",
                ))
            }
            CentralizedMsg::Request => self.coord_request(from, out),
            CentralizedMsg::Release => self.coord_release(from, out),
            CentralizedMsg::Grant { fence } => {
                if from != self.coordinator || self.client != Client::Waiting {
                    return Err(protocol(self.id, "unexpected GRANT"));
                }
                self.client = Client::InCs;
                out.grant(fence);
                Ok(())
            }
        }
    }
}
