//! The stage graph G = (S, C), its partition into clusters and the mapping of clusters
//! to processes, with validation before anything runs.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::cluster::Cluster;
use crate::connector::{Connector, ConnectorKind};
use crate::port::Port;
use crate::stage::{BindCtx, Stage, StageId};

/// Why a graph, partition or mapping is invalid. Every variant names what is involved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// The graph has no stage.
    #[error("graph '{graph}' has no stage")]
    Empty {
        /// The graph.
        graph: String,
    },
    /// Two different stages share a name (names identify stages across processes).
    #[error("two different stages are named '{name}'")]
    DuplicateStageName {
        /// The name.
        name: String,
    },
    /// An output port is bound to two connectors.
    #[error(
        "output port '{port}' of stage '{stage}' is connected twice (to '{first}' and to '{second}')"
    )]
    PortBoundTwice {
        /// The stage.
        stage: String,
        /// The port.
        port: String,
        /// First destination.
        first: String,
        /// Second destination.
        second: String,
    },
    /// A stage of the graph is in no cluster of the partition.
    #[error("stage '{stage}' is in no cluster of the partition")]
    Uncovered {
        /// The stage.
        stage: String,
    },
    /// A stage is in two clusters.
    #[error("stage '{stage}' is in clusters {first} and {second}")]
    InTwoClusters {
        /// The stage.
        stage: String,
        /// First cluster (1-based).
        first: usize,
        /// Second cluster (1-based).
        second: usize,
    },
    /// A cluster holds a stage that is not in the graph.
    #[error("cluster {cluster} holds stage '{stage}', which is not in the graph")]
    ForeignStage {
        /// The stage.
        stage: String,
        /// The cluster (1-based).
        cluster: usize,
    },
    /// A local or cohort connector joins stages of different clusters.
    #[error(
        "{kind} connector {from}.{port} -> {to} joins clusters {from_cluster} and {to_cluster}; {kind} connectors must stay inside one cluster"
    )]
    LocalAcrossClusters {
        /// Connector kind.
        kind: ConnectorKind,
        /// Emitting stage.
        from: String,
        /// Port.
        port: String,
        /// Receiving stage.
        to: String,
        /// Cluster of `from` (1-based).
        from_cluster: usize,
        /// Cluster of `to` (1-based).
        to_cluster: usize,
    },
    /// A cluster is empty.
    #[error("cluster {cluster} of the partition is empty")]
    EmptyCluster {
        /// The cluster (1-based).
        cluster: usize,
    },
    /// `map` got a different number of processes than there are clusters.
    #[error("map names {processes} process(es) for {clusters} cluster(s)")]
    MapArity {
        /// Number of clusters.
        clusters: usize,
        /// Number of process entries.
        processes: usize,
    },
    /// `map` was called before `part`.
    #[error("map needs a partition: call part first")]
    MapWithoutPartition,
    /// A cluster is mapped to no process.
    #[error("cluster {cluster} is mapped to no process")]
    NoProcess {
        /// The cluster (1-based).
        cluster: usize,
    },
    /// One process would run two clusters.
    #[error(
        "process {addr} is mapped to clusters {first} and {second}; a process runs one cluster"
    )]
    ProcessReused {
        /// The address.
        addr: String,
        /// First cluster (1-based).
        first: usize,
        /// Second cluster (1-based).
        second: usize,
    },
    /// One cluster lists the same process twice among its replicas (it would start two
    /// processes of that address, and the second would receive nothing).
    #[error("cluster {cluster} lists process {addr} twice; each replica is a process of its own")]
    ReplicaTwice {
        /// The address.
        addr: String,
        /// The cluster (1-based).
        cluster: usize,
    },
    /// A cluster with a serial stage is replicated on several processes.
    #[error(
        "cluster {cluster} holds serial stage '{stage}' and cannot be mapped to {processes} processes"
    )]
    SerialReplicated {
        /// The serial stage.
        stage: String,
        /// The cluster (1-based).
        cluster: usize,
        /// Number of processes.
        processes: usize,
    },
    /// A process address is not `host:port`.
    #[error("process address '{addr}' is not host:port")]
    BadAddress {
        /// The address.
        addr: String,
    },
    /// A stage's `bind` refused the graph.
    #[error("bind of stage '{stage}' refused the graph: {message}")]
    BindRefused {
        /// The stage.
        stage: String,
        /// Its message.
        message: String,
    },
}

