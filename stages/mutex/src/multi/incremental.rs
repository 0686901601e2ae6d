//! The incremental baseline (\[LJ\] §5, spec §2.4): one Naimi–Tréhel instance per resource
//! instance, locked one at a time in a global order.
//!
//! [`IncrementalNode`] is one process, a pure state machine (what a Leda stage will wrap);
//! [`Incremental`] is the group of `n` of them seen by the driver. Every process runs, for every
//! resource instance, its own [`NaimiTrehel`] node (the unmodified
//! single-resource state machine of [`crate::algo::naimi_trehel`]); a message carries the index
//! of the instance it belongs to. A request is turned into a **lock plan**, a list of instances,
//! and the process asks for them one at a time, asking for the next only once the previous is
//! granted; it enters its CS when it holds all of them and releases each through its instance.
//!
//! Decisions \[D\]:
//! - **Global order:** increasing flat instance index (type-major, then instance number), the
//!   "increasing resource index" reading of the spec. Any two processes then lock the instances
//!   they share in the same order, so no wait-for cycle can form: deadlock-free by ordering. It
//!   is subject to the domino effect (a process holds early resources while waiting for later
//!   ones), which is what this baseline is meant to show.
//! - **Multi-instance requests:** a request for `c` of the `k` instances of a type locks the
//!   specific instances `(id + j) mod k`, `j = 0..c` (spreading processes over instances). The
//!   incremental algorithm cannot exploit that instances are interchangeable: a process may wait
//!   for its instance while another is free. Correct and deadlock-free, not efficient.
//! - **Initial tokens:** the token of flat instance `t` starts at process `t mod n`.
//! - **Fences:** each instance's Naimi–Tréhel token counter (strictly increasing per instance).
//! - **Broken variant** ([`LockOrder::Alternating`]): odd processes lock in *decreasing* order.
//!   Two processes can then each hold what the other waits for; it exists so that tests show the
//!   checker reporting that deadlock. Never use it otherwise.
//! - Naimi–Tréhel does not need FIFO links, so neither does this.

use serde::{Deserialize, Serialize};

use crate::algo::naimi_trehel::{NaimiTrehel, NaimiTrehelConfig, NaimiTrehelMsg};
use crate::error::MutexError;
use crate::node::{Message, MutexNode, NodeId, Outbox, Output, check_node, protocol};

use super::model::{Hold, MultiOutbox, MultiRequest, MultiSystem, ResourceSpace};

/// The order in which a process locks its resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LockOrder {
    /// Increasing flat instance index for every process (the algorithm).
    #[default]
    Global,
    /// **Deliberately broken**: even processes lock in increasing order, odd ones in decreasing
    /// order. Can deadlock; for checker tests only.
    Alternating,
}

/// Configuration of the incremental algorithm.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IncrementalConfig {
    /// Lock order.
    pub order: LockOrder,
}

/// A message of the incremental algorithm: a Naimi–Tréhel message of one instance's lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncrementalMsg {
    /// Flat index of the resource instance whose lock this message belongs to.
    pub lock: usize,
    /// The Naimi–Tréhel message.
    pub inner: NaimiTrehelMsg,
}

impl Message for IncrementalMsg {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn is_token(&self) -> bool {
        self.inner.is_token()
    }
}

/// One process of the incremental algorithm: a pure state machine (no I/O, no clock).
#[derive(Debug, Clone)]
pub struct IncrementalNode {
    id: NodeId,
    n: usize,
    space: ResourceSpace,
    order: LockOrder,
    /// One Naimi–Tréhel node per flat resource instance.
    locks: Vec<NaimiTrehel>,
    /// The instances of the current request, in locking order.
    plan: Vec<usize>,
    /// Index in `plan` of the lock being acquired.
    next: usize,
    /// Instances held so far, with fences.
    holds: Vec<Hold>,
    requesting: bool,
    in_cs: bool,
    inner: Outbox<NaimiTrehelMsg>,
}

