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
//! "why":"ttl"|"closed"|"not reading its answers"|...}`) when an audit file is set, and
//! closes the connection. A client that does not read: once `DIRECT_MAX` of the gate's own
//! answers wait to be written (keep-alives waiting for their check included), the session
//! stops reading it, and ends when none frees up within a TTL (bounded memory per session).
//!
//! A refused release (of a request still waiting, or released already) answers the
//! client with an error and leaves the request as it was: its grant, or the answer to
//! the first release, still comes.
//!
//! Fences leave the gate as `epoch << 40 | fence`. With an epoch stage wired
//! ([`crate::epoch`]), requests wait until the group's epoch is agreed, each grant's fence
//! comes from the epoch stages' majority register (port `fence`), a grant after an unreleased
//! hold waits out that hold's lease on the gate's timer (a client's cancel meanwhile is
//! answered at once, the lock given back when the wait is over), a hold's end is stored in
//! the register before the front lets the lock go, and a keep-alive of a session holding
//! locks is answered once the register shows no later grant of them (one check at a time;
//! the keep-alives that arrive meanwhile wait for the next). Without one the epoch is 0 and
//! fences are the algorithm's own.
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

use crate::epoch::counter;
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
type Out = (Response, Option<Place>);

/// A place among the [`DIRECT_MAX`] answers the gate gives itself.
type Place = tokio::sync::OwnedSemaphorePermit;

/// How often the register's operations in flight are sent again to the nodes that have
/// not answered them.
const REGISTER_TICK: Duration = Duration::from_millis(250);

/// Fences carry the epoch in their bits from this one up.
pub const EPOCH_SHIFT: u32 = 40;

/// Why a grant is refused once a lock has had 2^32 grants in one epoch (its fences
/// would run into the epoch's bits: a month of ~1,600 grants a second). A new epoch,
/// that is the group started again, gives it fences again.
const FENCES_EXHAUSTED: &str =
    "this lock's fences are used up in this epoch: start the group again for a new one";

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
    /// Cancelled before any grant: a grant crossing the cancel is not the client's (the
    /// front answers the cancel by letting it go).
    cancelled: bool,
}

#[derive(Debug)]
struct Session {
    name: String,
    tx: mpsc::UnboundedSender<Out>,
    reqs: HashMap<u64, Held>,
    ttl_ms: u64,
    /// Keep-alives waiting for a check of this session's holds, each with its place among
    /// the [`DIRECT_MAX`] answers.
    pings: Vec<Place>,
    /// The check under way.
    checking: Option<Check>,
    /// A hold of this session was granted to another since (why): its leases are no
    /// longer renewed, and its next request ends it.
    superseded: Option<String>,
}

/// A check of a session's holds in the register, for keep-alives.
#[derive(Debug)]
struct Check {
    /// The keep-alives it answers.
    pings: Vec<Place>,
    /// The holds it looks at: front id, lock, fence.
    holds: Vec<(i64, String, u64)>,
}

impl Session {
    /// Queues `resp` for the client (an answer not among the [`DIRECT_MAX`]); a session
    /// whose writer ended drops it, as its end reports the session's requests.
    fn send(&self, resp: Response) {
        let _ = self.tx.send((resp, None));
    }

