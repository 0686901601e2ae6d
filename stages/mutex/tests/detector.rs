//! The VCube failure detector (`ft_quorum::detector`): the state machine driven by a small
//! discrete-event harness (testing rounds, timeouts, even/odd counters spreading crash news,
//! completeness and accuracy over random crash schedules), and the detector stages beside the
//! crash-tolerant quorum node stages under leda-core's simulated executor, with crashes.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Duration;

use leda_core::sim::Latency as NetLatency;
use leda_mutex::ft_quorum::detector::{
    Detector, DetectorConfig, DetectorMsg, DetectorOutput, Evidence,
};
use leda_mutex::ft_quorum::{CorrectSet, Generator, vcube};
use leda_mutex::rng::SplitMix64;
use leda_mutex::{Algorithm, Latency, NodeId, StageSim, Verdict};

/// 1 µs per unit: period 100, timeout 50, links 1..=10 (round trip ≤ 20 < timeout).
fn config() -> DetectorConfig {
    DetectorConfig {
        period: Duration::from_micros(100),
        timeout: Duration::from_micros(50),
    }
}

/// One crash notice seen in a harness run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Notice {
    time: u64,
    observer: NodeId,
    crashed: NodeId,
    evidence: Evidence,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Tick(NodeId),
    Deliver { to: NodeId, from: NodeId, id: u64 },
}

/// Drives `n` detectors in virtual time (µs): each ticks every `config().tick()`, messages take
/// `latency` (drawn per message), crashed processes stop handling anything at their crash time.
struct Harness {
    detectors: Vec<Detector>,
    crash_at: Vec<Option<u64>>,
    queue: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    msgs: BTreeMap<u64, DetectorMsg>,
    next_id: u64,
    rng: SplitMix64,
    latency: (u64, u64),
    notices: Vec<Notice>,
    /// ARE-YOU-ALIVE sends: (time, tester, tested).
    tests: Vec<(u64, NodeId, NodeId)>,
    now: u64,
}

impl Harness {
    fn new(n: usize, seed: u64, latency: (u64, u64), crashes: &[(NodeId, u64)]) -> Self {
        let detectors = (0..n)
            .map(|i| Detector::new(i, n, config()).expect("valid detector"))
            .collect();
        let mut crash_at = vec![None; n];
        for &(node, at) in crashes {
            crash_at[node] = Some(at);
        }
        let mut h = Harness {
            detectors,
            crash_at,
            queue: BinaryHeap::new(),
            msgs: BTreeMap::new(),
            next_id: 0,
            rng: SplitMix64::new(seed),
            latency,
            notices: Vec::new(),
            tests: Vec::new(),
            now: 0,
        };
        for i in 0..n {
            let mut out = Vec::new();
            h.detectors[i].on_start(Duration::ZERO, &mut out);
            h.apply(i, out);
            h.push(tick(), Ev::Tick(i));
        }
        h
    }

    fn alive(&self, i: NodeId) -> bool {
        self.crash_at[i].is_none_or(|at| self.now < at)
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.next_id += 1;
        self.queue.push(Reverse((at, self.next_id, ev)));
    }

    fn apply(&mut self, from: NodeId, out: Vec<DetectorOutput>) {
        for o in out {
            match o {
                DetectorOutput::Send { to, msg } => {
                    if matches!(msg, DetectorMsg::AreYouAlive { .. }) {
                        self.tests.push((self.now, from, to));
                    }
                    let delay = self.rng.range_inclusive(self.latency.0, self.latency.1);
                    self.next_id += 1;
                    let id = self.next_id;
                    self.msgs.insert(id, msg);
                    self.push(self.now + delay, Ev::Deliver { to, from, id });
                }
                DetectorOutput::Crash { node, evidence } => self.notices.push(Notice {
                    time: self.now,
                    observer: from,
                    crashed: node,
                    evidence,
                }),
                // Latency below the timeout: no live process is ever held crashed.
                DetectorOutput::Excluded { by } => {
                    panic!("p{from} excluded by p{by} in a run with a perfect detector")
                }
            }
        }
    }

