//! # leda-lock-service
//!
//! A distributed lock service whose algorithms are Leda stages (`leda-mutex`): every node is a
//! cluster of a node stage (the mutual-exclusion algorithm, chosen by configuration), a front
//! stage (multiplexing the node's local clients) and an application side; nodes are joined by
//! decoupled connectors and run in one process or one process per node over leda-net.
//!
//! - [`remote`]: the client of a serving group over the network ([`proto`]): `LockClient::
//!   connect(addr, opts)` (blocking) or `AsyncLockClient`, `acquire` → a `Hold` under a lease.
//! - [`client`]: the in-process API ([`LocalClient`]): `acquire(resource, timeout)` →
//!   [`Grant`] with its fencing token, `try_acquire`, `release`, cancellation.
//! - [`front`]: the front stage and its protocol.
//! - [`gate`]: a serving node's client port, sessions and leases.
//! - [`epoch`]: the group's epoch and the majority fence register (fences that only grow).
//! - [`group`]: the group's graph, the daemon registries, an in-process group.
//! - [`guard`]: a serving node stops when its detector holds a majority crashed.
//! - [`check`]: `lock-check`'s history and checker; [`serving`]: starting a serving group's
//!   processes from outside.
//! - [`multi`]: multi-resource locks in a group (`acquire_all([r1, r2, ...], timeout)` and the
//!   multi-instance form), a multi node stage per node beside the single-resource one.
//! - [`etcd`]: a minimal etcd v3 lock client (JSON gateway), for the benchmark.
//! - [`app`]: the example's counter workers (guarded increments of a shared file, checked
//!   with the fencing token) and the results collector.
//!
//! The `lock-service` binary runs serving nodes (`serve`), runs a command under a lock
//! (`lock`), deploys test workloads (`daemon`, `run`) and benchmarks against etcd (`bench`);
//! `lock-check` checks the service under faults. See `docs/mutex.md`.

#![warn(missing_docs)]

pub mod app;
pub mod check;
pub mod client;
pub mod epoch;
pub mod etcd;
pub mod front;
pub mod gate;
pub mod group;
pub mod guard;
pub mod multi;
pub mod proto;
pub mod remote;
pub mod remote_stage;
pub mod serving;

pub use client::{Grant, InstanceGrant, LocalClient, LockError, MultiGrant, Pending, PendingAll};
pub use group::{LocalGroup, ServiceConfig};
pub use multi::MultiServiceConfig;

use leda_core::stage::Stage;

/// Builds one catalogue stage.
pub type StageMaker = fn() -> Stage;

/// The stages this crate registers with the `leda` command, by `require` name, for Lua
/// graphs of the lock service:
///
/// - `leda.stage.mutex.node`: a node stage; set `algorithm`, `id`, `n`, `resources` on a copy
///   (`local m = leda.stage 'mutex0' (require 'leda.stage.mutex.node')`), connect `peer<j>` to
///   node `j`'s copy and `grant` to the front with a local connector (`m:connect('grant', f,
///   'local')`: the front takes node replies only with the node's seal, which does not cross
///   decoupled connectors);
/// - `leda.stage.lock.front`: a front stage; set `resources`, connect `mutex` to the node and
///   `reply` to the client, which sends `("acquire", id, resource, try)`, `("release", id,
///   resource)` and `("cancel", id, resource)` (protocol in [`front`]);
/// - `leda.stage.mutex.multi`: a multi-resource node stage; set `algorithm` (`incremental`...),
///   `id`, `n` and `resources` (`{{name, instances}, ...}`), connect `peer<j>` to process `j`'s
///   copy and `grant` to the front, and set the front's `multi` to the same list and connect
///   its `multi` port to it; clients then send `("acquire_all", id, {names...})`,
///   `("release_all", id)` and `("cancel_all", id)`;
/// - `leda.stage.lock.client`: a client of a serving group over the network; set `connect`
///   (and `ttl`, `name`, `secret_file`), send it `("acquire", id, lock[, timeout])` and
///   `("release", id)`, and connect its `reply` port ([`remote_stage`]).
///
/// Each comes with what it needs beyond computing, as `leda start --allow` names it (the
/// client: `net`, sockets).
pub fn catalogue() -> Vec<(&'static str, &'static str, StageMaker)> {
    vec![
        ("leda.stage.mutex.node", "", || {
            leda_mutex::stage::node_stage_by_attrs("mutex.node")
        }),
        ("leda.stage.lock.front", "", || {
            front::front_stage_by_attrs("lock.front")
        }),
        ("leda.stage.mutex.multi", "", || {
            leda_mutex::multi::stage::multi_node_stage_by_attrs("mutex.multi")
        }),
        ("leda.stage.lock.client", "net", || {
            remote_stage::client_stage_by_attrs("lock.client")
        }),
    ]
}
