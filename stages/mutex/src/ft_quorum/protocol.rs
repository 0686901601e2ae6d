//! The crash-tolerant quorum mutual-exclusion protocol (spec §5): REQUEST, REPLY, FAILED,
//! INQUIRE, YIELD, RELEASE and CANCEL with `(Lamport timestamp, pid)` priority, over a quorum
//! that is recomputed from the process's `correct` view on every crash notice; plus FLUSH,
//! LOCK and REVOKE, which settle each crash so that a quorum change cannot break mutual
//! exclusion (gap 1 below).
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
//! - **Quorum change while in the CS (gap 1) — crash settlement.** The spec's suggestion
//!   (finish the CS, RELEASE the old `locked` set minus the dead) is **not safe**: when every
//!   live member of the holder's quorum that a later quorum meets has crashed, the holder's
//!   permissions vanish with the dead arbiters and another process can enter during the CS
//!   (VCube, n = 8: p0 in the CS with {0,1,2,4,5}; 1, 2, 4, 5 crash; p7's new quorum {3,6,7};
//!   `quorum_change_inside_the_cs_is_safe` in `tests/ft_quorum.rs`). The same mechanism let a
//!   fence repeat (a holder's successor whose quorum misses every live process that saw the
//!   holder's RELEASE). Decision, with three messages beyond the spec's seven:
//!   1. **LOCK.** A process *inside the CS* that learns of a crash keeps every lock it holds
//!      (no CANCEL in the CS) and sends LOCK to each member its new quorum gained. An arbiter
//!      receiving LOCK gives its permission to the holder at once; if it had granted it to
//!      another requester, it takes it back with **REVOKE** (that requester is not in the CS,
//!      see below). The revoked grant stays *suspended* until its requester answers — YIELD,
//!      or, if it entered the CS with that REPLY after the holder had left and before the
//!      REVOKE arrived, its RELEASE — and until then the permission goes to nobody but the
//!      holder. RELEASE at exit goes to every locked member, old and new.
//!   2. **FLUSH.** Every process, on every crash notice `f`, after any LOCK, sends
//!      FLUSH(`f`, its largest fence) to every process of its view. An arbiter has **settled**
//!      `f` once it knows `f` crashed and holds FLUSH(`f`) from every process its view holds
//!      correct (a process that crashes meanwhile is no longer awaited).
//!   3. **View-stamped REPLYs.** Every REPLY carries the number of crashes its arbiter had
//!      settled; an arbiter that settles more re-sends its current grantee a REPLY (`refresh`)
//!      with the new count. A requester enters only when **every** member's REPLY carries
//!      exactly the number of crashes in its own view. Since a settled crash was FLUSHed by
//!      every live process, an arbiter's settled set is contained in every live view; equal
//!      counts therefore mean equal sets: all the permissions were granted under the
//!      requester's own view, after every live process had processed those crashes.
//!
//!   *Why it is safe* (when all processes learn crashes in the same order, e.g. simultaneous
//!   notices): let p be in the CS, having entered under view V_i, and q enter under V_j. If
//!   j = i the quorums meet at an arbiter whose single permission p holds (or held until it
//!   died, so q cannot have its REPLY under V_i). If j > i, every arbiter q used settled V_j,
//!   so it had p's FLUSH of the j-th crash, so (FIFO) it had processed p's LOCK under V_j
//!   before; Q_q(V_j) and Q_p(V_j) meet at such an arbiter, whose permission p holds until its
//!   RELEASE, so q cannot hold it. The same argument shows a REVOKEd requester was not in the
//!   CS. FLUSH carries the largest fence, so a REPLY given under V_j also carries every fence a
//!   live process knew when the crashes were settled. *Liveness:* settlement needs only the
//!   perfect detector (every live process eventually FLUSHes every crash), after which stamps
//!   match and the protocol is the plain one.
//!
//!   *Not proved:* with notices in different orders at different processes (staggered views),
//!   settled sets at different arbiters can be incomparable and quorums from incomparable views
//!   need not intersect; closing that needs agreement on one sequence of views (a sequencer
//!   with a view-change round, i.e. view-synchronous membership over the perfect detector),
//!   not done. The soaks (`mutex-soak --crashes`) found no violation with staggered notices.
//!
//!   *Cost:* n − 1 FLUSHes per live process per crash, i.e. about n² messages per crash, plus
//!   one refreshed REPLY per arbiter; reported as message types `flush`, `refresh`, `lock`,
//!   `revoke`.
//! - **Arbiter whose locker crashed (§5.4 \[sic\]).** It drops the crashed process's request and
//!   grants the head of its queue. Requests of correct processes whose quorum no longer contains
//!   this arbiter are *not* guessed from the arbiter's own view: those requesters send CANCEL.
//! - **Messages from processes outside the view** (sent before the crash, delivered after the
//!   notice) are dropped, as the spec's "remove the failed process's messages" asks.
//! - **No quorum (tree).** When the generator reports [`QuorumError::NoQuorum`] the process
//!   CANCELs its outstanding requests, and a pending or later request stays blocked: it is never
//!   granted and [`FtQuorumNode::no_quorum`] reports it, so a driver counts such runs instead of
//!   mistaking them for deadlocks. The arbiter role keeps working.
//! - **Fencing.** As in Maekawa: REPLY, RELEASE and FLUSH carry the largest fence seen; an
//!   entering node uses `max_seen + 1`. A holder that crashes inside the CS never publishes its
//!   fence, so the next fence may equal it (the checker forgets a crashed holder's fence).
//!   That is harmless only if the crashed node was the fence's only user; the lock service's
//!   clients outlive their node, so its serving groups take fences from a majority register
//!   instead (`leda_lock_service::epoch`; `lock-check` found the repeat).
//! - **Grant numbers.** Each arbiter numbers its grants; REPLY carries the number, YIELD echoes
//!   it and REVOKE names it, so a YIELD that crossed a REVOKE is recognised as void.
//! - **Channels:** FIFO required (an arbiter's REPLY must precede its INQUIRE, a requester's
//!   YIELD/CANCEL must precede a later REQUEST, a holder's LOCK must precede its FLUSH). Over
//!   non-FIFO links the protocol is not safe and [`MutexNode::REQUIRES_FIFO`] says so.

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

