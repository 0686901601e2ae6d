//! Bouabdallah–Laforest with its control token (spec §2.3, the \[R\] reconstruction; \[LJ\]'s
//! single-instance description is the special case `k = 1`).
//!
//! One token per resource instance, plus a unique **control token** (CT) that circulates on a
//! Naimi–Tréhel tree (§2.1: `father`, `next`; the root is the last CT requester). A process takes
//! the CT before asking for resources. The CT holds one slot per instance: `Free(fence)` (the
//! token is stored inside the CT) or `Holder(p)` (the process that holds it or will hold it,
//! i.e. the last one registered for it). With the CT, a process takes the free tokens it needs,
//! puts back the ones it caches but does not need, and sends one `TokenReq` per registered
//! holder of the tokens it still lacks, registering itself as the new holder. The holder gives
//! unlocked tokens at once (`Ack1`) and owes the others, sent at its CS exit (`Ack2`). Because
//! the CT serialises registrations, every per-token chain of holders follows one global order,
//! so the wait-for graph has no cycle (deadlock freedom).
//!
//! [`BlNode`] is one process, a pure state machine (`on_request`, `on_release`, `on_message`);
//! [`BouabdallahLaforest`] is the group of `n` for the driver.
//!
//! Decisions \[D\]:
//! - **CT release:** the CT leaves as soon as all `Ack1` replies of the holder's registration
//!   are in (the early release of \[VN\] Alg. 11), not at CS exit. Technically the process stops
//!   "requesting" the CT (Naimi–Tréhel's flag) once registered: a queued `next` gets the CT then,
//!   and a CT request arriving later at a registered root is answered at once.
//! - **Initial state:** every token starts free inside the CT; the CT starts at process 0 (or
//!   [`BlConfig::initial_ct`]) and every other process points to it (as \[VN\] implemented BL).
//! - **Fast path:** off by default (\[LJ\]'s BL always takes the CT first). With
//!   [`BlConfig::fast_path`], a request whose tokens are all cached here and unlocked is served
//!   without the CT and without any message (the \[VN\] fast path).
//! - **Multi-instance choice:** for `c` instances of a type, tokens cached here first, then free
//!   slots, then instances registered to other processes, lowest index first in each tier.
//! - **Ack messages carry sets**, as the spec's `send(j, ACK1, give)` and `send(j, ACK2, S)`:
//!   a `TokenReq` is answered by one `Ack1` with every token that can be given now (possibly
//!   none), and each owed entry goes back as one `Ack2` with all its tokens at CS exit. (Up to
//!   2026-11-25 each token travelled in its own message, which inflated BL's message counts
//!   against \[VN\]'s algorithm, whose ACKs carry sets.) The group counts the tokens in flight
//!   itself ([`BouabdallahLaforest`]'s `tokens_held`), as one message may carry several.
//! - **Registration numbers:** `TokenReq` carries the requester's registration number and
//!   `Ack1` echoes it. On non-FIFO links the empty `Ack1` of a registration can be overtaken by
//!   the `Ack2` of the same token; the process may then finish its CS and register again (it
//!   kept the CT) before that `Ack1` lands. A late `Ack1` of an older registration confirms
//!   nothing any more and is ignored (a 3000-seed soak found this case).
//! - **Fences:** each token carries a counter, incremented at every CS entry using it.
//! - Nothing relies on FIFO links (tested FIFO and non-FIFO).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::MutexError;
use crate::node::{Fence, Message, NodeId, check_node, protocol};

use super::model::{Hold, MultiOutbox, MultiOutput, MultiRequest, MultiSystem, ResourceSpace};

/// Configuration of Bouabdallah–Laforest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlConfig {
    /// Serve a request whose tokens are all cached and unlocked here without the CT.
    pub fast_path: bool,
    /// The initial CT holder.
    pub initial_ct: NodeId,
    /// Keep the CT until CS exit (the literal reading of §2.3's pseudo-code, where
    /// `requesting` stays true until Release), instead of passing it on once every
    /// `Ack1` is in. For sensitivity runs (`mutex-exp --grid-ct-at-exit`).
    pub ct_at_exit: bool,
}

/// One slot of the control token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Slot {
    /// The token is stored in the CT, with its last fence.
    Free(Fence),
    /// The process holding the token, or the last one registered to hold it.
    Holder(NodeId),
}

/// The control token: one slot per flat resource instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlToken {
    /// Per flat instance.
    pub slots: Vec<Slot>,
}

