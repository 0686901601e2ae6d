//! The dashboard endpoint over real HTTP on loopback: routes, Prometheus text (parsed
//! by a real parser), access control, aggregation of peer processes, and the page
//! itself in headless Chromium.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leda_core::dashboard::{Control, PeerStats, Sample};
use leda_core::prelude::*;
use leda_core::runtime::Running;
use leda_core::runtime::executor::{RemoteLinks, RemoteSink};
use leda_core::stats::{Snapshot, StageSnapshot};

fn request(addr: SocketAddr, method: &str, path: &str, headers: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n"
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

fn http(addr: SocketAddr, method: &str, path: &str, auth: Option<&str>) -> (u16, String) {
    let auth = auth
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    request(addr, method, path, &auth)
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
    assert!(
        page.contains("add thread"),
        "thread-pool controls on the page"
    );

    let (code, stats) = http(addr, "GET", "/stats", None);
    assert_eq!(code, 200);
    let snap: Snapshot = serde_json::from_str(&stats).unwrap();
    assert_eq!(snap.stages.len(), 2);
    let sample: Sample = serde_json::from_str(&stats).unwrap();
    assert_eq!(sample.name, "local");
    assert!(sample.peers.is_empty());
    let (code, history) = http(addr, "GET", "/history", None);
    assert_eq!(code, 200);
    let history: Vec<Sample> = serde_json::from_str(&history).unwrap();
    assert!(!history.is_empty());

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
    assert_eq!(graph["stages"][0]["ports"], serde_json::json!(["out"]));
    assert_eq!(graph["connectors"][0]["kind"], "local");
    assert_eq!(graph["clusters"].as_array().unwrap().len(), 1);
    assert_eq!(
        graph["processes"],
        serde_json::json!([{"name": "local", "clusters": [0], "this": true}])
    );
    let (_, dot) = http(addr, "GET", "/graph.dot", None);
    assert!(dot.starts_with("digraph \"dash\""), "{dot}");
    assert_eq!(http(addr, "GET", "/graph?format=dot", None).1, dot);
    assert_eq!(
        request(addr, "GET", "/graph", "Accept: text/vnd.graphviz\r\n").1,
        dot
    );

    let (code, _) = http(addr, "POST", "/control/threads?n=3", None);
    assert_eq!(code, 200);
    assert_eq!(running.handle().snapshot().process.threads, 3);
    let (code, _) = http(addr, "POST", "/control/threads?n=2&process=local", None);
    assert_eq!(code, 200);
    assert_eq!(running.handle().snapshot().process.threads, 2);
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
    let (code, _) = http(addr, "POST", "/control/maxpar?stage=src&n=3", None);
    assert_eq!(code, 200);
    assert_eq!(running.handle().snapshot().stage("src").unwrap().maxpar, 3);
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
    let (code, _) = http(addr, "POST", "/control/threads?n=many", None);
    assert_eq!(code, 400);
    let (code, body) = http(
        addr,
        "POST",
        "/control/threads?n=2&process=10.0.0.9:1",
        None,
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("no process 10.0.0.9:1"), "{body}");
    assert_eq!(http(addr, "POST", "/control/nope?n=1", None).0, 404);
    assert_eq!(http(addr, "GET", "/nope", None).0, 404);
    assert_eq!(http(addr, "DELETE", "/stats", None).0, 405);

    running.handle().quit(());
    running.wait().unwrap();
}

/// A pipeline that handles a known number of events, then stays alive.
fn busy_pipeline(run: Run, events: i64) -> Running {
    let src = Stage::asynchronous("source", move |_, mut ctx: Ctx| async move {
        for i in 0..events {
            ctx.send_wait("out", i).await?;
        }
        ctx.sleep(Duration::from_secs(3600)).await;
        Ok(())
    })
    .autostart(());
    let work = Stage::new("work", |ev: Event, ctx: &mut Ctx| {
        ctx.send("done", ev.get::<i64>(0)?)?;
        Ok(())
    });
    let sink = Stage::new("sink", |_, _| Ok(())).serial();
    let mut g = Graph::new("pipeline");
    g.connect(&src, "out", &work);
    g.connect(&work, "done", &sink).local();
    g.start(run.threads(2)).unwrap()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn prometheus_text_parses_with_stable_names_and_labels() {
    let running = busy_pipeline(Run::default().dashboard("127.0.0.1:0"), 500);
    let addr = running.dashboard_addr().unwrap();
    let h = running.handle();
    wait_until("500 events at the sink", || {
        h.snapshot().stage("sink").is_some_and(|s| s.handled == 500)
    });
    // /metrics serves the latest one-second sample: wait until it has the events.
    let mut text = String::new();
    wait_until("a sample with every event", || {
        text = http(addr, "GET", "/metrics", None).1;
        text.contains(r#"leda_stage_handled_total{process="local",stage="sink"} 500"#)
    });
    let scrape =
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parses");
    let find = |metric: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .unwrap_or_else(|| panic!("no {metric} {labels:?}"))
            .value
            .clone()
    };
    use prometheus_parse::Value;
    for stage in ["source", "work", "sink"] {
        for metric in [
            "leda_stage_events_in_total",
            "leda_stage_handled_total",
            "leda_stage_errors_total",
        ] {
            assert!(
                matches!(
                    find(metric, &[("process", "local"), ("stage", stage)]),
                    Value::Counter(_)
                ),
                "{metric} is a counter"
            );
        }
        assert!(matches!(
            find(
                "leda_stage_queue_length",
                &[("process", "local"), ("stage", stage)]
            ),
            Value::Gauge(_)
        ));
    }
    assert_eq!(
        find(
            "leda_stage_handled_total",
            &[("process", "local"), ("stage", "work")]
        ),
        Value::Counter(500.0)
    );
    assert_eq!(
        find(
            "leda_connector_events_total",
            &[
                ("process", "local"),
                ("from", "work"),
                ("port", "done"),
                ("to", "sink"),
                ("kind", "local")
            ]
        ),
        Value::Counter(500.0)
    );
    assert_eq!(
        find("leda_process_threads", &[("process", "local")]),
        Value::Gauge(2.0)
    );
    assert!(matches!(
        find("leda_process_resident_memory_bytes", &[("process", "local")]),
        Value::Gauge(v) if v > 0.0
    ));
    // Every sample carries the process label; every family has help text.
    assert!(
        scrape
            .samples
            .iter()
            .all(|s| s.labels.get("process") == Some("local"))
    );
    for name in [
        "leda_stage_latency_p99_seconds",
        "leda_connector_latency_mean_seconds",
    ] {
        assert!(scrape.docs.contains_key(name), "HELP for {name}");
    }
    h.quit(());
    running.wait().unwrap();
}

#[test]
fn a_token_guards_every_route() {
    let running = start(
        Run::default()
            .dashboard("127.0.0.1:0")
            .dashboard_token("s3cret-token"),
    );
    let addr = running.dashboard_addr().unwrap();
    for path in [
        "/",
        "/stats",
        "/history",
        "/metrics",
        "/graph",
        "/graph.dot",
    ] {
        assert_eq!(http(addr, "GET", path, None).0, 401, "{path}");
    }
    assert_eq!(http(addr, "GET", "/stats", Some("wrong")).0, 401);
    assert_eq!(http(addr, "GET", "/stats", Some("s3cret-token")).0, 200);
    assert_eq!(
        http(addr, "GET", "/metrics?token=s3cret-token", None).0,
        200
    );
    assert_eq!(http(addr, "POST", "/control/threads?n=1", None).0, 401);
    assert_eq!(
        http(addr, "POST", "/control/threads?n=1&token=wrong", None).0,
        401
    );
    assert_eq!(running.handle().snapshot().process.threads, 2);
    assert_eq!(
        http(addr, "POST", "/control/threads?n=1", Some("s3cret-token")).0,
        200
    );
    assert_eq!(running.handle().snapshot().process.threads, 1);
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

/// A transport stand-in that reports one peer process and records forwarded controls.
#[derive(Default)]
struct FakePeers {
    controls: Mutex<Vec<(String, Control)>>,
}

impl RemoteLinks for FakePeers {
    fn sink(
        &self,
        _: &str,
        to: &str,
        _: usize,
        _: &[String],
    ) -> Result<Arc<dyn RemoteSink>, String> {
        Err(format!("no remote stage {to} in this test"))
    }

    fn peer_stats(&self) -> Vec<PeerStats> {
        vec![PeerStats {
            name: "127.0.0.1:7002".into(),
            snapshot: Snapshot {
                time: 1.0,
                stages: vec![StageSnapshot {
                    name: "remote-stage".into(),
                    queue_len: 7,
                    queue_capacity: 100,
                    handled: 42,
                    ..Default::default()
                }],
                process: leda_core::stats::ProcessSnapshot {
                    threads: 5,
                    ..Default::default()
                },
                ..Default::default()
            },
        }]
    }

    fn peer_control(&self, process: &str, action: &Control) -> Result<(), String> {
        self.controls
            .lock()
            .unwrap()
            .push((process.to_owned(), action.clone()));
        Ok(())
    }
}

#[test]
fn peers_reported_by_the_transport_are_aggregated_and_controllable() {
    let peers = Arc::new(FakePeers::default());
    let running = start(
        Run::default()
            .dashboard("127.0.0.1:0")
            .remote(peers.clone()),
    );
    let addr = running.dashboard_addr().unwrap();
    // Peers appear in `/stats` as last sampled; the sampler's first round runs on its own
    // thread, so a request made at once may come before it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let sample: Sample = loop {
        let s: Sample = serde_json::from_str(&http(addr, "GET", "/stats", None).1).unwrap();
        if !s.peers.is_empty() || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(sample.peers.len(), 1);
    assert_eq!(sample.peers[0].snapshot.stages[0].queue_len, 7);
    let names: Vec<&str> = sample.processes().map(|p| p.0).collect();
    assert_eq!(names, ["local", "127.0.0.1:7002"]);

    let text = http(addr, "GET", "/metrics", None).1;
    let scrape =
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parses");
    let threads: Vec<(Option<&str>, f64)> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "leda_process_threads")
        .map(|s| match s.value {
            prometheus_parse::Value::Gauge(v) => (s.labels.get("process"), v),
            ref other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        threads,
        [(Some("local"), 2.0), (Some("127.0.0.1:7002"), 5.0)]
    );
    assert!(
        text.contains(
            r#"leda_stage_queue_length{process="127.0.0.1:7002",stage="remote-stage"} 7"#
        )
    );

    let (code, _) = http(
        addr,
        "POST",
        "/control/capacity?stage=remote-stage&n=64&process=127.0.0.1%3A7002",
        None,
    );
    assert_eq!(code, 200);
    assert_eq!(
        peers.controls.lock().unwrap().as_slice(),
        [(
            "127.0.0.1:7002".to_owned(),
            Control::Capacity {
                stage: "remote-stage".into(),
                n: 64
            }
        )]
    );
    running.handle().quit(());
    running.wait().unwrap();
}

/// The page in a real browser (opened with a token): it draws the stages, and its
/// "add thread" button grows the worker pool. Skipped (with a message) where Chromium is not installed;
/// `.ci/run` installs it.
#[test]
fn page_in_headless_chromium_shows_stages_and_adds_a_thread() {
    use headless_chrome::{Browser, LaunchOptions};
    let Ok(chromium) = headless_chrome::browser::default_executable() else {
        eprintln!(
            "SKIPPED page_in_headless_chromium_shows_stages_and_adds_a_thread: no Chromium found \
             (install Debian's `chromium`, or set CHROME to its path)"
        );
        return;
    };
    // With a token: the page passes on the one it was opened with.
    let running = busy_pipeline(
        Run::default()
            .dashboard("127.0.0.1:0")
            .dashboard_token("t0k3n-token"),
        100,
    );
    let addr = running.dashboard_addr().unwrap();
    let browser = Browser::new(
        LaunchOptions::default_builder()
            .path(Some(chromium))
            .headless(true)
            .sandbox(false)
            .window_size(Some((1400, 1000)))
            .idle_browser_timeout(Duration::from_secs(60))
            .build()
            .unwrap(),
    )
    .expect("launch chromium");
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(10));
    tab.navigate_to(&format!("http://{addr}/?token=t0k3n-token"))
        .unwrap()
        .wait_until_navigated()
        .unwrap();
    // The graph is drawn with every stage, and the stage table lists them.
    for stage in ["source", "work", "sink"] {
        tab.wait_for_element(&format!("#graph g.stage[data-stage=\"{stage}\"]"))
            .unwrap_or_else(|e| panic!("stage {stage} drawn: {e}"));
    }
    let table = tab
        .wait_for_element("#stages")
        .unwrap()
        .get_inner_text()
        .unwrap();
    for stage in ["source", "work", "sink"] {
        assert!(table.contains(stage), "{table}");
    }
    let threads = |tab: &headless_chrome::Tab| {
        tab.wait_for_element("#threads-0")
            .and_then(|e| e.get_inner_text())
            .unwrap_or_default()
    };
    wait_until("the process panel", || threads(&tab) == "2");
    // A real mouse click on the button, retried only if it did not reach the server
    // (the page may be mid-update).
    let h = running.handle();
    let mut clicked = false;
    for _ in 0..5 {
        let ok = tab
            .wait_for_element("#add-thread-0")
            .and_then(|b| b.click().map(|_| ()))
            .is_ok();
        let deadline = Instant::now() + Duration::from_secs(2);
        while ok && h.snapshot().process.threads == 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if h.snapshot().process.threads != 2 {
            clicked = true;
            break;
        }
    }
    assert!(clicked, "clicked \"add thread\"");
    wait_until("the page to show 3 threads", || threads(&tab) == "3");
    assert_eq!(running.handle().snapshot().process.threads, 3);
    running.handle().quit(());
    running.wait().unwrap();
}

/// Without a token, the dashboard takes state-changing requests only from its own
/// pages: a cross-site POST (another `Origin`) and a rebound name (another `Host`) are
/// refused; control values are bounded; connections are capped and a client that
/// drips its request is dropped at the deadline.
#[test]
fn cross_site_requests_huge_values_and_floods_are_refused() {
    let running = start(Run::default().dashboard("127.0.0.1:0"));
    let addr = running.dashboard_addr().unwrap();
    let (code, body) = request(
        addr,
        "POST",
        "/control/threads?n=3",
        "Origin: http://evil.example\r\n",
    );
    assert_eq!(code, 403, "{body}");
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /stats HTTP/1.1\r\nHost: evil.example:{}\r\nConnection: close\r\n\r\n",
        addr.port()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    // A Host or Origin that is not UTF-8, or a Host given twice, is not ours either
    // (each passed for absent).
    for head in [
        b"GET /stats HTTP/1.1\r\nHost: evil\xff.example\r\nConnection: close\r\n\r\n".to_vec(),
        format!(
            "GET /stats HTTP/1.1\r\nHost: {addr}\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
        )
        .into_bytes(),
        {
            let mut v = format!(
                "POST /control/threads?n=2 HTTP/1.1\r\nHost: {addr}\r\nOrigin: http://evil"
            )
            .into_bytes();
            v.extend_from_slice(b"\xff.example\r\nConnection: close\r\n\r\n");
            v
        },
    ] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&head).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    }
    // Its own page's origin is fine, and so is a client that sends none (curl).
    let own = format!("Origin: http://{addr}\r\n");
    assert_eq!(request(addr, "POST", "/control/threads?n=3", &own).0, 200);
    let (code, body) = http(addr, "POST", "/control/threads?n=100000", None);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("outside 1..="), "{body}");
    assert_eq!(http(addr, "POST", "/control/threads?n=0", None).0, 400);
    assert_eq!(running.handle().snapshot().process.threads, 3);
    // A flood of silent connections: some are refused at once (503), and every one
    // is closed by the request deadline, after which the dashboard answers again.
    let t0 = Instant::now();
    let silent: Vec<TcpStream> = (0..48).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut refused = 0;
    for mut c in silent {
        c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        if out.starts_with("HTTP/1.1 503") {
            refused += 1;
        }
    }
    assert!(refused >= 48 - 32, "{refused} refused");
    assert!(t0.elapsed() < Duration::from_secs(14), "{:?}", t0.elapsed());
    assert_eq!(http(addr, "GET", "/stats", None).0, 200);
    running.handle().quit(());
    running.wait().unwrap();
}
