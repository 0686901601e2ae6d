//! Measurements of a simulated run (spec §3): messages per CS and per type, response (waiting)
//! time, synchronisation delay. Kept as raw samples so later experiments (mutex-exp CSV) can
//! derive any statistic.

use std::collections::BTreeMap;

use crate::node::Fence;

/// Counters and samples collected by the simulator.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Messages sent, per message kind: network messages (dropped ones included) and the
    /// messages a node sends to itself ([`crate::Output::Local`]).
    pub messages_by_kind: BTreeMap<&'static str, u64>,
    /// All messages sent (network and self-addressed, dropped ones included).
    pub messages_total: u64,
    /// Of [`Metrics::messages_total`], those a node sent to itself (never on a link).
    pub self_messages: u64,
    /// [`Metrics::messages_total`] at each grant, in grant order: the differences give the
    /// messages sent between consecutive grants (per-CS cost under concurrent load).
    pub messages_at_grant: Vec<u64>,
    /// Messages dropped by fault injection.
    pub messages_dropped: u64,
    /// Critical-section entries.
    pub cs_entries: u64,
    /// Response time of each grant: virtual time from request to grant.
    pub wait_times: Vec<u64>,
    /// Synchronisation delays: time from a release to the next grant, recorded when some node was
    /// already waiting at the release.
    pub sync_delays: Vec<u64>,
    /// With the serial workload only: messages sent from each request up to the next request
    /// (so each CS's full cost, request to release).
    pub per_cs_messages: Vec<u64>,
    /// Messages sent before the first request (e.g. a ring's idle token hops).
    pub messages_before_first_request: u64,
    /// Fences of the grants, in grant order.
    pub fences: Vec<Fence>,
    /// Virtual time when the run ended.
    pub end_time: u64,
    /// Events processed.
    pub events: u64,
}

fn mean(xs: &[u64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<u64>() as f64 / xs.len() as f64)
}

impl Metrics {
    /// Messages per CS entry (all kinds); `None` without entries.
    pub fn msgs_per_cs(&self) -> Option<f64> {
        (self.cs_entries > 0).then(|| self.messages_total as f64 / self.cs_entries as f64)
    }

    /// Messages of one kind per CS entry.
    pub fn msgs_per_cs_of(&self, kind: &str) -> Option<f64> {
        let count = self.messages_by_kind.get(kind).copied().unwrap_or(0);
        (self.cs_entries > 0).then(|| count as f64 / self.cs_entries as f64)
    }

    /// Mean and standard deviation of the messages per CS. With the serial workload each CS's
    /// exact cost (request to release) is a sample. Otherwise the mean is all messages over all
    /// entries, and the deviation is that of the messages sent between consecutive grants (the
    /// first window starts at time 0).
    pub fn msgs_per_cs_mean_std(&self) -> Option<(f64, f64)> {
        let std_of = |samples: &[u64], mean: f64| {
            (samples
                .iter()
                .map(|&x| (x as f64 - mean).powi(2))
                .sum::<f64>()
                / samples.len().max(1) as f64)
                .sqrt()
        };
        if !self.per_cs_messages.is_empty() {
            let mean = mean(&self.per_cs_messages)?;
            return Some((mean, std_of(&self.per_cs_messages, mean)));
        }
        let mean = self.msgs_per_cs()?;
        let mut prev = 0;
        let windows: Vec<u64> = self
            .messages_at_grant
            .iter()
            .map(|&m| {
                let d = m.saturating_sub(prev);
                prev = m;
                d
            })
            .collect();
        Some((mean, std_of(&windows, mean)))
    }

    /// Mean response time.
    pub fn mean_wait(&self) -> Option<f64> {
        mean(&self.wait_times)
    }

    /// Mean synchronisation delay.
    pub fn mean_sync_delay(&self) -> Option<f64> {
        mean(&self.sync_delays)
    }

    /// The `p`-th percentile (0–100, nearest rank) of the response times.
    pub fn wait_percentile(&self, p: f64) -> Option<u64> {
        if self.wait_times.is_empty() {
            return None;
        }
        let mut v = self.wait_times.clone();
        v.sort_unstable();
        let rank = ((p.clamp(0.0, 100.0) / 100.0) * v.len() as f64).ceil() as usize;
        v.get(rank.saturating_sub(1)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics() {
        let m = Metrics {
            messages_total: 12,
            cs_entries: 4,
            wait_times: vec![4, 1, 3, 2],
            ..Metrics::default()
        };
        assert_eq!(m.msgs_per_cs(), Some(3.0));
        assert_eq!(m.mean_wait(), Some(2.5));
        assert_eq!(m.wait_percentile(50.0), Some(2));
        assert_eq!(m.wait_percentile(100.0), Some(4));
        assert_eq!(Metrics::default().msgs_per_cs(), None);
    }
}
