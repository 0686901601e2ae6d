//! Typed errors returned by the state machines and the simulator.

use crate::node::NodeId;

/// Everything that can go wrong when driving a mutual-exclusion state machine.
///
/// Errors are returned for inputs that a wrapper (a Leda stage, the simulator) could feed in
/// from outside: a malformed configuration, a message from an unknown node, a release without a
/// grant, or a message that the protocol forbids in the current state. A correct run of a correct
/// algorithm never produces one; the simulator reports any error as a failed run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MutexError {
    /// The configuration handed to a constructor is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A node id outside `0..n` was named (as a peer, a message sender or in a config).
    #[error("node {node} is out of range for a group of {n} nodes")]
    UnknownNode {
        /// The offending id.
        node: NodeId,
        /// The group size.
        n: usize,
    },
    /// `on_request` was called while a previous request is still pending or being served.
    #[error("node {node}: request while a request is already pending or in the critical section")]
    AlreadyRequesting {
        /// The node that got the duplicate request.
        node: NodeId,
    },
    /// `on_release` was called although the node was not granted the critical section.
    #[error("node {node}: release without holding the critical section")]
    NotHolding {
        /// The node that got the spurious release.
        node: NodeId,
    },
    /// A message arrived that the protocol cannot produce in the receiver's current state.
    #[error("node {node}: protocol violation: {detail}")]
    Protocol {
        /// The receiving node.
        node: NodeId,
        /// What was unexpected.
        detail: String,
    },
    /// A timer fired that the state machine never set (none of the classic algorithms sets one).
    #[error("node {node}: unknown timer {timer}")]
    UnknownTimer {
        /// The node that got the timer.
        node: NodeId,
        /// The timer id.
        timer: u64,
    },
    /// The algorithm assumes failure-free processes and cannot handle a failure notice.
    #[error("node {node}: {algorithm} does not tolerate the failure of node {failed}")]
    FailureNotTolerated {
        /// The node that got the notice.
        node: NodeId,
        /// The node reported as failed.
        failed: NodeId,
        /// The algorithm's name.
        algorithm: &'static str,
    },
    /// A message could not be turned into a dynamic value (or back).
    #[error("message encoding failed: {0}")]
    Encoding(String),
    /// A request named a resource the group was not configured with.
    #[error("unknown resource {0:?}")]
    UnknownResource(String),
}
