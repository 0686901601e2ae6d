//! A lock-service group as one Leda graph: node `i` is a cluster of its node stage
//! (`mutex<i>`, the algorithm chosen by configuration), its front stage (`front<i>`) and its
//! application side, either the API stage (`api<i>`, for [`LocalClient`]s in that process) or a
//! counter worker (`app<i>`). Node stages are joined pairwise by decoupled connectors; the
//! same graph runs in one process ([`LocalGroup`]) or with one process per node
//! (`lock-service run`, over leda-net).
//!
//! With a crash-tolerant algorithm (`quorum-grid`, `quorum-tree`, `quorum-vcube`), node `i`'s
//! cluster also holds the VCube failure detector's stages (`detector<i>` and its timer
//! `dtimer<i>`, see [`leda_mutex::ft_quorum::detector`]): the detectors test each other over
//! decoupled connectors and send `("failure", j)` into `mutex<i>` when node `j` crashed, so the
//! survivors of a killed node keep the lock going ([`Detection`], [`build_group_with`]).

use std::path::PathBuf;
use std::sync::Arc;

use leda_core::prelude::*;
use leda_mutex::Algorithm;
use leda_mutex::ft_quorum::detector::{
    DETECTOR_KIND, DETECTOR_TIMER_KIND, DetectorConfig, DetectorSpec, NoticeObserver,
    connect_detectors, detector_stage_from_attrs, detector_stage_observed,
    detector_timer_stage_from_attrs, wire_detector,
};
use leda_mutex::stage::{
    NODE_KIND, NodeSpec, connect_peers, node_name, node_stage, node_stage_from_attrs,
};
use leda_net::Registry;

use crate::app::{APP_KIND, app_stage, app_stage_from_attrs, done_stage};
use crate::client::{ApiShared, LocalClient, LockError, api_stage};
use crate::epoch::{EPOCH_KIND, epoch_stage};
use crate::front::{FRONT_KIND, front_stage, front_stage_from_attrs};
use crate::gate::{GATE_KIND, GateLocal, gate_stage};

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
    /// The API stage, for [`LocalClient`]s of this process.
    Api(ApiShared),
    /// The gate stage, for clients in other processes ([`crate::gate`]); `None` where the
    /// node runs in another process (its daemon supplies the listener).
    Gate(Option<Arc<GateLocal>>),
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

/// How a group detects crashed nodes.
#[derive(Clone, Default)]
pub struct Detection {
    /// The failure detector's timing; `None`: no detector stages.
    pub config: Option<DetectorConfig>,
    /// Sees the crash notices of the detector stages that run in this process (stages rebuilt
    /// by a daemon have none; they log each notice at `info`).
    pub observer: Option<Arc<dyn NoticeObserver>>,
}

impl std::fmt::Debug for Detection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detection")
            .field("config", &self.config)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl Detection {
    /// The default for `algorithm`: detector stages with [`DetectorConfig::default`] timing for
    /// the crash-tolerant algorithms, none for the others.
    pub fn for_algorithm(algorithm: Algorithm) -> Self {
        Detection {
            config: algorithm.tolerates_crashes().then(DetectorConfig::default),
            observer: None,
        }
    }
}

/// Builds the group's graph; `sides[i]` is node `i`'s application side. With `done` set, the
/// workers report to a `done` stage in node 0's cluster, which quits the run after `done`
/// reports. Crash-tolerant algorithms get detector stages ([`Detection::for_algorithm`]).
pub fn build_group(
    cfg: &ServiceConfig,
    sides: &[Side],
    done: Option<usize>,
) -> Result<GroupGraph, leda_mutex::MutexError> {
    build_group_with(cfg, sides, done, &Detection::for_algorithm(cfg.algorithm))
}

