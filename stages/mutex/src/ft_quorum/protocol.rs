//! The crash-tolerant quorum mutual-exclusion protocol (spec §5): REQUEST, REPLY, FAILED,
//! INQUIRE, YIELD, RELEASE and CANCEL with `(Lamport timestamp, pid)` priority, over a quorum
//! that is recomputed from the process's `correct` view on every crash notice.
//!
//! Every process is both a **requester** and an **arbiter** (one permission, `granted`). The
//! quorum comes from a [`QuorumSource`]: one of the three generators ([`Generator`]) or, for
//! hand-made scenarios such as the spec's §7 trace, an explicit table.
//!
//! Handlers follow the spec's §5.5 consolidation. Decisions where the spec is open (\[D\]), each
//! exercised by `tests/ft_quorum.rs`:
//!
//! - **Self-messages.** `i ∈ Q_i`; messages to self are handled locally right after the handler
//!   that produced them and reported as [`crate::Output::Local`] (counted, as in
//!   [`crate::algo::maekawa`]): a CS at light load costs `3|Q_i|` messages.
//! - **Clock.** Tick before stamping a request; `clock := max(clock, ts) + 1` on every REQUEST.
//! - **Arbiter queue.** `granted` holds the one request this arbiter voted for; `queue` holds the
//!   other pending requests, ordered by priority. YIELD puts the granted request back in the
//!   queue and grants the head.
//! - **Duplicate INQUIREs (gap 4).** At most one INQUIRE per grant (`inquired`, reset whenever
//!   the permission is granted anew).
//! - **FAILED to queued lower-priority requests (gap 5).** The classic Maekawa fix, needed for
//!   deadlock freedom: every queued request that has a higher-priority competitor at this arbiter
//!   (the granted one or an earlier queued one) receives exactly one FAILED per stay in the queue.
//!   Only the queue head, when it beats the granted request, waits without FAILED (its INQUIRE is
//!   under way).
//! - **INQUIRE.** Carries the granted request's timestamp and attempt number. It is honoured only
//!   while waiting for that very request, holding that arbiter's REPLY; otherwise it is stale and
//!   ignored. With a FAILED received for the current request the requester YIELDs at once;
//!   otherwise it defers and YIELDs on the first FAILED, or ignores it by entering the CS (the
//!   RELEASE then frees the arbiter).
//! - **Re-requests keep the timestamp (gap 2).** After a quorum change the same `(ts, i)` is sent
//!   to the new members, so priority is preserved and fresh timestamps cannot starve a request.
//! - **Attempts.** Every REQUEST a requester sends carries a per-requester attempt counter,
//!   echoed by REPLY and INQUIRE. A REPLY that does not match the attempt currently outstanding at
//!   that member is stale (sent before a CANCEL reached it) and ignored; the CANCEL frees that
//!   arbiter. This matters when a member leaves the quorum and later re-enters it.
//! - **Releasing a member that left the quorum (gap 3).** CANCEL: at an arbiter it removes the
//!   requester's queued request, and if the arbiter was granted to that requester it also frees
//!   the permission, exactly like RELEASE.
//! - **Quorum change while in the CS (gap 1).** The CS is finished; RELEASE goes to the old
//!   `locked` set minus crashed processes; no REQUEST or CANCEL is sent during the CS. This is
//!   the spec's suggestion and it is **not safe** in general: when every live member of the
//!   holder's quorum that a later quorum would meet has crashed, the holder's permissions vanish
//!   with the dead arbiters and another process can enter during the CS (pinned by
//!   `known_hole_quorum_change_inside_the_cs_is_unsafe` in `tests/ft_quorum.rs`). An open
//!   problem of the protocol as specified, not fixed here.
//! - **Arbiter whose locker crashed (§5.4 \[sic\]).** It drops the crashed process's request and
//!   grants the head of its queue. Requests of correct processes whose quorum no longer contains
//!   this arbiter are *not* guessed from the arbiter's own view: those requesters send CANCEL.
//! - **Messages from processes outside the view** (sent before the crash, delivered after the
//!   notice) are dropped, as the spec's "remove the failed process's messages" asks.
//! - **No quorum (tree).** When the generator reports [`QuorumError::NoQuorum`] the process
//!   CANCELs its outstanding requests, and a pending or later request stays blocked: it is never
//!   granted and [`FtQuorumNode::no_quorum`] reports it, so a driver counts such runs instead of
//!   mistaking them for deadlocks. The arbiter role keeps working.
//! - **Fencing.** As in Maekawa: REPLY and RELEASE carry the largest fence seen; an entering node
//!   uses `max_seen + 1`. Strictly increasing fences are guaranteed across releases; a holder that
//!   crashes inside the CS never publishes its fence, so after such a crash the next fence may
//!   repeat (see the note in `tests/ft_quorum.rs`).
//! - **Channels:** FIFO required (an arbiter's REPLY must precede its INQUIRE, a requester's
//!   YIELD/CANCEL must precede a later REQUEST).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::clock::{LamportClock, Stamp};
use crate::error::MutexError;
use crate::ft_quorum::{CorrectSet, Generator, Quorum, QuorumError};
use crate::node::{Fence, Message, MutexNode, NodeId, Outbox, check_group, check_node, protocol};

