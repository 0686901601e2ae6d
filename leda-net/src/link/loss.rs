//! Telling a lost peer from a live one, and what a process does when one is lost.
//!
//! Owns the liveness settings ([`Liveness`]), the report of a lost process
//! ([`ProcessLost`]) and the policy ([`OnProcessLoss`]): end the run everywhere (the
//! default) or go on without the lost process. It does not read or write sockets:
//! the reader notices silence and broken connections, the writer sends heartbeats and
//! reports the events that were in flight, and both call in here.
//!
//! # Detection
//!
//! * A peer that dies (kill -9, a crash, RST or FIN without the `Quit` that ends every
//!   orderly close) is noticed as soon as its kernel closes the connection.
//! * A peer that goes silent (SIGSTOP, a partition, a pulled cable) is noticed when
//!   nothing at all was read from it for [`Liveness::silence`]: every link writes a
//!   `Heartbeat` frame when it has written nothing for half of [`Liveness::heartbeat`]
//!   (checked twice a period), so a live peer is never silent that long. Silence is
//!   counted only while this process runs (see [`watch`]). TCP keepalive and
//!   `TCP_USER_TIMEOUT` (set to the same bound) also end a connection whose data goes
//!   unacknowledged.
//! * Every process of a deployment has a link to every other one, so each notices on
//!   its own; under [`OnProcessLoss::End`] the first to notice also tells the others
//!   (`Lost` frame), so that a launcher reports the loss even when a daemon noticed it
//!   first and ended the run.

use std::fmt;
use std::time::Duration;

use leda_core::event::Event;
pub use leda_core::runtime::OnProcessLoss;
use serde::{Deserialize, Serialize};

use super::*;

/// How links tell a live peer from a lost one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Liveness {
    /// The longest a link goes without writing: one that has written nothing for half
    /// of this writes a heartbeat (checked twice a period).
    pub heartbeat: Duration,
    /// A peer nothing was read from for this long is lost.
    pub silence: Duration,
}

impl Default for Liveness {
    /// Heartbeats every 500 ms; a peer silent for 3 s is lost.
    fn default() -> Self {
        Liveness::with_silence(Duration::from_secs(3))
    }
}

impl Liveness {
    /// The silence bound in milliseconds from `LEDA_SILENCE_MS`, else the default (3 s):
    /// how a `leda-*` command's user sets it for a slow or lossy network (a bound under
    /// about twice TCP's retransmission back-off takes a total outage of half the bound
    /// for a loss, see docs/running-across-processes.md).
    pub fn from_env() -> Liveness {
        match std::env::var("LEDA_SILENCE_MS") {
            Err(_) => Liveness::default(),
            Ok(v) => match v.trim().parse::<u64>() {
                Ok(ms) => Liveness::with_silence(Duration::from_millis(ms)),
                Err(_) => {
                    tracing::warn!(value = %v, "LEDA_SILENCE_MS is not a number of milliseconds: using 3000");
                    Liveness::default()
                }
            },
        }
    }

    /// Peers silent for `silence` are lost; heartbeats go every sixth of it (so a few
    /// late or slow ones are not mistaken for a loss), at least every 10 ms.
    pub fn with_silence(silence: Duration) -> Liveness {
        let silence = silence.max(Duration::from_millis(60));
        Liveness {
            heartbeat: (silence / 6).max(Duration::from_millis(10)),
            silence,
        }
    }
}

impl Liveness {
    /// Sets TCP keepalive (probes after a second of idleness, one a second, three
    /// unanswered end the connection) and `TCP_USER_TIMEOUT` (data unacknowledged
    /// for [`Liveness::silence`] ends it) on `stream`; failures are logged (the
    /// heartbeats still bound detection).
    pub(crate) fn apply_to(&self, stream: &TcpStream) {
        let sock = socket2::SockRef::from(stream);
        let ka = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(1))
            .with_interval(Duration::from_secs(1))
            .with_retries(3);
        if let Err(e) = sock
            .set_tcp_keepalive(&ka)
            .and_then(|()| sock.set_tcp_user_timeout(Some(self.silence)))
        {
            tracing::debug!(error = %e, "cannot set TCP keepalive / user timeout");
        }
    }
}

