//! The deployment message: what a launcher sends each daemon, and how both sides turn
//! it into a graph and a route table.
//!
//! Every daemon receives the whole graph *shape* (all stage names, all connectors, the
//! partition and the mapping) so that it can validate and route exactly like the
//! launcher, but only the stages of its own cluster carry their kind, attributes and
//! initial events: the others become inert placeholders.

use std::collections::HashMap;

use leda_core::connector::ConnectorKind;
use leda_core::event::Event;
use leda_core::graph::{Graph, Processes};
use leda_core::port::Port;
use leda_core::prelude::Cluster;
use leda_core::stage::{Attrs, Stage};
use leda_core::value::Value;
use serde::{Deserialize, Serialize};

use crate::registry::{Registry, ResolveError};

/// One stage as deployed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StageDesc {
    /// The stage's name (its identity across processes).
    pub name: String,
    /// The registered kind (`None` for stages the receiver does not run).
    pub kind: Option<String>,
    /// Attributes.
    pub attrs: Vec<(String, Value)>,
    /// Serial stage.
    pub serial: bool,
    /// Instance limit.
    pub maxpar: Option<usize>,
    /// Queue capacity.
    pub capacity: Option<usize>,
    /// Initial events (arguments) the receiver must push.
    pub pushed: Vec<Vec<Value>>,
    /// Fail-stop stage (`Stage::fail_stop`); absent from older launchers' deployments.
    #[serde(default)]
    pub fail_stop: bool,
    /// Declared `Stage::nonblocking` where the graph was built (a Lua stage's
    /// `nonblocking = true`); absent from older launchers' deployments, and left out
    /// when `false` (the last field of a positional array: a daemon that predates it
    /// still reads such a deployment). A stage whose kind's constructor declares it is
    /// nonblocking either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nonblocking: bool,
}

/// One connector as deployed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConnectorDesc {
    /// Emitting stage.
    pub from: String,
    /// Port.
    pub port: Port,
    /// Receiving stage.
    pub to: String,
    /// `decoupled`, `local` or `cohort`.
    pub kind: String,
}

/// A deployment for one daemon.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Deployment {
    /// Identifies the deployment (peer links of the same run carry it).
    pub id: u64,
    /// The graph's name.
    pub graph: String,
    /// The launcher's address in the mapping.
    pub launcher: String,
    /// The receiving daemon's address in the mapping.
    pub target: String,
    /// Every stage of the graph.
    pub stages: Vec<StageDesc>,
    /// Every connector.
    pub connectors: Vec<ConnectorDesc>,
    /// Stage names of each cluster, in partition order.
    pub clusters: Vec<Vec<String>>,
    /// Processes of each cluster.
    pub mapping: Vec<Vec<String>>,
    /// Worker threads for the receiving process (`None`: its own default).
    pub threads: Option<usize>,
    /// How every link of the run tells a live peer from a lost one.
    pub liveness: crate::link::Liveness,
    /// What every process does when another is lost.
    pub on_loss: leda_core::runtime::OnProcessLoss,
    /// Under `Continue`, the daemons go on when the launcher is lost too
    /// ([`leda_core::runtime::Run::outlive_launcher`]).
    #[serde(default)]
    pub outlive_launcher: bool,
}

/// One route: a distinct (from, to) pair of stages, identified on the wire by its index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteInfo {
    /// Emitting stage.
    pub from: String,
    /// Receiving stage.
    pub to: String,
    /// Initial credit a sender gets on this route towards each receiving process.
    pub window: u32,
}

/// Default credit window per route and peer: at most this many events unacknowledged.
pub const DEFAULT_WINDOW: u32 = 32768;