/// The seven messages of the protocol (spec §5.1), then the three of crash settlement (FLUSH,
/// LOCK, REVOKE; see the module docs).
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
        /// How many crashes the arbiter had *settled* when it sent this (see the module docs):
        /// the grant is valid for a requester whose view holds exactly that many crashes.
        view: u64,
        /// A re-sent REPLY for a permission already granted, after the arbiter settled another
        /// crash; it only refreshes `view` at a requester that still holds the permission.
        refresh: bool,
        /// The arbiter's number for this grant (echoed by YIELD, named by REVOKE).
        grant: u64,
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
    Yield {
        /// The grant given back (as its REPLY numbered it); a YIELD for an older grant is void.
        grant: u64,
    },
    /// The requester left the CS.
    Release {
        /// The releaser's fence.
        fence: Fence,
    },
    /// The requester withdraws its request (it left this arbiter's quorum).
    Cancel,
    /// Sent to every process on a crash notice, after any LOCK: "I have processed the crash of
    /// `crashed`; the largest fence I know is `fence`".
    Flush {
        /// The crashed process.
        crashed: NodeId,
        /// The sender's largest fence.
        fence: Fence,
    },
    /// From a process **inside the CS** to a member its quorum gained on a crash notice: the
    /// arbiter's permission belongs to the sender until its RELEASE.
    Lock {
        /// Timestamp of the holder's request.
        ts: u64,
        /// The holder's attempt number for this member.
        attempt: u64,
    },
    /// The arbiter took back the permission it had granted (a LOCK claimed it); the requester
    /// answers with YIELD, or, if it is in the CS with it, with its RELEASE.
    Revoke {
        /// The grant that is void.
        grant: u64,
    },
}

impl Message for FtMsg {
    fn kind(&self) -> &'static str {
        match self {
            Self::Request { .. } => "request",
            Self::Reply { refresh: false, .. } => "reply",
            Self::Reply { refresh: true, .. } => "refresh",
            Self::Failed => "failed",
            Self::Inquire { .. } => "inquire",
            Self::Yield { .. } => "yield",
            Self::Release { .. } => "release",
            Self::Cancel => "cancel",
            Self::Flush { .. } => "flush",
            Self::Lock { .. } => "lock",
            Self::Revoke { .. } => "revoke",
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
    /// Members whose permission I hold: (settled-crash count of their REPLY, grant number).
    replies: BTreeMap<NodeId, (u64, u64)>,
    got_failed: bool,
    deferred_inquires: BTreeSet<NodeId>,
    // Arbiter.
    granted: Option<(Stamp, u64)>,
    inquired: bool,
    queue: BTreeMap<Stamp, u64>,
    failed_sent: BTreeSet<Stamp>,
    /// Number of the current (or last) grant of this arbiter's permission.
    grant_no: u64,
    /// A grant a LOCK took back, awaiting its holder's answer to REVOKE (YIELD, or RELEASE if
    /// it had already entered with it, or CANCEL): (request, attempt, grant number). While
    /// set, the permission goes to nobody but the LOCK holder.
    suspended: Option<(Stamp, u64, u64)>,
    // Crash settlement.
    /// For each crash not yet settled: the processes that sent its FLUSH.
    flushes: BTreeMap<NodeId, BTreeSet<NodeId>>,
    /// Crashes settled: known here, and FLUSHed by every process this view holds correct.
    settled: BTreeSet<NodeId>,
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
        self.grant_no += 1;
        self.send_reply(s.node, attempt, false, out);
    }

