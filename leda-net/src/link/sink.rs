//! The sending side seen by the core: a stage's [`RemoteSink`] for one route, taking
//! credit and encoding events straight into a link's outbox on the sending worker.
//! It never waits. When the sending task's batch ends ([`RemoteSink::flush`]) the
//! worker writes what is queued on plain TCP itself, unless someone writes already;
//! whatever it cannot write without waiting goes to the link's writer task.

use super::*;

pub(super) struct Sink {
    pub(super) stats: Arc<TransportStats>,
    pub(super) room: Arc<Notify>,
    pub(super) route: u32,
    pub(super) to: String,
    pub(super) peers: Vec<Arc<Link>>,
    pub(super) next: AtomicUsize,
}

/// Bytes a link's outbox may hold for sends that wait for their task's batch to end
/// ([`RemoteSink::send_held`]) before the sending worker writes them anyway (a long
/// handler's sends leave in chunks of this size). Measured on 2 vCPUs, 16-byte
/// events: 64 KiB 7.2-7.4 M events/s, 256 KiB 6.4-7.1 M, 1 MiB 5.5-6.3 M; 1 KiB
/// events: 1.68-1.76 M, 1.89-1.95 M, 1.93-2.11 M (waking the writer task at 64 KiB
/// instead: 5.0-5.3 M and 1.99-2.06 M).
const HOLD_MAX: usize = 256 * 1024;

impl RemoteSink for Sink {
    fn send(&self, event: Event) -> Result<(), Rejected> {
        self.push(event, false)
    }

    fn send_held(&self, event: Event) -> Result<(), Rejected> {
        self.push(event, true)
    }

    fn flush(&self) {
        for link in &self.peers {
            link.write_queued(&self.room);
        }
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

impl Sink {
    /// Takes `event` for the peer (see [`RemoteSink::send`]); `held`: the sending task
    /// flushes at its batch end (see [`RemoteSink::send_held`]).
    fn push(&self, event: Event, held: bool) -> Result<(), Rejected> {
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
            let before = ob.buf.weight();
            if let Err(reason) = ob.push_event(self.route, &event) {
                let error = SendError::Unsendable {
                    stage: self.to.clone(),
                    reason: *reason,
                };
                return Err(Rejected { error, event });
            }
            // Counted before the bytes can be taken by the writer (it takes them under
            // this lock), so that no status ever shows it received and not sent.
            ob.sent += 1;
            // (Referenced binaries count: their memory is held until acknowledged.)
            let size = ob.buf.weight().saturating_sub(before);
            ob.unacked_bytes += size;
            let rs = &mut ob.routes[route];
            rs.credit -= 1;
            rs.in_flight += 1;
            rs.sent += 1;
            rs.unacked
                .push_back((event, u32::try_from(size).unwrap_or(u32::MAX)));
            // A held send wakes nobody (its task's batch end writes it); held bytes
            // that grew large this worker writes now.
            let full = held && ob.buf.weight() >= HOLD_MAX;
            let wake = !held && ob.signal();
            drop(ob);
            drop(released);
            if wake {
                link.wake.notify_one();
            }
            if full {
                // A long handler's sends leave in chunks, from this worker.
                link.write_queued(&self.room);
            }
            return Ok(());
        }
        if held {
            // What this task held may be what stands between it and room (credit
            // returns only for events written): written now.
            self.flush();
        }
        let error = if all_dead {
            SendError::Unreachable {
                stage: self.to.clone(),
                reason: "no live connection to its process".into(),
            }
        } else {
            SendError::QueueFull {
                stage: self.to.as_str().into(),
            }
        };
        Err(Rejected { error, event })
    }
}
