//! Bouabdallah–Laforest and Lejeune–Arantes–Sopena–Sens (issue #10): hand-driven scenarios and
//! seeded property runs through `MultiSim` + `MultiChecker` (safety, liveness, token uniqueness
//! per instance after every event).

use leda_mutex::multi::{
    BlConfig, BlMsg, BlNode, BouabdallahLaforest, Lejeune, LjConfig, LjMsg, LjNode, MultiOutbox,
    MultiOutput, MultiReport, MultiRequest, MultiSimConfig, MultiSystem, MultiVerdict,
    MultiWorkload, ResourceSpace, simulate_multi,
};
use leda_mutex::rng::SplitMix64;
use leda_mutex::{Channels, Latency};

/// Seed count: `default`, or `MULTI_SEEDS` from the environment for longer local soaks.
fn seeds(default: u64) -> u64 {
    std::env::var("MULTI_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A random configuration from `seed`: N in [1, 16], M in [1, 20], SizeReq in [1, M], 1–4
/// requests per process, think mean 0.5/5/50, FIFO or not (or as forced by `channels`).
fn random_config(seed: u64, multi_instance: bool, channels: Option<Channels>) -> MultiSimConfig {
    let mut r = SplitMix64::new(seed ^ 0x5EED_0A1C);
    let n = r.range_inclusive(1, 16) as usize;
    let m = r.range_inclusive(1, 20) as usize;
    let space = if multi_instance {
        let caps = (0..m).map(|_| r.range_inclusive(1, 4) as u32).collect();
        ResourceSpace::with_capacities(caps).expect("capacities >= 1")
    } else {
        ResourceSpace::single(m).expect("m >= 1")
    };
    let mut cfg = MultiSimConfig::new(n, space, seed);
    cfg.workload = MultiWorkload {
        requests_per_node: r.range_inclusive(1, 4) as usize,
        size_req: r.range_inclusive(1, m as u64) as usize,
        cs_duration: Latency::Uniform { min: 1, max: 20 },
        cs_per_resource: 2,
        think_time: Latency::Exponential {
            min: 0,
            mean: [0.5, 5.0, 50.0][r.index(3)],
        },
    };
    cfg.latency = Latency::Uniform { min: 1, max: 10 };
    let fifo = r.index(2) == 0;
    cfg.channels = channels.unwrap_or(if fifo {
        Channels::Fifo
    } else {
        Channels::NonFifo
    });
    cfg
}

fn expected_grants(cfg: &MultiSimConfig) -> u64 {
    (cfg.n * cfg.workload.requests_per_node) as u64
}

fn run_bl(cfg: MultiSimConfig, config: BlConfig) -> MultiReport {
    let sys = BouabdallahLaforest::new(cfg.n, cfg.space.clone(), config).expect("valid group");
    simulate_multi(cfg, sys).expect("valid config")
}

fn run_lj(cfg: MultiSimConfig, config: LjConfig) -> MultiReport {
    let sys = Lejeune::new(cfg.n, cfg.space.clone(), config).expect("valid group");
    simulate_multi(cfg, sys).expect("valid config")
}

/// Runs `run` over `count` random seeds and checks verdict Ok and every request granted;
/// returns how many runs had contention (some waiting time).
fn property(
    count: u64,
    multi_instance: bool,
    channels: Option<Channels>,
    run: impl Fn(MultiSimConfig) -> MultiReport,
) -> u64 {
    let mut contended = 0;
    for seed in 0..seeds(count) {
        let cfg = random_config(seed, multi_instance, channels);
        let want = expected_grants(&cfg);
        let rep = run(cfg);
        assert_eq!(rep.verdict, MultiVerdict::Ok, "seed {seed}");
        assert_eq!(rep.stats.grants, want, "seed {seed}");
        contended += u64::from(rep.stats.wait_total > 0 && rep.stats.messages > 0);
    }
    contended
}

// ---------------------------------------------------------------- Bouabdallah–Laforest

#[test]
fn bl_single_instance_safe_and_live_over_300_seeds_fifo_and_not() {
    let contended = property(300, false, None, |cfg| run_bl(cfg, BlConfig::default()));
    assert!(contended > 100, "only {contended} contended runs");
}

#[test]
fn bl_multi_instance_safe_and_live_over_200_seeds() {
    let contended = property(200, true, Some(Channels::NonFifo), |cfg| {
        run_bl(cfg, BlConfig::default())
    });
    assert!(contended > 60, "only {contended} contended runs");
}

#[test]
fn bl_keeping_the_ct_until_cs_exit_is_safe_and_live() {
    let at_exit = BlConfig {
        ct_at_exit: true,
        ..BlConfig::default()
    };
    let contended = property(200, false, None, |cfg| run_bl(cfg, at_exit.clone()));
    assert!(contended > 60, "only {contended} contended runs");
    let contended = property(100, true, Some(Channels::NonFifo), |cfg| {
        run_bl(
            cfg,
            BlConfig {
                fast_path: true,
                ..at_exit.clone()
            },
        )
    });
    assert!(contended > 30, "only {contended} contended runs");
}

#[test]
fn bl_fast_path_safe_and_live_and_saves_messages() {
    let mut saved = 0;
    for seed in 0..seeds(150) {
        let cfg = random_config(seed, seed % 2 == 0, Some(Channels::NonFifo));
        let want = expected_grants(&cfg);
        let slow = run_bl(cfg.clone(), BlConfig::default());
        let fast = run_bl(
            cfg,
            BlConfig {
                fast_path: true,
                ..BlConfig::default()
            },
        );
        assert_eq!(fast.verdict, MultiVerdict::Ok, "seed {seed}");
        assert_eq!(fast.stats.grants, want, "seed {seed}");
        saved += u64::from(fast.stats.messages < slow.stats.messages);
    }
    assert!(
        saved > 10,
        "the fast path saved messages in {saved} runs only"
    );
}

/// BL's bound: at most `n + 3k` messages per CS (k: instances requested), summed over a run.
#[test]
fn bl_messages_within_n_plus_3k_per_cs() {
    for seed in 0..seeds(200) {
        let cfg = random_config(seed, seed % 2 == 1, None);
        let k_max = cfg
            .space
            .capacities()
            .iter()
            .map(|&k| k as u64)
            .max()
            .unwrap_or(1);
        let per_cs = cfg.n as u64 + 3 * cfg.workload.size_req as u64 * k_max;
        let rep = run_bl(cfg, BlConfig::default());
        assert_eq!(rep.verdict, MultiVerdict::Ok, "seed {seed}");
        assert!(
            rep.stats.messages <= per_cs * rep.stats.grants,
            "seed {seed}"
        );
    }
}

/// Drives a group of BL processes by hand: messages delivered in sending order.
struct Hand<S: MultiSystem> {
    sys: S,
    queue: std::collections::VecDeque<(usize, usize, S::Msg)>,
    grants: Vec<(usize, Vec<leda_mutex::multi::Hold>)>,
}

impl<S: MultiSystem> Hand<S> {
    fn new(sys: S) -> Self {
        Self {
            sys,
            queue: Default::default(),
            grants: Vec::new(),
        }
    }

    fn absorb(&mut self, out: &mut MultiOutbox<S::Msg>) {
        for o in out.drain() {
            match o {
                MultiOutput::Send { from, to, msg } => self.queue.push_back((from, to, msg)),
                MultiOutput::Grant { node, holds } => self.grants.push((node, holds)),
            }
        }
    }

    fn request(&mut self, node: usize, req: &MultiRequest) {
        let mut out = MultiOutbox::new();
        self.sys.request(node, req, &mut out).expect("request");
        self.absorb(&mut out);
    }

    fn release(&mut self, node: usize) {
        let mut out = MultiOutbox::new();
        self.sys.release(node, &mut out).expect("release");
        self.absorb(&mut out);
    }

    /// Delivers everything in flight, in order; returns the message kinds delivered.
    fn settle(&mut self) -> Vec<&'static str> {
        let mut kinds = Vec::new();
        while let Some((from, to, msg)) = self.queue.pop_front() {
            kinds.push(leda_mutex::Message::kind(&msg));
            let mut out = MultiOutbox::new();
            self.sys.deliver(from, to, msg, &mut out).expect("deliver");
            self.absorb(&mut out);
        }
        kinds
    }

    /// Delivers the oldest message in flight; returns its kind.
    fn step(&mut self) -> &'static str {
        let (from, to, msg) = self.queue.pop_front().expect("a message in flight");
        let kind = leda_mutex::Message::kind(&msg);
        let mut out = MultiOutbox::new();
        self.sys.deliver(from, to, msg, &mut out).expect("deliver");
        self.absorb(&mut out);
        kind
    }

    /// Delivers the oldest message in flight from `from` to `to`; returns it, delivered.
    fn deliver(&mut self, from: usize, to: usize) -> (usize, usize, S::Msg)
    where
        S::Msg: Clone,
    {
        let i = self
            .queue
            .iter()
            .position(|(f, t, _)| (*f, *t) == (from, to))
            .unwrap_or_else(|| panic!("no message in flight from {from} to {to}"));
        let (from, to, msg) = self.queue.remove(i).expect("found above");
        let mut out = MultiOutbox::new();
        self.sys
            .deliver(from, to, msg.clone(), &mut out)
            .expect("deliver");
        self.absorb(&mut out);
        (from, to, msg)
    }

    /// Delivers everything in flight, in order; returns each message delivered.
    fn settle_trace(&mut self) -> Vec<(usize, usize, S::Msg)>
    where
        S::Msg: Clone,
    {
        let mut trace = Vec::new();
        while let Some(&(from, to, _)) = self.queue.front() {
            trace.push(self.deliver(from, to));
        }
        trace
    }

    fn granted(&self) -> Vec<usize> {
        self.grants.iter().map(|g| g.0).collect()
    }
}

