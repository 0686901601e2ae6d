//! The dashboard endpoint over real HTTP on loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use leda_core::prelude::*;
use leda_core::runtime::Running;

fn http(addr: SocketAddr, method: &str, path: &str, auth: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = auth
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
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

/// A two-stage graph that stays alive (its source waits) until quit.
fn start(run: Run) -> Running {
    let src = Stage::asynchronous("src", |_, mut ctx: Ctx| async move {
        ctx.send_wait("out", "hello").await?;
        ctx.sleep(Duration::from_secs(3600)).await;
        Ok(())
    })
    .autostart(());
    let sink = Stage::new("sink \"quoted\"", |_, _| Ok(())).serial();
    let mut g = Graph::new("dash");
    g.connect(&src, "out", &sink).local();
    g.start(run.threads(2)).unwrap()
}

#[test]
fn serves_page_stats_metrics_graph_and_controls() {
    let running = start(Run::default().dashboard("127.0.0.1:0"));
    let addr = running.dashboard_addr().unwrap();
    assert!(addr.ip().is_loopback());

    let (code, page) = http(addr, "GET", "/", None);
    assert_eq!(code, 200);
    assert!(
        page.contains("<svg") && !page.contains("http://") && !page.contains("https://"),
        "self-contained page"
    );

    let (code, stats) = http(addr, "GET", "/stats", None);
    assert_eq!(code, 200);
    let snap: leda_core::stats::Snapshot = serde_json::from_str(&stats).unwrap();
    assert_eq!(snap.stages.len(), 2);

    let (code, metrics) = http(addr, "GET", "/metrics", None);
    assert_eq!(code, 200);
    assert!(
        metrics.contains("# TYPE leda_stage_queue_length gauge"),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"leda_stage_handled_total{process="local",stage="sink \"quoted\""}"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"leda_connector_events_total{process="local",from="src",port="out",to="sink \"quoted\"",kind="local"}"#));
    assert!(
        metrics.contains("leda_process_threads{process=\"local\"} 2"),
        "{metrics}"
    );

    let (code, graph) = http(addr, "GET", "/graph", None);
    assert_eq!(code, 200);
    let graph: serde_json::Value = serde_json::from_str(&graph).unwrap();
    assert_eq!(graph["stages"][1]["serial"], true);
    assert_eq!(graph["connectors"][0]["kind"], "local");
    let (_, dot) = http(addr, "GET", "/graph.dot", None);
    assert!(dot.starts_with("digraph \"dash\""), "{dot}");

    let (code, _) = http(addr, "POST", "/control/threads?n=3", None);
    assert_eq!(code, 200);
    assert_eq!(running.handle().snapshot().process.threads, 3);
    let (code, _) = http(addr, "POST", "/control/capacity?stage=src&n=10", None);
    assert_eq!(code, 200);
    assert_eq!(
        running
            .handle()
            .snapshot()
            .stage("src")
            .unwrap()
            .queue_capacity,
        10
    );
    let (code, body) = http(
        addr,
        "POST",
        "/control/maxpar?stage=sink%20%22quoted%22&n=4",
        None,
    );
    assert_eq!(
        (code, body.trim()),
        (
            400,
            "stage 'sink \"quoted\"' is serial: its maxpar is always 1"
        )
    );
    let (code, _) = http(addr, "POST", "/control/maxpar?stage=nope&n=4", None);
    assert_eq!(code, 400);
    assert_eq!(http(addr, "GET", "/nope", None).0, 404);
    assert_eq!(http(addr, "DELETE", "/stats", None).0, 405);

    running.handle().quit(());
    running.wait().unwrap();
}

#[test]
fn a_token_guards_every_route() {
    let running = start(
        Run::default()
            .dashboard("127.0.0.1:0")
            .dashboard_token("s3cret"),
    );
    let addr = running.dashboard_addr().unwrap();
    assert_eq!(http(addr, "GET", "/stats", None).0, 401);
    assert_eq!(http(addr, "GET", "/stats", Some("wrong")).0, 401);
    assert_eq!(http(addr, "GET", "/stats", Some("s3cret")).0, 200);
    assert_eq!(http(addr, "GET", "/metrics?token=s3cret", None).0, 200);
    assert_eq!(http(addr, "POST", "/control/threads?n=1", None).0, 401);
    running.handle().quit(());
    running.wait().unwrap();
}

#[test]
fn off_loopback_without_token_is_refused() {
    let s = Stage::new("s", |_, _| Ok(()));
    let mut g = Graph::new("g");
    g.add(&s);
    let err = g
        .start(Run::default().dashboard("0.0.0.0:0"))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("requires a token"), "{err}");
}
