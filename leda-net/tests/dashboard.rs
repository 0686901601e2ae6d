//! The launcher's dashboard aggregates every process of a mapped graph: its `/stats`
//! and `/metrics` include the daemon's stages, and a control action names the daemon
//! and is applied there.

mod common;
#[path = "../src/bin/leda-net-test-node/stages.rs"]
mod stages;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{Node, eventually};
use leda_core::dashboard::Sample;
use leda_core::prelude::*;
use leda_net::Launcher;

const ME: &str = "launcher:1";

fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the dashboard");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn stats(addr: SocketAddr) -> Sample {
    serde_json::from_str(&http(addr, "GET", "/stats").1).expect("a sample")
}

#[test]
fn launcher_dashboard_shows_and_steers_the_daemon() {
    let node = Node::spawn(&["--threads", "2"]);
    let gen_ = stages::generator("gen");
    let slow = stages::slow("slow").attr("ms", 2);
    let mut g = Graph::new("dash");
    g.connect(&gen_, 1, &slow);
    g.part([Cluster::of([&gen_]), Cluster::of([&slow])])
        .unwrap()
        .map([ME, node.addr.as_str()])
        .unwrap();
    gen_.push((300, 0, false));
    // No idle detection: the run lasts until the test quits it.
    let launched = Launcher::new(ME)
        .start(&g, Run::default().threads(2).dashboard("127.0.0.1:0"))
        .expect("start");
    let addr = launched.dashboard_addr().expect("a dashboard");

    // The sampler asks the daemon once a second.
    let mut sample = Sample::default();
    assert!(
        eventually(Duration::from_secs(10), || {
            sample = stats(addr);
            !sample.peers.is_empty()
        }),
        "the daemon's statistics reach the launcher's dashboard"
    );
    assert_eq!(sample.name, ME);
    assert_eq!(sample.peers[0].name, node.addr);
    assert!(sample.peers[0].snapshot.stage("slow").is_some());
    assert!(sample.local.stage("gen").is_some());
    assert_eq!(sample.peers[0].snapshot.process.threads, 2);

    let (_, metrics) = http(addr, "GET", "/metrics");
    assert!(
        metrics.contains(&format!(
            "leda_stage_handled_total{{process=\"{}\",stage=\"slow\"}}",
            node.addr
        )),
        "{metrics}"
    );
    assert!(metrics.contains("leda_stage_handled_total{process=\"launcher:1\",stage=\"gen\"}"));
    // The remote route's accounting, by outcome, in the metrics and the snapshot.
    for outcome in ["sent", "delivered", "failed", "discarded"] {
        let series = format!(
            "leda_remote_events_total{{process=\"launcher:1\",from=\"gen\",to=\"slow\",outcome=\"{outcome}\"}}"
        );
        assert!(metrics.contains(&series), "{series} in {metrics}");
    }
    let route = &stats(addr).local.remote_routes;
    assert!(
        route.len() == 1 && route[0].sent > 0 && route[0].from == "gen",
        "{route:?}"
    );

    let graph: serde_json::Value = serde_json::from_str(&http(addr, "GET", "/graph").1).unwrap();
    let procs: Vec<&str> = graph["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(procs, [ME, node.addr.as_str()]);

    // Resize the daemon's pool from the launcher's dashboard.
    let (code, body) = http(
        addr,
        "POST",
        &format!("/control/threads?n=3&process={}", node.addr),
    );
    assert_eq!(code, 200, "{body}");
    assert!(
        eventually(Duration::from_secs(10), || stats(addr)
            .peers
            .first()
            .is_some_and(|p| p.snapshot.process.threads == 3)),
        "the daemon runs 3 threads"
    );
    let (code, body) = http(
        addr,
        "POST",
        &format!("/control/maxpar?stage=nope&n=3&process={}", node.addr),
    );
    assert_eq!(code, 502, "{body}");
    assert!(
        body.contains("nope"),
        "the daemon's refusal comes back: {body}"
    );

    launched.handle().quit(());
    let report = launched.wait().expect("the run ends");
    assert!(!report.idle);
    // Quit with events still queued at the daemon: every one sent is delivered or
    // discarded at the end, in the report and in the end-of-run statistics.
    let r = &report.routes;
    assert!(r.len() == 1 && r[0].adds_up() && r[0].failed == 0, "{r:?}");
    assert_eq!(report.run.stats.remote_routes.len(), 1);
    let (status, _) = node.finish(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "the daemon exits cleanly"
    );
}
