//! Maekawa voting with Sanders' INQUIRE/RELINQUISH (spec §12–§13), over grid quorums, plus the
//! naive, deadlock-prone voting of §12.1 as a deliberately broken variant for the checker.
//!
//! Every node is both a requester and a voter. A requester sends `REQ(ts)` to every member of its
//! quorum `S_i` (itself included) and enters once all of them voted YES; on exit it sends REL to
//! all of them. A voter gives one vote at a time and queues the other requests.
//!
//! **Sanders variant** ([`MaekawaVariant::Sanders`], the default): requests carry Lamport
//! timestamps compared as `(ts, pid)`. A voter that voted for `cand` and receives an earlier
//! request sends `INQ(cand_ts)` to `cand` (once: `inquired`). A requester that is still waiting
//! and whose current timestamp is the inquired one gives the vote back with RELINQUISH; the voter
//! re-queues `cand` and votes for the earliest queued request. REL and RELINQUISH both reset
//! `inquired` (the \[R\] reading "resetting in both branches is the only safe reading").
//!
//! **Naive variant** ([`MaekawaVariant::Naive`]): no timestamps in the decision, no INQ; a voter
//! serves its queue in arrival order. It deadlocks (slide 42); the test suite shows the checker
//! catches it.
//!
//! Decisions:
//! - **Quorums:** [`crate::quorum::grid_quorums`] by default (row ∪ column, wrap-around fill for
//!   non-square `n`), or explicit quorums validated by [`crate::quorum::validate_quorums`].
//! - **Clock \[D\]:** tick before stamping a request; on every REQ/INQ received,
//!   `clock := max(clock, ts) + 1`.
//! - **Self votes / counting convention:** `P_i ∈ S_i`, and the messages a node sends to itself
//!   (its own REQ, YES, INQ, RELINQUISH, REL) are handled locally, in FIFO order, right after the
//!   handler that produced them, and never cross a link. They are still messages the algorithm
//!   sends, so the node reports each one as an [`crate::Output::Local`] and the metrics count
//!   them: a CS at light load costs `3|S_i|` messages, `3(|S_i| − 1)` of them on the network.
//! - **INQ handling:** an INQ is honoured only while waiting and only if it names the current
//!   request's timestamp; INQs reaching a node in the CS or after it stopped requesting are
//!   ignored (Situation A). Channels must be FIFO, so a voter's YES always precedes its INQ.
//! - **Fencing:** every node remembers the largest fence it has seen; REL carries the releaser's
//!   fence and YES carries the voter's largest fence. A node entering the CS uses
//!   `max_seen + 1`. For consecutive entries of `a` then `b`, some voter `v ∈ S_a ∩ S_b` voted for
//!   `a` during its CS and could vote for `b` only after `a`'s REL, so `b` has seen `a`'s fence.
//! - **Channels:** FIFO required (spec §13 model).

use serde::{Deserialize, Serialize};

use std::collections::VecDeque;

use crate::clock::{LamportClock, Stamp};
use crate::error::MutexError;
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, check_group, protocol};
use crate::quorum::{grid_quorums, validate_quorums};

/// Which voting rule to run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MaekawaVariant {
    /// Sanders' deadlock-free voting with timestamps, INQ and RELINQUISH.
    #[default]
    Sanders,
    /// Naive voting (§12.1): first come, first served, no INQ. Deadlock-prone, for testing.
    Naive,
}

/// Configuration of Maekawa voting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaekawaConfig {
    /// The voting rule.
    pub variant: MaekawaVariant,
    /// Explicit quorums (`quorums[i] = S_i`); `None` uses grid quorums.
    pub quorums: Option<Vec<Vec<NodeId>>>,
}