impl Deployment {
    /// The deployment shape of `graph` (no stage carries pushed events yet).
    /// Fails when a stage the launcher does not run has no kind.
    pub fn from_graph(
        graph: &Graph,
        launcher: &str,
        id: u64,
        threads: Option<usize>,
    ) -> Result<Deployment, String> {
        let plan = graph.verify().map_err(|e| e.to_string())?;
        let mapping: Vec<Vec<String>> = plan
            .processes
            .clone()
            .ok_or("the graph is not mapped: call part and map first")?
            .into_iter()
            .map(|Processes(p)| p)
            .collect();
        let mine = mapping
            .iter()
            .position(|p| p.iter().any(|a| a == launcher))
            .ok_or_else(|| format!("the launcher's address {launcher} runs no cluster"))?;
        let mut stages = Vec::new();
        for s in graph.stages() {
            let remote = plan.cluster_of(s) != Some(mine);
            let kind = s.kind_name();
            if remote && kind.is_none() {
                return Err(ResolveError::NoKind {
                    stage: s.name().into(),
                }
                .to_string());
            }
            stages.push(StageDesc {
                name: s.name().into(),
                kind,
                attrs: s
                    .attrs()
                    .iter()
                    .map(|(k, v)| (k.to_owned(), v.clone()))
                    .collect(),
                serial: s.is_serial(),
                maxpar: s.maxpar_setting(),
                capacity: s.capacity_setting(),
                pushed: Vec::new(),
                fail_stop: s.is_fail_stop(),
                nonblocking: s.is_nonblocking(),
            });
        }
        Ok(Deployment {
            id,
            graph: graph.name().into(),
            launcher: launcher.into(),
            target: String::new(),
            stages,
            connectors: graph
                .connectors()
                .iter()
                .map(|c| ConnectorDesc {
                    from: c.from.name().into(),
                    port: c.port.clone(),
                    to: c.to.name().into(),
                    kind: c.kind.as_str().into(),
                })
                .collect(),
            clusters: plan
                .clusters
                .iter()
                .map(|c| c.stages().map(|s| s.name().to_owned()).collect())
                .collect(),
            mapping,
            threads,
            liveness: crate::link::Liveness::default(),
            on_loss: leda_core::runtime::OnProcessLoss::End,
            outlive_launcher: false,
        })
    }

    /// The cluster index that `addr` runs.
    pub fn cluster_of_process(&self, addr: &str) -> Option<usize> {
        self.mapping
            .iter()
            .position(|p| p.iter().any(|a| a == addr))
    }

    /// Every process of the mapping, in order.
    pub fn processes(&self) -> impl Iterator<Item = &str> {
        self.mapping.iter().flatten().map(String::as_str)
    }

    /// The route table: distinct (from, to) pairs of connectors, in connector order.
    pub fn routes(&self) -> Vec<RouteInfo> {
        let capacity: HashMap<&str, Option<usize>> = self
            .stages
            .iter()
            .map(|s| (s.name.as_str(), s.capacity))
            .collect();
        let mut out: Vec<RouteInfo> = Vec::new();
        for c in &self.connectors {
            if out.iter().any(|r| r.from == c.from && r.to == c.to) {
                continue;
            }
            let cap = capacity
                .get(c.to.as_str())
                .copied()
                .flatten()
                .unwrap_or(leda_core::stage::DEFAULT_CAPACITY);
            out.push(RouteInfo {
                from: c.from.clone(),
                to: c.to.clone(),
                window: u32::try_from(cap)
                    .unwrap_or(u32::MAX)
                    .clamp(1, DEFAULT_WINDOW),
            });
        }
        out
    }