impl IncrementalNode {
    /// Process `id` of a group of `n` over `space`.
    pub fn new(
        id: NodeId,
        n: usize,
        space: ResourceSpace,
        config: &IncrementalConfig,
    ) -> Result<Self, MutexError> {
        let locks = (0..space.total_instances())
            .map(|t| {
                NaimiTrehel::new(
                    id,
                    n,
                    &NaimiTrehelConfig {
                        initial_holder: t % n.max(1),
                    },
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        if locks.is_empty() {
            return Err(MutexError::Config("no resource instance".into()));
        }
        Ok(Self {
            id,
            n,
            space,
            order: config.order,
            locks,
            plan: Vec::new(),
            next: 0,
            holds: Vec::new(),
            requesting: false,
            in_cs: false,
            inner: Outbox::new(),
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

    /// Whether this process holds the token of flat instance `t`.
    pub fn holds_token(&self, t: usize) -> bool {
        self.locks.get(t).is_some_and(NaimiTrehel::holds_token)
    }

    /// The lock plan of `req`.
    fn plan(&self, req: &MultiRequest) -> Vec<usize> {
        let mut plan = Vec::with_capacity(req.instances() as usize);
        for &(r, c) in req.items() {
            let k = self.space.capacity(r);
            for j in 0..c {
                let i = ((self.id as u64 + u64::from(j)) % u64::from(k.max(1))) as u32;
                if let Some(f) = self.space.flat(r, i) {
                    plan.push(f);
                }
            }
        }
        plan.sort_unstable();
        if self.order == LockOrder::Alternating && self.id % 2 == 1 {
            plan.reverse();
        }
        plan
    }

    /// Runs one Naimi–Tréhel handler of lock `lock`, forwards its messages and returns the fence
    /// if it granted.
    fn step(
        &mut self,
        lock: usize,
        out: &mut MultiOutbox<IncrementalMsg>,
        f: impl FnOnce(&mut NaimiTrehel, &mut Outbox<NaimiTrehelMsg>) -> Result<(), MutexError>,
    ) -> Result<Option<u64>, MutexError> {
        let nt = self
            .locks
            .get_mut(lock)
            .ok_or_else(|| protocol(self.id, format!("message for unknown lock {lock}")))?;
        f(nt, &mut self.inner)?;
        let mut granted = None;
        for o in self.inner.drain() {
            match o {
                Output::Send { to, msg } => {
                    out.send(self.id, to, IncrementalMsg { lock, inner: msg })
                }
                Output::Grant { fence } => granted = Some(fence),
                Output::Local { .. } => {}
            }
        }
        Ok(granted)
    }

    /// Records that lock `plan[next]` was granted with `fence`, then asks for the following
    /// locks, as long as they are granted at once; grants the CS when all are held.
    fn acquired(
        &mut self,
        fence: u64,
        out: &mut MultiOutbox<IncrementalMsg>,
    ) -> Result<(), MutexError> {
        let mut fence = Some(fence);
        while let Some(f) = fence {
            let lock = self.plan[self.next];
            let (resource, instance) = self
                .space
                .unflat(lock)
                .ok_or_else(|| protocol(self.id, "lock outside the resource space"))?;
            self.holds.push(Hold {
                resource,
                instance,
                fence: f,
            });
            self.next += 1;
            if self.next == self.plan.len() {
                self.in_cs = true;
                out.grant(self.id, self.holds.clone());
                return Ok(());
            }
            let lock = self.plan[self.next];
            fence = self.step(lock, out, |nt, o| nt.on_request(o))?;
        }
        Ok(())
    }

    /// The local application asks for `req`.
    pub fn on_request(
        &mut self,
        req: &MultiRequest,
        out: &mut MultiOutbox<IncrementalMsg>,
    ) -> Result<(), MutexError> {
        if self.requesting {
            return Err(MutexError::AlreadyRequesting { node: self.id });
        }
        let plan = self.plan(req);
        let first = *plan
            .first()
            .ok_or_else(|| MutexError::Config("empty request".into()))?;
        self.plan = plan;
        self.next = 0;
        self.holds.clear();
        self.requesting = true;
        if let Some(fence) = self.step(first, out, |nt, o| nt.on_request(o))? {
            self.acquired(fence, out)?;
        }
        Ok(())
    }

    /// The local application leaves its critical section: every lock is released.
    pub fn on_release(&mut self, out: &mut MultiOutbox<IncrementalMsg>) -> Result<(), MutexError> {
        if !self.in_cs {
            return Err(MutexError::NotHolding { node: self.id });
        }
        let plan = std::mem::take(&mut self.plan);
        for &lock in &plan {
            if self.step(lock, out, |nt, o| nt.on_release(o))?.is_some() {
                return Err(protocol(self.id, "grant on release"));
            }
        }
        self.holds.clear();
        self.next = 0;
        self.requesting = false;
        self.in_cs = false;
        Ok(())
    }

    /// A message from `from` arrived.
    pub fn on_message(
        &mut self,
        from: NodeId,
        msg: IncrementalMsg,
        out: &mut MultiOutbox<IncrementalMsg>,
    ) -> Result<(), MutexError> {
        check_node(from, self.n)?;
        let lock = msg.lock;
        if let Some(fence) = self.step(lock, out, |nt, o| nt.on_message(from, msg.inner, o))? {
            if self.in_cs || self.plan.get(self.next) != Some(&lock) {
                return Err(protocol(
                    self.id,
                    format!("grant of lock {lock} out of plan"),
                ));
            }
            self.acquired(fence, out)?;
        }
        Ok(())
    }
}

/// The incremental algorithm for a group of `n` processes: `n` independent
/// [`IncrementalNode`]s, each handler touching one of them.
#[derive(Debug, Clone)]
pub struct Incremental {
    nodes: Vec<IncrementalNode>,
}

impl Incremental {
    /// Builds the `n` processes over `space`.
    pub fn new(
        n: usize,
        space: ResourceSpace,
        config: IncrementalConfig,
    ) -> Result<Self, MutexError> {
        if n == 0 {
            return Err(MutexError::Config(
                "a group needs at least one process".into(),
            ));
        }
        let nodes = (0..n)
            .map(|id| IncrementalNode::new(id, n, space.clone(), &config))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { nodes })
    }

    /// The processes.
    pub fn nodes(&self) -> &[IncrementalNode] {
        &self.nodes
    }

    fn node(&mut self, id: NodeId) -> Result<&mut IncrementalNode, MutexError> {
        let n = self.nodes.len();
        self.nodes
            .get_mut(id)
            .ok_or(MutexError::UnknownNode { node: id, n })
    }
}

impl MultiSystem for Incremental {
    type Msg = IncrementalMsg;
    const NAME: &'static str = "incremental";
    const REQUIRES_FIFO: bool = false;

    fn token_instance(msg: &IncrementalMsg) -> Option<usize> {
        msg.is_token().then_some(msg.lock)
    }

    fn tokens_held(&self) -> Option<Vec<usize>> {
        let total = self.nodes.first().map_or(0, |p| p.locks.len());
        let mut held = vec![0; total];
        for p in &self.nodes {
            for (t, h) in held.iter_mut().enumerate() {
                *h += usize::from(p.holds_token(t));
            }
        }
        Some(held)
    }

    fn request(
        &mut self,
        node: NodeId,
        req: &MultiRequest,
        out: &mut MultiOutbox<IncrementalMsg>,
    ) -> Result<(), MutexError> {
        self.node(node)?.on_request(req, out)
    }

    fn release(
        &mut self,
        node: NodeId,
        out: &mut MultiOutbox<IncrementalMsg>,
    ) -> Result<(), MutexError> {
        self.node(node)?.on_release(out)
    }

    fn deliver(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: IncrementalMsg,
        out: &mut MultiOutbox<IncrementalMsg>,
    ) -> Result<(), MutexError> {
        self.node(to)?.on_message(from, msg, out)
    }
}
