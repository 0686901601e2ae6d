//! Lejeune, Arantes, Sopena & Sens: counters, a total order on requests, and loans (spec §4,
//! handlers H1–H8 reconstructed from the prose of \[LJ\]; single-instance resources only, as in
//! \[LJ\]).
//!
//! Every resource has one token, managed by a simplified Mueller algorithm: a dynamic tree per
//! resource whose root is the token holder (`father[r]`), and a token that carries the
//! resource's **counter**, a **wait queue** sorted by priority and the pending **loan requests**.
//! A request first reads the counter of every resource it needs (`ReqCnt` / `Counter`; the
//! holder increments after each read), computes its mark `A(v)` = the mean of the non-zero
//! counter values, then asks each token (`ReqRes`) with that mark. Requests are totally ordered
//! by `(A(v), site id)` (◁: smaller mark first, then smaller id); a holder that is not in its CS
//! cedes a token to a request with priority over its own, which makes the scheme deadlock-free
//! without a global lock. With **loans** (threshold 1), a waiting site missing only one
//! resource asks its holder to lend it; the holder, if it is waiting itself and owns everything
//! the borrower misses, lends, and the borrower enters at once (or cancels and returns the
//! tokens).
//!
//! [`LjNode`] is one process, a pure state machine; [`Lejeune`] is the group for the driver.
//!
//! Decisions (\[D\], spec §4.10), each exercised by the tests in `tests/multi_algos.rs`:
//! 1. **Father updates:** the site sending a token sets `father[r]` to the receiver; the
//!    receiver becomes the root; forwarders do not re-point. `Counter` from `s_j` sets
//!    `father[r] := s_j` (§4.8 (i)). A lender keeps itself as `father[r]` while the token is
//!    lent; the borrower points back to the lender when it returns the token.
//! 2. **Next hop already visited:** every request message carries the sites it visited; a site
//!    records every request it receives about a token it does not have in its **history**, and
//!    stops forwarding when its father was already visited (or is itself, i.e. the token is lent
//!    or on its way here). When a token arrives at a site, the site serves its history for that
//!    resource (answers `ReqCnt`, inserts `ReqRes` in the wait queue, `ReqLoan` in the loan
//!    list) and forgets those entries.
//! 3. **Pruning "by logical clock":** each site numbers its requests; each token carries, per
//!    site, the last request number whose counter read, resource request and loan request it
//!    already accounted for (like Suzuki–Kasami's LN). Duplicates (a request served from a
//!    history and also reached directly) and obsolete entries are dropped by comparing numbers.
//!    A site entering its CS marks its request accounted for in every token it holds and
//!    removes its own entries from their queues.
//! 4. **Order of the H5 steps:** read the counter, serve the history, enter the CS if
//!    everything is held (a site that can enter always enters first), else go to waitCS if the
//!    counters are complete, then the priority check on every owned token (cede to a queue head
//!    with priority), then serve pending loan requests, then maybe ask for a loan.
//! 5. **waitS holders** have the lowest priority: they answer `ReqCnt` but cede the token to the
//!    head of its queue as soon as the queue is not empty (they already read its counter).
//!    Idle holders do the same.
//! 6. **Returned loans:** the lender re-adds the tokens, serves its history for them, and
//!    re-checks entry, priorities and loans.
//! 7. **Queue entries** are `(site, request number, mark)` sorted by ◁, at most one per site; a
//!    holder ceding a token it still needs inserts its own entry. A holder asked for a token by
//!    a request without priority over the queue head sends the token to the head (which may be
//!    the asker): the spec's "cede to s_i" when the queue is empty.
//! 8. **Initial placement:** the token of resource `r` starts at site `r mod n`, every
//!    `father[r]` points there; counters start at 1 (so a counter value is never 0, the "not
//!    requested" entry of `v`).
//! 9. A request whose tokens are all here enters at once (counters read locally).
//! 10. **Loans:** threshold configurable ([`LjConfig::loan_threshold`], 1 in \[LJ\]); at most one
//!     loan request per request. Only a holder that is itself in waitCS lends (an idle or
//!     waitS holder, or one that does not need the token, simply cedes it: it never needs it
//!     back). Lending needs (a)–(e) of H6. A loan that arrives when the borrower cannot enter
//!     (it ceded a token meanwhile, or the loan is for an older request) is returned at once.
//!     While the borrower holds borrowed tokens it keeps them (queueing requests in them) and
//!     returns them, with the queue, at CS exit.
//! 11. §4.8 optimisations, both on by default and switchable ([`LjConfig`]): (ii) forwarding
//!     limitation (a waitCS site that needs `r` and has priority, or a lender of `r`, keeps a
//!     `ReqRes` in its history instead of forwarding); the single-resource shortcut (a request
//!     for one resource goes straight to waitCS with a `ReqCnt` flagged `single`; the holder
//!     reads the counter, uses it as the mark and queues the request, no `Counter` is sent).
//!     Such a requester never knows its own mark; it needs none: it holds its only token
//!     exactly when it enters, and it never asks for a loan.
//! 12. **Preemptions** ([`MultiSystem::preemptions`](crate::multi::MultiSystem::preemptions)): loans granted plus tokens ceded by a
//!     waitCS site that needed them to a request with priority (the dynamic rescheduling).
//!     [`Lejeune::loans`] and [`Lejeune::cessions`] give the two parts.
//! 13. FIFO links are not needed (the tests run FIFO and non-FIFO).
//!
//! This module owns a site's state machine and its request, token and release handlers
//! (H1–H5, H8); `token` what a token carries, `msg` the messages, `loans` the loan
//! handlers (H6, H7), `group` the group as a [`MultiSystem`](super::model::MultiSystem).

