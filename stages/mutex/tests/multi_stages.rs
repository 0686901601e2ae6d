//! Multi-resource algorithms as Leda stages: the stage graph of a group under leda-core's
//! simulated executor, judged by the `MultiChecker` (per-instance exclusion, grants matching
//! requests, fences increasing per instance, token uniqueness, every request served).

use std::time::Duration;

use leda_core::sim::{Latency as NetLatency, NetModel};
use leda_mutex::Latency;
use leda_mutex::multi::stage::{MultiNodeEvent, MultiObserver};
use leda_mutex::multi::stage_sim::{MultiMonitor, named_space};
use leda_mutex::multi::{
    Clusters, Hold, MultiAlgorithm, MultiRequest, MultiStageSim, MultiVerdict, MultiViolation,
    MultiWorkload,
};

/// Seeds per algorithm and resource shape: 40 in CI, `MULTI_STAGE_SEEDS` for a soak.
fn seeds() -> u64 {
    std::env::var("MULTI_STAGE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
}

fn varied(algorithm: MultiAlgorithm, capacities: &[u32], seed: u64) -> MultiStageSim {
    let n = [2, 3, 4, 6][(seed % 4) as usize];
    let mut sim = MultiStageSim::new(algorithm, n, named_space(capacities).unwrap(), seed);
    let us = Duration::from_micros;
    sim.net = NetModel {
        latency: match (seed / 4) % 3 {
            0 => NetLatency::Constant(us(3)),
            1 => NetLatency::Uniform(us(1), us(20)),
            _ => NetLatency::Exponential(us(6)),
        },
        fifo: algorithm.requires_fifo() || seed.is_multiple_of(2),
        spike: if seed.is_multiple_of(3) {
            (0.05, us(200))
        } else {
            (0.0, Duration::ZERO)
        },
        ..NetModel::default()
    };
    sim.workload = MultiWorkload {
        requests_per_node: 3,
        size_req: 1 + (seed as usize % capacities.len()),
        cs_duration: Latency::Uniform { min: 1, max: 8 },
        cs_per_resource: 1,
        think_time: if (seed / 12).is_multiple_of(2) {
            Latency::Uniform { min: 0, max: 3 }
        } else {
            Latency::Exponential { min: 0, mean: 60.0 }
        },
    };
    sim
}

#[test]
fn every_multi_algorithm_is_safe_and_live_as_stages_single_instance() {
    for &algorithm in MultiAlgorithm::ALL {
        let (mut tokens, mut messages) = (0, 0);
        for seed in 0..seeds() {
            let sim = varied(algorithm, &[1, 1, 1, 1, 1], seed);
            let r = sim.run().expect("valid configuration");
            assert_eq!(
                r.verdict,
                MultiVerdict::Ok,
                "{algorithm} seed {seed} n {}",
                sim.n
            );
            assert_eq!(
                r.stats.grants as usize,
                3 * sim.n,
                "{algorithm} seed {seed}"
            );
            assert_eq!(r.stats.releases, r.stats.grants);
            tokens += r.stats.token_messages;
            messages += r.stats.messages;
        }
        assert!(messages > 0, "{algorithm}: the runs sent no message");
        let space = named_space(&[1]).unwrap();
        if algorithm.node(0, 1, space.space()).unwrap().token_based() {
            // Token uniqueness was checked after every handler: make sure tokens moved.
            assert!(tokens > 0, "{algorithm}: the runs never moved a token");
        }
    }
}

#[test]
fn every_multi_algorithm_is_safe_and_live_as_stages_multi_instance() {
    for &algorithm in MultiAlgorithm::ALL.iter().filter(|a| a.multi_instance()) {
        for seed in 0..seeds() {
            let sim = varied(algorithm, &[3, 1, 2], seed);
            let r = sim.run().expect("valid configuration");
            assert_eq!(
                r.verdict,
                MultiVerdict::Ok,
                "{algorithm} seed {seed} n {}",
                sim.n
            );
            assert_eq!(r.stats.grants as usize, 3 * sim.n);
        }
    }
}

#[test]
fn same_seed_same_trace() {
    let run = |seed| {
        let sim = varied(MultiAlgorithm::Incremental, &[1, 2, 1], seed);
        sim.run().unwrap()
    };
    let (a, b, c) = (run(13), run(13), run(14));
    assert!(a.verdict.is_ok() && c.verdict.is_ok());
    assert!(a.trace.len() > 20, "{} lines", a.trace.len());
    assert_eq!(a.trace, b.trace);
    assert_eq!(a.stats, b.stats);
    assert_ne!(a.trace, c.trace);
}

#[test]
fn clusters_slow_down_inter_cluster_links() {
    // Every algorithm over 3 clusters of 2 (the grid-aware one is told the layout).
    for &algorithm in MultiAlgorithm::ALL {
        let mut fast = 0;
        let mut slow = 0;
        let mut remote_msgs = 0;
        for seed in 0..6 {
            let mut total = [0u64; 2];
            for (i, remote) in [1u64, 500].into_iter().enumerate() {
                let mut sim =
                    MultiStageSim::new(algorithm, 6, named_space(&[1, 1, 1]).unwrap(), seed);
                sim.net.latency = NetLatency::Constant(Duration::from_micros(1));
                sim.clusters = Some(Clusters::even(6, 3, Latency::Constant(remote)).unwrap());
                let r = sim.run().unwrap();
                assert!(
                    r.verdict.is_ok(),
                    "{algorithm} seed {seed} remote {remote}: {:?}",
                    r.verdict
                );
                assert_eq!(
                    r.stats.messages_local + r.stats.messages_remote,
                    r.stats.messages
                );
                remote_msgs += r.stats.messages_remote;
                total[i] = r.end_time;
            }
            fast += total[0];
            slow += total[1];
        }
        assert!(remote_msgs > 0, "{algorithm}: no inter-cluster message");
        assert!(
            slow > fast,
            "{algorithm}: remote 500 µs ({slow}) not slower than 1 µs ({fast})"
        );
    }
}

#[test]
fn bad_configurations_are_refused() {
    let mut sim = MultiStageSim::new(
        MultiAlgorithm::Incremental,
        3,
        named_space(&[1]).unwrap(),
        1,
    );
    sim.clusters = Some(Clusters::even(2, 1, Latency::Constant(1)).unwrap());
    assert!(sim.run().is_err(), "cluster map of the wrong size");
    assert!(named_space(&[]).is_err());
    assert!(named_space(&[2, 0]).is_err());
}

/// The monitor the stages report to catches what a broken node would do.
#[test]
fn the_monitor_catches_double_grants_and_duplicated_tokens() {
    let space = named_space(&[1, 2]).unwrap();
    let req = MultiRequest::set([0], space.space()).unwrap();
    let hold = Hold {
        resource: 0,
        instance: 0,
        fence: 1,
    };
    // Two processes granted the single instance of resource 0.
    let m = MultiMonitor::new(MultiAlgorithm::Incremental, 2, space.clone()).unwrap();
    m.observe(0.0, 0, MultiNodeEvent::Request(&req));
    m.observe(0.0, 1, MultiNodeEvent::Request(&req));
    m.observe(1e-6, 0, MultiNodeEvent::Grant(&[hold]));
    m.observe(2e-6, 1, MultiNodeEvent::Grant(&[Hold { fence: 2, ..hold }]));
    assert!(matches!(
        m.failure(),
        Some(MultiVerdict::Violation(MultiViolation::Exclusion {
            holder: 0,
            intruder: 1,
            ..
        }))
    ));
    // A token sent while the sender still reports holding it: two tokens for instance 0.
    let m = MultiMonitor::new(MultiAlgorithm::Incremental, 2, space.clone()).unwrap();
    m.observe(
        0.0,
        0,
        MultiNodeEvent::Send {
            to: 1,
            kind: "token",
            token: Some(0),
        },
    );
    m.observe(0.0, 0, MultiNodeEvent::Tokens(&[true, false, true]));
    assert!(matches!(
        m.failure(),
        Some(MultiVerdict::Violation(MultiViolation::TokenCount {
            resource: 0,
            instance: 0,
            count: 2,
            ..
        }))
    ));
    // A grant the process never asked for.
    let m = MultiMonitor::new(MultiAlgorithm::Incremental, 2, space).unwrap();
    m.observe(0.0, 1, MultiNodeEvent::Grant(&[hold]));
    assert!(matches!(
        m.failure(),
        Some(MultiVerdict::Violation(MultiViolation::SpuriousGrant {
            node: 1,
            ..
        }))
    ));
}

/// The node stage's own protocol, driven by a scripted client: bad input is refused with a
/// reason and changes nothing; a grant names every instance with its fence.
#[test]
fn the_multi_node_stage_refuses_bad_input_and_keeps_going() {
    use std::sync::{Arc, Mutex};

    use leda_core::prelude::*;
    use leda_core::sim::Simulation;
    use leda_mutex::multi::{MultiNodeSpec, multi_node_stage};

    let space = named_space(&[1, 2]).unwrap();
    let node = multi_node_stage(MultiNodeSpec {
        algorithm: MultiAlgorithm::Incremental,
        id: 0,
        n: 1,
        resources: space,
        clusters: 1,
        observer: None,
    })
    .unwrap();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    // Each reply triggers the next step of the script.
    let script: Vec<Vec<Value>> = vec![
        vec!["request".into(), Value::Array(vec![])],
        vec![
            "request".into(),
            Value::Array(vec![Value::Array(vec!["r1".into(), Value::Int(2)])]),
        ],
        vec!["request".into(), Value::Array(vec!["r0".into()])],
        vec!["release".into()],
        vec!["cancel".into()],
    ];
    let client = Stage::stateful(
        "client",
        move |_: &Attrs| -> Result<usize, BoxError> { Ok(0) },
        move |step: &mut usize, ev: Event, ctx: &mut Ctx| {
            let tag: String = ev.get(0)?;
            if tag != "start" {
                let detail = match tag.as_str() {
                    "multi-grant" => format!("{:?}", ev.arg(1)),
                    "multi-refused" => ev.get::<String>(1)?,
                    _ => String::new(),
                };
                log.lock().unwrap().push(format!("{tag} {detail}"));
            }
            if tag == "start" {
                // A release without a grant first.
                ctx.send("mutex", "release")?;
            } else if let Some(next) = script.get(*step) {
                *step += 1;
                ctx.send("mutex", Event::from_values(next.clone()))?;
            } else {
                ctx.quit("done");
            }
            Ok(())
        },
    )
    .serial()
    .autostart("start");
    let mut g = Graph::new("script");
    g.connect(&client, "mutex", &node).local();
    g.connect(&node, "grant", &client).local();
    Simulation::new(1).run(&g).unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 6, "{seen:#?}");
    assert!(
        seen[0].starts_with("multi-refused release without"),
        "{seen:?}"
    );
    assert!(seen[1].contains("at least one resource"), "{seen:?}");
    // Both instances of r1, each with a fence.
    assert!(
        seen[2].starts_with("multi-grant") && seen[2].matches("r1").count() == 2,
        "{seen:?}"
    );
    assert!(seen[3].contains("already pending or held"), "{seen:?}");
    assert_eq!(seen[4].trim(), "multi-released");
    assert_eq!(
        seen[5].trim(),
        "multi-released",
        "a cancel with nothing pending"
    );
}