    /// Runs until virtual time `until`.
    fn run(&mut self, until: u64) {
        while let Some(Reverse((at, _, _))) = self.queue.peek() {
            if *at > until {
                break;
            }
            let Some(Reverse((at, _, ev))) = self.queue.pop() else {
                break;
            };
            self.now = at;
            match ev {
                Ev::Tick(i) => {
                    if !self.alive(i) {
                        continue;
                    }
                    let mut out = Vec::new();
                    self.detectors[i].on_tick(Duration::from_micros(at), &mut out);
                    self.apply(i, out);
                    self.push(at + tick(), Ev::Tick(i));
                }
                Ev::Deliver { to, from, id } => {
                    let Some(msg) = self.msgs.remove(&id) else {
                        continue;
                    };
                    if !self.alive(to) {
                        continue;
                    }
                    let mut out = Vec::new();
                    self.detectors[to]
                        .on_message(from, msg, &mut out)
                        .expect("well-formed message");
                    self.apply(to, out);
                }
            }
        }
        self.now = until;
    }

    /// The processes that have not crashed by now.
    fn survivors(&self) -> Vec<NodeId> {
        (0..self.detectors.len())
            .filter(|&i| self.alive(i))
            .collect()
    }
}

fn tick() -> u64 {
    config().tick().as_micros() as u64
}

#[test]
fn fault_free_rounds_test_the_first_process_of_every_cluster() {
    // Spec §2.1–2.2, n = 8: in the fault-free case process i tests c(i, s)[0] = i ⊕ 2^(s−1)
    // for s = 1..3, and every process is tested once per cluster index in a round.
    let mut h = Harness::new(8, 1, (1, 10), &[]);
    h.run(99); // the first round only (the second starts at 100)
    let mut tested_by: BTreeMap<NodeId, BTreeSet<NodeId>> = BTreeMap::new();
    for &(_, tester, tested) in &h.tests {
        tested_by.entry(tester).or_default().insert(tested);
    }
    let expected = [
        (0, [1, 2, 4]),
        (1, [0, 3, 5]),
        (2, [3, 0, 6]),
        (3, [2, 1, 7]),
        (4, [5, 6, 0]),
        (5, [4, 7, 1]),
        (6, [7, 4, 2]),
        (7, [6, 5, 3]),
    ];
    for (i, tests) in expected {
        let want: BTreeSet<NodeId> = tests.into_iter().collect();
        assert_eq!(tested_by.get(&i), Some(&want), "tests of p{i}");
        for (s, j) in (1..=3).zip(tests) {
            assert_eq!(vcube::cluster(i, s, 8).expect("cluster")[0], j);
        }
    }
    assert_eq!(h.tests.len(), 8 * 3, "n·log2 n tests per round");
    let mut times_tested = [0usize; 8];
    for &(_, _, j) in &h.tests {
        times_tested[j] += 1;
    }
    assert_eq!(times_tested, [3; 8], "each process tested once per s");
    // Every test was answered: no notice, every counter even, every view full.
    h.run(2_000);
    assert!(h.notices.is_empty(), "{:?}", h.notices);
    for d in &h.detectors {
        assert_eq!(d.correct(), &CorrectSet::all(8));
        assert!(d.timestamps().iter().all(|&t| t == 0));
        assert!(d.rounds() >= 20);
    }
}

