//! The observability endpoint: a small HTTP server per process.
//!
//! | route | what |
//! |---|---|
//! | `GET /` | the dashboard page (self-contained: no external asset) |
//! | `GET /stats` | a [`Sample`]: this process now (rates over the last second), its peers as last sampled |
//! | `GET /history` | the last five minutes of samples, one per second, JSON |
//! | `GET /metrics` | Prometheus text exposition (every process of the sample) |
//! | `GET /graph` | stages, ports, connectors, clusters and processes, JSON ([`GraphInfo`]); DOT with `?format=dot` or `Accept: text/vnd.graphviz` |
//! | `GET /graph.dot` | the graph in Graphviz DOT |
//! | `POST /control/threads?n=N` | resize the worker pool |
//! | `POST /control/maxpar?stage=S&n=N` | set a stage's instance limit |
//! | `POST /control/capacity?stage=S&n=N` | set a stage's queue capacity |
//!
//! Control routes take `process=ADDR` to act on another process of a multi-process
//! run (forwarded by the transport, see
//! [`RemoteLinks::peer_control`]).
//!
//! # Metrics
//!
//! Stable names: `leda_stage_*` (labels `process`, `stage`), `leda_connector_*`
//! (labels `process`, `from`, `port`, `to`, `kind`), `leda_process_*` (label
//! `process`). `process` is the process' address, or `local` for an unmapped graph.
//!
//! # Access
//!
//! It listens on 127.0.0.1 unless told otherwise; any other address requires a token.
//! With a token, every request must carry it (`Authorization: Bearer TOKEN` or
//! `?token=TOKEN`; the page passes on the token it was opened with); without one,
//! control actions are still refused to non-loopback peers.
//!
//! # Multi-process runs
//!
//! When the run has a transport ([`Run::remote`](crate::runtime::Run::remote)), the
//! sampler asks it once a second for the other processes' snapshots
//! ([`RemoteLinks::peer_stats`]): the
//! launcher's dashboard then shows and exports every process of the graph.

mod http;
mod metrics;
mod model;

pub use model::{
    ClusterInfo, ConnectorInfo, Control, GraphInfo, PeerStats, ProcessInfo, Sample, StageInfo,
};

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::RunError;
use crate::runtime::ProcessHandle;
use crate::runtime::executor::RemoteLinks;
use crate::stats::Snapshot;
use http::{Request, json, respond};

const PAGE: &str = include_str!("index.html");
/// Samples kept for `/history` (one per second).
const HISTORY: usize = 300;
/// Sampling period.
const PERIOD: Duration = Duration::from_secs(1);

/// Where and how to serve the dashboard.
#[derive(Clone, Debug)]
pub struct DashboardConfig {
    /// `host:port` to listen on (port 0 picks a free one).
    pub addr: String,
    /// Token required on every request; mandatory off loopback.
    pub token: Option<String>,
}

/// A running dashboard; it stops when the run ends, or when dropped.
pub(crate) struct Dashboard {
    pub(crate) addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Shared {
    handle: ProcessHandle,
    graph: GraphInfo,
    dot: String,
    token: Option<String>,
    links: Option<Arc<dyn RemoteLinks>>,
    history: Mutex<VecDeque<Sample>>,
    stop: Arc<AtomicBool>,
    /// The bound address: the names a browser may use for it (`Host`, `Origin`).
    addr: SocketAddr,
    /// Connections being served.
    conns: std::sync::atomic::AtomicUsize,
}

/// Connections served at once, at most; more are answered 503 and closed.
const MAX_CONNECTIONS: usize = 32;

impl Shared {
    /// `true` if `host` (a `Host` header, or an origin's `host:port`) names this
    /// dashboard: its address, or `localhost` on its port when it is on loopback.
    /// (A page of another site that rebinds its name to 127.0.0.1 sends its own
    /// name.)
    fn is_us(&self, host: &str) -> bool {
        let port = self.addr.port();
        host == self.addr.to_string()
            || (self.addr.ip().is_loopback()
                && [
                    format!("localhost:{port}"),
                    format!("127.0.0.1:{port}"),
                    format!("[::1]:{port}"),
                ]
                .iter()
                .any(|h| h == host))
    }

    /// `true` unless `origin` (an `Origin` or `Referer` value) is another site's.
    fn same_origin(&self, origin: &str) -> bool {
        let rest = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        rest.map(|r| r.split('/').next().unwrap_or(""))
            .is_some_and(|host| self.is_us(host))
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.handle.is_stopping()
    }

