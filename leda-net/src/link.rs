//! The transport of one process: a link per peer process (one TCP connection carrying
//! every connector between the two), credit-based flow control, batching, and the
//! accounting that keeps `sent = delivered + reported failed`.
//!
//! # Sending
//!
//! [`RemoteSink::send`] never blocks: on the sending worker thread, under the link's
//! outbox lock, it takes one credit of the route on a peer (round-robin over the peers
//! of a replicated cluster), encodes the event straight into the open `events` frame
//! of the link's outbound buffer (`wire::EventsFrame`) and keeps the event in
//! the route's *unacknowledged* queue; with no credit anywhere it returns `QueueFull`
//! at once, and [`RemoteSink::room`] gives the core a future that completes when
//! credit returns (a waiting sender retries then, not after a back-off). The link
//! also bounds its unacknowledged *bytes* (`BYTE_WINDOW`), so a
//! receiver that falls behind on large events holds tens of megabytes, not a window of
//! them. Binaries of `SPLICE_MIN` bytes or more are not copied: the buffer keeps a
//! reference and the writer sends them from the event's memory with vectored writes.
//! The first event after a write wakes the link's writer task (one wake-up per batch,
//! not per event); the writer swaps the buffer for an empty one and writes everything
//! that accumulated, so batches grow with the load. No event crosses a channel: the
//! only hand-off between the sending worker and the socket is that wake-up.
//!
//! # Receiving
//!
//! The reader decodes each `events` frame whole into buffers reused from frame to frame
//! (`wire::decode_events_into`; tiny binaries are cut from shared, recycled chunks),
//! then injects each route group as one batch (`ProcessHandle::inject_batch`: one
//! queue lock, at most one wake-up). Events a full destination queue has no room for
//! wait in a per-route pending queue (bounded by the credit window) and are retried,
//! in order; other routes are not held up. Outcomes go back in
//! [`Reply`] frames, in processing order, coalesced: while more bytes are already
//! waiting on the connection they are handled first (up to `REPLY_BATCH` events), and
//! the replies leave as soon as it has nothing more for now. An acknowledgement is only
//! counted by the sender's reader (an atomic per route): the sending worker takes the
//! count in under the outbox lock it holds anyway (credits, byte window, `delivered`)
//! and drops two acknowledged copies per send; the reader drops a chunk when the lock
//! is free, and idle checks drop the rest, so the two never wait for each other. A
//! refusal (unknown stage, run ended, credit exceeded) is
//! reported by the sender through `ProcessHandle::report_failed`, so it reaches the
//! sending stage's `error` port.
//!
//! # Failure
//!
//! When a connection breaks, every event still queued or unacknowledged on it is
//! reported as failed with `SendError::Unreachable`, and later sends to that peer fail
//! at once (or go to a live replica).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::BytesMut;
use leda_core::error::{Rejected, SendError};
use leda_core::event::Event;
use leda_core::runtime::ProcessHandle;
use leda_core::runtime::executor::{RemoteLinks, RemoteSink};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::deploy::RouteInfo;
use crate::error::FrameError;
use crate::frame::{self, Frame, LinkCount, MAX_FRAME, Refusal, Reply, Status};
use crate::wire::{EventsFrame, Outgoing};

