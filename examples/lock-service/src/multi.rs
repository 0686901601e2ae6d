//! Multi-resource locks in a lock-service group (issue #10): every node gets a multi node
//! stage (`multi<i>`, a multi-resource algorithm of `leda-mutex` chosen by name) beside its
//! single-resource node stage, joined to the node's front (port `multi`) and to the other
//! nodes' multi stages by decoupled connectors. Clients then call
//! [`crate::LocalClient::acquire_all`] / [`crate::LocalClient::acquire_counts`] (Rust) or send
//! `("acquire_all", id, items)` to the front (Lua; protocol in [`crate::front`]).

use leda_mutex::MutexError;
use leda_mutex::multi::stage::{MultiNodeSpec, multi_node_name};
use leda_mutex::multi::{MultiAlgorithm, NamedSpace, multi_node_stage};
use leda_mutex::stage::connect_peers;

use crate::group::GroupGraph;

/// The multi-resource locks of a group.
#[derive(Debug, Clone)]
pub struct MultiServiceConfig {
    /// The algorithm every node runs for them.
    pub algorithm: MultiAlgorithm,
    /// The locks: `(name, instances)`. Names must differ from the single-resource locks'.
    pub resources: Vec<(String, u32)>,
}

impl MultiServiceConfig {
    /// Single-instance locks with these names.
    pub fn set(algorithm: MultiAlgorithm, names: &[&str]) -> Self {
        Self {
            algorithm,
            resources: names.iter().map(|n| ((*n).to_owned(), 1)).collect(),
        }
    }
}

/// Adds the multi node stages to a group built by [`crate::group::build_group`]: `multi<i>`
/// in node `i`'s cluster, connected to `front<i>` both ways, multi stages joined pairwise; the
/// fronts learn the locks through their `multi` attribute. Fails on a bad configuration (no
/// lock, a repeated name, zero instances, a name also used by a single-resource lock, a front
/// missing).
pub fn attach_multi(
    built: &mut GroupGraph,
    single: &[String],
    cfg: &MultiServiceConfig,
) -> Result<(), MutexError> {
    let space = NamedSpace::new(&cfg.resources)?;
    if let Some(both) = single.iter().find(|r| space.contains(r)) {
        return Err(MutexError::Config(format!(
            "resource {both:?} is configured both as a lock and as a multi-resource lock"
        )));
    }
    let n = built.clusters.len();
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let front = built
            .graph
            .stage(&format!("front{i}"))
            .cloned()
            .ok_or_else(|| MutexError::Config(format!("the group has no stage front{i}")))?;
        if built.graph.stage(&multi_node_name(i)).is_some() {
            return Err(MutexError::Config(format!(
                "the group already has a stage {}",
                multi_node_name(i)
            )));
        }
        front.set_attr("multi", space.to_value());
        let node = multi_node_stage(MultiNodeSpec {
            algorithm: cfg.algorithm,
            id: i,
            n,
            resources: space.clone(),
            clusters: 1,
            observer: None,
        })?;
        built.graph.connect(&front, "multi", &node).local();
        built.graph.connect(&node, "grant", &front).local();
        built.clusters[i].insert(&node);
        nodes.push(node);
    }
    connect_peers(&mut built.graph, &nodes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ApiShared;
    use crate::group::{ServiceConfig, Side, build_group, registry};

    fn built() -> GroupGraph {
        let cfg = ServiceConfig {
            algorithm: leda_mutex::Algorithm::NaimiTrehel,
            nodes: 2,
            resources: vec!["a".into()],
        };
        let sides = vec![Side::Api(ApiShared::new()), Side::Api(ApiShared::new())];
        build_group(&cfg, &sides, None).unwrap()
    }

    #[test]
    fn attached_stages_rebuild_from_their_attributes() {
        let mut g = built();
        let cfg = MultiServiceConfig {
            algorithm: MultiAlgorithm::BouabdallahLaforest,
            resources: vec![("x".into(), 1), ("gpu".into(), 2)],
        };
        attach_multi(&mut g, &["a".into()], &cfg).unwrap();
        for i in 0..2 {
            let node = g.graph.stage(&multi_node_name(i)).unwrap();
            assert!(
                g.clusters[i].contains(node),
                "multi{i} in node {i}'s cluster"
            );
            let front = g.graph.stage(&format!("front{i}")).unwrap();
            // What a daemon gets: kind and attributes.
            let reg = registry();
            for stage in [node, front] {
                let kind = stage.kind_name().unwrap();
                let rebuilt = reg.build(stage.name(), &kind, &stage.attrs()).unwrap();
                assert_eq!(rebuilt.attrs().get("multi"), stage.attrs().get("multi"));
                assert_eq!(
                    rebuilt.attrs().get("resources"),
                    stage.attrs().get("resources")
                );
            }
        }
        // A second attachment would duplicate the stages.
        assert!(attach_multi(&mut g, &["a".into()], &cfg).is_err());
    }
}
