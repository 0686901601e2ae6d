//! The gate stage (`gate<i>`): node `i`'s door for clients in other processes.
//!
//! It owns the node's client listener and speaks the client protocol ([`crate::proto`]):
//! every connection is authenticated (leda-net's handshake, role `Client`), opens one session
//! with a lease, and has its requests turned into the front's client events
//! (`("acquire", id, lock, try)`, `("release", id, lock)`, `("cancel", id, lock)`); the
//! front's replies (port `reply` of `front<i>`) come back on the gate's input and go to the
//! session that asked. A client can only send what [`Request`] can say, so nothing it sends
//! reaches the front as a node's reply, and the gate's input is wired from the front and the
//! epoch stage only.
//!
//! Sessions and leases: a session lives while the gate hears from it within its TTL; when the
//! TTL passes in silence or the connection closes, the gate cancels every request of the
//! session (the front turns the cancel of a granted lock into its release), tells a client
//! still connected [`Response::Expired`] for each lock it held, writes one audit line per
//! such lock (`{"kind":"expired","node":i,"client":NAME,"lock":L,"fence":F,"at_ns":T,
//! "why":"ttl"|"closed"|"not reading its answers"}`) when an audit file is set, and closes
//! the connection. A client that does not read: once `DIRECT_MAX` of the gate's own
//! answers wait to be written, the session stops reading it, and ends when an answer
//! waits a TTL (bounded memory per session).
//!
//! A refused release (of a request still waiting, or released already) answers the
//! client with an error and leaves the request as it was: its grant, or the answer to
//! the first release, still comes.
//!
//! Fences leave the gate as `epoch << 40 | fence`. With an epoch stage wired
//! ([`crate::epoch`]), requests wait until the group's epoch is agreed and each grant's fence
//! comes from the epoch stages' majority register (port `fence`, answered `("fenced", id, v)`);
//! without one the epoch is 0 and fences are the algorithm's own.
//!
//! Network threads: the listener and the sessions run on a small tokio runtime of the gate's
//! own (started by the stage's first event), which hands requests to the graph with
//! `Ctx::send`; a full front queue is answered with an error, never dropped.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use leda_core::prelude::*;
use leda_net::Secret;
use leda_net::conn::Conn;
use leda_net::frame::Role;
use leda_net::handshake::{self, HANDSHAKE_TIMEOUT};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::proto::{
    self, MAX_LOCK_NAME, MAX_REQUESTS, MAX_TTL_MS, MIN_TTL_MS, Request, Response, monotonic_ns,
};

/// Most authenticated client connections a gate keeps open at once; further ones are
/// closed once authenticated. Handshakes in progress are bounded apart
/// (`MAX_HANDSHAKES`), so connections that never authenticate cannot use these up.
pub const MAX_SESSIONS: usize = 1024;

/// Handshakes in progress on the client port, at most (see `leda_net::handshake::Slots`).
const MAX_HANDSHAKES: usize = 64;

/// Answers the gate gives itself (`Alive`, refusals) that may wait for a session's
/// writer: past them the session stops reading its client, so one that sends without
/// reading costs bounded memory (the front's answers are bounded by `MAX_REQUESTS`).
const DIRECT_MAX: usize = 64;

/// What a session's writer sends: an answer, and for one the gate gave itself, its
/// place among the [`DIRECT_MAX`].
type Out = (Response, Option<tokio::sync::OwnedSemaphorePermit>);

/// Fences carry the epoch in their bits from this one up.
pub const EPOCH_SHIFT: u32 = 40;

/// What a gate needs from its own host: the bound listener, the client secret, the audit
/// file. A daemon's registry supplies them, so nothing of it travels in the deployment.
#[derive(Debug)]
pub struct GateLocal {
    /// The client listener (taken by the stage when it starts).
    pub listener: Mutex<Option<std::net::TcpListener>>,
    /// The secret clients must prove.
    pub secret: Secret,
    /// Where expiries are logged, one JSON line each.
    pub audit: Option<PathBuf>,
}

#[derive(Debug)]
struct Held {
    id: i64,
    lock: String,
    fence: Option<u64>,
}

