//! The transport of one process: a link per peer process (one TCP connection carrying
//! every connector between the two), credit-based flow control, batching, and the
//! accounting that keeps `sent = delivered + reported failed`.
//!
//! # Sending
//!
//! [`RemoteSink::send`] never blocks: it takes one credit of the route on a peer
//! (round-robin over the peers of a replicated cluster) and queues the event on that
//! link's outbound channel; with no credit anywhere it returns `QueueFull` at once.
//! The link's writer task drains the channel, groups events by route into one frame,
//! moves them to the route's *unacknowledged* queue, and writes the frame.
//!
//! # Receiving
//!
//! The receiver injects events in order per route. An event whose destination queue is
//! full waits in a per-route pending queue (bounded by the credit window) and is retried;
//! other routes are not held up. Outcomes go back in [`Reply`] frames, in processing
//! order: an acknowledgement returns the credits and releases the sender's copies; a
//! refusal (unknown stage, run ended, credit exceeded) is reported by the sender through
//! `ProcessHandle::report_failed`, so it reaches the sending stage's `error` port.
//!
//! # Failure
//!
//! When a connection breaks, every event still queued or unacknowledged on it is
//! reported as failed with `SendError::Unreachable`, and later sends to that peer fail
//! at once (or go to a live replica).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::BytesMut;
use leda_core::error::{Rejected, SendError};
use leda_core::event::Event;
use leda_core::runtime::ProcessHandle;
use leda_core::runtime::executor::{RemoteLinks, RemoteSink};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use crate::deploy::RouteInfo;
use crate::error::FrameError;
use crate::frame::{self, Frame, LinkCount, MAX_FRAME, Refusal, Reply, Status};

/// How long a closing link waits for the peer to finish its side.
const CLOSE_GRACE: Duration = Duration::from_secs(3);
/// Retry period of events waiting for room in a full destination queue.
const RETRY: Duration = Duration::from_micros(200);
/// Read buffer growth step.
const READ_CHUNK: usize = 256 * 1024;
/// Most items one writer pass takes from the outbound channel.
const BATCH: usize = 2048;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counters of one process' transport.
#[derive(Debug, Default)]
pub struct TransportStats {
    /// Events taken by remote sinks.
    pub sent: AtomicU64,
    /// Of those, acknowledged by the receiver (queued at the destination).
    pub delivered: AtomicU64,
    /// Of those, reported failed (refused, or lost with a connection).
    pub failed: AtomicU64,
    /// Events received from other processes and queued here.
    pub accepted: AtomicU64,
}

/// A copy of [`TransportStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportCounts {
    /// Events taken by remote sinks.
    pub sent: u64,
    /// Acknowledged by receivers.
    pub delivered: u64,
    /// Reported failed.
    pub failed: u64,
    /// Received and queued here.
    pub accepted: u64,
}

enum Out {
    Event(u32, Event),
    Frame(Frame),
    Close,
}

struct LinkRoute {
    credit: AtomicI64,
    in_flight: AtomicU64,
    unacked: Mutex<VecDeque<Event>>,
}

