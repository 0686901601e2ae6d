//! What one link has to send, under one lock: the encoded frames, the open `events`
//! frame, and per route the credits and the unacknowledged events (kept for failure
//! reports). Owns flow control on the sending side; it never touches the socket
//! (the writer does) nor the process (the sink and the reader do).

use super::*;

/// Flow control and unacknowledged events of one route on one link.
pub(super) struct RouteOut {
    /// Events this sender may still send before acknowledgements return credit.
    pub(super) credit: i64,
    /// Events taken and not yet acknowledged or reported failed.
    pub(super) in_flight: u64,
    /// Events taken and not yet acknowledged, in order (kept for failure reports),
    /// with their encoded sizes; the first `stale` of them were acknowledged and
    /// only wait to be dropped.
    pub(super) unacked: VecDeque<(Event, u32)>,
    /// Acknowledged events still at the front of `unacked`.
    pub(super) stale: usize,
    /// The link's acknowledgement count of this route already taken in.
    pub(super) absorbed: u64,
    /// Events taken on this link (accounting).
    pub(super) sent: u64,
}

impl RouteOut {
    /// Pops one acknowledged event, if any.
    pub(super) fn pop_stale(&mut self) -> Option<Event> {
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
pub(super) struct Outbox {
    /// Frames to write; the open `events` frame, if any, is at its end.
    pub(super) buf: Outgoing,
    pub(super) open: Option<EventsFrame>,
    pub(super) routes: Box<[RouteOut]>,
    /// Encoded bytes of the unacknowledged events, all routes.
    pub(super) unacked_bytes: usize,
    /// Events taken for the peer (idle detection: counted before the bytes can be
    /// taken by the writer, which takes them under this lock).
    pub(super) sent: u64,
    /// The writer was woken since it last took the buffer.
    pub(super) signalled: bool,
    /// The writer is to write what is queued, then close the connection.
    pub(super) close: bool,
    /// The link is down: nothing more is taken (what was is reported failed).
    pub(super) down: bool,
    /// Someone writes the socket now: the writer task, or a sending worker
    /// ([`Outbox::take_direct`]); nobody else may until it is cleared.
    pub(super) writing: bool,
    /// The buffer to swap with `buf` when writing (`None` while someone writes).
    pub(super) spare: Option<Outgoing>,
    /// What a sending worker could not write without waiting, from the given byte
    /// on: the writer task writes it before anything else.
    pub(super) partial: Option<(Outgoing, usize)>,
    /// The socket, for sending workers to write without waiting (plain TCP only; a
    /// TLS stream has one writer, the task). Dropped when the link goes down.
    pub(super) direct: Option<Arc<std::net::TcpStream>>,
    /// The socket, plain or under TLS, for [`Transport::close`] to see whether the peer
    /// had shut its side before this process began closing. Dropped with `direct`.
    pub(super) sock: Option<Arc<std::net::TcpStream>>,
    /// The peer process reading this process's memory, if it does: binaries of
    /// [`memory::REF_MIN`] bytes or more then go as references ([`memory`]).
    pub(super) peer: Option<Arc<memory::Peer>>,
}

impl Drop for Outbox {
    /// Unacknowledged events still here (the link's tasks were cancelled before the
    /// end of the link accounted for them) may be referenced by frames the peer has yet
    /// to read: their binaries are kept while it can (see [`memory::bury`]).
    fn drop(&mut self) {
        if let Some(peer) = self.peer.take() {
            let unread = self
                .routes
                .iter()
                .flat_map(|rs| rs.unacked.range(rs.stale..).map(|(ev, _)| ev));
            memory::bury(&peer, unread);
        }
    }
}

impl Outbox {
    /// Takes in the acknowledgements the reader counted for `route` since the last
    /// call: credits, in-flight count, byte window and the `delivered` counter are
    /// exact afterwards; the events stay at the front of the queue (`stale`) until
    /// they are popped, a few at a time, by later sends or by the reader. (An
    /// acknowledgement for more than is unacknowledged, from a faulty peer, counts
    /// only what there is.)
    pub(super) fn absorb(&mut self, route: usize, acked: &AtomicU64, stats: &TransportStats) {
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
        stats.delivered(route, k as u64);
    }

    /// [`Outbox::absorb`] for every route.
    pub(super) fn absorb_all(&mut self, acked: &[AtomicU64], stats: &TransportStats) {
        for (r, a) in acked.iter().enumerate() {
            self.absorb(r, a, stats);
        }
    }

    /// Pops up to `max` acknowledged events (all routes) into `out`.
    pub(super) fn pop_stale(&mut self, mut max: usize, out: &mut Vec<Event>) {
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
    pub(super) fn has_room(&self, route: usize) -> bool {
        self.buf.bytes.len() < MAX_BACKLOG
            && self.unacked_bytes < BYTE_WINDOW
            && self.routes.get(route).is_some_and(|rs| rs.credit > 0)
    }

    /// Marks that there is something to write; `true` if the writer must be woken.
    pub(super) fn signal(&mut self) -> bool {
        !std::mem::replace(&mut self.signalled, true)
    }

    /// Closes the open `events` frame (an empty one is removed).
    pub(super) fn close_open(&mut self) {
        if let Some(f) = self.open.take() {
            if f.is_empty() {
                self.buf.bytes.truncate(f.start());
            } else {
                f.close(&mut self.buf);
            }
        }
    }

    /// Encodes `ev` into the open `events` frame (opening one as needed).
    pub(super) fn push_event(
        &mut self,
        route: u32,
        ev: &Event,
    ) -> Result<(), crate::wire::EncodeError> {
        // The open frame is worked on in place (taking it out and putting it back, per
        // event, cost stalled loads of what was just stored).
        if self
            .open
            .as_ref()
            .is_some_and(|f| f.weight(&self.buf) >= FRAME_TARGET || f.events() >= FRAME_EVENTS)
        {
            self.close_open();
        }
        let buf = &mut self.buf;
        // (The buffers are swapped with the writer's: each takes the setting here; none
        // while too much is kept for peers after faults, see `memory::bury`.)
        buf.refs_from = (self.peer.is_some() && memory::may_reference()).then_some(memory::REF_MIN);
        let f = self.open.get_or_insert_with(|| EventsFrame::open(buf));
        let r = f.push(buf, route, ev);
        if r.is_err() && !f.is_empty() {
            // Perhaps too big only together with the others: alone in a new frame.
            self.close_open();
            let f = self.open.insert(EventsFrame::open(&mut self.buf));
            return f.push(&mut self.buf, route, ev);
        }
        r
    }

    /// Appends a control frame.
    pub(super) fn push_frame(&mut self, f: &Frame, peer: &str) {
        self.close_open();
        if let Err(e) = frame::encode_into(&mut self.buf.bytes, f) {
            tracing::error!(peer, error = %e, "cannot encode a control frame");
        }
    }

    /// Hands everything queued to the writer (swapped with `spare`, which must be
    /// empty); returns whether the writer is to close after writing it.
    pub(super) fn take(&mut self, spare: &mut Outgoing) -> bool {
        self.close_open();
        std::mem::swap(&mut self.buf, spare);
        self.signalled = false;
        self.close
    }

    /// For a thread that queued something on this link (a sending worker at the end
    /// of its batch, the reader with replies): if nobody writes and something is
    /// queued (and the link is neither closing nor down), takes the right to write
    /// and everything queued, with the socket to write it to.
    pub(super) fn take_direct(&mut self) -> Option<(Outgoing, Arc<std::net::TcpStream>)> {
        if self.writing || self.buf.is_empty() || self.close || self.down || self.partial.is_some()
        {
            return None;
        }
        let sock = self.direct.clone()?;
        Some((self.start_write().0, sock))
    }

    /// Takes the right to write and everything queued (swapped with the spare
    /// buffer); also returns whether the link is to close after it.
    pub(super) fn start_write(&mut self) -> (Outgoing, bool) {
        let mut out = self
            .spare
            .take()
            .unwrap_or_else(|| Outgoing::new(SPLICE_MIN, FRAME_TARGET));
        let close = self.take(&mut out);
        self.writing = true;
        (out, close)
    }

    /// When [`Outbox::take_direct`] gave nothing: `true` if the writer task must be
    /// woken for what is queued (no direct writes on this link, or it is closing).
    /// Someone who writes now looks again when done. `wrote`: the caller has just
    /// written (its wake-up is owed whether or not the writer was told before: the
    /// writer may have looked, and backed off, while it wrote).
    pub(super) fn needs_writer(&mut self, wrote: bool) -> bool {
        if self.writing || (self.buf.is_empty() && !self.close && self.partial.is_none()) {
            return false;
        }
        let first = self.signal();
        first || wrote
    }

    /// Ends a write: the buffer `out` (written whole: emptied for reuse here) comes
    /// back. Returns `true` if more was queued meanwhile (or the link is to close).
    pub(super) fn end_write(&mut self, mut out: Outgoing) -> bool {
        if out.bytes.capacity() > KEEP_BUFFER {
            // A very large batch or event passed: do not keep its buffer.
            out = Outgoing::new(SPLICE_MIN, FRAME_TARGET);
        } else {
            // Kept (and swapped back in): no allocation or page fault per batch.
            out.clear();
        }
        self.spare = Some(out);
        self.writing = false;
        !self.buf.is_empty() || self.close
    }
}
