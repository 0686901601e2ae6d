//! The multi-resource checker (issue #10 item 3).
//!
//! Fed every request, grant and release in virtual time, it judges:
//! - **exclusion per instance**: each resource instance has at most one holder at a time (so a
//!   type with `k` instances has at most `k` holders);
//! - **grant matches request**: a grant goes to a process with a pending, ungranted request and
//!   holds exactly the requested number of distinct instances of each requested type, nothing
//!   else;
//! - **fencing**: the fences handed out for one instance strictly increase;
//! - **token uniqueness** (checked by the driver with [`MultiViolation::TokenCount`]): for
//!   token algorithms, each instance has exactly one token, held or in flight;
//! - **liveness** (at the end of a run): every request was served; otherwise the driver reports a
//!   deadlock or a stall naming the waiting processes (see [`MultiVerdict`]).

use crate::error::MutexError;
use crate::node::{Fence, NodeId};

use super::model::{Hold, MultiRequest, ResourceId, ResourceSpace};

/// A safety violation of multi-resource allocation, with the virtual time it happened at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MultiViolation {
    /// An instance granted to a process while another holds it.
    #[error(
        "t={time}: instance {instance} of resource {resource} granted to {intruder} while {holder} holds it"
    )]
    Exclusion {
        /// Virtual time.
        time: u64,
        /// Resource type.
        resource: ResourceId,
        /// Instance.
        instance: u32,
        /// Current holder.
        holder: NodeId,
        /// Process granted in addition.
        intruder: NodeId,
    },
    /// A grant to a process without a pending request (or already granted).
    #[error("t={time}: spurious grant to {node}, which has no pending request")]
    SpuriousGrant {
        /// Virtual time.
        time: u64,
        /// Process.
        node: NodeId,
    },
    /// A grant whose instances do not match the request.
    #[error("t={time}: grant to {node} does not match its request: {detail}")]
    GrantMismatch {
        /// Virtual time.
        time: u64,
        /// Process.
        node: NodeId,
        /// What differs.
        detail: String,
    },
    /// A fence not above the previous fence of the same instance.
    #[error(
        "t={time}: fence {fence} of instance {instance} of resource {resource} (to {node}) does not exceed {previous}"
    )]
    FenceNotIncreasing {
        /// Virtual time.
        time: u64,
        /// Process.
        node: NodeId,
        /// Resource type.
        resource: ResourceId,
        /// Instance.
        instance: u32,
        /// The fence granted.
        fence: Fence,
        /// The previous fence of that instance.
        previous: Fence,
    },
    /// A release by a process not in its critical section.
    #[error("t={time}: release by {node}, which is not in its critical section")]
    SpuriousRelease {
        /// Virtual time.
        time: u64,
        /// Process.
        node: NodeId,
    },
    /// A resource instance with no token, or several, held or in flight (token algorithms).
    #[error(
        "t={time}: {count} tokens exist for instance {instance} of resource {resource} (held or in flight)"
    )]
    TokenCount {
        /// Virtual time.
        time: u64,
        /// Resource type.
        resource: ResourceId,
        /// Instance.
        instance: u32,
        /// Tokens counted.
        count: usize,
    },
    /// A message to a process outside the group.
    #[error("t={time}: {from} sent a message to unknown process {to}")]
    BadDestination {
        /// Virtual time.
        time: u64,
        /// Sender.
        from: NodeId,
        /// Destination.
        to: NodeId,
    },
}

/// The outcome of a multi-resource run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MultiVerdict {
    /// Every request was served and no property was violated.
    Ok,
    /// A safety property was violated.
    Violation(MultiViolation),
    /// Nothing is left to happen, yet these processes wait.
    Deadlock {
        /// Virtual time of the last event.
        time: u64,
        /// The waiting processes.
        waiting: Vec<NodeId>,
    },
    /// The time or event bound was hit with these processes waiting (starvation, livelock).
    Stall {
        /// Virtual time reached.
        time: u64,
        /// The waiting processes.
        waiting: Vec<NodeId>,
        /// Which bound.
        bound: &'static str,
    },
    /// A handler returned an error.
    NodeError {
        /// Virtual time.
        time: u64,
        /// Its error.
        error: MutexError,
    },
}

impl MultiVerdict {
    /// Whether the run passed every check.
    pub fn is_ok(&self) -> bool {
        matches!(self, Self::Ok)
    }
}

