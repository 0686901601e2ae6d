//! The receiving side of a link: reads and decodes frames, delivers events to the
//! process (in order per route, waiting for room), answers with replies (credits),
//! takes in the peer's acknowledgements and refusals, and notices a silent or lost
//! peer. It queues its frames on the link, and writes them itself (plain TCP) when
//! they cannot wait for the next write of events.

use super::*;

pub(super) fn push_reply(replies: &mut Vec<Reply>, route: u32, refused: Option<Refusal>) {
    push_replies(replies, route, refused, 1);
}

/// Appends the outcome of `n` events of `route` (merged with the last reply when it
/// is the same outcome).
pub(super) fn push_replies(
    replies: &mut Vec<Reply>,
    route: u32,
    refused: Option<Refusal>,
    mut n: usize,
) {
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

pub(super) struct Inbound {
    pub(super) pending: HashMap<u32, VecDeque<Event>>,
    /// Bytes per event of each route's last frame (frame and referenced bytes over its
    /// events; 0 before one came): what a queued event of the route is taken to weigh
    /// ([`Transport::max_queued_bytes`]). Indexed by route.
    pub(super) event_bytes: Vec<usize>,
    /// Events in `pending`, all routes.
    pub(super) pending_total: usize,
    pub(super) replies: Vec<Reply>,
    /// Events accepted since the transport's counter was last updated.
    pub(super) accepted: u64,
    /// Acknowledged events popped from an outbox, dropped outside its lock.
    pub(super) acked: Vec<Event>,
    /// Decoded `events` frames, reused from frame to frame: `(route, count)` per group
    /// and the events of all groups in order.
    pub(super) groups: Vec<(u32, usize)>,
    pub(super) events: Vec<Event>,
    /// The events of one group of a frame with several (reused).
    pub(super) batch: Vec<Event>,
    /// The chunks small binaries are decoded into.
    pub(super) arena: crate::wire::Arena,
    /// Whose `pending_inbound` counts `pending_total`: given back on drop, also when
    /// the reader is aborted (idle detection must not wait for events that are gone).
    pub(super) owner: Arc<Transport>,
    /// Replies queued on the link but not written: events they acknowledge, the
    /// smallest credit window of their routes, and when they are written at the
    /// latest (unless a write of events carries them first).
    pub(super) deferred: u64,
    pub(super) deferred_window: u64,
    /// Bytes of `events` frames read since replies were last written (the sender's
    /// byte window, like its credit, must not wait for them).
    pub(super) deferred_bytes: usize,
    /// The last frame larger than `BIG_FRAME` (its buffer, for the next one).
    pub(super) big: Option<bytes::Bytes>,
    /// Large frames so far, and how many in a row found the kept buffer still in use
    /// (its events alive in stages). Keeping it then only stops a stage from taking
    /// the buffer over (a binary it holds alone can be written in place): after two
    /// such misses buffers are kept again only every `BIG_PROBE`th frame.
    pub(super) big_frames: u64,
    pub(super) big_misses: u32,
    /// The link's count of events sent, when replies were last handled.
    pub(super) sent_seen: u64,
    pub(super) ack_due: Option<tokio::time::Instant>,
    /// Activations the delivered events claimed, run by this task once the frames at
    /// hand are delivered and acknowledged ([`Inbound::run_claimed`]).
    pub(super) claimed: Vec<Claimed>,
    /// The peer once its memory offer was checked: referenced binaries in its
    /// `events` frames are read from its memory ([`memory`]).
    pub(super) peer: Option<Arc<memory::Peer>>,
    /// An offer came, a `MemoryOk` came (only the first of each is looked at).
    pub(super) offered: bool,
    pub(super) ok_seen: bool,
}

impl Drop for Inbound {
    fn drop(&mut self) {
        self.owner
            .pending_inbound
            .fetch_sub(self.pending_total as u64, Relaxed);
    }
}

impl Inbound {
    /// Queues the replies held so far on the link. Plain acknowledgements wait there
    /// (up to [`ACK_DELAY`]) for the next write of events to the peer, which carries
    /// them (an echo's answer, the next request), so that a round trip costs the peer
    /// one wake-up, not two; refusals, and acknowledgements that would leave a sender
    /// short of credit or of byte window (a quarter of either), are written at once.
    pub(super) fn queue_replies(&mut self, t: &Transport, link: &Link) {
        let replies = std::mem::take(&mut self.replies);
        let mut urgent = false;
        for r in &replies {
            urgent |= r.refused.is_some();
            let window = t.routes.get(r.route as usize).map_or(1, |x| x.window);
            self.deferred += u64::from(r.count);
            self.deferred_window = self.deferred_window.min(window.into());
        }
        urgent |= self.deferred * 4 >= self.deferred_window;
        urgent |= self.deferred_bytes * 4 >= BYTE_WINDOW;
        link.queue_frame(Frame::Replies(replies));
        if urgent {
            self.write_replies(t, link);
        } else if self.ack_due.is_none() {
            self.ack_due = Some(tokio::time::Instant::now() + ACK_DELAY);
        }
    }

    /// Writes what is queued on the link now, deferred replies included.
    pub(super) fn write_replies(&mut self, t: &Transport, link: &Link) {
        self.deferred = 0;
        self.deferred_window = u64::MAX;
        self.deferred_bytes = 0;
        self.ack_due = None;
        link.write_queued(&t.room);
    }

    /// Runs the activations the delivered events claimed: on this thread when the
    /// connection has nothing more to read (`drained`) and their work is short (the
    /// events skip a pool worker's wake-up, which on a busy small host costs a round
    /// trip more than the handling), else on the pool (while bytes keep coming, a
    /// worker handles them as this thread reads on).
    /// While this thread runs handlers it does not read: the peer's silence is not
    /// counted meanwhile (a handler that computes for seconds must not get a live
    /// peer declared lost), and the time is added to when it was last heard.
    pub(super) fn run_claimed(&mut self, link: &Link, drained: bool) {
        if !drained {
            self.claimed.drain(..).for_each(Claimed::schedule);
            return;
        }
        if self.claimed.is_empty() {
            return;
        }
        let heard = link.heard_ms.swap(super::NOT_LISTENING, Relaxed);
        let start = self.owner.now_ms();
        self.claimed.drain(..).for_each(Claimed::run);
        let busy = self.owner.now_ms().saturating_sub(start);
        link.heard_ms.store(heard.saturating_add(busy), Relaxed);
    }

    pub(super) fn pending_len(&self) -> usize {
        self.pending_total
    }

    /// Publishes the accepted count (before the replies that acknowledge them).
    pub(super) fn publish_accepted(&mut self, t: &Transport) {
        if self.accepted > 0 {
            t.stats
                .accepted
                .fetch_add(std::mem::take(&mut self.accepted), Relaxed);
        }
    }

    /// Injects the events of one group of `route` (in order behind any pending ones),
    /// as a batch: one queue lock and at most one wake-up for all that fit (in the
    /// queue's capacity and the transport's byte bound). `evs` is left empty.
    pub(super) fn deliver_group(
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
        let room = byte_room(&self.event_bytes, t, h, dest, route);
        let over = (room < evs.len()).then(|| evs.split_off(room));
        match h.inject_batch_here(dest, evs, &mut self.claimed) {
            Ok(n) => {
                self.accepted += n as u64;
                push_replies(&mut self.replies, route, None, n);
                evs.extend(over.into_iter().flatten());
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
    pub(super) fn deliver(
        &mut self,
        t: &Transport,
        h: &ProcessHandle,
        dest: usize,
        route: u32,
        ev: Event,
    ) {
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
        if byte_room(&self.event_bytes, t, h, dest, route) == 0 {
            self.pending.entry(route).or_default().push_back(ev);
            self.pending_total += 1;
            t.pending_inbound.fetch_add(1, Relaxed);
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
    pub(super) fn retry(&mut self, t: &Transport, h: &ProcessHandle, idx: &RouteIndexes) {
        for (&route, q) in self.pending.iter_mut() {
            let Some(dest) = idx.to.get(route as usize).copied().flatten() else {
                continue;
            };
            let mut room = byte_room(&self.event_bytes, t, h, dest, route);
            while room > 0
                && let Some(ev) = q.pop_front()
            {
                room -= 1;
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

    pub(super) fn drop_pending(&mut self, t: &Transport) {
        let n = std::mem::take(&mut self.pending_total) as u64;
        t.pending_inbound.fetch_sub(n, Relaxed);
        self.pending.clear();
    }
}

/// Reads, decodes and handles the peer's frames, and retries events waiting for room.
/// Reads go into one buffer with a cancel-safe `read_buf`, so the retry timer can
/// interrupt them; frames are handled on this task (no hop to another).
pub(super) async fn read_loop(
    t: Arc<Transport>,
    link: Arc<Link>,
    mut rd: crate::conn::ReadHalf,
    mut plain: Option<Plain>,
) {
    let mut inb = Inbound {
        pending: HashMap::new(),
        event_bytes: vec![0; t.routes.len()],
        pending_total: 0,
        replies: Vec::new(),
        accepted: 0,
        acked: Vec::new(),
        groups: Vec::new(),
        events: Vec::new(),
        batch: Vec::new(),
        arena: crate::wire::Arena::default(),
        owner: t.clone(),
        deferred: 0,
        deferred_window: u64::MAX,
        deferred_bytes: 0,
        big: None,
        big_frames: 0,
        big_misses: 0,
        sent_seen: 0,
        ack_due: None,
        claimed: Vec::new(),
        peer: None,
        offered: false,
        ok_seen: false,
    };
    let mut ready: Option<(ProcessHandle, Arc<RouteIndexes>)> = None;
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    // The low-water mark's patience ran out: the next read is not held back by it.
    let mut patience_over = false;
    // When a read last took bytes: the patience runs from it, not from the select's
    // (re)start, which the retry and ack timers repeat every millisecond or so.
    let mut read_at = tokio::time::Instant::now();
    // For the liveness watch (`loss::watch`): when something was last read.
    let heard = || link.heard_ms.store(t.now_ms(), Relaxed);
    'conn: loop {
        // Handle every complete frame in the buffer.
        while let Some(len) = announced(&buf) {
            if len == 0 || len > MAX_FRAME {
                let e = FrameError::BadLength {
                    len: len.into(),
                    max: MAX_FRAME,
                };
                tracing::warn!(peer = %link.peer, error = %e, "bad frame; closing the link");
                link.lose(format!("it sent a bad frame ({e})"));
                break 'conn;
            }
            let total = 4 + len as usize;
            if buf.len() < total {
                if total > BIG_FRAME {
                    if buf.capacity() < total {
                        // A large frame gets one buffer of its own, allocated once
                        // (its pages are touched only as its bytes arrive, so an
                        // announced length alone costs no memory), not a doubling
                        // series (each step a fresh allocation, its pages zeroed, and
                        // a copy of what arrived). The last large frame's buffer is
                        // reused when its events are gone.
                        let kept = match inb.big.take().map(bytes::Bytes::try_into_mut) {
                            Some(Ok(b)) => {
                                inb.big_misses = 0;
                                Some(b)
                            }
                            Some(Err(_)) => {
                                inb.big_misses = inb.big_misses.saturating_add(1);
                                None
                            }
                            None => None,
                        };
                        let mut big = kept
                            .filter(|b| b.capacity() >= total)
                            .unwrap_or_else(|| BytesMut::with_capacity(total));
                        big.clear();
                        big.extend_from_slice(&buf);
                        buf = big;
                    }
                } else {
                    // Grow as the bytes arrive, geometrically (at most doubling what
                    // has arrived).
                    let want = (total - buf.len()).min(buf.len().max(READ_CHUNK));
                    buf.reserve(want);
                }
                break;
            }
            let raw = buf.split_to(total).freeze();
            if total > BIG_FRAME {
                // What follows it goes to a buffer of its own, so that this frame's
                // is free for reuse once its events are gone (kept up to
                // `KEEP_BUFFER` bytes: a link idles with one such buffer at most),
                // unless its predecessors' events outlived the next frame.
                let tail = std::mem::replace(&mut buf, BytesMut::with_capacity(READ_CHUNK));
                buf.extend_from_slice(&tail);
                inb.big_frames += 1;
                let pays = inb.big_misses < 2 || inb.big_frames.is_multiple_of(BIG_PROBE);
                inb.big = (total <= KEEP_BUFFER && pays).then(|| raw.clone());
            }
            let ok = if raw[4] == frame::kind::EVENTS {
                inb.deferred_bytes += total;
                // Nearly all the traffic: decoded into reused buffers (a frame is
                // decoded whole before any of it is delivered).
                let body = raw.slice(5..);
                drop(raw);
                let mut groups = std::mem::take(&mut inb.groups);
                let mut events = std::mem::take(&mut inb.events);
                let decoded = crate::wire::decode_events_into(
                    &body,
                    Some(&body),
                    inb.peer.as_deref(),
                    &mut inb.arena,
                    &mut groups,
                    &mut events,
                );
                // Only the events' slices hold a large frame's buffer now: a stage that
                // gets a binary alone may take it over (`try_into_mut`) as soon as it
                // runs, while this task is still delivering.
                drop(body);
                let ok = match decoded {
                    Ok(referenced) => {
                        // (What was read from the peer's memory does not hasten the
                        // acknowledgements, though it counts in the sender's byte window:
                        // acknowledged at once, a 12 MB request's acknowledgement left
                        // apart from its answer, and the round trip took 2.1 instead of
                        // 1.5 ms, `leda-sort send`, medians of five alternating runs;
                        // image layouts 2 and 3 the same either way. A sender whose
                        // window is full of references waits for `ACK_DELAY` at worst.)
                        let bytes = total + referenced;
                        deliver_events(&t, &link, &mut inb, &mut ready, &groups, &mut events, bytes)
                            .await
                    }
                    Err(reason) if reason.starts_with(crate::wire::SENDER_GONE) => {
                        // (Killed after sending: not a protocol violation.)
                        tracing::debug!(peer = %link.peer, reason = %reason, "sender gone");
                        link.lose(*reason);
                        false
                    }
                    Err(reason) => {
                        let e = FrameError::Malformed {
                            kind: frame::kind_name(frame::kind::EVENTS),
                            reason: *reason,
                        };
                        tracing::warn!(peer = %link.peer, error = %e, "bad frame; closing the link");
                        link.lose(format!("it sent a bad frame ({e})"));
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
                        link.lose(format!("it sent a bad frame ({e})"));
                        false
                    }
                }
            };
            if !ok {
                break 'conn;
            }
        }
        // (A large frame's own buffer has room for exactly its bytes: not grown.)
        if buf.capacity() - buf.len() < 1024 && !awaiting_big(&buf) {
            buf.reserve(READ_CHUNK);
        }
        if inb
            .ack_due
            .is_some_and(|due| tokio::time::Instant::now() >= due)
        {
            // Deferred replies are due, though bytes keep arriving.
            inb.write_replies(&t, &link);
        }
        // Replies (credits) are coalesced: while more bytes are already there, they
        // are handled first and the replies held back, up to `REPLY_BATCH` events;
        // they leave as soon as the connection has nothing more for now.
        let held: usize = inb.replies.iter().map(|r| r.count as usize).sum();
        let mut drained = false;
        if held < REPLY_BATCH && inb.pending_len() == 0 {
            let now = match &plain {
                Some(p) => p.read_now(&mut buf),
                None => try_read(&mut rd, &mut buf),
            };
            match now {
                Ok(0) => {
                    closed(&link, &buf);
                    break;
                }
                Ok(_) => {
                    heard();
                    read_at = tokio::time::Instant::now();
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => drained = true,
                Err(e) => {
                    // `lose` reports the loss (once, with the cause): no second line here.
                    tracing::debug!(peer = %link.peer, error = %e, "link read failed; closing it");
                    link.lose(format!("the connection failed ({e})"));
                    break;
                }
            }
        }
        inb.publish_accepted(&t);
        let replies = !inb.replies.is_empty();
        if replies {
            inb.queue_replies(&t, &link);
        }
        if drained && !inb.claimed.is_empty() && lock(&link.outbox).signalled {
            // The writer was woken (for the replies just queued, or a heartbeat) and may
            // wait in this thread's next-task slot, which tokio's other threads do not
            // take: it runs first, or a long handler run here would hold it back, the
            // link's heartbeats with it, and the peer would take this process for lost.
            tokio::task::yield_now().await;
        }
        // The stages run now, their answers carrying the replies just queued.
        inb.run_claimed(&link, drained);
        if replies && inb.ack_due.is_none() {
            // Let the writer send them now (under TLS): on a busy connection the next
            // read is ready at once, and the writer may share this thread.
            tokio::task::yield_now().await;
        }
        // (A silent peer: the liveness watch declares it lost, and the writer then
        // ends this task.)
        let retry = inb.pending_len() > 0;
        let ack_due = inb.ack_due;
        let raised = plain.as_mut().is_some_and(|p| {
            p.set_low_water(match big_rest(&buf) {
                Some(rest) if !std::mem::take(&mut patience_over) => rest.min(LOW_WATER_MAX),
                _ => 1,
            });
            p.raised()
        });
        let read = tokio::select! {
            r = rd.read_buf(&mut buf) => Some(r),
            _ = tokio::time::sleep_until(read_at + LOW_WATER_PATIENCE), if raised => {
                // A slow link: the next read takes what came so far (the mark stays
                // lowered until it did), so that the liveness watch hears the peer.
                patience_over = true;
                continue;
            }
            _ = tokio::time::sleep(RETRY), if retry => None,
            _ = tokio::time::sleep_until(ack_due.unwrap_or_else(tokio::time::Instant::now)),
                if ack_due.is_some() => {
                // No write carried the held replies: this one does.
                inb.write_replies(&t, &link);
                continue;
            }
        };
        match read {
            None => {
                if let Some((h, idx)) = &ready {
                    inb.retry(&t, h, idx);
                }
                inb.publish_accepted(&t);
                if !inb.replies.is_empty() {
                    inb.queue_replies(&t, &link);
                }
                inb.run_claimed(&link, true);
            }
            Some(Ok(0)) => {
                closed(&link, &buf);
                break;
            }
            Some(Ok(_)) => {
                heard();
                read_at = tokio::time::Instant::now();
            }
            Some(Err(e)) => {
                // `lose` reports the loss (once, with the cause): no second line here.
                tracing::debug!(peer = %link.peer, error = %e, "link read failed; closing it");
                link.lose(format!("the connection failed ({e})"));
                break;
            }
        }
    }
    inb.drop_pending(&t);
    inb.publish_accepted(&t);
    if !inb.replies.is_empty() {
        link.send_frame(Frame::Replies(std::mem::take(&mut inb.replies)));
    }
    // Let the writer finish what is queued (deferred replies included), then close.
    link.close();
}

/// Reads what is already there without waiting: one poll of a read (cancel-safe)
/// with a waker that does nothing (the next real read registers the task's own).
fn try_read(rd: &mut crate::conn::ReadHalf, buf: &mut BytesMut) -> std::io::Result<usize> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let read = std::pin::pin!(rd.read_buf(buf));
    match read.poll(&mut cx) {
        std::task::Poll::Ready(r) => r,
        std::task::Poll::Pending => Err(std::io::ErrorKind::WouldBlock.into()),
    }
}

/// While kept large-frame buffers keep being found in use, one in this many is kept
/// anyway, to notice when reuse pays again (see `Inbound::big_misses`).
const BIG_PROBE: u64 = 16;

/// Most bytes the reader waits for before the kernel wakes it ([`Plain::set_low_water`]).
const LOW_WATER_MAX: usize = 1024 * 1024;

/// How long the reader waits with a raised low-water mark before it reads what came
/// anyway (a slow link: reads keep the liveness watch's `heard_ms` fresh).
const LOW_WATER_PATIENCE: std::time::Duration = std::time::Duration::from_millis(20);

/// The plain TCP socket under a link's reader (the second descriptor of it that sending
/// workers write through; none under TLS, where the bytes in the socket are not the
/// frame's), for two things the runtime's reads do not do:
///
/// - its receive low-water mark (`SO_RCVLOWAT`), raised while the reader waits for the
///   rest of a large frame: the kernel then wakes the reader once that much has arrived
///   (at most [`LOW_WATER_MAX`], never above the bytes the frame still needs, which the
///   peer is bound to send) instead of once per burst of segments;
/// - reads that do not wait ([`Plain::read_now`]): after a read that did not fill its
///   buffer the runtime takes the socket for drained until its next readiness event, a
///   trip through its event loop, though more bytes often came meanwhile (while a large
///   frame arrives, nearly always). `leda-sort send` of 12 MB with `LEDA_PEER_MEMORY=0`,
///   eight alternating runs: median 3.86 → 2.89 ms; 1.5 MB 0.45 → 0.36 ms.
pub(super) struct Plain {
    sock: Arc<std::net::TcpStream>,
    /// The low-water mark now set (the kernel's default: one byte).
    mark: usize,
    /// `false` once setting the mark failed (it stays at the default).
    marks: bool,
}

impl Plain {
    /// Over `sock`, a second descriptor of the link's socket (non-blocking, like the
    /// first: they share its open file).
    pub(super) fn new(sock: Arc<std::net::TcpStream>) -> Plain {
        Plain {
            sock,
            mark: 1,
            marks: true,
        }
    }

    /// `true` while the low-water mark is above one byte.
    fn raised(&self) -> bool {
        self.mark > 1
    }

    /// Sets the low-water mark to `n` bytes (a failure leaves the kernel's default, one
    /// byte, and ends the tries).
    fn set_low_water(&mut self, n: usize) {
        use std::os::fd::AsRawFd;
        if n == self.mark || !self.marks {
            return;
        }
        let v = libc::c_int::try_from(n).unwrap_or(libc::c_int::MAX);
        // SAFETY: the descriptor is open as long as `self.sock` lives; the option value
        // is a c_int, as SO_RCVLOWAT takes.
        let r = unsafe {
            libc::setsockopt(
                self.sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            self.mark = n;
        } else {
            self.marks = false;
            self.mark = 1;
        }
    }

    /// Reads what the socket holds now into `buf`'s spare room, without waiting
    /// (`WouldBlock` when it holds nothing; the low-water mark does not hold back a read
    /// that does not wait).
    pub(super) fn read_now(&self, buf: &mut BytesMut) -> std::io::Result<usize> {
        if buf.capacity() == buf.len() {
            // (A read into no room returns 0, which reads as the end of the stream; the
            // callers leave room, and this keeps it so, as the runtime's reads do.)
            buf.reserve(64);
        }
        let n = socket2::SockRef::from(&*self.sock).recv(buf.spare_capacity_mut())?;
        // SAFETY: `recv` initialised the first `n` bytes of the spare room.
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
    }
}

/// The length the frame at the start of `buf` announces, once its 4 bytes are there.
fn announced(buf: &BytesMut) -> Option<u32> {
    Some(u32::from_le_bytes(buf.get(..4)?.try_into().ok()?))
}

/// `true` if `buf` holds the start of a frame larger than `BIG_FRAME`, not all of it.
fn awaiting_big(buf: &BytesMut) -> bool {
    big_rest(buf).is_some()
}

/// The bytes still missing of the frame larger than `BIG_FRAME` that `buf` starts.
fn big_rest(buf: &BytesMut) -> Option<usize> {
    let total = 4 + announced(buf)? as usize;
    (total > BIG_FRAME && buf.len() < total).then(|| total - buf.len())
}

/// The peer closed the connection: the orderly end after its `Quit`, a loss otherwise.
fn closed(link: &Link, buf: &BytesMut) {
    if link.goodbye.load(Acquire) {
        tracing::debug!(peer = %link.peer, "peer closed the link");
    } else if buf.is_empty() {
        link.lose("it closed the connection".into());
    } else {
        tracing::warn!(peer = %link.peer, bytes = buf.len(), "peer closed the link inside a frame");
        link.lose("it closed the connection inside a frame".into());
    }
}

/// How many more events of `route` stage `dest` may queue within the transport's byte
/// bound, each taken to weigh what the route's last frame's did (`event_bytes`).
fn byte_room(
    event_bytes: &[usize],
    t: &Transport,
    h: &ProcessHandle,
    dest: usize,
    route: u32,
) -> usize {
    match event_bytes.get(route as usize) {
        Some(&per) if per > 0 => {
            let most = (t.max_queued_bytes.load(Relaxed) / per).max(1);
            most.saturating_sub(h.queue_load(dest))
        }
        _ => usize::MAX,
    }
}

/// Delivers the events of one `events` frame (`(route, count)` per group, events of
/// all groups in order; `bytes`: what the frame and the peer memory it referenced
/// held, 0 if not known) to their destination stages, in order per route; `false`
/// closes the link.
pub(super) async fn deliver_events(
    t: &Arc<Transport>,
    link: &Arc<Link>,
    inb: &mut Inbound,
    ready: &mut Option<(ProcessHandle, Arc<RouteIndexes>)>,
    groups: &[(u32, usize)],
    events: &mut Vec<Event>,
    bytes: usize,
) -> bool {
    if ready.is_none() {
        *ready = t.handle().await;
    }
    let Some((h, idx)) = ready.as_ref() else {
        return false;
    };
    if bytes > 0 && !events.is_empty() {
        let per = bytes / events.len();
        for &(route, _) in groups {
            if let Some(b) = inb.event_bytes.get_mut(route as usize) {
                *b = per;
            }
        }
    }
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
pub(super) async fn handle_frame(
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
            return deliver_events(t, link, inb, ready, &counts, &mut events, 0).await;
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
                // Refused because the receiver's run had ended: the end of the run.
                let at_end = *why == Refusal::Stopped;
                t.report_undelivered(r.route, &err, popped, at_end).await;
                let mut ob = lock(&link.outbox);
                let rs = &mut ob.routes[route];
                rs.in_flight -= n as u64;
                rs.credit += n as i64;
            }
            // Senders waiting for credit retry now.
            t.room.notify_waiters();
            // Acknowledged events are dropped here if the sending worker is not
            // holding the lock (a short hold; they are dropped outside it) and has sent
            // nothing since the last replies, so that a sender gone quiet does not
            // keep them. A sender at work takes the acknowledgements in and drops the
            // events itself: the outbox's counters and the events' reference counts
            // stay in its cache (transport bench, ours alone, alternating pairs: 16 B
            // 5.9-7.9 -> 8.0-8.8 M events/s in four, 8.1-9.3 -> 8.5-8.9 M in three
            // more; 1 KiB 2.06-2.14 -> 2.33-2.44 M in those three).
            if let Ok(mut ob) = link.outbox.try_lock() {
                let quiet = ob.sent == inb.sent_seen;
                inb.sent_seen = ob.sent;
                if quiet {
                    ob.absorb_all(&link.acked, &t.stats);
                    ob.pop_stale(RELEASE_CHUNK, &mut inb.acked);
                }
                drop(ob);
                inb.acked.clear();
            }
        }
        Frame::Quit(values) => {
            link.goodbye.store(true, Release);
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
        Frame::Heartbeat => {}
        Frame::Lost(lost) => t.peer_reported_loss(*lost).await,
        Frame::Memory(offer) => {
            // The first offer on a plain TCP link, checked (see `memory`; it reads
            // `/proc`, off this task's thread): the peer's references are read from
            // then on.
            let first = !std::mem::replace(&mut inb.offered, true);
            if first && let (Some(ends), Some(session)) = (link.ends, link.session) {
                let pid = offer.pid;
                let checked =
                    tokio::task::spawn_blocking(move || memory::accept(&offer, ends, &session))
                        .await
                        .ok()
                        .flatten();
                if let Some((peer, ok)) = checked {
                    tracing::debug!(peer = %link.peer, pid, "reading the peer's memory");
                    inb.peer = Some(peer);
                    link.send_frame(Frame::MemoryOk(Box::new(ok)));
                }
            }
        }
        Frame::MemoryOk(ok) => {
            // Only in answer to this side's offer, from the process at the other end.
            let first = !std::mem::replace(&mut inb.ok_seen, true);
            if first
                && let (Some(ends), Some(session), Some(mine)) =
                    (link.ends, link.session, link.token.clone())
            {
                let checked = tokio::task::spawn_blocking(move || {
                    memory::accepted(&ok, ends, &session, mine)
                })
                .await
                .ok()
                .flatten();
                if let Some(peer) = checked {
                    lock(&link.outbox).peer.get_or_insert(peer);
                }
            }
        }
        Frame::Error(m) => {
            tracing::warn!(peer = %link.peer, error = %m, "peer reported an error");
            link.lose(format!("it reported an error: {m}"));
            return false;
        }
        other => {
            tracing::warn!(peer = %link.peer, frame = other.name(), "unexpected frame on a link; closing it");
            link.lose(format!("it sent an unexpected {} frame", other.name()));
            return false;
        }
    }
    true
}