    fn send_reply(&mut self, to: NodeId, attempt: u64, refresh: bool, out: &mut Outbox<FtMsg>) {
        let msg = FtMsg::Reply {
            attempt,
            fence: self.max_fence,
            view: self.settled.len() as u64,
            refresh,
            grant: self.grant_no,
        };
        self.dispatch(to, msg, out);
    }

    /// Number of crashes in this process's view.
    fn crashes_known(&self) -> u64 {
        (self.n - self.correct.len()) as u64
    }

    /// Settles every crash this process knows of whose FLUSH came from every process its view
    /// holds correct; on progress, re-sends the current grantee its REPLY with the new count.
    /// `only`: the one crash whose FLUSH just arrived (the others cannot have progressed).
    fn settle(&mut self, only: Option<NodeId>, out: &mut Outbox<FtMsg>) {
        let mut progress = false;
        let unsettled: Vec<NodeId> = match only {
            Some(f) => vec![f],
            None => (0..self.n).collect(),
        };
        let others = self.correct.len().saturating_sub(1);
        for f in unsettled {
            if self.correct.contains(f) || self.settled.contains(&f) {
                continue;
            }
            let from = self.flushes.get(&f);
            let done = others == 0
                || from.is_some_and(|set| {
                    set.len() >= others
                        && (0..self.n)
                            .filter(|&j| j != self.id && self.correct.contains(j))
                            .all(|j| set.contains(&j))
                });
            if done {
                self.flushes.remove(&f);
                self.settled.insert(f);
                progress = true;
            }
        }
        if progress && let Some((s, a)) = self.granted {
            self.send_reply(s.node, a, true, out);
        }
    }

    /// Grants the head of the queue if the permission is free, then sends the FAILEDs owed.
    fn grant_next(&mut self, out: &mut Outbox<FtMsg>) {
        if self.granted.is_none()
            && self.suspended.is_none()
            && let Some((s, a)) = self.queue.pop_first()
        {
            self.grant(s, a, out);
        }
        self.send_faileds(out);
    }