    /// This process now (rates from the latest sample) and the peers as last sampled.
    fn latest(&self) -> Sample {
        let mut local = self.handle.snapshot();
        let last = self
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .back()
            .map(|s| {
                for (now, then) in local.stages.iter_mut().zip(&s.local.stages) {
                    now.throughput = then.throughput;
                }
                for (now, then) in local.connectors.iter_mut().zip(&s.local.connectors) {
                    now.throughput = then.throughput;
                }
                s.peers.clone()
            });
        Sample {
            local,
            name: self.graph.this_process().to_owned(),
            peers: last.unwrap_or_default(),
        }
    }
}

/// Binds the listener and starts serving (and sampling) on threads of its own.
pub(crate) fn serve(
    cfg: &DashboardConfig,
    handle: ProcessHandle,
    mut graph: GraphInfo,
    dot: String,
    links: Option<Arc<dyn RemoteLinks>>,
) -> Result<Dashboard, RunError> {
    let io = |context: String| move |source| RunError::Io { context, source };
    let listener =
        TcpListener::bind(&cfg.addr).map_err(io(format!("binding dashboard {}", cfg.addr)))?;
    let addr = listener
        .local_addr()
        .map_err(io("dashboard address".into()))?;
    if let Some(t) = &cfg.token
        && t.trim().len() < MIN_TOKEN
    {
        return Err(RunError::Io {
            context: format!("dashboard on {addr}"),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "a dashboard token needs at least {MIN_TOKEN} characters (an empty one, \
                     from an unset variable, let anyone in)"
                ),
            ),
        });
    }
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
    graph.complete();
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(Shared {
        handle,
        graph,
        dot,
        token: cfg.token.clone(),
        links,
        history: Mutex::new(VecDeque::new()),
        stop: stop.clone(),
        addr,
        conns: std::sync::atomic::AtomicUsize::new(0),
    });
    let s = shared.clone();
    let sampling = std::thread::Builder::new()
        .name("leda-dashboard-sampler".into())
        .spawn(move || {
            let mut sampler = Sampler::default();
            sampler.sample(&s);
            let mut next = Instant::now() + PERIOD;
            while !s.stopping() {
                let now = Instant::now();
                if now >= next {
                    next += PERIOD;
                    sampler.sample(&s);
                } else {
                    std::thread::sleep((next - now).min(Duration::from_millis(50)));
                }
            }
        })
        .map_err(io("starting the dashboard sampler".into()))?;
    let serving = std::thread::Builder::new()
        .name("leda-dashboard".into())
        .spawn(move || accept_loop(listener, shared))
        .map_err(io("starting the dashboard thread".into()))?;
    tracing::info!(%addr, "dashboard listening");
    Ok(Dashboard {
        addr,
        stop,
        threads: vec![sampling, serving],
    })
}

/// Takes one sample a second: this process, and the peers the transport reports,
/// each with rates computed from its own previous snapshot.
#[derive(Default)]
struct Sampler {
    prev_local: Option<Snapshot>,
    prev_peers: HashMap<String, Snapshot>,
}

impl Sampler {
    fn sample(&mut self, shared: &Shared) {
        let mut local = shared.handle.snapshot();
        if let Some(p) = &self.prev_local {
            local.rates_from(p);
        }
        self.prev_local = Some(local.clone());
        let mut peers = shared
            .links
            .as_ref()
            .map(|l| l.peer_stats())
            .unwrap_or_default();
        for p in &mut peers {
            if let Some(prev) = self.prev_peers.get(&p.name) {
                p.snapshot.rates_from(prev);
            }
            self.prev_peers.insert(p.name.clone(), p.snapshot.clone());
        }
        peers.sort_by(|a, b| a.name.cmp(&b.name));
        let sample = Sample {
            local,
            name: shared.graph.this_process().to_owned(),
            peers,
        };
        let mut h = shared.history.lock().unwrap_or_else(|e| e.into_inner());
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(sample);
    }
}