#[derive(Debug, Clone)]
enum Phase {
    Idle,
    Waiting(MultiRequest),
    InCs(Vec<Hold>),
}

/// The multi-resource property checker.
#[derive(Debug, Clone)]
pub struct MultiChecker {
    space: ResourceSpace,
    /// Per flat instance: current holder.
    holder: Vec<Option<NodeId>>,
    /// Per flat instance: last fence granted.
    last_fence: Vec<Option<Fence>>,
    phase: Vec<Phase>,
}

impl MultiChecker {
    /// A checker for `n` processes over `space`.
    pub fn new(n: usize, space: ResourceSpace) -> Self {
        let total = space.total_instances();
        Self {
            space,
            holder: vec![None; total],
            last_fence: vec![None; total],
            phase: vec![Phase::Idle; n],
        }
    }

    /// Process `node` issued `req` (the driver issues at most one request per process at a
    /// time, as both studies assume; an id out of range is ignored and later grants to it are
    /// reported as spurious).
    pub fn on_request(&mut self, node: NodeId, req: &MultiRequest) {
        if let Some(p) = self.phase.get_mut(node) {
            *p = Phase::Waiting(req.clone());
        }
    }

    /// Process `node` was granted `holds` at `time`.
    pub fn on_grant(
        &mut self,
        time: u64,
        node: NodeId,
        holds: &[Hold],
    ) -> Result<(), MultiViolation> {
        let Some(Phase::Waiting(req)) = self.phase.get(node) else {
            return Err(MultiViolation::SpuriousGrant { time, node });
        };
        let mismatch = |detail: String| MultiViolation::GrantMismatch { time, node, detail };
        let mut sorted: Vec<Hold> = holds.to_vec();
        sorted.sort_unstable();
        for w in sorted.windows(2) {
            if (w[0].resource, w[0].instance) == (w[1].resource, w[1].instance) {
                return Err(mismatch(format!(
                    "instance {} of resource {} granted twice",
                    w[0].instance, w[0].resource
                )));
            }
        }
        let mut counts: Vec<(ResourceId, u32)> = Vec::new();
        for h in &sorted {
            match counts.last_mut() {
                Some((r, c)) if *r == h.resource => *c += 1,
                _ => counts.push((h.resource, 1)),
            }
        }
        if counts != req.items() {
            return Err(mismatch(format!(
                "asked {:?}, granted {:?}",
                req.items(),
                counts
            )));
        }
        for h in &sorted {
            let Some(f) = self.space.flat(h.resource, h.instance) else {
                return Err(mismatch(format!(
                    "instance {} of resource {} does not exist",
                    h.instance, h.resource
                )));
            };
            if let Some(holder) = self.holder[f] {
                return Err(MultiViolation::Exclusion {
                    time,
                    resource: h.resource,
                    instance: h.instance,
                    holder,
                    intruder: node,
                });
            }
            if let Some(previous) = self.last_fence[f]
                && h.fence <= previous
            {
                return Err(MultiViolation::FenceNotIncreasing {
                    time,
                    node,
                    resource: h.resource,
                    instance: h.instance,
                    fence: h.fence,
                    previous,
                });
            }
        }
        for h in &sorted {
            if let Some(f) = self.space.flat(h.resource, h.instance) {
                self.holder[f] = Some(node);
                self.last_fence[f] = Some(h.fence);
            }
        }
        self.phase[node] = Phase::InCs(sorted);
        Ok(())
    }

    /// Process `node` left its critical section at `time`.
    pub fn on_release(&mut self, time: u64, node: NodeId) -> Result<(), MultiViolation> {
        let Some(Phase::InCs(holds)) = self.phase.get(node) else {
            return Err(MultiViolation::SpuriousRelease { time, node });
        };
        for h in holds {
            if let Some(f) = self.space.flat(h.resource, h.instance) {
                self.holder[f] = None;
            }
        }
        self.phase[node] = Phase::Idle;
        Ok(())
    }

    /// The processes whose request is pending (not yet granted).
    pub fn waiting(&self) -> Vec<NodeId> {
        self.phase
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p, Phase::Waiting(_)))
            .map(|(i, _)| i)
            .collect()
    }

    /// Number of instances currently held.
    pub fn held_instances(&self) -> usize {
        self.holder.iter().filter(|h| h.is_some()).count()
    }
}