#[test]
fn one_crash_is_detected_by_its_testers_and_spread_by_counters() {
    // n = 8, p1 crashes at 150. Its testers are the first correct processes of c(1, s):
    // c(1,1) = (0), c(1,2) = (3,2), c(1,3) = (5,4,7,6), so 0, 3 and 5 time out on it; the others
    // (2, 4, 6, 7) learn it from an odd counter in an ALIVE.
    let mut h = Harness::new(8, 7, (1, 10), &[(1, 150)]);
    h.run(3_000);
    let mut by_timeout = BTreeSet::new();
    let mut by_gossip = BTreeSet::new();
    for n in &h.notices {
        assert_eq!(n.crashed, 1, "{n:?}");
        assert!(n.time > 150, "{n:?} before the crash");
        match n.evidence {
            Evidence::Timeout => by_timeout.insert(n.observer),
            Evidence::Gossip { from } => {
                assert_ne!(from, 1);
                by_gossip.insert(n.observer)
            }
        };
    }
    assert_eq!(by_timeout, BTreeSet::from([0, 3, 5]));
    assert_eq!(by_gossip, BTreeSet::from([2, 4, 6, 7]));
    assert_eq!(
        h.notices.len(),
        7,
        "one notice per survivor: {:?}",
        h.notices
    );
    let view = CorrectSet::with_crashed(8, [1]).expect("view");
    for i in h.survivors() {
        let d = &h.detectors[i];
        assert_eq!(d.correct(), &view, "view of p{i}");
        // Even/odd counters: p1's is odd (1 event: its crash), everybody else's even.
        let ts = d.timestamps();
        assert_eq!(ts[1], 1, "p{i}: {ts:?}");
        assert!(
            ts.iter()
                .enumerate()
                .all(|(k, t)| k == 1 || t.is_multiple_of(2)),
            "{ts:?}"
        );
        // Crash-stop: the crashed process is tested no more.
        assert!(!d.testing().any(|j| j == 1));
    }
    let last_test_of_1 = h
        .tests
        .iter()
        .filter(|t| t.2 == 1)
        .map(|t| t.0)
        .max()
        .unwrap_or(0);
    let latest_notice = h.notices.iter().map(|n| n.time).max().unwrap_or(0);
    assert!(
        last_test_of_1 < latest_notice,
        "p1 must not be tested once everyone knows"
    );
}

#[test]
fn after_a_crash_the_next_correct_process_of_the_cluster_takes_over_the_tests() {
    // VCube's rule: i tests j iff i is the first correct process of c(j, s). Fault-free, p1
    // tests p3 (c(3,2) = (1,0)) and p5 (c(5,3) = (1,0,3,2)); once p1 is known crashed, p0 is the
    // first correct process of both clusters and takes those tests over. In general the tests
    // of a round after the crash are exactly `round_tests` over the view without p1.
    let mut h = Harness::new(8, 3, (1, 10), &[(1, 150)]);
    h.run(2_000);
    let from = h.now;
    h.tests.clear();
    h.run(from + 100);
    let view = CorrectSet::with_crashed(8, [1]).expect("view");
    let mut got: BTreeSet<(NodeId, NodeId)> = BTreeSet::new();
    for &(_, i, j) in &h.tests {
        got.insert((i, j));
    }
    let mut want = BTreeSet::new();
    for i in h.survivors() {
        for (_, j) in vcube::round_tests(i, &view).expect("round") {
            if j != 1 {
                want.insert((i, j));
            }
        }
    }
    assert_eq!(got, want);
    assert!(got.contains(&(0, 3)) && got.contains(&(0, 5)), "{got:?}");
    assert!(!got.iter().any(|&(i, j)| i == 1 || j == 1));
}