use std::collections::{BTreeMap, BTreeSet};

use crate::error::MutexError;
use crate::node::{NodeId, check_node, protocol};

use super::model::{Hold, MultiOutbox, MultiRequest, ResourceSpace};

mod group;
mod loans;
mod msg;
mod token;

pub use group::Lejeune;
pub use msg::LjMsg;
pub use token::{LjToken, LoanEntry, Mark, QEntry, Transfer};
use token::{before, queue_single};

/// Configuration of the Lejeune et al. algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LjConfig {
    /// The loan mechanism ("avec prêt").
    pub loan: bool,
    /// Ask for a loan when at most this many resources are missing (1 in \[LJ\]).
    pub loan_threshold: usize,
    /// §4.8 (ii): do not forward a `ReqRes` that this site will serve anyway.
    pub forwarding_limits: bool,
    /// §4.8: single-resource requests skip the counter round trip.
    pub single_shortcut: bool,
}

impl Default for LjConfig {
    fn default() -> Self {
        Self {
            loan: false,
            loan_threshold: 1,
            forwarding_limits: true,
            single_shortcut: true,
        }
    }
}

impl LjConfig {
    /// With the loan mechanism, threshold 1 (\[LJ\]'s "avec prêt").
    pub fn with_loan() -> Self {
        Self {
            loan: true,
            ..Self::default()
        }
    }
}

/// The state of a site (§4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LjState {
    /// No request.
    Idle,
    /// Waiting for counter values.
    WaitS,
    /// Waiting for tokens.
    WaitCs,
    /// In the critical section.
    InCs,
}

/// A request message kept in a site's history.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hist {
    Cnt {
        init: NodeId,
        seq: u64,
        single: bool,
    },
    Res(QEntry),
    Loan(LoanEntry),
}

/// One site of the Lejeune et al. algorithm: a pure state machine (no I/O, no clock).
#[derive(Debug, Clone)]
pub struct LjNode {
    id: NodeId,
    n: usize,
    m: usize,
    config: LjConfig,
    state: LjState,
    /// Per resource: probable holder (`id` itself: root, token here, lent or arriving).
    father: Vec<NodeId>,
    /// Tokens here (owned or borrowed).
    owned: BTreeMap<usize, LjToken>,
    /// Resources of the current request, sorted.
    required: Vec<usize>,
    /// Request number (1 for the first request).
    seq: u64,
    /// Counter values read for the current request.
    v: BTreeMap<usize, u64>,
    cnt_needed: BTreeSet<usize>,
    mark: Option<Mark>,
    /// Per resource: request messages not yet seen by its token.
    history: BTreeMap<usize, Vec<Hist>>,
    loan_asked: bool,
    /// Borrowed tokens here and their lender, and how many the loan has.
    borrowed: BTreeSet<usize>,
    lender: Option<(NodeId, usize)>,
    /// Tokens lent, and to whom.
    lent: BTreeSet<usize>,
    lent_to: Option<NodeId>,
    loans_granted: u64,
    cessions: u64,
}

