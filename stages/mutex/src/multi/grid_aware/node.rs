//! One process of the grid-aware algorithm: a pure state machine (no I/O, no clock), \[VN\]
//! Algs. 1–12 with the decisions listed in the [module docs](super).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::MutexError;
use crate::node::{Fence, NodeId, check_node, protocol};

use super::super::model::{Hold, MultiOutbox, MultiRequest, ResourceSpace};
use super::{AckKind, ControlToken, GridConfig, GridMode, GridMsg, Shared, Slot};

/// Something a process did that the group records for measurement (never read back by the
/// algorithm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridEvent {
    /// This process served the local requester `local` before the remote process `victim`
    /// (Alg. 4 lines 12–16); `count` is how often `victim` has now been preempted in its current
    /// request.
    Preempted {
        /// The remote process postponed.
        victim: NodeId,
        /// The local process served first.
        local: NodeId,
        /// Preemptions `victim` has suffered in its current request, this one included.
        count: u32,
    },
    /// A request served by the local-token fast path, without the control token.
    FastPath,
}

/// One process of the grid-aware algorithm.
#[derive(Debug, Clone)]
pub struct GridNode {
    id: NodeId,
    shared: Arc<Shared>,
    // --- control-token tree (Naimi–Tréhel with leaders, Algs. 1–6) ---
    /// Probable CT owner; `None`: I am the root (the last requester of my local chain).
    owner: Option<NodeId>,
    /// Next CT recipient.
    next: Option<NodeId>,
    /// When `next` is remote: how often it was preempted in its current request.
    next_preempted: u32,
    /// The remote process last in line for the CT (Alg. 4 line 9).
    remote_owner: Option<NodeId>,
    /// `requesting` of Algs. 2–4 and 12: waiting for, or using, the CT for the current request.
    ct_requesting: bool,
    /// The control token, while held.
    ct: Option<ControlToken>,
    /// Stage 2 registration done for the current request (the CT may leave once every ACK1 is
    /// in).
    registered: bool,
    // --- resource tokens (Algs. 7–12) ---
    /// `tokens_Locais`: the tokens present here, each with its fence counter.
    local: Vec<Option<Fence>>,
    /// `travado`: lock flags.
    locked: Vec<bool>,
    /// The concrete tokens of the current request.
    need: Vec<usize>,
    /// The current request.
    spec: Option<MultiRequest>,
    in_cs: bool,
    /// `tokens_devidos` as `(process, tokens)` tuples (§5.10 item 5).
    owed: Vec<(NodeId, Vec<usize>)>,
    ack1_pending: usize,
    /// `prioridade_local`, per resource type (successive requests naming that type).
    prio_local: Vec<u32>,
    /// Measurement events, drained by the group.
    events: Vec<GridEvent>,
}

impl GridNode {
    /// Process `id` (Alg. 1). `shared` holds the group's layout.
    pub(super) fn new(id: NodeId, shared: Arc<Shared>) -> Result<Self, MutexError> {
        check_node(id, shared.n)?;
        let k = shared.space.total_instances();
        let elected = shared.elected;
        let (owner, ct) = if id == elected {
            (None, Some(ControlToken::initial(&shared.space)))
        } else if shared.mode == GridMode::Plain
            || shared.cluster[id] == shared.cluster[elected]
            || shared.leader[id] == id
        {
            (Some(elected), None)
        } else {
            (Some(shared.leader[id]), None)
        };
        Ok(Self {
            id,
            owner,
            next: None,
            next_preempted: 0,
            remote_owner: None,
            ct_requesting: false,
            ct,
            registered: false,
            local: vec![None; k],
            locked: vec![false; k],
            need: Vec::new(),
            spec: None,
            in_cs: false,
            owed: Vec::new(),
            ack1_pending: 0,
            prio_local: vec![0; shared.space.types()],
            events: Vec::new(),
            shared,
        })
    }