#[derive(Debug)]
struct Session {
    name: String,
    tx: mpsc::UnboundedSender<Out>,
    reqs: HashMap<u64, Held>,
}

impl Session {
    /// Queues `resp` for the client (an answer not among the [`DIRECT_MAX`]); a session
    /// whose writer ended drops it, as its end reports the session's requests.
    fn send(&self, resp: Response) {
        let _ = self.tx.send((resp, None));
    }
}

#[derive(Debug, Default)]
struct State {
    /// `None` until the epoch is agreed (with an epoch stage).
    epoch: Option<u64>,
    /// Fences come from the epoch stage's majority register (with an epoch stage).
    keeper: bool,
    /// Client events waiting for the epoch.
    early: Vec<Event>,
    sessions: HashMap<u64, Session>,
    /// Front ids (negative) → (session, req).
    routes: HashMap<i64, (u64, u64)>,
    next_session: u64,
    next_id: i64,
}

struct Gate {
    node: usize,
    local: Arc<GateLocal>,
    state: Arc<Mutex<State>>,
    audit: Option<Arc<Mutex<std::fs::File>>>,
    started: bool,
}

/// The registry kind of gate stages.
pub const GATE_KIND: &str = "lock.gate";

/// A gate stage for node `node` (ports: `front`, to `front<node>`). With its attribute
/// `epoch` set ([`crate::epoch::attach_epochs`]) it waits for the epoch stage's
/// `("epoch", e)` before passing requests on. `local: None` builds the stand-in for a node
/// that runs in another process (its daemon rebuilds it with its own listener).
pub fn gate_stage(node: usize, local: Option<Arc<GateLocal>>) -> Stage {
    Stage::stateful(
        format!("gate{node}"),
        move |a: &Attrs| -> Result<Gate, BoxError> {
            let local = local
                .clone()
                .ok_or_else(|| format!("gate{node} runs in its own node's process"))?;
            let epoch = a.get_as::<Option<bool>>("epoch")?.unwrap_or(false);
            let audit = match &local.audit {
                None => None,
                Some(p) => Some(Arc::new(Mutex::new(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(p)
                        .map_err(|e| format!("audit file {}: {e}", p.display()))?,
                ))),
            };
            Ok(Gate {
                node,
                local,
                state: Arc::new(Mutex::new(State {
                    epoch: (!epoch).then_some(0),
                    keeper: epoch,
                    next_id: -1,
                    ..State::default()
                })),
                audit,
                started: false,
            })
        },
        |g: &mut Gate, ev: Event, ctx: &mut Ctx| g.handle(ev, ctx),
    )
    .fail_stop()
    .kind(GATE_KIND)
    .attr("node", node as i64)
    .autostart("start")
}

impl Gate {
    fn handle(&mut self, ev: Event, ctx: &mut Ctx) -> HandlerResult {
        let tag: String = ev.get(0)?;
        match tag.as_str() {
            "start" => self.start(ctx),
            "epoch" => {
                let e: u64 = ev.get(1)?;
                let early = {
                    let mut st = lock(&self.state);
                    st.epoch = Some(e);
                    std::mem::take(&mut st.early)
                };
                tracing::info!(node = self.node, epoch = e, "epoch agreed: serving clients");
                for ev in early {
                    self.forward(ev, ctx);
                }
                Ok(())
            }
            _ => self.reply(&tag, &ev, ctx),
        }
    }

    fn forward(&self, ev: Event, ctx: &mut Ctx) {
        forward(&self.state, ev, ctx);
    }

