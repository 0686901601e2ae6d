//! The common interface of every mutual-exclusion algorithm: a pure, reactive state machine.
//!
//! A node never does I/O and never reads a clock. Its inputs are the five events of the issue
//! (a local request, a local release, a message, a timer, a failure notice) plus a start event;
//! its outputs are written into an [`Outbox`]: messages to peers and grants to the local
//! application. Each handler runs atomically, as the spec's reactive clauses require (§2).
//!
//! The same state machines are driven by the in-crate simulator ([`crate::sim`]) and, later, by
//! Leda stages over the real network; nothing here depends on which.

use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::MutexError;

/// A process id, `0..n`.
pub type NodeId = usize;

/// A fencing token handed out with every grant. For one resource, the fences of successive
/// grants are strictly increasing; each algorithm module documents how it guarantees that.
pub type Fence = u64;

/// A protocol message. Messages are plain serde data so they can travel as msgpack.
pub trait Message: Clone + Debug + Serialize + DeserializeOwned + Send + 'static {
    /// A short, stable name of the message type (`"request"`, `"token"`, ...), used to count
    /// messages per type.
    fn kind(&self) -> &'static str;

    /// Whether this message carries the unique mutual-exclusion token (token algorithms only).
    /// The checker uses it to verify token uniqueness.
    fn is_token(&self) -> bool {
        false
    }
}

/// One effect of a handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output<M> {
    /// Send `msg` to node `to`.
    Send {
        /// Destination node.
        to: NodeId,
        /// The message.
        msg: M,
    },
    /// A message of kind `kind` the node sent to **itself** and handled internally, right
    /// after the handler that produced it (Maekawa's own REQ/YES/REL: `P_i ∈ S_i`). It never
    /// crosses a link, but the algorithm sends it, so messages-per-CS figures count it.
    Local {
        /// The message kind, as [`Message::kind`] names it.
        kind: &'static str,
    },
    /// The local application may enter the critical section, with this fencing token.
    Grant {
        /// The fencing token of this grant.
        fence: Fence,
    },
}

/// The buffer a handler writes its outputs into. Reuse one across calls (call [`Outbox::drain`]
/// or [`Outbox::clear`] in between) to avoid an allocation per event.
#[derive(Debug, Clone)]
pub struct Outbox<M> {
    items: Vec<Output<M>>,
}

impl<M> Default for Outbox<M> {
    fn default() -> Self {
        Self { items: Vec::new() }
    }
}

impl<M> Outbox<M> {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a message to `to`.
    pub fn send(&mut self, to: NodeId, msg: M) {
        self.items.push(Output::Send { to, msg });
    }

    /// Records a message of kind `kind` sent to self and handled inside the node (see
    /// [`Output::Local`]).
    pub fn local(&mut self, kind: &'static str) {
        self.items.push(Output::Local { kind });
    }

    /// Queues a grant of the critical section to the local application.
    pub fn grant(&mut self, fence: Fence) {
        self.items.push(Output::Grant { fence });
    }

    /// The outputs queued so far, in order.
    pub fn as_slice(&self) -> &[Output<M>] {
        &self.items
    }

    /// Number of queued outputs.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Removes and yields all queued outputs, in order, keeping the allocation.
    pub fn drain(&mut self) -> std::vec::Drain<'_, Output<M>> {
        self.items.drain(..)
    }

    /// Drops all queued outputs.
    pub fn clear(&mut self) {
        self.items.clear();
    }
}

/// A distributed mutual-exclusion algorithm, one instance per process.
///
/// Handlers return `Err` only for inputs the protocol cannot produce (a spurious release, a
/// message from an unknown node, a message impossible in the current state). After an error the
/// node's state is unspecified; a wrapper should report it and stop using the node.
pub trait MutexNode: Sized {
    /// The algorithm's message type.
    type Msg: Message;
    /// Per-algorithm configuration (coordinator, initial token holder, tree shape, quorums...).
    type Config: Clone + Debug + Default;

    /// The algorithm's name.
    const NAME: &'static str;
    /// Whether the algorithm needs FIFO channels between each pair of nodes.
    const REQUIRES_FIFO: bool;
    /// Whether the algorithm is token based; if so [`MutexNode::holds_token`] and
    /// [`Message::is_token`] are meaningful and the checker verifies token uniqueness.
    const TOKEN_BASED: bool;

    /// Builds node `id` of a group of `n` nodes.
    fn new(id: NodeId, n: usize, config: &Self::Config) -> Result<Self, MutexError>;

    /// This node's id.
    fn id(&self) -> NodeId;

    /// The START event, delivered once to every node before anything else (the token ring uses it
    /// to set its token moving). Default: nothing.
    fn on_start(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        let _ = out;
        Ok(())
    }

    /// The local application asks for the critical section (`EnterCS`). A grant follows, now or
    /// in a later handler, as an [`Output::Grant`].
    fn on_request(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError>;

    /// The local application leaves the critical section (`ExitCS`).
    fn on_release(&mut self, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError>;

    /// A message from `from` arrived.
    fn on_message(
        &mut self,
        from: NodeId,
        msg: Self::Msg,
        out: &mut Outbox<Self::Msg>,
    ) -> Result<(), MutexError>;

    /// A timer fired. None of the classic algorithms sets timers, so the default rejects it.
    fn on_timer(&mut self, timer: u64, out: &mut Outbox<Self::Msg>) -> Result<(), MutexError> {
        let _ = out;
        Err(MutexError::UnknownTimer {
            node: self.id(),
            timer,
        })
    }

    /// A failure detector reports that `failed` has crashed. The classic algorithms assume
    /// failure-free processes (spec §1), so the default refuses with a typed error that a wrapper
    /// can surface; it never pretends to recover.
    fn on_failure(
        &mut self,
        failed: NodeId,
        out: &mut Outbox<Self::Msg>,
    ) -> Result<(), MutexError> {
        let _ = out;
        Err(MutexError::FailureNotTolerated {
            node: self.id(),
            failed,
            algorithm: Self::NAME,
        })
    }

    /// Whether this node currently holds the (CS) token. Only meaningful when
    /// [`MutexNode::TOKEN_BASED`].
    fn holds_token(&self) -> bool {
        false
    }
}

/// Checks that `node` is a valid id in a group of `n`.
pub(crate) fn check_node(node: NodeId, n: usize) -> Result<(), MutexError> {
    if node < n {
        Ok(())
    } else {
        Err(MutexError::UnknownNode { node, n })
    }
}

/// Checks the common constructor arguments.
pub(crate) fn check_group(id: NodeId, n: usize) -> Result<(), MutexError> {
    if n == 0 {
        return Err(MutexError::Config("a group needs at least one node".into()));
    }
    check_node(id, n)
}

/// Shorthand for a protocol-violation error.
pub(crate) fn protocol(node: NodeId, detail: impl Into<String>) -> MutexError {
    MutexError::Protocol {
        node,
        detail: detail.into(),
    }
}