/// How long a closing link waits for the peer to finish its side.
const CLOSE_GRACE: Duration = Duration::from_secs(3);
/// Retry period of events waiting for room in a full destination queue.
const RETRY: Duration = Duration::from_micros(200);
/// Read buffer growth step.
const READ_CHUNK: usize = 256 * 1024;
/// An open `events` frame is closed once it reaches this size or holds this many
/// events, so that the receiver can start on a batch while the next one is encoded
/// (a frame is decoded whole before it is delivered).
const FRAME_TARGET: usize = 2 * 1024 * 1024;
/// See [`FRAME_TARGET`].
const FRAME_EVENTS: u32 = 8192;
/// Binaries at least this long are written from the event's own memory rather than
/// copied into the outbound buffer.
const SPLICE_MIN: usize = 512;
/// Copied bytes waiting for the writer beyond which a link refuses more events for
/// now (`QueueFull`): a bound on memory when many large strings are sent (binaries
/// are spliced, not copied); one event larger than this is taken when the backlog is
/// smaller.
const MAX_BACKLOG: usize = 16 * 1024 * 1024;
/// Encoded bytes a link lets be unacknowledged (besides the per-route credits): a
/// receiver that falls behind on large events holds this much, not a whole window of
/// them (32768 events of 64 KiB would be 2 GiB); one event larger than this is taken
/// when less is unacknowledged. (A smaller bound, 4 MiB, made 1 KiB events stall:
/// a sender without credit retries only after the core's 1 ms back-off.)
const BYTE_WINDOW: usize = 32 * 1024 * 1024;
/// Replies (and the credits they return) are held back while more bytes are already
/// there to handle, up to this many events.
const REPLY_BATCH: usize = 4096;
/// Most acknowledged events released under one hold of a link's outbox lock.
const RELEASE_CHUNK: usize = 128;
/// Largest outbound buffer kept between writes.
const KEEP_BUFFER: usize = 32 * 1024 * 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counters of one process' transport.
#[derive(Debug, Default)]
pub struct TransportStats {
    /// Events taken by remote sinks on links replaced since (live links count theirs
    /// under their outbox lock, without an atomic operation per event).
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

/// Flow control and unacknowledged events of one route on one link.
struct RouteOut {
    /// Events this sender may still send before acknowledgements return credit.
    credit: i64,
    /// Events taken and not yet acknowledged or reported failed.
    in_flight: u64,
    /// Events taken and not yet acknowledged, in order (kept for failure reports),
    /// with their encoded sizes; the first `stale` of them were acknowledged and
    /// only wait to be dropped.
    unacked: VecDeque<(Event, u32)>,
    /// Acknowledged events still at the front of `unacked`.
    stale: usize,
    /// The link's acknowledgement count of this route already taken in.
    absorbed: u64,
}

impl RouteOut {
    /// Pops one acknowledged event, if any.
    fn pop_stale(&mut self) -> Option<Event> {
        if self.stale == 0 {
            return None;
        }
        self.stale -= 1;
        self.unacked.pop_front().map(|(ev, _)| ev)
    }
}

/// What a link has to send, under one lock: encoded frames, the open `events` frame,
/// and the per-route state the bytes depend on (so that an event is in its route's
/// unacknowledged queue before its bytes can be written).
struct Outbox {
    /// Frames to write; the open `events` frame, if any, is at its end.
    buf: Outgoing,
    open: Option<EventsFrame>,
    routes: Box<[RouteOut]>,
    /// Encoded bytes of the unacknowledged events, all routes.
    unacked_bytes: usize,
    /// Events taken for the peer (idle detection: counted before the bytes can be
    /// taken by the writer, which takes them under this lock).
    sent: u64,
    /// The writer was woken since it last took the buffer.
    signalled: bool,
    /// The writer is to write what is queued, then close the connection.
    close: bool,
    /// The link is down: nothing more is taken (what was is reported failed).
    down: bool,
}

impl Outbox {
    /// Takes in the acknowledgements the reader counted for `route` since the last
    /// call: credits, in-flight count, byte window and the `delivered` counter are
    /// exact afterwards; the events stay at the front of the queue (`stale`) until
    /// they are popped, a few at a time, by later sends or by the reader. (An
    /// acknowledgement for more than is unacknowledged, from a faulty peer, counts
    /// only what there is.)
    fn absorb(&mut self, route: usize, acked: &AtomicU64, stats: &TransportStats) {
        let Some(rs) = self.routes.get_mut(route) else {
            return;
        };
        let a = acked.load(Acquire);
        if a == rs.absorbed {
            return;
        }
        let k = usize::try_from(a.wrapping_sub(rs.absorbed))
            .unwrap_or(usize::MAX)
            .min(rs.unacked.len() - rs.stale);
        rs.absorbed = a;
        let bytes: usize = rs
            .unacked
            .range(rs.stale..rs.stale + k)
            .map(|e| e.1 as usize)
            .sum();
        rs.stale += k;
        rs.in_flight = rs.in_flight.saturating_sub(k as u64);
        rs.credit += k as i64;
        self.unacked_bytes = self.unacked_bytes.saturating_sub(bytes);
        stats.delivered.fetch_add(k as u64, Relaxed);
    }

    /// [`Outbox::absorb`] for every route.
    fn absorb_all(&mut self, acked: &[AtomicU64], stats: &TransportStats) {
        for (r, a) in acked.iter().enumerate() {
            self.absorb(r, a, stats);
        }
    }

    /// Pops up to `max` acknowledged events (all routes) into `out`.
    fn pop_stale(&mut self, mut max: usize, out: &mut Vec<Event>) {
        for rs in self.routes.iter_mut() {
            let n = rs.stale.min(max);
            out.extend(rs.unacked.drain(..n).map(|(ev, _)| ev));
            rs.stale -= n;
            max -= n;
        }
    }

    /// `true` if an event of `route` may be taken now: the route has credit (the
    /// receiver's queue bounds it), and neither the copied bytes waiting for the
    /// writer nor the unacknowledged bytes are at their bounds.
    fn has_room(&self, route: usize) -> bool {
        self.buf.bytes.len() < MAX_BACKLOG
            && self.unacked_bytes < BYTE_WINDOW
            && self.routes.get(route).is_some_and(|rs| rs.credit > 0)
    }

    /// Marks that there is something to write; `true` if the writer must be woken.
    fn signal(&mut self) -> bool {
        !std::mem::replace(&mut self.signalled, true)
    }

    /// Closes the open `events` frame (an empty one is removed).
    fn close_open(&mut self) {
        if let Some(f) = self.open.take() {
            if f.is_empty() {
                self.buf.bytes.truncate(f.start());
            } else {
                f.close(&mut self.buf);
            }
        }
    }

