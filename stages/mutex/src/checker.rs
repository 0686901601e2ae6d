//! The property checker used by the simulator (spec §16, issue item 3).
//!
//! It is fed every grant and release as they happen in virtual time and, for token algorithms, the
//! number of tokens in existence after every event. It judges:
//! - **mutual exclusion** at every virtual instant: a grant while another node holds the CS (of
//!   the single resource these algorithms protect) is a violation;
//! - **no spurious grant**: a grant to a node that did not ask, or asked and was already granted;
//! - **fencing**: the fences of successive grants strictly increase;
//! - **token uniqueness** (token algorithms): never more than one token (held or in flight), and
//!   never none unless a token message was deliberately dropped by fault injection;
//! - **liveness**: at the end of a run, every request was granted; otherwise the run is a
//!   [`Verdict::Deadlock`] (nothing left to happen, naming the stuck nodes) or a
//!   [`Verdict::Stall`] (the virtual-time or event bound was hit, naming the stuck nodes; this
//!   covers starvation and livelock, and deadlock of algorithms whose token circulates idly).

use std::fmt;

use crate::error::MutexError;
use crate::node::{Fence, NodeId};

/// A safety violation, with the virtual time at which it happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// Two nodes in the CS at once.
    #[error(
        "t={time}: mutual exclusion violated: node {intruder} granted while node {holder} holds the CS"
    )]
    MutualExclusion {
        /// Virtual time.
        time: u64,
        /// The node already in the CS.
        holder: NodeId,
        /// The node granted in addition.
        intruder: NodeId,
    },
    /// A grant to a node that had no pending request.
    #[error("t={time}: spurious grant to node {node}, which has no pending request")]
    SpuriousGrant {
        /// Virtual time.
        time: u64,
        /// The node granted.
        node: NodeId,
    },
    /// A fence that does not exceed the previous grant's fence.
    #[error(
        "t={time}: fence {fence} granted to node {node} does not exceed the previous fence {previous}"
    )]
    FenceNotIncreasing {
        /// Virtual time.
        time: u64,
        /// The node granted.
        node: NodeId,
        /// Its fence.
        fence: Fence,
        /// The previous grant's fence.
        previous: Fence,
    },
    /// More than one token exists.
    #[error("t={time}: {count} tokens exist (held or in flight)")]
    TokenDuplicated {
        /// Virtual time.
        time: u64,
        /// Tokens counted.
        count: usize,
    },
    /// The token vanished although no token message was dropped.
    #[error("t={time}: no token exists, and none was dropped")]
    TokenVanished {
        /// Virtual time.
        time: u64,
    },
    /// A message addressed to a node outside the group.
    #[error("t={time}: node {from} sent a message to unknown node {to}")]
    BadDestination {
        /// Virtual time.
        time: u64,
        /// Sender.
        from: NodeId,
        /// Destination.
        to: NodeId,
    },
}

/// The outcome of a simulated run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every request was granted, and no property was violated.
    Ok,
    /// A safety property was violated.
    Violation(Violation),
    /// No event is left to process, yet these nodes wait for the CS.
    Deadlock {
        /// Virtual time of the last event.
        time: u64,
        /// The nodes still waiting.
        waiting: Vec<NodeId>,
    },
    /// The virtual-time or event bound was reached with these nodes still waiting (or yet to
    /// issue their requests).
    Stall {
        /// Virtual time reached.
        time: u64,
        /// The nodes waiting for the CS at that point.
        waiting: Vec<NodeId>,
        /// Which bound was hit.
        bound: &'static str,
    },
    /// A node's handler returned an error.
    NodeError {
        /// Virtual time.
        time: u64,
        /// The node.
        node: NodeId,
        /// Its error.
        error: MutexError,
    },
}

impl Verdict {
    /// Whether the run passed every check.
    pub fn is_ok(&self) -> bool {
        matches!(self, Verdict::Ok)
    }

    /// Whether the run ended in a deadlock (or a stall, which for a circulating-token algorithm is
    /// how a deadlock shows).
    pub fn is_liveness_failure(&self) -> bool {
        matches!(self, Verdict::Deadlock { .. } | Verdict::Stall { .. })
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Ok => write!(f, "ok"),
            Verdict::Violation(v) => write!(f, "safety violation: {v}"),
            Verdict::Deadlock { time, waiting } => {
                write!(f, "deadlock at t={time}: nodes {waiting:?} wait for ever")
            }
            Verdict::Stall {
                time,
                waiting,
                bound,
            } => {
                write!(
                    f,
                    "stall: {bound} reached at t={time} with nodes {waiting:?} waiting"
                )
            }
            Verdict::NodeError { time, node, error } => {
                write!(f, "t={time}: node {node} failed: {error}")
            }
        }
    }
}