/// A connector being added; choose its kind (decoupled by default).
pub struct ConnectorBuilder<'g> {
    connector: &'g mut Connector,
}

impl ConnectorBuilder<'_> {
    /// Makes the connector `local`.
    pub fn local(self) -> Self {
        self.kind(ConnectorKind::Local)
    }
    /// Makes the connector `cohort` (direct hand-off).
    pub fn cohort(self) -> Self {
        self.kind(ConnectorKind::Cohort)
    }
    /// Makes the connector `decoupled` (the default).
    pub fn decoupled(self) -> Self {
        self.kind(ConnectorKind::Decoupled)
    }
    /// Sets the connector kind.
    pub fn kind(self, kind: ConnectorKind) -> Self {
        self.connector.kind = kind;
        self
    }
}

/// The processes one cluster is mapped to (more than one: replicas, round-robin).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Processes(pub Vec<String>);

impl From<&str> for Processes {
    fn from(s: &str) -> Self {
        Processes(vec![s.to_owned()])
    }
}
impl From<String> for Processes {
    fn from(s: String) -> Self {
        Processes(vec![s])
    }
}
impl<S: Into<String>> From<Vec<S>> for Processes {
    fn from(v: Vec<S>) -> Self {
        Processes(v.into_iter().map(Into::into).collect())
    }
}

/// A stage graph.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    name: String,
    stages: Vec<Stage>,
    /// The ids of `stages` (adding a stage to a graph of thousands was quadratic).
    ids: std::collections::HashSet<StageId>,
    connectors: Vec<Connector>,
    partition: Option<Vec<Cluster>>,
    mapping: Option<Vec<Processes>>,
}

/// The validated layout of a graph: clusters in order, each with its processes.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The clusters, in partition order.
    pub clusters: Vec<Cluster>,
    /// The processes of each cluster (`None` when the graph was not mapped: all local).
    pub processes: Option<Vec<Processes>>,
    cluster_of: HashMap<StageId, usize>,
}