/// Runs a harness with `crashes` and checks completeness (every survivor suspects every
/// crashed process), accuracy (nobody else), one notice per pair, and returns the worst
/// detection latency in µs.
fn check_run(n: usize, seed: u64, crashes: &[(NodeId, u64)]) -> u64 {
    let d = vcube::dimensions(n.next_power_of_two()).expect("power of two") as u64;
    let period = config().period.as_micros() as u64;
    let horizon = crashes.iter().map(|c| c.1).max().unwrap_or(0) + (d * d + 4) * period;
    let mut h = Harness::new(n, seed, (1, 10), crashes);
    h.run(horizon);
    let crashed: BTreeSet<NodeId> = crashes.iter().map(|c| c.0).collect();
    let view = CorrectSet::with_crashed(n, crashed.iter().copied()).expect("view");
    let mut seen: BTreeSet<(NodeId, NodeId)> = BTreeSet::new();
    let mut worst = 0;
    for notice in &h.notices {
        assert!(
            crashed.contains(&notice.crashed),
            "n={n} seed={seed} crashes={crashes:?}: false suspicion {notice:?}"
        );
        assert!(
            seen.insert((notice.observer, notice.crashed)),
            "n={n} seed={seed}: notice twice {notice:?}"
        );
        let at = crashes
            .iter()
            .find(|c| c.0 == notice.crashed)
            .map_or(0, |c| c.1);
        assert!(notice.time >= at, "{notice:?} before the crash at {at}");
        if h.alive(notice.observer) {
            worst = worst.max(notice.time - at);
        }
    }
    for i in h.survivors() {
        let got: Vec<NodeId> = h.detectors[i].correct().iter().filter(|&j| j < n).collect();
        assert_eq!(
            got,
            view.iter().collect::<Vec<_>>(),
            "n={n} seed={seed} crashes={crashes:?}: view of p{i}"
        );
        for &c in &crashed {
            assert_eq!(h.detectors[i].timestamps()[c] % 2, 1);
        }
    }
    worst
}

#[test]
fn several_crashes_are_detected_by_every_survivor() {
    // n = 16: three crashes at different times, one of them a tester of another (p2 tests p3).
    let worst = check_run(16, 11, &[(3, 120), (2, 400), (12, 410)]);
    assert!(worst > 0);
    // Every process but one crashes: the last one still learns every crash.
    let all_but_one: Vec<(NodeId, u64)> = (1..8).map(|j| (j, 100 + 37 * j as u64)).collect();
    check_run(8, 5, &all_but_one);
}

#[test]
fn every_survivor_suspects_exactly_the_crashed_ones_random_schedules() {
    let period = config().period.as_micros() as u64;
    let timeout = config().timeout.as_micros() as u64;
    let mut rng = SplitMix64::new(2026);
    let mut worst_by_n: BTreeMap<usize, u64> = BTreeMap::new();
    for n in [4usize, 6, 8, 12, 16, 32] {
        for seed in 0..40 {
            let f = rng.range_inclusive(1, (n / 2) as u64) as usize;
            let mut victims: Vec<NodeId> = (0..n).collect();
            let mut crashes = Vec::new();
            for _ in 0..f {
                let v = victims.swap_remove(rng.index(victims.len()));
                crashes.push((v, rng.range_inclusive(0, 1_000)));
            }
            let worst = check_run(n, seed, &crashes);
            let e = worst_by_n.entry(n).or_insert(0);
            *e = (*e).max(worst);
        }
    }
    for (&n, &worst) in &worst_by_n {
        // VCube's bound is log2² n rounds; a round here is `period`, plus the timeout and
        // one tick of clock resolution.
        let d = vcube::dimensions(n.next_power_of_two()).expect("power of two") as u64;
        let bound = d * d * period + timeout + 2 * tick();
        println!("n={n}: worst detection latency {worst} µs (bound {bound})");
        assert!(worst <= bound, "n={n}: {worst} > {bound}");
    }
}

#[test]
fn a_process_held_crashed_stays_crashed() {
    let mut h = Harness::new(4, 9, (1, 10), &[(2, 50)]);
    h.run(1_000);
    let d0 = &mut h.detectors[0];
    assert!(!d0.correct().contains(2));
    // A late ALIVE of "p2" (or news that p2 is back, an even counter) changes nothing.
    let mut out = Vec::new();
    d0.on_message(
        2,
        DetectorMsg::Alive {
            seq: 1,
            ts: vec![0, 0, 2, 0],
        },
        &mut out,
    )
    .expect("accepted");
    d0.on_message(
        1,
        DetectorMsg::Alive {
            seq: 1,
            ts: vec![0, 0, 2, 0],
        },
        &mut out,
    )
    .expect("accepted");
    assert!(out.is_empty(), "{out:?}");
    assert!(!d0.correct().contains(2));
    assert_eq!(d0.timestamps()[2], 1);
    // A process always answers a test, with its counters.
    d0.on_message(3, DetectorMsg::AreYouAlive { seq: 42 }, &mut out)
        .expect("accepted");
    assert_eq!(
        out,
        vec![DetectorOutput::Send {
            to: 3,
            msg: DetectorMsg::Alive {
                seq: 42,
                ts: vec![0, 0, 1, 0]
            }
        }]
    );
    // Counters that hold p0 itself crashed (p0 was paused past the others' timeout):
    // excluded, told once; the counter itself is still not taken.
    out.clear();
    let excluded = DetectorMsg::Alive {
        seq: 2,
        ts: vec![1, 0, 1, 0],
    };
    d0.on_message(1, excluded.clone(), &mut out)
        .expect("accepted");
    d0.on_message(3, excluded, &mut out).expect("accepted");
    assert_eq!(out, vec![DetectorOutput::Excluded { by: 1 }]);
    assert_eq!(d0.timestamps()[0], 0);
}