/// The connection to one peer process.
pub(crate) struct Link {
    peer: String,
    out: mpsc::UnboundedSender<Out>,
    routes: Box<[LinkRoute]>,
    /// Events handed to this link for the peer (idle detection).
    sent: AtomicU64,
    /// Events received from the peer and handled here (idle detection).
    received: AtomicU64,
    dead: AtomicBool,
    dead_notify: Notify,
    status: Mutex<Option<Status>>,
    status_notify: Notify,
    /// The latest dashboard answer ([`crate::observe`]).
    pub(crate) observed: Mutex<Option<crate::observe::ObserveReply>>,
    pub(crate) observed_notify: Notify,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl Link {
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Relaxed)
    }

    fn mark_dead(&self) {
        if !self.dead.swap(true, AcqRel) {
            self.dead_notify.notify_one();
            self.status_notify.notify_waiters();
        }
    }

    /// The peer's address.
    pub(crate) fn peer(&self) -> &str {
        &self.peer
    }

    /// Queues a control frame.
    pub(crate) fn send_frame(&self, f: Frame) {
        let _ = self.out.send(Out::Frame(f));
    }

    /// The latest status answer, if it is for `round`.
    pub(crate) async fn status(&self, round: u64, timeout: Duration) -> Option<Status> {
        let wait = async {
            loop {
                let notified = self.status_notify.notified();
                if let Some(s) = lock(&self.status).as_ref()
                    && s.round >= round
                {
                    return Some(s.clone());
                }
                if self.is_dead() {
                    return None;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }
}

/// The transport of one process in one run: implements [`RemoteLinks`] for the core.
pub struct Transport {
    me: String,
    routes: Vec<RouteInfo>,
    route_ids: HashMap<(String, String), u32>,
    links: Mutex<HashMap<String, Arc<Link>>>,
    handle_tx: watch::Sender<Option<ProcessHandle>>,
    indexes: Mutex<Option<Arc<RouteIndexes>>>,
    stats: Arc<TransportStats>,
    pending_inbound: AtomicU64,
    quit_on_loss: Mutex<Option<String>>,
    closing: AtomicBool,
    rt: tokio::runtime::Handle,
}

struct RouteIndexes {
    from: Vec<Option<usize>>,
    to: Vec<Option<usize>>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("me", &self.me)
            .field("peers", &lock(&self.links).keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Transport {
    /// A transport for process `me` with the deployment's route table; link tasks run
    /// on `rt`.
    pub(crate) fn new(me: &str, routes: Vec<RouteInfo>, rt: tokio::runtime::Handle) -> Arc<Self> {
        let route_ids = routes
            .iter()
            .enumerate()
            .map(|(i, r)| ((r.from.clone(), r.to.clone()), i as u32))
            .collect();
        Arc::new(Transport {
            me: me.into(),
            routes,
            route_ids,
            links: Mutex::new(HashMap::new()),
            handle_tx: watch::channel(None).0,
            indexes: Mutex::new(None),
            stats: Arc::new(TransportStats::default()),
            pending_inbound: AtomicU64::new(0),
            quit_on_loss: Mutex::new(None),
            closing: AtomicBool::new(false),
            rt,
        })
    }

    /// This process' address in the mapping.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// Counters now.
    pub fn counts(&self) -> TransportCounts {
        TransportCounts {
            sent: self.stats.sent.load(Relaxed),
            delivered: self.stats.delivered.load(Relaxed),
            failed: self.stats.failed.load(Relaxed),
            accepted: self.stats.accepted.load(Relaxed),
        }
    }

    /// Ends the local run if the link to `peer` is lost before the run ends (a daemon
    /// does not outlive its launcher).
    pub(crate) fn quit_on_loss(&self, peer: &str) {
        *lock(&self.quit_on_loss) = Some(peer.to_owned());
    }

    /// Gives the transport the running process (inbound events wait for it).
    pub(crate) fn set_handle(&self, h: ProcessHandle) {
        let from = self.routes.iter().map(|r| h.stage_index(&r.from)).collect();
        let to = self.routes.iter().map(|r| h.stage_index(&r.to)).collect();
        *lock(&self.indexes) = Some(Arc::new(RouteIndexes { from, to }));
        self.handle_tx.send_replace(Some(h));
    }

    async fn handle(&self) -> Option<(ProcessHandle, Arc<RouteIndexes>)> {
        let mut rx = self.handle_tx.subscribe();
        let h = rx.wait_for(|h| h.is_some()).await.ok()?.clone()?;
        let idx = lock(&self.indexes).clone()?;
        Some((h, idx))
    }

    /// This process' answer to a status request of `round`: quiescence, then the
    /// counters (read after it, so a counter change during the check is seen as a
    /// change between rounds), then quiescence again.
    pub(crate) fn status(&self, h: &ProcessHandle, round: u64) -> Status {
        let before = h.is_quiescent() && self.no_pending_inbound();
        let accepted = self.stats.accepted.load(Relaxed);
        let mut links: Vec<LinkCount> = lock(&self.links)
            .iter()
            .filter(|(_, l)| !l.is_dead())
            .map(|(peer, l)| LinkCount {
                peer: peer.clone(),
                sent: l.sent.load(Acquire),
                received: l.received.load(Acquire),
            })
            .collect();
        links.sort();
        let after = h.is_quiescent() && self.no_pending_inbound();
        Status {
            round,
            quiescent: before && after,
            accepted,
            links,
        }
    }

    /// `true` when no inbound event waits for room here.
    pub(crate) fn no_pending_inbound(&self) -> bool {
        self.pending_inbound.load(Relaxed) == 0
    }

    /// The runtime the links run on.
    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.rt
    }

    /// The live links.
    pub(crate) fn links(&self) -> Vec<Arc<Link>> {
        lock(&self.links).values().cloned().collect()
    }

    /// Ends every link cleanly (after `Quit` frames, if asked) and waits (bounded) for
    /// their writers to finish; events never acknowledged are then reported failed.
    pub(crate) async fn close(&self, quit: Option<Vec<leda_core::value::Value>>) {
        self.closing.store(true, Relaxed);
        let links = self.links();
        for l in &links {
            if let Some(v) = &quit {
                l.send_frame(Frame::Quit(v.clone()));
            }
            let _ = l.out.send(Out::Close);
        }
        for l in links {
            let w = lock(&l.writer).take();
            if let Some(w) = w
                && tokio::time::timeout(CLOSE_GRACE * 2, w).await.is_err()
            {
                tracing::warn!(peer = %l.peer, "link did not close in time");
            }
        }
    }

    /// Starts the link to `peer` over `stream` (handshake done).
    pub(crate) fn attach(self: &Arc<Self>, peer: &str, stream: TcpStream) -> Arc<Link> {
        let _ = stream.set_nodelay(true);
        let (tx, rx) = mpsc::unbounded_channel();
        let link = Arc::new(Link {
            peer: peer.into(),
            out: tx,
            routes: self
                .routes
                .iter()
                .map(|r| LinkRoute {
                    credit: AtomicI64::new(r.window.into()),
                    in_flight: AtomicU64::new(0),
                    unacked: Mutex::new(VecDeque::new()),
                })
                .collect(),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            dead_notify: Notify::new(),
            status: Mutex::new(None),
            status_notify: Notify::new(),
            observed: Mutex::new(None),
            observed_notify: Notify::new(),
            writer: Mutex::new(None),
        });
        if let Some(old) = lock(&self.links).insert(peer.into(), link.clone()) {
            tracing::warn!(peer, "replacing an existing link");
            old.mark_dead();
        }
        let (rd, wr) = stream.into_split();
        let reader = self.rt.spawn(read_loop(self.clone(), link.clone(), rd));
        let writer = self
            .rt
            .spawn(write_loop(self.clone(), link.clone(), wr, rx, reader));
        *lock(&link.writer) = Some(writer);
        tracing::debug!(me = %self.me, peer, "link up");
        link
    }

    fn refusal_error(&self, route: u32, peer: &str, r: &Refusal) -> SendError {
        let stage = self
            .routes
            .get(route as usize)
            .map(|r| r.to.clone())
            .unwrap_or_default();
        match r {
            Refusal::QueueFull => SendError::QueueFull { stage },
            Refusal::UnknownStage(why) => SendError::Unreachable {
                stage,
                reason: format!("{peer} refused: {why}"),
            },
            Refusal::Stopped => SendError::Unreachable {
                stage,
                reason: format!("the run in {peer} has ended"),
            },
        }
    }

    /// Reports events of `route` as failed to their sending stage.
    async fn report_failed(&self, route: u32, error: &SendError, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        self.stats.failed.fetch_add(events.len() as u64, Relaxed);
        let Some((h, idx)) = self.handle().await else {
            return;
        };
        let from = idx.from.get(route as usize).copied().flatten();
        for ev in events {
            match from {
                Some(i) => h.report_failed(i, error, ev),
                None => tracing::warn!(route, error = %error, "lost event of an unknown route"),
            }
        }
    }
}

impl RemoteLinks for Transport {
    fn sink(
        &self,
        from: &str,
        to: &str,
        _cluster: usize,
        processes: &[String],
    ) -> Result<Arc<dyn RemoteSink>, String> {
        let route = *self
            .route_ids
            .get(&(from.to_owned(), to.to_owned()))
            .ok_or_else(|| format!("no route {from} -> {to} in the deployment"))?;
        let links = lock(&self.links);
        let mut peers = Vec::new();
        for p in processes {
            peers.push(
                links
                    .get(p)
                    .cloned()
                    .ok_or_else(|| format!("no connection to process {p}"))?,
            );
        }
        if peers.is_empty() {
            return Err(format!("stage {to} is mapped to no process"));
        }
        Ok(Arc::new(Sink {
            stats: self.stats.clone(),
            route,
            to: to.into(),
            peers,
            next: AtomicUsize::new(0),
        }))
    }

    fn peer_stats(&self) -> Vec<leda_core::dashboard::PeerStats> {
        self.observe_peers()
    }

    fn peer_control(
        &self,
        process: &str,
        action: &leda_core::dashboard::Control,
    ) -> Result<(), String> {
        self.control_peer(process, action)
    }
}

struct Sink {
    stats: Arc<TransportStats>,
    route: u32,
    to: String,
    peers: Vec<Arc<Link>>,
    next: AtomicUsize,
}

impl RemoteSink for Sink {
    fn send(&self, mut event: Event) -> Result<(), Rejected> {
        let n = self.peers.len();
        let start = self.next.fetch_add(1, Relaxed) % n;
        let mut all_dead = true;
        for k in 0..n {
            let link = &self.peers[(start + k) % n];
            if link.is_dead() {
                continue;
            }
            all_dead = false;
            let Some(rs) = link.routes.get(self.route as usize) else {
                continue;
            };
            if rs.credit.fetch_sub(1, AcqRel) <= 0 {
                rs.credit.fetch_add(1, AcqRel);
                continue;
            }
            rs.in_flight.fetch_add(1, AcqRel);
            // Counted before the event can reach the peer, so that no status ever
            // shows it received and not sent.
            link.sent.fetch_add(1, AcqRel);
            match link.out.send(Out::Event(self.route, event)) {
                Ok(()) => {
                    self.stats.sent.fetch_add(1, Relaxed);
                    return Ok(());
                }
                Err(mpsc::error::SendError(back)) => {
                    link.sent.fetch_sub(1, AcqRel);
                    rs.in_flight.fetch_sub(1, AcqRel);
                    rs.credit.fetch_add(1, AcqRel);
                    let Out::Event(_, ev) = back else {
                        unreachable!("an event was sent")
                    };
                    event = ev;
                }
            }
        }
        let error = if all_dead {
            SendError::Unreachable {
                stage: self.to.clone(),
                reason: "no live connection to its process".into(),
            }
        } else {
            SendError::QueueFull {
                stage: self.to.clone(),
            }
        };
        Err(Rejected { error, event })
    }

    fn in_flight(&self) -> u64 {
        self.peers
            .iter()
            .filter_map(|l| l.routes.get(self.route as usize))
            .map(|r| r.in_flight.load(Relaxed))
            .sum()
    }
}

fn push_reply(replies: &mut Vec<Reply>, route: u32, refused: Option<Refusal>) {
    if let Some(last) = replies.last_mut()
        && last.route == route
        && last.refused == refused
        && last.count < u32::MAX
    {
        last.count += 1;
        return;
    }
    replies.push(Reply {
        route,
        count: 1,
        refused,
    });
}

struct Inbound {
    pending: HashMap<u32, VecDeque<Event>>,
    replies: Vec<Reply>,
}

impl Inbound {
    fn pending_len(&self) -> usize {
        self.pending.values().map(VecDeque::len).sum()
    }

    /// Injects one event of `route` (in order behind any pending ones).
    fn deliver(&mut self, t: &Transport, h: &ProcessHandle, dest: usize, route: u32, ev: Event) {
        let q = self.pending.entry(route).or_default();
        if !q.is_empty() {
            let window = t.routes.get(route as usize).map_or(1, |r| r.window) as usize;
            if q.len() >= window {
                push_reply(&mut self.replies, route, Some(Refusal::QueueFull));
            } else {
                q.push_back(ev);
                t.pending_inbound.fetch_add(1, Relaxed);
            }
            return;
        }
        match h.inject(dest, ev) {
            Ok(()) => {
                t.stats.accepted.fetch_add(1, Relaxed);
                push_reply(&mut self.replies, route, None);
            }
            Err(Rejected {
                error: SendError::QueueFull { .. },
                event,
            }) => {
                q.push_back(event);
                t.pending_inbound.fetch_add(1, Relaxed);
            }
            Err(Rejected {
                error: SendError::Stopped,
                ..
            }) => push_reply(&mut self.replies, route, Some(Refusal::Stopped)),
            Err(r) => push_reply(
                &mut self.replies,
                route,
                Some(Refusal::UnknownStage(r.error.to_string())),
            ),
        }
    }

    /// Retries pending events, in order per route.
    fn retry(&mut self, t: &Transport, h: &ProcessHandle, idx: &RouteIndexes) {
        for (&route, q) in self.pending.iter_mut() {
            let Some(dest) = idx.to.get(route as usize).copied().flatten() else {
                continue;
            };
            while let Some(ev) = q.pop_front() {
                match h.inject(dest, ev) {
                    Ok(()) => {
                        t.pending_inbound.fetch_sub(1, Relaxed);
                        t.stats.accepted.fetch_add(1, Relaxed);
                        push_reply(&mut self.replies, route, None);
                    }
                    Err(Rejected {
                        error: SendError::QueueFull { .. },
                        event,
                    }) => {
                        q.push_front(event);
                        break;
                    }
                    Err(r) => {
                        t.pending_inbound.fetch_sub(1, Relaxed);
                        let why = match r.error {
                            SendError::Stopped => Refusal::Stopped,
                            e => Refusal::UnknownStage(e.to_string()),
                        };
                        push_reply(&mut self.replies, route, Some(why));
                    }
                }
            }
        }
    }

    fn drop_pending(&mut self, t: &Transport) {
        let n = self.pending_len() as u64;
        t.pending_inbound.fetch_sub(n, Relaxed);
        self.pending.clear();
    }
}

/// Reads, decodes and handles the peer's frames, and retries events waiting for room.
/// Reads go into one buffer with a cancel-safe `read_buf`, so the retry timer can
/// interrupt them; frames are handled on this task (no hop to another).
async fn read_loop(t: Arc<Transport>, link: Arc<Link>, mut rd: tokio::net::tcp::OwnedReadHalf) {
    let mut inb = Inbound {
        pending: HashMap::new(),
        replies: Vec::new(),
    };
    let mut ready: Option<(ProcessHandle, Arc<RouteIndexes>)> = None;
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    'conn: loop {
        // Handle every complete frame in the buffer.
        loop {
            if buf.len() < 4 {
                break;
            }
            let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
            if len == 0 || len > MAX_FRAME {
                let e = FrameError::BadLength {
                    len: len.into(),
                    max: MAX_FRAME,
                };
                tracing::warn!(peer = %link.peer, error = %e, "bad frame; closing the link");
                break 'conn;
            }
            let total = 4 + len as usize;
            if buf.len() < total {
                // Grow only as the bytes arrive, but geometrically (at most doubling
                // what has arrived), so a large frame costs a linear number of
                // copies and an announced length alone allocates little.
                let want = (total - buf.len()).min(buf.len().max(READ_CHUNK));
                buf.reserve(want);
                break;
            }
            let raw = buf.split_to(total).freeze();
            let f = match frame::decode_shared(raw.slice(4..)) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(peer = %link.peer, error = %e, "bad frame; closing the link");
                    break 'conn;
                }
            };
            if !handle_frame(&t, &link, &mut inb, &mut ready, f).await {
                break 'conn;
            }
        }
        if !inb.replies.is_empty() {
            link.send_frame(Frame::Replies(std::mem::take(&mut inb.replies)));
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(READ_CHUNK);
        }
        let read = if inb.pending_len() > 0 {
            tokio::select! {
                r = rd.read_buf(&mut buf) => Some(r),
                _ = tokio::time::sleep(RETRY) => None,
            }
        } else {
            Some(rd.read_buf(&mut buf).await)
        };
        match read {
            None => {
                if let Some((h, idx)) = &ready {
                    inb.retry(&t, h, idx);
                }
                if !inb.replies.is_empty() {
                    link.send_frame(Frame::Replies(std::mem::take(&mut inb.replies)));
                }
            }
            Some(Ok(0)) => {
                if buf.is_empty() {
                    tracing::debug!(peer = %link.peer, "peer closed the link");
                } else {
                    tracing::warn!(peer = %link.peer, bytes = buf.len(), "peer closed the link inside a frame");
                }
                break;
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::warn!(peer = %link.peer, error = %e, "link read failed; closing it");
                break;
            }
        }
    }
    inb.drop_pending(&t);
    // Let the writer finish what is queued (replies included), then close.
    let _ = link.out.send(Out::Close);
}