/// A BL message as `kind from->to [tokens]`, for exact traces.
fn bl_line((from, to, msg): &(usize, usize, BlMsg)) -> String {
    let tokens = |ts: &[(usize, u64)]| ts.iter().map(|t| t.0).collect::<Vec<_>>();
    match msg {
        BlMsg::CtRequest { requester } => format!("ct_request({requester}) {from}->{to}"),
        BlMsg::Ct { .. } => format!("ct {from}->{to}"),
        BlMsg::TokenReq { tokens, .. } => format!("token_req{tokens:?} {from}->{to}"),
        BlMsg::Ack1 { tokens: t, .. } => format!("ack1{:?} {from}->{to}", tokens(t)),
        BlMsg::Ack2 { tokens: t } => format!("ack2{:?} {from}->{to}", tokens(t)),
    }
}

fn bl_lines(trace: &[(usize, usize, BlMsg)]) -> Vec<String> {
    trace.iter().map(bl_line).collect()
}

/// Hand-traced from spec §2.3 (the independent audit's scenario B2): a holder gives every
/// token of one `TokenReq` in one `Ack1` (`send(j, ACK1, give)`), so a CS that needs two
/// cached tokens of one process and a free one costs exactly five messages. (Fails on the
/// one-token-per-Ack code before 2026-11-25: six.)
#[test]
fn bl_trace_one_ack1_carries_every_token_given() {
    let space = ResourceSpace::single(3).expect("space");
    let mut h =
        Hand::new(BouabdallahLaforest::new(3, space.clone(), BlConfig::default()).expect("group"));
    h.request(1, &MultiRequest::set([0, 1], &space).expect("req"));
    assert_eq!(
        bl_lines(&h.settle_trace()),
        ["ct_request(1) 1->0", "ct 0->1"]
    );
    assert_eq!(h.granted(), vec![1]);
    h.release(1);
    assert!(h.settle_trace().is_empty(), "nothing is owed");
    h.request(2, &MultiRequest::set([0, 1, 2], &space).expect("req"));
    assert_eq!(
        bl_lines(&h.settle_trace()),
        [
            "ct_request(2) 2->0",
            "ct_request(2) 0->1",
            "ct 1->2",
            "token_req[0, 1] 2->1",
            "ack1[0, 1] 1->2",
        ]
    );
    assert_eq!(h.granted(), vec![1, 2]);
}