/// Where a process's quorum comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuorumSource {
    /// One of the spec's three generators.
    Generator(Generator),
    /// Hand-made quorums (the spec's §7 trace): for a set of crashed processes (as the view sees
    /// it), the quorum of every process. A view whose crashed set is not in the table has no
    /// quorum ([`QuorumError::NoQuorum`]).
    Table(BTreeMap<BTreeSet<NodeId>, Vec<Quorum>>),
}

impl Default for QuorumSource {
    fn default() -> Self {
        QuorumSource::Generator(Generator::VCube)
    }
}

impl QuorumSource {
    /// The quorum of `i` under the view `correct`.
    pub fn quorum(&self, i: NodeId, correct: &CorrectSet) -> Result<Quorum, QuorumError> {
        match self {
            QuorumSource::Generator(g) => g.quorum(i, correct),
            QuorumSource::Table(table) => {
                correct.check_requester(i)?;
                let crashed: BTreeSet<NodeId> =
                    (0..correct.n()).filter(|&j| !correct.contains(j)).collect();
                table
                    .get(&crashed)
                    .and_then(|qs| qs.get(i))
                    .cloned()
                    .ok_or(QuorumError::NoQuorum {
                        n: correct.n(),
                        correct: correct.len(),
                    })
            }
        }
    }
}

/// Configuration of the fault-tolerant quorum protocol.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FtQuorumConfig {
    /// The quorum generator (default: VCube).
    pub source: QuorumSource,
}

impl FtQuorumConfig {
    /// A configuration over generator `g`.
    pub fn generator(g: Generator) -> Self {
        Self {
            source: QuorumSource::Generator(g),
        }
    }
}

/// The seven messages of the protocol (spec §5.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FtMsg {
    /// Permission request stamped `(ts, sender)`; `attempt` numbers this sending.
    Request {
        /// Lamport timestamp of the request.
        ts: u64,
        /// The requester's attempt counter for this sending.
        attempt: u64,
    },
    /// The arbiter grants its permission to the request sent with `attempt`.
    Reply {
        /// The attempt being answered.
        attempt: u64,
        /// Largest fence the arbiter has seen.
        fence: Fence,
    },
    /// The arbiter is locked by a higher-priority request.
    Failed,
    /// The arbiter wants back the permission it granted to request `ts` (attempt `attempt`).
    Inquire {
        /// Timestamp of the granted request.
        ts: u64,
        /// Attempt of the granted request.
        attempt: u64,
    },
    /// The requester gives the permission back.
    Yield,
    /// The requester left the CS.
    Release {
        /// The releaser's fence.
        fence: Fence,
    },
    /// The requester withdraws its request (it left this arbiter's quorum).
    Cancel,
}

impl Message for FtMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Request { .. } => "request",
            Self::Reply { .. } => "reply",
            Self::Failed => "failed",
            Self::Inquire { .. } => "inquire",
            Self::Yield => "yield",
            Self::Release { .. } => "release",
            Self::Cancel => "cancel",
        }
    }
}

