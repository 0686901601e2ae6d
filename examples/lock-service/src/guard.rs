//! Majority guard: a serving node stops when its failure detector holds a majority of the
//! group crashed.
//!
//! The crash-tolerant quorum algorithms assume crash-stop processes and a perfect detector.
//! A partition breaks both: the cut-off node and the others take each other for crashed, each
//! side shrinks its quorums to what it still sees, and after the partition heals both sides
//! grant the same lock (`lock-check` found overlapping holds and lost updates this way). So a
//! node that holds a majority of the group crashed stops its own process, making the
//! detector's verdict true: the side that keeps a majority goes on, the other stops, and a
//! stopped node never rejoins (crash-stop; restart the group for a new epoch). The price is
//! availability: two successive partitions of different nodes can stop a 3-node group.
//!
//! **Excluded.** A node paused (SIGSTOP) or cut off past the detector's timeout is taken for
//! crashed by the others, who go on without it; when it runs again nothing told it so, and it
//! served its clients on (renewing their leases while the others granted the same locks). Now
//! the first answer whose counters hold it crashed stops it too.
//!
//! **Vouched.** The guard also records when each node last showed it held this one correct
//! ([`NoticeObserver::heard`]): [`MajorityGuard::vouched`] says whether a majority did within
//! half the detector's timeout, which no node can then have taken this one for crashed. The
//! gate renews a client's lease only then (see [`crate::gate`]), and the others, taking over
//! a lock last granted by a node they hold crashed, wait out the longest lease it can have
//! renewed ([`MajorityGuard::takeover_margin`] beyond the longest TTL).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use leda_mutex::ft_quorum::detector::{DetectorConfig, Evidence, NoticeObserver};

/// The observer that stops the process (see the module docs).
#[derive(Debug)]
pub struct MajorityGuard {
    n: usize,
    crashed: Mutex<BTreeSet<usize>>,
    /// Per node, when it last held this node correct (creation time at first).
    heard: Mutex<Vec<Instant>>,
    config: DetectorConfig,
}

impl MajorityGuard {
    /// A guard for a group of `n` nodes whose detectors run with `config`.
    pub fn new(n: usize, config: DetectorConfig) -> MajorityGuard {
        MajorityGuard {
            n,
            crashed: Mutex::default(),
            heard: Mutex::new(vec![Instant::now(); n]),
            config,
        }
    }

    /// `true` if this node's detector holds `node` crashed.
    pub fn is_crashed(&self, node: usize) -> bool {
        lock(&self.crashed).contains(&node)
    }

    /// `true` when a majority of the group, `me` included, held `me` correct within half
    /// the detector's timeout: none of them can have taken it for crashed since (a test
    /// stays unanswered a whole timeout first).
    pub fn vouched(&self, me: usize) -> bool {
        let window = self.config.timeout / 2;
        let now = Instant::now();
        let crashed = lock(&self.crashed);
        let recent = lock(&self.heard)
            .iter()
            .enumerate()
            .filter(|&(j, &t)| j != me && !crashed.contains(&j) && now - t <= window)
            .count();
        // With `me`, a majority: recent + 1 >= n / 2 + 1.
        recent >= self.n / 2
    }

    /// How much longer than the longest lease a node taking over a lock from a node it holds
    /// crashed waits: the time the others may still have vouched for that node after the first
    /// of them took it for crashed (the news spreads in at most log₂² n rounds, VCube's bound,
    /// plus a timeout), twice over.
    pub fn takeover_margin(&self) -> Duration {
        let d = self.n.next_power_of_two().trailing_zeros().max(1);
        (self.config.period * (d * d) + self.config.timeout) * 2
    }

    /// Records that `node` crashed; `true` once fewer than a majority remain.
    pub fn lost_majority(&self, node: usize) -> bool {
        let mut c = lock(&self.crashed);
        c.insert(node);
        self.n - c.len().min(self.n) < self.n / 2 + 1
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl NoticeObserver for MajorityGuard {
    fn heard(&self, _time: f64, _observer: usize, from: usize) {
        if let Some(t) = lock(&self.heard).get_mut(from) {
            *t = Instant::now();
        }
    }

    fn excluded(&self, _time: f64, observer: usize, by: usize) {
        eprintln!(
            "lock-service: node {by} holds node {observer} crashed (it was paused or cut off \
             past the detector's timeout, and the group went on without it): stopping"
        );
        std::process::exit(3);
    }

    fn crashed(&self, _time: f64, observer: usize, crashed: usize, evidence: Evidence) {
        tracing::warn!(observer, crashed, ?evidence, "node held crashed");
        if self.lost_majority(crashed) {
            eprintln!(
                "lock-service: node {observer} holds a majority of the group crashed: stopping \
                 (fail-stop; the side with a majority goes on)"
            );
            std::process::exit(3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_is_lost_at_the_right_count() {
        let g = MajorityGuard::new(3, DetectorConfig::default());
        assert!(!g.lost_majority(2));
        assert!(!g.lost_majority(2), "the same node twice counts once");
        assert!(g.lost_majority(1));
        let g = MajorityGuard::new(5, DetectorConfig::default());
        assert!(!g.lost_majority(1) && !g.lost_majority(2));
        assert!(g.lost_majority(3));
    }

    #[test]
    fn vouched_by_a_recent_majority_only() {
        let config = DetectorConfig {
            period: Duration::from_millis(10),
            timeout: Duration::from_millis(40),
        };
        let g = MajorityGuard::new(3, config);
        assert!(g.vouched(0), "just started: every node counts as heard");
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !g.vouched(0),
            "nothing heard for more than half the timeout"
        );
        g.heard(0.0, 0, 2);
        assert!(g.vouched(0), "node 2 and node 0: a majority of 3");
        g.lost_majority(2);
        assert!(!g.vouched(0), "a crashed node does not vouch");
        assert!(g.is_crashed(2) && !g.is_crashed(1));
        // n = 3: 2 dimensions of the completed cube, (4 rounds + a timeout) twice.
        assert_eq!(g.takeover_margin(), Duration::from_millis(160));
    }
}
