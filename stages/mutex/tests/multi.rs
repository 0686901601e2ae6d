//! Multi-resource allocation (issue #10): the checker, the driver, the omniscient reference and
//! the incremental algorithm, over many seeds; the broken unordered variant deadlocks and the
//! checker says so.

use leda_mutex::multi::{
    Clusters, Hold, Incremental, IncrementalConfig, IncrementalMsg, IncrementalNode, LockOrder,
    MultiChecker, MultiOutbox, MultiOutput, MultiReport, MultiRequest, MultiSimConfig, MultiSystem,
    MultiVerdict, MultiViolation, MultiWorkload, Omniscient, ResourceSpace, simulate_multi,
};
use leda_mutex::rng::SplitMix64;
use leda_mutex::{Channels, Latency, Message, MutexError};

/// A random configuration derived from `seed`: N in [1, 16], M in [1, 20], SizeReq in [1, M].
fn random_config(
    seed: u64,
    space_of: impl Fn(usize, &mut SplitMix64) -> ResourceSpace,
) -> MultiSimConfig {
    let mut r = SplitMix64::new(seed ^ 0xA5A5_5A5A);
    let n = r.range_inclusive(1, 16) as usize;
    let m = r.range_inclusive(1, 20) as usize;
    let space = space_of(m, &mut r);
    let mut cfg = MultiSimConfig::new(n, space, seed);
    cfg.workload = MultiWorkload {
        requests_per_node: r.range_inclusive(1, 4) as usize,
        size_req: r.range_inclusive(1, m as u64) as usize,
        cs_duration: Latency::Uniform { min: 1, max: 20 },
        cs_per_resource: 2,
        // Think times from near zero (high load) to long (light load).
        think_time: Latency::Exponential {
            min: 0,
            mean: [0.5, 5.0, 50.0][r.index(3)],
        },
    };
    cfg.latency = Latency::Uniform { min: 1, max: 10 };
    if r.index(2) == 0 {
        cfg.channels = Channels::Fifo;
    }
    cfg
}

