//! Multi-resource allocation (generalised mutual exclusion, issue #10, spec
//! `specs/mutex-multiresource.md`): a process asks for a set of resources, or for a number of
//! instances of several resource types, and enters its critical section holding all of them.
//!
//! - [`model`]: resource spaces (types with `k` instances), requests, holds with fences, and the
//!   [`MultiSystem`] interface a driver talks to.
//! - [`checker`]: per-instance exclusion, grants matching requests, fences strictly increasing
//!   per instance, liveness (deadlock/stall naming the waiting processes).
//! - [`sim`]: a seeded deterministic driver with a latency model and the [LJ] workload
//!   generator (sizes uniform in `[1, SizeReq]`, CS and think times).
//! - [`omniscient`]: the centralised, message-free reference scheduler (FIFO with backfilling).
//! - [`incremental`]: one Naimi–Tréhel per resource instance, locked in a global order (and a
//!   deliberately broken unordered variant, for the checker's deadlock test).

pub mod checker;
pub mod incremental;
pub mod model;
pub mod omniscient;
pub mod sim;

pub use checker::{MultiChecker, MultiVerdict, MultiViolation};
pub use incremental::{Incremental, IncrementalConfig, IncrementalMsg, IncrementalNode, LockOrder};
pub use model::{
    Hold, MultiOutbox, MultiOutput, MultiRequest, MultiSystem, ResourceId, ResourceSpace,
};
pub use omniscient::{NoMsg, Omniscient};
pub use sim::{
    Clusters, MultiReport, MultiSim, MultiSimConfig, MultiStats, MultiWorkload, WaitAcc,
    simulate_multi,
};