    /// Process `id` of the group `config` describes (`n = config.cluster.len()`), over `space`:
    /// what a stage wraps. Every process of a group must get the same `space` and `config`.
    pub fn with_config(
        id: NodeId,
        space: &ResourceSpace,
        config: &GridConfig,
    ) -> Result<Self, MutexError> {
        Self::new(id, Shared::new(space, config)?)
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

    /// The control token, while held.
    pub fn control_token(&self) -> Option<&ControlToken> {
        self.ct.as_ref()
    }

    /// The probable CT owner (`None`: root).
    pub fn owner(&self) -> Option<NodeId> {
        self.owner
    }

    /// The next CT recipient.
    pub fn next(&self) -> Option<NodeId> {
        self.next
    }

    /// The remote process last in line for the CT, as recorded here.
    pub fn remote_owner(&self) -> Option<NodeId> {
        self.remote_owner
    }

    /// Whether resource token `t` (flat index) is present here.
    pub fn has_token(&self, t: usize) -> bool {
        self.local.get(t).is_some_and(Option::is_some)
    }

    /// Drains the measurement events (they accumulate until drained: a long-lived driver
    /// must drain them, as the stage wrapper does after every input).
    pub fn take_events(&mut self) -> Vec<GridEvent> {
        std::mem::take(&mut self.events)
    }

    fn is_local(&self, p: NodeId) -> bool {
        self.shared.mode == GridMode::GridAware
            && self.shared.cluster[p] == self.shared.cluster[self.id]
    }

    /// The application asks for `req` (Alg. 2, preceded by the local-token fast path).
    pub fn on_request(
        &mut self,
        req: &MultiRequest,
        out: &mut MultiOutbox<GridMsg>,
    ) -> Result<(), MutexError> {
        if self.spec.is_some() {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        let space = &self.shared.space;
        for &(r, c) in req.items() {
            if r >= space.types() || c == 0 || c > space.capacity(r) {
                return Err(MutexError::Config(format!(
                    "request for {c} instances of resource {r} outside the resource space"
                )));
            }
        }
        // Alg. 9's local counters: successive requests naming the same type.
        let mut named = vec![false; space.types()];
        for &(r, _) in req.items() {
            named[r] = true;
        }
        for (p, &n) in self.prio_local.iter_mut().zip(&named) {
            *p = if n { p.saturating_add(1) } else { 0 };
        }
        self.spec = Some(req.clone());
        if self.ct.is_some() {
            // An idle root holding the CT goes straight to Stage 2.
            self.ct_requesting = true;
            return self.stage2(out);
        }
        if let Some(need) = self.fast_path(req) {
            self.need = need;
            for &t in &self.need {
                self.locked[t] = true;
            }
            self.events.push(GridEvent::FastPath);
            return self.enter_cs(out);
        }
        let owner = self
            .owner
            .ok_or_else(|| protocol(self.id, "root without the control token at request"))?;
        self.ct_requesting = true;
        out.send(
            self.id,
            owner,
            GridMsg::Request {
                origin: self.id,
                preempted: 0,
            },
        );
        self.owner = None;
        Ok(())
    }

    /// The tokens satisfying `req` from the unlocked local tokens, if there are enough.
    fn fast_path(&self, req: &MultiRequest) -> Option<Vec<usize>> {
        let mut need = Vec::new();
        for &(r, c) in req.items() {
            let mut got = 0;
            for i in 0..self.shared.space.capacity(r) {
                if got == c {
                    break;
                }
                let t = self.shared.space.flat(r, i)?;
                if self.local[t].is_some() && !self.locked[t] {
                    need.push(t);
                    got += 1;
                }
            }
            if got < c {
                return None;
            }
        }
        Some(need)
    }

    /// Stage 2 on CT receipt: Algs. 7 (take free tokens, return unneeded ones), 8 (select the
    /// holders of the missing ones by locality and list C) and 9 (update list C).
    fn stage2(&mut self, out: &mut MultiOutbox<GridMsg>) -> Result<(), MutexError> {
        let id = self.id;
        let spec = self
            .spec
            .clone()
            .ok_or_else(|| protocol(id, "control token without a request"))?;
        let mut ct = self
            .ct
            .take()
            .ok_or_else(|| protocol(id, "stage 2 without the control token"))?;
        // Invariant (ACK1 gating): every token request registered before this CT visit has
        // been answered, so nothing is owed yet and every token here is registered to me.
        if !self.owed.is_empty() {
            return Err(protocol(id, "tokens owed at control-token receipt"));
        }
        if let Some(t) = (0..self.local.len())
            .find(|&t| self.local[t].is_some() && ct.slots[t] != Slot::Holder(id))
        {
            return Err(protocol(
                id,
                format!("token {t} is here but registered to another process"),
            ));
        }
        let space = self.shared.space.clone();
        let grid = self.shared.mode == GridMode::GridAware;
        let mut need = Vec::new();
        let mut asked: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
        for &(r, c) in spec.items() {
            let c = c as usize;
            let flats: Vec<usize> = (0..space.capacity(r))
                .filter_map(|i| space.flat(r, i))
                .collect();
            // 1. tokens already here; 2. free tokens in the CT (set A).
            let mut chosen: Vec<usize> = flats
                .iter()
                .copied()
                .filter(|&t| self.local[t].is_some())
                .take(c)
                .collect();
            chosen.extend(
                flats
                    .iter()
                    .copied()
                    .filter(|&t| matches!(ct.slots[t], Slot::Free(_)))
                    .take(c - chosen.len()),
            );
            // 3. registered holders, in Alg. 8's four tiers (ties: process id, then token).
            if chosen.len() < c {
                let prio = ct.priority[r].map(|(p, _)| p);
                let mut held: Vec<((u8, NodeId), usize)> = flats
                    .iter()
                    .filter_map(|&t| match ct.slots[t] {
                        Slot::Holder(j) if j != id => {
                            let tier = if grid {
                                u8::from(!self.is_local(j)) * 2 + u8::from(prio == Some(j))
                            } else {
                                0
                            };
                            Some(((tier, j), t))
                        }
                        _ => None,
                    })
                    .collect();
                held.sort_unstable();
                for ((_, j), t) in held.into_iter().take(c - chosen.len()) {
                    asked.entry(j).or_default().push(t);
                    chosen.push(t);
                }
            }
            if chosen.len() < c {
                return Err(protocol(
                    id,
                    format!("control token cannot supply {c} instances of resource {r}"),
                ));
            }
            need.extend(chosen);
        }
        need.sort_unstable();
        // Alg. 7: take the needed free tokens, return the unneeded local ones to A.
        let mut needed = vec![false; self.local.len()];
        for &t in &need {
            needed[t] = true;
        }
        for (t, &is_needed) in needed.iter().enumerate() {
            if is_needed {
                if let Slot::Free(f) = ct.slots[t] {
                    self.local[t] = Some(f);
                    ct.slots[t] = Slot::Holder(id);
                }
            } else if let Some(f) = self.local[t] {
                self.local[t] = None;
                self.locked[t] = false;
                ct.slots[t] = Slot::Free(f);
            }
        }
        for &t in &need {
            if self.local[t].is_some() {
                self.locked[t] = true;
            }
        }
        // Alg. 9 (interpretation in the module docs): list C per resource type.
        if grid {
            let threshold = self.shared.priority_threshold;
            for (r, &count) in self.prio_local.iter().enumerate() {
                let cur = ct.priority[r];
                if threshold > 0 && count >= threshold {
                    if cur.is_none_or(|(p, v)| p == id || v < count) {
                        ct.priority[r] = Some((id, count));
                    }
                } else if cur.is_some_and(|(p, _)| p == id) {
                    ct.priority[r] = None;
                }
            }
            for (&j, ts) in &asked {
                for &t in ts {
                    if let Some((r, _)) = space.unflat(t)
                        && ct.priority[r].is_some_and(|(p, _)| p == j)
                    {
                        ct.priority[r] = None;
                    }
                }
            }
        }
        // Alg. 8, lines 17–22: one request per holder; I become the registered future holder.
        for (j, ts) in asked {
            for &t in &ts {
                ct.slots[t] = Slot::Holder(id);
            }
            out.send(id, j, GridMsg::TokenRequest { tokens: ts });
            self.ack1_pending += 1;
        }
        self.need = need;
        self.ct = Some(ct);
        self.registered = true;
        self.try_enter(out)?;
        self.try_pass_ct(out);
        Ok(())
    }

    fn try_enter(&mut self, out: &mut MultiOutbox<GridMsg>) -> Result<(), MutexError> {
        if self.registered && !self.in_cs && self.need.iter().all(|&t| self.local[t].is_some()) {
            self.enter_cs(out)?;
        }
        Ok(())
    }

    fn enter_cs(&mut self, out: &mut MultiOutbox<GridMsg>) -> Result<(), MutexError> {
        let mut holds = Vec::with_capacity(self.need.len());
        for &t in &self.need {
            let fence = self.local[t]
                .as_mut()
                .ok_or_else(|| protocol(self.id, "entering without a needed token"))?;
            *fence += 1;
            let (resource, instance) = self
                .shared
                .space
                .unflat(t)
                .ok_or_else(|| protocol(self.id, "token outside the resource space"))?;
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

    /// Sends the CT to `next` once this request's registrations are confirmed (every ACK1 in,
    /// Alg. 11 prose) or the request is over (Alg. 12).
    fn try_pass_ct(&mut self, out: &mut MultiOutbox<GridMsg>) {
        let done = !self.ct_requesting
            || (!self.shared.ct_at_exit && self.registered && self.ack1_pending == 0);
        if !done || self.ct.is_none() {
            return;
        }
        let Some(to) = self.next.take() else {
            return;
        };
        if self.shared.mode == GridMode::GridAware && !self.is_local(to) {
            // Alg. 12 lines 4–10: the counter belonged to `to`; local pointers follow it.
            self.next_preempted = 0;
            if self.owner.is_none() {
                self.owner = Some(self.remote_owner.unwrap_or(to));
            }
            self.remote_owner = None;
        }
        if let Some(ct) = self.ct.take() {
            out.send(self.id, to, GridMsg::ControlToken(ct));
        }
    }

    /// The application leaves its critical section (Alg. 12).
    pub fn on_release(&mut self, out: &mut MultiOutbox<GridMsg>) -> Result<(), MutexError> {
        if !self.in_cs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.in_cs = false;
        self.ct_requesting = false;
        self.registered = false;
        self.try_pass_ct(out);
        for (j, ts) in std::mem::take(&mut self.owed) {
            let mut tokens = Vec::with_capacity(ts.len());
            for t in ts {
                let f = self.local[t]
                    .take()
                    .ok_or_else(|| protocol(self.id, format!("owed token {t} is not here")))?;
                self.locked[t] = false;
                tokens.push((t, f));
            }
            out.send(
                self.id,
                j,
                GridMsg::Ack {
                    kind: AckKind::Second,
                    tokens,
                },
            );
        }
        // §5.10 item 9: the remaining tokens stay cached here, unlocked.
        self.locked.iter_mut().for_each(|l| *l = false);
        self.need.clear();
        self.spec = None;
        Ok(())
    }

    /// A message from `from` arrived.
    pub fn on_message(
        &mut self,
        from: NodeId,
        msg: GridMsg,
        out: &mut MultiOutbox<GridMsg>,
    ) -> Result<(), MutexError> {
        check_node(from, self.shared.n)?;
        match msg {
            GridMsg::Request { origin, preempted } => {
                check_node(origin, self.shared.n)?;
                match self.shared.mode {
                    GridMode::GridAware => self.on_ct_request(origin, preempted, out),
                    GridMode::Plain => self.on_ct_request_plain(origin, out),
                }
            }
            GridMsg::Preempt { count, remote } => {
                check_node(remote, self.shared.n)?;
                self.on_preempt(count, remote, out);
                Ok(())
            }
            GridMsg::ControlToken(ct) => {
                if self.ct.is_some() || !self.ct_requesting || self.registered {
                    return Err(protocol(self.id, "unexpected control token"));
                }
                if ct.slots.len() != self.local.len() || ct.priority.len() != self.prio_local.len()
                {
                    return Err(protocol(self.id, "control token of another resource space"));
                }
                self.ct = Some(ct);
                self.stage2(out)
            }
            GridMsg::TokenRequest { tokens } => self.on_token_request(from, tokens, out),
            GridMsg::Ack { kind, tokens } => self.on_ack(kind, tokens, out),
        }
    }

    /// Alg. 4 (the extended CT request handler; decisions in the module docs).
    fn on_ct_request(
        &mut self,
        j: NodeId,
        preempted: u32,
        out: &mut MultiOutbox<GridMsg>,
    ) -> Result<(), MutexError> {
        let local = self.is_local(j);
        let Some(owner) = self.owner else {
            // I am the root.
            if !self.ct_requesting {
                let ct = self
                    .ct
                    .take()
                    .ok_or_else(|| protocol(self.id, "idle root without the control token"))?;
                out.send(self.id, j, GridMsg::ControlToken(ct));
                self.owner = Some(j);
                return Ok(());
            }
            match self.next {
                None => {
                    self.next = Some(j);
                    if local {
                        self.owner = Some(j);
                    } else {
                        self.remote_owner = Some(j);
                        self.next_preempted = preempted;
                    }
                }
                Some(x) => {
                    let x_remote = !self.is_local(x);
                    if local && x_remote && self.next_preempted < self.shared.max_preempt {
                        self.next_preempted += 1;
                        let count = self.next_preempted;
                        self.owner = Some(j);
                        out.send(self.id, j, GridMsg::Preempt { count, remote: x });
                        self.events.push(GridEvent::Preempted {
                            victim: x,
                            local: j,
                            count,
                        });
                        self.next = Some(j);
                        self.next_preempted = 0;
                        self.remote_owner = None;
                    } else {
                        out.send(
                            self.id,
                            x,
                            GridMsg::Request {
                                origin: j,
                                preempted,
                            },
                        );
                        if local {
                            self.owner = Some(j);
                        }
                    }
                }
            }
            self.try_pass_ct(out);
            return Ok(());
        };
        out.send(
            self.id,
            owner,
            GridMsg::Request {
                origin: j,
                preempted,
            },
        );
        if local {
            self.owner = Some(j);
        }
        Ok(())
    }

    /// Alg. 3 (plain Naimi–Tréhel on the control token), for [`GridMode::Plain`].
    fn on_ct_request_plain(
        &mut self,
        j: NodeId,
        out: &mut MultiOutbox<GridMsg>,
    ) -> Result<(), MutexError> {
        match self.owner {
            None if self.ct_requesting => {
                if self.next.is_some() {
                    return Err(protocol(self.id, "second CT request queued at a root"));
                }
                self.next = Some(j);
                self.try_pass_ct(out);
            }
            None => {
                let ct = self
                    .ct
                    .take()
                    .ok_or_else(|| protocol(self.id, "idle root without the control token"))?;
                out.send(self.id, j, GridMsg::ControlToken(ct));
            }
            Some(owner) => out.send(
                self.id,
                owner,
                GridMsg::Request {
                    origin: j,
                    preempted: 0,
                },
            ),
        }
        self.owner = Some(j);
        Ok(())
    }

    /// Alg. 5, forwarding along `next` (module docs, decision 2).
    fn on_preempt(&mut self, count: u32, remote: NodeId, out: &mut MultiOutbox<GridMsg>) {
        match self.next {
            None => {
                self.next = Some(remote);
                self.remote_owner = Some(remote);
                self.next_preempted = count;
            }
            Some(x) if self.is_local(x) => {
                out.send(self.id, x, GridMsg::Preempt { count, remote });
            }
            Some(x) => {
                // A remote successor queued here meanwhile: the preempted one goes first and
                // the other is appended behind it, keeping its own count.
                let theirs = self.next_preempted;
                self.next = Some(remote);
                self.remote_owner = Some(remote);
                self.next_preempted = count;
                out.send(
                    self.id,
                    remote,
                    GridMsg::Request {
                        origin: x,
                        preempted: theirs,
                    },
                );
            }
        }
        self.try_pass_ct(out);
    }

    /// Alg. 10.
    fn on_token_request(
        &mut self,
        j: NodeId,
        tokens: Vec<usize>,
        out: &mut MultiOutbox<GridMsg>,
    ) -> Result<(), MutexError> {
        let mut give = Vec::new();
        let mut owe = Vec::new();
        for t in tokens {
            if t >= self.local.len() {
                return Err(protocol(self.id, format!("request for unknown token {t}")));
            }
            match self.local[t] {
                Some(f) if !self.locked[t] => {
                    self.local[t] = None;
                    give.push((t, f));
                }
                _ => owe.push(t),
            }
        }
        if !owe.is_empty() {
            if !self.ct_requesting && !self.in_cs {
                return Err(protocol(
                    self.id,
                    format!("asked by {j} for tokens {owe:?} it neither has nor awaits"),
                ));
            }
            self.owed.push((j, owe));
        }
        out.send(
            self.id,
            j,
            GridMsg::Ack {
                kind: AckKind::First,
                tokens: give,
            },
        );
        Ok(())
    }

    /// Alg. 11.
    fn on_ack(
        &mut self,
        kind: AckKind,
        tokens: Vec<(usize, Fence)>,
        out: &mut MultiOutbox<GridMsg>,
    ) -> Result<(), MutexError> {
        if !self.registered {
            return Err(protocol(self.id, "token acknowledgement without a request"));
        }
        for (t, f) in tokens {
            if t >= self.local.len() || self.local[t].is_some() {
                return Err(protocol(self.id, format!("token {t} received twice")));
            }
            self.local[t] = Some(f);
            self.locked[t] = true;
        }
        if kind == AckKind::First {
            self.ack1_pending = self
                .ack1_pending
                .checked_sub(1)
                .ok_or_else(|| protocol(self.id, "unexpected ACK1"))?;
        }
        self.try_enter(out)?;
        self.try_pass_ct(out);
        Ok(())
    }

    /// Adds, per flat instance, the resource tokens present here and those free inside a held
    /// CT (token accounting).
    pub(super) fn count_tokens(&self, held: &mut [usize]) {
        for (h, l) in held.iter_mut().zip(&self.local) {
            *h += usize::from(l.is_some());
        }
        if let Some(ct) = &self.ct {
            ct.count_free(held);
        }
    }
}
