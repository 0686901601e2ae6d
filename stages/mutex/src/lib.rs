//! # leda-mutex
//!
//! Classic distributed mutual-exclusion algorithms (spec `specs/mutex-classic.md`) as **pure
//! state machines**, plus a deterministic simulator and a property checker.
//!
//! - [`node`]: the [`MutexNode`] trait every algorithm implements. Inputs: start, local request,
//!   local release, message, timer, failure notice; outputs: messages and grants, written to an
//!   [`Outbox`]. No I/O, no clock. Messages are serde types with a [`Message::kind`] name.
//! - [`algo`]: one module per algorithm: centralised coordinator, token ring, Misra's two-token
//!   ring, Lamport, Ricart–Agrawala, Roucairol–Carvalho, Suzuki–Kasami, Raymond, Naimi–Tréhel
//!   (Li–Hudak `next` form), Maekawa/Sanders voting over grid quorums (and naive voting as a broken
//!   variant).
//! - [`sim`]: seeded discrete-event simulator (virtual time, latency distributions, FIFO or
//!   non-FIFO links, client workloads, message-loss injection, trace).
//! - [`checker`]: mutual exclusion at every instant, fencing tokens strictly increasing, token
//!   uniqueness, liveness (deadlock/stall reports naming the stuck nodes).
//! - [`metrics`]: messages per CS and per type, response time, synchronisation delay.
//!
//! **Fencing tokens.** Every grant carries a `u64` fence, strictly increasing per resource:
//! token algorithms carry a counter in the token; Lamport and Ricart–Agrawala use the request's
//! `(ts, pid)` stamp (they serve in stamp order); Roucairol–Carvalho and Maekawa piggyback the
//! largest fence seen on permissions/votes; the coordinator counts. See each module.
//!
//! **Channels.** FIFO is required by Misra, Lamport and Maekawa/Sanders
//! ([`MutexNode::REQUIRES_FIFO`]); the others are tested over non-FIFO links too.

#![warn(missing_docs)]

pub mod algo;
pub mod checker;
pub mod clock;
pub mod error;
pub mod metrics;
pub mod node;
pub mod quorum;
pub mod rng;
pub mod sim;

pub use checker::{Checker, Verdict, Violation};
pub use error::MutexError;
pub use metrics::Metrics;
pub use node::{Fence, Message, MutexNode, NodeId, Outbox, Output};
pub use sim::{
    Channels, DropRule, Latency, Report, Schedule, SimConfig, Simulation, Workload, simulate,
};