/// Hand-traced from spec §2.3 (audit scenario B3): a CT request reaching a root whose `Ack1`s
/// are pending is served when they are in (S:188); tokens locked in a CS are owed and go back
/// as one `Ack2` per owed entry (`send(j, ACK2, S)`), each carrying the entry's whole set.
#[test]
fn bl_trace_owed_tokens_go_back_as_one_ack2_per_registration() {
    let space = ResourceSpace::single(2).expect("space");
    let mut h =
        Hand::new(BouabdallahLaforest::new(4, space.clone(), BlConfig::default()).expect("group"));
    let both = MultiRequest::set([0, 1], &space).expect("req");
    h.request(1, &both);
    h.settle_trace();
    assert_eq!(h.granted(), vec![1]);
    // p2 asks while p1 is in its CS; its TokenReq to p1 is held back.
    h.request(2, &both);
    let mut seen = vec![h.deliver(2, 0), h.deliver(0, 1), h.deliver(1, 2)];
    // p3 asks for R0; its CT request reaches p2 (the root, registration pending): queued.
    h.request(3, &MultiRequest::set([0], &space).expect("req"));
    seen.push(h.deliver(3, 0));
    seen.push(h.deliver(0, 2));
    seen.extend(h.settle_trace());
    assert_eq!(
        bl_lines(&seen),
        [
            "ct_request(2) 2->0",
            "ct_request(2) 0->1",
            "ct 1->2",
            "ct_request(3) 3->0",
            "ct_request(3) 0->2",
            "token_req[0, 1] 2->1",
            "ack1[] 1->2",
            "ct 2->3",
            "token_req[0] 3->2",
            "ack1[] 2->3",
        ]
    );
    assert_eq!(h.granted(), vec![1]);
    h.release(1);
    assert_eq!(bl_lines(&h.settle_trace()), ["ack2[0, 1] 1->2"]);
    assert_eq!(h.granted(), vec![1, 2]);
    h.release(2);
    assert_eq!(bl_lines(&h.settle_trace()), ["ack2[0] 2->3"]);
    assert_eq!(h.granted(), vec![1, 2, 3]);
}