    /// Encodes `ev` into the open `events` frame (opening one as needed).
    fn push_event(&mut self, route: u32, ev: &Event) -> Result<(), String> {
        let mut f = match self.open.take() {
            Some(f) if f.size(&self.buf) < FRAME_TARGET && f.events() < FRAME_EVENTS => f,
            Some(f) => {
                f.close(&mut self.buf);
                EventsFrame::open(&mut self.buf)
            }
            None => EventsFrame::open(&mut self.buf),
        };
        let mut r = f.push(&mut self.buf, route, ev);
        if r.is_err() && !f.is_empty() {
            // Perhaps too big only together with the others: alone in a new frame.
            f.close(&mut self.buf);
            f = EventsFrame::open(&mut self.buf);
            r = f.push(&mut self.buf, route, ev);
        }
        self.open = Some(f);
        r
    }

    /// Appends a control frame.
    fn push_frame(&mut self, f: &Frame, peer: &str) {
        self.close_open();
        if let Err(e) = frame::encode_into(&mut self.buf.bytes, f) {
            tracing::error!(peer, error = %e, "cannot encode a control frame");
        }
    }

    /// Hands everything queued to the writer (swapped with `spare`, which must be
    /// empty); returns whether the writer is to close after writing it.
    fn take(&mut self, spare: &mut Outgoing) -> bool {
        self.close_open();
        std::mem::swap(&mut self.buf, spare);
        self.signalled = false;
        self.close
    }
}

/// The connection to one peer process.
pub(crate) struct Link {
    peer: String,
    outbox: Mutex<Outbox>,
    /// Wakes the writer task.
    wake: Notify,
    /// Events acknowledged by the peer, per route, counted by the reader (taken in by
    /// [`Outbox::absorb`] under the outbox lock, which the reader does not wait for).
    acked: Box<[AtomicU64]>,
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

    /// Queues a control frame (dropped once the link is down).
    pub(crate) fn send_frame(&self, f: Frame) {
        let mut ob = lock(&self.outbox);
        if ob.down || ob.close {
            return;
        }
        ob.push_frame(&f, &self.peer);
        let wake = ob.signal();
        drop(ob);
        if wake {
            self.wake.notify_one();
        }
    }