/// Watches every link of the transport twice a heartbeat period, off the links' hot
/// paths (no timer per read or write): a link that wrote nothing for half a period
/// writes a `Heartbeat` (so a live link is never silent for much more than one period:
/// checked once a period, the gap was up to two, a third of the silence bound), and a
/// peer nothing was read from for the silence bound is lost (its writer then ends the
/// link, reader included; time its reader spent running handlers, reading nothing, does
/// not count). Ends with the transport (it holds a weak reference) or when the
/// transport closes.
///
/// Silence is counted only while this process itself runs: when a round comes later
/// than due (the process was stopped, SIGSTOP or a starved host, and its readers with
/// it), what queued up in the sockets meanwhile may not have been read yet, so that
/// delay is not counted as its peers' silence. Before, a process frozen for less than
/// the bound took a live peer for lost when it woke, ended the run and named that peer
/// (review finding, 2026-11-27); its peers judge its own silence. Only the delay is
/// left out, not the time before it, so a host starved round after round still
/// notices a silent peer, later.
///
/// It runs on a thread of its own, not on the transport's runtime: a reader that runs a
/// handler itself (`Inbound::run_claimed`) holds one runtime thread, and while the other
/// sleeps nothing polls the runtime's timers and sockets — a watch there did not run,
/// heartbeats were not sent, and a handler's first long run got this process taken for
/// lost by its peers. From here, a heartbeat wakes the writer through the runtime's
/// shared queue, which wakes a sleeping runtime thread.
pub(super) fn watch(t: std::sync::Weak<Transport>, l: Liveness) {
    let tick = l.heartbeat / 2;
    let (tick_ms, silence_ms) = (tick.as_millis() as u64, l.silence.as_millis() as u64);
    let mut stalls = Stalls::default();
    let mut last = std::time::Instant::now();
    loop {
        std::thread::sleep(tick);
        let Some(t) = t.upgrade() else { return };
        if t.closing.load(Relaxed) {
            return;
        }
        let now = t.now_ms();
        let late = last.elapsed().saturating_sub(tick);
        last = std::time::Instant::now();
        #[cfg(test)]
        if let Some(f) = &*lock(&t.mid_round) {
            f(late);
        }
        if late > tick / 2 {
            let late_ms = late.as_millis() as u64;
            tracing::debug!(late_ms, "liveness watch ran late");
            stalls.push(now, late_ms, 2 * silence_ms);
            if late_ms >= silence_ms / 2 {
                *lock(&t.stood_still) = (now, late_ms);
            }
        }
        // The round is noted once its stall is: a link that goes down meanwhile (its
        // reader read the close as this process woke) finds the round not yet noted,
        // and so a stall the watch has not seen (`link_down`). Noted first, as it was,
        // the link found neither when the watch was held up between the two, and a
        // daemon thawed after SIGSTOP said "it closed the connection (last heard from
        // 0.0 s before)", not that it had stood still (review finding).
        t.watched_ms.store(now, Release);
        for link in t.links() {
            if link.is_dead() {
                continue;
            }
            let heard = link.heard_ms.load(Relaxed);
            let quiet = now
                .saturating_sub(heard)
                .saturating_sub(stalls.since(heard));
            if quiet >= silence_ms && t.running.load(Relaxed) {
                let s = quiet as f64 / 1000.0;
                tracing::debug!(peer = %link.peer, silent_s = s, "peer silent; closing the link");
                link.lose(format!("nothing heard from it for {s:.1} s"));
            } else if now.saturating_sub(link.wrote_ms.load(Relaxed)) >= tick_ms {
                // Written nothing for a while: tell the peer this process is alive.
                link.send_frame(Frame::Heartbeat);
            }
        }
    }
}

/// The recent stalls of this process, as the liveness watch saw them: when each ended
/// (transport milliseconds) and how late it made the watch.
#[derive(Default)]
struct Stalls(std::collections::VecDeque<(u64, u64)>);

impl Stalls {
    /// Notes a stall that ended at `now`, forgetting those older than `keep`.
    fn push(&mut self, now: u64, late_ms: u64, keep: u64) {
        while self
            .0
            .front()
            .is_some_and(|&(end, _)| end + keep < now || self.0.len() >= 64)
        {
            self.0.pop_front();
        }
        self.0.push_back((now, late_ms));
    }

    /// How long this process stood still since `heard` (what it could not have read).
    fn since(&self, heard: u64) -> u64 {
        self.0
            .iter()
            .filter(|&&(end, _)| end > heard)
            .map(|&(_, late)| late)
            .sum()
    }
}

/// A process of the mapping that was lost during a run, as the run reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessLost {
    /// Its address in the mapping.
    pub process: String,
    /// The cluster it ran (index in the partition), if known.
    pub cluster: Option<usize>,
    /// The stages of that cluster.
    pub stages: Vec<String>,
    /// How it was lost: `silent for 3.0 s`, `connection reset by peer`, ...
    pub reason: String,
    /// How long nothing had been read from it when it was declared lost, milliseconds.
    pub silent_ms: u64,
    /// Events sent to it and not acknowledged: they failed with
    /// `SendError::Unreachable` and were reported to their sending stages.
    pub in_flight_lost: u64,
    /// Events it had acknowledged, that is accepted into its queues, over the run (on
    /// the links of the process that noticed the loss): they count as delivered, and
    /// those still queued when it died were lost with it (a queue is not persistent;
    /// how many is not known).
    pub delivered: u64,
    /// The process that noticed the loss.
    pub noticed_by: String,
}

