//! Vieira Neto's grid-aware hierarchical multi-resource algorithm (\[VN\], spec §5): one token per
//! resource instance plus a unique **control token** (CT) that orders acquisitions, with cluster
//! **leaders**, **local priority** for CT requests (**preemption**, bounded by `MAX_PREEMPT`),
//! token requests answered in two steps (**ACK1** now, **ACK2** at CS exit) and **token
//! selection by locality** (and list C). One code serves both forms: single-instance (\[VN\] v1,
//! every type with `k = 1`) and multi-instance (v2).
//!
//! [`GridNode`] is one process, a pure state machine (`on_request` / `on_release` /
//! `on_message`, what a Leda stage wraps); [`GridAware`] is the group of `n` for the driver
//! ([`MultiSystem`]). [`GridMode::Plain`] turns every grid feature off — one global tree (Alg. 3,
//! everyone initially pointing at the elected process), no `remote_owner`, no preemption, no
//! locality or list-C selection — which is the Bouabdallah–Laforest baseline as \[VN\] implemented
//! it (§5.11); it exists for ablation and as a fallback baseline.
//!
//! # Walk-through
//! - **Request** (Alg. 2): if the process holds the CT it goes to Stage 2 at once; else, if the
//!   tokens it needs are all here and unlocked it locks them and enters (the **fast path**, 0
//!   messages); else it sends `Request` to `owner` and becomes a root.
//! - **CT request** (Alg. 4): an idle root sends the CT; a requesting root with no successor
//!   queues the requester (`owner` follows local requesters only; a remote one is kept in
//!   `remote_owner`); a requesting root whose successor is remote **preempts** it for a local
//!   requester while that successor's preemption count is below `MAX_PREEMPT` (sending
//!   `Preempt` so the remote successor moves to the end of the local chain), else appends the
//!   requester behind the remote successor. A non-root forwards to `owner` and points at the
//!   requester only if it is local (remote requests do not redirect local pointers).
//! - **Stage 2** on CT receipt (Algs. 7–9): pick concrete instances (below), take the free ones
//!   from the CT, return unneeded local ones to it, lock the needed local ones, send one
//!   `TokenRequest` per holder and register as the future holder of those tokens in the CT.
//! - **Token request** (Alg. 10): the holder sends what it has unlocked in an ACK1 (always, even
//!   empty) and owes the rest (locked, or not arrived yet), sent in an ACK2 at its CS exit.
//! - **ACKs** (Alg. 11): received tokens are locked; when every ACK1 is in, the CT may leave to
//!   `next`; when every needed token is here, the process enters.
//! - **Release** (Alg. 12): pass the CT if a successor waits, send the owed ACK2s, unlock what
//!   stays here (cached for the fast path and for later ACK1s).
//!
//! # Decisions (spec §5.10 and the \[D\] points of §5.2–5.6, §7.1)
//! 1. **`num_preempt`** (§5.10.1): neither the literal accumulation (counts added several
//!    times) nor a counter inside the CT (the deciding root does not hold the CT). The count
//!    belongs to the **remote successor**: it travels with it in `Preempt { count, remote }` and
//!    in the `Request { origin, preempted }` that re-queues it, the root holding it as `next`
//!    keeps it, and a preemption is allowed only while it is below `MAX_PREEMPT`. So a process is
//!    preempted **at most `MAX_PREEMPT` times per request** (tested). It is dropped when the CT
//!    goes to that process (the reset of Alg. 12), including when an idle root sends the CT
//!    directly (Alg. 4 line 23). The preemption statistic counts `Preempt` initiations.
//! 2. **`Preempt` forwarding** (§5.10.2): along `next`, not `owner`. `next` is the CT's route, and
//!    with FIFO links a `Preempt` sent along it always precedes the CT on every link, so it
//!    reaches the true tail of the local chain before that tail can get (and keep) the CT;
//!    `owner` may skip ahead and race the CT. If the process reached already has a *remote*
//!    successor (queued meanwhile), the preempted process goes first and the other is
//!    re-queued behind it by a `Request` carrying its own count.
//! 3. Line 19 of Alg. 4 (append behind the remote successor) points `owner` at the requester
//!    only when it is local, like lines 29–31.
//! 4. **Stage 2 after the CT** (§5.10.3): Alg. 7 runs on CT receipt; it locks the *needed* local
//!    tokens (locking all local ones would block tokens the process is about to return).
//! 5. **Early CT release** (§5.10.4): the CT leaves as soon as every ACK1 of the request is in and
//!    a successor is queued — at that moment or whenever one is queued later — without waiting
//!    for the CS; and at CS exit otherwise.
//! 6. `tokens_devidos` are `(process, tokens)` tuples (§5.10.5); a token asked of its registered
//!    future holder before it arrived is owed (§5.10.6).
//! 7. **List C** (§5.10.7): per resource **type**, at most one `(process, count)`. A process's
//!    counter for a type counts its successive requests naming that type (reset when a request
//!    omits it). On Stage 2 it enters list C for a type when its counter is at least
//!    `LIMITE_MINIMO_PRIORIDADE` and the entry is empty, its own, or lower (rules a, b); it leaves
//!    when its counter drops below (rule c). Holders asked for tokens of a type lose their
//!    priority on that type (Alg. 9 lines 12–13, restricted to the types asked).
//! 8. **Instance selection** (§5.10.8): per needed type, instances already here first, then free
//!    ones from the CT, then registered holders in Alg. 8's tiers (local non-priority, local
//!    priority, remote non-priority, remote priority), ties by process id then instance.
//! 9. Unlocking after the CS (§5.10.9): the tokens left here are unlocked and stay cached.
//! 10. **Initial state** (§5.10.10): every token free in the CT; the CT at `NO_ELEITO` = the leader
//!     of process 0's cluster; the leader of a cluster is its lowest id; processes of the elected
//!     cluster and remote leaders point at `NO_ELEITO`, others at their leader (Alg. 1);
//!     `LIMITE_MINIMO_PRIORIDADE` defaults to 2; counters start at 0; fences start at 0 and each
//!     grant of an instance increments its fence (carried with the token).
//! 11. Channels must be FIFO per pair (§5.10.11): [`MultiSystem::REQUIRES_FIFO`].
//! 12. A request arriving while the process holds the CT (an idle root) skips the fast path and
//!     runs Stage 2 directly (0 messages either way).
//!
//! Deadlock freedom follows the spec's argument (§5.8): only the CT holder writes the CT, so
//! every token's chain of registered holders follows CT-possession order, and a process waits
//! only for processes registered before it; preemption reorders CT service only.
//!
//! Token accounting: ACKs carry token *sets* and the CT carries the free tokens, so
//! [`MultiSystem::token_instance`] (one instance per message) does not fit; instead
//! [`GridAware::tokens_held`] counts, per instance, the tokens present at processes, free in a
//! held CT, **and** in messages in flight (tracked by the group from every send and delivery),
//! so the driver's uniqueness check (exactly one per instance) covers this algorithm.

