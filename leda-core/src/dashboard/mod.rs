//! The observability endpoint: a small HTTP server per process.
//!
//! | route | what |
//! |---|---|
//! | `GET /` | the dashboard page (self-contained: no external asset) |
//! | `GET /stats` | the latest statistics snapshot, JSON |
//! | `GET /history` | the last five minutes of snapshots, one per second, JSON |
//! | `GET /metrics` | Prometheus text exposition |
//! | `GET /graph` | stages, ports, connectors, clusters and processes, JSON |
//! | `GET /graph.dot` | the graph in Graphviz DOT |
//! | `POST /control/threads?n=N` | resize the worker pool |
//! | `POST /control/maxpar?stage=S&n=N` | set a stage's instance limit |
//! | `POST /control/capacity?stage=S&n=N` | set a stage's queue capacity |
//!
//! It listens on 127.0.0.1 unless told otherwise; any other address requires a token.
//! With a token, every request must carry it (`Authorization: Bearer TOKEN` or
//! `?token=TOKEN`); without one, control actions are still refused to non-loopback
//! peers.

mod metrics;

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::controller::Knobs;
use crate::error::RunError;
use crate::runtime::ProcessHandle;
use crate::stats::Snapshot;

const PAGE: &str = include_str!("index.html");
/// Snapshots kept for `/history` (one per second).
const HISTORY: usize = 300;
/// Largest request head accepted.
const MAX_HEAD: usize = 16 * 1024;

/// Where and how to serve the dashboard.
#[derive(Clone, Debug)]
pub struct DashboardConfig {
    /// `host:port` to listen on (port 0 picks a free one).
    pub addr: String,
    /// Token required on every request; mandatory off loopback.
    pub token: Option<String>,
}

/// Stages, connectors, clusters and processes of a graph, as the dashboard shows them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GraphInfo {
    /// Graph name.
    pub name: String,
    /// This process' address, when the graph is mapped.
    pub process: Option<String>,
    /// Stages, in graph order.
    pub stages: Vec<StageInfo>,
    /// Connectors.
    pub connectors: Vec<ConnectorInfo>,
    /// Clusters, in partition order.
    pub clusters: Vec<ClusterInfo>,
}

/// One stage of [`GraphInfo`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct StageInfo {
    /// Name.
    pub name: String,
    /// Serial (one persistent instance).
    pub serial: bool,
    /// Index of its cluster.
    pub cluster: usize,
    /// Runs in this process.
    pub local: bool,
}

/// One connector of [`GraphInfo`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct ConnectorInfo {
    /// Emitting stage.
    pub from: String,
    /// Port.
    pub port: String,
    /// Receiving stage.
    pub to: String,
    /// `local`, `decoupled` or `cohort`.
    pub kind: String,
}

/// One cluster of [`GraphInfo`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClusterInfo {
    /// Its stages.
    pub stages: Vec<String>,
    /// The processes it is mapped to (empty when unmapped).
    pub processes: Vec<String>,
}

/// A running dashboard; it stops when the run ends.
pub(crate) struct Dashboard {
    pub(crate) addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Shared {
    handle: ProcessHandle,
    graph: GraphInfo,
    dot: String,
    token: Option<String>,
    history: Mutex<VecDeque<Snapshot>>,
}

/// Binds the listener and starts serving on a thread of its own.
pub(crate) fn serve(
    cfg: &DashboardConfig,
    handle: ProcessHandle,
    graph: GraphInfo,
    dot: String,
) -> Result<Dashboard, RunError> {
    let io = |context: String| move |source| RunError::Io { context, source };
    let listener =
        TcpListener::bind(&cfg.addr).map_err(io(format!("binding dashboard {}", cfg.addr)))?;
    let addr = listener
        .local_addr()
        .map_err(io("dashboard address".into()))?;
    if !addr.ip().is_loopback() && cfg.token.is_none() {
        return Err(RunError::Io {
            context: format!("dashboard on {addr}"),
            source: std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "a dashboard off loopback requires a token",
            ),
        });
    }
    listener
        .set_nonblocking(true)
        .map_err(io("dashboard listener".into()))?;
    let shared = Arc::new(Shared {
        handle,
        graph,
        dot,
        token: cfg.token.clone(),
        history: Mutex::new(VecDeque::new()),
    });
    let thread = std::thread::Builder::new()
        .name("leda-dashboard".into())
        .spawn(move || run(listener, shared))
        .map_err(io("starting the dashboard thread".into()))?;
    Ok(Dashboard {
        addr,
        thread: Some(thread),
    })
}

