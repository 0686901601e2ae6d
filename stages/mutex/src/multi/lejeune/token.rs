//! What a token carries (spec §4.3): its resource's counter, the wait queue sorted by
//! request priority ([`Mark`], ◁), the pending loan requests, and the per-site request
//! numbers already accounted for; and how it travels ([`Transfer`]). Data and its
//! invariants only: the handlers that move tokens are the node's (the parent module).

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::node::{Fence, NodeId};

/// A request's mark `A(v)`: the mean of the non-zero counter values, kept as `sum / count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// Sum of the counter values.
    pub sum: u64,
    /// Number of resources.
    pub count: u64,
}

/// The priority of a request: mark, then site id (◁).
pub(super) fn prio_cmp(a: (Mark, NodeId), b: (Mark, NodeId)) -> Ordering {
    let l = u128::from(a.0.sum) * u128::from(b.0.count);
    let r = u128::from(b.0.sum) * u128::from(a.0.count);
    l.cmp(&r).then(a.1.cmp(&b.1))
}

/// `a ◁ b`: `a` has priority over `b`.
pub(super) fn before(a: (Mark, NodeId), b: (Mark, NodeId)) -> bool {
    prio_cmp(a, b) == Ordering::Less
}

/// An entry of a token's wait queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QEntry {
    /// The requesting site.
    pub site: NodeId,
    /// Its request number.
    pub seq: u64,
    /// Its mark.
    pub mark: Mark,
}

/// A pending loan request kept in a token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoanEntry {
    /// The would-be borrower.
    pub site: NodeId,
    /// Its request number.
    pub seq: u64,
    /// Its mark.
    pub mark: Mark,
    /// The resources it misses.
    pub missing: Vec<usize>,
}

/// The token of one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LjToken {
    /// The resource.
    pub r: usize,
    /// The next counter value.
    pub counter: u64,
    /// Last fence granted.
    pub fence: Fence,
    /// Wait queue, sorted by ◁.
    pub queue: Vec<QEntry>,
    /// Pending loan requests.
    pub loans: Vec<LoanEntry>,
    /// Per site: last request number whose counter read is accounted for.
    pub acc_cnt: Vec<u64>,
    /// Per site: last request number whose resource request is accounted for.
    pub acc_res: Vec<u64>,
    /// Per site: last request number whose loan request is accounted for.
    pub acc_loan: Vec<u64>,
}

impl LjToken {
    /// Reads the counter for request `seq` of `init` (H2): the value, then the counter moves
    /// on and the read is accounted for.
    pub(super) fn take_counter(&mut self, init: NodeId, seq: u64) -> u64 {
        let val = self.counter;
        self.counter += 1;
        self.acc_cnt[init] = seq;
        val
    }

    pub(super) fn new(r: usize, n: usize) -> Self {
        Self {
            r,
            counter: 1,
            fence: 0,
            queue: Vec::new(),
            loans: Vec::new(),
            acc_cnt: vec![0; n],
            acc_res: vec![0; n],
            acc_loan: vec![0; n],
        }
    }

    /// Inserts `e` in ◁ order, replacing an older entry of the same site.
    pub(super) fn enqueue(&mut self, e: QEntry) {
        if let Some(i) = self.queue.iter().position(|q| q.site == e.site) {
            if self.queue[i].seq >= e.seq {
                return;
            }
            self.queue.remove(i);
        }
        let at = self
            .queue
            .partition_point(|q| before((q.mark, q.site), (e.mark, e.site)));
        self.queue.insert(at, e);
    }

    pub(super) fn add_loan(&mut self, e: LoanEntry) {
        if let Some(i) = self.loans.iter().position(|q| q.site == e.site) {
            if self.loans[i].seq >= e.seq {
                return;
            }
            self.loans.remove(i);
        }
        self.loans.push(e);
        self.loans
            .sort_by(|a, b| prio_cmp((a.mark, a.site), (b.mark, b.site)));
    }

    pub(super) fn forget_site(&mut self, site: NodeId) {
        self.queue.retain(|q| q.site != site);
        self.loans.retain(|q| q.site != site);
    }
}

/// §4.8 single-resource shortcut at the holder: the counter value is the request's mark; the
/// request is queued as if its `ReqRes` had arrived.
pub(super) fn queue_single(tok: &mut LjToken, init: NodeId, seq: u64) {
    let val = tok.take_counter(init, seq);
    if tok.acc_res[init] < seq {
        tok.enqueue(QEntry {
            site: init,
            seq,
            mark: Mark { sum: val, count: 1 },
        });
    }
}

/// How a token travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Transfer {
    /// Ownership moves to the receiver.
    Give,
    /// Lent by `lender` to the receiver's request number `seq`; `size` tokens make the loan.
    Loan {
        /// The lender.
        lender: NodeId,
        /// The borrower's request number.
        seq: u64,
        /// Number of tokens lent.
        size: usize,
    },
    /// A lent token going back to its lender.
    Return,
}
