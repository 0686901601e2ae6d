//! The lock API against a whole group running in this process.

use std::time::Duration;

use leda_lock_service::{LocalGroup, LockError, ServiceConfig};
use leda_mutex::Algorithm;

const LONG: Duration = Duration::from_secs(20);

fn group(algorithm: Algorithm) -> LocalGroup {
    LocalGroup::start(
        &ServiceConfig {
            algorithm,
            nodes: 3,
            resources: vec!["a".into(), "b".into()],
        },
        2,
    )
    .expect("group starts")
}

#[test]
fn acquire_release_with_increasing_fences_across_nodes() {
    for algorithm in [
        Algorithm::RicartAgrawala,
        Algorithm::SuzukiKasami,
        Algorithm::NaimiTrehel,
        Algorithm::Centralized,
    ] {
        let g = group(algorithm);
        let mut last = None;
        for round in 0..4 {
            for i in 0..3 {
                let c = g.client(i).unwrap();
                let grant = c.acquire("a", LONG).expect("granted");
                assert_eq!(grant.resource, "a");
                if let Some(prev) = last {
                    assert!(grant.fencing_token > prev, "{algorithm} round {round}");
                }
                last = Some(grant.fencing_token);
                c.release(grant).expect("released");
            }
        }
        // Resources are independent: holding "a" does not block "b".
        let a = g.client(0).unwrap().acquire("a", LONG).unwrap();
        let b = g.client(1).unwrap().acquire("b", LONG).unwrap();
        g.client(1).unwrap().release(b).unwrap();
        g.client(0).unwrap().release(a).unwrap();
        g.stop().unwrap();
    }
}

#[test]
fn try_acquire_succeeds_only_without_waiting() {
    // Suzuki–Kasami: node 0 starts with the token, so it can grant at once.
    let g = group(Algorithm::SuzukiKasami);
    let (c0, c1) = (g.client(0).unwrap(), g.client(1).unwrap());
    let held = c0
        .try_acquire("a")
        .unwrap()
        .expect("the token is at node 0");
    assert_eq!(
        c1.try_acquire("a").unwrap(),
        None,
        "node 1 must ask the others"
    );
    assert_eq!(c0.try_acquire("a").unwrap(), None, "busy locally");
    c0.release(held).unwrap();
    // The withdrawn try of node 1 did not leak the lock.
    let again = c0.acquire("a", LONG).unwrap();
    c0.release(again).unwrap();
    g.stop().unwrap();
}

#[test]
fn timeouts_and_cancellation_withdraw_requests() {
    let g = group(Algorithm::RicartAgrawala);
    let (c0, c1, c2) = (
        g.client(0).unwrap(),
        g.client(1).unwrap(),
        g.client(2).unwrap(),
    );
    let held = c0.acquire("a", LONG).unwrap();
    // Node 1 waits for node 0, which holds: the timeout withdraws the request.
    assert_eq!(
        c1.acquire("a", Duration::from_millis(100)),
        Err(LockError::Timeout("a".into()))
    );
    // A queued request is cancelled explicitly.
    let pending = c2.begin("a").unwrap();
    pending.cancel().unwrap();
    // A second local request queues behind a first, then cancels while queued.
    let first = c1.begin("a").unwrap();
    let second = c1.begin("a").unwrap();
    second.cancel().unwrap();
    c0.release(held).unwrap();
    let got = first.wait(LONG).expect("the first request is served");
    c1.release(got).unwrap();
    // Nothing leaked: every node can still get the lock.
    for c in [c0, c1, c2] {
        let g = c.acquire("a", LONG).unwrap();
        c.release(g).unwrap();
    }
    g.stop().unwrap();
}

#[test]
fn bad_calls_get_clear_errors() {
    let g = group(Algorithm::NaimiTrehel);
    let c = g.client(0).unwrap();
    assert!(
        matches!(c.acquire("nope", LONG), Err(LockError::Refused(e)) if e.contains("unknown resource"))
    );
    let grant = c.acquire("a", LONG).unwrap();
    c.release(grant).unwrap();
    g.stop().unwrap();
}

#[test]
fn concurrent_clients_never_overlap() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let g = group(Algorithm::Maekawa);
    let inside = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for i in 0..3 {
            for _ in 0..2 {
                let c = g.client(i).unwrap().clone();
                let inside = inside.clone();
                s.spawn(move || {
                    for _ in 0..15 {
                        let grant = c.acquire("b", LONG).unwrap();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "overlap");
                        std::thread::sleep(Duration::from_micros(200));
                        inside.fetch_sub(1, Ordering::SeqCst);
                        c.release(grant).unwrap();
                    }
                });
            }
        }
    });
    g.stop().unwrap();
}

/// When the run ends, a caller blocked in `acquire` (or a release that waits for the node)
/// gets an error at once, not after its own timeout (review finding F3, rv13: `lock-service
/// run` noticed a lost node at 0.5 s but exited only when its API clients' 30 s acquire
/// timeout ran out).
#[test]
fn a_blocked_acquire_returns_when_the_run_ends() {
    let g = group(Algorithm::SuzukiKasami);
    let held = g.client(0).unwrap().acquire("a", LONG).unwrap();
    let waiter = g.client(1).unwrap().clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(waiter.acquire("a", Duration::from_secs(600)));
    });
    // The request is queued behind the holder before the run ends.
    std::thread::sleep(Duration::from_millis(300));
    let holder = g.client(0).unwrap().clone();
    g.stop().unwrap();
    let blocked = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the acquire still blocks 20 s after the run ended");
    match blocked {
        Err(LockError::Unavailable(why)) => assert!(why.contains("run ended"), "{why}"),
        other => panic!("expected the run's end, got {other:?}"),
    }
    assert!(matches!(
        holder.release(held),
        Err(LockError::Unavailable(_))
    ));
}