    /// Answers the keep-alives that held `pings`: each `Alive` in its place.
    fn alive(&self, pings: Vec<Place>) {
        for place in pings {
            let _ = self.tx.send((Response::Alive, Some(place)));
        }
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
    /// Grants between the front and the client, by front id (with an epoch stage).
    grants: HashMap<i64, Grant>,
    next_session: u64,
    next_id: i64,
}

/// A grant the front made to a session's request, from its fence to its release
/// ([`crate::epoch`]'s register).
#[derive(Debug)]
struct Grant {
    sid: u64,
    req: u64,
    lock: String,
    /// The fence (without the epoch), once the register stored it.
    raw: u64,
    phase: Phase,
    /// What the front is told once the hold's end is stored: `release` or `cancel`.
    then: Option<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// The register is storing its fence.
    Fencing,
    /// Stored after a hold that was not released: waiting out that hold's lease.
    Waiting,
    /// The client holds it (or would, its session ended).
    Held,
    /// The register is storing its release; then the front lets the lock go.
    Releasing,
}

struct Gate {
    node: usize,
    local: Arc<GateLocal>,
    state: Arc<Mutex<State>>,
    audit: Option<Arc<Mutex<std::fs::File>>>,
    started: bool,
    /// The gate's network runtime (for the waits of grants).
    rt: Option<tokio::runtime::Handle>,
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
                rt: None,
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
            "fenced" => self.fenced(&ev, ctx),
            "release-stored" => {
                let id: i64 = ev.get(1)?;
                let Some(g) = lock(&self.state).grants.remove(&id) else {
                    return Ok(());
                };
                let then = g.then.unwrap_or("release");
                ctx.send_or_wait("front", (then, id, g.lock.as_str()))?;
                Ok(())
            }
            "checked" => {
                let (sid, fences): (u64, Vec<u64>) = (ev.get(1)?, ev.get(2)?);
                let mut st = lock(&self.state);
                let st = &mut *st;
                let Some(s) = st.sessions.get_mut(&sid) else {
                    return Ok(());
                };
                let Some(Check { pings, holds }) = s.checking.take() else {
                    return Ok(());
                };
                // A later grant of a lock still held (not released meanwhile): this node
                // was held crashed, or cut off.
                let later = holds.iter().zip(&fences).find(|((id, _, raw), read)| {
                    counter(**read) > counter(*raw)
                        && st.grants.get(id).is_some_and(|g| {
                            g.raw == *raw && matches!(g.phase, Phase::Held | Phase::Waiting)
                        })
                });
                if let Some(((_, name, _), _)) = later {
                    tracing::warn!(
                        node = self.node,
                        lock = name,
                        client = s.name,
                        "a hold was granted to another: the session's lease ends"
                    );
                    let message = format!("lock {name} was granted to another holder");
                    s.superseded = Some(message.clone());
                    s.send(Response::Error { req: None, message });
                    return Ok(());
                }
                s.alive(pings);
                check_pings(st, sid, ctx);
                Ok(())
            }
            _ => self.reply(&tag, &ev, ctx),
        }
    }

    /// The register stored a grant's fence: the client learns of it now, or once the
    /// lease of an unreleased hold before it has run out.
    fn fenced(&self, ev: &Event, ctx: &mut Ctx) -> HandlerResult {
        let (id, raw, wait_ms): (i64, u64, u64) = (ev.get(1)?, ev.get(2)?, ev.get(3)?);
        {
            let mut st = lock(&self.state);
            let Some(g) = st.grants.get_mut(&id) else {
                return Ok(());
            };
            g.raw = raw;
            if wait_ms > 0 {
                g.phase = Phase::Waiting;
                tracing::info!(
                    node = self.node,
                    lock = g.lock,
                    wait_ms,
                    "granted after a hold that was not released: waiting out its lease"
                );
                let rt = self.rt.as_ref().ok_or("gate: no runtime")?;
                let (state, mut ctx) = (self.state.clone(), ctx.clone());
                rt.spawn(async move {
                    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
                    settle(&state, id, &mut ctx);
                });
                return Ok(());
            }
        }
        settle(&self.state, id, ctx);
        Ok(())
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
        self.rt = Some(rt.handle().clone());
        if lock(&self.state).keeper {
            // The register's operations send their phase again on each tick.
            let mut ctx = ctx.clone();
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(REGISTER_TICK).await;
                    let _ = ctx.send("fence", "tick");
                }
            });
        }
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
        let Some(h) = st.sessions.get(&sid).and_then(|s| s.reqs.get(&req)) else {
            // The session is gone (expired or closed) and the front has its cancel: forget
            // the route once the front is done with the request.
            if !matches!(tag, "granted" | "not-held") {
                st.routes.remove(&id);
                st.grants.remove(&id);
            }
            return Ok(());
        };
        if tag == "granted" && h.cancelled {
            // The grant crossed the client's cancel: the front answers the cancel by
            // letting the lock go, and that answer ends the request.
            return Ok(());
        }
        if tag == "granted" && st.keeper {
            // The fence comes from the majority register ([`crate::epoch`]); the client
            // learns of its grant once a majority stored it.
            let name: String = ev.get(2)?;
            let ttl_ms = st.sessions.get(&sid).map_or(0, |s| s.ttl_ms);
            let grant = Grant {
                sid,
                req,
                lock: name.clone(),
                raw: 0,
                phase: Phase::Fencing,
                then: None,
            };
            st.grants.insert(id, grant);
            drop(st);
            if let Err(e) = ctx.send("fence", ("fence", id, name.as_str(), ttl_ms as i64)) {
                lock(&self.state).grants.remove(&id);
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
            "granted" => {
                let raw: u64 = ev.get(3)?;
                if raw >> EPOCH_SHIFT != 0 {
                    // (See `settle`.)
                    drop(st);
                    ctx.send("front", ("cancel", id, ev.get::<String>(2)?.as_str()))?;
                    let st = lock(&self.state);
                    if let Some(s) = st.sessions.get(&sid) {
                        s.send(Response::Error {
                            req: Some(req),
                            message: FENCES_EXHAUSTED.into(),
                        });
                    }
                    return Ok(());
                }
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
        if !matches!(tag, "granted" | "not-held") {
            st.routes.remove(&id);
            st.grants.remove(&id);
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

/// Has the register store the end of grant `id` (phase `Held`); the front lets the lock
/// go when it answers (`release-stored`).
fn store_release(id: i64, g: &mut Grant, ctx: &mut Ctx) -> Result<(), SendError> {
    ctx.send("fence", ("release", id, g.lock.as_str(), g.raw as i64))?;
    g.phase = Phase::Releasing;
    Ok(())
}

/// A grant's fence is stored (and its wait over): the client learns of it, or, the
/// request withdrawn meanwhile, the register stores its end.
fn settle(state: &Mutex<State>, id: i64, ctx: &mut Ctx) {
    let mut st = lock(state);
    let epoch = st.epoch.unwrap_or(0);
    let st = &mut *st;
    let Some(g) = st.grants.get_mut(&id) else {
        return;
    };
    let sid = g.sid;
    g.phase = Phase::Held;
    if g.raw >> EPOCH_SHIFT != 0 && g.then.is_none() {
        // The lock's fences of this epoch are used up: granting would put the fence's
        // high bits into the epoch's and hand out one smaller than earlier ones.
        tracing::error!(lock = g.lock, "gate: {FENCES_EXHAUSTED}");
        if let Some(s) = st.sessions.get(&sid) {
            s.send(Response::Error {
                req: Some(g.req),
                message: FENCES_EXHAUSTED.into(),
            });
        }
        g.then = Some("cancel");
    }
    if g.then.is_some() {
        if let Err(e) = store_release(id, g, ctx) {
            // The lock is given back unreleased: its next holder waits out this lease.
            tracing::warn!(lock = g.lock, error = %e, "gate: cannot store a release");
            let ev: Event = (g.then.unwrap_or("cancel"), id, g.lock.as_str()).into();
            st.grants.remove(&id);
            if let Err(e) = ctx.send("front", ev) {
                tracing::error!(error = %e, "gate: cannot withdraw a request");
            }
        }
    } else if let Some(s) = st.sessions.get_mut(&sid) {
        let fence = (epoch << EPOCH_SHIFT) | g.raw;
        if let Some(h) = s.reqs.get_mut(&g.req) {
            h.fence = Some(fence);
        }
        s.send(Response::Granted { req: g.req, fence });
    }
    check_pings(st, sid, ctx);
}

/// Starts a check of session `sid`'s holds for the keep-alives waiting, unless one runs
/// or a fence is being stored (the check must see it); a session holding nothing is
/// answered at once.
fn check_pings(st: &mut State, sid: u64, ctx: &mut Ctx) {
    let Some(s) = st.sessions.get_mut(&sid) else {
        return;
    };
    if s.checking.is_some() || s.pings.is_empty() || s.superseded.is_some() {
        return;
    }
    let mine = s
        .reqs
        .values()
        .filter_map(|h| Some((h, st.grants.get(&h.id)?)));
    let mut holds = Vec::new();
    for (h, g) in mine {
        match g.phase {
            Phase::Fencing => return,
            Phase::Waiting | Phase::Held => holds.push((h.id, g.lock.clone(), g.raw)),
            Phase::Releasing => {}
        }
    }
    if holds.is_empty() {
        let pings = std::mem::take(&mut s.pings);
        s.alive(pings);
        return;
    }
    let locks: Vec<Value> = holds
        .iter()
        .map(|(_, l, _)| Value::from(l.as_str()))
        .collect();
    match ctx.send("fence", ("check", sid as i64, locks)) {
        Ok(()) => {
            let pings = std::mem::take(&mut s.pings);
            s.checking = Some(Check { pings, holds });
        }
        // The next keep-alive tries again.
        Err(e) => tracing::debug!(error = %e, "gate: no check of a session's holds"),
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
            // Handshakes in progress are bounded apart from sessions, one dropped for a
            // new one (see `Slots`): silent connections cannot keep clients out.
            let _ = tcp.set_nodelay(true);
            let net = self.clone();
            let ctx = ctx.clone();
            handshakes.spawn(peer, move |slot| async move {
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
        let mut conn = Conn::plain(tcp);
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
                    ttl_ms,
                    pings: Vec::new(),
                    checking: None,
                    superseded: None,
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
                    // Past `DIRECT_MAX` answers of the gate's own unwritten (keep-alives
                    // waiting for their check included), reading waits for the writer; a
                    // client that reads none of them for a TTL is let go.
                    let place = tokio::time::timeout(ttl, direct.clone().acquire_owned());
                    let Ok(Ok(place)) = place.await else {
                        break "not reading its answers, or its keep-alives unanswered";
                    };
                    if let Some(out) = self.request(sid, r, place, &mut ctx) {
                        // An error of the whole session ends it.
                        let last = matches!(out.0, Response::Error { req: None, .. });
                        if tx.send(out).is_err() {
                            break "not reading its answers";
                        }
                        if last {
                            break "ended by the node";
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
    fn request(&self, sid: u64, r: Request, place: Place, ctx: &mut Ctx) -> Option<Out> {
        let mut place = Some(place);
        let resp = self.answer(sid, r, &mut place, ctx)?;
        Some((resp, place))
    }

    /// [`Net::request`]'s work: a keep-alive waiting for its check keeps `place`.
    fn answer(
        &self,
        sid: u64,
        r: Request,
        place: &mut Option<Place>,
        ctx: &mut Ctx,
    ) -> Option<Response> {
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
            if let Some(why) = &s.superseded {
                let message = why.clone();
                return Some(Response::Error { req: None, message });
            }
            match r {
                Request::KeepAlive => {
                    // A session holding a lock is renewed only once the register shows no
                    // later grant of it (and this node can reach a majority).
                    let holds = s.reqs.values().any(|h| st.grants.contains_key(&h.id));
                    if !st.keeper || (!holds && s.pings.is_empty() && s.checking.is_none()) {
                        return Some(Response::Alive);
                    }
                    s.pings.extend(place.take());
                    check_pings(st, sid, ctx);
                    return None;
                }
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
                            cancelled: false,
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
                    if let Some(g) = st.grants.get_mut(&h.id) {
                        // Granted: the front lets the lock go once the register stored the
                        // hold's end.
                        if g.then.is_some() {
                            return refuse(req, format!("request {req} is being released"));
                        }
                        if g.phase == Phase::Held {
                            g.then = Some(tag);
                            if let Err(e) = store_release(h.id, g, ctx) {
                                g.then = None;
                                return refuse(req, format!("the node is overloaded: {e}"));
                            }
                            return None;
                        }
                        // A grant the client has not seen (its fence being stored, or the
                        // lease of a hold before it waited out): not the client's to release;
                        // cancelled at once, while the lock stays here until the grant
                        // settles and then goes back.
                        if tag == "release" {
                            return refuse(req, format!("request {req} is not granted yet"));
                        }
                        g.then = Some("cancel");
                        let id = h.id;
                        s.reqs.remove(&req);
                        st.routes.remove(&id);
                        return Some(Response::Cancelled { req });
                    }
                    if tag == "cancel" {
                        // Not granted yet (as far as this gate knows).
                        if let Some(h) = s.reqs.get_mut(&req) {
                            h.cancelled = true;
                        }
                    }
                    let h = &s.reqs[&req];
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
                let mut st = lock(&self.state);
                if let Some(g) = st.grants.get_mut(&h.id) {
                    // Granted: the register stores the hold's end first (a release under
                    // way goes on).
                    if g.then.is_none() {
                        g.then = Some("cancel");
                        if g.phase == Phase::Held && store_release(h.id, g, ctx).is_err() {
                            // The lock is given back unreleased: its next holder waits
                            // out this lease.
                            st.grants.remove(&h.id);
                        } else {
                            continue;
                        }
                    } else {
                        continue;
                    }
                }
                // Before the epoch, the acquire itself still waits in `early`: queue the
                // cancel behind it.
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