impl fmt::Display for ProcessLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "process {}", self.process)?;
        match self.cluster {
            Some(c) if !self.stages.is_empty() => {
                write!(f, " (cluster {c}: {})", self.stages.join(", "))?
            }
            Some(c) => write!(f, " (cluster {c})")?,
            None => {}
        }
        write!(
            f,
            " was lost: {} (last heard from {:.1} s before); {} event(s) in flight to it \
             failed and were reported to their senders, and {} it had accepted over the \
             run count as delivered (those still queued there were lost with it) — \
             these figures are the links of {} alone, which noticed it",
            self.reason,
            self.silent_ms as f64 / 1000.0,
            self.in_flight_lost,
            self.delivered,
            self.noticed_by
        )
    }
}

/// Where each process of the deployment runs what: cluster index and its stages.
#[derive(Debug, Default)]
pub(crate) struct Topology {
    pub(crate) cluster_of: HashMap<String, usize>,
    pub(crate) clusters: Vec<Vec<String>>,
    /// The launcher's address (a daemon ends its run when it loses the launcher,
    /// whatever the policy, unless the run outlives its launcher).
    pub(crate) launcher: Option<String>,
    /// Under `Continue`, the run goes on when the launcher is lost too.
    pub(crate) outlive_launcher: bool,
}

impl Topology {
    /// Whether losing `process` ends the run here whatever the policy: it is the
    /// launcher, and the run does not outlive it.
    pub(crate) fn ends_with(&self, process: &str) -> bool {
        !self.outlive_launcher && self.launcher.as_deref() == Some(process)
    }
}

impl Transport {
    /// The processes lost so far in this run.
    pub fn lost(&self) -> Vec<ProcessLost> {
        lock(&self.lost).clone()
    }

    /// The policy of this run.
    pub fn policy(&self) -> &OnProcessLoss {
        &self.policy
    }

    /// The liveness settings of this run's links.
    pub fn liveness(&self) -> Liveness {
        self.liveness
    }

    /// Called by a link's writer once the link is down, before its `in_flight_lost`
    /// unacknowledged events are reported. Decides whether this was a loss (not the
    /// orderly end of the run) and applies the policy.
    pub(super) async fn link_down(&self, link: &Link, in_flight_lost: u64) {
        // (An orderly end is announced: this process is closing, or the peer said
        // `Quit`. A run that is stopping or closing here may be doing so because of
        // this very loss: a sender saw the link down before this was recorded.)
        if link.ended_in_order(self) {
            return;
        }
        let mut reason = lock(&link.lost)
            .clone()
            .unwrap_or_else(|| "the connection closed without the run ending".into());
        let silent_ms = self.now_ms().saturating_sub(link.heard_ms.load(Relaxed));
        let silence_ms = self.liveness.silence.as_millis() as u64;
        let now = self.now_ms();
        // Not watched for a while: this process is waking from a stall that the watch
        // has not seen yet (its readers may see the close first). Read before the
        // stall: the watch records a stall before it notes its round (`watch`).
        let unwatched = now.saturating_sub(self.watched_ms.load(Acquire));
        let (stall_end, stall_ms) = *lock(&self.stood_still);
        let stood_still = if stall_ms > 0 && now.saturating_sub(stall_end) < silence_ms {
            stall_ms
        } else if unwatched >= silence_ms / 2 {
            unwatched
        } else {
            0
        };
        // (The connection's end, however this process met it: its reader read the
        // close, or its writer found the connection broken.)
        let broken = [
            "it closed the connection",
            "writing to it failed",
            "the connection failed",
            "the connection closed",
        ]
        .iter()
        .any(|r| reason.starts_with(r));
        if stood_still > 0 && broken {
            // A peer that closed while this process stood still most likely took it for
            // lost (at least the bound) or may have (less). Said so, as this process names
            // the peer (review finding: a launcher frozen for 6 s named a live daemon,
            // "nothing heard from it for 6.0 s").
            let likely = if stood_still >= silence_ms {
                "most likely took"
            } else {
                "may have taken"
            };
            reason = format!(
                "{reason}, after this process stood still for about {:.1} s (SIGSTOP, a \
                 starved host): the peer {likely} this process for lost",
                stood_still as f64 / 1000.0
            );
        }
        let cluster = self.topology.cluster_of.get(&link.peer).copied();
        let lost = ProcessLost {
            process: link.peer.clone(),
            cluster,
            stages: cluster
                .and_then(|c| self.topology.clusters.get(c).cloned())
                .unwrap_or_default(),
            reason,
            silent_ms,
            in_flight_lost,
            delivered: link.acked.iter().map(|a| a.load(Acquire)).sum(),
            noticed_by: self.me.clone(),
        };
        if self.topology.launcher.is_some() || self.policy != OnProcessLoss::End {
            // (Under `Continue` the run goes on: this line is how its user learns of it.)
            tracing::warn!(me = %self.me, "{lost}");
        } else {
            // The launcher returns it as the run's error: the caller reports it.
            tracing::info!(me = %self.me, "{lost}");
        }
        // (Not told to others when only the close made it one: see `shut_before_close`.)
        let tell = !link.shut_before_close.load(SeqCst);
        self.record_loss(lost, tell).await;
    }

