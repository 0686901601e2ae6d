//! The statistics collector: per-stage, per-connector and per-process counters, and
//! the snapshots built from them (JSON-serializable, one line per snapshot in a file).
//!
//! Hot-path cost is kept low: instances count locally and flush per batch; handler
//! latency is sampled (one event in [`LATENCY_SAMPLE`]); connector latency is measured
//! on one sent event in [`STAMP_SAMPLE`], stamped at send and read at handling.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One handler call in this many is timed (a clock read costs ~23 ns on a VM: at one in
/// 16 the two reads were 12 % of a one-thread pipeline's time). The sample is per worker
/// thread, across stages: a stage that sees few events gets few latency samples.
pub const LATENCY_SAMPLE: u64 = 64;
/// One sent event in this many carries a timestamp for connector latency.
pub const STAMP_SAMPLE: u32 = 256;

/// A send timestamp riding on a sampled event.
#[derive(Debug)]
pub(crate) struct Stamp {
    pub(crate) connector: usize,
    pub(crate) at: Instant,
}

const SUB_BUCKETS: usize = 8;
const BUCKETS: usize = 48 * SUB_BUCKETS;

/// A lock-free log-linear histogram of durations in nanoseconds (about 12% precision).
///
/// Not `hdrhistogram`: its `Histogram::record` takes `&mut self`, and this one is
/// recorded into by every worker at once on the send path (relaxed atomic adds, no
/// lock); the dashboard reads only a count, a sum and the p99, for which 48×8 buckets
/// are enough.
pub(crate) struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    pub(crate) fn new() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    fn index(ns: u64) -> usize {
        if ns < SUB_BUCKETS as u64 {
            return ns as usize;
        }
        let exp = 63 - ns.leading_zeros() as usize; // >= 3
        let sub = ((ns >> (exp - 3)) & (SUB_BUCKETS as u64 - 1)) as usize;
        ((exp - 2) * SUB_BUCKETS + sub).min(BUCKETS - 1)
    }

    fn lower_bound(i: usize) -> u64 {
        if i < SUB_BUCKETS {
            return i as u64;
        }
        let exp = i / SUB_BUCKETS + 2;
        let sub = (i % SUB_BUCKETS) as u64;
        (1u64 << exp) | (sub << (exp - 3))
    }

    pub(crate) fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[Self::index(ns)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// (count, sum in ns, p99 in ns).
    pub(crate) fn summary(&self) -> (u64, u64, u64) {
        let count = self.count.load(Relaxed);
        let sum = self.sum_ns.load(Relaxed);
        if count == 0 {
            return (0, 0, 0);
        }
        let target = count - count / 100;
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Relaxed);
            if seen >= target {
                return (count, sum, Self::lower_bound(i + 1).max(1));
            }
        }
        (count, sum, Self::lower_bound(BUCKETS))
    }
}

/// Counters of one stage, updated by its instances.
pub(crate) struct StageCounters {
    pub(crate) received: AtomicU64,
    pub(crate) handled: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) failed_sends: AtomicU64,
    pub(crate) discarded: AtomicU64,
    pub(crate) created: AtomicU64,
    pub(crate) busy_ns: AtomicU64,
    pub(crate) latency: Histogram,
}

impl StageCounters {
    pub(crate) fn new() -> Self {
        StageCounters {
            received: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            failed_sends: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            created: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            latency: Histogram::new(),
        }
    }
}

/// Counters of one connector.
pub(crate) struct ConnectorCounters {
    pub(crate) events: AtomicU64,
    pub(crate) latency: Histogram,
}

impl ConnectorCounters {
    pub(crate) fn new() -> Self {
        ConnectorCounters {
            events: AtomicU64::new(0),
            latency: Histogram::new(),
        }
    }
}

/// Statistics of one stage at one instant.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StageSnapshot {
    /// Stage name.
    pub name: String,
    /// Events waiting in the queue.
    pub queue_len: usize,
    /// Queue capacity.
    pub queue_capacity: usize,
    /// Live instances (idle, ready, running or waiting).
    pub instances: usize,
    /// Instances bound to work (ready, running or waiting).
    pub active: usize,
    /// Instances parked in the stage's pool, ready for the next event.
    pub idle: usize,
    /// Instances parked on an asynchronous operation.
    pub waiting: usize,
    /// Instance limit.
    pub maxpar: usize,
    /// Instances created so far (each ran `init`).
    pub created: u64,
    /// Events accepted into the queue (or handed off).
    pub events_in: u64,
    /// Events this stage sent on its ports.
    pub events_out: u64,
    /// Events handled, failed ones (`errors`) included.
    pub handled: u64,
    /// Handler errors and panics.
    pub errors: u64,
    /// Sends to this stage refused because its queue was full.
    pub rejected: u64,
    /// Events this stage sent that were accepted and could not be delivered after
    /// all, each reported to its `error` port: lost in transit to another process
    /// (see `ProcessHandle::report_failed`), or held by `Ctx::send_or_wait` and then
    /// refused.
    pub failed_sends: u64,
    /// Events accepted for this stage and dropped unhandled because the run ended (in
    /// a producer's batch, taken by an instance, or held by a waiting instance); those
    /// still queued are `queue_len`. At the end of a run, `events_in` = `handled` +
    /// `queue_len` + `discarded`, but for the events of handler calls the run left
    /// behind ([`crate::runtime::Run::leave_stuck_after`]), in none of them.
    #[serde(default)]
    pub discarded: u64,
    /// Mean handler latency, microseconds (sampled).
    pub latency_mean_us: f64,
    /// 99th-percentile handler latency, microseconds (sampled).
    pub latency_p99_us: f64,
    /// Events handled per second since the previous snapshot.
    pub throughput: f64,
    /// Worker time spent in this stage since the start, seconds.
    pub busy_s: f64,
}

