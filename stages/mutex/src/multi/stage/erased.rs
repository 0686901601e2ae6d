//! Type erasure: a [`MultiNode`] of any algorithm behind [`DynMultiNode`], with its
//! messages as dynamic [`Value`]s and its outputs as [`MultiEffect`]s, so that the
//! stage handles every algorithm with one code path. Owns the conversion between
//! typed messages and values, nothing else.

use leda_core::prelude::*;

use crate::error::MutexError;
use crate::node::{Message, NodeId};

use super::super::model::{Hold, MultiOutbox, MultiOutput, MultiRequest};
use super::MultiNode;

/// One effect of a [`DynMultiNode`] handler.
#[derive(Debug, Clone)]
pub enum MultiEffect {
    /// Send `body` (a message of kind `kind`) to process `to`.
    Send {
        /// Destination.
        to: NodeId,
        /// Message kind.
        kind: &'static str,
        /// The flat instance whose token the message carries, if any.
        token: Option<usize>,
        /// The message as a dynamic value.
        body: Value,
    },
    /// The local application may enter its CS holding `holds`.
    Grant {
        /// Every instance held, with its fence.
        holds: Vec<Hold>,
    },
}

/// A type-erased [`MultiNode`]: messages as dynamic [`Value`]s.
pub trait DynMultiNode: Send {
    /// This process's id.
    fn id(&self) -> NodeId;
    /// The local application asks for `req`.
    fn request(&mut self, req: &MultiRequest, out: &mut Vec<MultiEffect>)
    -> Result<(), MutexError>;
    /// The local application releases everything.
    fn release(&mut self, out: &mut Vec<MultiEffect>) -> Result<(), MutexError>;
    /// A message `body` from `from` arrived.
    fn message(
        &mut self,
        from: NodeId,
        body: &Value,
        out: &mut Vec<MultiEffect>,
    ) -> Result<(), MutexError>;
    /// The flat instance whose token `body` carries, if it is a token message.
    fn token_of(&self, body: &Value) -> Option<usize>;
    /// Whether the algorithm has one token per instance.
    fn token_based(&self) -> bool;
    /// Whether this process holds the token of flat instance `flat`.
    fn holds_token(&self, flat: usize) -> bool;
}

struct Erased<N: MultiNode> {
    node: N,
    out: MultiOutbox<N::Msg>,
}

/// Erases a [`MultiNode`]'s message type.
pub fn erase<N: MultiNode>(node: N) -> Box<dyn DynMultiNode> {
    Box::new(Erased {
        node,
        out: MultiOutbox::new(),
    })
}

impl<N: MultiNode> Erased<N> {
    fn with(
        &mut self,
        out: &mut Vec<MultiEffect>,
        f: impl FnOnce(&mut N, &mut MultiOutbox<N::Msg>) -> Result<(), MutexError>,
    ) -> Result<(), MutexError> {
        let _ = self.out.drain();
        let r = f(&mut self.node, &mut self.out);
        let me = self.node.id();
        for o in self.out.drain() {
            out.push(match o {
                MultiOutput::Send { from, to, msg } => {
                    if from != me {
                        return Err(MutexError::Protocol {
                            node: me,
                            detail: format!("a message sent on behalf of process {from}"),
                        });
                    }
                    MultiEffect::Send {
                        to,
                        kind: msg.kind(),
                        token: N::token_instance(&msg),
                        body: Value::from_serde(&msg)
                            .map_err(|e| MutexError::Encoding(e.to_string()))?,
                    }
                }
                MultiOutput::Grant { node, holds } => {
                    if node != me {
                        return Err(MutexError::Protocol {
                            node: me,
                            detail: format!("a grant for process {node}"),
                        });
                    }
                    MultiEffect::Grant { holds }
                }
            });
        }
        r
    }
}

impl<N: MultiNode> DynMultiNode for Erased<N> {
    fn id(&self) -> NodeId {
        self.node.id()
    }

    fn request(
        &mut self,
        req: &MultiRequest,
        out: &mut Vec<MultiEffect>,
    ) -> Result<(), MutexError> {
        self.with(out, |n, o| n.on_request(req, o))
    }

    fn release(&mut self, out: &mut Vec<MultiEffect>) -> Result<(), MutexError> {
        self.with(out, |n, o| n.on_release(o))
    }

    fn message(
        &mut self,
        from: NodeId,
        body: &Value,
        out: &mut Vec<MultiEffect>,
    ) -> Result<(), MutexError> {
        let msg: N::Msg = body.to().map_err(|e| MutexError::Protocol {
            node: self.node.id(),
            detail: format!("undecodable message from {from}: {e}"),
        })?;
        self.with(out, |n, o| n.on_message(from, msg, o))
    }

    fn token_of(&self, body: &Value) -> Option<usize> {
        body.to::<N::Msg>().ok().and_then(|m| N::token_instance(&m))
    }

    fn token_based(&self) -> bool {
        self.node.token_based()
    }

    fn holds_token(&self, flat: usize) -> bool {
        self.node.holds_token(flat)
    }
}
