//! Multi-resource locks through the Rust API (`acquire_all`, `acquire_counts`): a whole group in
//! this process, several clients per node asking for overlapping sets, exclusion checked per
//! instance with the fencing tokens; timeouts, cancellation and bad input.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use leda_lock_service::{LocalGroup, LockError, MultiGrant, MultiServiceConfig, ServiceConfig};
use leda_mutex::Algorithm;
use leda_mutex::multi::{MultiAlgorithm, MultiRequestError};

const LONG: Duration = Duration::from_secs(20);

fn config() -> ServiceConfig {
    ServiceConfig {
        algorithm: Algorithm::NaimiTrehel,
        nodes: 3,
        resources: vec!["a".into()],
    }
}

/// Three single-instance locks and `gpu` with 3 instances (1 for the algorithms that only
/// allocate single-instance resources).
fn multi(algorithm: MultiAlgorithm) -> MultiServiceConfig {
    MultiServiceConfig {
        algorithm,
        resources: vec![
            ("x".into(), 1),
            ("y".into(), 1),
            ("z".into(), 1),
            ("gpu".into(), gpus(algorithm)),
        ],
    }
}

fn gpus(algorithm: MultiAlgorithm) -> u32 {
    if algorithm.multi_instance() { 3 } else { 1 }
}

fn group(algorithm: MultiAlgorithm) -> LocalGroup {
    LocalGroup::start_with_multi(&config(), Some(&multi(algorithm)), 2).expect("group starts")
}

/// Per instance: the current holder and the last fencing token seen.
#[derive(Default)]
struct Ledger {
    held: HashMap<(String, u32), (usize, u64)>,
    last: HashMap<(String, u32), u64>,
    grants: usize,
}

impl Ledger {
    fn enter(&mut self, who: usize, g: &MultiGrant) {
        for h in &g.holds {
            let key = (h.resource.clone(), h.instance);
            if let Some((other, _)) = self.held.get(&key) {
                panic!("{key:?} granted to {who} while {other} holds it");
            }
            if let Some(&last) = self.last.get(&key) {
                assert!(
                    h.fencing_token > last,
                    "{key:?}: fencing token {} after {last}",
                    h.fencing_token
                );
            }
            self.last.insert(key.clone(), h.fencing_token);
            self.held.insert(key, (who, h.fencing_token));
        }
        self.grants += 1;
    }

    fn leave(&mut self, g: &MultiGrant) {
        for h in &g.holds {
            self.held.remove(&(h.resource.clone(), h.instance));
        }
    }
}