/// Accepts connections until the run stops.
fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stopping() {
        match listener.accept() {
            Ok((mut stream, peer)) => {
                let _ = stream.set_nonblocking(false);
                // One short-lived thread per request (the dashboard sees little
                // traffic, and a slow client must not stall the others), at most
                // MAX_CONNECTIONS at once, each bounded by the request deadline.
                if shared.conns.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    shared.conns.fetch_sub(1, Ordering::SeqCst);
                    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
                    let _ = respond(&mut stream, 503, "text/plain", b"too many connections\n");
                    continue;
                }
                let shared = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("leda-dashboard-conn".into())
                    .spawn(move || {
                        if let Err(e) = handle_connection(stream, peer, &shared) {
                            tracing::debug!(%peer, error = %e, "dashboard connection");
                        }
                        shared.conns.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    tracing::warn!("dashboard: cannot start a connection thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!(error = %e, "dashboard accept");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn handle_connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
) -> std::io::Result<()> {
    let Some(req) = http::read_request(&mut stream)? else {
        return respond(&mut stream, 400, "text/plain", b"bad request\n");
    };
    let token_ok = match &shared.token {
        Some(t) => [req.bearer.as_deref(), req.q("token")]
            .into_iter()
            .flatten()
            .any(|given| same_secret(given, t)),
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
    // A browser always names the host it thinks it talks to: another name is a page
    // that rebound its own name to this address.
    if shared.token.is_none() && req.host.as_deref().is_some_and(|h| !shared.is_us(h)) {
        return respond(&mut stream, 403, "text/plain", b"unknown Host\n");
    }
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/") => respond(
            &mut stream,
            200,
            "text/html; charset=utf-8",
            PAGE.as_bytes(),
        ),
        ("GET", "/stats") => json(&mut stream, &shared.latest()),
        ("GET", "/history") => {
            let h: Vec<Sample> = shared
                .history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned()
                .collect();
            json(&mut stream, &h)
        }
        ("GET", "/metrics") => {
            let text = metrics::prometheus(&shared.latest());
            respond(
                &mut stream,
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                text.as_bytes(),
            )
        }
        ("GET", "/graph") if req.wants_dot || req.q("format") == Some("dot") => {
            respond(&mut stream, 200, "text/vnd.graphviz", shared.dot.as_bytes())
        }
        ("GET", "/graph") => json(&mut stream, &shared.graph),
        ("GET", "/graph.dot") => {
            respond(&mut stream, 200, "text/vnd.graphviz", shared.dot.as_bytes())
        }
        ("POST", path) if path.starts_with("/control/") => {
            if shared.token.is_none() && !peer.ip().is_loopback() {
                return respond(&mut stream, 403, "text/plain", b"control needs a token\n");
            }
            // Without a token, a state-changing request must not come from another
            // site's page (a cross-site POST carries its Origin).
            if shared.token.is_none()
                && req
                    .origin
                    .as_deref()
                    .is_some_and(|o| !shared.same_origin(o))
            {
                return respond(
                    &mut stream,
                    403,
                    "text/plain",
                    b"cross-origin control requests need the token\n",
                );
            }
            match control(shared, path, &req) {
                Ok(()) => respond(&mut stream, 200, "text/plain", b"ok\n"),
                Err((code, e)) => {
                    respond(&mut stream, code, "text/plain", format!("{e}\n").as_bytes())
                }
            }
        }
        ("GET" | "POST", _) => respond(&mut stream, 404, "text/plain", b"not found\n"),
        _ => respond(&mut stream, 405, "text/plain", b"method not allowed\n"),
    }
}

/// Largest queue capacity the dashboard may set.
const MAX_CAPACITY: usize = 1 << 20;

/// The shortest dashboard token taken.
const MIN_TOKEN: usize = 8;

/// Compares a presented token with the expected one in time independent of where
/// they differ.
/// Compares in constant time (for equal lengths): the time a wrong token takes to be
/// refused says nothing about how much of it was right.
fn same_secret(given: &str, expected: &str) -> bool {
    use subtle::ConstantTimeEq;
    given.as_bytes().ct_eq(expected.as_bytes()).into()
}

/// Parses and applies a control request, here or in the named process.
fn control(shared: &Shared, path: &str, req: &Request) -> Result<(), (u16, String)> {
    let n = req.q("n").and_then(|n| n.parse::<usize>().ok());
    // Bounds on every value: a pool of 100,000 threads is not a setting.
    let max = match path {
        "/control/threads" | "/control/maxpar" => crate::controller::max_threads(),
        _ => MAX_CAPACITY,
    };
    if let Some(n) = n
        && !(1..=max).contains(&n)
    {
        return Err((400, format!("n={n} is outside 1..={max}")));
    }
    let action = match (path, n, req.q("stage")) {
        ("/control/threads", Some(n), _) => Control::Threads(n),
        ("/control/maxpar", Some(n), Some(stage)) => Control::Maxpar {
            stage: stage.to_owned(),
            n,
        },
        ("/control/capacity", Some(n), Some(stage)) => Control::Capacity {
            stage: stage.to_owned(),
            n,
        },
        ("/control/threads" | "/control/maxpar" | "/control/capacity", _, _) => {
            return Err((
                400,
                "expected n=N (and stage=S for maxpar and capacity)".to_owned(),
            ));
        }
        _ => return Err((404, format!("no control action {path}"))),
    };
    match req.q("process") {
        Some(p) if p != shared.graph.this_process() => {
            let links = shared
                .links
                .as_ref()
                .ok_or_else(|| (400, format!("no process {p} in this run")))?;
            tracing::info!(process = p, ?action, "dashboard control (forwarded)");
            links.peer_control(p, &action).map_err(|e| (502, e))
        }
        _ => {
            tracing::info!(?action, "dashboard control");
            action.apply(&shared.handle).map_err(|e| (400, e))
        }
    }
}
