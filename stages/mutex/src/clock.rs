//! Lamport logical clocks and the `(timestamp, pid)` total order used by the permission-based
//! algorithms (Lamport, Ricart–Agrawala, Roucairol–Carvalho, Sanders/Maekawa).

use serde::{Deserialize, Serialize};

use crate::node::NodeId;

/// A Lamport logical clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LamportClock {
    now: u64,
}

impl LamportClock {
    /// A clock at 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current value.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Local event: advance by one and return the new value.
    pub fn tick(&mut self) -> u64 {
        self.now += 1;
        self.now
    }

    /// Receive event: `now := max(now, remote) + 1`; returns the new value.
    pub fn observe(&mut self, remote: u64) -> u64 {
        self.now = self.now.max(remote) + 1;
        self.now
    }
}

/// A request's priority: smaller is earlier. Ordered by timestamp, ties broken by node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Stamp {
    /// Lamport timestamp of the request.
    pub ts: u64,
    /// Requesting node (tie-break).
    pub node: NodeId,
}

impl Stamp {
    /// Builds a stamp.
    pub fn new(ts: u64, node: NodeId) -> Self {
        Self { ts, node }
    }

    /// Encodes the stamp as a fencing token: `ts * n + node`. For stamps of one group of `n`
    /// nodes this is strictly monotone in the `(ts, node)` order, so a grant order that respects
    /// the stamp order yields strictly increasing fences.
    pub fn fence(&self, n: usize) -> u64 {
        self.ts
            .saturating_mul(n as u64)
            .saturating_add(self.node as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_ticks_and_observes() {
        let mut c = LamportClock::new();
        assert_eq!(c.tick(), 1);
        assert_eq!(c.observe(10), 11);
        assert_eq!(c.observe(3), 12);
    }

    #[test]
    fn stamp_order_and_fence_agree() {
        let n = 5;
        let mut stamps = Vec::new();
        for ts in 1..6 {
            for node in 0..n {
                stamps.push(Stamp::new(ts, node));
            }
        }
        stamps.sort();
        for w in stamps.windows(2) {
            assert!(w[0] < w[1]);
            assert!(w[0].fence(n) < w[1].fence(n));
        }
    }
}
