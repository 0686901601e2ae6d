//! The writer task of a link: writes what the outbox accumulated (vectored for
//! spliced binaries, heartbeats included), and when the link ends reports everything
//! still unacknowledged. The only task that writes the socket.

use super::*;

/// Writes `out`: one plain write without spliced binaries, vectored writes with them.
pub(super) async fn write_out(
    wr: &mut crate::conn::WriteHalf,
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

pub(super) async fn write_loop(
    t: Arc<Transport>,
    link: Arc<Link>,
    mut wr: crate::conn::WriteHalf,
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
            // A lost peer (silent: frozen, cut off) may never read what is written to
            // it: the write ends with the link.
            let written = tokio::select! {
                biased;
                _ = link.dead_notify.notified() => break,
                // (TLS holds records back until flushed; plain TCP's flush is free.)
                r = async { write_out(&mut wr, &bytes).await?; wr.flush().await } => r,
            };
            if let Err(e) = written {
                tracing::warn!(peer = %link.peer, error = %e, "link write failed");
                link.lose(format!("writing to it failed ({e})"));
                break;
            }
            // For the liveness watch: a link that writes needs no heartbeat.
            link.wrote_ms.store(t.now_ms(), Relaxed);
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
    // Everything still queued or unacknowledged on this link is undelivered; nothing
    // more is taken (senders see `down` under the same lock).
    let undelivered: Vec<(usize, Vec<Event>)> = {
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
    // The end of the run (here, or at the peer, which said `Quit`): what was not
    // acknowledged is discarded. Otherwise the peer is lost: that is recorded (and
    // the policy applied) first, then its events fail back to their senders.
    let at_end = t.closing.load(Relaxed) || link.goodbye.load(Acquire);
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