/// Runs the detector stages beside the quorum node stages of `g` under the simulated executor
/// with `crashes`, and checks: the checker's verdict is `Ok` (no overlap, strictly increasing
/// fences, every survivor served), and every survivor was told of every crash exactly once,
/// after it happened, and of nothing else.
fn stage_run(g: Generator, seed: u64, crashes: &[(NodeId, u64)]) {
    let n = 8;
    let mut s = StageSim::new(Algorithm::Quorum(g), n, seed);
    s.requests = 6;
    s.cs_time = Latency::Constant(5);
    s.net.latency = NetLatency::Uniform(Duration::from_micros(1), Duration::from_micros(10));
    s.crashes = crashes.to_vec();
    s.detector = Some(config());
    s.max_time = 100_000;
    let r = s.run().expect("simulation runs");
    assert_eq!(
        r.verdict,
        Verdict::Ok,
        "{g} seed={seed} crashes={crashes:?}"
    );
    let mut told: BTreeSet<(NodeId, NodeId)> = BTreeSet::new();
    for &(t, observer, crashed) in &r.notices {
        let at = crashes
            .iter()
            .find(|c| c.0 == crashed)
            .unwrap_or_else(|| panic!("{g} seed={seed}: false suspicion of {crashed}"))
            .1;
        assert!(t >= at, "{g} seed={seed}: notice before the crash");
        assert!(
            told.insert((observer, crashed)),
            "{g} seed={seed}: told twice"
        );
    }
    // Completeness, for the crashes that happened long enough before the end of the run
    // (a crash after the last critical section may end the run before anyone needs to know).
    let survivors: Vec<NodeId> = (0..n)
        .filter(|&i| !crashes.iter().any(|c| c.0 == i))
        .collect();
    for &(crashed, at) in crashes {
        if r.end_time > at + 2_000 {
            for &i in &survivors {
                assert!(
                    told.contains(&(i, crashed)),
                    "{g} seed={seed}: p{i} never told of {crashed}"
                );
            }
        }
    }
    assert!(r.trace.iter().any(|l| l.contains("crash")), "{g}");
}

/// The detector stages beside the quorum node stages, under the simulated executor: a node
/// crashes mid-run, at a random time; the survivors keep getting the
/// lock with no overlap.
#[test]
fn detector_and_quorum_stages_survive_a_crash_in_simulation() {
    let mut rng = SplitMix64::new(9);
    for g in Generator::ALL {
        for seed in 0..8u64 {
            let victim = rng.index(8);
            stage_run(g, seed, &[(victim, rng.range_inclusive(50, 400))]);
        }
    }
}

/// Two crashes at different times, the second while the first may still be being detected.
#[test]
fn detector_and_quorum_stages_survive_two_crashes_in_simulation() {
    let mut rng = SplitMix64::new(10);
    for g in Generator::ALL {
        for seed in 0..8u64 {
            let a = rng.index(8);
            let b = (a + 1 + rng.index(7)) % 8;
            let crashes = [
                (a, rng.range_inclusive(50, 400)),
                (b, rng.range_inclusive(50, 600)),
            ];
            stage_run(g, seed, &crashes);
        }
    }
}