impl Plan {
    /// The index of the cluster that holds `stage`.
    pub fn cluster_of(&self, stage: &Stage) -> Option<usize> {
        self.cluster_of.get(&stage.id()).copied()
    }
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            ..Graph::default()
        }
    }

    /// The graph's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds a stage (connecting adds both ends automatically).
    pub fn add(&mut self, stage: &Stage) -> &mut Self {
        if self.ids.insert(stage.id()) {
            self.stages.push(stage.clone());
        }
        self
    }

    /// Connects `from`'s output `port` to `to`'s queue. The connector is decoupled
    /// unless the returned builder says otherwise.
    pub fn connect(
        &mut self,
        from: &Stage,
        port: impl Into<Port>,
        to: &Stage,
    ) -> ConnectorBuilder<'_> {
        self.add(from);
        self.add(to);
        self.connectors.push(Connector {
            from: from.clone(),
            port: port.into(),
            to: to.clone(),
            kind: ConnectorKind::Decoupled,
        });
        let connector = self.connectors.last_mut().expect("just pushed");
        ConnectorBuilder { connector }
    }

    /// The stages, in the order they were added.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// The connectors.
    pub fn connectors(&self) -> &[Connector] {
        &self.connectors
    }

    /// The stage named `name`.
    pub fn stage(&self, name: &str) -> Option<&Stage> {
        self.stages.iter().find(|s| s.name() == name)
    }

    /// The cluster of all stages (`graph:all()`).
    pub fn all(&self) -> Cluster {
        Cluster::of(&self.stages)
    }

    /// Sets the partition (`graph:part(c1, c2, ...)`), checking it at once.
    pub fn part(
        &mut self,
        clusters: impl IntoIterator<Item = Cluster>,
    ) -> Result<&mut Self, GraphError> {
        let clusters: Vec<Cluster> = clusters.into_iter().collect();
        self.check_partition(&clusters)?;
        self.partition = Some(clusters);
        self.mapping = None;
        Ok(self)
    }

    /// Maps the i-th cluster to the i-th entry (`graph:map(p1, p2, ...)`); an entry may
    /// list several processes to replicate a cluster (round-robin among replicas).
    pub fn map<P: Into<Processes>>(
        &mut self,
        processes: impl IntoIterator<Item = P>,
    ) -> Result<&mut Self, GraphError> {
        let processes: Vec<Processes> = processes.into_iter().map(Into::into).collect();
        let clusters = self
            .partition
            .as_ref()
            .ok_or(GraphError::MapWithoutPartition)?;
        check_mapping(clusters, &processes)?;
        self.mapping = Some(processes);
        Ok(self)
    }

    /// The partition, if set.
    pub fn partition(&self) -> Option<&[Cluster]> {
        self.partition.as_deref()
    }

    /// The mapping, if set.
    pub fn mapping(&self) -> Option<&[Processes]> {
        self.mapping.as_deref()
    }

    /// The connected output ports of `stage`.
    pub fn outputs(&self, stage: &Stage) -> Vec<Port> {
        self.connectors
            .iter()
            .filter(|c| &c.from == stage)
            .map(|c| c.port.clone())
            .collect()
    }

    /// Checks everything that can be checked before running: names, ports, partition,
    /// mapping, and every stage's `bind`. Returns the plan to run.
    pub fn verify(&self) -> Result<Plan, GraphError> {
        if self.stages.is_empty() {
            return Err(GraphError::Empty {
                graph: self.name.clone(),
            });
        }
        let mut names: HashMap<&str, StageId> = HashMap::new();
        for s in &self.stages {
            if let Some(id) = names.insert(s.name(), s.id())
                && id != s.id()
            {
                return Err(GraphError::DuplicateStageName {
                    name: s.name().to_owned(),
                });
            }
        }
        let mut bound: HashMap<(StageId, &Port), &Stage> = HashMap::new();
        for c in &self.connectors {
            if let Some(first) = bound.insert((c.from.id(), &c.port), &c.to) {
                return Err(GraphError::PortBoundTwice {
                    stage: c.from.name().to_owned(),
                    port: c.port.to_string(),
                    first: first.name().to_owned(),
                    second: c.to.name().to_owned(),
                });
            }
        }
        let clusters = match &self.partition {
            Some(p) => {
                self.check_partition(p)?;
                p.clone()
            }
            None => vec![self.all()],
        };
        if let Some(m) = &self.mapping {
            check_mapping(&clusters, m)?;
        }
        for s in &self.stages {
            let (bind, attrs) = {
                let spec = s.spec();
                (spec.bind.clone(), spec.attrs.clone())
            };
            if let Some(bind) = bind {
                let outputs = self.outputs(s);
                let ctx = BindCtx {
                    name: s.name(),
                    attrs: &attrs,
                    outputs: &outputs,
                };
                bind(&ctx).map_err(|message| GraphError::BindRefused {
                    stage: s.name().to_owned(),
                    message,
                })?;
            }
        }
        let cluster_of = clusters
            .iter()
            .enumerate()
            .flat_map(|(i, c)| c.stages().map(move |s| (s.id(), i)))
            .collect();
        Ok(Plan {
            clusters,
            processes: self.mapping.clone(),
            cluster_of,
        })
    }

    fn check_partition(&self, clusters: &[Cluster]) -> Result<(), GraphError> {
        let mut owner: HashMap<StageId, usize> = HashMap::new();
        for (i, c) in clusters.iter().enumerate() {
            if c.is_empty() {
                return Err(GraphError::EmptyCluster { cluster: i + 1 });
            }
            for s in c.stages() {
                if !self.ids.contains(&s.id()) {
                    return Err(GraphError::ForeignStage {
                        stage: s.name().to_owned(),
                        cluster: i + 1,
                    });
                }
                if let Some(first) = owner.insert(s.id(), i) {
                    return Err(GraphError::InTwoClusters {
                        stage: s.name().to_owned(),
                        first: first + 1,
                        second: i + 1,
                    });
                }
            }
        }
        if let Some(s) = self.stages.iter().find(|s| !owner.contains_key(&s.id())) {
            return Err(GraphError::Uncovered {
                stage: s.name().to_owned(),
            });
        }
        for c in self.connectors.iter().filter(|c| c.kind.is_local()) {
            let (a, b) = (owner[&c.from.id()], owner[&c.to.id()]);
            if a != b {
                return Err(GraphError::LocalAcrossClusters {
                    kind: c.kind,
                    from: c.from.name().to_owned(),
                    port: c.port.to_string(),
                    to: c.to.name().to_owned(),
                    from_cluster: a + 1,
                    to_cluster: b + 1,
                });
            }
        }
        Ok(())
    }

    /// The graph in Graphviz DOT: one subgraph per cluster (labelled with its processes
    /// when mapped), connectors labelled with port and kind.
    pub fn to_dot(&self) -> String {
        let clusters = self.partition.clone().unwrap_or_else(|| vec![self.all()]);
        let mut out = String::new();
        let _ = writeln!(out, "digraph \"{}\" {{", escape(&self.name));
        let _ = writeln!(out, "  node [shape=box, style=rounded];");
        for (i, c) in clusters.iter().enumerate() {
            let label = match self.mapping.as_ref().and_then(|m| m.get(i)) {
                Some(p) => format!("cluster {} @ {}", i + 1, p.0.join(", ")),
                None => format!("cluster {}", i + 1),
            };
            let _ = writeln!(
                out,
                "  subgraph cluster_{i} {{\n    label=\"{}\";",
                escape(&label)
            );
            for s in c.stages() {
                let shape = if s.is_serial() { ", peripheries=2" } else { "" };
                let _ = writeln!(
                    out,
                    "    \"{}\" [label=\"{}\"{shape}];",
                    escape(s.name()),
                    escape(s.name())
                );
            }
            let _ = writeln!(out, "  }}");
        }
        for c in &self.connectors {
            let style = match c.kind {
                ConnectorKind::Decoupled => "dashed",
                ConnectorKind::Local => "solid",
                ConnectorKind::Cohort => "bold",
            };
            let _ = writeln!(
                out,
                "  \"{}\" -> \"{}\" [label=\"{} ({})\", style={style}];",
                escape(c.from.name()),
                escape(c.to.name()),
                escape(&c.port.to_string()),
                c.kind
            );
        }
        out.push_str("}\n");
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn check_mapping(clusters: &[Cluster], processes: &[Processes]) -> Result<(), GraphError> {
    if clusters.len() != processes.len() {
        return Err(GraphError::MapArity {
            clusters: clusters.len(),
            processes: processes.len(),
        });
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, (c, p)) in clusters.iter().zip(processes).enumerate() {
        if p.0.is_empty() {
            return Err(GraphError::NoProcess { cluster: i + 1 });
        }
        for addr in &p.0 {
            let ok = addr
                .rsplit_once(':')
                .is_some_and(|(h, port)| !h.is_empty() && port.parse::<u16>().is_ok());
            if !ok {
                return Err(GraphError::BadAddress { addr: addr.clone() });
            }
            if let Some(first) = seen.insert(addr, i) {
                return Err(if first == i {
                    GraphError::ReplicaTwice {
                        addr: addr.clone(),
                        cluster: i + 1,
                    }
                } else {
                    GraphError::ProcessReused {
                        addr: addr.clone(),
                        first: first + 1,
                        second: i + 1,
                    }
                });
            }
        }
        if p.0.len() > 1
            && let Some(s) = c.stages().find(|s| s.is_serial())
        {
            return Err(GraphError::SerialReplicated {
                stage: s.name().to_owned(),
                cluster: i + 1,
                processes: p.0.len(),
            });
        }
    }
    Ok(())
}