/// Handles one inbound frame; `false` closes the link.
async fn handle_frame(
    t: &Arc<Transport>,
    link: &Arc<Link>,
    inb: &mut Inbound,
    ready: &mut Option<(ProcessHandle, Arc<RouteIndexes>)>,
    f: Frame,
) -> bool {
    let need_handle = matches!(
        f,
        Frame::Events(_) | Frame::Quit(_) | Frame::StatusReq(_) | Frame::Observe(_)
    );
    if need_handle && ready.is_none() {
        *ready = t.handle().await;
        if ready.is_none() {
            return false;
        }
    }
    match f {
        Frame::Events(groups) => {
            let Some((h, idx)) = ready.as_ref() else {
                return false;
            };
            for (route, events) in groups {
                match idx.to.get(route as usize).copied().flatten() {
                    Some(dest) => {
                        for ev in events {
                            inb.deliver(t, h, dest, route, ev);
                            // Counted once the event is queued, pending (not
                            // quiescent) or refused, never before.
                            link.received.fetch_add(1, AcqRel);
                        }
                    }
                    None => {
                        let why = Refusal::UnknownStage(format!(
                            "{} runs no destination for route {route}",
                            t.me
                        ));
                        for _ in events {
                            push_reply(&mut inb.replies, route, Some(why.clone()));
                            link.received.fetch_add(1, AcqRel);
                        }
                    }
                }
            }
        }
        Frame::Replies(replies) => {
            for r in replies {
                let Some(rs) = link.routes.get(r.route as usize) else {
                    tracing::warn!(peer = %link.peer, route = r.route, "reply for an unknown route");
                    return false;
                };
                let popped: Vec<Event> = {
                    let mut q = lock(&rs.unacked);
                    let n = (r.count as usize).min(q.len());
                    q.drain(..n).collect()
                };
                if popped.len() < r.count as usize {
                    tracing::warn!(peer = %link.peer, "reply for more events than were sent");
                }
                let n = popped.len() as u64;
                // Report before releasing the in-flight count, so that idle detection
                // never sees neither.
                match &r.refused {
                    None => {
                        t.stats.delivered.fetch_add(n, Relaxed);
                    }
                    Some(why) => {
                        let err = t.refusal_error(r.route, &link.peer, why);
                        t.report_failed(r.route, &err, popped).await;
                    }
                }
                rs.in_flight.fetch_sub(n, AcqRel);
                rs.credit.fetch_add(n as i64, AcqRel);
            }
        }
        Frame::Quit(values) => {
            if let Some((h, _)) = ready.as_ref() {
                tracing::debug!(peer = %link.peer, "quit from peer");
                h.quit(Event::from_values(values));
            }
        }
        Frame::StatusReq(round) => {
            if let Some((h, _)) = ready.as_ref() {
                link.send_frame(Frame::Status(t.status(h, round)));
            }
        }
        Frame::Status(s) => {
            *lock(&link.status) = Some(s);
            link.status_notify.notify_waiters();
        }
        Frame::Observe(req) => {
            if let Some((h, _)) = ready.as_ref() {
                link.send_frame(crate::observe::answer(req, h));
            }
        }
        Frame::Observed(reply) => crate::observe::record(link, *reply),
        Frame::Error(m) => {
            tracing::warn!(peer = %link.peer, error = %m, "peer reported an error");
            return false;
        }
        other => {
            tracing::warn!(peer = %link.peer, frame = other.name(), "unexpected frame on a link; closing it");
            return false;
        }
    }
    true
}