/// Incremental safety checker for one resource.
#[derive(Debug, Clone, Default)]
pub struct Checker {
    holder: Option<NodeId>,
    last_fence: Option<Fence>,
    /// The last fence before the current holder's grant (see [`Checker::on_crash`]).
    fence_before_holder: Option<Fence>,
}

impl Checker {
    /// A checker with nobody in the CS.
    pub fn new() -> Self {
        Self::default()
    }

    /// The node currently in the CS, if any.
    pub fn holder(&self) -> Option<NodeId> {
        self.holder
    }

    /// Records a grant to `node` with `fence`; `was_waiting` tells whether `node` had a pending,
    /// not yet granted request.
    pub fn on_grant(
        &mut self,
        time: u64,
        node: NodeId,
        fence: Fence,
        was_waiting: bool,
    ) -> Result<(), Violation> {
        if !was_waiting {
            return Err(Violation::SpuriousGrant { time, node });
        }
        if let Some(holder) = self.holder {
            return Err(Violation::MutualExclusion {
                time,
                holder,
                intruder: node,
            });
        }
        if let Some(previous) = self.last_fence
            && fence <= previous
        {
            return Err(Violation::FenceNotIncreasing {
                time,
                node,
                fence,
                previous,
            });
        }
        self.holder = Some(node);
        self.fence_before_holder = self.last_fence;
        self.last_fence = Some(fence);
        Ok(())
    }

    /// Records that `node` crashed (crash-stop). If it held the CS it leaves it, and its grant's
    /// fence is forgotten: a crashed holder never uses its fence again, and it could not tell
    /// anyone its value, so the next grant only has to exceed the fences of holders that did
    /// not crash inside the CS. Nothing else is relaxed.
    pub fn on_crash(&mut self, node: NodeId) {
        if self.holder == Some(node) {
            self.holder = None;
            self.last_fence = self.fence_before_holder;
        }
    }

    /// Records that `node` left the CS.
    pub fn on_release(&mut self, node: NodeId) {
        if self.holder == Some(node) {
            self.holder = None;
        }
    }

    /// Checks token uniqueness: `count` tokens exist (held or in flight) and `dropped` token
    /// messages were dropped by fault injection so far.
    pub fn check_tokens(&self, time: u64, count: usize, dropped: u64) -> Result<(), Violation> {
        if count > 1 {
            Err(Violation::TokenDuplicated { time, count })
        } else if count == 0 && dropped == 0 {
            Err(Violation::TokenVanished { time })
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_overlap_fence_and_spurious_grants() {
        let mut c = Checker::new();
        assert!(c.on_grant(1, 0, 5, true).is_ok());
        assert_eq!(
            c.on_grant(2, 1, 6, true),
            Err(Violation::MutualExclusion {
                time: 2,
                holder: 0,
                intruder: 1
            })
        );
        c.on_release(0);
        assert!(matches!(
            c.on_grant(3, 1, 5, true),
            Err(Violation::FenceNotIncreasing { .. })
        ));
        assert!(matches!(
            c.on_grant(3, 1, 9, false),
            Err(Violation::SpuriousGrant { .. })
        ));
        assert!(c.on_grant(3, 1, 6, true).is_ok());
    }

    #[test]
    fn a_crashed_holder_leaves_and_its_fence_is_forgotten() {
        let mut c = Checker::new();
        assert!(c.on_grant(1, 0, 5, true).is_ok());
        c.on_release(0);
        assert!(c.on_grant(2, 1, 7, true).is_ok());
        c.on_crash(2); // not the holder: nothing changes
        assert_eq!(c.holder(), Some(1));
        c.on_crash(1);
        assert_eq!(c.holder(), None);
        assert!(c.on_grant(3, 2, 6, true).is_ok()); // above 5, the last surviving fence
        assert!(matches!(
            c.clone().on_grant(4, 3, 6, true),
            Err(Violation::MutualExclusion { .. })
        ));
        c.on_release(2);
        assert!(matches!(
            c.on_grant(4, 3, 6, true),
            Err(Violation::FenceNotIncreasing { .. })
        ));
    }

    #[test]
    fn token_rules() {
        let c = Checker::new();
        assert!(c.check_tokens(0, 1, 0).is_ok());
        assert!(c.check_tokens(0, 2, 0).is_err());
        assert!(c.check_tokens(0, 0, 0).is_err());
        assert!(c.check_tokens(0, 0, 1).is_ok());
        assert!(c.check_tokens(0, 2, 1).is_err());
    }
}
