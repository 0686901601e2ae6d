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
//! reference and they are sent from the event's memory with vectored writes.
//!
//! **Who writes.** An event sent from a running task is held until the task's batch
//! ends ([`RemoteSink::send_held`], [`RemoteSink::flush`]; `HOLD_MAX` bytes at most):
//! then the sending worker swaps the buffer for an empty one and writes it itself
//! without waiting (plain TCP, through a second descriptor of the socket), unless
//! someone writes already (the `writing` flag, under the outbox lock; whoever writes
//! looks again when done). What the socket does not take at once goes to the link's
//! writer task, as does everything under TLS and sends from outside a task (the first
//! event after a write wakes it: one wake-up per batch). So on the common path no
//! thread hand-off separates a handler's send from the socket.
//!
//! # Receiving
//!
//! The reader decodes each `events` frame whole into buffers reused from frame to frame
//! (`wire::decode_events_into`; tiny binaries are cut from shared, recycled chunks),
//! then injects each route group as one batch (`ProcessHandle::inject_batch_here`: one
//! queue lock). An activation the batch claims for a stage declared `nonblocking` with
//! short work (its average call times its queued events under 50 µs) is not handed to
//! the pool: once the frames at hand are delivered and their replies queued, and the
//! connection has nothing more to read, the reader runs it itself (`Claimed::run`), so
//! a round trip through an echo stage costs each process one wake-up (its reader's),
//! not two; its answer carries the replies just queued. Other stages, longer work, and
//! work claimed while bytes keep coming go to the pool at once. Events a full
//! destination queue has no room for wait in a per-route pending queue (bounded by the
//! credit window) and are retried, in order; other routes are not held up. Outcomes go
//! back in [`Reply`] frames, in processing order, coalesced: while more bytes are already
//! waiting on the connection they are handled first (up to `REPLY_BATCH` events).
//! Plain acknowledgements then wait up to `ACK_DELAY` on the link for a write of
//! events to carry them (an echo's answer: one wake-up of the peer per round trip, not
//! two); refusals, and acknowledgements worth a quarter of a credit or byte window, are
//! written at once. An acknowledgement is only
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

/// [`Link::heard_ms`] while the reader runs handlers itself: whatever the peer sends
/// meanwhile waits in the socket, so its silence is not counted (the liveness watch
/// reads no silence from it).
const NOT_LISTENING: u64 = u64::MAX;

mod loss;
pub(crate) mod memory;
mod outbox;
mod reader;
mod sink;
#[cfg(test)]
mod tests;
mod writer;

pub(crate) use loss::Topology;
pub use loss::{Liveness, OnProcessLoss, ProcessLost};
pub use memory::{
    MemoryOffer, MemoryOk, PeerMemory, peer_memory, peer_memory_read, set_peer_memory,
};
use outbox::{Outbox, RouteOut};
use reader::read_loop;
use sink::Sink;
use writer::write_loop;

