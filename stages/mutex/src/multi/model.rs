//! The multi-resource model: resource types with `k` instances each, requests naming a count per
//! type, grants listing the instances held with their fences, and the [`MultiSystem`] interface
//! the simulation driver talks to.
//!
//! The single-instance problem of \[LJ\] (M resources, one instance each) is the special case
//! [`ResourceSpace::single`]; a request for a set of resources is [`MultiRequest::set`].

use crate::error::MutexError;
use crate::node::{Fence, Message, NodeId};

/// A resource type, `0..m`.
pub type ResourceId = usize;

/// The resources of a group: resource type `r` has `capacities[r]` equivalent instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceSpace {
    capacities: Vec<u32>,
    /// `offsets[r]`: flat index of instance 0 of type `r`.
    offsets: Vec<usize>,
}

impl ResourceSpace {
    /// `m` resources with one instance each (\[LJ\]).
    pub fn single(m: usize) -> Result<Self, MutexError> {
        Self::with_capacities(vec![1; m])
    }

    /// Resource types with the given numbers of instances (\[VN\]).
    pub fn with_capacities(capacities: Vec<u32>) -> Result<Self, MutexError> {
        if capacities.is_empty() {
            return Err(MutexError::Config("at least one resource is needed".into()));
        }
        if let Some(r) = capacities.iter().position(|&k| k == 0) {
            return Err(MutexError::Config(format!(
                "resource {r} has zero instances"
            )));
        }
        let mut offsets = Vec::with_capacity(capacities.len());
        let mut acc = 0usize;
        for &k in &capacities {
            offsets.push(acc);
            acc += k as usize;
        }
        Ok(Self {
            capacities,
            offsets,
        })
    }

    /// Number of resource types.
    pub fn types(&self) -> usize {
        self.capacities.len()
    }

    /// Number of instances of type `r` (0 for an unknown type).
    pub fn capacity(&self, r: ResourceId) -> u32 {
        self.capacities.get(r).copied().unwrap_or(0)
    }

    /// The instance counts of every type.
    pub fn capacities(&self) -> &[u32] {
        &self.capacities
    }

    /// Total number of instances over all types.
    pub fn total_instances(&self) -> usize {
        self.capacities.iter().map(|&k| k as usize).sum()
    }

    /// Flat index (`0..total_instances`) of instance `i` of type `r`, in the global order
    /// (type-major, then instance), or `None` if out of range.
    pub fn flat(&self, r: ResourceId, i: u32) -> Option<usize> {
        (i < self.capacity(r)).then(|| self.offsets[r] + i as usize)
    }

    /// The `(type, instance)` of a flat index, or `None` if out of range.
    pub fn unflat(&self, flat: usize) -> Option<(ResourceId, u32)> {
        if flat >= self.total_instances() {
            return None;
        }
        let r = self.offsets.partition_point(|&o| o <= flat) - 1;
        Some((r, (flat - self.offsets[r]) as u32))
    }
}

/// A request: how many instances of which types, sorted by type, each type once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MultiRequest {
    items: Vec<(ResourceId, u32)>,
}

impl MultiRequest {
    /// A request for `count` instances of each listed type. Fails on an empty request, an
    /// unknown type, a type listed twice, or a count of 0 or above the type's capacity.
    pub fn new(
        mut items: Vec<(ResourceId, u32)>,
        space: &ResourceSpace,
    ) -> Result<Self, MutexError> {
        if items.is_empty() {
            return Err(MutexError::Config("a request names no resource".into()));
        }
        items.sort_unstable();
        for w in items.windows(2) {
            if w[0].0 == w[1].0 {
                return Err(MutexError::Config(format!(
                    "resource {} is named twice in one request",
                    w[0].0
                )));
            }
        }
        for &(r, c) in &items {
            if r >= space.types() {
                return Err(MutexError::UnknownResource(r.to_string()));
            }
            if c == 0 || c > space.capacity(r) {
                return Err(MutexError::Config(format!(
                    "request for {c} instances of resource {r}, which has {}",
                    space.capacity(r)
                )));
            }
        }
        Ok(Self { items })
    }

    /// A request for one instance of each resource in `resources` (the single-instance form).
    pub fn set(
        resources: impl IntoIterator<Item = ResourceId>,
        space: &ResourceSpace,
    ) -> Result<Self, MutexError> {
        Self::new(resources.into_iter().map(|r| (r, 1)).collect(), space)
    }