    fn start(&mut self, ctx: &mut Ctx) -> HandlerResult {
        if std::mem::replace(&mut self.started, true) {
            return Ok(());
        }
        let listener = lock(&self.local.listener)
            .take()
            .ok_or("gate: no client listener (taken by an earlier instance)")?;
        listener.set_nonblocking(true)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("gate{}", self.node))
            .enable_all()
            .build()?;
        let net = Net {
            node: self.node,
            local: self.local.clone(),
            state: self.state.clone(),
            audit: self.audit.clone(),
            open: Arc::default(),
        };
        let ctx = ctx.clone();
        std::thread::Builder::new()
            .name(format!("gate{}", self.node))
            .spawn(move || rt.block_on(net.accept(listener, ctx)))?;
        Ok(())
    }

    /// A front reply: to the session that asked.
    fn reply(&self, tag: &str, ev: &Event, ctx: &mut Ctx) -> HandlerResult {
        let id: i64 = ev.get(1)?;
        let mut st = lock(&self.state);
        let epoch = st.epoch.unwrap_or(0);
        let Some(&(sid, req)) = st.routes.get(&id) else {
            return Ok(());
        };
        if !st.sessions.contains_key(&sid) {
            // The session is gone (expired or closed) and the front has its cancel: forget
            // the route once the front is done with the request.
            if !matches!(tag, "granted" | "fenced" | "not-held") {
                st.routes.remove(&id);
            }
            return Ok(());
        }
        if tag == "granted" && st.keeper {
            // The fence comes from the majority register ([`crate::epoch`]); the client
            // learns of its grant once a majority stored it.
            let name: String = ev.get(2)?;
            drop(st);
            if let Err(e) = ctx.send("fence", ("fence", id, name.as_str())) {
                // No fence, no grant: give the lock back and tell the client.
                ctx.send("front", ("cancel", id, name.as_str()))?;
                if let Some(s) = lock(&self.state).sessions.get(&sid) {
                    let message = format!("no fence for the grant: {e}");
                    s.send(Response::Error {
                        req: Some(req),
                        message,
                    });
                }
            }
            return Ok(());
        }
        let resp = match tag {
            "granted" | "fenced" => {
                let raw: u64 = ev.get(if tag == "fenced" { 2 } else { 3 })?;
                let fence = (epoch << EPOCH_SHIFT) | raw;
                if let Some(h) = st.sessions.get_mut(&sid).and_then(|s| s.reqs.get_mut(&req)) {
                    h.fence = Some(fence);
                }
                Response::Granted { req, fence }
            }
            "would-block" => Response::WouldBlock { req },
            "cancelled" => Response::Cancelled { req },
            "released" => Response::Released { req },
            "error" | "not-held" => Response::Error {
                req: Some(req),
                message: ev.get(3)?,
            },
            other => return Err(format!("gate: unknown reply {other:?}").into()),
        };
        // The request ends with its answer, except a grant (the hold goes on) and a
        // refused release (the request still waits, or its first release is under
        // way: its grant or `released` comes later and must find the route).
        if !matches!(tag, "granted" | "fenced" | "not-held") {
            st.routes.remove(&id);
            if let Some(s) = st.sessions.get_mut(&sid) {
                s.reqs.remove(&req);
            }
        }
        if let Some(s) = st.sessions.get(&sid) {
            s.send(resp);
        }
        Ok(())
    }
}

/// One of the gate's open sessions, counted until dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Passes a client event to the front, or keeps it until the epoch is known. A refusal
/// (the front's queue is full) is answered to the client.
fn forward(state: &Mutex<State>, ev: Event, ctx: &mut Ctx) {
    {
        let mut st = lock(state);
        if st.epoch.is_none() {
            st.early.push(ev);
            return;
        }
    }
    let id: i64 = ev.get(1).unwrap_or(0);
    let acquire = ev.get::<String>(0).is_ok_and(|t| t == "acquire");
    if let Err(e) = ctx.send("front", ev) {
        let mut st = lock(state);
        let Some(&(sid, req)) = st.routes.get(&id) else {
            return;
        };
        if acquire {
            // Nothing was queued: the request is over.
            st.routes.remove(&id);
            if let Some(s) = st.sessions.get_mut(&sid) {
                s.reqs.remove(&req);
            }
        }
        // A refused release or cancel leaves the hold as it was: the client may ask again,
        // and the session's end withdraws it.
        if let Some(s) = st.sessions.get(&sid) {
            let message = format!("the node is overloaded: {e}");
            s.send(Response::Error {
                req: Some(req),
                message,
            });
        }
    }
}

/// The gate's network side.
#[derive(Clone)]
struct Net {
    node: usize,
    local: Arc<GateLocal>,
    state: Arc<Mutex<State>>,
    audit: Option<Arc<Mutex<std::fs::File>>>,
    /// Open client connections.
    open: Arc<AtomicUsize>,
}

