//! The daemon: turns a process into a Leda process that waits for deployments and
//! runs the cluster of each, one after another (`leda start --listen HOST:PORT`).
//!
//! ```no_run
//! use clap::Parser;
//! use leda_net::{Daemon, Registry, cli::DaemonArgs};
//! # fn my_stages() -> Registry { Registry::new() }
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     daemon: DaemonArgs,
//! }
//! let config = Cli::parse().daemon.config();
//! let daemon = Daemon::bind(config, my_stages()).expect("bind");
//! leda_core::cli::announce_listening(daemon.local_addr()).expect("stdout");
//! // One deployment after another (`--once`: only one).
//! daemon
//!     .serve(|report| println!("ended: {:?}", report.run.reason))
//!     .expect("serve");
//! ```
//!
//! A deployment goes: the launcher connects (role `Launcher`) and sends `Deploy`; the
//! daemon rebuilds its cluster from its [`Registry`] and validates the graph, refusing
//! with a reason that names the stage if anything cannot be resolved; it then opens
//! (or accepts) the links to the other daemons of the deployment, answers `Ready`, and
//! starts on `Start`. Connections that fail the handshake, send garbage or say nothing
//! are logged and closed; the daemon goes on waiting. A failed deployment leaves the
//! daemon waiting for the next one.
//!
//! A run ends with a `quit` anywhere, the end of the launcher's run, or the loss of a
//! process ([`crate::link`]'s liveness: a daemon also ends the run when it loses its
//! launcher, killed or silent, within the launcher's silence bound, unless the run
//! outlives its launcher: `Run::outlive_launcher`). The daemon then
//! frees the run (its links, worker threads, stages) and waits for the next
//! deployment; a launcher that dies in the middle of a deployment leaves it waiting
//! too: the deployment ends when the launcher's connection does (the deployment steps
//! are bounded by `deploy_timeout` besides).

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use leda_core::runtime::{Run, RunReport};
use tokio::net::TcpListener;

use crate::conn::{Broken, Conn};
use tokio::sync::mpsc;

use crate::auth::Secret;
use crate::deploy::Deployment;
use crate::error::NetError;
use crate::frame::{Frame, Hello, MAX_FRAME, Role, read_frame, write_frame};
use crate::handshake::{self, HANDSHAKE_TIMEOUT};
use crate::link::{ProcessLost, RouteCounts, Transport, TransportCounts};
use crate::registry::Registry;

/// Default daemon port (the original Leda's).
pub const DEFAULT_PORT: u16 = 9999;

/// How long a daemon waits, once a run has ended, for handlers still running before it
/// leaves their threads behind and serves on (`Run::leave_stuck_after`).
pub const LEAVE_STUCK_AFTER: Duration = Duration::from_secs(5);

/// How a daemon listens and runs.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// `host:port` to listen on (default `127.0.0.1:9999`; port 0 picks a free one).
    pub listen: String,
    /// Worker threads (default: what the deployment asks, else one per CPU).
    pub threads: Option<usize>,
    /// Run each deployment under the automatic controller between these thread counts
    /// (`leda_core::controller::Auto`, `leda.start{controller = auto.get(min, max)}`)
    /// instead of a fixed pool.
    pub auto_threads: Option<(usize, usize)>,
    /// Shared secret (default: the user's: `LEDA_SECRET`, `LEDA_SECRET_FILE`, else the
    /// cookie file, see [`crate::auth`]). Listening off loopback needs one configured
    /// here or in the environment, not the cookie alone.
    pub secret: Option<Secret>,
    /// Time a connecting peer has to complete the handshake.
    pub handshake_timeout: Duration,
    /// Time the deployment steps (reading it, meshing with peers, waiting for start)
    /// may take.
    pub deploy_timeout: Duration,
    /// Serve the dashboard of each deployed run here (see `leda_core::dashboard`).
    pub dashboard: Option<leda_core::dashboard::DashboardConfig>,
    /// Default instance limit of parallel stages (`leda.start{maxpar=...}`; default:
    /// the thread count).
    pub maxpar: Option<usize>,
    /// Serve one deployment, then return ([`Daemon::serve`]); by default a daemon
    /// serves deployments one after another.
    pub once: bool,
    /// Speak TLS, with mutual certificates ([`crate::tls`]), on every connection.
    pub tls: Option<crate::tls::TlsConfig>,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            listen: format!("127.0.0.1:{DEFAULT_PORT}"),
            threads: None,
            auto_threads: None,
            secret: None,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            deploy_timeout: Duration::from_secs(30),
            dashboard: None,
            maxpar: None,
            once: false,
            tls: None,
        }
    }
}

