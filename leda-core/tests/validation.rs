//! Every graph, partition and mapping error, each naming what is involved.

use leda_core::error::RunError;
use leda_core::graph::GraphError;
use leda_core::prelude::*;

fn stage(name: &str) -> Stage {
    Stage::new(name, |_, _| Ok(()))
}

#[test]
fn empty_graph() {
    let g = Graph::new("nothing");
    assert_eq!(
        g.verify().unwrap_err(),
        GraphError::Empty {
            graph: "nothing".into()
        }
    );
}

#[test]
fn duplicate_stage_names() {
    let mut g = Graph::new("g");
    g.connect(&stage("a"), 1, &stage("a"));
    assert_eq!(
        g.verify().unwrap_err(),
        GraphError::DuplicateStageName { name: "a".into() }
    );
}

#[test]
fn port_bound_twice() {
    let (a, b, c) = (stage("a"), stage("b"), stage("c"));
    let mut g = Graph::new("g");
    g.connect(&a, "out", &b);
    g.connect(&a, "out", &c);
    let e = g.verify().unwrap_err();
    assert_eq!(
        e,
        GraphError::PortBoundTwice {
            stage: "a".into(),
            port: "out".into(),
            first: "b".into(),
            second: "c".into()
        }
    );
    assert!(e.to_string().contains("'out' of stage 'a'"), "{e}");
}

#[test]
fn input_queue_may_have_many_connectors() {
    let (a, b, c) = (stage("a"), stage("b"), stage("c"));
    let mut g = Graph::new("g");
    g.connect(&a, 1, &c);
    g.connect(&b, 1, &c);
    g.connect(&a, 2, &c);
    assert!(g.verify().is_ok());
}

#[test]
fn partition_must_cover_every_stage() {
    let (a, b, c) = (stage("a"), stage("b"), stage("c"));
    let mut g = Graph::new("g");
    g.connect(&a, 1, &b);
    g.connect(&b, 1, &c);
    let e = g.part([Cluster::of([&a]), Cluster::of([&b])]).unwrap_err();
    assert_eq!(e, GraphError::Uncovered { stage: "c".into() });
}

#[test]
fn partition_clusters_must_be_disjoint() {
    let (a, b) = (stage("a"), stage("b"));
    let mut g = Graph::new("g");
    g.connect(&a, 1, &b);
    let e = g
        .part([Cluster::of([&a, &b]), Cluster::of([&b])])
        .unwrap_err();
    assert_eq!(
        e,
        GraphError::InTwoClusters {
            stage: "b".into(),
            first: 1,
            second: 2
        }
    );
}

#[test]
fn partition_only_holds_graph_stages() {
    let (a, b, x) = (stage("a"), stage("b"), stage("x"));
    let mut g = Graph::new("g");
    g.connect(&a, 1, &b);
    let e = g
        .part([Cluster::of([&a, &b]), Cluster::of([&x])])
        .unwrap_err();
    assert_eq!(
        e,
        GraphError::ForeignStage {
            stage: "x".into(),
            cluster: 2
        }
    );
}

#[test]
fn empty_cluster_is_refused() {
    let a = stage("a");
    let mut g = Graph::new("g");
    g.add(&a);
    let e = g.part([g.all(), Cluster::default()]).unwrap_err();
    assert_eq!(e, GraphError::EmptyCluster { cluster: 2 });
}

#[test]
fn local_and_cohort_connectors_stay_in_one_cluster() {
    for kind in [ConnectorKind::Local, ConnectorKind::Cohort] {
        let (a, b) = (stage("a"), stage("b"));
        let mut g = Graph::new("g");
        g.connect(&a, "sock", &b).kind(kind);
        let e = g.part([Cluster::of([&a]), Cluster::of([&b])]).unwrap_err();
        assert_eq!(
            e,
            GraphError::LocalAcrossClusters {
                kind,
                from: "a".into(),
                port: "sock".into(),
                to: "b".into(),
                from_cluster: 1,
                to_cluster: 2
            }
        );
        assert!(g.part([Cluster::of([&a, &b])]).is_ok());
    }
    // Decoupled connectors may cross clusters.
    let (a, b) = (stage("a"), stage("b"));
    let mut g = Graph::new("g");
    g.connect(&a, 1, &b);
    assert!(g.part([Cluster::of([&a]), Cluster::of([&b])]).is_ok());
}

fn two_clusters() -> (Graph, Stage, Stage) {
    let (a, b) = (stage("a"), stage("b"));
    let mut g = Graph::new("g");
    g.connect(&a, 1, &b);
    g.part([Cluster::of([&a]), Cluster::of([&b])]).unwrap();
    (g, a, b)
}

#[test]
fn map_arity_and_order() {
    let mut g = Graph::new("g");
    g.add(&stage("a"));
    assert_eq!(
        g.map(["127.0.0.1:1"]).unwrap_err(),
        GraphError::MapWithoutPartition
    );
    let (mut g, _, _) = two_clusters();
    assert_eq!(
        g.map(["127.0.0.1:1"]).unwrap_err(),
        GraphError::MapArity {
            clusters: 2,
            processes: 1
        }
    );
    assert!(g.map(["127.0.0.1:1", "127.0.0.1:2"]).is_ok());
}