    /// Queues request `s`; INQUIREs the current grantee if `s` beats it (once per grant).
    fn enqueue(&mut self, s: Stamp, attempt: u64, out: &mut Outbox<FtMsg>) {
        self.queue.insert(s, attempt);
        if let Some((g, ga)) = self.granted
            && s < g
            && !self.inquired
        {
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
        if self.suspended.is_some_and(|(s, _, _)| s.node == k) {
            self.suspended = None;
        }
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
        if let Some((_, grant)) = self.replies.remove(&j) {
            self.dispatch(j, FtMsg::Yield { grant }, out);
        }
    }

    fn try_enter(&mut self, out: &mut Outbox<FtMsg>) {
        let ready = self.my_req.is_some()
            && !self.in_cs
            && !self.no_quorum
            && !self.locked.is_empty()
            && self
                .locked
                .keys()
                .all(|j| self.replies.get(j).map(|r| r.0) == Some(self.crashes_known()));
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
                if self.granted.is_none() && self.suspended.is_none() {
                    self.grant(s, attempt, out);
                } else {
                    self.enqueue(s, attempt, out);
                }
                self.send_faileds(out);
            }
            FtMsg::Reply {
                attempt,
                fence,
                view,
                refresh,
                grant,
            } => {
                self.max_fence = self.max_fence.max(fence);
                if self.locked.get(&from) != Some(&attempt) || self.in_cs {
                    // Stale: sent before our CANCEL reached `from`; that CANCEL frees it.
                    return Ok(());
                }
                match (refresh, self.replies.get_mut(&from)) {
                    (true, Some(held)) if held.1 == grant => held.0 = view,
                    // A refresh of a permission given back since (YIELD or REVOKE): void.
                    (true, _) => return Ok(()),
                    (false, Some(_)) => {
                        return Err(protocol(self.id, format!("duplicate REPLY from {from}")));
                    }
                    (false, None) => {
                        self.replies.insert(from, (view, grant));
                    }
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
                    && self.replies.contains_key(&from);
                if !current {
                    return Ok(());
                }
                if self.got_failed {
                    self.yield_to(from, out);
                } else {
                    self.deferred_inquires.insert(from);
                }
            }
            FtMsg::Yield { grant } => match (self.granted, self.suspended) {
                (Some((s, a)), _) if s.node == from && self.inquired && grant == self.grant_no => {
                    self.granted = None;
                    self.queue.insert(s, a);
                    // The yielder yielded because it was told FAILED: it is owed no other
                    // (the spec's YIELD handler sends only the REPLY).
                    self.failed_sent.insert(s);
                    self.grant_next(out);
                }
                // The answer to a REVOKE (or an INQUIRE that crossed it): the suspended grant
                // is given back; the request waits in the queue again.
                (_, Some((s, a, g))) if s.node == from && grant == g => {
                    self.suspended = None;
                    self.enqueue(s, a, out);
                    self.grant_next(out);
                }
                _ if grant < self.grant_no => {}
                _ => return Err(protocol(self.id, format!("unexpected YIELD from {from}"))),
            },
            FtMsg::Release { fence } => {
                self.max_fence = self.max_fence.max(fence);
                let suspended = self.suspended.is_some_and(|(s, _, _)| s.node == from);
                if !suspended && self.granted.is_none_or(|(s, _)| s.node != from) {
                    return Err(protocol(
                        self.id,
                        format!("RELEASE from {from}, which holds no permission here"),
                    ));
                }
                self.withdraw(from, out);
            }
            FtMsg::Cancel => self.withdraw(from, out),
            FtMsg::Flush { crashed, fence } => {
                self.max_fence = self.max_fence.max(fence);
                if !self.settled.contains(&crashed) {
                    self.flushes.entry(crashed).or_default().insert(from);
                    self.settle(Some(crashed), out);
                }
            }
            FtMsg::Lock { ts, attempt } => {
                self.clock.observe(ts);
                let s = Stamp::new(ts, from);
                self.queue.retain(|q, _| q.node != from);
                self.failed_sent.retain(|q| q.node != from);
                match self.granted {
                    Some((g, _)) if g.node == from => {}
                    Some((g, ga)) => {
                        // The holder is in the CS, so `g` is not (module docs): take it back.
                        // `g` may still enter with it once the holder has left (before the
                        // REVOKE arrives), so nobody else gets this permission until `g`
                        // answers: YIELD, or RELEASE if it did enter.
                        let grant = self.grant_no;
                        self.suspended = Some((g, ga, grant));
                        self.dispatch(g.node, FtMsg::Revoke { grant }, out);
                    }
                    None => {}
                }
                self.grant_no += 1;
                self.granted = Some((s, attempt));
                self.inquired = true; // never INQUIRE a holder: it cannot yield
                self.send_faileds(out);
            }
            FtMsg::Revoke { grant } => {
                // In the CS the RELEASE will answer; otherwise give the permission back.
                if !self.in_cs && self.replies.get(&from).is_some_and(|r| r.1 == grant) {
                    self.replies.remove(&from);
                    self.deferred_inquires.remove(&from);
                    self.dispatch(from, FtMsg::Yield { grant }, out);
                }
            }
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
            replies: BTreeMap::new(),
            got_failed: false,
            deferred_inquires: BTreeSet::new(),
            granted: None,
            inquired: false,
            queue: BTreeMap::new(),
            failed_sent: BTreeSet::new(),
            grant_no: 0,
            suspended: None,
            flushes: BTreeMap::new(),
            settled: BTreeSet::new(),
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
            // Gap 1: keep every lock (RELEASE later goes to all of them), and LOCK the members
            // the new quorum gained, before the FLUSH below (FIFO links).
            self.locked.remove(&failed);
            if let Some(req) = self.my_req {
                let added: Vec<NodeId> = self
                    .members
                    .iter()
                    .copied()
                    .filter(|p| !self.locked.contains_key(p))
                    .collect();
                for p in added {
                    self.attempts += 1;
                    let attempt = self.attempts;
                    self.locked.insert(p, attempt);
                    self.dispatch(
                        p,
                        FtMsg::Lock {
                            ts: req.ts,
                            attempt,
                        },
                        out,
                    );
                }
            }
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
        // Settlement: tell everyone this crash is processed (after the LOCKs), then settle what
        // the shrunken view lets settle. FLUSH messages from `failed` are no longer awaited.
        let fence = self.max_fence;
        let live: Vec<NodeId> = (0..self.n)
            .filter(|&j| j != self.id && self.correct.contains(j))
            .collect();
        for j in live {
            out.send(
                j,
                FtMsg::Flush {
                    crashed: failed,
                    fence,
                },
            );
        }
        self.settle(None, out);
        self.try_enter(out);
        self.run_local(out)
    }
}