mod node;

pub use node::{GridEvent, GridNode};

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::MutexError;
use crate::node::{Fence, Message, NodeId};

use super::model::{MultiOutbox, MultiOutput, MultiRequest, MultiSystem, ResourceSpace};

/// Which algorithm the processes run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GridMode {
    /// \[VN\]'s grid-aware algorithm (leaders, local priority, preemption, locality).
    #[default]
    GridAware,
    /// Every grid feature off: Bouabdallah–Laforest as \[VN\] implemented it (§5.11).
    Plain,
}

/// Configuration of a grid-aware group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GridConfig {
    /// `cluster[p]`: the cluster of process `p` (`Processos_Locais` is the set sharing it).
    pub cluster: Vec<usize>,
    /// `MAX_PREEMPT`: how often one process's CT service may be postponed for local requesters.
    pub max_preempt: u32,
    /// `LIMITE_MINIMO_PRIORIDADE` (0 disables list C).
    pub priority_threshold: u32,
    /// Grid-aware or plain.
    pub mode: GridMode,
    /// Keep the CT until CS exit (the literal reading; decision 5 passes it on once every
    /// ACK1 is in). For sensitivity runs (`mutex-exp --grid-ct-at-exit`).
    pub ct_at_exit: bool,
}

impl GridConfig {
    /// `n` processes in `c` clusters of contiguous ids (`p * c / n`, as
    /// [`super::sim::Clusters::even`]), `MAX_PREEMPT` = half the processes per cluster (at least
    /// 1) as in \[VN\]'s experiments, threshold 2.
    pub fn even(n: usize, c: usize) -> Result<Self, MutexError> {
        if c == 0 || c > n {
            return Err(MutexError::Config(format!(
                "{c} clusters for {n} processes: need 1 <= clusters <= processes"
            )));
        }
        Ok(Self {
            cluster: (0..n).map(|p| p * c / n).collect(),
            max_preempt: ((n / c) / 2).max(1) as u32,
            priority_threshold: 2,
            mode: GridMode::GridAware,
            ct_at_exit: false,
        })
    }