/// What a daemon's run ended with.
#[derive(Debug)]
pub struct DaemonReport {
    /// The local run's report.
    pub run: RunReport,
    /// Transport counters of this process.
    pub transport: TransportCounts,
    /// The outcome of each route's events sent from this process.
    pub routes: Vec<RouteCounts>,
    /// Processes lost during the run (the launcher among them if it was lost).
    pub lost: Vec<ProcessLost>,
}

/// A daemon bound to its address, ready to serve deployments one after another.
///
/// Connections are accepted and authenticated from [`Daemon::bind`] on, by a task of
/// the daemon's own runtime; each deployment gets its own transport and run, and
/// everything of it (links, worker threads, stages and their Lua states) is freed
/// when its run ends.
pub struct Daemon {
    rt: tokio::runtime::Runtime,
    addr: SocketAddr,
    config: Arc<Settings>,
    registry: Arc<Registry>,
    /// Authenticated connections, from the accept loop.
    incoming: mpsc::Receiver<Incoming>,
    /// Peer connections that arrived before their deployment.
    parked: Vec<Incoming>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon").field("addr", &self.addr).finish()
    }
}

/// A daemon's configuration with its secret resolved.
struct Settings {
    config: DaemonConfig,
    /// The secret every connection is authenticated with.
    key: Secret,
    /// TLS contexts, when configured.
    tls: Option<crate::tls::Tls>,
}

impl std::ops::Deref for Settings {
    type Target = DaemonConfig;
    fn deref(&self) -> &DaemonConfig {
        &self.config
    }
}

/// A connection that completed the handshake.
struct Incoming {
    stream: Conn,
    hello: Hello,
    addr: SocketAddr,
    /// When it was authenticated.
    since: tokio::time::Instant,
}

pub(crate) fn net_runtime(name: &str) -> Result<tokio::runtime::Runtime, NetError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        // A deployment's wait runs on a blocking thread; one started while the last
        // deployment's was still on its way back to idle would otherwise linger 10 s
        // (tokio's default), so a daemon between runs holds threads it does not use.
        .thread_keep_alive(Duration::from_secs(1))
        .enable_all()
        .build()
        .map_err(|e| NetError::io("starting the network runtime", e))
}