impl Net {
    async fn accept(self, listener: std::net::TcpListener, ctx: Ctx) {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "gate: cannot use the client listener");
                return;
            }
        };
        let handshakes = handshake::Slots::new(MAX_HANDSHAKES);
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "gate: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // Handshakes in progress are bounded apart from sessions, the oldest dropped
            // for a new one: silent connections cannot keep clients out.
            let _ = tcp.set_nodelay(true);
            let net = self.clone();
            let ctx = ctx.clone();
            handshakes.spawn(&peer.to_string(), move |slot| async move {
                if let Err(e) = net.session(tcp, peer.to_string(), slot, ctx).await {
                    tracing::info!(%peer, error = %e, "gate: client session ended");
                }
            });
        }
    }

    async fn session(
        self,
        tcp: TcpStream,
        peer: String,
        slot: handshake::Slot,
        mut ctx: Ctx,
    ) -> Result<(), BoxError> {
        let mut conn = Conn::Plain(tcp);
        let hello = handshake::server(&mut conn, &peer, &self.local.secret, HANDSHAKE_TIMEOUT)
            .await?
            .hello;
        if !slot.release() {
            return Err("handshake dropped for a newer connection".into());
        }
        // Authenticated connections are bounded.
        if self.open.fetch_add(1, Ordering::SeqCst) >= MAX_SESSIONS {
            self.open.fetch_sub(1, Ordering::SeqCst);
            return Err("connection limit reached".into());
        }
        let _counted = Counted(self.open.clone());
        if hello.role != Role::Client {
            return Err(format!("role {:?} on the client port", hello.role).into());
        }
        let name = if hello.from.is_empty() {
            peer.clone()
        } else {
            hello.from.chars().take(128).collect()
        };
        let ttl_ms = match tokio::time::timeout(HANDSHAKE_TIMEOUT, proto::read(&mut conn)).await {
            Ok(Ok(Some(Request::Open { ttl_ms }))) => ttl_ms.clamp(MIN_TTL_MS, MAX_TTL_MS),
            Ok(Ok(Some(other))) => {
                let message = format!("the first request must be Open, not {other:?}");
                proto::write(&mut conn, &Response::Error { req: None, message }).await?;
                return Err("no Open".into());
            }
            Ok(Ok(None)) => return Ok(()),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err("no Open within the handshake timeout".into()),
        };
        let ttl = Duration::from_millis(ttl_ms);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let sid = {
            let mut st = lock(&self.state);
            st.next_session += 1;
            let sid = st.next_session;
            st.sessions.insert(
                sid,
                Session {
                    name: name.clone(),
                    tx: tx.clone(),
                    reqs: HashMap::new(),
                },
            );
            sid
        };
        let opened = Response::Opened {
            ttl_ms,
            node: self.node as u64,
        };
        let _ = tx.send((opened, None));
        let (mut rd, mut wr) = tokio::io::split(conn);
        // A write the client does not take within a TTL ends the writer (and so the
        // session: its next answer finds the channel closed).
        let writer = tokio::spawn(async move {
            while let Some((resp, _place)) = rx.recv().await {
                let last = matches!(resp, Response::Error { req: None, .. });
                let written = tokio::time::timeout(ttl, proto::write(&mut wr, &resp)).await;
                if !matches!(written, Ok(Ok(()))) || last {
                    break;
                }
            }
            let _ = wr.shutdown().await;
        });
        let direct = Arc::new(tokio::sync::Semaphore::new(DIRECT_MAX));
        let why = loop {
            match tokio::time::timeout(ttl, proto::read::<_, Request>(&mut rd)).await {
                Err(_) => break "ttl",
                Ok(Ok(None)) => break "closed",
                Ok(Err(e)) => {
                    let _ = tx.send((
                        Response::Error {
                            req: None,
                            message: e.to_string(),
                        },
                        None,
                    ));
                    break "closed";
                }
                Ok(Ok(Some(r))) => {
                    if let Some(resp) = self.request(sid, r, &mut ctx) {
                        // Past `DIRECT_MAX` unwritten answers, reading waits for the
                        // writer; a client that reads none of them for a TTL is let go.
                        let place = tokio::time::timeout(ttl, direct.clone().acquire_owned());
                        let Ok(Ok(place)) = place.await else {
                            break "not reading its answers";
                        };
                        if tx.send((resp, Some(place))).is_err() {
                            break "not reading its answers";
                        }
                    }
                }
            }
        };
        self.expire(sid, why, &mut ctx).await;
        drop(tx);
        let _ = writer.await;
        Ok(())
    }

    /// One request of session `sid`; the answer, when the gate gives it itself.
    fn request(&self, sid: u64, r: Request, ctx: &mut Ctx) -> Option<Response> {
        let refuse = |req, message: String| {
            Some(Response::Error {
                req: Some(req),
                message,
            })
        };
        let ev: Event = {
            let mut st = lock(&self.state);
            let st = &mut *st;
            let s = st.sessions.get_mut(&sid)?;
            match r {
                Request::KeepAlive => return Some(Response::Alive),
                Request::Open { .. } => {
                    return Some(Response::Error {
                        req: None,
                        message: "the session is already open".into(),
                    });
                }
                Request::Acquire { req, lock, wait } => {
                    if lock.is_empty() || lock.len() > MAX_LOCK_NAME {
                        return refuse(req, format!("a lock name has 1..={MAX_LOCK_NAME} bytes"));
                    }
                    if s.reqs.contains_key(&req) {
                        return refuse(req, format!("request {req} is already in use"));
                    }
                    if s.reqs.len() >= MAX_REQUESTS {
                        return refuse(req, format!("at most {MAX_REQUESTS} requests a session"));
                    }
                    let id = st.next_id;
                    st.next_id -= 1;
                    st.routes.insert(id, (sid, req));
                    s.reqs.insert(
                        req,
                        Held {
                            id,
                            lock: lock.clone(),
                            fence: None,
                        },
                    );
                    ("acquire", id, lock.as_str(), !wait).into()
                }
                Request::Release { req } | Request::Cancel { req } => {
                    let Some(h) = s.reqs.get(&req) else {
                        return refuse(req, format!("no request {req} in this session"));
                    };
                    let tag = if matches!(r, Request::Release { .. }) {
                        "release"
                    } else {
                        "cancel"
                    };
                    (tag, h.id, h.lock.as_str()).into()
                }
            }
        };
        forward(&self.state, ev, ctx);
        None
    }

    /// Ends session `sid`: every request withdrawn, every hold released and reported.
    async fn expire(&self, sid: u64, why: &str, ctx: &mut Ctx) {
        let Some(mut s) = lock(&self.state).sessions.remove(&sid) else {
            return;
        };
        let at_ns = monotonic_ns();
        for (req, h) in std::mem::take(&mut s.reqs) {
            if let Some(fence) = h.fence {
                s.send(Response::Expired { req, at_ns });
                self.audit(&s.name, &h.lock, fence, at_ns, why);
                tracing::info!(
                    node = self.node,
                    client = s.name,
                    lock = h.lock,
                    fence,
                    why,
                    "lease ended: lock released"
                );
            }
            // The front keeps the route until it answers; the answer finds no session.
            // A full front queue is waited out: the lock must be given back.
            let ev: Event = ("cancel", h.id, h.lock.as_str()).into();
            {
                // Before the epoch, the acquire itself still waits in `early`: queue the
                // cancel behind it.
                let mut st = lock(&self.state);
                if st.epoch.is_none() {
                    st.early.push(ev);
                    continue;
                }
            }
            if let Err(e) = ctx.send_wait("front", ev).await {
                tracing::error!(lock = h.lock, error = %e,
                    "gate: cannot withdraw an expired session's request");
            }
        }
        let message = format!("session ended ({why})");
        s.send(Response::Error { req: None, message });
    }

    fn audit(&self, client: &str, name: &str, fence: u64, at_ns: u64, why: &str) {
        let Some(f) = &self.audit else { return };
        let line = serde_json::json!({
            "kind": "expired", "node": self.node, "client": client, "lock": name,
            "fence": fence, "at_ns": at_ns, "why": why,
        });
        let mut f = lock(f);
        if let Err(e) = writeln!(f, "{line}").and_then(|()| f.flush()) {
            tracing::error!(error = %e, "gate: cannot write the audit line");
        }
    }
}