    /// The same layout with [`GridMode::Plain`].
    pub fn plain(mut self) -> Self {
        self.mode = GridMode::Plain;
        self
    }
}

/// The group layout every process knows.
#[derive(Debug)]
pub(crate) struct Shared {
    n: usize,
    space: ResourceSpace,
    cluster: Vec<usize>,
    /// `leader[p]`: the leader of `p`'s cluster (its lowest id).
    leader: Vec<NodeId>,
    /// `NO_ELEITO`.
    elected: NodeId,
    max_preempt: u32,
    priority_threshold: u32,
    mode: GridMode,
    ct_at_exit: bool,
}

impl Shared {
    fn new(space: &ResourceSpace, config: &GridConfig) -> Result<Arc<Self>, MutexError> {
        let n = config.cluster.len();
        if n == 0 {
            return Err(MutexError::Config(
                "a group needs at least one process".into(),
            ));
        }
        let leader: Vec<NodeId> = config
            .cluster
            .iter()
            .map(|&c| config.cluster.iter().position(|&d| d == c).unwrap_or(0))
            .collect();
        Ok(Arc::new(Shared {
            n,
            elected: leader[0],
            leader,
            space: space.clone(),
            cluster: config.cluster.clone(),
            max_preempt: config.max_preempt,
            priority_threshold: config.priority_threshold,
            mode: config.mode,
            ct_at_exit: config.ct_at_exit,
        }))
    }
}

/// A slot of the control token (set A of §5.4 is the free slots): the same as
/// Bouabdallah–Laforest's.
pub use super::bouabdallah::Slot;

/// The control token (§5.4): one slot per resource instance, and list C.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlToken {
    /// Per flat instance.
    pub slots: Vec<Slot>,
    /// List C: per resource type, the priority process and its count.
    pub priority: Vec<Option<(NodeId, u32)>>,
}

impl ControlToken {
    fn initial(space: &ResourceSpace) -> Self {
        Self {
            slots: vec![Slot::Free(0); space.total_instances()],
            priority: vec![None; space.types()],
        }
    }

    fn count_free(&self, held: &mut [usize]) {
        for (h, s) in held.iter_mut().zip(&self.slots) {
            *h += usize::from(matches!(s, Slot::Free(_)));
        }
    }
}

/// ACK1 (immediate reply) or ACK2 (the remainder, at CS exit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AckKind {
    /// ACK1.
    First,
    /// ACK2.
    Second,
}

/// A message of the grid-aware algorithm (§5.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GridMsg {
    /// `Requisicao`: `origin` asks for the CT; `preempted` is how often it was already
    /// preempted in this request (non-zero only when a preempted successor is re-queued).
    Request {
        /// The original requester.
        origin: NodeId,
        /// Its preemption count.
        preempted: u32,
    },
    /// `ControlToken`.
    ControlToken(ControlToken),
    /// `Preempcao`: the remote successor `remote` (preempted `count` times) goes to the end of
    /// the local chain.
    Preempt {
        /// Preemptions `remote` has suffered in its current request.
        count: u32,
        /// The remote process.
        remote: NodeId,
    },
    /// `Requisicao-Token`: the sender asks for these tokens (flat instances).
    TokenRequest {
        /// The tokens.
        tokens: Vec<usize>,
    },
    /// `Mensagem_ACK`: tokens with their fence counters.
    Ack {
        /// ACK1 or ACK2.
        kind: AckKind,
        /// The tokens handed over.
        tokens: Vec<(usize, Fence)>,
    },
}

impl GridMsg {
    /// Resource tokens carried (ACK contents, or the free tokens of a CT), per flat instance.
    fn count_tokens(&self, counts: &mut [isize], sign: isize) {
        match self {
            GridMsg::Ack { tokens, .. } => {
                for &(t, _) in tokens {
                    if let Some(c) = counts.get_mut(t) {
                        *c += sign;
                    }
                }
            }
            GridMsg::ControlToken(ct) => {
                for (c, s) in counts.iter_mut().zip(&ct.slots) {
                    if matches!(s, Slot::Free(_)) {
                        *c += sign;
                    }
                }
            }
            _ => {}
        }
    }
}

impl Message for GridMsg {
    fn kind(&self) -> &'static str {
        match self {
            GridMsg::Request { .. } => "request",
            GridMsg::ControlToken(_) => "control_token",
            GridMsg::Preempt { .. } => "preempt",
            GridMsg::TokenRequest { .. } => "token_request",
            GridMsg::Ack {
                kind: AckKind::First,
                ..
            } => "ack1",
            GridMsg::Ack {
                kind: AckKind::Second,
                ..
            } => "ack2",
        }
    }

    fn is_token(&self) -> bool {
        matches!(self, GridMsg::ControlToken(_) | GridMsg::Ack { .. })
    }
}