#[test]
fn map_rejects_bad_addresses_and_shared_processes() {
    let (mut g, _, _) = two_clusters();
    assert_eq!(
        g.map(["127.0.0.1:1", "nohost"]).unwrap_err(),
        GraphError::BadAddress {
            addr: "nohost".into()
        }
    );
    assert_eq!(
        g.map(["127.0.0.1:1", "127.0.0.1:99999"]).unwrap_err(),
        GraphError::BadAddress {
            addr: "127.0.0.1:99999".into()
        }
    );
    assert_eq!(
        g.map(["127.0.0.1:1", "127.0.0.1:1"]).unwrap_err(),
        GraphError::ProcessReused {
            addr: "127.0.0.1:1".into(),
            first: 1,
            second: 2
        }
    );
    let none: Vec<String> = vec![];
    assert_eq!(
        g.map([Processes::from("127.0.0.1:1"), Processes::from(none)])
            .unwrap_err(),
        GraphError::NoProcess { cluster: 2 }
    );
}

use leda_core::graph::Processes;

#[test]
fn serial_cluster_cannot_be_replicated() {
    let a = stage("a");
    let b = stage("b").serial();
    let mut g = Graph::new("g");
    g.connect(&a, 1, &b);
    g.part([Cluster::of([&a]), Cluster::of([&b])]).unwrap();
    let e = g
        .map([
            Processes::from("127.0.0.1:1"),
            Processes::from(vec!["127.0.0.1:2", "127.0.0.1:3"]),
        ])
        .unwrap_err();
    assert_eq!(
        e,
        GraphError::SerialReplicated {
            stage: "b".into(),
            cluster: 2,
            processes: 2
        }
    );
    // A parallel cluster may be replicated.
    assert!(
        g.part([Cluster::of([&b]), Cluster::of([&a])])
            .unwrap()
            .map([
                Processes::from("127.0.0.1:1"),
                Processes::from(vec!["127.0.0.1:2", "127.0.0.1:3"])
            ])
            .is_ok()
    );
}

#[test]
fn bind_sees_attributes_and_outputs_and_can_refuse() {
    let matcher = Stage::new("match", |_, _| Ok(()))
        .attr("pattern", "err")
        .bind(|b| {
            if !b.has_output(1) {
                return Err("port 1 must be connected".into());
            }
            match b.attrs.get_as::<Option<String>>("pattern") {
                Ok(Some(_)) => Ok(()),
                _ => Err("attribute 'pattern' is required".into()),
            }
        });
    let mut g = Graph::new("g");
    g.add(&matcher);
    assert_eq!(
        g.verify().unwrap_err(),
        GraphError::BindRefused {
            stage: "match".into(),
            message: "port 1 must be connected".into()
        }
    );
    g.connect(&matcher, 1, &stage("print"));
    assert!(g.verify().is_ok());
    matcher.set_attr("pattern", ());
    let e = g.run(Run::default()).unwrap_err();
    assert!(
        e.to_string().contains("attribute 'pattern' is required"),
        "{e}"
    );
}

#[test]
fn run_refuses_remote_clusters_without_transport() {
    let (mut g, _, _) = two_clusters();
    g.map(["127.0.0.1:7001", "127.0.0.1:7002"]).unwrap();
    match g.run(Run::default().threads(1)) {
        Err(RunError::NoTransport { cluster: 2, addr }) => assert_eq!(addr, "127.0.0.1:7002"),
        other => panic!("unexpected {other:?}"),
    }
    match g.run(Run::default().process("127.0.0.1:9")) {
        Err(RunError::NotMapped { addr }) => assert_eq!(addr, "127.0.0.1:9"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn dot_output_shows_clusters_and_kinds() {
    let (a, b, c) = (stage("a"), stage("b"), stage("c"));
    let mut g = Graph::new("demo");
    g.connect(&a, "x", &b).local();
    g.connect(&b, 1, &c);
    g.part([Cluster::of([&a, &b]), Cluster::of([&c])])
        .unwrap()
        .map(["h:1", "h:2"])
        .unwrap();
    let dot = g.to_dot();
    assert!(dot.contains("subgraph cluster_0"), "{dot}");
    assert!(dot.contains("cluster 2 @ h:2"), "{dot}");
    assert!(
        dot.contains("\"a\" -> \"b\" [label=\"x (local)\", style=solid]"),
        "{dot}"
    );
    assert!(
        dot.contains("\"b\" -> \"c\" [label=\"1 (decoupled)\", style=dashed]"),
        "{dot}"
    );
}

#[test]
fn a_replica_listed_twice_is_refused() {
    let (a, b) = (stage("a"), stage("b"));
    let mut g = Graph::new("g");
    g.connect(&a, 1, &b);
    g.part([Cluster::of([&a]), Cluster::of([&b])]).unwrap();
    let e = g
        .map([vec!["127.0.0.1:1"], vec!["127.0.0.1:2", "127.0.0.1:2"]])
        .unwrap_err();
    assert_eq!(
        e,
        GraphError::ReplicaTwice {
            addr: "127.0.0.1:2".into(),
            cluster: 2
        }
    );
    assert_eq!(
        e.to_string(),
        "cluster 2 lists process 127.0.0.1:2 twice; each replica is a process of its own"
    );
    // Distinct replicas are fine.
    assert!(
        g.map([vec!["127.0.0.1:1"], vec!["127.0.0.1:2", "127.0.0.1:3"]])
            .is_ok()
    );
}