/// A message of Bouabdallah–Laforest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlMsg {
    /// Naimi–Tréhel request for the CT on behalf of `requester`.
    CtRequest {
        /// The original requester.
        requester: NodeId,
    },
    /// The control token.
    Ct {
        /// Its contents.
        ct: ControlToken,
    },
    /// Registration: the sender needs these tokens (flat indices) from the receiver.
    TokenReq {
        /// The requester's registration number (echoed by `Ack1`).
        reg: u64,
        /// Requested tokens.
        tokens: Vec<usize>,
    },
    /// Immediate reply to a `TokenReq`: the tokens given now (possibly none); the others
    /// are owed.
    Ack1 {
        /// The registration this answers.
        reg: u64,
        /// The tokens given, with their fences.
        tokens: Vec<(usize, Fence)>,
    },
    /// The tokens owed for one `TokenReq`, sent at the holder's CS exit.
    Ack2 {
        /// The tokens, with their fences.
        tokens: Vec<(usize, Fence)>,
    },
}

impl Message for BlMsg {
    fn kind(&self) -> &'static str {
        match self {
            BlMsg::CtRequest { .. } => "ct_request",
            BlMsg::Ct { .. } => "ct",
            BlMsg::TokenReq { .. } => "token_req",
            BlMsg::Ack1 { .. } => "ack1",
            BlMsg::Ack2 { .. } => "ack2",
        }
    }

    fn is_token(&self) -> bool {
        match self {
            BlMsg::Ack1 { tokens, .. } => !tokens.is_empty(),
            BlMsg::Ack2 { .. } => true,
            _ => false,
        }
    }
}

/// One process of Bouabdallah–Laforest: a pure state machine (no I/O, no clock).
#[derive(Debug, Clone)]
pub struct BlNode {
    id: NodeId,
    n: usize,
    space: ResourceSpace,
    fast_path: bool,
    ct_at_exit: bool,
    /// Naimi–Tréhel father for the CT (`None`: I am the root).
    father: Option<NodeId>,
    /// Naimi–Tréhel successor for the CT.
    next: Option<NodeId>,
    /// Naimi–Tréhel's "requesting" for the CT: from the request until registration completes.
    ct_wanted: bool,
    ct: Option<ControlToken>,
    /// Tokens present here, with their fences.
    local: BTreeMap<usize, Fence>,
    /// Per flat instance: locked (needed by the current request) here.
    locked: Vec<bool>,
    /// The concrete tokens of the current request.
    need: Vec<usize>,
    /// The pending request (until the CT arrives).
    pending: Option<MultiRequest>,
    /// Tokens to hand over at CS exit.
    owed: Vec<(NodeId, Vec<usize>)>,
    ack1_pending: usize,
    /// Registrations made so far (numbers `TokenReq`s, so a late `Ack1` of an older one is
    /// recognised on non-FIFO links).
    reg: u64,
    requesting: bool,
    in_cs: bool,
}

impl BlNode {
    /// Process `id` of a group of `n` over `space`.
    pub fn new(
        id: NodeId,
        n: usize,
        space: ResourceSpace,
        config: &BlConfig,
    ) -> Result<Self, MutexError> {
        check_node(id, n)?;
        check_node(config.initial_ct, n)?;
        let total = space.total_instances();
        let root = id == config.initial_ct;
        Ok(Self {
            id,
            n,
            fast_path: config.fast_path,
            ct_at_exit: config.ct_at_exit,
            father: (!root).then_some(config.initial_ct),
            next: None,
            ct_wanted: false,
            ct: root.then(|| ControlToken {
                slots: vec![Slot::Free(0); total],
            }),
            local: BTreeMap::new(),
            locked: vec![false; total],
            need: Vec::new(),
            pending: None,
            owed: Vec::new(),
            ack1_pending: 0,
            reg: 0,
            requesting: false,
            in_cs: false,
            space,
        })
    }

    /// This process's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Whether this process is in its critical section.
    pub fn in_cs(&self) -> bool {
        self.in_cs
    }

    /// Whether this process holds the control token.
    pub fn holds_ct(&self) -> bool {
        self.ct.is_some()
    }

    /// Whether the token of flat instance `t` is here.
    pub fn holds_token(&self, t: usize) -> bool {
        self.local.contains_key(&t)
    }

    /// The processes this one owes tokens to (to hand over at its CS exit): each is waiting
    /// for this one, an edge of the wait-for graph.
    pub fn owes_to(&self) -> Vec<NodeId> {
        self.owed.iter().map(|(j, _)| *j).collect()
    }