/// Messages of Maekawa voting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MaekawaMsg {
    /// Vote request, stamped `ts`.
    Request {
        /// Request timestamp.
        ts: u64,
    },
    /// A vote.
    Yes {
        /// Largest fence the voter has seen.
        fence: Fence,
    },
    /// The voter wants its vote for the request stamped `ts` back.
    Inquire {
        /// Timestamp of the request whose vote is reclaimed.
        ts: u64,
    },
    /// The requester gives the vote back.
    Relinquish,
    /// The requester left the CS.
    Release {
        /// The releaser's largest fence (its own grant's fence).
        fence: Fence,
    },
}

impl Message for MaekawaMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Request { .. } => "request",
            Self::Yes { .. } => "yes",
            Self::Inquire { .. } => "inquire",
            Self::Relinquish => "relinquish",
            Self::Release { .. } => "release",
        }
    }
}

/// One node (requester and voter) of Maekawa voting.
#[derive(Debug, Clone)]
pub struct Maekawa {
    id: NodeId,
    n: usize,
    variant: MaekawaVariant,
    quorum: Vec<NodeId>,
    clock: LamportClock,
    max_fence: Fence,
    local: VecDeque<MaekawaMsg>,
    // Requester.
    my_ts: Option<u64>,
    in_cs: bool,
    votes: Vec<bool>,
    yes_votes: usize,
    // Voter.
    cand: Option<Stamp>,
    inquired: bool,
    deferred: Vec<Stamp>,
}

impl Maekawa {
    /// This node's quorum `S_i`.
    pub fn quorum(&self) -> &[NodeId] {
        &self.quorum
    }

    fn dispatch(&mut self, to: NodeId, msg: MaekawaMsg, out: &mut Outbox<MaekawaMsg>) {
        if to == self.id {
            out.local(msg.kind());
            self.local.push_back(msg);
        } else {
            out.send(to, msg);
        }
    }

    fn run_local(&mut self, out: &mut Outbox<MaekawaMsg>) -> Result<(), MutexError> {
        while let Some(msg) = self.local.pop_front() {
            self.handle(self.id, msg, out)?;
        }
        Ok(())
    }

    fn vote(&mut self, s: Stamp, out: &mut Outbox<MaekawaMsg>) {
        self.cand = Some(s);
        self.dispatch(
            s.node,
            MaekawaMsg::Yes {
                fence: self.max_fence,
            },
            out,
        );
    }

    fn next_deferred(&mut self) -> Option<Stamp> {
        if self.deferred.is_empty() {
            return None;
        }
        let idx = match self.variant {
            MaekawaVariant::Naive => 0,
            MaekawaVariant::Sanders => self
                .deferred
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| **s)
                .map_or(0, |(i, _)| i),
        };
        Some(self.deferred.remove(idx))
    }

    fn handle(
        &mut self,
        from: NodeId,
        msg: MaekawaMsg,
        out: &mut Outbox<MaekawaMsg>,
    ) -> Result<(), MutexError> {
        match msg {
            MaekawaMsg::Request { ts } => {
                self.clock.observe(ts);
                let s = Stamp::new(ts, from);
                if self.cand.map(|c| c.node) == Some(from)
                    || self.deferred.iter().any(|d| d.node == from)
                {
                    return Err(protocol(self.id, format!("duplicate REQ from {from}")));
                }
                match self.cand {
                    None => self.vote(s, out),
                    Some(cand) => {
                        self.deferred.push(s);
                        if self.variant == MaekawaVariant::Sanders && s < cand && !self.inquired {
                            self.inquired = true;
                            self.dispatch(cand.node, MaekawaMsg::Inquire { ts: cand.ts }, out);
                        }
                    }
                }
            }
            MaekawaMsg::Yes { fence } => {
                self.max_fence = self.max_fence.max(fence);
                let ok = self.my_ts.is_some()
                    && !self.in_cs
                    && self.quorum.contains(&from)
                    && !self.votes[from];
                if !ok {
                    return Err(protocol(self.id, format!("unexpected YES from {from}")));
                }
                self.votes[from] = true;
                self.yes_votes += 1;
                if self.yes_votes == self.quorum.len() {
                    self.in_cs = true;
                    self.max_fence += 1;
                    out.grant(self.max_fence);
                }
            }
            MaekawaMsg::Inquire { ts } => {
                if self.variant == MaekawaVariant::Naive {
                    return Err(protocol(self.id, "INQ in naive voting"));
                }
                self.clock.observe(ts);
                if !self.in_cs && self.my_ts == Some(ts) {
                    if !self.votes[from] {
                        return Err(protocol(self.id, format!("INQ from {from} before its YES")));
                    }
                    self.votes[from] = false;
                    self.yes_votes -= 1;
                    self.dispatch(from, MaekawaMsg::Relinquish, out);
                }
            }
            MaekawaMsg::Relinquish => {
                let cand = match self.cand {
                    Some(c) if c.node == from && self.inquired => c,
                    _ => {
                        return Err(protocol(
                            self.id,
                            format!("unexpected RELINQUISH from {from}"),
                        ));
                    }
                };
                self.deferred.push(cand);
                self.inquired = false;
                if let Some(s) = self.next_deferred() {
                    self.vote(s, out);
                }
            }
            MaekawaMsg::Release { fence } => {
                self.max_fence = self.max_fence.max(fence);
                if self.cand.map(|c| c.node) != Some(from) {
                    return Err(protocol(
                        self.id,
                        format!("REL from {from}, which has no vote here"),
                    ));
                }
                self.cand = None;
                self.inquired = false;
                if let Some(s) = self.next_deferred() {
                    self.vote(s, out);
                }
            }
        }
        Ok(())
    }
}