/// [LJ] Fig. 2-like scenario for BL: two processes take disjoint sets, a third needs both
/// sets' resources and is registered behind both; it enters only after both exits, with the
/// tokens handed over by `Ack2`.
#[test]
fn bl_scenario_registration_and_owed_tokens() {
    let space = ResourceSpace::single(2).expect("space");
    let mut h =
        Hand::new(BouabdallahLaforest::new(3, space.clone(), BlConfig::default()).expect("group"));
    let red = MultiRequest::set([0], &space).expect("req");
    let blue = MultiRequest::set([1], &space).expect("req");
    let both = MultiRequest::set([0, 1], &space).expect("req");
    h.request(0, &red); // process 0 holds the CT: takes red from the CT, no message
    assert_eq!(h.granted(), vec![0]);
    h.request(2, &blue);
    h.settle();
    assert_eq!(h.granted(), vec![0, 2]);
    h.request(1, &both);
    let kinds = h.settle();
    // CT request travels to the root, the CT comes back, two registrations each answered by
    // an empty Ack1 (both tokens are locked in CSs).
    assert!(
        kinds.contains(&"token_req") && kinds.contains(&"ack1"),
        "{kinds:?}"
    );
    assert_eq!(h.granted(), vec![0, 2], "1 must wait for both tokens");
    h.release(0);
    h.settle();
    assert_eq!(h.granted(), vec![0, 2], "1 still lacks blue");
    h.release(2);
    let kinds = h.settle();
    assert_eq!(kinds, vec!["ack2"]);
    assert_eq!(h.granted(), vec![0, 2, 1]);
    let holds = &h.grants[2].1;
    assert_eq!(holds.len(), 2);
    assert!(holds.iter().all(|x| x.fence == 2), "{holds:?}");
}

