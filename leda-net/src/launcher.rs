//! The launcher: deploys a mapped graph to its daemons, then runs its own cluster.
//!
//! ```no_run
//! use leda_core::prelude::*;
//! use leda_net::Launcher;
//! # fn graph() -> Graph { Graph::new("g") }
//! let g = graph(); // part(...) and map([...]) done, remote stages have a kind
//! let report = Launcher::new("127.0.0.1:7001")
//!     .until_idle()
//!     .run(&g, Run::default())
//!     .expect("run");
//! println!("{:?}", report.run.reason);
//! ```
//!
//! Steps: build one [`Deployment`] per daemon (the launcher's cluster is the one its
//! address is mapped to; initial events pushed on remote stages travel with the
//! deployment of the process that runs them); connect to every daemon and send it; wait
//! until every daemon answers `Ready` (any refusal aborts everything and is returned,
//! naming the daemon and its reason); send `Start`; start the local cluster. The
//! connection to each daemon then carries the events between the two.
//!
//! # End of the run
//!
//! `quit` anywhere ends every process: the process that ends sends `Quit` to all its
//! peers. With [`Launcher::until_idle`], the launcher also detects global idleness:
//! it polls every daemon's status (quiescent, events accepted so far) and ends the run
//! when two consecutive rounds find every process quiescent with unchanged counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leda_core::event::Event;
use leda_core::graph::Graph;
use leda_core::runtime::{ProcessHandle, Run, RunReport, Running};
use tokio::net::TcpStream;

use crate::auth::Secret;
use crate::daemon::net_runtime;
use crate::deploy::Deployment;
use crate::error::NetError;
use crate::frame::{Frame, MAX_FRAME, Role, read_frame, write_frame};
use crate::handshake;
use crate::link::{Transport, TransportCounts};

/// Period of the global idle check.
const IDLE_POLL: Duration = Duration::from_millis(5);

/// Deploys graphs from this process.
pub struct Launcher {
    addr: String,
    secret: Option<Secret>,
    threads: Option<usize>,
    until_idle: bool,
    timeout: Duration,
}

impl std::fmt::Debug for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launcher")
            .field("addr", &self.addr)
            .finish()
    }
}

/// What a launched run ended with.
#[derive(Debug)]
pub struct LaunchReport {
    /// The local run's report.
    pub run: RunReport,
    /// Transport counters of this process.
    pub transport: TransportCounts,
    /// `true` if the run ended because every process was idle.
    pub idle: bool,
}

/// A launched run.
pub struct Launched {
    rt: tokio::runtime::Runtime,
    running: Running,
    transport: Arc<Transport>,
    idle: Arc<AtomicBool>,
}

impl std::fmt::Debug for Launched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launched")
            .field("transport", &self.transport)
            .finish()
    }
}

impl Launched {
    /// A handle into the local process.
    pub fn handle(&self) -> ProcessHandle {
        self.running.handle()
    }

    /// The address of the local dashboard, if the run asked for one (it shows every
    /// process of the graph).
    pub fn dashboard_addr(&self) -> Option<std::net::SocketAddr> {
        self.running.dashboard_addr()
    }

    /// Transport counters now.
    pub fn transport(&self) -> TransportCounts {
        self.transport.counts()
    }

    /// Waits for the run to end, tells every peer, closes the links.
    pub fn wait(self) -> Result<LaunchReport, NetError> {
        let Launched {
            rt,
            running,
            transport,
            idle,
        } = self;
        let run = running.wait();
        let quit = run
            .as_ref()
            .ok()
            .and_then(|r| r.quit.as_ref())
            .map(|e| e.args().to_vec())
            .unwrap_or_default();
        rt.block_on(transport.close(Some(quit)));
        Ok(LaunchReport {
            run: run?,
            transport: transport.counts(),
            idle: idle.load(Ordering::SeqCst),
        })
    }
}

impl Launcher {
    /// A launcher whose process is `addr` in the mapping (an identity: the launcher
    /// dials every daemon and does not listen).
    pub fn new(addr: impl Into<String>) -> Launcher {
        Launcher {
            addr: addr.into(),
            secret: Secret::from_env(),
            threads: None,
            until_idle: false,
            timeout: Duration::from_secs(30),
        }
    }

    /// The shared secret to authenticate with (default: `LEDA_SECRET`).
    pub fn secret(mut self, s: Secret) -> Self {
        self.secret = Some(s);
        self
    }

    /// Worker threads asked of daemons that do not set their own.
    pub fn daemon_threads(mut self, n: usize) -> Self {
        self.threads = Some(n.max(1));
        self
    }

    /// End the run when every process is idle (see the module docs).
    pub fn until_idle(mut self) -> Self {
        self.until_idle = true;
        self
    }

    /// Limit for connecting to daemons and for their answers (default 30 s).
    pub fn deploy_timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// Deploys `graph` and runs the local cluster until the run ends everywhere.
    pub fn run(&self, graph: &Graph, run: Run) -> Result<LaunchReport, NetError> {
        self.start(graph, run)?.wait()
    }