    /// Tells `peer` of the losses recorded so far: for the launcher, whose link a daemon
    /// attaches only at the start, and so missed a loss noticed during the deployment
    /// (the daemon's run then ended at once, and the launcher, told of nothing but the
    /// run's end, took it for a normal one: `Ok`, every event discarded).
    pub(crate) fn tell_losses(&self, peer: &str) {
        let Some(link) = lock(&self.links).get(peer).cloned() else {
            return;
        };
        for lost in self.lost() {
            link.send_frame(Frame::Lost(Box::new(lost)));
        }
    }

    /// A peer tells of a loss it noticed (`Lost` frame).
    pub(super) async fn peer_reported_loss(&self, lost: ProcessLost) {
        if lost.process == self.me {
            return; // (a frozen process that woke up: its peers already went on)
        }
        self.record_loss(lost, false).await;
    }

    /// Records `lost` (once per process) and applies the policy; `tell`: the others are
    /// told of it (a loss this process noticed itself) when it ends the run.
    async fn record_loss(&self, lost: ProcessLost, tell: bool) {
        {
            let mut all = lock(&self.lost);
            if all.iter().any(|l| l.process == lost.process) {
                return;
            }
            all.push(lost.clone());
        }
        let is_launcher = self.topology.ends_with(&lost.process);
        match (&self.policy, is_launcher) {
            (OnProcessLoss::End, _) | (_, true) => {
                if tell && !is_launcher {
                    // The others end too, and know why.
                    for l in self.links() {
                        if !l.is_dead() {
                            l.send_frame(Frame::Lost(Box::new(lost.clone())));
                        }
                    }
                }
                if let Some(h) = self.handle_tx.borrow().clone() {
                    h.quit(Event::new());
                }
            }
            (OnProcessLoss::Continue { notify }, false) => {
                let Some(stage) = notify else { return };
                let Some((h, _)) = self.handle().await else {
                    return;
                };
                let Some(i) = h.stage_index(stage) else {
                    tracing::warn!(stage, "on_process_loss: no such stage here to notify");
                    return;
                };
                let mut ev = Event::from((
                    "process_lost",
                    lost.process.clone(),
                    lost.cluster.map_or(-1, |c| c as i64),
                    lost.reason.clone(),
                ));
                // Told even when its queue is full for a while.
                loop {
                    match h.inject(i, ev) {
                        Ok(()) => break,
                        Err(r) if matches!(r.error, SendError::QueueFull { .. }) => {
                            if h.is_stopping() {
                                break;
                            }
                            ev = r.event;
                            tokio::time::sleep(RETRY).await;
                        }
                        Err(r) => {
                            tracing::warn!(stage, error = %r.error, "could not tell of a lost process");
                            break;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Stalls;

    /// What a stall excuses: only the delays that ended after the peer was last heard,
    /// and only their length (a host starved round after round still counts the rest).
    #[test]
    fn stalls_excuse_only_their_own_delay_since_the_peer_was_heard() {
        let mut s = Stalls::default();
        assert_eq!(s.since(0), 0);
        s.push(10_000, 2_400, 6_000);
        assert_eq!(s.since(9_000), 2_400, "a stop after the peer was heard");
        assert_eq!(s.since(10_000), 0, "heard after it: nothing to excuse");
        s.push(11_000, 300, 6_000);
        s.push(12_000, 300, 6_000);
        assert_eq!(s.since(9_000), 3_000);
        assert_eq!(s.since(10_500), 600);
        // Forgotten once older than `keep`.
        s.push(17_000, 100, 6_000);
        assert_eq!(s.since(0), 300 + 300 + 100);
        // At most 64 remembered.
        for i in 0..100 {
            s.push(20_000 + i, 1, 1_000_000);
        }
        assert_eq!(s.0.len(), 64);
    }
}