    /// Rebuilds the graph on the receiving side: the stages of `target`'s cluster from
    /// `registry` (with their attributes and initial events), the others as
    /// placeholders; then the connectors, the partition and the mapping.
    pub fn build_graph(&self, registry: &Registry) -> Result<Graph, String> {
        let mine = self
            .cluster_of_process(&self.target)
            .ok_or_else(|| format!("this process ({}) runs no cluster", self.target))?;
        let local: std::collections::HashSet<&str> = self
            .clusters
            .get(mine)
            .map(|c| c.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let mut g = Graph::new(self.graph.clone());
        let mut by_name: HashMap<&str, Stage> = HashMap::new();
        for d in &self.stages {
            let stage = if local.contains(d.name.as_str()) {
                let kind = d.kind.as_deref().ok_or_else(|| {
                    ResolveError::NoKind {
                        stage: d.name.clone(),
                    }
                    .to_string()
                })?;
                let mut attrs = Attrs::default();
                for (k, v) in &d.attrs {
                    attrs.set(k.clone(), v.clone());
                }
                let mut s = registry
                    .build(&d.name, kind, &attrs)
                    .map_err(|e| e.to_string())?;
                if d.serial {
                    s = s.serial();
                }
                if d.fail_stop {
                    s = s.fail_stop();
                }
                if d.nonblocking {
                    s = s.nonblocking();
                }
                if let Some(n) = d.maxpar {
                    s = s.maxpar(n);
                }
                if let Some(n) = d.capacity {
                    s = s.capacity(n);
                }
                for ev in &d.pushed {
                    s.push(Event::from_values(ev.iter().cloned()));
                }
                s
            } else {
                let name = d.name.clone();
                let mut s = Stage::new(d.name.clone(), move |_, _| {
                    Err(format!("stage '{name}' runs in another process").into())
                });
                if d.serial {
                    s = s.serial();
                }
                s
            };
            g.add(&stage);
            by_name.insert(d.name.as_str(), stage);
        }
        let get = |n: &str| {
            by_name
                .get(n)
                .ok_or_else(|| format!("connector names unknown stage '{n}'"))
        };
        for c in &self.connectors {
            let kind: ConnectorKind = c
                .kind
                .parse()
                .map_err(|_| format!("unknown connector kind '{}'", c.kind))?;
            g.connect(get(&c.from)?, c.port.clone(), get(&c.to)?)
                .kind(kind);
        }
        let mut clusters = Vec::new();
        for names in &self.clusters {
            let mut stages = Vec::new();
            for n in names {
                stages.push(get(n)?.clone());
            }
            clusters.push(Cluster::of(&stages));
        }
        g.part(clusters).map_err(|e| e.to_string())?;
        g.map(self.mapping.iter().map(|p| Processes(p.clone())))
            .map_err(|e| e.to_string())?;
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use leda_core::prelude::{BoxError, Ctx};

    use super::*;

    /// What is declared where the graph is built reaches the process that runs the
    /// stage: `nonblocking` set after the kind's constructor (a Lua stage's
    /// `nonblocking = true`) was not shipped, so the remote stage paid a pool worker's
    /// wake-up per event from another process. Also through the wire form.
    #[test]
    fn a_stage_declared_nonblocking_where_built_is_nonblocking_where_it_runs() {
        let kind = |name: &'static str| {
            move |_: &Attrs| -> Result<Stage, BoxError> {
                Ok(Stage::new(name, |_: Event, _: &mut Ctx| Ok(())).kind(name))
            }
        };
        let registry = Registry::new().with("a", kind("a")).with("b", kind("b"));
        let a = Stage::new("a", |_: Event, _: &mut Ctx| Ok(())).kind("a");
        let b = Stage::new("b", |_: Event, _: &mut Ctx| Ok(()))
            .kind("b")
            .nonblocking()
            .fail_stop();
        let mut g = Graph::new("g");
        g.connect(&a, 1, &b);
        g.part([Cluster::of([&a]), Cluster::of([&b])])
            .unwrap()
            .map(["127.0.0.1:1", "127.0.0.1:2"])
            .unwrap();
        let mut d = Deployment::from_graph(&g, "127.0.0.1:1", 1, None).unwrap();
        let wire = rmp_serde::to_vec(&d).unwrap();
        d = rmp_serde::from_slice(&wire).unwrap();
        d.target = "127.0.0.1:2".into();
        let built = d.build_graph(&registry).unwrap();
        let b = built.stage("b").unwrap();
        assert!(b.is_nonblocking() && b.is_fail_stop());
        assert!(!built.stage("a").unwrap().is_nonblocking());
    }

    /// A daemon from before `nonblocking` reads a stage that is not (review finding: the
    /// field made every deployment's stages one element longer, and such a daemon
    /// refused them all: "array had incorrect length, expected 8").
    #[test]
    fn a_daemon_from_before_nonblocking_reads_a_stage_without_it() {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Before {
            name: String,
            kind: Option<String>,
            attrs: Vec<(String, Value)>,
            serial: bool,
            maxpar: Option<usize>,
            capacity: Option<usize>,
            pushed: Vec<Vec<Value>>,
            fail_stop: bool,
        }
        let desc = StageDesc {
            name: "s".into(),
            fail_stop: true,
            ..StageDesc::default()
        };
        let old: Before = rmp_serde::from_slice(&rmp_serde::to_vec(&desc).unwrap()).unwrap();
        assert!(old.fail_stop && old.name == "s");
        let back: StageDesc = rmp_serde::from_slice(&rmp_serde::to_vec(&desc).unwrap()).unwrap();
        assert!(!back.nonblocking);
    }
}