/// One process (requester and arbiter) of the fault-tolerant quorum protocol.
#[derive(Debug, Clone)]
pub struct FtQuorumNode {
    id: NodeId,
    n: usize,
    source: QuorumSource,
    correct: CorrectSet,
    clock: LamportClock,
    max_fence: Fence,
    local: VecDeque<FtMsg>,
    // Requester.
    members: Quorum,
    no_quorum: bool,
    my_req: Option<Stamp>,
    in_cs: bool,
    attempts: u64,
    /// Members holding my current request, with the attempt each one holds.
    locked: BTreeMap<NodeId, u64>,
    replies: BTreeSet<NodeId>,
    got_failed: bool,
    deferred_inquires: BTreeSet<NodeId>,
    // Arbiter.
    granted: Option<(Stamp, u64)>,
    inquired: bool,
    queue: BTreeMap<Stamp, u64>,
    failed_sent: BTreeSet<Stamp>,
}

impl FtQuorumNode {
    /// The current quorum `members_i` (empty while no quorum exists).
    pub fn members(&self) -> &Quorum {
        &self.members
    }

    /// Whether the generator reported that no quorum exists in this process's view.
    pub fn no_quorum(&self) -> bool {
        self.no_quorum
    }

    /// This process's view `correct_i`.
    pub fn correct(&self) -> &CorrectSet {
        &self.correct
    }

    /// Whether a request of this process is pending (not yet granted).
    pub fn is_waiting(&self) -> bool {
        self.my_req.is_some() && !self.in_cs
    }

    /// The request this arbiter's permission is granted to, if any.
    pub fn granted_to(&self) -> Option<Stamp> {
        self.granted.map(|(s, _)| s)
    }

    fn dispatch(&mut self, to: NodeId, msg: FtMsg, out: &mut Outbox<FtMsg>) {
        if to == self.id {
            out.local(msg.kind());
            self.local.push_back(msg);
        } else {
            out.send(to, msg);
        }
    }

    fn run_local(&mut self, out: &mut Outbox<FtMsg>) -> Result<(), MutexError> {
        while let Some(msg) = self.local.pop_front() {
            self.handle(self.id, msg, out)?;
        }
        Ok(())
    }

    // ---- arbiter ----

    fn grant(&mut self, s: Stamp, attempt: u64, out: &mut Outbox<FtMsg>) {
        self.granted = Some((s, attempt));
        self.inquired = false;
        self.failed_sent.remove(&s);
        let fence = self.max_fence;
        self.dispatch(s.node, FtMsg::Reply { attempt, fence }, out);
    }

    /// Grants the head of the queue if the permission is free, then sends the FAILEDs owed.
    fn grant_next(&mut self, out: &mut Outbox<FtMsg>) {
        if self.granted.is_none()
            && let Some((s, a)) = self.queue.pop_first()
        {
            self.grant(s, a, out);
        }
        self.send_faileds(out);
    }

    /// Gap 5: every queued request with a higher-priority competitor here gets one FAILED.
    fn send_faileds(&mut self, out: &mut Outbox<FtMsg>) {
        let granted = self.granted.map(|(s, _)| s);
        let owed: Vec<Stamp> = self
            .queue
            .keys()
            .enumerate()
            .filter(|&(k, s)| k > 0 || granted.is_some_and(|g| g < *s))
            .map(|(_, s)| *s)
            .filter(|s| !self.failed_sent.contains(s))
            .collect();
        for s in owed {
            self.failed_sent.insert(s);
            self.dispatch(s.node, FtMsg::Failed, out);
        }
    }

    /// Removes every request of `k` from the queue; frees the permission if `k` holds it.
    fn withdraw(&mut self, k: NodeId, out: &mut Outbox<FtMsg>) {
        self.queue.retain(|s, _| s.node != k);
        self.failed_sent.retain(|s| s.node != k);
        if self.granted.is_some_and(|(s, _)| s.node == k) {
            self.granted = None;
            self.inquired = false;
        }
        self.grant_next(out);
    }

    // ---- requester ----

    fn send_request(&mut self, to: NodeId, ts: u64, out: &mut Outbox<FtMsg>) {
        self.attempts += 1;
        let attempt = self.attempts;
        self.locked.insert(to, attempt);
        self.dispatch(to, FtMsg::Request { ts, attempt }, out);
    }