    /// Asks the writer to write what is queued, then close the connection.
    fn close(&self) {
        let mut ob = lock(&self.outbox);
        ob.close = true;
        let wake = ob.signal();
        drop(ob);
        if wake {
            self.wake.notify_one();
        }
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
    /// Links replaced by a newer one to the same peer (kept for their counters).
    retired: Mutex<Vec<Arc<Link>>>,
    /// Wakes senders waiting for room ([`RemoteSink::room`]): credit returned, or a
    /// backlog written.
    room: Arc<Notify>,
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
            retired: Mutex::new(Vec::new()),
            room: Arc::new(Notify::new()),
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
        let mut sent = self.stats.sent.load(Relaxed);
        for l in self.links().iter().chain(lock(&self.retired).iter()) {
            let mut ob = lock(&l.outbox);
            ob.absorb_all(&l.acked, &self.stats);
            sent += ob.sent;
        }
        TransportCounts {
            sent,
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
                sent: lock(&l.outbox).sent,
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
            l.close();
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
        let link = Arc::new(Link {
            peer: peer.into(),
            outbox: Mutex::new(Outbox {
                buf: Outgoing::new(SPLICE_MIN, FRAME_TARGET),
                open: None,
                routes: self
                    .routes
                    .iter()
                    .map(|r| RouteOut {
                        credit: r.window.into(),
                        in_flight: 0,
                        unacked: VecDeque::new(),
                        stale: 0,
                        absorbed: 0,
                    })
                    .collect(),
                unacked_bytes: 0,
                sent: 0,
                signalled: false,
                close: false,
                down: false,
            }),
            wake: Notify::new(),
            acked: self.routes.iter().map(|_| AtomicU64::new(0)).collect(),
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
            lock(&self.retired).push(old);
        }
        let (rd, wr) = stream.into_split();
        let reader = self.rt.spawn(read_loop(self.clone(), link.clone(), rd));
        let writer = self
            .rt
            .spawn(write_loop(self.clone(), link.clone(), wr, reader));
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
            room: self.room.clone(),
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
    room: Arc<Notify>,
    route: u32,
    to: String,
    peers: Vec<Arc<Link>>,
    next: AtomicUsize,
}

impl RemoteSink for Sink {
    fn send(&self, event: Event) -> Result<(), Rejected> {
        let n = self.peers.len();
        let start = if n == 1 {
            0
        } else {
            self.next.fetch_add(1, Relaxed) % n
        };
        let route = self.route as usize;
        let mut all_dead = true;
        // Acknowledged events this send pops (two at most: the queue shrinks while
        // sends go on), dropped once the lock is released.
        let mut released: [Option<Event>; 2] = [None, None];
        for k in 0..n {
            let link = &self.peers[(start + k) % n];
            if link.is_dead() {
                continue;
            }
            let mut ob = lock(&link.outbox);
            if ob.down {
                continue;
            }
            all_dead = false;
            if let Some(acked) = link.acked.get(route) {
                ob.absorb(route, acked, &self.stats);
                if let Some(rs) = ob.routes.get_mut(route)
                    && rs.stale > 0
                    && released[0].is_none()
                {
                    released = [rs.pop_stale(), rs.pop_stale()];
                }
            }
            if !ob.has_room(route) {
                continue;
            }
            let before = ob.buf.len();
            if let Err(reason) = ob.push_event(self.route, &event) {
                let error = SendError::Unreachable {
                    stage: self.to.clone(),
                    reason,
                };
                return Err(Rejected { error, event });
            }
            // Counted before the bytes can be taken by the writer (it takes them under
            // this lock), so that no status ever shows it received and not sent.
            ob.sent += 1;
            let size = ob.buf.len().saturating_sub(before);
            ob.unacked_bytes += size;
            let rs = &mut ob.routes[route];
            rs.credit -= 1;
            rs.in_flight += 1;
            rs.unacked
                .push_back((event, u32::try_from(size).unwrap_or(u32::MAX)));
            let wake = ob.signal();
            drop(ob);
            drop(released);
            if wake {
                link.wake.notify_one();
            }
            return Ok(());
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

    fn room(&self) -> Option<leda_core::runtime::executor::BoxFuture<()>> {
        let (room, peers, stats) = (self.room.clone(), self.peers.clone(), self.stats.clone());
        let route = self.route as usize;
        Some(Box::pin(async move {
            // Registered before the check: room made after it wakes this wait.
            let notified = room.notified();
            for l in &peers {
                let mut ob = lock(&l.outbox);
                if ob.down {
                    continue;
                }
                if let Some(acked) = l.acked.get(route) {
                    ob.absorb(route, acked, &stats);
                }
                if ob.has_room(route) {
                    return;
                }
            }
            if peers.iter().all(|l| l.is_dead()) {
                return; // the retry fails at once, with the reason
            }
            notified.await;
        }))
    }

    fn in_flight(&self) -> u64 {
        let route = self.route as usize;
        let mut released = Vec::new();
        let mut n = 0;
        for l in &self.peers {
            let mut ob = lock(&l.outbox);
            if let Some(acked) = l.acked.get(route) {
                ob.absorb(route, acked, &self.stats);
            }
            // Asked when the process may be idle: nothing acknowledged is kept.
            ob.pop_stale(usize::MAX, &mut released);
            n += ob.routes.get(route).map_or(0, |r| r.in_flight);
            drop(ob);
            released.clear();
        }
        n
    }
}

fn push_reply(replies: &mut Vec<Reply>, route: u32, refused: Option<Refusal>) {
    push_replies(replies, route, refused, 1);
}

/// Appends the outcome of `n` events of `route` (merged with the last reply when it
/// is the same outcome).
fn push_replies(replies: &mut Vec<Reply>, route: u32, refused: Option<Refusal>, mut n: usize) {
    if let Some(last) = replies.last_mut()
        && last.route == route
        && last.refused == refused
    {
        let k = n.min((u32::MAX - last.count) as usize);
        last.count += k as u32;
        n -= k;
    }
    while n > 0 {
        let k = n.min(u32::MAX as usize);
        replies.push(Reply {
            route,
            count: k as u32,
            refused: refused.clone(),
        });
        n -= k;
    }
}

struct Inbound {
    pending: HashMap<u32, VecDeque<Event>>,
    /// Events in `pending`, all routes.
    pending_total: usize,
    replies: Vec<Reply>,
    /// Events accepted since the transport's counter was last updated.
    accepted: u64,
    /// Acknowledged events popped from an outbox, dropped outside its lock.
    acked: Vec<Event>,
    /// Decoded `events` frames, reused from frame to frame: `(route, count)` per group
    /// and the events of all groups in order.
    groups: Vec<(u32, usize)>,
    events: Vec<Event>,
    /// The events of one group of a frame with several (reused).
    batch: Vec<Event>,
    /// The chunks small binaries are decoded into.
    arena: crate::wire::Arena,
}

impl Inbound {
    fn pending_len(&self) -> usize {
        self.pending_total
    }

    /// Publishes the accepted count (before the replies that acknowledge them).
    fn publish_accepted(&mut self, t: &Transport) {
        if self.accepted > 0 {
            t.stats
                .accepted
                .fetch_add(std::mem::take(&mut self.accepted), Relaxed);
        }
    }

    /// Injects the events of one group of `route` (in order behind any pending ones),
    /// as a batch: one queue lock and at most one wake-up for all that fit. `evs` is
    /// left empty.
    fn deliver_group(
        &mut self,
        t: &Transport,
        h: &ProcessHandle,
        dest: usize,
        route: u32,
        evs: &mut Vec<Event>,
    ) {
        if self.pending_total > 0 && self.pending.get(&route).is_some_and(|q| !q.is_empty()) {
            for ev in evs.drain(..) {
                self.deliver(t, h, dest, route, ev);
            }
            return;
        }
        let total = evs.len();
        match h.inject_batch(dest, evs) {
            Ok(n) => {
                self.accepted += n as u64;
                push_replies(&mut self.replies, route, None, n);
                if !evs.is_empty() {
                    // The rest waits for room, in order.
                    let k = evs.len();
                    self.pending.entry(route).or_default().extend(evs.drain(..));
                    self.pending_total += k;
                    t.pending_inbound.fetch_add(k as u64, Relaxed);
                }
            }
            Err(SendError::Stopped) => {
                evs.clear();
                push_replies(&mut self.replies, route, Some(Refusal::Stopped), total);
            }
            Err(e) => {
                evs.clear();
                let why = Refusal::UnknownStage(e.to_string());
                push_replies(&mut self.replies, route, Some(why), total);
            }
        }
    }

    /// Injects one event of `route` (in order behind any pending ones).
    fn deliver(&mut self, t: &Transport, h: &ProcessHandle, dest: usize, route: u32, ev: Event) {
        if self.pending_total > 0
            && let Some(q) = self.pending.get_mut(&route)
            && !q.is_empty()
        {
            let window = t.routes.get(route as usize).map_or(1, |r| r.window) as usize;
            if q.len() >= window {
                push_reply(&mut self.replies, route, Some(Refusal::QueueFull));
            } else {
                q.push_back(ev);
                self.pending_total += 1;
                t.pending_inbound.fetch_add(1, Relaxed);
            }
            return;
        }
        match h.inject(dest, ev) {
            Ok(()) => {
                self.accepted += 1;
                push_reply(&mut self.replies, route, None);
            }
            Err(Rejected {
                error: SendError::QueueFull { .. },
                event,
            }) => {
                self.pending.entry(route).or_default().push_back(event);
                self.pending_total += 1;
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
                        self.pending_total -= 1;
                        t.pending_inbound.fetch_sub(1, Relaxed);
                        self.accepted += 1;
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
                        self.pending_total -= 1;
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
        let n = std::mem::take(&mut self.pending_total) as u64;
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
        pending_total: 0,
        replies: Vec::new(),
        accepted: 0,
        acked: Vec::new(),
        groups: Vec::new(),
        events: Vec::new(),
        batch: Vec::new(),
        arena: crate::wire::Arena::default(),
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
            let ok = if raw[4] == frame::kind::EVENTS {
                // Nearly all the traffic: decoded into reused buffers (a frame is
                // decoded whole before any of it is delivered).
                let body = raw.slice(5..);
                let mut groups = std::mem::take(&mut inb.groups);
                let mut events = std::mem::take(&mut inb.events);
                let ok = match crate::wire::decode_events_into(
                    &body,
                    Some(&body),
                    &mut inb.arena,
                    &mut groups,
                    &mut events,
                ) {
                    Ok(()) => {
                        deliver_events(&t, &link, &mut inb, &mut ready, &groups, &mut events).await
                    }
                    Err(reason) => {
                        let e = FrameError::Malformed {
                            kind: frame::kind_name(frame::kind::EVENTS),
                            reason,
                        };
                        tracing::warn!(peer = %link.peer, error = %e, "bad frame; closing the link");
                        false
                    }
                };
                events.clear();
                inb.groups = groups;
                inb.events = events;
                ok
            } else {
                match frame::decode_shared(raw.slice(4..)) {
                    Ok(f) => handle_frame(&t, &link, &mut inb, &mut ready, f).await,
                    Err(e) => {
                        tracing::warn!(peer = %link.peer, error = %e, "bad frame; closing the link");
                        false
                    }
                }
            };
            if !ok {
                break 'conn;
            }
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(READ_CHUNK);
        }
        // Replies (credits) are coalesced: while more bytes are already there, they
        // are handled first and the replies held back, up to `REPLY_BATCH` events;
        // they leave as soon as the connection has nothing more for now.
        let held: usize = inb.replies.iter().map(|r| r.count as usize).sum();
        if held < REPLY_BATCH && inb.pending_len() == 0 {
            match rd.try_read_buf(&mut buf) {
                Ok(0) => {
                    if buf.is_empty() {
                        tracing::debug!(peer = %link.peer, "peer closed the link");
                    } else {
                        tracing::warn!(peer = %link.peer, bytes = buf.len(), "peer closed the link inside a frame");
                    }
                    break;
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    tracing::warn!(peer = %link.peer, error = %e, "link read failed; closing it");
                    break;
                }
            }
        }
        inb.publish_accepted(&t);
        if !inb.replies.is_empty() {
            link.send_frame(Frame::Replies(std::mem::take(&mut inb.replies)));
            // Let the writer send them now: on a busy connection the next read is
            // ready at once, and the writer may share this thread.
            tokio::task::yield_now().await;
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
                inb.publish_accepted(&t);
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
    inb.publish_accepted(&t);
    if !inb.replies.is_empty() {
        link.send_frame(Frame::Replies(std::mem::take(&mut inb.replies)));
    }
    // Let the writer finish what is queued (replies included), then close.
    link.close();
}

/// Delivers the events of one `events` frame (`(route, count)` per group, events of
/// all groups in order) to their destination stages, in order per route; `false`
/// closes the link.
async fn deliver_events(
    t: &Arc<Transport>,
    link: &Arc<Link>,
    inb: &mut Inbound,
    ready: &mut Option<(ProcessHandle, Arc<RouteIndexes>)>,
    groups: &[(u32, usize)],
    events: &mut Vec<Event>,
) -> bool {
    if ready.is_none() {
        *ready = t.handle().await;
    }
    let Some((h, idx)) = ready.as_ref() else {
        return false;
    };
    if let [(route, n)] = *groups
        && let Some(dest) = idx.to.get(route as usize).copied().flatten()
    {
        // One group (the usual case): its events are the whole list.
        inb.deliver_group(t, h, dest, route, events);
        // Counted once the events are queued, pending (not quiescent) or refused,
        // never before.
        link.received.fetch_add(n as u64, AcqRel);
        return true;
    }
    let mut batch = std::mem::take(&mut inb.batch);
    let mut events = events.drain(..);
    for &(route, n) in groups {
        match idx.to.get(route as usize).copied().flatten() {
            Some(dest) => {
                batch.extend(events.by_ref().take(n));
                inb.deliver_group(t, h, dest, route, &mut batch);
            }
            None => {
                let why = Refusal::UnknownStage(format!(
                    "{} runs no destination for route {route}",
                    t.me
                ));
                for _ in events.by_ref().take(n) {
                    push_reply(&mut inb.replies, route, Some(why.clone()));
                }
            }
        }
        // Counted once the events are queued, pending (not quiescent) or refused,
        // never before.
        link.received.fetch_add(n as u64, AcqRel);
    }
    inb.batch = batch;
    true
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
            let mut counts = Vec::with_capacity(groups.len());
            let mut events = Vec::new();
            for (route, evs) in groups {
                counts.push((route, evs.len()));
                events.extend(evs);
            }
            return deliver_events(t, link, inb, ready, &counts, &mut events).await;
        }
        Frame::Replies(replies) => {
            for r in replies {
                let route = r.route as usize;
                if route >= t.routes.len() {
                    tracing::warn!(peer = %link.peer, route = r.route, "reply for an unknown route");
                    return false;
                }
                let Some(why) = &r.refused else {
                    // Acknowledged: only counted here; the sending worker takes the
                    // count in (credits) and drops the events a few at a time, and
                    // this reader does when the lock is free (below), so the two
                    // never wait for each other.
                    link.acked[route].fetch_add(r.count.into(), Release);
                    continue;
                };
                // Refused: the acknowledgements before it are taken in, then the
                // refused events popped and reported (outside the lock) before their
                // in-flight count is released, so that idle detection never sees
                // neither.
                let popped: Vec<Event> = {
                    let mut ob = lock(&link.outbox);
                    ob.absorb(route, &link.acked[route], &t.stats);
                    let rs = &mut ob.routes[route];
                    let stale = std::mem::take(&mut rs.stale);
                    inb.acked
                        .extend(rs.unacked.drain(..stale).map(|(ev, _)| ev));
                    let n = (r.count as usize).min(rs.unacked.len());
                    let mut bytes = 0usize;
                    let popped = rs
                        .unacked
                        .drain(..n)
                        .map(|(ev, size)| {
                            bytes += size as usize;
                            ev
                        })
                        .collect();
                    ob.unacked_bytes = ob.unacked_bytes.saturating_sub(bytes);
                    popped
                };
                inb.acked.clear();
                let n = popped.len();
                if n < r.count as usize {
                    tracing::warn!(peer = %link.peer, "reply for more events than were sent");
                }
                let err = t.refusal_error(r.route, &link.peer, why);
                t.report_failed(r.route, &err, popped).await;
                let mut ob = lock(&link.outbox);
                let rs = &mut ob.routes[route];
                rs.in_flight -= n as u64;
                rs.credit += n as i64;
            }
            // Senders waiting for credit retry now.
            t.room.notify_waiters();
            // Acknowledged events are dropped here if the sending worker is not
            // holding the lock (a short hold; they are dropped outside it), so that a
            // sender gone quiet does not keep them.
            if let Ok(mut ob) = link.outbox.try_lock() {
                ob.absorb_all(&link.acked, &t.stats);
                ob.pop_stale(RELEASE_CHUNK, &mut inb.acked);
                drop(ob);
                inb.acked.clear();
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

/// Writes `out`: one plain write without spliced binaries, vectored writes with them.
async fn write_out(
    wr: &mut tokio::net::tcp::OwnedWriteHalf,
    out: &Outgoing,
) -> std::io::Result<()> {
    if out.splices.is_empty() {
        return wr.write_all(&out.bytes).await;
    }
    /// Slices per vectored write (well under `IOV_MAX`).
    const IOV: usize = 1024;
    let segs = out.segments();
    let (mut i, mut skip) = (0, 0);
    let mut iov: Vec<std::io::IoSlice<'_>> = Vec::with_capacity(IOV);
    while i < segs.len() {
        iov.clear();
        iov.push(std::io::IoSlice::new(&segs[i][skip..]));
        iov.extend(
            segs[i + 1..]
                .iter()
                .take(IOV - 1)
                .map(|s| std::io::IoSlice::new(s)),
        );
        let mut n = wr.write_vectored(&iov).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && i < segs.len() {
            let left = segs[i].len() - skip;
            if n >= left {
                n -= left;
                i += 1;
                skip = 0;
            } else {
                skip += n;
                n = 0;
            }
        }
    }
    Ok(())
}

async fn write_loop(
    t: Arc<Transport>,
    link: Arc<Link>,
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    mut reader: JoinHandle<()>,
) {
    // Swapped with the outbox's buffer: one is filled by senders while the other is
    // written.
    let mut bytes = Outgoing::new(SPLICE_MIN, FRAME_TARGET);
    let mut clean = false;
    loop {
        tokio::select! {
            biased;
            _ = link.dead_notify.notified() => break,
            _ = link.wake.notified() => {}
        }
        let close = lock(&link.outbox).take(&mut bytes);
        if bytes.bytes.len() >= MAX_BACKLOG {
            // Senders refused for the backlog may go on.
            t.room.notify_waiters();
        }
        if !bytes.is_empty() {
            if let Err(e) = write_out(&mut wr, &bytes).await {
                tracing::warn!(peer = %link.peer, error = %e, "link write failed");
                break;
            }
            if bytes.bytes.capacity() > KEEP_BUFFER {
                // A very large batch or event passed: do not keep its buffer.
                bytes = Outgoing::new(SPLICE_MIN, FRAME_TARGET);
            } else {
                // Kept (and swapped back in): no allocation or page fault per batch.
                bytes.clear();
            }
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
    // Everything still queued or unacknowledged on this link is lost; nothing more is
    // taken (senders see `down` under the same lock).
    let lost: Vec<(usize, Vec<Event>)> = {
        let mut ob = lock(&link.outbox);
        ob.down = true;
        ob.open = None;
        ob.buf = Outgoing::default();
        // (Events acknowledged before the end were delivered: not lost.)
        ob.absorb_all(&link.acked, &t.stats);
        ob.unacked_bytes = 0;
        ob.routes
            .iter_mut()
            .enumerate()
            .filter(|(_, rs)| rs.unacked.len() > rs.stale)
            .map(|(r, rs)| {
                let stale = std::mem::take(&mut rs.stale);
                rs.unacked.drain(..stale);
                (r, rs.unacked.drain(..).map(|(ev, _)| ev).collect())
            })
            .collect()
    };
    // Senders waiting for room on this link retry (and go elsewhere, or fail).
    t.room.notify_waiters();
    for (r, evs) in lost {
        let n = evs.len() as u64;
        let stage = t.routes.get(r).map(|x| x.to.clone()).unwrap_or_default();
        let err = SendError::Unreachable {
            stage,
            reason: format!("the connection to {} was lost", link.peer),
        };
        tracing::warn!(peer = %link.peer, events = n, "events lost with the connection");
        t.report_failed(r as u32, &err, evs).await;
        lock(&link.outbox).routes[r].in_flight -= n;
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

#[cfg(test)]
mod tests {
    use super::*;
    use leda_core::prelude::*;
    use leda_core::runtime::Running;
    use std::sync::atomic::AtomicU64;

    fn route(from: &str, to: &str) -> RouteInfo {
        RouteInfo {
            from: from.into(),
            to: to.into(),
            window: 8,
        }
    }

    /// A sender (`s:1`) and a receiver (`r:1`) transport for `routes`, joined by one
    /// loopback connection, on a one-thread runtime.
    fn linked_pair(
        routes: Vec<RouteInfo>,
    ) -> (tokio::runtime::Runtime, Arc<Transport>, Arc<Transport>) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
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
        (rt, sender, receiver)
    }

    /// Runs the receiving stage `b` behind `receiver` and a sending stage `a` behind
    /// `sender`, one worker each; returns the sender's run and the receiver's.
    fn start_runs(sender: &Transport, receiver: &Transport, b: &Stage) -> (Running, Running) {
        let mut rg = Graph::new("r");
        rg.add(b);
        let rrun = rg.start(Run::default().threads(1)).unwrap();
        receiver.set_handle(rrun.handle());
        let a = Stage::new("a", |_, _| Ok(()));
        let mut sg = Graph::new("s");
        sg.add(&a);
        let srun = sg.start(Run::default().threads(1)).unwrap();
        sender.set_handle(srun.handle());
        (srun, rrun)
    }

    /// Ends both runs and closes both transports.
    fn shut_down(
        rt: &tokio::runtime::Runtime,
        sender: &Transport,
        receiver: &Transport,
        srun: Running,
        rrun: Running,
    ) {
        srun.handle().quit(());
        rrun.handle().quit(());
        srun.wait().unwrap();
        rrun.wait().unwrap();
        rt.block_on(async {
            sender.close(None).await;
            receiver.close(None).await;
        });
    }

    /// Two transports over a loopback connection: events reach the destination stage
    /// and are acknowledged; events for a stage the receiver does not run are refused
    /// and reported failed to the sending stage, with the credit window enforced.
    #[test]
    fn delivery_refusal_and_credits_over_a_link() {
        let (rt, sender, receiver) = linked_pair(vec![route("a", "b"), route("a", "zzz")]);

        let got = Arc::new(AtomicU64::new(0));
        let seen = got.clone();
        let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
            seen.fetch_add(ev.get::<u64>(0)?, Relaxed);
            Ok(())
        });
        let (srun, rrun) = start_runs(&sender, &receiver, &b);

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

        shut_down(&rt, &sender, &receiver, srun, rrun);
    }

    /// Large binaries (spliced into vectored writes, not copied), strings and small
    /// values cross a link intact and in order, over many batches, with credits and
    /// the byte window returning as acknowledgements come back.
    #[test]
    fn mixed_payloads_arrive_intact_and_in_order() {
        let (rt, sender, receiver) = linked_pair(vec![RouteInfo {
            from: "a".into(),
            to: "b".into(),
            window: 64,
        }]);

        const N: u64 = 600;
        // Event i: (i, binary of a size cycling through small, spliced and large
        // ones, each byte = i mod 251, a string).
        let size =
            |i: u64| [0usize, 16, SPLICE_MIN, 1000, 70_000, 1024 * 1024 + 7][(i % 6) as usize];
        let bad = Arc::new(AtomicU64::new(0));
        let next = Arc::new(AtomicU64::new(0));
        let (b2, n2) = (bad.clone(), next.clone());
        let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
            let i: u64 = ev.get(0)?;
            let bin = ev.arg(1).and_then(Value::as_bytes).map(|b| b.to_vec());
            let s: String = ev.get(2)?;
            let ok = n2.fetch_add(1, Relaxed) == i
                && bin.is_some_and(|b| {
                    b.len() == size(i) && b.iter().all(|&x| u64::from(x) == i % 251)
                })
                && s == format!("event {i}");
            if !ok {
                b2.fetch_add(1, Relaxed);
            }
            Ok(())
        })
        .serial();
        let (srun, rrun) = start_runs(&sender, &receiver, &b);

        let to_b = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        for i in 0..N {
            let bin = bytes::Bytes::from(vec![(i % 251) as u8; size(i)]);
            let mut ev = Event::from((i as i64, Value::Bytes(bin), format!("event {i}")));
            loop {
                match to_b.send(ev) {
                    Ok(()) => break,
                    Err(r) => {
                        assert!(
                            matches!(r.error, SendError::QueueFull { .. }),
                            "{}",
                            r.error
                        );
                        assert!(
                            std::time::Instant::now() < deadline,
                            "credits never came back"
                        );
                        ev = r.event;
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            }
        }
        while next.load(Relaxed) < N && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(next.load(Relaxed), N);
        assert_eq!(bad.load(Relaxed), 0, "every event intact and in order");
        while to_b.in_flight() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let c = sender.counts();
        assert_eq!((c.sent, c.delivered, c.failed), (N, N, 0));
        assert_eq!(lock(&sender.links()[0].outbox).unacked_bytes, 0);

        shut_down(&rt, &sender, &receiver, srun, rrun);
    }

    /// A receiving stage with less room than a frame holds: each frame is queued as
    /// far as it fits (one batch), the rest waits and is retried, in order; the
    /// sender's acknowledged events are released and its counters settle, and a
    /// sender out of credit is woken by [`RemoteSink::room`] when credit returns.
    #[test]
    fn partial_batches_keep_order_and_credit_wakes_the_sender() {
        let (rt, sender, receiver) = linked_pair(vec![RouteInfo {
            from: "a".into(),
            to: "b".into(),
            window: 256,
        }]);
        const N: u64 = 5000;
        let next = Arc::new(AtomicU64::new(0));
        let bad = Arc::new(AtomicU64::new(0));
        let (n2, b2) = (next.clone(), bad.clone());
        let b = Stage::new("b", move |ev: Event, _: &mut Ctx| {
            let i: u64 = ev.get(0)?;
            let bin = ev.arg(1).and_then(Value::as_bytes).map(|b| b.to_vec());
            if n2.fetch_add(1, Relaxed) != i || bin != Some(vec![(i % 251) as u8; 16]) {
                b2.fetch_add(1, Relaxed);
            }
            Ok(())
        })
        .serial()
        .capacity(10);
        let (srun, rrun) = start_runs(&sender, &receiver, &b);

        let to_b = sender.sink("a", "b", 1, &["r:1".into()]).unwrap();
        let mut waits = 0;
        for i in 0..N {
            let bin = bytes::Bytes::from(vec![(i % 251) as u8; 16]);
            let mut ev = Event::from((i as i64, Value::Bytes(bin)));
            loop {
                match to_b.send(ev) {
                    Ok(()) => break,
                    Err(r) => {
                        assert!(
                            matches!(r.error, SendError::QueueFull { .. }),
                            "{}",
                            r.error
                        );
                        ev = r.event;
                        // Completes once credit is back (no back-off here): a lost
                        // wake-up would hang, hence the generous bound.
                        let room = to_b.room().expect("leda-net signals room");
                        rt.block_on(async {
                            tokio::time::timeout(Duration::from_secs(20), room).await
                        })
                        .expect("woken when credit returned");
                        waits += 1;
                    }
                }
            }
        }
        assert!(waits > 0, "the window (256) ran out at least once");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while (next.load(Relaxed) < N || to_b.in_flight() > 0)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(next.load(Relaxed), N);
        assert_eq!(bad.load(Relaxed), 0, "every event intact and in order");
        let c = sender.counts();
        assert_eq!((c.sent, c.delivered, c.failed), (N, N, 0));
        assert_eq!(receiver.counts().accepted, N);
        {
            let link = &sender.links()[0];
            let ob = lock(&link.outbox);
            assert_eq!(ob.unacked_bytes, 0);
            assert!(
                ob.routes[0].unacked.is_empty(),
                "acknowledged events released"
            );
            assert_eq!(ob.routes[0].credit, 256, "every credit back");
        }

        shut_down(&rt, &sender, &receiver, srun, rrun);
    }
}