    /// The local application asks for `req`.
    pub fn on_request(
        &mut self,
        req: &MultiRequest,
        out: &mut MultiOutbox<BlMsg>,
    ) -> Result<(), MutexError> {
        if self.requesting {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        self.requesting = true;
        if self.fast_path
            && let Some(chosen) = self.cached_fit(req)
        {
            self.need = chosen;
            for &t in &self.need {
                self.locked[t] = true;
            }
            return self.try_enter(out);
        }
        self.pending = Some(req.clone());
        self.ct_wanted = true;
        if self.ct.is_some() {
            self.on_ct(out)
        } else {
            let father = self
                .father
                .ok_or_else(|| protocol(self.id, "root without the control token"))?;
            out.send(self.id, father, BlMsg::CtRequest { requester: self.id });
            self.father = None;
            Ok(())
        }
    }

    /// The local application leaves its critical section.
    pub fn on_release(&mut self, out: &mut MultiOutbox<BlMsg>) -> Result<(), MutexError> {
        if !self.in_cs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.in_cs = false;
        self.requesting = false;
        if self.ct_at_exit && self.ack1_pending == 0 && self.ct.is_some() {
            self.registered(out);
        }
        for (j, owed) in std::mem::take(&mut self.owed) {
            let mut tokens = Vec::with_capacity(owed.len());
            for t in owed {
                let fence = self
                    .local
                    .remove(&t)
                    .ok_or_else(|| protocol(self.id, format!("owed token {t} is not here")))?;
                tokens.push((t, fence));
            }
            out.send(self.id, j, BlMsg::Ack2 { tokens });
        }
        for t in std::mem::take(&mut self.need) {
            self.locked[t] = false;
        }
        Ok(())
    }

    /// A message from `from` arrived.
    pub fn on_message(
        &mut self,
        from: NodeId,
        msg: BlMsg,
        out: &mut MultiOutbox<BlMsg>,
    ) -> Result<(), MutexError> {
        check_node(from, self.n)?;
        match msg {
            BlMsg::CtRequest { requester } => {
                check_node(requester, self.n)?;
                match self.father {
                    None if self.ct_wanted => self.next = Some(requester),
                    None => {
                        let ct = self
                            .ct
                            .take()
                            .ok_or_else(|| protocol(self.id, "idle root without the CT"))?;
                        out.send(self.id, requester, BlMsg::Ct { ct });
                    }
                    Some(f) => out.send(self.id, f, BlMsg::CtRequest { requester }),
                }
                self.father = Some(requester);
                Ok(())
            }
            BlMsg::Ct { ct } => {
                if self.ct.is_some() || !self.ct_wanted {
                    return Err(protocol(self.id, "unexpected control token"));
                }
                if ct.slots.len() != self.locked.len() {
                    return Err(protocol(self.id, "control token of the wrong size"));
                }
                self.ct = Some(ct);
                self.on_ct(out)
            }
            BlMsg::TokenReq { reg, tokens } => {
                let mut give = Vec::new();
                let mut rest = Vec::new();
                for t in tokens {
                    match self.local.get(&t) {
                        Some(&f) if !self.locked.get(t).copied().unwrap_or(true) => {
                            self.local.remove(&t);
                            give.push((t, f));
                        }
                        _ if t < self.locked.len() => rest.push(t),
                        _ => return Err(protocol(self.id, format!("request for token {t}"))),
                    }
                }
                if !rest.is_empty() {
                    self.owed.push((from, rest));
                }
                out.send(self.id, from, BlMsg::Ack1 { reg, tokens: give });
                Ok(())
            }
            BlMsg::Ack1 { reg, tokens } => {
                for (t, f) in tokens {
                    self.receive_token(t, f)?;
                }
                // A late empty `Ack1` of an older registration (overtaken by the `Ack2` on a
                // non-FIFO link, the CS done since): nothing left to confirm.
                if reg == self.reg {
                    self.ack1_pending = self
                        .ack1_pending
                        .checked_sub(1)
                        .ok_or_else(|| protocol(self.id, "Ack1 without a registration"))?;
                    if self.ack1_pending == 0 {
                        self.registered(out);
                    }
                }
                self.try_enter(out)
            }
            BlMsg::Ack2 { tokens } => {
                for (t, f) in tokens {
                    self.receive_token(t, f)?;
                }
                self.try_enter(out)
            }
        }
    }

    fn receive_token(&mut self, t: usize, fence: Fence) -> Result<(), MutexError> {
        if !self.need.contains(&t) || self.local.insert(t, fence).is_some() {
            return Err(protocol(self.id, format!("unexpected token {t}")));
        }
        self.locked[t] = true;
        Ok(())
    }

    /// With the fast path: the tokens of `req` if all are cached here and unlocked.
    fn cached_fit(&self, req: &MultiRequest) -> Option<Vec<usize>> {
        let mut chosen = Vec::new();
        for &(r, c) in req.items() {
            let have: Vec<usize> = (0..self.space.capacity(r))
                .filter_map(|i| self.space.flat(r, i))
                .filter(|t| self.local.contains_key(t) && !self.locked[*t])
                .take(c as usize)
                .collect();
            if have.len() < c as usize {
                return None;
            }
            chosen.extend(have);
        }
        Some(chosen)
    }

    /// Stage 2 with the CT: choose, take free tokens, put back unneeded ones, register.
    fn on_ct(&mut self, out: &mut MultiOutbox<BlMsg>) -> Result<(), MutexError> {
        let req = self
            .pending
            .take()
            .ok_or_else(|| protocol(self.id, "control token without a request"))?;
        let me = self.id;
        let ct = self
            .ct
            .as_mut()
            .ok_or_else(|| protocol(me, "no control token"))?;
        // Choose the concrete tokens: cached here, then free, then registered elsewhere.
        let mut need = Vec::with_capacity(req.instances() as usize);
        for &(r, c) in req.items() {
            let all: Vec<usize> = (0..self.space.capacity(r))
                .filter_map(|i| self.space.flat(r, i))
                .collect();
            let tier = |t: &usize| match ct.slots[*t] {
                _ if self.local.contains_key(t) => 0,
                Slot::Free(_) => 1,
                Slot::Holder(_) => 2,
            };
            let mut sorted = all;
            sorted.sort_by_key(|t| (tier(t), *t));
            need.extend(sorted.into_iter().take(c as usize));
        }
        need.sort_unstable();
        for (t, slot) in ct.slots.iter_mut().enumerate() {
            let needed = need.binary_search(&t).is_ok();
            match *slot {
                Slot::Free(f) if needed => {
                    *slot = Slot::Holder(me);
                    self.local.insert(t, f);
                }
                _ if !needed && !self.locked[t] => {
                    if let Some(f) = self.local.remove(&t) {
                        *slot = Slot::Free(f);
                    }
                }
                _ => {}
            }
        }
        let mut groups: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
        for &t in &need {
            if self.local.contains_key(&t) {
                self.locked[t] = true;
                continue;
            }
            match ct.slots[t] {
                Slot::Holder(j) if j != me => groups.entry(j).or_default().push(t),
                other => {
                    return Err(protocol(
                        me,
                        format!("token {t} is missing but its slot says {other:?}"),
                    ));
                }
            }
            ct.slots[t] = Slot::Holder(me);
        }
        self.need = need;
        self.ack1_pending = groups.len();
        self.reg += 1;
        for (j, tokens) in groups {
            out.send(
                me,
                j,
                BlMsg::TokenReq {
                    reg: self.reg,
                    tokens,
                },
            );
        }
        if self.ack1_pending == 0 {
            self.registered(out);
        }
        self.try_enter(out)
    }

    /// Registration complete: the CT may leave (with [`BlConfig::ct_at_exit`], once the
    /// CS is over too).
    fn registered(&mut self, out: &mut MultiOutbox<BlMsg>) {
        if self.ct_at_exit && self.requesting {
            return;
        }
        self.ct_wanted = false;
        if let Some(next) = self.next.take()
            && let Some(ct) = self.ct.take()
        {
            out.send(self.id, next, BlMsg::Ct { ct });
        }
    }

    fn try_enter(&mut self, out: &mut MultiOutbox<BlMsg>) -> Result<(), MutexError> {
        if !self.requesting
            || self.in_cs
            || self.need.is_empty()
            || !self.need.iter().all(|t| self.local.contains_key(t))
        {
            return Ok(());
        }
        let mut holds = Vec::with_capacity(self.need.len());
        for &t in &self.need {
            let (resource, instance) = self
                .space
                .unflat(t)
                .ok_or_else(|| protocol(self.id, "token outside the resource space"))?;
            let fence = self
                .local
                .get_mut(&t)
                .ok_or_else(|| protocol(self.id, "token vanished"))?;
            *fence += 1;
            holds.push(Hold {
                resource,
                instance,
                fence: *fence,
            });
        }
        self.in_cs = true;
        out.grant(self.id, holds);
        Ok(())
    }
}

/// Bouabdallah–Laforest for a group of `n` processes.
#[derive(Debug, Clone)]
pub struct BouabdallahLaforest {
    nodes: Vec<BlNode>,
    /// Instrumentation for the token check: the CT while it is in flight.
    ct_in_flight: Option<ControlToken>,
    /// Instrumentation for the token check: per flat instance, tokens in `Ack` messages in
    /// flight.
    acks_in_flight: Vec<usize>,
}

/// The tokens an `Ack` message carries.
fn acked(msg: &BlMsg) -> &[(usize, Fence)] {
    match msg {
        BlMsg::Ack1 { tokens, .. } | BlMsg::Ack2 { tokens } => tokens,
        _ => &[],
    }
}

fn count_free(ct: &ControlToken, held: &mut [usize]) {
    for (h, s) in held.iter_mut().zip(&ct.slots) {
        *h += usize::from(matches!(s, Slot::Free(_)));
    }
}

impl BouabdallahLaforest {
    /// Builds the `n` processes over `space`.
    pub fn new(n: usize, space: ResourceSpace, config: BlConfig) -> Result<Self, MutexError> {
        if n == 0 {
            return Err(MutexError::Config(
                "a group needs at least one process".into(),
            ));
        }
        let nodes = (0..n)
            .map(|id| BlNode::new(id, n, space.clone(), &config))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            nodes,
            ct_in_flight: None,
            acks_in_flight: vec![0; space.total_instances()],
        })
    }

    /// The processes.
    pub fn nodes(&self) -> &[BlNode] {
        &self.nodes
    }

    /// How many processes hold the CT now (0 while it is in flight, never more than 1).
    pub fn ct_holders(&self) -> usize {
        self.nodes.iter().filter(|p| p.holds_ct()).count()
    }

    fn node(&mut self, id: NodeId) -> Result<&mut BlNode, MutexError> {
        let n = self.nodes.len();
        self.nodes
            .get_mut(id)
            .ok_or(MutexError::UnknownNode { node: id, n })
    }

    /// Records the CT and the tokens sent by the last handler (outputs from index `from` on).
    fn note_sent(&mut self, out: &MultiOutbox<BlMsg>, from: usize) {
        for o in &out.as_slice()[from..] {
            let MultiOutput::Send { msg, .. } = o else {
                continue;
            };
            if let BlMsg::Ct { ct } = msg {
                self.ct_in_flight = Some(ct.clone());
            }
            for &(t, _) in acked(msg) {
                if let Some(c) = self.acks_in_flight.get_mut(t) {
                    *c += 1;
                }
            }
        }
    }
}

