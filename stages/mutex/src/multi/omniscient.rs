//! The omniscient centralised scheduler: the reference curve of \[LJ\] §5 (spec §2.5).
//!
//! It sees every request the instant it is issued and every release the instant it happens, and
//! sends no message: its waiting times are pure contention, with zero synchronisation cost.
//!
//! **Policy \[D\]: FIFO with backfilling.** On every request and every release it scans the pending
//! requests in arrival order and grants each one whose resources are all available, taking the
//! lowest-numbered free instances of each type. A request that cannot be served does not block
//! later, smaller ones (backfilling); this maximises the use rate, at the price that a large
//! request can in principle be overtaken indefinitely under unbounded load. Runs here are finite
//! (every client issues a bounded number of requests), so every request is served and the
//! checker's liveness check applies. Fences: one counter per instance, incremented per grant.
//!
//! Backfilling is greedy, not optimal: in a closed loop (each process asks again after its
//! release) serving a small request first can leave resources idle later, so it is a
//! reference, not an upper bound on the use rate. [`Omniscient::strict_fifo`] is the spec's
//! alternative, strict FIFO without backfilling (the head blocks everything behind it), as a
//! second reference.

use serde::{Deserialize, Serialize};

use crate::error::MutexError;
use crate::node::{Fence, Message, NodeId, check_node};

use super::model::{Hold, MultiOutbox, MultiRequest, MultiSystem, ResourceSpace};

/// The omniscient scheduler sends no message; this type has no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NoMsg {}

impl Message for NoMsg {
    fn kind(&self) -> &'static str {
        match *self {}
    }
}

/// The omniscient centralised scheduler.
#[derive(Debug, Clone)]
pub struct Omniscient {
    n: usize,
    space: ResourceSpace,
    /// Per flat instance: whether it is free.
    free: Vec<bool>,
    /// Per flat instance: last fence granted.
    fences: Vec<Fence>,
    /// Pending requests in arrival order.
    pending: Vec<(NodeId, MultiRequest)>,
    /// Per process: what it holds (empty when not in its CS).
    held: Vec<Vec<Hold>>,
    requesting: Vec<bool>,
    /// Later requests may be served while an earlier one waits.
    backfill: bool,
}

impl Omniscient {
    /// A scheduler for `n` processes over `space`.
    pub fn new(n: usize, space: ResourceSpace) -> Result<Self, MutexError> {
        if n == 0 {
            return Err(MutexError::Config(
                "a group needs at least one process".into(),
            ));
        }
        let total = space.total_instances();
        Ok(Self {
            n,
            space,
            free: vec![true; total],
            fences: vec![0; total],
            pending: Vec::new(),
            held: vec![Vec::new(); n],
            requesting: vec![false; n],
            backfill: true,
        })
    }

    /// The same scheduler, strict FIFO: a request that cannot be served holds back every
    /// later one.
    pub fn strict_fifo(n: usize, space: ResourceSpace) -> Result<Self, MutexError> {
        Ok(Self {
            backfill: false,
            ..Self::new(n, space)?
        })
    }

    /// The free instances of `req`, lowest first per type, if all are available.
    fn fit(&self, req: &MultiRequest) -> Option<Vec<usize>> {
        let mut chosen = Vec::with_capacity(req.instances() as usize);
        for &(r, c) in req.items() {
            let before = chosen.len();
            for i in 0..self.space.capacity(r) {
                if chosen.len() - before == c as usize {
                    break;
                }
                if let Some(f) = self.space.flat(r, i)
                    && self.free[f]
                {
                    chosen.push(f);
                }
            }
            if chosen.len() - before < c as usize {
                return None;
            }
        }
        Some(chosen)
    }

    fn schedule(&mut self, out: &mut MultiOutbox<NoMsg>) {
        let mut i = 0;
        while i < self.pending.len() {
            match self.fit(&self.pending[i].1) {
                Some(flats) => {
                    let (node, _) = self.pending.remove(i);
                    let mut holds = Vec::with_capacity(flats.len());
                    for f in flats {
                        self.free[f] = false;
                        self.fences[f] += 1;
                        if let Some((resource, instance)) = self.space.unflat(f) {
                            holds.push(Hold {
                                resource,
                                instance,
                                fence: self.fences[f],
                            });
                        }
                    }
                    self.held[node] = holds.clone();
                    out.grant(node, holds);
                }
                None if self.backfill => i += 1,
                None => break,
            }
        }
    }
}

impl MultiSystem for Omniscient {
    type Msg = NoMsg;
    const NAME: &'static str = "omniscient";
    const REQUIRES_FIFO: bool = false;

    fn request(
        &mut self,
        node: NodeId,
        req: &MultiRequest,
        out: &mut MultiOutbox<NoMsg>,
    ) -> Result<(), MutexError> {
        check_node(node, self.n)?;
        if self.requesting[node] {
            return Err(MutexError::AlreadyRequesting { node });
        }
        self.requesting[node] = true;
        self.pending.push((node, req.clone()));
        self.schedule(out);
        Ok(())
    }

    fn release(&mut self, node: NodeId, out: &mut MultiOutbox<NoMsg>) -> Result<(), MutexError> {
        check_node(node, self.n)?;
        if !self.requesting[node] || self.held[node].is_empty() {
            return Err(MutexError::NotHolding { node });
        }
        for h in std::mem::take(&mut self.held[node]) {
            if let Some(f) = self.space.flat(h.resource, h.instance) {
                self.free[f] = true;
            }
        }
        self.requesting[node] = false;
        self.schedule(out);
        Ok(())
    }

    fn deliver(
        &mut self,
        _from: NodeId,
        _to: NodeId,
        msg: NoMsg,
        _out: &mut MultiOutbox<NoMsg>,
    ) -> Result<(), MutexError> {
        match msg {}
    }
}