    fn yield_to(&mut self, j: NodeId, out: &mut Outbox<FtMsg>) {
        self.replies.remove(&j);
        self.dispatch(j, FtMsg::Yield, out);
    }

    fn try_enter(&mut self, out: &mut Outbox<FtMsg>) {
        let ready = self.my_req.is_some()
            && !self.in_cs
            && !self.no_quorum
            && !self.locked.is_empty()
            && self.locked.keys().all(|j| self.replies.contains(j));
        if ready {
            self.in_cs = true;
            self.deferred_inquires.clear();
            self.max_fence += 1;
            out.grant(self.max_fence);
        }
    }

    fn handle(
        &mut self,
        from: NodeId,
        msg: FtMsg,
        out: &mut Outbox<FtMsg>,
    ) -> Result<(), MutexError> {
        match msg {
            FtMsg::Request { ts, attempt } => {
                self.clock.observe(ts);
                let s = Stamp::new(ts, from);
                let known = self.granted.is_some_and(|(g, _)| g.node == from)
                    || self.queue.keys().any(|q| q.node == from);
                if known {
                    return Err(protocol(self.id, format!("duplicate REQUEST from {from}")));
                }
                match self.granted {
                    None => self.grant(s, attempt, out),
                    Some((g, ga)) => {
                        self.queue.insert(s, attempt);
                        if s < g && !self.inquired {
                            self.inquired = true;
                            self.dispatch(
                                g.node,
                                FtMsg::Inquire {
                                    ts: g.ts,
                                    attempt: ga,
                                },
                                out,
                            );
                        }
                    }
                }
                self.send_faileds(out);
            }
            FtMsg::Reply { attempt, fence } => {
                self.max_fence = self.max_fence.max(fence);
                if self.locked.get(&from) != Some(&attempt) || self.in_cs {
                    // Stale: sent before our CANCEL reached `from`; that CANCEL frees it.
                    return Ok(());
                }
                if !self.replies.insert(from) {
                    return Err(protocol(self.id, format!("duplicate REPLY from {from}")));
                }
                self.try_enter(out);
            }
            FtMsg::Failed => {
                if self.my_req.is_none() || self.in_cs || !self.locked.contains_key(&from) {
                    return Ok(());
                }
                self.got_failed = true;
                for j in std::mem::take(&mut self.deferred_inquires) {
                    self.yield_to(j, out);
                }
            }
            FtMsg::Inquire { ts, attempt } => {
                self.clock.observe(ts);
                let current = !self.in_cs
                    && self.my_req.is_some_and(|r| r.ts == ts)
                    && self.locked.get(&from) == Some(&attempt)
                    && self.replies.contains(&from);
                if !current {
                    return Ok(());
                }
                if self.got_failed {
                    self.yield_to(from, out);
                } else {
                    self.deferred_inquires.insert(from);
                }
            }
            FtMsg::Yield => match self.granted {
                Some((s, a)) if s.node == from && self.inquired => {
                    self.granted = None;
                    self.queue.insert(s, a);
                    self.grant_next(out);
                }
                _ => return Err(protocol(self.id, format!("unexpected YIELD from {from}"))),
            },
            FtMsg::Release { fence } => {
                self.max_fence = self.max_fence.max(fence);
                if self.granted.is_none_or(|(s, _)| s.node != from) {
                    return Err(protocol(
                        self.id,
                        format!("RELEASE from {from}, which holds no permission here"),
                    ));
                }
                self.withdraw(from, out);
            }
            FtMsg::Cancel => self.withdraw(from, out),
        }
        Ok(())
    }
}

impl MutexNode for FtQuorumNode {
    type Msg = FtMsg;
    type Config = FtQuorumConfig;
    const NAME: &'static str = "ft-quorum";
    const REQUIRES_FIFO: bool = true;
    const TOKEN_BASED: bool = false;