use crossbeam_utils::CachePadded;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::BytesMut;
use leda_core::error::{Rejected, SendError};
use leda_core::event::Event;
use leda_core::runtime::executor::{RemoteLinks, RemoteSink};
use leda_core::runtime::{Claimed, ProcessHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::deploy::RouteInfo;
use crate::error::FrameError;
use crate::frame::{self, Frame, LinkCount, MAX_FRAME, Refusal, Reply, Status};
use crate::wire::{EventsFrame, Outgoing};
pub use leda_core::stats::RouteCounts;

/// How long a closing link waits for the peer to finish its side.
const CLOSE_GRACE: Duration = Duration::from_secs(3);
/// How long a link that ended by an error waits for its reader to read what a peer
/// that had shut its side sent before (its `Quit`, perhaps: see `shut_before_close`).
const SHUT_DRAIN: Duration = Duration::from_millis(500);
/// Retry period of events waiting for room in a full destination queue.
const RETRY: Duration = Duration::from_micros(200);
/// Read buffer growth step.
const READ_CHUNK: usize = 256 * 1024;
/// Frames larger than this are read into a buffer of their own, allocated once.
const BIG_FRAME: usize = 1024 * 1024;
/// An open `events` frame is closed once it reaches this size or holds this many
/// events, so that the receiver can start on a batch while the next one is encoded
/// (a frame is decoded whole before it is delivered).
const FRAME_TARGET: usize = 2 * 1024 * 1024;
/// See [`FRAME_TARGET`].
const FRAME_EVENTS: u32 = 8192;
const _: () = assert!(FRAME_EVENTS as usize <= crate::wire::MAX_FRAME_EVENTS);
/// Binaries at least this long are written from the event's own memory rather than
/// copied into the outbound buffer.
const SPLICE_MIN: usize = 512;
/// Copied bytes waiting for the writer beyond which a link refuses more events for
/// now (`QueueFull`): a bound on memory when many large strings are sent (binaries
/// are spliced, not copied); one event larger than this is taken when the backlog is
/// smaller.
const MAX_BACKLOG: usize = 16 * 1024 * 1024;

/// The most bytes of events from other processes that one stage of this process has
/// queued, as estimated from the frames they came in: past it, what arrives waits
/// unacknowledged (the sender's credit and byte window then stop it), as when the
/// queue is full. A queue's bound is in events (`capacity`, 65,536 by default): with
/// events of a megabyte, a sender filled a daemon with 6 GB in 14 s (a review,
/// 2026-11-27).
pub const MAX_QUEUED_BYTES: usize = 256 * 1024 * 1024;
/// Encoded bytes a link lets be unacknowledged (besides the per-route credits): a
/// receiver that falls behind on large events holds this much, not a whole window of
/// them (32768 events of 64 KiB would be 2 GiB); one event larger than this is taken
/// when less is unacknowledged. (A smaller bound, 4 MiB, made 1 KiB events stall:
/// a sender without credit retries only after the core's 1 ms back-off.)
const BYTE_WINDOW: usize = 32 * 1024 * 1024;
/// Replies (and the credits they return) are held back while more bytes are already
/// there to handle, up to this many events.
const REPLY_BATCH: usize = 4096;
/// How long acknowledgements may wait for a write of events to carry them (see
/// `Inbound::queue_replies`); the runtime's timers round it up to a millisecond.
const ACK_DELAY: Duration = Duration::from_micros(500);
/// Most acknowledged events released under one hold of a link's outbox lock.
const RELEASE_CHUNK: usize = 128;
/// Largest outbound buffer kept between writes.
const KEEP_BUFFER: usize = 32 * 1024 * 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counters of one process' transport. Events taken by a remote sink end in exactly
/// one of `delivered`, `failed` or `discarded` (or are still in flight), per route and
/// in total.
#[derive(Debug, Default)]
pub struct TransportStats {
    /// Events taken by remote sinks on links replaced since (live links count theirs
    /// under their outbox lock, without an atomic operation per event).
    pub sent: AtomicU64,
    /// Of those, acknowledged by the receiver (queued at the destination).
    pub delivered: AtomicU64,
    /// Of those, reported failed to their sending stage: refused by the receiver, or
    /// lost with the connection or the process while the run went on.
    pub failed: AtomicU64,
    /// Of those, still unacknowledged when the run ended (or refused because the
    /// receiver's run had ended): counted, logged, not reported one by one.
    pub discarded: AtomicU64,
    /// Events received from other processes and queued here.
    pub accepted: AtomicU64,
    /// The same outcomes per route (index in the route table).
    routes: Box<[RouteStats]>,
}

/// Outcomes of one route's events (see [`TransportStats`]).
#[derive(Debug, Default)]
struct RouteStats {
    delivered: AtomicU64,
    failed: AtomicU64,
    discarded: AtomicU64,
}

impl TransportStats {
    fn new(routes: usize) -> TransportStats {
        TransportStats {
            routes: (0..routes).map(|_| RouteStats::default()).collect(),
            ..TransportStats::default()
        }
    }

    /// Counts `n` delivered events of `route`.
    fn delivered(&self, route: usize, n: u64) {
        self.delivered.fetch_add(n, Relaxed);
        if let Some(r) = self.routes.get(route) {
            r.delivered.fetch_add(n, Relaxed);
        }
    }

    /// Counts `n` events of `route` that failed, or were discarded at the end.
    fn undelivered(&self, route: usize, n: u64, discarded: bool) {
        let (total, per) = match (discarded, self.routes.get(route)) {
            (true, r) => (&self.discarded, r.map(|r| &r.discarded)),
            (false, r) => (&self.failed, r.map(|r| &r.failed)),
        };
        total.fetch_add(n, Relaxed);
        if let Some(per) = per {
            per.fetch_add(n, Relaxed);
        }
    }
}

/// A copy of [`TransportStats`]' totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportCounts {
    /// Events taken by remote sinks.
    pub sent: u64,
    /// Acknowledged by receivers.
    pub delivered: u64,
    /// Reported failed.
    pub failed: u64,
    /// Unacknowledged when the run ended.
    pub discarded: u64,
    /// Received and queued here.
    pub accepted: u64,
}

