//! A lock-service group as one Leda graph: node `i` is a cluster of its node stage
//! (`mutex<i>`, the algorithm chosen by configuration), its front stage (`front<i>`) and its
//! application side, either the API stage (`api<i>`, for [`LockClient`]s in that process) or a
//! counter worker (`app<i>`). Node stages are joined pairwise by decoupled connectors; the
//! same graph runs in one process ([`LocalGroup`]) or with one process per node
//! (`lock-service run`, over leda-net).

use leda_core::prelude::*;
use leda_mutex::Algorithm;
use leda_mutex::stage::{
    NODE_KIND, NodeSpec, connect_peers, node_name, node_stage, node_stage_from_attrs,
};
use leda_net::Registry;

use crate::app::{APP_KIND, app_stage, app_stage_from_attrs, done_stage};
use crate::client::{ApiShared, LockClient, LockError, api_stage};
use crate::front::{FRONT_KIND, front_stage, front_stage_from_attrs};

/// The service's configuration.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The algorithm every node runs.
    pub algorithm: Algorithm,
    /// Number of nodes.
    pub nodes: usize,
    /// The lockable resources.
    pub resources: Vec<String>,
}

/// What runs on the application side of a node.
#[derive(Debug, Clone)]
pub enum Side {
    /// The API stage, for [`LockClient`]s of this process.
    Api(ApiShared),
    /// A counter worker: `clients` clients × `iters` increments of `counter` under `resource`.
    Worker {
        /// Concurrent clients.
        clients: usize,
        /// Increments per client.
        iters: usize,
        /// The lock.
        resource: String,
        /// The counter file.
        counter: String,
    },
}

/// A built group graph.
#[derive(Debug)]
pub struct GroupGraph {
    /// The graph.
    pub graph: Graph,
    /// One cluster per node, in node order (node `i` is cluster `i`).
    pub clusters: Vec<Cluster>,
}

/// Builds the group's graph; `sides[i]` is node `i`'s application side. With `done` set, the
/// workers report to a `done` stage in node 0's cluster, which quits the run after `done`
/// reports.
pub fn build_group(
    cfg: &ServiceConfig,
    sides: &[Side],
    done: Option<usize>,
) -> Result<GroupGraph, leda_mutex::MutexError> {
    if sides.len() != cfg.nodes {
        return Err(leda_mutex::MutexError::Config(format!(
            "{} application sides for {} nodes",
            sides.len(),
            cfg.nodes
        )));
    }
    let mut g = Graph::new(format!("lock-service-{}", cfg.algorithm));
    let done = done.map(done_stage);
    let mut nodes = Vec::new();
    let mut clusters = Vec::new();
    for (i, side) in sides.iter().enumerate() {
        let node = node_stage(NodeSpec {
            algorithm: cfg.algorithm,
            id: i,
            n: cfg.nodes,
            resources: cfg.resources.clone(),
            observer: None,
        })?;
        let front = front_stage(i, &cfg.resources);
        g.connect(&front, "mutex", &node).local();
        g.connect(&node, "grant", &front).local();
        let app = match side {
            Side::Api(shared) => api_stage(i, shared.clone()),
            Side::Worker {
                clients,
                iters,
                resource,
                counter,
            } => {
                let app = app_stage(i, *clients, *iters, resource, counter);
                if let Some(done) = &done {
                    g.connect(&app, "done", done);
                }
                app
            }
        };
        g.connect(&front, "reply", &app).local();
        g.connect(&app, "front", &front).local();
        let mut cluster = Cluster::of([&node, &front, &app]);
        if i == 0
            && let Some(done) = &done
        {
            cluster.insert(done);
        }
        clusters.push(cluster);
        nodes.push(node);
    }
    connect_peers(&mut g, &nodes);
    Ok(GroupGraph { graph: g, clusters })
}

/// The stage kinds a daemon of the lock service must know.
pub fn registry() -> Registry {
    Registry::new()
        .with(NODE_KIND, |a| Ok(node_stage_from_attrs(a)?))
        .with(FRONT_KIND, front_stage_from_attrs)
        .with(APP_KIND, app_stage_from_attrs)
}

/// A whole group running in this process, with a [`LockClient`] per node.
pub struct LocalGroup {
    running: leda_core::runtime::Running,
    clients: Vec<LockClient>,
}

impl std::fmt::Debug for LocalGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalGroup")
            .field("nodes", &self.clients.len())
            .finish()
    }
}

impl LocalGroup {
    /// Starts the group on `threads` worker threads.
    pub fn start(cfg: &ServiceConfig, threads: usize) -> Result<LocalGroup, LockError> {
        let shared: Vec<ApiShared> = (0..cfg.nodes).map(|_| ApiShared::new()).collect();
        let sides: Vec<Side> = shared.iter().cloned().map(Side::Api).collect();
        let built =
            build_group(cfg, &sides, None).map_err(|e| LockError::Refused(e.to_string()))?;
        let running = built
            .graph
            .start(Run::default().threads(threads))
            .map_err(|e| LockError::Unavailable(e.to_string()))?;
        let clients = shared
            .into_iter()
            .enumerate()
            .map(|(i, s)| LockClient::new(running.handle(), &format!("front{i}"), s))
            .collect::<Result<_, _>>()?;
        Ok(LocalGroup { running, clients })
    }

    /// The client of node `i`.
    pub fn client(&self, i: usize) -> Option<&LockClient> {
        self.clients.get(i)
    }

    /// Stops the group.
    pub fn stop(self) -> Result<(), LockError> {
        self.running.handle().quit(Event::new());
        self.running
            .wait()
            .map(|_| ())
            .map_err(|e| LockError::Unavailable(e.to_string()))
    }
}

/// The name of node `i`'s stage (re-exported for callers that inject into it).
pub fn mutex_stage_name(i: usize) -> String {
    node_name(i)
}