    /// Deploys `graph` and starts the local cluster.
    pub fn start(&self, graph: &Graph, run: Run) -> Result<Launched, NetError> {
        let mut id = [0u8; 8];
        getrandom::fill(&mut id)
            .map_err(|e| NetError::io("drawing an id", std::io::Error::other(e.to_string())))?;
        let id = u64::from_le_bytes(id);
        let base = Deployment::from_graph(graph, &self.addr, id, self.threads)
            .map_err(NetError::Deploy)?;
        let mine = base
            .cluster_of_process(&self.addr)
            .ok_or_else(|| NetError::Deploy(format!("{} runs no cluster", self.addr)))?;
        let daemons: Vec<String> = base
            .processes()
            .filter(|p| *p != self.addr)
            .map(str::to_owned)
            .collect();
        let mut per: Vec<Deployment> = daemons
            .iter()
            .map(|a| {
                let mut d = base.clone();
                d.target = a.clone();
                d
            })
            .collect();
        // Initial events of remote stages go with their process' deployment
        // (round-robin over replicas).
        let mut taken: Vec<(usize, Vec<Event>)> = Vec::new();
        for (si, s) in graph.stages().iter().enumerate() {
            let Some(c) = base
                .clusters
                .iter()
                .position(|c| c.iter().any(|n| n == s.name()))
            else {
                continue;
            };
            if c == mine {
                continue;
            }
            let evs = s.take_pushed();
            let procs = &base.mapping[c];
            for (k, ev) in evs.iter().enumerate() {
                let addr = &procs[k % procs.len()];
                if let Some(d) = per.iter_mut().find(|d| &d.target == addr) {
                    d.stages[si].pushed.push(ev.args().to_vec());
                }
            }
            taken.push((si, evs));
        }
        let restore = || {
            for (si, evs) in &taken {
                for ev in evs {
                    graph.stages()[*si].push(ev.clone_args());
                }
            }
        };
        let rt = net_runtime("leda-launcher-net")?;
        let streams = match rt.block_on(self.deploy_all(&per)) {
            Ok(s) => s,
            Err(e) => {
                restore();
                return Err(e);
            }
        };
        let transport = Transport::new(&self.addr, base.routes(), rt.handle().clone());
        let started = rt.block_on(async {
            for (addr, mut s) in streams {
                write_frame(&mut s, &Frame::Start)
                    .await
                    .map_err(|source| NetError::Frame {
                        peer: addr.clone(),
                        source,
                    })?;
                transport.attach(&addr, s);
            }
            Ok::<_, NetError>(())
        });
        if let Err(e) = started {
            rt.block_on(transport.close(Some(Vec::new())));
            return Err(e);
        }
        let running = match graph.start(run.process(self.addr.clone()).remote(transport.clone())) {
            Ok(r) => r,
            Err(e) => {
                rt.block_on(transport.close(Some(Vec::new())));
                return Err(e.into());
            }
        };
        transport.set_handle(running.handle());
        let idle = Arc::new(AtomicBool::new(false));
        if self.until_idle {
            rt.spawn(idle_watch(
                transport.clone(),
                running.handle(),
                idle.clone(),
            ));
        }
        Ok(Launched {
            rt,
            running,
            transport,
            idle,
        })
    }

    /// Sends every deployment, then collects every answer.
    async fn deploy_all(&self, per: &[Deployment]) -> Result<Vec<(String, TcpStream)>, NetError> {
        let mut streams = Vec::new();
        for d in per {
            let mut s = handshake::connect(
                &d.target,
                Role::Launcher,
                &self.addr,
                d.id,
                self.secret.as_ref(),
                self.timeout,
            )
            .await?;
            write_frame(&mut s, &Frame::Deploy(Box::new(d.clone())))
                .await
                .map_err(|source| NetError::Frame {
                    peer: d.target.clone(),
                    source,
                })?;
            streams.push((d.target.clone(), s));
        }
        for (addr, s) in streams.iter_mut() {
            let answer = tokio::time::timeout(self.timeout, read_frame(s, MAX_FRAME))
                .await
                .map_err(|_| NetError::Timeout {
                    peer: addr.clone(),
                    during: "deployment answer",
                    secs: self.timeout.as_secs_f64(),
                })?
                .map_err(|source| NetError::Frame {
                    peer: addr.clone(),
                    source,
                })?;
            match answer {
                Some(Frame::Ready) => {}
                Some(Frame::Refused(reason)) => {
                    return Err(NetError::Refused {
                        daemon: addr.clone(),
                        reason,
                    });
                }
                other => {
                    return Err(NetError::Protocol {
                        peer: addr.clone(),
                        reason: format!(
                            "expected ready, got {}",
                            other.as_ref().map_or("end of stream", Frame::name)
                        ),
                    });
                }
            }
        }
        Ok(streams)
    }
}

/// Ends the run when every process is quiescent in two consecutive rounds with the
/// same accepted-event counters (nothing moved in between).
async fn idle_watch(t: Arc<Transport>, h: ProcessHandle, idle: Arc<AtomicBool>) {
    let mut prev: Option<Vec<u64>> = None;
    let mut round = 0u64;
    loop {
        tokio::time::sleep(IDLE_POLL).await;
        round += 1;
        let links = t.links();
        for l in &links {
            l.send_frame(Frame::StatusReq(round));
        }
        let mut all = h.is_quiescent() && t.no_pending_inbound();
        let mut counts = vec![t.counts().accepted];
        for l in &links {
            match l.status(round, Duration::from_secs(2)).await {
                Some(s) => {
                    all &= s.quiescent;
                    counts.push(s.accepted);
                }
                // A process that died or does not answer does not hold the run.
                None => counts.push(u64::MAX),
            }
        }
        all &= h.is_quiescent() && t.no_pending_inbound();
        counts[0] = t.counts().accepted.max(counts[0]);
        if all && prev.as_ref() == Some(&counts) {
            idle.store(true, Ordering::SeqCst);
            h.quit(Event::new());
            return;
        }
        prev = if all { Some(counts) } else { None };
    }
}