impl TransportCounts {
    /// Events sent and not yet delivered, failed or discarded.
    pub fn in_flight(&self) -> u64 {
        self.sent
            .saturating_sub(self.delivered + self.failed + self.discarded)
    }
}

/// The connection to one peer process.
pub(crate) struct Link {
    peer: String,
    /// On cache lines of its own: the sending workers lock it per event, while the
    /// reader writes the counters below per read.
    outbox: CachePadded<Mutex<Outbox>>,
    /// Wakes the writer task.
    wake: Notify,
    /// Events acknowledged by the peer, per route, counted by the reader (taken in by
    /// [`Outbox::absorb`] under the outbox lock, which the reader does not wait for).
    acked: Box<[AtomicU64]>,
    /// Events received from the peer and handled here (idle detection).
    received: AtomicU64,
    /// When something was last read from the peer (milliseconds since the
    /// transport's epoch), less the time the reader spent running handlers itself
    /// (`Inbound::run_claimed`), when it could not read: [`NOT_LISTENING`] meanwhile.
    heard_ms: AtomicU64,
    /// When something was last written to the peer (likewise).
    wrote_ms: AtomicU64,
    /// The transport's epoch, for `heard_ms` and `wrote_ms`.
    epoch: std::time::Instant,
    /// The peer said `Quit`: its closing the connection is the orderly end.
    goodbye: AtomicBool,
    /// Why the link was lost, if it was (first reason wins).
    lost: Mutex<Option<String>>,
    dead: AtomicBool,
    /// Down before this process began closing: a loss, even when its writer records
    /// it after the close began (a sender that saw the link down may have ended the
    /// run itself).
    dead_before_close: AtomicBool,
    /// The peer had shut its side of the connection, without a `Quit` read so far,
    /// when this process began closing, and its reader had not yet read that: the
    /// peer's close was no answer to this process' `Quit` (it came before), so it is a
    /// loss when read, as it would have been read a moment earlier. A process thawed
    /// after SIGSTOP that read another peer's `Quit` first and began closing took the
    /// close of a peer that had taken it for lost for part of its orderly end, and
    /// reported none (chaos test `sigstop_of_a_daemon_is_noticed_within_the_silence_bound`
    /// failed so in a CI run). Such a loss is not told to other peers (`Lost`): the
    /// peer died, and they see it on their own links, or it took this process for lost.
    shut_before_close: AtomicBool,
    dead_notify: Notify,
    status: Mutex<Option<Status>>,
    status_notify: Notify,
    /// The latest dashboard answer ([`crate::observe`]).
    pub(crate) observed: Mutex<Option<crate::observe::ObserveReply>>,
    pub(crate) observed_notify: Notify,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// This side's socket's addresses (plain TCP only): how the peer's process is
    /// recognised for peer memory ([`memory`]).
    ends: Option<memory::Ends>,
    /// What the handshake left this end with (its key binds the peer memory tokens).
    session: Option<crate::conn::Session>,
    /// What this process put in its memory for the peer, if it offered it to read it.
    token: Option<Arc<memory::Mine>>,
}

