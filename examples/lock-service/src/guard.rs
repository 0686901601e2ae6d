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
//! crashed by the others, who go on without it; when it ran again nothing told it so, and it
//! served its clients on, renewing their leases for good while the others had granted the
//! same locks. Now the first answer whose counters hold it crashed stops it too.

use std::collections::BTreeSet;
use std::sync::Mutex;

use leda_mutex::ft_quorum::detector::{Evidence, NoticeObserver};

/// The observer that stops the process (see the module docs).
#[derive(Debug)]
pub struct MajorityGuard {
    n: usize,
    crashed: Mutex<BTreeSet<usize>>,
}

impl MajorityGuard {
    /// A guard for a group of `n` nodes.
    pub fn new(n: usize) -> MajorityGuard {
        MajorityGuard {
            n,
            crashed: Mutex::default(),
        }
    }

    /// Records that `node` crashed; `true` once fewer than a majority remain.
    pub fn lost_majority(&self, node: usize) -> bool {
        let mut c = self.crashed.lock().unwrap_or_else(|e| e.into_inner());
        c.insert(node);
        self.n - c.len().min(self.n) < self.n / 2 + 1
    }
}

impl NoticeObserver for MajorityGuard {
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
        let g = MajorityGuard::new(3);
        assert!(!g.lost_majority(2));
        assert!(!g.lost_majority(2), "the same node twice counts once");
        assert!(g.lost_majority(1));
        let g = MajorityGuard::new(5);
        assert!(!g.lost_majority(1) && !g.lost_majority(2));
        assert!(g.lost_majority(3));
    }
}