impl MutexNode for Maekawa {
    type Msg = MaekawaMsg;
    type Config = MaekawaConfig;
    const NAME: &'static str = "maekawa";
    const REQUIRES_FIFO: bool = true;
    const TOKEN_BASED: bool = false;

    fn new(id: NodeId, n: usize, config: &Self::Config) -> Result<Self, MutexError> {
        check_group(id, n)?;
        let quorum = match &config.quorums {
            Some(q) => {
                validate_quorums(n, q)?;
                let mut s = q[id].clone();
                s.sort_unstable();
                s.dedup();
                s
            }
            None => grid_quorums(n).swap_remove(id),
        };
        Ok(Self {
            id,
            n,
            variant: config.variant,
            quorum,
            clock: LamportClock::new(),
            max_fence: 0,
            local: VecDeque::new(),
            my_ts: None,
            in_cs: false,
            votes: vec![false; n],
            yes_votes: 0,
            cand: None,
            inquired: false,
            deferred: Vec::new(),
        })
    }

    fn id(&self) -> NodeId {
        self.id
    }

    fn on_request(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if self.my_ts.is_some() {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        let ts = self.clock.tick();
        self.my_ts = Some(ts);
        for k in 0..self.quorum.len() {
            let r = self.quorum[k];
            self.dispatch(r, MaekawaMsg::Request { ts }, out);
        }
        self.run_local(out)
    }

    fn on_release(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        if !self.in_cs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.in_cs = false;
        self.my_ts = None;
        self.yes_votes = 0;
        self.votes.iter_mut().for_each(|v| *v = false);
        let fence = self.max_fence;
        for k in 0..self.quorum.len() {
            let r = self.quorum[k];
            self.dispatch(r, MaekawaMsg::Release { fence }, out);
        }
        self.run_local(out)
    }

    fn on_message(
        &mut self,
        from: NodeId,
        msg: Self::Msg,
        out: &mut Outbox<Self::Msg>,
    ) -> Result<(), MutexError> {
        if from >= self.n {
            return Err(MutexError::UnknownNode {
                node: from,
                n: self.n,
            });
        }
        if from == self.id {
            return Err(protocol(self.id, "network message from itself"));
        }
        self.handle(from, msg, out)?;
        self.run_local(out)
    }
}