impl Daemon {
    /// Binds the listening socket and starts accepting (and authenticating)
    /// connections. Resolves the secret (see [`DaemonConfig::secret`]); refuses a
    /// non-loopback address without a configured one.
    pub fn bind(config: DaemonConfig, registry: Registry) -> Result<Daemon, NetError> {
        let addrs: Vec<SocketAddr> = config
            .listen
            .to_socket_addrs()
            .map_err(|e| NetError::io(format!("resolving {}", config.listen), e))?
            .collect();
        let mut config = config;
        let configured = match config.secret.take() {
            Some(s) => Some(s),
            None => Secret::from_env()?,
        };
        if configured.is_none() && addrs.iter().any(|a| !a.ip().is_loopback()) {
            return Err(NetError::SecretRequired {
                addr: config.listen.clone(),
            });
        }
        let key = match configured {
            Some(s) => s,
            None => Secret::cookie()?,
        };
        let rt = net_runtime("leda-daemon-net")?;
        let listener = rt
            .block_on(TcpListener::bind(&addrs[..]))
            .map_err(|e| NetError::io(format!("listening on {}", config.listen), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| NetError::io("reading the bound address", e))?;
        tracing::info!(%addr, "leda daemon listening");
        let tls = match &config.tls {
            Some(t) => Some(crate::tls::Tls::load(t)?),
            None => None,
        };
        let config = Arc::new(Settings { config, key, tls });
        let (tx, incoming) = mpsc::channel::<Incoming>(64);
        rt.spawn(accept_loop(listener, config.clone(), tx));
        Ok(Daemon {
            rt,
            addr,
            config,
            registry: Arc::new(registry),
            incoming,
            parked: Vec::new(),
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits for a deployment, runs it, and returns when its run ends (a `quit`
    /// anywhere, the end of the launcher's run, or the loss of a process). A
    /// deployment that fails before it runs (refused, a launcher gone mid-way) is
    /// logged and the daemon waits for the next one.
    pub fn serve_one(&mut self) -> Result<DaemonReport, NetError> {
        let Daemon {
            rt,
            config,
            registry,
            incoming,
            parked,
            ..
        } = self;
        let handle = rt.handle().clone();
        rt.block_on(serve_deployments(
            incoming, parked, config, registry, handle,
        ))
    }

    /// Serves deployments one after another (only one with
    /// [`DaemonConfig::once`]), calling `on_end` with each run's report; returns
    /// only on a fatal error, or after the first run with `once`.
    pub fn serve(mut self, mut on_end: impl FnMut(&DaemonReport)) -> Result<(), NetError> {
        loop {
            let report = self.serve_one()?;
            on_end(&report);
            if self.config.once {
                return Ok(());
            }
        }
    }
}

/// Handshakes in progress at once, at most (each bounded by the handshake timeout):
/// a flood of connections costs a bounded number of tasks, and cannot keep a peer that
/// knows the secret out ([`handshake::Slots`]).
const MAX_HANDSHAKES: usize = 64;

async fn accept_loop(listener: TcpListener, config: Arc<Settings>, tx: mpsc::Sender<Incoming>) {
    let slots = handshake::Slots::new(MAX_HANDSHAKES);
    loop {
        let (tcp, addr) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let config = config.clone();
        let tx = tx.clone();
        slots.spawn(addr, move |slot| async move {
            let peer = addr.to_string();
            let _ = tcp.set_nodelay(true);
            let tls = async {
                match &config.tls {
                    Some(t) => t.accept(tcp, &peer).await,
                    None => Ok(Conn::plain(tcp)),
                }
            };
            let mut stream = match tokio::time::timeout(config.handshake_timeout, tls).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::warn!(peer, error = %e, "connection refused");
                    return;
                }
                Err(_) => {
                    tracing::warn!(peer, "connection refused: no TLS handshake in time");
                    return;
                }
            };
            let accepted =
                handshake::server(&mut stream, &peer, &config.key, config.handshake_timeout).await;
            // Authenticated (or refused): no longer a handshake that may be dropped, unless
            // it was chosen to make room meanwhile.
            if !slot.release() {
                return;
            }
            match accepted {
                Ok(acc) => {
                    let _ = tx
                        .send(Incoming {
                            stream,
                            hello: acc.hello,
                            addr,
                            since: tokio::time::Instant::now(),
                        })
                        .await;
                }
                Err(e) => tracing::warn!(peer, error = %e, "connection refused"),
            }
        });
    }
}

async fn serve_deployments(
    inc_rx: &mut mpsc::Receiver<Incoming>,
    parked: &mut Vec<Incoming>,
    config: &Settings,
    registry: &Registry,
    rt: tokio::runtime::Handle,
) -> Result<DaemonReport, NetError> {
    loop {
        // A peer's connection parked longer than a deployment may take belongs to a
        // deployment that never came here (its launcher died first): the peer gave up
        // on it, and the connection is closed rather than kept.
        prune(parked, config);
        // A launcher that came while the last run ended is served first.
        let kept = parked.iter().position(|p| p.hello.role == Role::Launcher);
        let inc = match kept {
            Some(i) => parked.remove(i),
            None => match tokio::time::timeout(config.deploy_timeout, inc_rx.recv()).await {
                Err(_) => continue,
                Ok(Some(inc)) => inc,
                Ok(None) => {
                    return Err(NetError::io(
                        "accepting connections",
                        std::io::Error::other("the listener stopped"),
                    ));
                }
            },
        };
        match inc.hello.role {
            // A service's client has nothing to do with a deployment.
            Role::Probe | Role::Client => {}
            Role::Peer => {
                park(parked, inc, config);
            }
            Role::Launcher => {
                let from = inc.addr.to_string();
                match deploy(inc, inc_rx, parked, config, registry, &rt).await {
                    Ok(report) => return Ok(report),
                    Err(e) => tracing::warn!(launcher = from, error = %e, "deployment failed"),
                }
            }
        }
    }
}

async fn timed<T>(
    d: Duration,
    peer: &str,
    during: &'static str,
    f: impl std::future::Future<Output = Result<T, NetError>>,
) -> Result<T, NetError> {
    tokio::time::timeout(d, f)
        .await
        .map_err(|_| NetError::Timeout {
            peer: peer.into(),
            during,
            secs: d.as_secs_f64(),
        })?
}

async fn deploy(
    inc: Incoming,
    inc_rx: &mut mpsc::Receiver<Incoming>,
    parked: &mut Vec<Incoming>,
    config: &Settings,
    registry: &Registry,
    rt: &tokio::runtime::Handle,
) -> Result<DaemonReport, NetError> {
    let peer = inc.addr.to_string();
    let mut s = inc.stream;
    let ferr = |source| NetError::Frame {
        peer: peer.clone(),
        source,
    };
    let d = timed(config.deploy_timeout, &peer, "deployment", async {
        match read_frame(&mut s, MAX_FRAME).await.map_err(ferr)? {
            Some(Frame::Deploy(d)) => Ok(d),
            Some(other) => Err(NetError::Protocol {
                peer: peer.clone(),
                reason: format!("expected a deployment, got {}", other.name()),
            }),
            None => Err(NetError::Protocol {
                peer: peer.clone(),
                reason: "closed before the deployment".into(),
            }),
        }
    })
    .await?;
    tracing::info!(graph = %d.graph, me = %d.target, launcher = %d.launcher, "deployment received");
    let graph = match resolve(&d, registry) {
        Ok(g) => g,
        Err(reason) => {
            tracing::warn!(reason, "refusing the deployment");
            let _ = write_frame(&mut s, &Frame::Refused(reason.clone())).await;
            return Err(NetError::Refused {
                daemon: d.target.clone(),
                reason,
            });
        }
    };
    let transport = Transport::for_deployment(&d, &d.target, rt.clone());
    // The launcher says nothing between its deployment and `Start`: its connection
    // ending meanwhile means it gave up or died, and the deployment ends with it —
    // before the peers are dialled, for one that waited in the queue while its launcher
    // went (the peers would wait for this daemon until their deploy timeout, and it
    // for them).
    let meshed = tokio::select! {
        biased;
        gone = launcher_gone(&mut s) => Err(NetError::Protocol {
            peer: peer.clone(),
            reason: gone,
        }),
        r = mesh(&d, &transport, inc_rx, parked, config) => r,
    };
    if let Err(e) = meshed {
        let _ = write_frame(&mut s, &Frame::Refused(e.to_string())).await;
        transport.abandon().await;
        return Err(e);
    }
    write_frame(&mut s, &Frame::Ready).await.map_err(ferr)?;
    let start = timed(config.deploy_timeout, &peer, "start", async {
        match read_frame(&mut s, MAX_FRAME).await.map_err(ferr)? {
            Some(Frame::Start) => Ok(()),
            other => Err(NetError::Protocol {
                peer: peer.clone(),
                reason: format!(
                    "expected start, got {}",
                    other.as_ref().map_or("end of stream", Frame::name)
                ),
            }),
        }
    })
    .await;
    if let Err(e) = start {
        transport.abandon().await;
        return Err(e);
    }
    transport.attach(&d.launcher, s);
    transport.tell_losses(&d.launcher);
    // A handler that nothing interrupts (a loop in C, a Lua finalizer) must not keep the
    // daemon from its next deployment.
    let mut run = Run::default()
        .process(d.target.clone())
        .remote(transport.clone())
        .leave_stuck_after(LEAVE_STUCK_AFTER);
    // What a deployment asks is bounded as the commands' `--threads` is (a launcher
    // picked a daemon's pool size: thousands of threads).
    let asked = d.threads.map(|n| {
        let max = leda_core::cli::max_threads();
        if n > max {
            tracing::warn!(
                asked = n,
                max,
                "the deployment asks for more threads than the bound"
            );
        }
        n.min(max)
    });
    if let Some(n) = config.threads.or(asked) {
        run = run.threads(n);
    }
    if let Some(n) = config.maxpar {
        run = run.maxpar(n);
    }
    if let Some((min, max)) = config.auto_threads {
        run = run.controller(leda_core::controller::Auto::new(min, max));
    }
    if let Some(dash) = &config.dashboard {
        run = run.dashboard(dash.addr.clone());
        if let Some(t) = &dash.token {
            run = run.dashboard_token(t.clone());
        }
    }
    let running = match graph.start(run) {
        Ok(r) => r,
        Err(e) => {
            transport.close(Some(Vec::new())).await;
            return Err(e.into());
        }
    };
    let handle = running.handle();
    transport.set_handle(handle.clone());
    tracing::info!(graph = %d.graph, me = %d.target, "running");
    // While running, other deployments are refused; peers of other runs are dropped.
    // Once the run is ending, they are kept for after it: a launcher whose run just
    // ended here (its `wait` returned) and that launches again at once was refused
    // while this side still closed (one launch in five, back to back), and so were
    // the peers of that next deployment.
    let mut run = tokio::task::spawn_blocking(move || running.wait());
    let report = loop {
        tokio::select! {
            r = &mut run => break r,
            Some(inc) = inc_rx.recv() => match inc.hello.role {
                Role::Launcher | Role::Peer if handle.is_stopping() && !config.once => {
                    park(parked, inc, config)
                }
                Role::Launcher => {
                    let busy = format!("{} is running another deployment", d.target);
                    refuse(inc.stream, busy, config.handshake_timeout);
                }
                _ => {}
            }
        }
    };
    let report =
        report.map_err(|e| NetError::io("waiting for the run", std::io::Error::other(e)))??;
    let quit = report
        .quit
        .as_ref()
        .map(|e| e.args().to_vec())
        .unwrap_or_default();
    transport.close(Some(quit)).await;
    let lost = transport.lost();
    match lost.first() {
        Some(l) => tracing::warn!(reason = ?report.reason, "run ended: {l}"),
        None => tracing::info!(reason = ?report.reason, "run ended"),
    }
    Ok(DaemonReport {
        run: report,
        transport: transport.counts(),
        routes: transport.route_counts(),
        lost,
    })
}

/// Rebuilds and validates the cluster; the error names what could not be resolved.
fn resolve(d: &Deployment, registry: &Registry) -> Result<leda_core::graph::Graph, String> {
    let g = d.build_graph(registry)?;
    g.verify().map_err(|e| e.to_string())?;
    Ok(g)
}

/// Peer connections parked at most (the oldest go first).
const MAX_PARKED: usize = 64;

/// Keeps a peer's connection that arrived before its deployment.
fn park(parked: &mut Vec<Incoming>, inc: Incoming, config: &Settings) {
    parked.push(inc);
    prune(parked, config);
}

/// Closes the parked connections older than a deployment may take (their deployment
/// never came here: its launcher died first, and the peer gave up on it), and the
/// oldest beyond [`MAX_PARKED`].
fn prune(parked: &mut Vec<Incoming>, config: &Settings) {
    parked.retain(|p| p.since.elapsed() < config.deploy_timeout);
    let extra = parked.len().saturating_sub(MAX_PARKED);
    parked.drain(..extra);
}

/// At most this many refused launchers (in this process, all daemons together) are
/// read to their end at a time; beyond, the refusal is written and the connection
/// closed (a client with the secret could otherwise hold a socket and a buffer per
/// connection it opens, for `limit` each).
const MAX_REFUSING: usize = 16;

/// Tells a launcher this daemon is busy, without holding up the deployment at hand:
/// the refusal is written, and what the launcher still sends (its deployment, up to
/// megabytes) is read and dropped until it closes, for at most `limit` — closing with
/// unread data would reset the connection, and the launcher would read "connection
/// reset" instead of the reason (the launcher also looks for the reason after a failed
/// write: the refusal reaches it past `limit` too, unless the reset came first).
fn refuse(mut s: Conn, reason: String, limit: Duration) {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    static REFUSING: AtomicUsize = AtomicUsize::new(0);
    /// Counts one refusal in progress, however its task ends (dropped with the runtime).
    struct Refusing;
    impl Drop for Refusing {
        fn drop(&mut self) {
            REFUSING.fetch_sub(1, SeqCst);
        }
    }
    let drain = REFUSING.fetch_add(1, SeqCst) < MAX_REFUSING;
    let counted = Refusing;
    tokio::spawn(async move {
        let _counted = counted;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = tokio::time::timeout(limit, async {
            write_frame(&mut s, &Frame::Refused(reason)).await.ok()?;
            s.shutdown().await.ok()?;
            let mut sink = vec![0u8; 16 * 1024];
            while drain && s.read(&mut sink).await.ok()? > 0 {}
            Some(())
        })
        .await;
    });
}

/// Completes when the launcher's connection ends or says something while it should
/// wait for `Ready`: why, for the log.
async fn launcher_gone(s: &mut Conn) -> String {
    match s.silence_broken().await {
        Broken::Closed => "the launcher closed its connection during the deployment".into(),
        Broken::Spoke => "the launcher sent something before this daemon was ready".into(),
        Broken::Failed(e) => {
            format!("the launcher's connection failed during the deployment: {e}")
        }
    }
}

/// Opens the links to the other daemons: the lower address dials the higher one.
/// Bounded by `deploy_timeout`; the error names the peers that did not connect.
async fn mesh(
    d: &Deployment,
    transport: &Arc<Transport>,
    inc_rx: &mut mpsc::Receiver<Incoming>,
    parked: &mut Vec<Incoming>,
    config: &Settings,
) -> Result<(), NetError> {
    let me = d.target.as_str();
    let peers: Vec<String> = d
        .processes()
        .filter(|p| *p != me && *p != d.launcher)
        .map(str::to_owned)
        .collect();
    let mut waiting: Vec<String> = Vec::new();
    for p in &peers {
        if me < p.as_str() {
            let s = handshake::connect(
                p,
                Role::Peer,
                me,
                d.id,
                &config.key,
                config.tls.as_ref(),
                config.handshake_timeout,
            )
            .await?;
            transport.attach(p, s);
        } else {
            waiting.push(p.clone());
        }
    }
    let take = |inc: Incoming, waiting: &mut Vec<String>| -> Option<Incoming> {
        if inc.hello.role == Role::Peer
            && inc.hello.deployment == d.id
            && let Some(i) = waiting.iter().position(|w| *w == inc.hello.from)
        {
            let from = waiting.swap_remove(i);
            transport.attach(&from, inc.stream);
            None
        } else {
            Some(inc)
        }
    };
    let old = std::mem::take(parked);
    for inc in old {
        match take(inc, &mut waiting) {
            Some(back) if back.hello.role == Role::Peer => park(parked, back, config),
            // (Another launcher kept while the last run ended.)
            Some(back) if back.hello.role == Role::Launcher => refuse(
                back.stream,
                format!("{me} is being deployed"),
                config.handshake_timeout,
            ),
            _ => {}
        }
    }
    let deadline = tokio::time::Instant::now() + config.deploy_timeout;
    while !waiting.is_empty() {
        let Ok(Some(inc)) = tokio::time::timeout_at(deadline, inc_rx.recv()).await else {
            break;
        };
        if inc.hello.role == Role::Launcher {
            refuse(
                inc.stream,
                format!("{me} is being deployed"),
                config.handshake_timeout,
            );
            continue;
        }
        if let Some(back) = take(inc, &mut waiting)
            && back.hello.role == Role::Peer
        {
            park(parked, back, config);
        }
    }
    if waiting.is_empty() {
        Ok(())
    } else {
        Err(NetError::Timeout {
            peer: waiting.join(", "),
            during: "connecting the peers",
            secs: config.deploy_timeout.as_secs_f64(),
        })
    }
}

/// Makes the process `cmd` starts end (SIGKILL) when the thread that starts it ends,
/// whatever the way: for daemons a launcher starts for one run (`--once`), which wait
/// for a deployment that a launcher killed before deploying never sends (review
/// finding, 2026-11-27: such daemons outlived their launcher for good). Linux's
/// `PR_SET_PDEATHSIG` follows the starting *thread*: start them from a thread that
/// lives as long as they should. A no-op elsewhere.
pub fn end_with_parent(cmd: &mut std::process::Command) -> &mut std::process::Command {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (prctl, getppid, raise).
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have gone before the call above took effect.
                if libc::getppid() != parent {
                    libc::raise(libc::SIGKILL);
                }
                Ok(())
            });
        }
    }
    cmd
}
