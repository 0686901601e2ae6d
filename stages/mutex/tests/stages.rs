//! The algorithms as Leda stages: the same stage graph under leda-core's simulated executor
//! (many seeds, varied network models, crashes, byte-identical traces) and in one process on the
//! real runtime, judged by the same checker.

use std::time::Duration;

use leda_core::sim::{Latency as NetLatency, NetModel};
use leda_mutex::{Algorithm, Latency, StageSim, Verdict};

/// Seeds per algorithm in CI: group size, latency distribution, FIFO-ness, spikes and load vary
/// with the seed.
const SEEDS: u64 = 100;

fn varied(algorithm: Algorithm, seed: u64) -> StageSim {
    let n = [2, 3, 5, 8][(seed % 4) as usize];
    let mut sim = StageSim::new(algorithm, n, seed);
    let us = Duration::from_micros;
    sim.net = NetModel {
        latency: match (seed / 4) % 3 {
            0 => NetLatency::Constant(us(3)),
            1 => NetLatency::Uniform(us(1), us(20)),
            _ => NetLatency::Exponential(us(6)),
        },
        // Non-FIFO links wherever the algorithm allows them.
        fifo: algorithm.requires_fifo(),
        spike: if seed.is_multiple_of(3) {
            (0.05, us(200))
        } else {
            (0.0, Duration::ZERO)
        },
        ..NetModel::default()
    };
    sim.requests = 3;
    sim.cs_time = Latency::Uniform { min: 1, max: 8 };
    sim.think_time = if (seed / 12).is_multiple_of(2) {
        Latency::Uniform { min: 0, max: 3 }
    } else {
        Latency::Exponential { min: 0, mean: 80.0 }
    };
    sim
}

#[test]
fn every_algorithm_is_safe_and_live_as_stages_under_many_seeds() {
    for algorithm in Algorithm::correct() {
        for seed in 0..SEEDS {
            let sim = varied(algorithm, seed);
            let r = sim.run().expect("valid configuration");
            assert_eq!(
                r.verdict,
                Verdict::Ok,
                "{algorithm} seed {seed} n {}: {}",
                sim.n,
                r.verdict
            );
            assert_eq!(r.metrics.cs_entries as usize, 3 * sim.n, "{algorithm}");
            assert!(r.metrics.fences.windows(2).all(|w| w[0] < w[1]));
        }
    }
}

#[test]
fn same_seed_same_trace_byte_for_byte() {
    let mk = |seed| {
        let mut s = StageSim::new(Algorithm::SuzukiKasami, 5, seed);
        s.net = NetModel {
            latency: NetLatency::Exponential(Duration::from_micros(5)),
            fifo: false,
            spike: (0.1, Duration::from_micros(100)),
            ..NetModel::default()
        };
        s.run().unwrap()
    };
    let (a, b, c) = (mk(7), mk(7), mk(8));
    assert!(a.verdict.is_ok() && c.verdict.is_ok());
    assert!(a.trace.len() > 50, "{} lines", a.trace.len());
    assert_eq!(a.trace.join("\n").as_bytes(), b.trace.join("\n").as_bytes());
    assert_eq!(a.metrics, b.metrics);
    assert_ne!(a.trace, c.trace);
}

/// One requester at a time: the stage engine counts exactly what the theory says.
#[test]
fn exact_message_counts_through_the_stages() {
    for n in [2, 4, 7] {
        let per_cs = |algorithm: Algorithm| {
            let mut s = StageSim::new(algorithm, n, 1);
            s.requesters = Some(vec![n - 1]);
            s.requests = 5;
            let r = s.run().unwrap();
            assert!(r.verdict.is_ok(), "{algorithm}: {}", r.verdict);
            r.metrics.msgs_per_cs().unwrap()
        };
        let nf = n as f64;
        assert_eq!(per_cs(Algorithm::RicartAgrawala), 2.0 * (nf - 1.0));
        assert_eq!(per_cs(Algorithm::Lamport), 3.0 * (nf - 1.0));
        assert_eq!(per_cs(Algorithm::Centralized), 3.0);
        // Suzuki–Kasami: N for the first CS, then the requester keeps the token.
        assert_eq!(per_cs(Algorithm::SuzukiKasami), nf / 5.0);
        let k = Algorithm::Maekawa.quorum_size(n).unwrap() as f64;
        let mae = per_cs(Algorithm::Maekawa);
        assert!(mae <= 3.0 * k, "maekawa {mae} > 3K = {}", 3.0 * k);
    }
}

