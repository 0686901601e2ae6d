//! The writer task of a link: writes what the outbox accumulated (vectored for
//! spliced binaries, heartbeats included) when no sending worker did, and when the
//! link ends reports everything still unacknowledged. On plain TCP a sending worker
//! writes the socket itself at the end of its batch ([`write_now`], never waiting),
//! so the writer mostly writes under load, under TLS, and what a worker left.

use super::*;

/// Slices per vectored write (well under `IOV_MAX`).
const IOV: usize = 1024;

/// Where byte `from` of the stream `segs` is: (segment, offset in it).
fn seek(segs: &[&[u8]], mut from: usize) -> (usize, usize) {
    let mut i = 0;
    while i < segs.len() && from >= segs[i].len() {
        from -= segs[i].len();
        i += 1;
    }
    (i, from)
}

/// Moves (segment, offset) `n` bytes on.
fn advance(segs: &[&[u8]], (mut i, mut skip): (usize, usize), mut n: usize) -> (usize, usize) {
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
    (i, skip)
}

/// The slices from (segment, offset) on, at most [`IOV`].
fn slices<'a>(segs: &[&'a [u8]], (i, skip): (usize, usize), iov: &mut Vec<std::io::IoSlice<'a>>) {
    iov.clear();
    iov.push(std::io::IoSlice::new(&segs[i][skip..]));
    iov.extend(
        segs[i + 1..]
            .iter()
            .take(IOV - 1)
            .map(|s| std::io::IoSlice::new(s)),
    );
}

/// Writes `out` from byte `from` on: one plain write without spliced binaries,
/// vectored writes with them.
pub(super) async fn write_out(
    wr: &mut crate::conn::WriteHalf,
    out: &Outgoing,
    from: usize,
) -> std::io::Result<()> {
    if out.splices.is_empty() {
        return wr.write_all(&out.bytes[from..]).await;
    }
    let segs = out.segments();
    let mut at = seek(&segs, from);
    let mut iov = Vec::with_capacity(IOV.min(segs.len()));
    while at.0 < segs.len() {
        slices(&segs, at, &mut iov);
        let n = wr.write_vectored(&iov).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        at = advance(&segs, at, n);
    }
    Ok(())
}

/// Writes `out` to `sock` without waiting: the number of bytes written (all of them,
/// or as many as the socket took before it would block).
pub(super) fn write_now(sock: &std::net::TcpStream, out: &Outgoing) -> std::io::Result<usize> {
    use std::io::Write;
    let segs = out.segments();
    let (mut at, mut written) = ((0, 0), 0);
    let mut iov = Vec::with_capacity(IOV.min(segs.len()));
    while at.0 < segs.len() {
        slices(&segs, at, &mut iov);
        let n = match (&*sock).write_vectored(&iov) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        written += n;
        at = advance(&segs, at, n);
    }
    Ok(written)
}

/// Rounds of [`Link::write_queued`] before what is left goes to the writer task.
const DIRECT_ROUNDS: usize = 4;

impl Link {
    /// Sends what is queued: the calling thread writes it if nobody else writes and
    /// the socket takes it without waiting (plain TCP); what it cannot write, and
    /// everything under TLS, goes to the writer task. `room` wakes senders waiting
    /// for room (a large backlog was taken).
    pub(super) fn write_queued(&self, room: &Notify) {
        let mut rounds = 0;
        loop {
            let wrote = rounds > 0;
            let (out, sock) = {
                let mut ob = lock(&self.outbox);
                // After a few rounds, what keeps coming goes to the writer task.
                let taken = if rounds == DIRECT_ROUNDS {
                    None
                } else {
                    ob.take_direct()
                };
                match taken {
                    Some(taken) => taken,
                    None => {
                        let wake = ob.needs_writer(wrote);
                        drop(ob);
                        if wake {
                            self.wake.notify_one();
                        }
                        return;
                    }
                }
            };
            rounds += 1;
            if out.bytes.len() >= MAX_BACKLOG {
                room.notify_waiters();
            }
            let written = write_now(&sock, &out);
            drop(sock);
            let n = match written {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(peer = %self.peer, error = %e, "link write failed");
                    // The writer task ends the link and reports what it held.
                    self.lose(format!("writing to it failed ({e})"));
                    lock(&self.outbox).writing = false;
                    return;
                }
            };
            if n > 0 {
                let now = self.epoch.elapsed().as_millis() as u64;
                self.wrote_ms.store(now, Relaxed);
            }
            let mut ob = lock(&self.outbox);
            if n < out.len() {
                // The rest waits for room in the socket: the writer's job.
                ob.writing = false;
                ob.partial = Some((out, n));
                ob.signalled = true;
                drop(ob);
                self.wake.notify_one();
                return;
            }
            if !ob.end_write(out) {
                return;
            }
        }
    }
}

/// The reader did not read to the end of what the peer sent (it runs a handler, say):
/// whether a `Quit` came before the peer's close is not known, so a close the peer made
/// before this process began closing is not counted a loss (`shut_before_close`); the
/// close is then the orderly end, as a close met while closing always was before.
fn unread_end(link: &Link) {
    link.shut_before_close.store(false, SeqCst);
}