/// Statistics of one connector at one instant.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ConnectorSnapshot {
    /// Emitting stage.
    pub from: String,
    /// Output port.
    pub port: String,
    /// Receiving stage.
    pub to: String,
    /// Connector kind.
    pub kind: String,
    /// Events carried.
    pub events: u64,
    /// Mean latency from send to the start of handling, microseconds (sampled).
    pub latency_mean_us: f64,
    /// Events per second since the previous snapshot.
    pub throughput: f64,
}

/// Statistics of the process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcessSnapshot {
    /// Worker threads.
    pub threads: usize,
    /// Threads running an instance now.
    pub busy_threads: usize,
    /// Instances waiting in the ready queue.
    pub ready_queue: usize,
    /// Resident memory, bytes (0 where unknown).
    pub rss_bytes: u64,
    /// CPU time the process has used so far (user and system), seconds (0 where
    /// unknown).
    #[serde(default)]
    pub cpu_s: f64,
}

/// The outcomes of the events one stage of this process sent to a stage of another
/// process (a remote route): each event taken is delivered (acknowledged: queued at
/// the destination), failed (reported to the sending stage), discarded (still
/// unacknowledged when the run ended), or still in flight.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RouteCounts {
    /// Emitting stage.
    pub from: String,
    /// Receiving stage.
    pub to: String,
    /// Events taken by this process' transport.
    pub sent: u64,
    /// Acknowledged by the receiving process.
    pub delivered: u64,
    /// Reported failed to the sending stage (refused, or lost with a process).
    pub failed: u64,
    /// Unacknowledged when the run ended.
    pub discarded: u64,
}

impl RouteCounts {
    /// Events neither delivered, failed nor discarded yet.
    pub fn in_flight(&self) -> u64 {
        self.sent
            .saturating_sub(self.delivered + self.failed + self.discarded)
    }

    /// `true` when every event sent is accounted for (`sent = delivered + failed +
    /// discarded`): always so once the run has ended.
    pub fn adds_up(&self) -> bool {
        self.sent == self.delivered + self.failed + self.discarded
    }
}

/// A statistics snapshot of one process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Snapshot {
    /// Seconds since the run started.
    pub time: f64,
    /// Process figures.
    pub process: ProcessSnapshot,
    /// One entry per stage of this process.
    pub stages: Vec<StageSnapshot>,
    /// One entry per connector leaving a stage of this process.
    pub connectors: Vec<ConnectorSnapshot>,
    /// The remote routes this process sends on, with the outcomes of their events
    /// (from the transport; empty in a single-process run).
    #[serde(default)]
    pub remote_routes: Vec<RouteCounts>,
}

/// The events whose handlers failed in a run, for one stage of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageFailures {
    /// The process (`"this process"` for the one that launched the run).
    pub process: String,
    /// The stage.
    pub stage: String,
    /// How many of its events failed.
    pub count: u64,
}

impl std::fmt::Display for StageFailures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} in '{}' ({})", self.count, self.stage, self.process)
    }
}

impl Snapshot {
    /// The stages of this snapshot, taken in `process`, whose handlers failed.
    pub fn failures(&self, process: &str) -> Vec<StageFailures> {
        self.stages
            .iter()
            .filter(|s| s.errors > 0)
            .map(|s| StageFailures {
                process: process.to_owned(),
                stage: s.name.clone(),
                count: s.errors,
            })
            .collect()
    }

    /// The entry of the stage named `name`.
    pub fn stage(&self, name: &str) -> Option<&StageSnapshot> {
        self.stages.iter().find(|s| s.name == name)
    }

    /// Fills the throughput fields from the previous snapshot of the same run.
    pub(crate) fn rates_from(&mut self, prev: &Snapshot) {
        let dt = self.time - prev.time;
        if dt <= 0.0 {
            return;
        }
        for (s, p) in self.stages.iter_mut().zip(&prev.stages) {
            s.throughput = (s.handled.saturating_sub(p.handled)) as f64 / dt;
        }
        for (c, p) in self.connectors.iter_mut().zip(&prev.connectors) {
            c.throughput = (c.events.saturating_sub(p.events)) as f64 / dt;
        }
    }
}

/// CPU time this process has used (user and system), seconds, from `/proc/self/stat`
/// (0 elsewhere).
pub fn cpu_time() -> f64 {
    // Fields 14 and 15 of /proc/self/stat, in USER_HZ (100 a second on Linux), counted
    // after the command name, which may hold spaces and parentheses.
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

/// Resident set size of this process in bytes, from `/proc/self/status` (0 elsewhere).
pub fn resident_memory() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_p99_within_precision() {
        let h = Histogram::new();
        for i in 1..=1000u64 {
            h.record(Duration::from_micros(i));
        }
        let (count, sum, p99) = h.summary();
        assert_eq!(count, 1000);
        assert_eq!(sum, (1..=1000u64).sum::<u64>() * 1000);
        let want = 990_000.0;
        assert!((p99 as f64 - want).abs() / want < 0.15, "p99 {p99}");
    }

    #[test]
    fn histogram_bucket_bounds_are_monotonic() {
        for i in 0..BUCKETS - 1 {
            assert!(
                Histogram::lower_bound(i) < Histogram::lower_bound(i + 1),
                "bucket {i}"
            );
        }
        for ns in [0u64, 1, 7, 8, 9, 100, 12345, 1 << 30] {
            let i = Histogram::index(ns);
            assert!(
                Histogram::lower_bound(i) <= ns && ns < Histogram::lower_bound(i + 1),
                "{ns}"
            );
        }
    }
}
