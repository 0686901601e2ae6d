//! # leda-mutex
//!
//! Classic distributed mutual-exclusion algorithms (spec `specs/mutex-classic.md`) as **pure
//! state machines**, wrapped as Leda stages, plus deterministic simulation (of the state machines
//! alone, and of the stage graph under leda-core's simulated executor) and a property checker.
//!
//! - [`node`]: the [`MutexNode`] trait every algorithm implements. Inputs: start, local request,
//!   local release, message, timer, failure notice; outputs: messages and grants, written to an
//!   [`Outbox`]. No I/O, no clock. Messages are serde types with a [`Message::kind`] name.
//! - [`algo`]: one module per algorithm: centralised coordinator, token ring, Misra's two-token
//!   ring, Lamport, Ricart–Agrawala, Roucairol–Carvalho, Suzuki–Kasami, Raymond, Naimi–Tréhel
//!   (Li–Hudak `next` form), Maekawa/Sanders voting over grid quorums (and naive voting as a broken
//!   variant).
//! - [`algorithm`]: the [`Algorithm`] chosen by name at run time, its analytic costs (spec §15),
//!   and [`DynNode`], a type-erased node whose messages are dynamic values.
//! - [`stage`]: the algorithms as Leda stages: one serial node stage per node (request, release
//!   and message inputs; `peer<j>` and `grant` ports), a workload client stage, node stages
//!   joined pairwise by decoupled connectors, one cluster per node.
//! - [`stage_sim`]: that stage graph under leda-core's deterministic simulated executor (seeded
//!   network model, crashes, byte-identical traces) with the [`Checker`] watching.
//! - [`sim`]: seeded discrete-event simulator (virtual time, latency distributions, FIFO or
//!   non-FIFO links, client workloads, message-loss injection, trace).
//! - [`checker`]: mutual exclusion at every instant, fencing tokens strictly increasing, token
//!   uniqueness, liveness (deadlock/stall reports naming the stuck nodes).
//! - [`ft_quorum`]: fault-tolerant quorum generators recomputed from a `correct` view (VCube
//!   clusters and testing rounds, VCube majority, Agrawal–El Abbadi tree and grid with
//!   substitution; spec `specs/mutex-vcube-quorum.md`).
//! - [`experiment`], [`chart`]: the `mutex-exp` experiments (CSV rows, the sweep over N and
//!   load) and their PNG charts with the analytic values beside the measurements.
//! - [`quorum_exp`], [`quorum_chart`]: experiments of the crash-tolerant quorum protocol
//!   (random crash schedules shared by the grid, tree and VCube generators; the
//!   `--sweep-quorum` matrix, its summary table and PNG charts); [`quorum_soak`]: thousands of
//!   seeds with up to N/2 crashes and staggered notices through the checker.
//! - [`metrics`]: messages per CS and per type, response time, synchronisation delay.
//!
//! **Fencing tokens.** Every grant carries a `u64` fence, strictly increasing per resource:
//! token algorithms carry a counter in the token; Lamport and Ricart–Agrawala use the request's
//! `(ts, pid)` stamp (they serve in stamp order); Roucairol–Carvalho and Maekawa piggyback the
//! largest fence seen on permissions/votes; the coordinator counts. See each module.
//!
//! **Channels.** FIFO is required by Misra, Lamport and Maekawa/Sanders
//! ([`MutexNode::REQUIRES_FIFO`]); the others are tested over non-FIFO links too.
//!
//! # Example
//!
//! Ricart–Agrawala on 5 nodes over non-FIFO links with exponential latencies, in
//! simulated time, every instant watched by the checker; the same algorithm by name
//! runs as a stage graph ([`StageSim`]) or over real processes (`lock-service`).
//!
//! ```
//! use leda_mutex::{Algorithm, Channels, Latency, SimConfig, Verdict};
//!
//! let mut cfg = SimConfig::new(5, 42);
//! cfg.channels = Channels::NonFifo;
//! cfg.latency = Latency::Exponential { min: 1, mean: 6.0 };
//! let algorithm: Algorithm = "ricart-agrawala".parse()?;
//! let report = algorithm.simulate(cfg)?;
//! assert_eq!(report.verdict, Verdict::Ok);
//! assert!(report.metrics.cs_entries > 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod algo;
pub mod algorithm;
pub mod chart;
pub mod checker;
pub mod clock;
pub mod error;
pub mod experiment;
pub mod ft_quorum;
pub mod metrics;
pub mod multi;
pub mod node;
pub mod quorum;
pub mod quorum_chart;
pub mod quorum_exp;
pub mod quorum_soak;
pub mod rng;
pub mod sim;
pub mod stage;
pub mod stage_sim;

pub use algorithm::{Algorithm, DynNode, Effect, Load};
pub use checker::{Checker, Verdict, Violation};
pub use error::MutexError;
pub use metrics::Metrics;
pub use node::{Fence, Message, MutexNode, NodeId, Outbox, Output};
pub use sim::{
    Channels, DropRule, Latency, Report, Schedule, SimConfig, Simulation, Workload, simulate,
};
pub use stage_sim::{StageReport, StageSim};