impl LjNode {
    /// Site `id` of a group of `n` over `space` (single-instance resources only).
    pub fn new(
        id: NodeId,
        n: usize,
        space: &ResourceSpace,
        config: &LjConfig,
    ) -> Result<Self, MutexError> {
        check_node(id, n)?;
        if space.capacities().iter().any(|&k| k != 1) {
            return Err(MutexError::Config(
                "Lejeune et al. allocates single-instance resources only".into(),
            ));
        }
        if config.loan && config.loan_threshold == 0 {
            return Err(MutexError::Config(
                "a loan threshold must be at least 1".into(),
            ));
        }
        let m = space.types();
        let owned = (0..m)
            .filter(|r| r % n == id)
            .map(|r| (r, LjToken::new(r, n)))
            .collect();
        Ok(Self {
            id,
            n,
            m,
            config: config.clone(),
            state: LjState::Idle,
            father: (0..m).map(|r| r % n).collect(),
            owned,
            required: Vec::new(),
            seq: 0,
            v: BTreeMap::new(),
            cnt_needed: BTreeSet::new(),
            mark: None,
            history: BTreeMap::new(),
            loan_asked: false,
            borrowed: BTreeSet::new(),
            lender: None,
            lent: BTreeSet::new(),
            lent_to: None,
            loans_granted: 0,
            cessions: 0,
        })
    }

    /// This site's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The site's state.
    pub fn state(&self) -> LjState {
        self.state
    }

    /// Whether the token of resource `r` is here (owned or borrowed).
    pub fn holds_token(&self, r: usize) -> bool {
        self.owned.contains_key(&r)
    }

    /// Loans this site granted.
    pub fn loans_granted(&self) -> u64 {
        self.loans_granted
    }

    /// Tokens this site ceded, while waiting for them, to a request with priority.
    pub fn cessions(&self) -> u64 {
        self.cessions
    }

    fn my_prio(&self) -> Option<(Mark, NodeId)> {
        self.mark.map(|m| (m, self.id))
    }

    fn requires(&self, r: usize) -> bool {
        self.required.binary_search(&r).is_ok()
    }