/// Accepts connections and samples statistics once a second until the run stops.
fn run(listener: TcpListener, shared: Arc<Shared>) {
    let mut prev = shared.handle.snapshot();
    let mut next_sample = Instant::now() + Duration::from_secs(1);
    shared
        .history
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push_back(prev.clone());
    while !shared.handle.is_stopping() {
        match listener.accept() {
            Ok((stream, peer)) => {
                let shared = shared.clone();
                let _ = stream.set_nonblocking(false);
                // One short-lived thread per request: the dashboard sees little traffic,
                // and a slow client must not stall sampling.
                let _ = std::thread::Builder::new()
                    .name("leda-dashboard-conn".into())
                    .spawn(move || {
                        if let Err(e) = handle_connection(stream, peer, &shared) {
                            tracing::debug!(%peer, error = %e, "dashboard connection");
                        }
                    });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!(error = %e, "dashboard accept");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(1);
            let mut snap = shared.handle.snapshot();
            snap.rates_from(&prev);
            let mut h = shared.history.lock().unwrap_or_else(|e| e.into_inner());
            if h.len() == HISTORY {
                h.pop_front();
            }
            h.push_back(snap.clone());
            prev = snap;
        }
    }
}

struct Request {
    method: String,
    path: String,
    query: Vec<(String, String)>,
    bearer: Option<String>,
}

fn read_request(stream: &mut TcpStream) -> Result<Option<Request>, std::io::Error> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                let target = req.path.unwrap_or("/");
                let (path, query) = target.split_once('?').unwrap_or((target, ""));
                let bearer = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("authorization"))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(str::to_owned);
                return Ok(Some(Request {
                    method: req.method.unwrap_or("GET").to_owned(),
                    path: path.to_owned(),
                    query: parse_query(query),
                    bearer,
                }));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            _ => return Ok(None),
        }
    }
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn handle_connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
) -> std::io::Result<()> {
    let Some(req) = read_request(&mut stream)? else {
        return respond(&mut stream, 400, "text/plain", b"bad request\n");
    };
    let q = |k: &str| {
        req.query
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    let token_ok = match &shared.token {
        Some(t) => req.bearer.as_deref() == Some(t.as_str()) || q("token") == Some(t.as_str()),
        None => true,
    };
    if !token_ok {
        return respond(
            &mut stream,
            401,
            "text/plain",
            b"a valid token is required\n",
        );
    }
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/") => respond(
            &mut stream,
            200,
            "text/html; charset=utf-8",
            PAGE.as_bytes(),
        ),
        ("GET", "/stats") => {
            let latest = shared
                .history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .back()
                .cloned();
            let snap = latest.unwrap_or_else(|| shared.handle.snapshot());
            json(&mut stream, &snap)
        }
        ("GET", "/history") => {
            let h: Vec<Snapshot> = shared
                .history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned()
                .collect();
            json(&mut stream, &h)
        }
        ("GET", "/metrics") => {
            let latest = shared
                .history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .back()
                .cloned();
            let snap = latest.unwrap_or_else(|| shared.handle.snapshot());
            let text =
                metrics::prometheus(&snap, shared.graph.process.as_deref().unwrap_or("local"));
            respond(
                &mut stream,
                200,
                "text/plain; version=0.0.4",
                text.as_bytes(),
            )
        }
        ("GET", "/graph") => json(&mut stream, &shared.graph),
        ("GET", "/graph.dot") => {
            respond(&mut stream, 200, "text/vnd.graphviz", shared.dot.as_bytes())
        }
        ("POST", path) if path.starts_with("/control/") => {
            if shared.token.is_none() && !peer.ip().is_loopback() {
                return respond(&mut stream, 403, "text/plain", b"control needs a token\n");
            }
            let n = q("n").and_then(|n| n.parse::<usize>().ok());
            let mut knobs: Knobs<'_> = shared.handle.knobs();
            let result = match (path, n, q("stage")) {
                ("/control/threads", Some(n), _) => {
                    knobs.set_threads(n);
                    Ok(())
                }
                ("/control/maxpar", Some(n), Some(stage)) => {
                    knobs.set_maxpar(stage, n).map_err(|e| e.to_string())
                }
                ("/control/capacity", Some(n), Some(stage)) => {
                    knobs.set_capacity(stage, n).map_err(|e| e.to_string())
                }
                _ => Err("expected n=N (and stage=S for maxpar and capacity)".to_owned()),
            };
            match result {
                Ok(()) => respond(&mut stream, 200, "text/plain", b"ok\n"),
                Err(e) => respond(&mut stream, 400, "text/plain", format!("{e}\n").as_bytes()),
            }
        }
        ("GET" | "POST", _) => respond(&mut stream, 404, "text/plain", b"not found\n"),
        _ => respond(&mut stream, 405, "text/plain", b"method not allowed\n"),
    }
}

fn json<T: Serialize>(stream: &mut TcpStream, v: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    respond(stream, 200, "application/json", &body)
}

fn respond(stream: &mut TcpStream, status: u16, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    stream.flush()
}