/// Measurements of a grid-aware group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GridStats {
    /// Preemptions performed (`Preempt` initiations).
    pub preemptions: u64,
    /// The largest number of preemptions one process suffered in one request.
    pub max_preempted_per_request: u32,
    /// Requests served by the local-token fast path.
    pub fast_path: u64,
}

/// The grid-aware algorithm for a group of `n` processes: `n` independent [`GridNode`]s, each
/// handler touching one of them.
#[derive(Debug, Clone)]
pub struct GridAware {
    nodes: Vec<GridNode>,
    /// Per flat instance: resource tokens in messages in flight.
    inflight: Vec<isize>,
    /// Per process: preemptions suffered in its current request (measured here independently of
    /// the count the algorithm carries).
    suffered: Vec<u32>,
    stats: GridStats,
}

impl GridAware {
    /// Builds the `n = config.cluster.len()` processes over `space`.
    pub fn new(space: ResourceSpace, config: GridConfig) -> Result<Self, MutexError> {
        let shared = Shared::new(&space, &config)?;
        let n = shared.n;
        let nodes = (0..n)
            .map(|id| GridNode::new(id, Arc::clone(&shared)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            nodes,
            inflight: vec![0; space.total_instances()],
            suffered: vec![0; n],
            stats: GridStats::default(),
        })
    }

    /// The processes.
    pub fn nodes(&self) -> &[GridNode] {
        &self.nodes
    }

    /// Measurements so far.
    pub fn stats(&self) -> &GridStats {
        &self.stats
    }

    fn node(&mut self, id: NodeId) -> Result<&mut GridNode, MutexError> {
        let n = self.nodes.len();
        self.nodes
            .get_mut(id)
            .ok_or(MutexError::UnknownNode { node: id, n })
    }

    /// Books the sends of the last handler (from `mark` on) and the node's events.
    fn after(&mut self, id: NodeId, out: &MultiOutbox<GridMsg>, mark: usize) {
        for o in &out.as_slice()[mark..] {
            if let MultiOutput::Send { msg, .. } = o {
                msg.count_tokens(&mut self.inflight, 1);
            }
        }
        let events = self.nodes.get_mut(id).map(GridNode::take_events);
        for e in events.into_iter().flatten() {
            match e {
                GridEvent::Preempted { victim, .. } => {
                    self.stats.preemptions += 1;
                    if let Some(s) = self.suffered.get_mut(victim) {
                        *s += 1;
                        self.stats.max_preempted_per_request =
                            self.stats.max_preempted_per_request.max(*s);
                    }
                }
                GridEvent::FastPath => self.stats.fast_path += 1,
            }
        }
    }
}

impl MultiSystem for GridAware {
    type Msg = GridMsg;
    const NAME: &'static str = "grid-aware";
    const REQUIRES_FIFO: bool = true;

    fn tokens_held(&self) -> Option<Vec<usize>> {
        let mut held = vec![0usize; self.inflight.len()];
        for p in &self.nodes {
            p.count_tokens(&mut held);
        }
        for (h, &f) in held.iter_mut().zip(&self.inflight) {
            *h = (*h as isize + f).max(0) as usize;
        }
        Some(held)
    }

    fn preemptions(&self) -> u64 {
        self.stats.preemptions
    }

    fn request(
        &mut self,
        node: NodeId,
        req: &MultiRequest,
        out: &mut MultiOutbox<GridMsg>,
    ) -> Result<(), MutexError> {
        let mark = out.as_slice().len();
        self.node(node)?.on_request(req, out)?;
        if let Some(s) = self.suffered.get_mut(node) {
            *s = 0;
        }
        self.after(node, out, mark);
        Ok(())
    }

    fn release(&mut self, node: NodeId, out: &mut MultiOutbox<GridMsg>) -> Result<(), MutexError> {
        let mark = out.as_slice().len();
        self.node(node)?.on_release(out)?;
        self.after(node, out, mark);
        Ok(())
    }

    fn deliver(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: GridMsg,
        out: &mut MultiOutbox<GridMsg>,
    ) -> Result<(), MutexError> {
        msg.count_tokens(&mut self.inflight, -1);
        let mark = out.as_slice().len();
        self.node(to)?.on_message(from, msg, out)?;
        self.after(to, out, mark);
        Ok(())
    }
}