#[test]
fn bl_node_rejects_bad_inputs() {
    let space = ResourceSpace::single(2).expect("space");
    let mut p = BlNode::new(1, 2, space.clone(), &BlConfig::default()).expect("node");
    let mut out = MultiOutbox::new();
    assert!(p.on_release(&mut out).is_err(), "release without grant");
    assert!(
        p.on_message(
            0,
            BlMsg::Ack2 {
                tokens: vec![(0, 1)]
            },
            &mut out
        )
        .is_err(),
        "token nobody asked for"
    );
    assert!(
        p.on_message(
            0,
            BlMsg::Ack1 {
                reg: 0,
                tokens: Vec::new(),
            },
            &mut out
        )
        .is_err(),
        "ack without registration"
    );
    assert!(
        p.on_message(7, BlMsg::CtRequest { requester: 0 }, &mut out)
            .is_err()
    );
    assert!(BlNode::new(3, 2, space, &BlConfig::default()).is_err());
}

// ---------------------------------------------------------------- Lejeune et al.

fn lj_variants() -> [(&'static str, LjConfig); 5] {
    [
        ("without loan", LjConfig::default()),
        ("with loan", LjConfig::with_loan()),
        (
            "with loan, threshold 2",
            LjConfig {
                loan_threshold: 2,
                ..LjConfig::with_loan()
            },
        ),
        (
            "without the single-resource shortcut",
            LjConfig {
                single_shortcut: false,
                ..LjConfig::with_loan()
            },
        ),
        (
            "without forwarding limits",
            LjConfig {
                forwarding_limits: false,
                ..LjConfig::with_loan()
            },
        ),
    ]
}

#[test]
fn lejeune_without_loan_safe_and_live_over_300_seeds_fifo_and_not() {
    let contended = property(300, false, None, |cfg| run_lj(cfg, LjConfig::default()));
    assert!(contended > 100, "only {contended} contended runs");
}

#[test]
fn lejeune_with_loan_safe_and_live_over_300_seeds_fifo_and_not() {
    let contended = property(300, false, None, |cfg| run_lj(cfg, LjConfig::with_loan()));
    assert!(contended > 100, "only {contended} contended runs");
}

#[test]
fn lejeune_variants_safe_and_live_non_fifo() {
    for (name, config) in lj_variants() {
        for seed in 0..seeds(100) {
            let cfg = random_config(seed + 10_000, false, Some(Channels::NonFifo));
            let want = expected_grants(&cfg);
            let rep = run_lj(cfg, config.clone());
            assert_eq!(rep.verdict, MultiVerdict::Ok, "{name}, seed {seed}");
            assert_eq!(rep.stats.grants, want, "{name}, seed {seed}");
        }
    }
}

/// The loan mechanism is used under load, and only with the loan variant; preemptions (loans
/// plus cessions) are reported through the driver's stats.
#[test]
fn lejeune_loans_happen_under_load_and_are_counted() {
    let mut loans = 0;
    let mut cessions = 0;
    for seed in 0..20 {
        let space = ResourceSpace::single(20).expect("space");
        let mut cfg = MultiSimConfig::new(12, space.clone(), seed);
        cfg.workload = MultiWorkload {
            requests_per_node: 8,
            size_req: 6,
            cs_duration: Latency::Uniform { min: 5, max: 30 },
            cs_per_resource: 3,
            think_time: Latency::Exponential { min: 0, mean: 1.0 },
        };
        let without = Lejeune::new(12, space.clone(), LjConfig::default()).expect("group");
        let rep = simulate_multi(cfg.clone(), without).expect("run");
        assert_eq!(rep.verdict, MultiVerdict::Ok);
        assert_eq!(rep.stats.messages_by_kind.get("req_loan"), None);
        let mut sim = leda_mutex::multi::MultiSim::new(
            cfg,
            Lejeune::new(12, space, LjConfig::with_loan()).expect("group"),
        )
        .expect("sim");
        let rep = sim.run();
        assert_eq!(rep.verdict, MultiVerdict::Ok);
        let sys = sim.system();
        assert_eq!(rep.stats.preemptions, sys.loans() + sys.cessions());
        loans += sys.loans();
        cessions += sys.cessions();
    }
    assert!(loans > 0, "no loan in 20 loaded runs");
    assert!(cessions > 0, "no cession in 20 loaded runs");
}

/// Multi-instance spaces are refused (the algorithm is single-instance, as in [LJ]).
#[test]
fn lejeune_refuses_multi_instance_and_bad_inputs() {
    let multi = ResourceSpace::with_capacities(vec![1, 2]).expect("space");
    assert!(Lejeune::new(2, multi, LjConfig::default()).is_err());
    let space = ResourceSpace::single(2).expect("space");
    assert!(
        Lejeune::new(
            2,
            space.clone(),
            LjConfig {
                loan_threshold: 0,
                ..LjConfig::with_loan()
            }
        )
        .is_err()
    );
    let mut p = LjNode::new(1, 2, &space, &LjConfig::default()).expect("node");
    let mut out = MultiOutbox::new();
    assert!(p.on_release(&mut out).is_err());
    let bogus = LjMsg::Counter {
        r: 9,
        seq: 1,
        val: 1,
    };
    assert!(p.on_message(0, bogus, &mut out).is_err());
    assert!(
        p.on_message(
            5,
            LjMsg::Counter {
                r: 0,
                seq: 1,
                val: 1
            },
            &mut out
        )
        .is_err()
    );
}

/// [LJ] Fig. 2: 3 sites, red (resource 0) and blue (resource 1). s1 holds red, s3 holds blue
/// and both are in their CS; s2 asks for both: ReqCnt to each holder, Counter back, ReqRes;
/// when s1 and s3 exit they send the tokens to s2, which enters holding both and becomes the
/// root of both trees. (Sites 0, 1, 2 here are the figure's s1, s2, s3; red starts at 0, and
/// blue is moved to 2 by a first request.)
#[test]
fn lejeune_figure_2() {
    let space = ResourceSpace::single(2).expect("space");
    let mut h = Hand::new(Lejeune::new(3, space.clone(), LjConfig::default()).expect("group"));
    let red = MultiRequest::set([0], &space).expect("req");
    let blue = MultiRequest::set([1], &space).expect("req");
    let both = MultiRequest::set([0, 1], &space).expect("req");
    // Initially red is at site 0 and blue at site 1 (r mod n); s3 (= 2) takes blue first.
    h.request(2, &blue);
    h.settle();
    h.release(2);
    h.request(2, &blue);
    h.request(0, &red);
    h.settle();
    assert_eq!(h.granted(), vec![2, 2, 0]);
    h.request(1, &both);
    let kinds = h.settle();
    assert_eq!(
        kinds.iter().filter(|k| **k == "req_cnt").count(),
        2,
        "{kinds:?}"
    );
    assert_eq!(kinds.iter().filter(|k| **k == "counter").count(), 2);
    assert_eq!(kinds.iter().filter(|k| **k == "req_res").count(), 2);
    assert_eq!(h.granted(), vec![2, 2, 0], "s2 waits for both tokens");
    h.release(0);
    assert_eq!(h.settle(), vec!["token"]);
    h.release(2);
    assert_eq!(h.settle(), vec!["token"]);
    assert_eq!(h.granted(), vec![2, 2, 0, 1]);
    let sys = &h.sys;
    assert!(sys.nodes()[1].holds_token(0) && sys.nodes()[1].holds_token(1));
    assert_eq!(sys.nodes()[1].state(), leda_mutex::multi::LjState::InCs);
}

/// Priority and cession: a site waiting for a token cedes one it holds to a request with
/// priority (smaller mark), and gets it back afterwards.
#[test]
fn lejeune_waiting_holder_cedes_to_priority() {
    let space = ResourceSpace::single(2).expect("space");
    let mut h = Hand::new(Lejeune::new(2, space.clone(), LjConfig::default()).expect("group"));
    let only0 = MultiRequest::set([0], &space).expect("req");
    let both = MultiRequest::set([0, 1], &space).expect("req");
    // Site 1 takes resource 0 (counter 1 read, its token moves to 1) and stays in its CS.
    h.request(1, &only0);
    h.settle();
    assert_eq!(h.granted(), vec![1]);
    // Site 0 asks for {0, 1}: counters 2 (resource 0) and 1 (resource 1): mark 1.5; it holds
    // nothing of resource 0 (site 1 is in CS). Site 1 still has the token of 1? No: resource 1
    // starts at site 1, so site 0 gets counter of 1 from site 1 (which does not need it and
    // gives the token away instead).
    h.request(0, &both);
    h.settle();
    assert_eq!(h.granted(), vec![1]);
    assert!(
        h.sys.nodes()[0].holds_token(1),
        "idle holder gave the token away"
    );
    h.release(1);
    h.settle();
    assert_eq!(h.granted(), vec![1, 0]);
}

/// Hand-traced from spec §4.7 H4 (found by an independent audit of the code against the
/// spec): a site in its critical section that holds a token it does not need cedes it at once
/// to a ReqRes; only a conflict lets an inCS holder keep a token. Sites 0, 1; resources 0 and
/// 2 start at site 0, resource 1 at site 1.
#[test]
fn lejeune_in_cs_holder_cedes_a_token_it_does_not_need() {
    let space = ResourceSpace::single(3).expect("space");
    let mut h = Hand::new(Lejeune::new(2, space.clone(), LjConfig::default()).expect("group"));
    let set = |r: &[usize]| MultiRequest::set(r.iter().copied(), &space).expect("req");
    // 1. s0 takes {0, 2}: both tokens are here, no message.
    h.request(0, &set(&[0, 2]));
    assert_eq!(h.granted(), vec![0]);
    // 2-4. s1 asks for {1, 2}: ReqCnt(r2) to s0, Counter(r2) back, then its ReqRes(r2)...
    h.request(1, &set(&[1, 2]));
    assert_eq!(h.step(), "req_cnt");
    assert_eq!(h.step(), "counter");
    // ...which is still in flight when s0 leaves and takes {0} alone (no message).
    h.release(0);
    h.request(0, &set(&[0]));
    assert_eq!(h.granted(), vec![0, 0]);
    // 7. The ReqRes reaches s0, in its CS without r2: the token goes to s1 at once, and s1
    //    enters while s0 is still inside.
    assert_eq!(h.settle(), vec!["req_res", "token"]);
    assert_eq!(h.granted(), vec![0, 0, 1]);
    assert_eq!(h.sys.nodes()[0].state(), leda_mutex::multi::LjState::InCs);
}

/// The spec's property for BL: the wait-for graph (i waits for j when j owes i a token) never
/// has a cycle. Random interleavings (any in-flight message may be delivered next, releases
/// and new requests at random moments), checked after every step; every request is served.
#[test]
fn bl_wait_for_graph_stays_acyclic_under_random_interleavings() {
    let mut max_edges = 0;
    for seed in 0..seeds(150) {
        let mut rng = SplitMix64::new(seed ^ 0xB1);
        let n = rng.range_inclusive(2, 8) as usize;
        let m = rng.range_inclusive(1, 6) as usize;
        let caps = (0..m).map(|_| rng.range_inclusive(1, 3) as u32).collect();
        let space = ResourceSpace::with_capacities(caps).expect("space");
        let mut sys =
            BouabdallahLaforest::new(n, space.clone(), BlConfig::default()).expect("group");
        let mut flight: Vec<(usize, usize, BlMsg)> = Vec::new();
        let mut remaining = vec![3usize; n];
        let mut state = vec![0u8; n]; // 0 idle, 1 waiting, 2 in CS
        let mut granted = 0;
        loop {
            let mut choices = Vec::new();
            if !flight.is_empty() {
                choices.push(0);
            }
            if state.contains(&2) {
                choices.push(1);
            }
            if (0..n).any(|p| state[p] == 0 && remaining[p] > 0) {
                choices.push(2);
            }
            if choices.is_empty() {
                break;
            }
            let mut out = MultiOutbox::new();
            match choices[rng.index(choices.len())] {
                0 => {
                    let (from, to, msg) = flight.swap_remove(rng.index(flight.len()));
                    sys.deliver(from, to, msg, &mut out).expect("deliver");
                }
                1 => {
                    let ps: Vec<usize> = (0..n).filter(|&p| state[p] == 2).collect();
                    let p = ps[rng.index(ps.len())];
                    state[p] = 0;
                    sys.release(p, &mut out).expect("release");
                }
                _ => {
                    let ps: Vec<usize> = (0..n)
                        .filter(|&p| state[p] == 0 && remaining[p] > 0)
                        .collect();
                    let p = ps[rng.index(ps.len())];
                    remaining[p] -= 1;
                    state[p] = 1;
                    let size = rng.range_inclusive(1, m as u64) as usize;
                    let mut types: Vec<usize> = (0..m).collect();
                    for i in 0..size {
                        let j = i + rng.index(m - i);
                        types.swap(i, j);
                    }
                    let items = types[..size]
                        .iter()
                        .map(|&r| {
                            (
                                r,
                                rng.range_inclusive(1, u64::from(space.capacity(r))) as u32,
                            )
                        })
                        .collect();
                    let req = MultiRequest::new(items, &space).expect("request");
                    sys.request(p, &req, &mut out).expect("request");
                }
            }
            for o in out.drain() {
                match o {
                    MultiOutput::Send { from, to, msg } => flight.push((from, to, msg)),
                    MultiOutput::Grant { node, .. } => {
                        assert_eq!(
                            state[node], 1,
                            "seed {seed}: grant to a non-waiting process"
                        );
                        state[node] = 2;
                        granted += 1;
                    }
                }
            }
            // Wait-for graph: edge i -> j when j owes i; it must stay acyclic.
            let edges: Vec<Vec<usize>> = (0..n)
                .map(|i| {
                    (0..n)
                        .filter(|&j| sys.nodes()[j].owes_to().contains(&i))
                        .collect()
                })
                .collect();
            max_edges = max_edges.max(edges.iter().map(Vec::len).sum::<usize>());
            assert!(acyclic(&edges), "seed {seed}: wait-for cycle {edges:?}");
            assert!(sys.ct_holders() <= 1, "seed {seed}: two control tokens");
        }
        assert_eq!(granted, 3 * n, "seed {seed}: requests left unserved");
    }
    assert!(
        max_edges >= 2,
        "the interleavings never built a waiting chain"
    );
}

fn acyclic(edges: &[Vec<usize>]) -> bool {
    // Kahn's algorithm.
    let n = edges.len();
    let mut indeg = vec![0; n];
    for e in edges {
        for &j in e {
            indeg[j] += 1;
        }
    }
    let mut stack: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    let mut seen = 0;
    while let Some(i) = stack.pop() {
        seen += 1;
        for &j in &edges[i] {
            indeg[j] -= 1;
            if indeg[j] == 0 {
                stack.push(j);
            }
        }
    }
    seen == n
}

/// §4.8 single-resource shortcut: a one-resource request costs `ReqCnt` + token (the holder
/// applies A itself) instead of `ReqCnt`, `Counter`, `ReqRes` + token.
#[test]
fn lejeune_single_resource_shortcut_saves_the_counter_round_trip() {
    let space = ResourceSpace::single(1).expect("space");
    let only = MultiRequest::set([0], &space).expect("req");
    for (shortcut, expected) in [
        (true, vec!["req_cnt"]),
        (false, vec!["req_cnt", "counter", "req_res"]),
    ] {
        let config = LjConfig {
            single_shortcut: shortcut,
            ..LjConfig::default()
        };
        let mut h = Hand::new(Lejeune::new(2, space.clone(), config).expect("group"));
        h.request(0, &only); // resource 0 starts at site 0: enters at once
        assert_eq!(h.granted(), vec![0]);
        h.request(1, &only);
        assert_eq!(h.settle(), expected, "shortcut {shortcut}");
        h.release(0);
        assert_eq!(h.settle(), vec!["token"]);
        assert_eq!(h.granted(), vec![0, 1]);
        assert_eq!(h.grants[1].1[0].fence, 2);
    }
}
