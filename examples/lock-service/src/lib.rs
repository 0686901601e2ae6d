//! # leda-lock-service
//!
//! A distributed lock service whose algorithms are Leda stages (`leda-mutex`): every node is a
//! cluster of a node stage (the mutual-exclusion algorithm, chosen by configuration), a front
//! stage (multiplexing the node's local clients) and an application side; nodes are joined by
//! decoupled connectors and run in one process or one process per node over leda-net.
//!
//! - [`client`]: the Rust API: `acquire(resource, timeout)` → [`Grant`] with its fencing token,
//!   `try_acquire`, `release`, cancellation of a queued request.
//! - [`front`]: the front stage and its protocol.
//! - [`group`]: the group's graph, the daemon registry, an in-process group.
//! - [`etcd`]: a minimal etcd v3 lock client (JSON gateway), for the benchmark.
//! - [`app`]: the example's counter workers (guarded increments of a shared file, checked
//!   with the fencing token) and the results collector.
//!
//! The `lock-service` binary runs daemons and the launcher; see its `--help`.

#![warn(missing_docs)]

pub mod app;
pub mod client;
pub mod etcd;
pub mod front;
pub mod group;

pub use client::{Grant, LockClient, LockError, Pending};
pub use group::{LocalGroup, ServiceConfig};

use leda_core::stage::Stage;

/// Builds one catalogue stage.
pub type StageMaker = fn() -> Stage;

/// The stages this crate registers with the `leda` command, by `require` name, for Lua
/// graphs of the lock service:
///
/// - `leda.stage.mutex.node`: a node stage; set `algorithm`, `id`, `n`, `resources` on a copy
///   (`local m = leda.stage 'mutex0' (require 'leda.stage.mutex.node')`), connect `peer<j>` to
///   node `j`'s copy and `grant` to the front;
/// - `leda.stage.lock.front`: a front stage; set `resources`, connect `mutex` to the node and
///   `reply` to the client, which sends `("acquire", id, resource, try)`, `("release", id,
///   resource)` and `("cancel", id, resource)` (protocol in [`front`]).
pub fn catalogue() -> Vec<(&'static str, StageMaker)> {
    vec![
        ("leda.stage.mutex.node", || {
            leda_mutex::stage::node_stage_by_attrs("mutex.node")
        }),
        ("leda.stage.lock.front", || {
            front::front_stage_by_attrs("lock.front")
        }),
    ]
}