pub(super) async fn write_loop(
    t: Arc<Transport>,
    link: Arc<Link>,
    mut wr: crate::conn::WriteHalf,
    mut reader: JoinHandle<()>,
) {
    let mut clean = false;
    // After a sending worker's partial write, the rest of the queue follows at once.
    let mut again = false;
    loop {
        if !std::mem::take(&mut again) {
            tokio::select! {
                biased;
                _ = link.dead_notify.notified() => break,
                _ = link.wake.notified() => {}
            }
        }
        // The buffer is swapped with the outbox's: one is filled by senders while the
        // other is written.
        let (out, from, close) = {
            let mut ob = lock(&link.outbox);
            if ob.writing {
                // A sending worker writes: it wakes this task if it leaves anything.
                // This wake-up is spent: the next one must come (see `Outbox::signal`).
                ob.signalled = false;
                continue;
            }
            match ob.partial.take() {
                Some((out, from)) => {
                    ob.writing = true;
                    again = true;
                    (out, from, false)
                }
                None => {
                    let (out, close) = ob.start_write();
                    (out, 0, close)
                }
            }
        };
        if out.bytes.len() >= MAX_BACKLOG {
            // Senders refused for the backlog may go on.
            t.room.notify_waiters();
        }
        if !out.is_empty() {
            // A lost peer (silent: frozen, cut off) may never read what is written to
            // it: the write ends with the link.
            let written = tokio::select! {
                biased;
                _ = link.dead_notify.notified() => break,
                // (TLS holds records back until flushed; plain TCP's flush is free.)
                r = async { write_out(&mut wr, &out, from).await?; wr.flush().await } => r,
            };
            if let Err(e) = written {
                tracing::warn!(peer = %link.peer, error = %e, "link write failed");
                link.lose(format!("writing to it failed ({e})"));
                break;
            }
            // For the liveness watch: a link that writes needs no heartbeat.
            link.wrote_ms.store(t.now_ms(), Relaxed);
        }
        // More queued meanwhile (by senders that hold their sends until their batch
        // ends, and found this task writing): written at once.
        again |= lock(&link.outbox).end_write(out);
        if close {
            clean = true;
            break;
        }
    }
    link.mark_dead();
    if clean {
        // Then wait for the peer to finish its side, processing its last replies (but
        // for a deployment that never started: nothing to wait for). Both within the
        // grace: under TLS the shutdown writes `close_notify`, which waits while a peer
        // reads nothing.
        let grace = if t.abandoned.load(Relaxed) {
            Duration::ZERO
        } else {
            CLOSE_GRACE
        };
        let deadline = tokio::time::Instant::now() + grace;
        let _ = tokio::time::timeout_at(deadline, wr.shutdown()).await;
        if tokio::time::timeout_at(deadline, &mut reader)
            .await
            .is_err()
        {
            tracing::debug!(peer = %link.peer, "peer did not close in time");
            unread_end(&link);
        }
    } else if link.shut_before_close.load(SeqCst) && !link.goodbye.load(Acquire) {
        // A write failed (the peer that had shut its side reset the connection), and
        // its reader may not have read all it sent before, a `Quit` perhaps (then the
        // run ended there in order): the end of it is in the socket already.
        if tokio::time::timeout(SHUT_DRAIN, &mut reader).await.is_err() {
            unread_end(&link);
        }
    }
    reader.abort();
    drop(wr);
    // Everything still queued or unacknowledged on this link is undelivered; nothing
    // more is taken (senders see `down` under the same lock).
    let (undelivered, peer): (Vec<(usize, Vec<Event>)>, _) = {
        let mut ob = lock(&link.outbox);
        ob.down = true;
        ob.open = None;
        ob.buf = Outgoing::default();
        ob.partial = None;
        ob.direct = None;
        // The peer is told the end now. Over plain TCP dropping the write half did it
        // already; under TLS both halves hold the stream, and the reader, perhaps
        // running a handler (its abort waits for its next await), holds it still.
        if let Some(sock) = ob.sock.take() {
            let _ = sock.shutdown(std::net::Shutdown::Write);
        }
        // (Events acknowledged before the end were delivered: not lost.)
        ob.absorb_all(&link.acked, &t.stats);
        ob.unacked_bytes = 0;
        let undelivered = ob
            .routes
            .iter_mut()
            .enumerate()
            .filter(|(_, rs)| rs.unacked.len() > rs.stale)
            .map(|(r, rs)| {
                let stale = std::mem::take(&mut rs.stale);
                rs.unacked.drain(..stale);
                (r, rs.unacked.drain(..).map(|(ev, _)| ev).collect())
            })
            .collect();
        (undelivered, ob.peer.take())
    };
    // The peer may still read binaries these events referenced (a frame left in its
    // socket, a paused process resumed): their memory stays while it can.
    if let Some(peer) = peer {
        memory::bury(&peer, undelivered.iter().flat_map(|(_, evs)| evs));
    }
    // Senders waiting for room on this link retry (and go elsewhere, or fail).
    t.room.notify_waiters();
    // The end of the run (here, or at the peer, which said `Quit`): what was not
    // acknowledged is discarded. Otherwise the peer is lost: that is recorded (and
    // the policy applied) first, then its events fail back to their senders.
    let at_end = link.ended_in_order(&t);
    let why = lock(&link.lost).clone();
    if !at_end {
        let failed = undelivered.iter().map(|(_, e)| e.len() as u64).sum();
        t.link_down(&link, failed).await;
    }
    for (r, evs) in undelivered {
        let n = evs.len() as u64;
        let stage = t.routes.get(r).map(|x| x.to.clone()).unwrap_or_default();
        let reason = match &why {
            Some(why) => format!("the process {} was lost: {why}", link.peer),
            None => format!("the connection to {} was lost", link.peer),
        };
        let err = SendError::Unreachable { stage, reason };
        if !at_end {
            tracing::warn!(peer = %link.peer, events = n, "events lost with the connection");
        }
        t.report_undelivered(r as u32, &err, evs, at_end).await;
        lock(&link.outbox).routes[r].in_flight -= n;
    }
    tracing::debug!(me = %t.me, peer = %link.peer, "link down");
}