    fn new(id: NodeId, n: usize, config: &Self::Config) -> Result<Self, MutexError> {
        check_group(id, n)?;
        let correct = CorrectSet::all(n);
        let members = config
            .source
            .quorum(id, &correct)
            .map_err(|e| MutexError::Config(format!("quorum of process {id}: {e}")))?;
        if !members.contains(&id) || members.iter().any(|&j| j >= n) {
            return Err(MutexError::Config(format!(
                "quorum of process {id} must contain it and only ids below {n}"
            )));
        }
        Ok(Self {
            id,
            n,
            source: config.source.clone(),
            correct,
            clock: LamportClock::new(),
            max_fence: 0,
            local: VecDeque::new(),
            members,
            no_quorum: false,
            my_req: None,
            in_cs: false,
            attempts: 0,
            locked: BTreeMap::new(),
            replies: BTreeSet::new(),
            got_failed: false,
            deferred_inquires: BTreeSet::new(),
            granted: None,
            inquired: false,
            queue: BTreeMap::new(),
            failed_sent: BTreeSet::new(),
        })
    }

    fn id(&self) -> NodeId {
        self.id
    }

    fn on_request(&mut self, out: &mut Outbox<FtMsg>) -> Result<(), MutexError> {
        if self.my_req.is_some() {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        let ts = self.clock.tick();
        self.my_req = Some(Stamp::new(ts, self.id));
        self.locked.clear();
        self.replies.clear();
        self.got_failed = false;
        self.deferred_inquires.clear();
        if !self.no_quorum {
            let members: Vec<NodeId> = self.members.iter().copied().collect();
            for p in members {
                self.send_request(p, ts, out);
            }
        }
        self.run_local(out)
    }

    fn on_release(&mut self, out: &mut Outbox<FtMsg>) -> Result<(), MutexError> {
        if !self.in_cs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.in_cs = false;
        self.my_req = None;
        self.replies.clear();
        self.deferred_inquires.clear();
        self.got_failed = false;
        let fence = self.max_fence;
        let targets: Vec<NodeId> = std::mem::take(&mut self.locked).into_keys().collect();
        for p in targets {
            self.dispatch(p, FtMsg::Release { fence }, out);
        }
        self.run_local(out)
    }

    fn on_message(
        &mut self,
        from: NodeId,
        msg: FtMsg,
        out: &mut Outbox<FtMsg>,
    ) -> Result<(), MutexError> {
        check_node(from, self.n)?;
        if from == self.id {
            return Err(protocol(self.id, "network message from itself"));
        }
        if !self.correct.contains(from) {
            // Sent before `from` crashed, delivered after the notice: dropped (spec §5.4).
            return Ok(());
        }
        self.handle(from, msg, out)?;
        self.run_local(out)
    }

    fn on_failure(&mut self, failed: NodeId, out: &mut Outbox<FtMsg>) -> Result<(), MutexError> {
        check_node(failed, self.n)?;
        if failed == self.id {
            return Err(protocol(self.id, "crash notice about itself"));
        }
        let newly = self
            .correct
            .crash(failed)
            .map_err(|e| protocol(self.id, e.to_string()))?;
        if !newly {
            return Ok(());
        }
        // Arbiter: drop the dead process's request; revoke a permission it held.
        self.withdraw(failed, out);
        // Requester: drop its messages.
        self.replies.remove(&failed);
        self.deferred_inquires.remove(&failed);
        match self.source.quorum(self.id, &self.correct) {
            Ok(q) => {
                self.members = q;
                self.no_quorum = false;
            }
            Err(QuorumError::NoQuorum { .. }) => {
                self.members.clear();
                self.no_quorum = true;
            }
            Err(e) => return Err(protocol(self.id, format!("quorum regeneration: {e}"))),
        }
        if self.in_cs {
            // Gap 1: finish the CS; RELEASE later goes to the old locked set minus the dead.
            self.locked.remove(&failed);
        } else if let Some(req) = self.my_req {
            self.locked.remove(&failed);
            let added: Vec<NodeId> = self
                .members
                .iter()
                .copied()
                .filter(|p| !self.locked.contains_key(p))
                .collect();
            let left: Vec<NodeId> = self
                .locked
                .keys()
                .copied()
                .filter(|p| !self.members.contains(p))
                .collect();
            for p in left {
                self.locked.remove(&p);
                self.replies.remove(&p);
                self.deferred_inquires.remove(&p);
                self.dispatch(p, FtMsg::Cancel, out);
            }
            for p in added {
                self.send_request(p, req.ts, out);
            }
            self.try_enter(out);
        }
        self.run_local(out)
    }
}