impl MultiSystem for BouabdallahLaforest {
    type Msg = BlMsg;
    const NAME: &'static str = "bouabdallah-laforest";
    const REQUIRES_FIFO: bool = false;

    /// A token is held by the process where it is cached, or by the CT while it is free in it,
    /// or by an `Ack` in flight; the CT's and the acks' in flight are counted from the group's
    /// record of the messages (instrumentation only: the processes never read it). The
    /// driver's own count of tokens in flight (`token_instance`) stays at zero: one message
    /// may carry several tokens.
    fn tokens_held(&self) -> Option<Vec<usize>> {
        let mut held = self.acks_in_flight.clone();
        for p in &self.nodes {
            for &t in p.local.keys() {
                held[t] += 1;
            }
            if let Some(ct) = &p.ct {
                count_free(ct, &mut held);
            }
        }
        if let Some(ct) = &self.ct_in_flight {
            count_free(ct, &mut held);
        }
        Some(held)
    }

    fn request(
        &mut self,
        node: NodeId,
        req: &MultiRequest,
        out: &mut MultiOutbox<BlMsg>,
    ) -> Result<(), MutexError> {
        let from = out.as_slice().len();
        self.node(node)?.on_request(req, out)?;
        self.note_sent(out, from);
        Ok(())
    }

    fn release(&mut self, node: NodeId, out: &mut MultiOutbox<BlMsg>) -> Result<(), MutexError> {
        let from = out.as_slice().len();
        self.node(node)?.on_release(out)?;
        self.note_sent(out, from);
        Ok(())
    }

    fn deliver(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: BlMsg,
        out: &mut MultiOutbox<BlMsg>,
    ) -> Result<(), MutexError> {
        if matches!(msg, BlMsg::Ct { .. }) {
            self.ct_in_flight = None;
        }
        for &(t, _) in acked(&msg) {
            if let Some(c) = self.acks_in_flight.get_mut(t) {
                *c = c.saturating_sub(1);
            }
        }
        let start = out.as_slice().len();
        self.node(to)?.on_message(from, msg, out)?;
        self.note_sent(out, start);
        Ok(())
    }
}