async fn write_loop(
    t: Arc<Transport>,
    link: Arc<Link>,
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Out>,
    mut reader: JoinHandle<()>,
) {
    let mut batch: Vec<Out> = Vec::with_capacity(BATCH);
    let mut bytes: Vec<u8> = Vec::with_capacity(256 * 1024);
    let mut clean = false;
    'run: loop {
        let n = tokio::select! {
            biased;
            _ = link.dead_notify.notified() => break 'run,
            n = rx.recv_many(&mut batch, BATCH) => n,
        };
        if n == 0 {
            break;
        }
        bytes.clear();
        let mut groups: Vec<(u32, Vec<Event>)> = Vec::new();
        let mut control = Vec::new();
        let mut close = false;
        for item in batch.drain(..) {
            match item {
                Out::Event(r, ev) => match groups.iter_mut().find(|g| g.0 == r) {
                    Some(g) => g.1.push(ev),
                    None => groups.push((r, vec![ev])),
                },
                Out::Frame(f) => control.push(f),
                Out::Close => close = true,
            }
        }
        if !groups.is_empty() {
            encode_groups(&t, &link, &mut bytes, groups).await;
        }
        for f in &control {
            if let Err(e) = frame::encode_into(&mut bytes, f) {
                tracing::error!(peer = %link.peer, error = %e, "cannot encode a control frame");
            }
        }
        if let Err(e) = wr.write_all(&bytes).await {
            tracing::warn!(peer = %link.peer, error = %e, "link write failed");
            break;
        }
        if close {
            clean = true;
            break;
        }
    }
    link.mark_dead();
    if clean {
        let _ = wr.shutdown().await;
        // Wait for the peer to finish its side, processing its last replies.
        if tokio::time::timeout(CLOSE_GRACE, &mut reader)
            .await
            .is_err()
        {
            tracing::debug!(peer = %link.peer, "peer did not close in time");
        }
    }
    reader.abort();
    drop(wr);
    // Everything still queued or unacknowledged on this link is lost.
    rx.close();
    let mut lost: HashMap<u32, Vec<Event>> = HashMap::new();
    while let Ok(item) = rx.try_recv() {
        if let Out::Event(r, ev) = item {
            lost.entry(r).or_default().push(ev);
        }
    }
    for (r, rs) in link.routes.iter().enumerate() {
        let mut evs: Vec<Event> = lock(&rs.unacked).drain(..).collect();
        if let Some(q) = lost.remove(&(r as u32)) {
            evs.extend(q);
        }
        if evs.is_empty() {
            continue;
        }
        let n = evs.len() as u64;
        let stage = t.routes.get(r).map(|x| x.to.clone()).unwrap_or_default();
        let err = SendError::Unreachable {
            stage,
            reason: format!("the connection to {} was lost", link.peer),
        };
        tracing::warn!(peer = %link.peer, events = n, "events lost with the connection");
        t.report_failed(r as u32, &err, evs).await;
        rs.in_flight.fetch_sub(n, AcqRel);
    }
    tracing::debug!(me = %t.me, peer = %link.peer, "link down");
    if !t.closing.load(Relaxed)
        && lock(&t.quit_on_loss).as_deref() == Some(link.peer.as_str())
        && let Some(h) = t.handle_tx.borrow().clone()
        && !h.is_stopping()
    {
        // (A launcher that ended the run sent `Quit` first: the run is stopping.)
        tracing::warn!(peer = %link.peer, "lost the launcher; ending the run");
        h.quit(Event::new());
    }
}

