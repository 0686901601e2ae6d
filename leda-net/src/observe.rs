//! Observation of peer processes for the launcher's dashboard: an `observe` frame asks
//! a peer for its statistics snapshot (and optionally applies a control action there
//! first); the `observed` frame answers. Through [`RemoteLinks`]'s `peer_stats` and
//! `peer_control`, the dashboard of a multi-process run shows (and steers) every process
//! its process is linked to; the launcher is linked to all of them.
//!
//! [`RemoteLinks`]: leda_core::runtime::executor::RemoteLinks

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leda_core::dashboard::{Control, PeerStats};
use leda_core::runtime::ProcessHandle;
use leda_core::stats::Snapshot;
use serde::{Deserialize, Serialize};

use crate::frame::Frame;
use crate::link::{Link, Transport};

/// How long the dashboard waits for peers' answers.
const ANSWER_WAIT: Duration = Duration::from_millis(500);

/// Request rounds, so that a late answer is never taken for a newer one.
static ROUND: AtomicU64 = AtomicU64::new(0);

/// Body of an `observe` frame.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObserveReq {
    /// Request round.
    pub round: u64,
    /// A control action to apply before answering.
    pub control: Option<Control>,
}

/// Body of an `observed` frame.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObserveReply {
    /// The request's round.
    pub round: u64,
    /// The process' snapshot (after the control action).
    pub snapshot: Snapshot,
    /// Why the control action failed.
    pub error: Option<String>,
}

/// Answers an `observe` request on this process.
pub(crate) fn answer(req: ObserveReq, h: &ProcessHandle) -> Frame {
    let error = req.control.as_ref().and_then(|c| c.apply(h).err());
    if let Some(c) = &req.control {
        tracing::info!(control = ?c, ?error, "control action from a peer's dashboard");
    }
    Frame::Observed(Box::new(ObserveReply {
        round: req.round,
        snapshot: h.snapshot(),
        error,
    }))
}

/// Records an answer and wakes whoever waits for it.
pub(crate) fn record(link: &Link, reply: ObserveReply) {
    *link.observed.lock().unwrap_or_else(|e| e.into_inner()) = Some(reply);
    link.observed_notify.notify_waiters();
}

async fn wait(link: &Link, round: u64, deadline: tokio::time::Instant) -> Option<ObserveReply> {
    let slot: &Mutex<Option<ObserveReply>> = &link.observed;
    let wait = async {
        loop {
            let notified = link.observed_notify.notified();
            if let Some(r) = slot.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
                && r.round >= round
            {
                return Some(r.clone());
            }
            notified.await;
        }
    };
    tokio::time::timeout_at(deadline, wait).await.ok().flatten()
}

/// Asks `links` (with `control`, if any) and collects the answers that come in time.
fn ask(
    t: &Transport,
    links: Vec<Arc<Link>>,
    control: Option<&Control>,
) -> Vec<(Arc<Link>, ObserveReply)> {
    // Blocking on the transport's runtime from one of its own threads would deadlock.
    if tokio::runtime::Handle::try_current().is_ok() {
        return Vec::new();
    }
    let round = ROUND.fetch_add(1, Relaxed) + 1;
    for l in &links {
        l.send_frame(Frame::Observe(ObserveReq {
            round,
            control: control.cloned(),
        }));
    }
    t.runtime().block_on(async {
        // One deadline for all: peers that do not answer cost half a second in all, not
        // each.
        let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
        let mut out = Vec::new();
        for l in links {
            if let Some(r) = wait(&l, round, deadline).await {
                out.push((l, r));
            }
        }
        out
    })
}

impl Transport {
    /// Snapshots of every linked process still running (those that answer within half a
    /// second; a process whose run ended, or whose link is down, is not asked: it would
    /// not answer, and every launch ending on a peer's `Quit` waited half a second for
    /// it).
    pub(crate) fn observe_peers(&self) -> Vec<PeerStats> {
        let links = self.links().into_iter().filter(|l| !l.ended()).collect();
        ask(self, links, None)
            .into_iter()
            .map(|(l, r)| PeerStats {
                name: l.peer().to_owned(),
                snapshot: r.snapshot,
            })
            .collect()
    }

    /// Applies `action` in the linked process `process`.
    pub(crate) fn control_peer(&self, process: &str, action: &Control) -> Result<(), String> {
        let link = self
            .links()
            .into_iter()
            .find(|l| l.peer() == process)
            .ok_or_else(|| format!("no link to process {process}"))?;
        match ask(self, vec![link], Some(action)).pop() {
            Some((_, r)) => r.error.map_or(Ok(()), Err),
            None => Err(format!("process {process} did not answer")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode, encode};

    #[test]
    fn observe_frames_round_trip() {
        let req = ObserveReq {
            round: 7,
            control: Some(Control::Maxpar {
                stage: "s".into(),
                n: 3,
            }),
        };
        let bytes = encode(&Frame::Observe(req.clone())).unwrap();
        match decode(&bytes[4..]).unwrap() {
            Frame::Observe(r) => assert_eq!(r, req),
            other => panic!("{}", other.name()),
        }
        let mut snapshot = Snapshot::default();
        snapshot.process.threads = 4;
        snapshot.stages.push(leda_core::stats::StageSnapshot {
            name: "s".into(),
            queue_len: 9,
            throughput: 1.5,
            ..Default::default()
        });
        let reply = ObserveReply {
            round: 7,
            snapshot,
            error: Some("no such stage".into()),
        };
        let bytes = encode(&Frame::Observed(Box::new(reply.clone()))).unwrap();
        match decode(&bytes[4..]).unwrap() {
            Frame::Observed(r) => assert_eq!(*r, reply),
            other => panic!("{}", other.name()),
        }
    }
}
