//! Loans (spec §4.7, handlers H6 and H7): when a waiting site lacks only a few
//! resources, it asks their holders to lend them; a holder that is itself waiting and
//! owns everything the borrower misses lends. The node's other handlers are in the
//! parent module; this one only decides and sends loans.

use super::msg::LjMsg;
use super::token::{LoanEntry, Mark, Transfer, before, prio_cmp};
use super::{LjNode, LjState};
use crate::multi::model::MultiOutbox;
use crate::node::NodeId;

impl LjNode {
    /// H6 conditions (a)–(e) for lending `missing` to `(mark, site)`.
    pub(super) fn loan_possible(&self, site: NodeId, mark: Mark, missing: &[usize]) -> bool {
        self.config.loan
            && site != self.id
            && self.state == LjState::WaitCs
            && !missing.is_empty()
            && missing
                .iter()
                .all(|r| self.owned.contains_key(r) && self.requires(*r))
            && self.borrowed.is_empty()
            && self.lent.is_empty()
            && (!self.loan_asked || self.my_prio().is_some_and(|me| before((mark, site), me)))
    }

    pub(super) fn lend(&mut self, e: &LoanEntry, out: &mut MultiOutbox<LjMsg>) {
        let size = e.missing.len();
        for &r in &e.missing {
            if let Some(tok) = self.owned.get_mut(&r) {
                tok.acc_loan[e.site] = tok.acc_loan[e.site].max(e.seq);
                tok.loans.retain(|l| l.site != e.site);
            }
            self.lent.insert(r);
            self.send_token(
                r,
                e.site,
                Transfer::Loan {
                    lender: self.id,
                    seq: e.seq,
                    size,
                },
                out,
            );
        }
        self.lent_to = Some(e.site);
        self.loans_granted += 1;
    }

    /// Serves the first possible pending loan request of the owned tokens.
    pub(super) fn serve_loans(&mut self, out: &mut MultiOutbox<LjMsg>) {
        if !self.config.loan || self.state != LjState::WaitCs || !self.lent.is_empty() {
            return;
        }
        let mut candidates: Vec<LoanEntry> = Vec::new();
        for (&r, tok) in &mut self.owned {
            if self.borrowed.contains(&r) {
                continue;
            }
            let accounted = &tok.acc_loan;
            tok.loans.retain(|l| accounted[l.site] < l.seq);
            candidates.extend(tok.loans.iter().cloned());
        }
        candidates.sort_by(|a, b| prio_cmp((a.mark, a.site), (b.mark, b.site)));
        if let Some(e) = candidates
            .into_iter()
            .find(|e| self.loan_possible(e.site, e.mark, &e.missing))
        {
            self.lend(&e, out);
        }
    }

    /// H7: ask for a loan when few resources are missing.
    pub(super) fn maybe_ask_loan(&mut self, out: &mut MultiOutbox<LjMsg>) {
        if !self.config.loan
            || self.state != LjState::WaitCs
            || self.loan_asked
            || !self.borrowed.is_empty()
            || !self.lent.is_empty()
        {
            return;
        }
        let Some(mark) = self.mark else { return };
        let missing: Vec<usize> = self
            .required
            .iter()
            .copied()
            .filter(|r| !self.owned.contains_key(r))
            .collect();
        if missing.is_empty() || missing.len() > self.config.loan_threshold {
            return;
        }
        self.loan_asked = true;
        for &r in &missing {
            if self.father[r] == self.id {
                continue;
            }
            let msg = LjMsg::ReqLoan {
                r,
                init: self.id,
                seq: self.seq,
                mark,
                missing: missing.clone(),
                visited: vec![self.id],
            };
            out.send(self.id, self.father[r], msg);
        }
    }
}