#[test]
fn naive_maekawa_deadlock_is_caught_through_the_stages() {
    let mut caught = 0;
    for seed in 0..30 {
        let mut s = StageSim::new(Algorithm::MaekawaNaive, 9, seed);
        s.think_time = Latency::Constant(0);
        s.net.latency = NetLatency::Uniform(Duration::from_micros(1), Duration::from_micros(30));
        let r = s.run().unwrap();
        match r.verdict {
            Verdict::Ok => {}
            Verdict::Deadlock { ref waiting, .. } => {
                assert!(!waiting.is_empty());
                caught += 1;
            }
            other => panic!("seed {seed}: naive voting must be safe, got {other}"),
        }
        // The same seeds with Sanders' INQUIRE never deadlock.
        let mut s = StageSim::new(Algorithm::Maekawa, 9, seed);
        s.think_time = Latency::Constant(0);
        s.net.latency = NetLatency::Uniform(Duration::from_micros(1), Duration::from_micros(30));
        assert_eq!(s.run().unwrap().verdict, Verdict::Ok, "sanders seed {seed}");
    }
    assert!(caught > 0, "no seed exposed the naive voting deadlock");
}

#[test]
fn a_crashed_coordinator_is_a_liveness_failure_not_a_safety_one() {
    let mut s = StageSim::new(Algorithm::Centralized, 4, 3);
    s.requests = 20;
    s.crashes = vec![(0, 200)];
    s.max_time = 1_000_000;
    let r = s.run().unwrap();
    assert!(
        matches!(r.verdict, Verdict::Deadlock { .. }),
        "{}",
        r.verdict
    );
    assert!(r.trace.iter().any(|l| l.contains("crash node0:1")));
}

#[test]
fn duplicated_tokens_are_caught() {
    let mut caught = false;
    for seed in 0..10 {
        let mut s = StageSim::new(Algorithm::TokenRing, 4, seed);
        s.net.duplicate = 0.3;
        s.max_time = 100_000;
        let r = s.run().unwrap();
        if !r.verdict.is_ok() {
            assert!(!r.verdict.is_liveness_failure(), "{}", r.verdict);
            caught = true;
            break;
        }
    }
    assert!(
        caught,
        "a duplicating network must break the ring's token uniqueness"
    );
}

#[test]
fn lost_messages_stall_ricart_agrawala() {
    let mut s = StageSim::new(Algorithm::RicartAgrawala, 4, 5);
    s.net.loss = 0.3;
    s.requests = 10;
    let r = s.run().unwrap();
    assert!(r.verdict.is_liveness_failure(), "{}", r.verdict);
}

#[test]
fn the_same_graph_runs_in_one_process() {
    for algorithm in [
        Algorithm::RicartAgrawala,
        Algorithm::SuzukiKasami,
        Algorithm::NaimiTrehel,
        Algorithm::Maekawa,
        Algorithm::TokenRing,
    ] {
        let mut s = StageSim::new(algorithm, 4, 1);
        s.requests = 5;
        let r = s
            .run_in_process(2, Duration::from_secs(20))
            .expect("valid configuration");
        assert_eq!(r.verdict, Verdict::Ok, "{algorithm}: {}", r.verdict);
        assert_eq!(r.metrics.cs_entries, 20);
    }
}

/// A node stage is fail-stop: a failed handler stops the node, as the crash-tolerant
/// algorithms assume, instead of rebuilding it with fresh state. Here the centralized
/// coordinator grants fence 1, then a malformed message fails its handler; rebuilt, it
/// would count fences from 0 again and grant fence 1 a second time.
#[test]
fn a_failed_node_stops_instead_of_restarting_with_fresh_state() {
    use std::sync::{Arc, Mutex};

    use leda_core::prelude::*;
    use leda_mutex::stage::{NodeSpec, node_stage};

    let node = node_stage(NodeSpec {
        algorithm: Algorithm::Centralized,
        id: 0,
        n: 1,
        resources: vec!["r".into()],
        observer: None,
    })
    .expect("a valid node");
    assert!(node.is_fail_stop());
    let grants = Arc::new(Mutex::new(Vec::new()));
    let g2 = grants.clone();
    let app = Stage::new("app", move |ev: Event, _: &mut Ctx| {
        if ev.get::<String>(0)? == "grant" {
            g2.lock().unwrap().push(ev.get::<i64>(2)?);
        }
        Ok(())
    });
    let failures = Arc::new(Mutex::new(Vec::new()));
    let f2 = failures.clone();
    let errors = Stage::new("errors", move |ev: Event, _: &mut Ctx| {
        f2.lock().unwrap().push(ev.get::<String>(1)?);
        Ok(())
    });
    node.push(("request", "r"));
    node.push(("release", "r"));
    node.push(("msg", 7, "r", "nonsense", Value::Nil));
    node.push(("request", "r"));
    let mut g = Graph::new("fail-stop");
    g.connect(&node, "grant", &app).local();
    g.connect(&node, "error", &errors);
    g.run(Run::default().threads(2).until_idle())
        .expect("the run ends");
    assert_eq!(
        *grants.lock().unwrap(),
        vec![1],
        "one grant, never fence 1 twice"
    );
    let failures = failures.lock().unwrap();
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(
        failures[1].contains("stage 'mutex0' stopped after a failure"),
        "{failures:?}"
    );
}