/// Encodes a batch, moving its events to the unacknowledged queues before the write.
async fn encode_groups(
    t: &Transport,
    link: &Link,
    bytes: &mut Vec<u8>,
    groups: Vec<(u32, Vec<Event>)>,
) {
    let at = bytes.len();
    let fits = frame::encode_events(bytes, &groups).is_ok();
    if !fits {
        bytes.truncate(at);
    }
    for (r, events) in groups {
        let Some(rs) = link.routes.get(r as usize) else {
            continue;
        };
        if fits {
            lock(&rs.unacked).extend(events);
            continue;
        }
        // Too big for one frame: one event per frame; an event that alone exceeds
        // the limit (or cannot be encoded) is reported failed.
        for ev in events {
            let one = [(r, vec![ev])];
            let at = bytes.len();
            match frame::encode_events(bytes, &one) {
                Ok(()) => {
                    let [(_, mut v)] = one;
                    lock(&rs.unacked).extend(v.drain(..));
                }
                Err(e) => {
                    bytes.truncate(at);
                    let [(_, v)] = one;
                    let stage = t
                        .routes
                        .get(r as usize)
                        .map(|x| x.to.clone())
                        .unwrap_or_default();
                    let err = SendError::Unreachable {
                        stage,
                        reason: e.to_string(),
                    };
                    t.report_failed(r, &err, v).await;
                    rs.in_flight.fetch_sub(1, AcqRel);
                    rs.credit.fetch_add(1, AcqRel);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leda_core::prelude::*;
    use std::sync::atomic::AtomicU64;

    fn route(from: &str, to: &str) -> RouteInfo {
        RouteInfo {
            from: from.into(),
            to: to.into(),
            window: 8,
        }
    }

    /// Two transports over a loopback connection: events reach the destination stage
    /// and are acknowledged; events for a stage the receiver does not run are refused
    /// and reported failed to the sending stage, with the credit window enforced.
    #[test]
    fn delivery_refusal_and_credits_over_a_link() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let routes = vec![route("a", "b"), route("a", "zzz")];
        let sender = Transport::new("s:1", routes.clone(), rt.handle().clone());
        let receiver = Transport::new("r:1", routes, rt.handle().clone());
        let (client, server) = rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let c = TcpStream::connect(addr).await.unwrap();
            let (s, _) = l.accept().await.unwrap();
            (c, s)
        });
        sender.attach("r:1", client);
        receiver.attach("s:1", server);

        let got = Arc::new(AtomicU64::new(0));
        let seen = got.clone();
        let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
            seen.fetch_add(ev.get::<u64>(0)?, Relaxed);
            Ok(())
        });
        let mut rg = Graph::new("r");
        rg.add(&b);
        let rrun = rg.start(Run::default().threads(1)).unwrap();
        receiver.set_handle(rrun.handle());
        let a = Stage::new("a", |_, _| Ok(()));
        let mut sg = Graph::new("s");
        sg.add(&a);
        let srun = sg.start(Run::default().threads(1)).unwrap();
        sender.set_handle(srun.handle());

        let to_b = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
        let to_zzz = sender.sink("a", "zzz", 1, &["r:1".into()]).unwrap();
        for i in 1..=8u64 {
            to_b.send(Event::from(i)).unwrap();
        }
        // The window (8) is used up until the receiver acknowledges.
        let r = to_b.send(Event::from(100u64));
        if let Err(r) = &r {
            assert!(
                matches!(r.error, SendError::QueueFull { .. }),
                "{}",
                r.error
            );
        }
        to_zzz.send(Event::from(5u64)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let want_b = if r.is_ok() { 136 } else { 36 };
        while (got.load(Relaxed) != want_b || sender.counts().failed != 1)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(got.load(Relaxed), want_b);
        let c = sender.counts();
        assert_eq!(c.failed, 1, "{c:?}");
        assert_eq!(c.delivered + c.failed, c.sent);
        assert_eq!(to_b.in_flight() + to_zzz.in_flight(), 0);
        let snap = srun.handle().snapshot();
        assert_eq!(
            snap.stages[0].failed_sends, 1,
            "reported to the sending stage"
        );
        assert_eq!(receiver.counts().accepted, c.delivered);

        srun.handle().quit(());
        rrun.handle().quit(());
        srun.wait().unwrap();
        rrun.wait().unwrap();
        rt.block_on(async {
            sender.close(None).await;
            receiver.close(None).await;
        });
    }
}
