//! Multi-resource allocation (generalised mutual exclusion, issue #10, spec
//! `specs/mutex-multiresource.md`): a process asks for a set of resources, or for a number of
//! instances of several resource types, and enters its critical section holding all of them.
//!
//! - [`model`]: resource spaces (types with `k` instances), requests, holds with fences, and the
//!   [`MultiSystem`] interface a driver talks to.
//! - [`checker`]: per-instance exclusion, grants matching requests, fences strictly increasing
//!   per instance, liveness (deadlock/stall naming the waiting processes).
//! - [`sim`]: a seeded deterministic driver with a latency model and the \[LJ\] workload
//!   generator (sizes uniform in `[1, SizeReq]`, CS and think times).
//! - [`omniscient`]: the centralised, message-free reference scheduler (FIFO with backfilling).
//! - [`grid_aware`]: Vieira Neto's grid-aware hierarchical algorithm (control token, cluster
//!   leaders, bounded preemption, ACK1/ACK2, token selection by locality), single and
//!   multi-instance; [`grid_exp`]: its `--sweep-grid` evaluation with a latency-weighted
//!   logical clock.
//! - [`incremental`]: one Naimi–Tréhel per resource instance, locked in a global order (and a
//!   deliberately broken unordered variant, for the checker's deadlock test).
//! - [`bouabdallah`]: Bouabdallah–Laforest (control token on a Naimi–Tréhel tree, per-instance
//!   tokens, ACK1/ACK2), single and multi-instance.
//! - [`lejeune`]: Lejeune et al. (per-resource counters, total order on requests, Mueller
//!   trees, loans), single-instance; [`lejeune_exp`]: its `--sweep-lejeune` evaluation.
//! - [`stage`]: per-process multi-resource nodes ([`MultiNode`]) as Leda stages, chosen by
//!   name ([`MultiAlgorithm`]), with named resources ([`NamedSpace`]).
//! - [`stage_sim`]: those stages under leda-core's simulated executor with the checker.

pub mod bouabdallah;
pub mod checker;
pub mod grid_aware;
pub mod grid_exp;
pub mod incremental;
pub mod lejeune;
pub mod lejeune_exp;
pub mod model;
pub mod omniscient;
pub mod sim;
pub mod stage;
pub mod stage_sim;

pub use bouabdallah::{BlConfig, BlMsg, BlNode, BouabdallahLaforest};
pub use checker::{MultiChecker, MultiVerdict, MultiViolation};
pub use grid_aware::{GridAware, GridConfig, GridMode, GridMsg, GridNode, GridStats};
pub use incremental::{Incremental, IncrementalConfig, IncrementalMsg, IncrementalNode, LockOrder};
pub use lejeune::{Lejeune, LjConfig, LjMsg, LjNode, LjState};
pub use model::{
    Hold, MultiOutbox, MultiOutput, MultiRequest, MultiSystem, ResourceId, ResourceSpace,
};
pub use omniscient::{NoMsg, Omniscient};
pub use sim::{
    Clusters, MultiReport, MultiSim, MultiSimConfig, MultiStats, MultiWorkload, WaitAcc,
    simulate_multi,
};
pub use stage::{
    DynMultiNode, MultiAlgorithm, MultiNode, MultiNodeSpec, MultiRequestError, NamedSpace,
    multi_node_stage,
};
pub use stage_sim::{MultiStageReport, MultiStageSim};
