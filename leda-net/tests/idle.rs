//! Global idle detection across real processes: a run that ends by idleness must not
//! end while events are still queued, running, or in flight between processes.

mod common;
#[path = "../src/bin/leda-net-test-node/stages.rs"]
mod stages;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Node, eventually};
use leda_core::prelude::*;
use leda_net::Launcher;

const ME: &str = "launcher:1";
const EXIT: Duration = Duration::from_secs(10);

/// gen (launcher) -> slow_echo (daemon) -> count (launcher), ended by idleness only.
/// Returns what `count` saw and the launch report.
fn round_trip(
    n: i64,
    size: usize,
    ms: u64,
    local_until_idle: bool,
) -> (u64, leda_net::LaunchReport) {
    let node = Node::spawn(&["--threads", "2"]);
    let seen = Arc::new(AtomicU64::new(0));
    let gen_ = stages::generator("gen");
    let echo = stages::slow_echo("slow_echo").attr("ms", ms as i64);
    let count = stages::counter("count", seen.clone());
    let mut g = Graph::new("idle");
    g.connect(&gen_, 1, &echo);
    g.connect(&echo, 1, &count);
    g.part([Cluster::of([&gen_, &count]), Cluster::of([&echo])])
        .unwrap()
        .map([ME, node.addr.as_str()])
        .unwrap();
    gen_.push((n, size as i64, false));
    let mut run = Run::default().threads(2);
    if local_until_idle {
        run = run.until_idle();
    }
    let report = Launcher::new(ME)
        .until_idle()
        .run(&g, run)
        .expect("idle run");
    let (status, _) = node.finish(EXIT);
    assert!(status.is_some_and(|s| s.success()), "daemon exits cleanly");
    (seen.load(Ordering::SeqCst), report)
}

fn check(n: i64, seen: u64, report: &leda_net::LaunchReport) {
    let t = report.transport;
    assert!(
        report.idle,
        "ended by global idleness: {:?}",
        report.run.reason
    );
    assert_eq!(t.failed, 0, "{t:?}");
    assert_eq!(t.sent, n as u64, "every event went out: {t:?}");
    assert_eq!(t.delivered, t.sent, "{t:?}");
    assert_eq!(t.accepted, n as u64, "every echo came back: {t:?}");
    assert_eq!(seen, n as u64, "every event accounted for: {t:?}");
}

/// Many events, some large (they stay on the wire and in frame buffers for a while),
/// and a daemon stage busy long after the launcher has nothing left to do.
#[test]
fn until_idle_waits_for_events_in_flight() {
    const N: i64 = 300;
    let (seen, report) = round_trip(N, 256 * 1024, 2, false);
    check(N, seen, &report);
}

/// The same with the local run also asked to end when idle: the launcher's own
/// process being idle must not end the run while the daemon still works.
#[test]
fn local_until_idle_does_not_end_a_launched_run_early() {
    const N: i64 = 40;
    let (seen, report) = round_trip(N, 1024 * 1024, 25, true);
    check(N, seen, &report);
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

/// A live daemon that does not answer status requests for a while (stopped with
/// SIGSTOP while it still holds work) must hold the run: silence is not idleness.
#[test]
fn silent_daemon_holds_the_run() {
    const N: i64 = 60;
    let node = Node::spawn(&["--threads", "2"]);
    let seen = Arc::new(AtomicU64::new(0));
    let gen_ = stages::generator("gen");
    let echo = stages::slow_echo("slow_echo").attr("ms", 40);
    let count = stages::counter("count", seen.clone());
    let mut g = Graph::new("idle-silent");
    g.connect(&gen_, 1, &echo);
    g.connect(&echo, 1, &count);
    g.part([Cluster::of([&gen_, &count]), Cluster::of([&echo])])
        .unwrap()
        .map([ME, node.addr.as_str()])
        .unwrap();
    gen_.push((N, 0, false));
    // Frozen for less than the silence bound: not lost (see tests/chaos.rs for more).
    let launched = Launcher::new(ME)
        .liveness(leda_net::Liveness::with_silence(Duration::from_secs(15)))
        .until_idle()
        .start(&g, Run::default().threads(2))
        .expect("start");
    assert!(
        eventually(Duration::from_secs(20), || launched.transport().delivered
            >= N as u64),
        "every event reached the daemon"
    );
    // The launcher has nothing left to do; the daemon still works, and stops
    // answering for longer than two status rounds may wait.
    let pid = node.pid();
    signal(pid, "-STOP");
    std::thread::sleep(Duration::from_millis(4500));
    let early = seen.load(Ordering::SeqCst);
    signal(pid, "-CONT");
    let report = launched.wait().expect("run");
    assert!(
        early < N as u64,
        "the daemon still had work when stopped ({early})"
    );
    let (status, _) = node.finish(EXIT);
    assert!(status.is_some_and(|s| s.success()), "daemon exits cleanly");
    check(N, seen.load(Ordering::SeqCst), &report);
}