impl Link {
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Relaxed)
    }

    /// The link is down, or the peer said `Quit` (its run ended: it answers no more
    /// requests).
    pub(crate) fn ended(&self) -> bool {
        self.is_dead() || self.goodbye.load(Acquire)
    }

    fn mark_dead(&self) {
        if !self.dead.swap(true, AcqRel) {
            self.dead_notify.notify_one();
            self.status_notify.notify_waiters();
        }
    }

    /// The peer is lost (`why`): the link goes down at once, without waiting for
    /// anything queued to be written.
    fn lose(&self, why: String) {
        lock(&self.lost).get_or_insert(why);
        self.mark_dead();
    }

    /// The link went down as the run ended in order (this process closing, or the
    /// peer having said `Quit`), not by a loss: what it did not deliver is discarded.
    fn ended_in_order(&self, t: &Transport) -> bool {
        self.goodbye.load(Acquire)
            || (t.closing.load(SeqCst)
                && !self.dead_before_close.load(SeqCst)
                && !self.shut_before_close.load(SeqCst))
    }

    /// Whether the peer has shut its side of the connection (or reset it), read yet or
    /// not: the kernel knows before the reader reads it.
    fn peer_shut(&self) -> bool {
        let Some(sock) = lock(&self.outbox).sock.clone() else {
            return false;
        };
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid `pollfd` for the length of the call, a descriptor held open
        // by `sock`, and no waiting.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 1 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
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

    /// Queues a control frame without writing it: the next write carries it (see
    /// [`Link::write_queued`]). Dropped once the link is down.
    pub(crate) fn queue_frame(&self, f: Frame) {
        let mut ob = lock(&self.outbox);
        if !ob.down && !ob.close {
            ob.push_frame(&f, &self.peer);
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
    /// The most bytes of events from other processes a stage of this one may have
    /// queued ([`MAX_QUEUED_BYTES`]; tests lower it).
    pub(super) max_queued_bytes: AtomicUsize,
    closing: AtomicBool,
    /// Closing a deployment that never started ([`Transport::abandon`]).
    abandoned: AtomicBool,
    rt: tokio::runtime::Handle,
    liveness: Liveness,
    policy: OnProcessLoss,
    topology: Topology,
    lost: Mutex<Vec<ProcessLost>>,
    epoch: std::time::Instant,
    /// This process' last stall long enough to matter, as the liveness watch saw it:
    /// when it ended and how long it was (transport milliseconds).
    stood_still: Mutex<(u64, u64)>,
    /// When the liveness watch last ran (transport milliseconds): long ago, this process
    /// is only now waking from a stall that the watch has not seen yet. Stored after
    /// `stood_still` (release; read before it, acquire).
    watched_ms: AtomicU64,
    /// Run by the liveness watch in each round, with how late the round is, before it
    /// records anything of it (tests: a link that goes down at that moment).
    #[cfg(test)]
    mid_round: Mutex<Option<MidRound>>,
    /// The run has started here ([`Transport::set_handle`]): silence counts from then.
    /// Before, a peer may not be listening yet (a daemon parks a peer's connection until
    /// its own deployment arrives, which a slow path from the launcher can delay past
    /// the bound: a live peer was taken for lost, and the run went on without it).
    running: AtomicBool,
}

/// What the liveness watch runs in each round before it records anything of it (tests).
#[cfg(test)]
type MidRound = Box<dyn Fn(Duration) + Send>;

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
    /// A transport for process `me` with a route table, default liveness, the default
    /// policy and no topology; link tasks run on `rt`.
    #[cfg(test)]
    pub(crate) fn new(me: &str, routes: Vec<RouteInfo>, rt: tokio::runtime::Handle) -> Arc<Self> {
        Transport::build(
            me,
            routes,
            rt,
            Liveness::default(),
            OnProcessLoss::End,
            Topology::default(),
        )
    }

    /// The transport of process `me` in deployment `d`: its routes, the liveness and
    /// policy the launcher chose, and who runs what.
    pub(crate) fn for_deployment(
        d: &crate::deploy::Deployment,
        me: &str,
        rt: tokio::runtime::Handle,
    ) -> Arc<Self> {
        let topology = Topology {
            cluster_of: d
                .mapping
                .iter()
                .enumerate()
                .flat_map(|(c, ps)| ps.iter().map(move |p| (p.clone(), c)))
                .collect(),
            clusters: d.clusters.clone(),
            launcher: (d.launcher != me).then(|| d.launcher.clone()),
            outlive_launcher: d.outlive_launcher,
        };
        Transport::build(me, d.routes(), rt, d.liveness, d.on_loss.clone(), topology)
    }

    fn build(
        me: &str,
        routes: Vec<RouteInfo>,
        rt: tokio::runtime::Handle,
        liveness: Liveness,
        policy: OnProcessLoss,
        topology: Topology,
    ) -> Arc<Self> {
        let route_ids = routes
            .iter()
            .enumerate()
            .map(|(i, r)| ((r.from.clone(), r.to.clone()), i as u32))
            .collect();
        let t = Arc::new(Transport {
            me: me.into(),
            stats: Arc::new(TransportStats::new(routes.len())),
            routes,
            route_ids,
            links: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            room: Arc::new(Notify::new()),
            handle_tx: watch::channel(None).0,
            indexes: Mutex::new(None),
            pending_inbound: AtomicU64::new(0),
            max_queued_bytes: AtomicUsize::new(MAX_QUEUED_BYTES),
            closing: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            running: AtomicBool::new(false),
            rt,
            liveness,
            policy,
            topology,
            lost: Mutex::new(Vec::new()),
            epoch: std::time::Instant::now(),
            stood_still: Mutex::new((0, 0)),
            watched_ms: AtomicU64::new(0),
            #[cfg(test)]
            mid_round: Mutex::new(None),
        });
        let weak = Arc::downgrade(&t);
        if let Err(e) = std::thread::Builder::new()
            .name("leda-net-watch".into())
            .spawn(move || loss::watch(weak, liveness))
        {
            // (Without it, no heartbeats: peers would take this process for lost.)
            tracing::error!(error = %e, "cannot start the links' liveness watch");
        }
        t
    }

    /// Milliseconds since this transport was made.
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
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
            discarded: self.stats.discarded.load(Relaxed),
            accepted: self.stats.accepted.load(Relaxed),
        }
    }

    /// The outcomes of each route's events so far (routes this process sends on).
    pub fn route_counts(&self) -> Vec<RouteCounts> {
        let links: Vec<Arc<Link>> = self
            .links()
            .into_iter()
            .chain(lock(&self.retired).iter().cloned())
            .collect();
        let mut sent = vec![0u64; self.routes.len()];
        for l in &links {
            let mut ob = lock(&l.outbox);
            ob.absorb_all(&l.acked, &self.stats);
            for (s, rs) in sent.iter_mut().zip(ob.routes.iter()) {
                *s += rs.sent;
            }
        }
        self.routes
            .iter()
            .zip(self.stats.routes.iter())
            .zip(sent)
            .filter(|(_, s)| *s > 0)
            .map(|((r, st), sent)| RouteCounts {
                from: r.from.clone(),
                to: r.to.clone(),
                sent,
                delivered: st.delivered.load(Relaxed),
                failed: st.failed.load(Relaxed),
                discarded: st.discarded.load(Relaxed),
            })
            .collect()
    }

    /// Gives the transport the running process (inbound events wait for it). A
    /// process lost before the run started ends it now under [`OnProcessLoss::End`].
    pub(crate) fn set_handle(&self, h: ProcessHandle) {
        // Silence counts from the start of the run (see `running`).
        let now = self.now_ms();
        for link in self.links() {
            link.heard_ms.fetch_max(now, Relaxed);
        }
        self.running.store(true, Relaxed);
        let from = self.routes.iter().map(|r| h.stage_index(&r.from)).collect();
        let to = self.routes.iter().map(|r| h.stage_index(&r.to)).collect();
        *lock(&self.indexes) = Some(Arc::new(RouteIndexes { from, to }));
        self.handle_tx.send_replace(Some(h.clone()));
        let launcher_lost = lock(&self.lost)
            .iter()
            .any(|l| self.topology.ends_with(&l.process));
        if !lock(&self.lost).is_empty() && (self.policy == OnProcessLoss::End || launcher_lost) {
            h.quit(Event::new());
        }
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

    /// Ends the links of a deployment that did not start here: they close without
    /// waiting for their peers to finish their side (one that only parked the
    /// connection, never to read it, held a failed deployment 3 s more). Whatever a
    /// peer that did start sent on them is not waited for either.
    pub(crate) async fn abandon(&self) {
        self.abandoned.store(true, Relaxed);
        self.close(None).await;
    }

    /// Ends every link cleanly (after `Quit` frames, if asked) and waits (bounded) for
    /// their writers to finish; events never acknowledged are then reported failed.
    pub(crate) async fn close(&self, quit: Option<Vec<leda_core::value::Value>>) {
        let links = self.links();
        // (Noted before `closing`, which the writers read after it. A deployment that
        // never started has no run whose losses to report.)
        let abandoned = self.abandoned.load(Relaxed);
        for l in &links {
            // (Looked at before `is_dead`: a link that goes down between the two, its
            // second descriptor dropped, is then found dead.)
            let shut = !abandoned && l.peer_shut();
            if l.is_dead() {
                l.dead_before_close.store(true, SeqCst);
            } else if shut && !l.goodbye.load(Acquire) {
                l.shut_before_close.store(true, SeqCst);
            }
        }
        self.closing.store(true, SeqCst);
        for l in &links {
            if let Some(v) = &quit {
                l.send_frame(Frame::Quit(v.clone()));
            }
            l.close();
        }
        for l in links {
            let w = lock(&l.writer).take();
            if let Some(mut w) = w
                && tokio::time::timeout(CLOSE_GRACE * 2, &mut w).await.is_err()
            {
                // A peer that reads nothing (frozen) holds the writer in a write: the
                // link ends now, so that the writer stops and counts what was never
                // acknowledged as discarded (before, the runtime was dropped with it
                // waiting, and those events were counted nowhere).
                tracing::warn!(peer = %l.peer, "link did not close in time; ending it");
                l.lose("it did not finish closing in time".into());
                let _ = tokio::time::timeout(CLOSE_GRACE, w).await;
            }
        }
    }

    /// Starts the link to `peer` over `stream` (handshake done).
    pub(crate) fn attach(self: &Arc<Self>, peer: &str, stream: crate::conn::Conn) -> Arc<Link> {
        let _ = stream.tcp().set_nodelay(true);
        self.liveness.apply_to(stream.tcp());
        let plain_tcp = !stream.is_tls();
        let ends = plain_tcp
            .then(|| {
                Some((
                    stream.tcp().local_addr().ok()?,
                    stream.tcp().peer_addr().ok()?,
                ))
            })
            .flatten();
        // On one host the peer may read large binaries from this process's memory.
        let session = stream.session();
        let offer = ends.and(session).and_then(|s| memory::offer(&s));
        // A second descriptor of the socket (non-blocking, like the first): sending
        // workers write plain TCP through it themselves (the writer task writes what
        // they cannot write without waiting, and everything under TLS), and the close
        // looks through it whether the peer had shut its side (`Transport::close`).
        let sock = {
            use std::os::fd::AsFd;
            stream
                .tcp()
                .as_fd()
                .try_clone_to_owned()
                .map(|fd| Arc::new(std::net::TcpStream::from(fd)))
                .map_err(|e| tracing::debug!(peer, error = %e, "no second descriptor"))
                .ok()
        };
        let direct = sock.clone().filter(|_| plain_tcp);
        // The reader's reads that do not wait and its low-water mark go through the same
        // second descriptor (see `reader::Plain`).
        let read_plain = direct.clone().map(reader::Plain::new);
        let link = Arc::new(Link {
            peer: peer.into(),
            outbox: CachePadded::new(Mutex::new(Outbox {
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
                        sent: 0,
                    })
                    .collect(),
                unacked_bytes: 0,
                sent: 0,
                signalled: false,
                close: false,
                down: false,
                writing: false,
                spare: Some(Outgoing::new(SPLICE_MIN, FRAME_TARGET)),
                partial: None,
                direct,
                sock,
                peer: None,
            })),
            wake: Notify::new(),
            acked: self.routes.iter().map(|_| AtomicU64::new(0)).collect(),
            received: AtomicU64::new(0),
            heard_ms: AtomicU64::new(self.now_ms()),
            wrote_ms: AtomicU64::new(self.now_ms()),
            epoch: self.epoch,
            goodbye: AtomicBool::new(false),
            lost: Mutex::new(None),
            dead: AtomicBool::new(false),
            dead_before_close: AtomicBool::new(false),
            shut_before_close: AtomicBool::new(false),
            dead_notify: Notify::new(),
            status: Mutex::new(None),
            status_notify: Notify::new(),
            observed: Mutex::new(None),
            observed_notify: Notify::new(),
            writer: Mutex::new(None),
            ends,
            session,
            token: offer.as_ref().map(|(_, t)| t.clone()),
        });
        if let Some(old) = lock(&self.links).insert(peer.into(), link.clone()) {
            tracing::warn!(peer, "replacing an existing link");
            old.mark_dead();
            lock(&self.retired).push(old);
        }
        let (rd, wr) = stream.split();
        let reader = self
            .rt
            .spawn(read_loop(self.clone(), link.clone(), rd, read_plain));
        let writer = self
            .rt
            .spawn(write_loop(self.clone(), link.clone(), wr, reader));
        *lock(&link.writer) = Some(writer);
        if let Some((offer, _)) = offer {
            link.send_frame(Frame::Memory(Box::new(offer)));
        }
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
            Refusal::QueueFull => SendError::QueueFull {
                stage: stage.as_str().into(),
            },
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

    /// Accounts for events of `route` that were not delivered: `discarded` at the end
    /// of the run (counted and logged once), or else failed, each reported to its
    /// sending stage (its `error` port, if connected).
    async fn report_undelivered(
        &self,
        route: u32,
        error: &SendError,
        events: Vec<Event>,
        discarded: bool,
    ) {
        if events.is_empty() {
            return;
        }
        self.stats
            .undelivered(route as usize, events.len() as u64, discarded);
        if discarded {
            let r = self.routes.get(route as usize);
            tracing::info!(
                from = r.map_or("?", |r| r.from.as_str()),
                to = r.map_or("?", |r| r.to.as_str()),
                events = events.len(),
                reason = %error,
                "events unacknowledged at the end of the run (discarded)"
            );
            return;
        }
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

    fn route_counts(&self) -> Vec<RouteCounts> {
        // (The inherent method: same name, same answer.)
        Transport::route_counts(self)
    }

    fn peer_control(
        &self,
        process: &str,
        action: &leda_core::dashboard::Control,
    ) -> Result<(), String> {
        self.control_peer(process, action)
    }
}