/// Seed count: `default`, or `MULTI_SEEDS` from the environment for longer local soaks.
fn seeds(default: u64) -> u64 {
    std::env::var("MULTI_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn single(m: usize, _: &mut SplitMix64) -> ResourceSpace {
    ResourceSpace::single(m).expect("m >= 1")
}

fn multi_instance(m: usize, r: &mut SplitMix64) -> ResourceSpace {
    let caps = (0..m).map(|_| r.range_inclusive(1, 4) as u32).collect();
    ResourceSpace::with_capacities(caps).expect("capacities >= 1")
}

fn run_omniscient(cfg: MultiSimConfig) -> MultiReport {
    let sys = Omniscient::new(cfg.n, cfg.space.clone()).expect("valid group");
    simulate_multi(cfg, sys).expect("valid config")
}

fn run_incremental(cfg: MultiSimConfig, order: LockOrder) -> MultiReport {
    let sys = Incremental::new(cfg.n, cfg.space.clone(), IncrementalConfig { order })
        .expect("valid group");
    simulate_multi(cfg, sys).expect("valid config")
}

fn expected_grants(cfg: &MultiSimConfig) -> u64 {
    (cfg.n * cfg.workload.requests_per_node) as u64
}

#[test]
fn omniscient_safe_and_live_over_300_seeds() {
    for seed in 0..seeds(300) {
        let cfg = random_config(seed, single);
        let want = expected_grants(&cfg);
        let rep = run_omniscient(cfg);
        assert_eq!(rep.verdict, MultiVerdict::Ok, "seed {seed}");
        assert_eq!(rep.stats.grants, want, "seed {seed}");
        assert_eq!(rep.stats.messages, 0, "the reference sends nothing");
    }
}

#[test]
fn incremental_safe_and_live_over_300_seeds() {
    let mut contended = 0;
    for seed in 0..seeds(300) {
        let cfg = random_config(seed, single);
        let (n, want) = (cfg.n, expected_grants(&cfg));
        let rep = run_incremental(cfg, LockOrder::Global);
        assert_eq!(rep.verdict, MultiVerdict::Ok, "seed {seed}");
        assert_eq!(rep.stats.grants, want, "seed {seed}");
        if n > 1 && rep.stats.wait_total > 0 {
            contended += 1;
            assert!(
                rep.stats.messages > 0,
                "seed {seed}: waited without messages"
            );
        }
    }
    assert!(
        contended > 100,
        "too few contended runs ({contended}) to mean anything"
    );
}

#[test]
fn multi_instance_both_algorithms_over_150_seeds() {
    for seed in 0..seeds(150) {
        let cfg = random_config(1000 + seed, multi_instance);
        let want = expected_grants(&cfg);
        let rep = run_omniscient(cfg.clone());
        assert_eq!(rep.verdict, MultiVerdict::Ok, "omniscient seed {seed}");
        assert_eq!(rep.stats.grants, want);
        let rep = run_incremental(cfg, LockOrder::Global);
        assert_eq!(rep.verdict, MultiVerdict::Ok, "incremental seed {seed}");
        assert_eq!(rep.stats.grants, want);
    }
}

#[test]
fn multi_instance_type_is_shared_by_k_holders() {
    // One type with 3 instances (counts drawn in [1, 3]), 6 processes arriving together: both
    // algorithms stay safe (the checker allows at most 3 holders) and serve everyone.
    let space = ResourceSpace::with_capacities(vec![3]).expect("valid");
    let mut cfg = MultiSimConfig::new(6, space.clone(), 7);
    cfg.workload = MultiWorkload {
        requests_per_node: 1,
        size_req: 1,
        cs_duration: Latency::Constant(10),
        cs_per_resource: 0,
        think_time: Latency::Constant(0),
    };
    let rep = run_omniscient(cfg.clone());
    assert_eq!(rep.verdict, MultiVerdict::Ok);
    let rep = run_incremental(cfg, LockOrder::Global);
    assert_eq!(rep.verdict, MultiVerdict::Ok);

    // Driven by hand: four processes each ask for one of the three instances.
    let mut sched = Omniscient::new(4, space.clone()).expect("valid");
    let one = MultiRequest::new(vec![(0, 1)], &space).expect("valid");
    let mut out = MultiOutbox::new();
    for p in 0..4 {
        sched.request(p, &one, &mut out).expect("request");
    }
    let granted: Vec<(usize, Vec<Hold>)> = out
        .drain()
        .map(|o| match o {
            MultiOutput::Grant { node, holds } => (node, holds),
            MultiOutput::Send { .. } => panic!("the reference sends nothing"),
        })
        .collect();
    let instances: Vec<u32> = granted.iter().map(|(_, h)| h[0].instance).collect();
    assert_eq!(
        granted.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(
        instances,
        vec![0, 1, 2],
        "three holders, distinct instances"
    );
    sched.release(1, &mut out).expect("release");
    match out.drain().collect::<Vec<_>>().as_slice() {
        [MultiOutput::Grant { node: 3, holds }] => {
            assert_eq!(
                holds,
                &[Hold {
                    resource: 0,
                    instance: 1,
                    fence: 2
                }]
            );
        }
        other => panic!("expected process 3 granted the freed instance, got {other:?}"),
    }

    let mut ck = MultiChecker::new(4, space.clone());
    let req = MultiRequest::new(vec![(0, 1)], &space).expect("valid");
    for p in 0..4 {
        ck.on_request(p, &req);
    }
    for p in 0..3u32 {
        let hold = Hold {
            resource: 0,
            instance: p,
            fence: 1,
        };
        ck.on_grant(0, p as usize, &[hold])
            .expect("distinct instances may be held at once");
    }
    assert_eq!(ck.held_instances(), 3);
    let err = ck
        .on_grant(
            1,
            3,
            &[Hold {
                resource: 0,
                instance: 1,
                fence: 2,
            }],
        )
        .expect_err("a fourth holder of a 3-instance type");
    assert!(
        matches!(
            err,
            MultiViolation::Exclusion {
                holder: 1,
                intruder: 3,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(ck.waiting(), vec![3]);
}

#[test]
fn checker_rejects_bad_fences_mismatches_and_spurious_events() {
    let space = ResourceSpace::single(3).expect("valid");
    let mut ck = MultiChecker::new(2, space.clone());
    let h = |resource, fence| Hold {
        resource,
        instance: 0,
        fence,
    };
    assert!(matches!(
        ck.on_grant(0, 0, &[h(0, 1)]),
        Err(MultiViolation::SpuriousGrant { node: 0, .. })
    ));
    ck.on_request(0, &MultiRequest::set([0, 2], &space).expect("valid"));
    assert!(matches!(
        ck.on_grant(1, 0, &[h(0, 1)]),
        Err(MultiViolation::GrantMismatch { node: 0, .. })
    ));
    ck.on_grant(2, 0, &[h(2, 5), h(0, 1)])
        .expect("matching grant");
    assert!(matches!(
        ck.on_release(3, 1),
        Err(MultiViolation::SpuriousRelease { node: 1, .. })
    ));
    ck.on_release(4, 0).expect("release");
    ck.on_request(1, &MultiRequest::set([2], &space).expect("valid"));
    let err = ck.on_grant(5, 1, &[h(2, 5)]).expect_err("fence reused");
    assert!(
        matches!(
            err,
            MultiViolation::FenceNotIncreasing {
                resource: 2,
                fence: 5,
                previous: 5,
                ..
            }
        ),
        "{err}"
    );
    ck.on_grant(6, 1, &[h(2, 6)]).expect("higher fence");
}

#[test]
fn broken_unordered_incremental_deadlocks_and_checker_names_the_waiters() {
    let mut deadlocks = 0;
    for seed in 0..60 {
        let space = ResourceSpace::single(2).expect("valid");
        let mut cfg = MultiSimConfig::new(2, space, seed);
        cfg.workload = MultiWorkload {
            requests_per_node: 5,
            size_req: 2,
            cs_duration: Latency::Uniform { min: 1, max: 5 },
            cs_per_resource: 0,
            think_time: Latency::Uniform { min: 0, max: 3 },
        };
        // The correct algorithm never deadlocks on the same workloads...
        assert_eq!(
            run_incremental(cfg.clone(), LockOrder::Global).verdict,
            MultiVerdict::Ok
        );
        // ...the broken one does, and never violates safety while doing so.
        match run_incremental(cfg, LockOrder::Alternating).verdict {
            MultiVerdict::Ok => {}
            MultiVerdict::Deadlock { waiting, .. } => {
                assert_eq!(waiting, vec![0, 1], "seed {seed}: both processes are stuck");
                deadlocks += 1;
            }
            other => panic!("seed {seed}: unexpected verdict {other:?}"),
        }
    }
    assert!(deadlocks >= 5, "only {deadlocks} deadlocks in 60 seeds");
}

#[test]
fn runs_are_deterministic_per_seed() {
    for seed in [3, 42, 977] {
        let cfg = random_config(seed, multi_instance);
        let a = run_incremental(cfg.clone(), LockOrder::Global);
        let b = run_incremental(cfg, LockOrder::Global);
        assert_eq!(a.verdict, b.verdict);
        assert_eq!(a.stats, b.stats);
    }
}

#[test]
fn reference_waits_no_more_than_incremental_on_average() {
    // A trend check over many seeds, not a per-run claim: the message-free reference has no
    // synchronisation cost, the incremental algorithm pays messages and the domino effect.
    let (mut omni, mut inc) = (0u64, 0u64);
    for seed in 0..40 {
        let space = ResourceSpace::single(10).expect("valid");
        let mut cfg = MultiSimConfig::new(8, space, seed);
        cfg.workload.size_req = 5;
        cfg.workload.requests_per_node = 4;
        omni += run_omniscient(cfg.clone()).stats.wait_total;
        inc += run_incremental(cfg, LockOrder::Global).stats.wait_total;
    }
    assert!(omni < inc, "omniscient waited {omni}, incremental {inc}");
}

#[test]
fn bad_requests_and_spaces_are_rejected() {
    assert!(matches!(
        ResourceSpace::single(0),
        Err(MutexError::Config(_))
    ));
    assert!(matches!(
        ResourceSpace::with_capacities(vec![2, 0]),
        Err(MutexError::Config(_))
    ));
    let space = ResourceSpace::with_capacities(vec![2, 1]).expect("valid");
    assert!(matches!(
        MultiRequest::new(vec![], &space),
        Err(MutexError::Config(_))
    ));
    assert!(matches!(
        MultiRequest::new(vec![(5, 1)], &space),
        Err(MutexError::UnknownResource(_))
    ));
    assert!(matches!(
        MultiRequest::new(vec![(0, 3)], &space),
        Err(MutexError::Config(_))
    ));
    assert!(matches!(
        MultiRequest::new(vec![(1, 1), (1, 1)], &space),
        Err(MutexError::Config(_))
    ));
    let req = MultiRequest::new(vec![(1, 1), (0, 2)], &space).expect("valid");
    assert_eq!(req.items(), &[(0, 2), (1, 1)]);
    assert_eq!((req.size(), req.instances()), (2, 3));
    assert_eq!(space.flat(1, 0), Some(2));
    assert_eq!(space.unflat(1), Some((0, 1)));
    assert_eq!(space.unflat(3), None);
    assert!(Omniscient::new(0, space.clone()).is_err());
    assert!(Incremental::new(0, space, IncrementalConfig::default()).is_err());
}

/// A broken wrapper: the first token message the incremental algorithm sends is sent twice.
struct DuplicateFirstToken {
    inner: Incremental,
    done: bool,
}

impl DuplicateFirstToken {
    fn duplicate(&mut self, out: &mut MultiOutbox<IncrementalMsg>) {
        if self.done {
            return;
        }
        let dup = out.as_slice().iter().find_map(|o| match o {
            MultiOutput::Send { from, to, msg } if msg.inner.is_token() => {
                Some((*from, *to, msg.clone()))
            }
            _ => None,
        });
        if let Some((from, to, msg)) = dup {
            out.send(from, to, msg);
            self.done = true;
        }
    }
}

impl MultiSystem for DuplicateFirstToken {
    type Msg = IncrementalMsg;
    const NAME: &'static str = "duplicate-token";
    const REQUIRES_FIFO: bool = false;

    fn token_instance(msg: &IncrementalMsg) -> Option<usize> {
        Incremental::token_instance(msg)
    }

    fn tokens_held(&self) -> Option<Vec<usize>> {
        self.inner.tokens_held()
    }

    fn request(
        &mut self,
        node: usize,
        req: &MultiRequest,
        out: &mut MultiOutbox<IncrementalMsg>,
    ) -> Result<(), MutexError> {
        self.inner.request(node, req, out)?;
        self.duplicate(out);
        Ok(())
    }

    fn release(
        &mut self,
        node: usize,
        out: &mut MultiOutbox<IncrementalMsg>,
    ) -> Result<(), MutexError> {
        self.inner.release(node, out)?;
        self.duplicate(out);
        Ok(())
    }

    fn deliver(
        &mut self,
        from: usize,
        to: usize,
        msg: IncrementalMsg,
        out: &mut MultiOutbox<IncrementalMsg>,
    ) -> Result<(), MutexError> {
        self.inner.deliver(from, to, msg, out)?;
        self.duplicate(out);
        Ok(())
    }
}

#[test]
fn duplicated_token_is_caught_by_the_token_count() {
    let space = ResourceSpace::single(3).expect("valid");
    let mut cfg = MultiSimConfig::new(4, space.clone(), 11);
    cfg.workload.size_req = 3;
    let inner = Incremental::new(4, space, IncrementalConfig::default()).expect("valid group");
    let rep = simulate_multi(cfg, DuplicateFirstToken { inner, done: false }).expect("valid");
    assert!(
        matches!(
            rep.verdict,
            MultiVerdict::Violation(MultiViolation::TokenCount { count: 2, .. })
        ),
        "{:?}",
        rep.verdict
    );
}

#[test]
fn waiting_statistics_per_request_size_add_up() {
    for seed in 0..20 {
        let space = ResourceSpace::single(12).expect("valid");
        let mut cfg = MultiSimConfig::new(10, space, seed);
        cfg.workload.size_req = 12;
        cfg.workload.requests_per_node = 5;
        cfg.workload.think_time = Latency::Exponential { min: 0, mean: 2.0 };
        for rep in [
            run_omniscient(cfg.clone()),
            run_incremental(cfg.clone(), LockOrder::Global),
        ] {
            assert_eq!(rep.verdict, MultiVerdict::Ok);
            let s = &rep.stats;
            let count: u64 = s.wait_by_size.values().map(|w| w.count).sum();
            let sum: u64 = s.wait_by_size.values().map(|w| w.sum).sum();
            assert_eq!((count, sum), (s.grants, s.wait_total), "seed {seed}");
            assert!(s.wait_by_size.keys().all(|&k| (1..=12).contains(&k)));
            assert!(
                s.wait_std() >= 0.0 && s.wait_mean() > 0.0,
                "seed {seed}: contended"
            );
            let use_rate = s.use_rate(12);
            assert!(
                use_rate > 0.0 && use_rate <= 1.0,
                "seed {seed}: use rate {use_rate}"
            );
        }
    }
}

/// Drives `nodes` by hand: each process requests `req`, messages are delivered in sending order,
/// every granted process releases at once. Returns the order of the grants.
fn drive_by_hand(nodes: &mut [IncrementalNode], req: &MultiRequest) -> Vec<usize> {
    let mut out = MultiOutbox::new();
    let mut queue = std::collections::VecDeque::new();
    let mut grants = Vec::new();
    for node in nodes.iter_mut() {
        node.on_request(req, &mut out).expect("request");
    }
    loop {
        while !out.as_slice().is_empty() {
            for o in out.drain().collect::<Vec<_>>() {
                match o {
                    MultiOutput::Send { from, to, msg } => queue.push_back((from, to, msg)),
                    MultiOutput::Grant { node, .. } => {
                        grants.push(node);
                        nodes[node].on_release(&mut out).expect("release");
                    }
                }
            }
        }
        let Some((from, to, msg)) = queue.pop_front() else {
            return grants;
        };
        nodes[to].on_message(from, msg, &mut out).expect("message");
    }
}

#[test]
fn scripted_wait_for_cycle_of_the_unordered_variant() {
    // Tokens start at `t mod n`: resource 0 at process 0, resource 1 at process 1. Both ask for
    // {0, 1}. In the global order both lock 0 first and are served one after the other; with
    // process 1 locking in reverse, each takes the token it holds and queues for the other's:
    // a wait-for cycle, no message left, nobody served.
    let space = ResourceSpace::single(2).expect("valid");
    let req = MultiRequest::set([0, 1], &space).expect("valid");
    let make = |order| {
        (0..2)
            .map(|id| {
                IncrementalNode::new(id, 2, space.clone(), &IncrementalConfig { order })
                    .expect("valid")
            })
            .collect::<Vec<_>>()
    };
    let mut ordered = make(LockOrder::Global);
    assert_eq!(drive_by_hand(&mut ordered, &req), vec![0, 1]);
    let mut broken = make(LockOrder::Alternating);
    assert_eq!(drive_by_hand(&mut broken, &req), Vec::<usize>::new());
    assert!(broken[0].holds_token(0) && broken[1].holds_token(1));
    assert!(!broken[0].in_cs() && !broken[1].in_cs());
}

#[test]
fn clusters_split_local_and_remote_messages() {
    let (mut slow, mut fast) = (0u64, 0u64);
    for seed in 0..20 {
        let space = ResourceSpace::single(8).expect("valid");
        let mut cfg = MultiSimConfig::new(12, space, seed);
        cfg.workload.size_req = 4;
        cfg.latency = Latency::Constant(1);
        for (remote, total) in [(250, &mut slow), (1, &mut fast)] {
            cfg.clusters =
                Some(Clusters::even(12, 3, Latency::Constant(remote)).expect("valid clusters"));
            let rep = run_incremental(cfg.clone(), LockOrder::Global);
            assert_eq!(rep.verdict, MultiVerdict::Ok, "seed {seed}");
            let s = &rep.stats;
            assert_eq!(s.messages_local + s.messages_remote, s.messages);
            assert!(
                s.messages_remote > 0,
                "seed {seed}: tokens start spread over clusters"
            );
            *total += s.wait_total;
        }
    }
    assert!(
        slow > fast,
        "remote latency 250 waited {slow}, 1 waited {fast}"
    );
    assert!(Clusters::even(4, 0, Latency::Constant(1)).is_err());
    assert!(Clusters::even(4, 5, Latency::Constant(1)).is_err());
    let mut cfg = MultiSimConfig::new(4, ResourceSpace::single(2).expect("valid"), 0);
    cfg.clusters = Some(Clusters::even(3, 1, Latency::Constant(1)).expect("valid"));
    let sys = Omniscient::new(4, cfg.space.clone()).expect("valid");
    assert!(matches!(
        simulate_multi(cfg, sys),
        Err(MutexError::Config(_))
    ));
}

/// The omniscient reference backfills (a later, smaller request is served while an earlier
/// one waits); its strict-FIFO variant holds everything behind the head.
#[test]
fn omniscient_backfills_and_its_strict_fifo_variant_does_not() {
    let space = ResourceSpace::single(2).expect("space");
    let r0 = MultiRequest::set([0], &space).expect("req");
    let both = MultiRequest::set([0, 1], &space).expect("req");
    let r1 = MultiRequest::set([1], &space).expect("req");
    for (strict, want) in [(false, vec![0, 2]), (true, vec![0])] {
        let mut sched = if strict {
            Omniscient::strict_fifo(3, space.clone())
        } else {
            Omniscient::new(3, space.clone())
        }
        .expect("valid");
        let mut out = MultiOutbox::new();
        sched.request(0, &r0, &mut out).expect("request");
        sched.request(1, &both, &mut out).expect("request");
        sched.request(2, &r1, &mut out).expect("request");
        let granted: Vec<usize> = out
            .drain()
            .filter_map(|o| match o {
                MultiOutput::Grant { node, .. } => Some(node),
                MultiOutput::Send { .. } => None,
            })
            .collect();
        assert_eq!(granted, want, "strict FIFO: {strict}");
    }
}