#[test]
fn overlapping_sets_from_several_clients_never_share_an_instance() {
    for &algorithm in MultiAlgorithm::ALL {
        let g = group(algorithm);
        let ledger = Mutex::new(Ledger::default());
        let k = gpus(algorithm);
        let sets: [&[(&str, u32)]; 6] = [
            &[("x", 1), ("y", 1)],
            &[("y", 1), ("z", 1)],
            &[("z", 1), ("x", 1)],
            &[("x", 1), ("y", 1), ("z", 1), ("gpu", 1)],
            &[("gpu", k.min(2)), ("y", 1)],
            &[("gpu", k)],
        ];
        // 8 rounds per client in CI; `MULTI_LOCK_ROUNDS` for a soak.
        let rounds: usize = std::env::var("MULTI_LOCK_ROUNDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(8);
        std::thread::scope(|s| {
            for node in 0..3 {
                for k in 0..2 {
                    let c = g.client(node).unwrap().clone();
                    let ledger = &ledger;
                    let who = node * 10 + k;
                    s.spawn(move || {
                        for round in 0..rounds {
                            let set = sets[(who + round) % sets.len()];
                            let grant = c.acquire_counts(set, LONG).expect("granted");
                            // The grant holds exactly what was asked, distinct instances.
                            for (r, n) in set {
                                let mut inst = grant.instances(r);
                                inst.dedup();
                                assert_eq!(inst.len(), *n as usize, "{r}: {grant:?}");
                            }
                            assert_eq!(
                                grant.holds.len(),
                                set.iter().map(|(_, n)| *n as usize).sum::<usize>()
                            );
                            ledger.lock().unwrap().enter(who, &grant);
                            std::thread::sleep(Duration::from_micros(300));
                            ledger.lock().unwrap().leave(&grant);
                            c.release_all(grant).expect("released");
                        }
                    });
                }
            }
        });
        assert_eq!(ledger.lock().unwrap().grants, 6 * rounds, "{algorithm}");
        // The set form, and single-resource locks still work beside the multi ones.
        let c = g.client(1).unwrap();
        let both = c.acquire_all(&["x", "z"], LONG).unwrap();
        assert!(both.fencing_token("x", 0).is_some() && both.fencing_token("z", 0).is_some());
        let a = c.acquire("a", LONG).unwrap();
        c.release(a).unwrap();
        c.release_all(both).unwrap();
        g.stop().unwrap();
    }
}

#[test]
fn timeouts_and_cancellation_withdraw_multi_requests() {
    let g = group(MultiAlgorithm::Incremental);
    let (c0, c1, c2) = (
        g.client(0).unwrap(),
        g.client(1).unwrap(),
        g.client(2).unwrap(),
    );
    let held = c0.acquire_all(&["x", "y"], LONG).unwrap();
    // Node 1 needs y, which node 0 holds: the timeout withdraws the whole request.
    assert_eq!(
        c1.acquire_all(&["y", "z"], Duration::from_millis(150)),
        Err(LockError::Timeout("[y, z]".into()))
    );
    // Nothing of it is kept: z is free for another node.
    let z = c2.acquire_all(&["z"], LONG).unwrap();
    c2.release_all(z).unwrap();
    // An explicit cancellation of a request waiting at the node.
    let waiting = c2.begin_all(&["x"]).unwrap();
    waiting.cancel().unwrap();
    // A second local request queues behind the first and is cancelled while queued.
    let first = c1.begin_counts(&[("x", 1), ("gpu", 2)]).unwrap();
    let second = c1.begin_all(&["z"]).unwrap();
    second.cancel().unwrap();
    c0.release_all(held).unwrap();
    let got = first.wait(LONG).expect("the first request is served");
    assert_eq!(got.instances("gpu").len(), 2);
    c1.release_all(got).unwrap();
    // Nothing leaked: every node can take every instance.
    for c in [c0, c1, c2] {
        let all = c
            .acquire_counts(&[("x", 1), ("y", 1), ("z", 1), ("gpu", 3)], LONG)
            .unwrap();
        assert_eq!(all.holds.len(), 6);
        c.release_all(all).unwrap();
    }
    g.stop().unwrap();
}

#[test]
fn bad_multi_requests_get_typed_errors_and_lose_nothing() {
    let g = group(MultiAlgorithm::Incremental);
    let c = g.client(0).unwrap();
    let invalid = |r: Result<MultiGrant, LockError>| match r {
        Err(LockError::Invalid(e)) => e,
        other => panic!("expected an invalid-request error, got {other:?}"),
    };
    let none: [&str; 0] = [];
    assert_eq!(
        invalid(c.acquire_all(&none, LONG)),
        MultiRequestError::Empty
    );
    assert_eq!(
        invalid(c.acquire_all(&["x", "nope"], LONG)),
        MultiRequestError::UnknownResource("nope".into())
    );
    assert_eq!(
        invalid(c.acquire_all(&["x", "y", "x"], LONG)),
        MultiRequestError::Duplicate("x".into())
    );
    assert_eq!(
        invalid(c.acquire_counts(&[("gpu", 4)], LONG)),
        MultiRequestError::Count {
            resource: "gpu".into(),
            count: 4,
            capacity: 3
        }
    );
    assert_eq!(
        invalid(c.acquire_counts(&[("x", 0)], LONG)),
        MultiRequestError::Count {
            resource: "x".into(),
            count: 0,
            capacity: 1
        }
    );
    // A multi-resource lock is not a single lock, and the other way round.
    assert!(
        matches!(c.acquire("x", LONG), Err(LockError::Refused(e)) if e.contains("acquire_all"))
    );
    assert_eq!(
        invalid(c.acquire_all(&["a"], LONG)),
        MultiRequestError::UnknownResource("a".into())
    );
    // The errors queued nothing: the locks are all free.
    let all = c
        .acquire_counts(&[("x", 1), ("y", 1), ("z", 1), ("gpu", 3)], LONG)
        .unwrap();
    c.release_all(all).unwrap();
    g.stop().unwrap();
}

#[test]
fn bad_group_configurations_are_refused() {
    let mut m = multi(MultiAlgorithm::Incremental);
    m.resources.push(("a".into(), 1));
    assert!(matches!(
        LocalGroup::start_with_multi(&config(), Some(&m), 1),
        Err(LockError::Refused(e)) if e.contains("both")
    ));
    let mut m = multi(MultiAlgorithm::Incremental);
    m.resources.push(("x".into(), 2));
    assert!(LocalGroup::start_with_multi(&config(), Some(&m), 1).is_err());
    let mut m = multi(MultiAlgorithm::Incremental);
    m.resources.push(("w".into(), 0));
    assert!(LocalGroup::start_with_multi(&config(), Some(&m), 1).is_err());
    // Without multi-resource locks, acquire_all names unknown locks.
    let g = LocalGroup::start(&config(), 1).unwrap();
    assert!(matches!(
        g.client(0).unwrap().acquire_all(&["x"], LONG),
        Err(LockError::Invalid(MultiRequestError::UnknownResource(r))) if r == "x"
    ));
    g.stop().unwrap();
}

#[test]
fn try_acquire_all_succeeds_only_without_waiting() {
    // Incremental: the token of flat instance `t` starts at node `t mod 3`, so `x` (instance 0)
    // is at node 0 and `y` (instance 1) at node 1.
    let g = group(MultiAlgorithm::Incremental);
    let (c0, c1) = (g.client(0).unwrap(), g.client(1).unwrap());
    let held = c0
        .try_acquire_all(&["x"])
        .unwrap()
        .expect("x's token is at node 0");
    assert_eq!(c1.try_acquire_all(&["x"]).unwrap(), None, "node 1 must ask");
    assert_eq!(c0.try_acquire_all(&["x"]).unwrap(), None, "busy locally");
    c0.release_all(held).unwrap();
    assert_eq!(
        c0.try_acquire_all(&["x", "y"]).unwrap(),
        None,
        "y's token is at node 1"
    );
    assert!(matches!(
        c0.try_acquire_all(&["nope"]),
        Err(LockError::Invalid(MultiRequestError::UnknownResource(r))) if r == "nope"
    ));
    // The withdrawn tries leaked nothing.
    for c in [c0, c1] {
        let all = c.acquire_all(&["x", "y", "z"], LONG).unwrap();
        c.release_all(all).unwrap();
    }
    g.stop().unwrap();
}
