//! What the dashboard serves: the graph as it shows it, the statistics samples
//! (this process and its peers), and the control actions it accepts.

use serde::{Deserialize, Serialize};

use crate::runtime::ProcessHandle;
use crate::stats::Snapshot;

/// Stages, ports, connectors, clusters and processes of a graph, as the dashboard
/// shows them (`GET /graph`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GraphInfo {
    /// Graph name.
    pub name: String,
    /// This process' address, when the graph is mapped.
    pub process: Option<String>,
    /// Stages, in graph order.
    pub stages: Vec<StageInfo>,
    /// Connectors.
    pub connectors: Vec<ConnectorInfo>,
    /// Clusters, in partition order.
    pub clusters: Vec<ClusterInfo>,
    /// Processes running the graph (one named `local` when the graph is not mapped).
    #[serde(default)]
    pub processes: Vec<ProcessInfo>,
}

/// One stage of [`GraphInfo`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StageInfo {
    /// Name.
    pub name: String,
    /// Serial (one persistent instance).
    pub serial: bool,
    /// Index of its cluster.
    pub cluster: usize,
    /// Runs in this process.
    pub local: bool,
    /// Its connected output ports, in connector order.
    #[serde(default)]
    pub ports: Vec<String>,
}

/// One connector of [`GraphInfo`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ConnectorInfo {
    /// Emitting stage.
    pub from: String,
    /// Port.
    pub port: String,
    /// Receiving stage.
    pub to: String,
    /// `local`, `decoupled` or `cohort`.
    pub kind: String,
}

/// One cluster of [`GraphInfo`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClusterInfo {
    /// Its stages.
    pub stages: Vec<String>,
    /// The processes it is mapped to (empty when unmapped).
    pub processes: Vec<String>,
}

/// One process of [`GraphInfo`].
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessInfo {
    /// Its address (`local` when the graph is not mapped).
    pub name: String,
    /// Indexes of the clusters it runs.
    pub clusters: Vec<usize>,
    /// The process serving this dashboard.
    pub this: bool,
}

impl GraphInfo {
    /// Fills the derived fields: each stage's ports (from the connectors) and the
    /// process list (from the clusters' mapping).
    pub(crate) fn complete(&mut self) {
        for s in &mut self.stages {
            s.ports = self
                .connectors
                .iter()
                .filter(|c| c.from == s.name)
                .map(|c| c.port.clone())
                .fold(Vec::new(), |mut v, p| {
                    if !v.contains(&p) {
                        v.push(p);
                    }
                    v
                });
        }
        let me = self.process.clone().unwrap_or_else(|| "local".into());
        let mut procs: Vec<ProcessInfo> = Vec::new();
        for (i, c) in self.clusters.iter().enumerate() {
            let names = if c.processes.is_empty() {
                vec![me.clone()]
            } else {
                c.processes.clone()
            };
            for n in names {
                match procs.iter_mut().find(|p| p.name == n) {
                    Some(p) => p.clusters.push(i),
                    None => procs.push(ProcessInfo {
                        this: n == me,
                        name: n,
                        clusters: vec![i],
                    }),
                }
            }
        }
        if procs.is_empty() {
            procs.push(ProcessInfo {
                name: me,
                clusters: Vec::new(),
                this: true,
            });
        }
        self.processes = procs;
    }

    /// The name this process goes by in samples and metrics.
    pub fn this_process(&self) -> &str {
        self.process.as_deref().unwrap_or("local")
    }
}

/// Statistics of another process of the run (what leda-net's transport reports).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PeerStats {
    /// The process' address.
    pub name: String,
    /// Its latest snapshot.
    pub snapshot: Snapshot,
}

/// One statistics sample (`GET /stats`; `GET /history` is a list of them): this
/// process' snapshot, its fields at the top level, with the process' name and the
/// snapshots of the other processes of the run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Sample {
    /// This process' snapshot.
    #[serde(flatten)]
    pub local: Snapshot,
    /// This process' name (`local` when the graph is not mapped).
    pub name: String,
    /// The other processes, when the run spans several and the transport reports them.
    pub peers: Vec<PeerStats>,
}

impl Sample {
    /// Every process of the sample, this one first.
    pub fn processes(&self) -> impl Iterator<Item = (&str, &Snapshot)> {
        std::iter::once((self.name.as_str(), &self.local))
            .chain(self.peers.iter().map(|p| (p.name.as_str(), &p.snapshot)))
    }
}

/// A control action (`POST /control/...`), applied to one process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    /// Resize the worker pool to this many threads (at least 1).
    Threads(usize),
    /// Set a stage's instance limit.
    Maxpar {
        /// The stage.
        stage: String,
        /// The new limit.
        n: usize,
    },
    /// Set a stage's queue capacity.
    Capacity {
        /// The stage.
        stage: String,
        /// The new capacity.
        n: usize,
    },
}

impl Control {
    /// Applies the action to the process behind `handle`.
    pub fn apply(&self, handle: &ProcessHandle) -> Result<(), String> {
        let mut knobs = handle.knobs();
        match self {
            Control::Threads(n) => {
                knobs.set_threads((*n).max(1));
                Ok(())
            }
            Control::Maxpar { stage, n } => knobs.set_maxpar(stage, *n).map_err(|e| e.to_string()),
            Control::Capacity { stage, n } => {
                knobs.set_capacity(stage, *n).map_err(|e| e.to_string())
            }
        }
    }
}
