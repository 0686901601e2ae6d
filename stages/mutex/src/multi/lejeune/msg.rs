//! The messages of the Lejeune et al. algorithm (spec §4.4: `ReqCnt`, `Counter`,
//! `ReqRes`, `ReqLoan`, the token) and their kinds. Owns the wire form only.

use serde::{Deserialize, Serialize};

use crate::node::{Message, NodeId};

use super::token::{LjToken, Mark, Transfer};

/// A message of the Lejeune et al. algorithm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LjMsg {
    /// Asks for the counter of resource `r` (forwarded to the holder).
    ReqCnt {
        /// The resource.
        r: usize,
        /// The requester.
        init: NodeId,
        /// Its request number.
        seq: u64,
        /// §4.8 single-resource shortcut: the request is for `r` alone; the holder reads the
        /// counter, uses it as the mark and queues the request as a `ReqRes` (no `Counter`).
        single: bool,
        /// Sites visited.
        visited: Vec<NodeId>,
    },
    /// The counter value given to request `seq` (direct to the requester).
    Counter {
        /// The resource.
        r: usize,
        /// The request number it answers.
        seq: u64,
        /// The value.
        val: u64,
    },
    /// Asks for the token of `r` with priority `mark` (forwarded to the holder).
    ReqRes {
        /// The resource.
        r: usize,
        /// The requester.
        init: NodeId,
        /// Its request number.
        seq: u64,
        /// Its mark.
        mark: Mark,
        /// Sites visited.
        visited: Vec<NodeId>,
    },
    /// Asks the holder of `r` to lend everything in `missing` (forwarded to the holder).
    ReqLoan {
        /// The resource this copy is routed for.
        r: usize,
        /// The requester.
        init: NodeId,
        /// Its request number.
        seq: u64,
        /// Its mark.
        mark: Mark,
        /// All the resources it misses.
        missing: Vec<usize>,
        /// Sites visited.
        visited: Vec<NodeId>,
    },
    /// A token (direct to its new holder).
    Token {
        /// The token.
        token: LjToken,
        /// Give, loan or return.
        how: Transfer,
    },
}

impl Message for LjMsg {
    fn kind(&self) -> &'static str {
        match self {
            LjMsg::ReqCnt { .. } => "req_cnt",
            LjMsg::Counter { .. } => "counter",
            LjMsg::ReqRes { .. } => "req_res",
            LjMsg::ReqLoan { .. } => "req_loan",
            LjMsg::Token { .. } => "token",
        }
    }

    fn is_token(&self) -> bool {
        matches!(self, LjMsg::Token { .. })
    }
}