    /// H1: the local application asks for `req`.
    pub fn on_request(
        &mut self,
        req: &MultiRequest,
        out: &mut MultiOutbox<LjMsg>,
    ) -> Result<(), MutexError> {
        if self.state != LjState::Idle {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        let mut required = Vec::with_capacity(req.size());
        for &(r, c) in req.items() {
            if r >= self.m || c != 1 {
                return Err(MutexError::Config(format!(
                    "request for {c} instances of resource {r}"
                )));
            }
            required.push(r);
        }
        self.seq += 1;
        self.required = required;
        self.v.clear();
        self.cnt_needed.clear();
        self.mark = None;
        self.loan_asked = false;
        self.state = LjState::WaitS;
        for i in 0..self.required.len() {
            let r = self.required[i];
            if let Some(tok) = self.owned.get_mut(&r) {
                self.v.insert(r, tok.take_counter(self.id, self.seq));
            } else {
                let single = self.config.single_shortcut && self.required.len() == 1;
                let msg = LjMsg::ReqCnt {
                    r,
                    init: self.id,
                    seq: self.seq,
                    single,
                    visited: vec![self.id],
                };
                out.send(self.id, self.father[r], msg);
                if single {
                    // §4.8: straight to waitCS; the holder applies A and queues the request.
                    self.state = LjState::WaitCs;
                    self.settle_all(out);
                    return Ok(());
                }
                self.cnt_needed.insert(r);
            }
        }
        if self.cnt_needed.is_empty() {
            self.enter_wait_cs(out)?;
        } else {
            // Tokens held but not yet usable: a waitS holder cedes to queued requests.
            self.settle_all(out);
        }
        Ok(())
    }

    /// H3 tail: all counters known; send the resource requests.
    fn enter_wait_cs(&mut self, out: &mut MultiOutbox<LjMsg>) -> Result<(), MutexError> {
        let sum: u64 = self.v.values().sum();
        let mark = Mark {
            sum,
            count: self.v.len() as u64,
        };
        self.mark = Some(mark);
        self.state = LjState::WaitCs;
        for i in 0..self.required.len() {
            let r = self.required[i];
            if self.owned.contains_key(&r) || self.father[r] == self.id {
                continue;
            }
            let msg = LjMsg::ReqRes {
                r,
                init: self.id,
                seq: self.seq,
                mark,
                visited: vec![self.id],
            };
            out.send(self.id, self.father[r], msg);
        }
        self.progress(out)
    }

    /// After any change: enter if possible, else priority checks, loans to serve, loan to ask.
    fn progress(&mut self, out: &mut MultiOutbox<LjMsg>) -> Result<(), MutexError> {
        if self.try_enter(out)? {
            return Ok(());
        }
        self.settle_all(out);
        self.serve_loans(out);
        self.maybe_ask_loan(out);
        Ok(())
    }

    fn try_enter(&mut self, out: &mut MultiOutbox<LjMsg>) -> Result<bool, MutexError> {
        if self.state != LjState::WaitCs
            || !self.required.iter().all(|r| self.owned.contains_key(r))
        {
            return Ok(false);
        }
        let mut holds = Vec::with_capacity(self.required.len());
        for tok in self.owned.values_mut() {
            tok.acc_cnt[self.id] = self.seq;
            tok.acc_res[self.id] = self.seq;
            tok.acc_loan[self.id] = self.seq;
            tok.forget_site(self.id);
        }
        for &r in &self.required {
            let tok = self
                .owned
                .get_mut(&r)
                .ok_or_else(|| protocol(self.id, "token vanished"))?;
            tok.fence += 1;
            holds.push(Hold {
                resource: r,
                instance: 0,
                fence: tok.fence,
            });
        }
        self.state = LjState::InCs;
        out.grant(self.id, holds);
        Ok(true)
    }

    /// Sends the token of `r` (must be here) to `to`.
    fn send_token(&mut self, r: usize, to: NodeId, how: Transfer, out: &mut MultiOutbox<LjMsg>) {
        if let Some(mut token) = self.owned.remove(&r) {
            match how {
                Transfer::Give => {
                    token.forget_site(to);
                    self.father[r] = to;
                }
                Transfer::Return => self.father[r] = to,
                Transfer::Loan { .. } => {}
            }
            out.send(self.id, to, LjMsg::Token { token, how });
        }
    }

    /// Priority check on an owned (not borrowed) token: cede it to its queue head if the head
    /// has priority, or if this site does not (or cannot yet) use it. In the critical section
    /// only the tokens the section uses are kept (§4.7 H4/H6: `r ∉ required_j` cedes at once,
    /// whatever the state).
    fn settle(&mut self, r: usize, out: &mut MultiOutbox<LjMsg>) {
        if (self.state == LjState::InCs && self.requires(r)) || self.borrowed.contains(&r) {
            return;
        }
        let Some(tok) = self.owned.get(&r) else {
            return;
        };
        let Some(&head) = tok.queue.first() else {
            return;
        };
        let mine = self.state == LjState::WaitCs && self.requires(r);
        if mine {
            let Some(me) = self.my_prio() else { return };
            if !before((head.mark, head.site), me) {
                return;
            }
            let own = QEntry {
                site: self.id,
                seq: self.seq,
                mark: me.0,
            };
            if let Some(tok) = self.owned.get_mut(&r) {
                tok.queue.remove(0);
                tok.enqueue(own);
            }
            self.cessions += 1;
        } else if let Some(tok) = self.owned.get_mut(&r) {
            tok.queue.remove(0);
        }
        self.send_token(r, head.site, Transfer::Give, out);
    }

    fn settle_all(&mut self, out: &mut MultiOutbox<LjMsg>) {
        let rs: Vec<usize> = self.owned.keys().copied().collect();
        for r in rs {
            self.settle(r, out);
        }
    }

    /// Records a request about `r` (not here) and forwards it unless its next hop was visited.
    fn forward(
        &mut self,
        r: usize,
        hist: Hist,
        mut msg: LjMsg,
        stop: bool,
        out: &mut MultiOutbox<LjMsg>,
    ) {
        self.history.entry(r).or_default().push(hist);
        let father = self.father[r];
        let visited = match &mut msg {
            LjMsg::ReqCnt { visited, .. }
            | LjMsg::ReqRes { visited, .. }
            | LjMsg::ReqLoan { visited, .. } => visited,
            _ => return,
        };
        if stop || father == self.id || visited.contains(&father) {
            return;
        }
        visited.push(self.id);
        out.send(self.id, father, msg);
    }

    /// Serves the history of `r` now that its token is here.
    fn serve_history(&mut self, r: usize, out: &mut MultiOutbox<LjMsg>) {
        let Some(entries) = self.history.remove(&r) else {
            return;
        };
        let me = self.id;
        let Some(tok) = self.owned.get_mut(&r) else {
            return;
        };
        for h in entries {
            match h {
                Hist::Cnt { init, seq, single } => {
                    if init != me && tok.acc_cnt[init] < seq && single {
                        queue_single(tok, init, seq);
                    } else if init != me && tok.acc_cnt[init] < seq {
                        let val = tok.take_counter(init, seq);
                        out.send(me, init, LjMsg::Counter { r, seq, val });
                    }
                }
                Hist::Res(e) => {
                    if e.site != me && tok.acc_res[e.site] < e.seq {
                        tok.enqueue(e);
                    }
                }
                Hist::Loan(e) => {
                    if e.site != me && tok.acc_loan[e.site] < e.seq {
                        tok.add_loan(e);
                    }
                }
            }
        }
    }

    /// H8: the local application leaves its critical section.
    pub fn on_release(&mut self, out: &mut MultiOutbox<LjMsg>) -> Result<(), MutexError> {
        if self.state != LjState::InCs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        self.state = LjState::Idle;
        if let Some((lender, _)) = self.lender.take() {
            for r in std::mem::take(&mut self.borrowed) {
                self.send_token(r, lender, Transfer::Return, out);
            }
        }
        self.required.clear();
        self.mark = None;
        self.loan_asked = false;
        self.settle_all(out);
        Ok(())
    }

    /// A message from `from` arrived.
    pub fn on_message(
        &mut self,
        from: NodeId,
        msg: LjMsg,
        out: &mut MultiOutbox<LjMsg>,
    ) -> Result<(), MutexError> {
        check_node(from, self.n)?;
        let r = match &msg {
            LjMsg::ReqCnt { r, .. }
            | LjMsg::Counter { r, .. }
            | LjMsg::ReqRes { r, .. }
            | LjMsg::ReqLoan { r, .. } => *r,
            LjMsg::Token { token, .. } => token.r,
        };
        if r >= self.m {
            return Err(protocol(self.id, format!("message about resource {r}")));
        }
        match msg {
            LjMsg::ReqCnt {
                init, seq, single, ..
            } if self.owned.contains_key(&r) => {
                check_node(init, self.n)?;
                self.on_req_cnt(r, init, seq, single, out);
                Ok(())
            }
            LjMsg::ReqCnt {
                init, seq, single, ..
            } => {
                check_node(init, self.n)?;
                let stop = self.lent.contains(&r);
                self.forward(r, Hist::Cnt { init, seq, single }, msg, stop, out);
                Ok(())
            }
            LjMsg::Counter { seq, val, .. } => {
                if seq != self.seq || self.state != LjState::WaitS || !self.cnt_needed.remove(&r) {
                    return Ok(()); // a duplicate answer to an already-read counter
                }
                self.v.insert(r, val);
                if !self.owned.contains_key(&r) && !self.lent.contains(&r) {
                    self.father[r] = from;
                }
                if self.cnt_needed.is_empty() {
                    self.enter_wait_cs(out)?;
                }
                Ok(())
            }
            LjMsg::ReqRes {
                init, seq, mark, ..
            } => {
                check_node(init, self.n)?;
                let e = QEntry {
                    site: init,
                    seq,
                    mark,
                };
                if self.owned.contains_key(&r) {
                    self.on_req_res(r, e, out);
                } else {
                    let keep = self.lent.contains(&r)
                        || (self.config.forwarding_limits
                            && self.state == LjState::WaitCs
                            && self.requires(r)
                            && self.my_prio().is_some_and(|me| before(me, (mark, init))));
                    self.forward(r, Hist::Res(e), msg, keep, out);
                }
                Ok(())
            }
            LjMsg::ReqLoan {
                init,
                seq,
                mark,
                ref missing,
                ..
            } => {
                check_node(init, self.n)?;
                if missing.iter().any(|&x| x >= self.m) {
                    return Err(protocol(self.id, "loan request for an unknown resource"));
                }
                let e = LoanEntry {
                    site: init,
                    seq,
                    mark,
                    missing: missing.clone(),
                };
                if self.owned.contains_key(&r) {
                    self.on_req_loan(r, e, out);
                } else {
                    let stop = self.lent.contains(&r);
                    self.forward(r, Hist::Loan(e), msg, stop, out);
                }
                Ok(())
            }
            LjMsg::Token { token, how } => self.on_token(token, how, out),
        }
    }

    /// H2 at the holder.
    fn on_req_cnt(
        &mut self,
        r: usize,
        init: NodeId,
        seq: u64,
        single: bool,
        out: &mut MultiOutbox<LjMsg>,
    ) {
        let me = self.id;
        let needed = self.state != LjState::Idle && self.requires(r);
        let Some(tok) = self.owned.get_mut(&r) else {
            return;
        };
        if init == me || tok.acc_cnt[init] >= seq {
            return;
        }
        if !needed && !self.borrowed.contains(&r) {
            // Not needed here: give the token away (the requester reads the counter itself).
            self.send_token(r, init, Transfer::Give, out);
        } else if single {
            queue_single(tok, init, seq);
            self.settle(r, out);
        } else {
            let val = tok.take_counter(init, seq);
            out.send(me, init, LjMsg::Counter { r, seq, val });
        }
    }

    /// H4 at the holder.
    fn on_req_res(&mut self, r: usize, e: QEntry, out: &mut MultiOutbox<LjMsg>) {
        let Some(tok) = self.owned.get_mut(&r) else {
            return;
        };
        if e.site == self.id || tok.acc_res[e.site] >= e.seq {
            return;
        }
        tok.enqueue(e);
        self.settle(r, out);
    }

    /// H6 at the holder.
    fn on_req_loan(&mut self, r: usize, e: LoanEntry, out: &mut MultiOutbox<LjMsg>) {
        let cede =
            !self.borrowed.contains(&r) && (self.state != LjState::WaitCs || !self.requires(r));
        let Some(tok) = self.owned.get_mut(&r) else {
            return;
        };
        if e.site == self.id || tok.acc_loan[e.site] >= e.seq {
            return;
        }
        if cede {
            // Not a loan: the requester's resource request is served like a ReqRes.
            if tok.acc_res[e.site] < e.seq {
                tok.enqueue(QEntry {
                    site: e.site,
                    seq: e.seq,
                    mark: e.mark,
                });
            }
            self.settle(r, out);
        } else if self.loan_possible(e.site, e.mark, &e.missing) {
            self.lend(&e, out);
        } else if let Some(tok) = self.owned.get_mut(&r) {
            tok.add_loan(e);
        }
    }

    /// H5: a token arrives (given, lent or returned).
    fn on_token(
        &mut self,
        mut token: LjToken,
        how: Transfer,
        out: &mut MultiOutbox<LjMsg>,
    ) -> Result<(), MutexError> {
        let r = token.r;
        if self.owned.contains_key(&r) || token.acc_cnt.len() != self.n {
            return Err(protocol(self.id, format!("unexpected token {r}")));
        }
        match how {
            Transfer::Give => {}
            Transfer::Loan { lender, seq, size } => {
                check_node(lender, self.n)?;
                let valid = seq == self.seq
                    && self.state == LjState::WaitCs
                    && self.requires(r)
                    && self.lender.is_none_or(|(l, _)| l == lender)
                    && self.lent.is_empty();
                if !valid {
                    out.send(
                        self.id,
                        lender,
                        LjMsg::Token {
                            token,
                            how: Transfer::Return,
                        },
                    );
                    return Ok(());
                }
                self.borrowed.insert(r);
                self.lender = Some((lender, size));
                self.owned.insert(r, token);
                self.serve_history(r, out);
                if self.borrowed.len() < size {
                    return Ok(()); // the rest of the loan is on its way
                }
                if !self.try_enter(out)? {
                    // H5 loan case: cannot enter (ceded something meanwhile): cancel.
                    self.lender = None;
                    for b in std::mem::take(&mut self.borrowed) {
                        self.send_token(b, lender, Transfer::Return, out);
                    }
                    self.progress(out)?;
                }
                return Ok(());
            }
            Transfer::Return => {
                if !self.lent.remove(&r) {
                    return Err(protocol(self.id, format!("return of token {r} never lent")));
                }
                if self.lent.is_empty() {
                    self.lent_to = None;
                }
            }
        }
        self.father[r] = self.id;
        token.forget_site(self.id);
        self.owned.insert(r, token);
        if self.state == LjState::WaitS
            && self.cnt_needed.remove(&r)
            && let Some(tok) = self.owned.get_mut(&r)
        {
            self.v.insert(r, tok.take_counter(self.id, self.seq));
        }
        self.serve_history(r, out);
        if self.state == LjState::WaitS && self.cnt_needed.is_empty() {
            self.enter_wait_cs(out)
        } else {
            self.progress(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(sum: u64, count: u64) -> Mark {
        Mark { sum, count }
    }

    #[test]
    fn priority_is_the_mean_of_the_counters_then_the_site_id() {
        // A(v) = mean of the non-zero entries: 3/2 = 1.5 < 5/3 ≈ 1.67.
        assert!(before((mark(3, 2), 7), (mark(5, 3), 0)));
        assert!(!before((mark(5, 3), 0), (mark(3, 2), 7)));
        // Equal means (2/1 = 4/2): the smaller site id has priority.
        assert!(before((mark(4, 2), 1), (mark(2, 1), 3)));
        assert!(!before((mark(2, 1), 3), (mark(4, 2), 1)));
        // Irreflexive.
        assert!(!before((mark(2, 1), 3), (mark(2, 1), 3)));
    }

    #[test]
    fn wait_queue_is_sorted_and_keeps_one_entry_per_site() {
        let mut t = LjToken::new(0, 4);
        t.enqueue(QEntry {
            site: 2,
            seq: 1,
            mark: mark(9, 3),
        });
        t.enqueue(QEntry {
            site: 1,
            seq: 1,
            mark: mark(4, 2),
        });
        t.enqueue(QEntry {
            site: 3,
            seq: 1,
            mark: mark(2, 1),
        });
        let order: Vec<NodeId> = t.queue.iter().map(|q| q.site).collect();
        assert_eq!(order, vec![1, 3, 2]);
        // A newer request of site 2 replaces its entry; an older one is ignored.
        t.enqueue(QEntry {
            site: 2,
            seq: 2,
            mark: mark(1, 1),
        });
        t.enqueue(QEntry {
            site: 2,
            seq: 1,
            mark: mark(9, 3),
        });
        let order: Vec<(NodeId, u64)> = t.queue.iter().map(|q| (q.site, q.seq)).collect();
        assert_eq!(order, vec![(2, 2), (1, 1), (3, 1)]);
    }
}