/// [`build_group`] with an explicit failure-detection setting. Detector stages are refused for
/// an algorithm that does not tolerate crashes (its nodes would fail on the first notice).
pub fn build_group_with(
    cfg: &ServiceConfig,
    sides: &[Side],
    done: Option<usize>,
    detection: &Detection,
) -> Result<GroupGraph, leda_mutex::MutexError> {
    if detection.config.is_some() && !cfg.algorithm.tolerates_crashes() {
        return Err(leda_mutex::MutexError::Config(format!(
            "{} does not tolerate crashes: no failure detector for it (use quorum-grid, \
             quorum-tree or quorum-vcube)",
            cfg.algorithm
        )));
    }
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
    let mut detectors = Vec::new();
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
            Side::Gate(local) => gate_stage(i, local.clone()),
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
        if let Some(config) = detection.config {
            let spec = DetectorSpec {
                id: i,
                n: cfg.nodes,
                config,
                observer: detection.observer.clone(),
            };
            let (detector, timer) = wire_detector(&mut g, spec, &node)
                .map_err(|e| leda_mutex::MutexError::Config(e.to_string()))?;
            cluster.insert(&detector);
            cluster.insert(&timer);
            detectors.push(detector);
        }
        clusters.push(cluster);
        nodes.push(node);
    }
    connect_peers(&mut g, &nodes);
    connect_detectors(&mut g, &detectors);
    Ok(GroupGraph { graph: g, clusters })
}

/// The stage kinds a daemon of the lock service must know.
pub fn registry() -> Registry {
    Registry::new()
        .with(NODE_KIND, |a| Ok(node_stage_from_attrs(a)?))
        .with(FRONT_KIND, front_stage_from_attrs)
        .with(APP_KIND, app_stage_from_attrs)
        .with(DETECTOR_KIND, |a| Ok(detector_stage_from_attrs(a)?))
        .with(DETECTOR_TIMER_KIND, |a| {
            Ok(detector_timer_stage_from_attrs(a)?)
        })
        .with(leda_mutex::multi::stage::MULTI_KIND, |a| {
            Ok(leda_mutex::multi::stage::multi_node_stage_from_attrs(a)?)
        })
}

/// The registry of a serving node's daemon ([`registry`] and the node-local stages): its gate
/// gets `gate`'s listener, secret and audit file, its epoch stage stores in `data_dir`, and its
/// failure detector (crash-tolerant algorithms) stops the process when it holds a majority of
/// the group crashed ([`crate::guard`]).
pub fn serve_registry(gate: Arc<GateLocal>, data_dir: PathBuf) -> Registry {
    registry()
        .with(DETECTOR_KIND, |a| {
            let n: usize = a.get_as("n")?;
            let guard: Arc<dyn NoticeObserver> = Arc::new(crate::guard::MajorityGuard::new(n));
            Ok(detector_stage_observed(a, Some(guard))?)
        })
        .with(GATE_KIND, move |a| {
            Ok(gate_stage(a.get_as("node")?, Some(gate.clone())))
        })
        .with(EPOCH_KIND, move |a| {
            Ok(epoch_stage(
                a.get_as("node")?,
                a.get_as("n")?,
                Some(data_dir.clone()),
            ))
        })
}

/// A whole group running in this process, with a [`LocalClient`] per node.
pub struct LocalGroup {
    running: leda_core::runtime::Running,
    clients: Vec<LocalClient>,
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
        Self::start_with_multi(cfg, None, threads)
    }

    /// Starts the group with multi-resource locks too ([`crate::multi`]).
    pub fn start_with_multi(
        cfg: &ServiceConfig,
        multi: Option<&crate::multi::MultiServiceConfig>,
        threads: usize,
    ) -> Result<LocalGroup, LockError> {
        let shared: Vec<ApiShared> = (0..cfg.nodes).map(|_| ApiShared::new()).collect();
        let sides: Vec<Side> = shared.iter().cloned().map(Side::Api).collect();
        let mut built =
            build_group(cfg, &sides, None).map_err(|e| LockError::Refused(e.to_string()))?;
        if let Some(m) = multi {
            crate::multi::attach_multi(&mut built, &cfg.resources, m)
                .map_err(|e| LockError::Refused(e.to_string()))?;
        }
        let running = built
            .graph
            .start(Run::default().threads(threads))
            .map_err(|e| LockError::Unavailable(e.to_string()))?;
        let clients = shared
            .into_iter()
            .enumerate()
            .map(|(i, s)| LocalClient::new(running.handle(), &format!("front{i}"), s))
            .collect::<Result<_, _>>()?;
        Ok(LocalGroup { running, clients })
    }

    /// The client of node `i`.
    pub fn client(&self, i: usize) -> Option<&LocalClient> {
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