    /// `(type, count)` pairs, sorted by type.
    pub fn items(&self) -> &[(ResourceId, u32)] {
        &self.items
    }

    /// Number of resource types named (the request "size" of \[LJ\]).
    pub fn size(&self) -> usize {
        self.items.len()
    }

    /// Total number of instances asked for.
    pub fn instances(&self) -> u32 {
        self.items.iter().map(|&(_, c)| c).sum()
    }
}

/// One resource instance held by a grant, with its fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hold {
    /// The resource type.
    pub resource: ResourceId,
    /// Which instance of it (`0..k`).
    pub instance: u32,
    /// The fence of this grant of this instance; strictly increasing per instance.
    pub fence: Fence,
}

/// One effect of a [`MultiSystem`] handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MultiOutput<M> {
    /// Node `from` sends `msg` to node `to`.
    Send {
        /// Sender.
        from: NodeId,
        /// Destination.
        to: NodeId,
        /// The message.
        msg: M,
    },
    /// Node `node` may enter its critical section holding `holds`.
    Grant {
        /// The process granted.
        node: NodeId,
        /// Every instance it now holds, with fences.
        holds: Vec<Hold>,
    },
}

/// The buffer [`MultiSystem`] handlers write their outputs into.
#[derive(Debug, Clone)]
pub struct MultiOutbox<M> {
    items: Vec<MultiOutput<M>>,
}

impl<M> Default for MultiOutbox<M> {
    fn default() -> Self {
        Self { items: Vec::new() }
    }
}

impl<M> MultiOutbox<M> {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a message.
    pub fn send(&mut self, from: NodeId, to: NodeId, msg: M) {
        self.items.push(MultiOutput::Send { from, to, msg });
    }

    /// Queues a grant.
    pub fn grant(&mut self, node: NodeId, holds: Vec<Hold>) {
        self.items.push(MultiOutput::Grant { node, holds });
    }

    /// The outputs queued so far.
    pub fn as_slice(&self) -> &[MultiOutput<M>] {
        &self.items
    }

    /// Removes and yields all queued outputs, in order.
    pub fn drain(&mut self) -> std::vec::Drain<'_, MultiOutput<M>> {
        self.items.drain(..)
    }
}

/// A multi-resource allocation algorithm seen from the driver: the whole group of `n`
/// processes. Distributed algorithms are `n` pure per-process state machines behind this
/// interface (each handler touches one process only and talks to others by messages); the
/// omniscient reference is one centralised scheduler that sends no message.
///
/// Handlers return `Err` only for inputs the protocol cannot produce (a second pending request,
/// a release without a grant, an impossible message).
pub trait MultiSystem {
    /// The message type (an uninhabited type for message-free schedulers).
    type Msg: Message;
    /// The algorithm's name.
    const NAME: &'static str;
    /// Whether the algorithm needs FIFO channels.
    const REQUIRES_FIFO: bool;

    /// Process `node` asks for `req`; a [`MultiOutput::Grant`] follows now or later.
    fn request(
        &mut self,
        node: NodeId,
        req: &MultiRequest,
        out: &mut MultiOutbox<Self::Msg>,
    ) -> Result<(), MutexError>;

    /// Process `node` leaves its critical section and releases everything it holds.
    fn release(&mut self, node: NodeId, out: &mut MultiOutbox<Self::Msg>)
    -> Result<(), MutexError>;

    /// For token algorithms: the flat resource instance ([`ResourceSpace::flat`]) whose token
    /// `msg` carries, if it carries one. Default: none.
    fn token_instance(msg: &Self::Msg) -> Option<usize> {
        let _ = msg;
        None
    }

    /// For token algorithms: per flat resource instance, how many processes hold its token now
    /// (the driver adds the tokens in flight and checks the total is one). Default: `None`, not
    /// token based.
    fn tokens_held(&self) -> Option<Vec<usize>> {
        None
    }

    /// How many preemptions the algorithm has made so far (loans for \[LJ\], CT preemptions for
    /// \[VN\]); the driver copies it into [`super::sim::MultiStats::preemptions`]. Default: 0.
    fn preemptions(&self) -> u64 {
        0
    }

    /// A message from `from` reaches `to`.
    fn deliver(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: Self::Msg,
        out: &mut MultiOutbox<Self::Msg>,
    ) -> Result<(), MutexError>;
}
