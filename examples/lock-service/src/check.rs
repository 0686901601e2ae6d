//! The history of a `lock-check` run and its checker.
//!
//! A history is JSON lines, every time CLOCK_MONOTONIC nanoseconds of one host:
//!
//! - `{"kind":"hold","lock":L,"client":C,"fence":F,"acquired_ns":T,"ended_ns":T|null,
//!   "end":"released"|"lease_expired"|null}` per lock hold: `acquired_ns` when the client
//!   learnt of the grant, `ended_ns` the earlier of the moment it asked for the release and
//!   the moment the service expired its lease (null if neither happened);
//! - `{"kind":"write","lock":L,"client":C,"fence":F,"accepted":bool}` per register write, in
//!   the register's order;
//! - `{"kind":"final","lock":L,"register":N}` per lock at the end (N: the register's value,
//!   which each accepted write incremented by one);
//! - `{"kind":"fault","what":W,"target":T,"at_ns":T}` per injected fault.
//!
//! [`check`] reports, per lock: **overlapping holds** (a hold acquired before the previous
//! hold ended), **fence regressions** (a hold, in acquisition order, whose fence is not above
//! the previous one's), **lost updates** (fewer increments in the register than accepted
//! writes) and **stale writes accepted** (an accepted write whose fence is below one the
//! register accepted before). A hold that ended before the client learnt of it (a client
//! paused between the grant and its delivery past its lease) is void: it held nothing, and
//! is counted apart.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A lock hold.
    Hold {
        /// The lock.
        lock: String,
        /// The client.
        client: String,
        /// Its fence.
        fence: u64,
        /// When the client learnt of the grant.
        acquired_ns: u64,
        /// When it ended, if it did.
        ended_ns: Option<u64>,
        /// How it ended (`released`, `lease_expired`), if it did.
        end: Option<String>,
    },
    /// A register write, in the register's order.
    Write {
        /// The lock guarding it.
        lock: String,
        /// The writer.
        client: String,
        /// The fence it carried.
        fence: u64,
        /// Whether the register took it.
        accepted: bool,
    },
    /// The register's final value for a lock.
    Final {
        /// The lock.
        lock: String,
        /// The value.
        register: u64,
    },
    /// An injected fault.
    Fault {
        /// What (`kill`, `stop`, `cont`, `restart`...).
        what: String,
        /// Whom.
        target: String,
        /// When.
        at_ns: u64,
    },
}

/// What [`check`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Holds, void ones included.
    pub holds: usize,
    /// Holds that ended before the client learnt of them.
    pub void_holds: usize,
    /// Holds ended by an expired lease.
    pub expired: usize,
    /// Register writes.
    pub writes: usize,
    /// Register writes accepted.
    pub accepted: usize,
    /// Faults injected.
    pub faults: usize,
    /// Overlapping holds, described.
    pub overlaps: Vec<String>,
    /// Fence regressions, described.
    pub regressions: Vec<String>,
    /// Lost updates, described.
    pub lost: Vec<String>,
    /// Stale writes accepted, described.
    pub stale: Vec<String>,
}

impl Report {
    /// `true` if no anomaly was found.
    pub fn ok(&self) -> bool {
        self.overlaps.is_empty()
            && self.regressions.is_empty()
            && self.lost.is_empty()
            && self.stale.is_empty()
    }
}

impl Report {
    /// The counts, named as the `CHECK` line names them.
    pub fn counts(&self) -> [(&'static str, usize); 10] {
        [
            ("holds", self.holds),
            ("void", self.void_holds),
            ("expired", self.expired),
            ("writes", self.writes),
            ("accepted", self.accepted),
            ("faults", self.faults),
            ("overlaps", self.overlaps.len()),
            ("fence_regressions", self.regressions.len()),
            ("lost_updates", self.lost.len()),
            ("stale_accepted", self.stale.len()),
        ]
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, n)) in self.counts().iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(f, "{sep}{name}={n}")?;
        }
        Ok(())
    }
}

/// Checks a history (see the module docs).
pub fn check(records: &[Record]) -> Report {
    let mut r = Report::default();
    // Per lock: (acquired, ended, fence, client).
    type Span<'a> = (u64, Option<u64>, u64, &'a str);
    let mut holds: BTreeMap<&str, Vec<Span>> = BTreeMap::new();
    let mut max_fence: BTreeMap<&str, u64> = BTreeMap::new();
    let mut accepted: BTreeMap<&str, u64> = BTreeMap::new();
    let mut finals: BTreeMap<&str, u64> = BTreeMap::new();
    for rec in records {
        match rec {
            Record::Hold {
                lock,
                client,
                fence,
                acquired_ns,
                ended_ns,
                end,
            } => {
                r.holds += 1;
                if end.as_deref() == Some("lease_expired") {
                    r.expired += 1;
                }
                if ended_ns.is_some_and(|e| e < *acquired_ns) {
                    r.void_holds += 1;
                    continue;
                }
                holds
                    .entry(lock)
                    .or_default()
                    .push((*acquired_ns, *ended_ns, *fence, client));
            }
            Record::Write {
                lock,
                client,
                fence,
                accepted: ok,
            } => {
                r.writes += 1;
                if !ok {
                    continue;
                }
                r.accepted += 1;
                *accepted.entry(lock).or_default() += 1;
                let max = max_fence.entry(lock).or_default();
                if *fence < *max {
                    r.stale.push(format!(
                        "{lock}: write by {client} with fence {fence} accepted after fence {max}"
                    ));
                }
                *max = (*max).max(*fence);
            }
            Record::Final { lock, register } => {
                finals.insert(lock, *register);
            }
            Record::Fault { .. } => r.faults += 1,
        }
    }
    for (lock, hs) in &mut holds {
        hs.sort_by_key(|h| h.0);
        // The latest end among the holds acquired so far, and whose it is.
        let mut open: Option<(u64, Option<u64>, &str, u64)> = None;
        let mut prev: Option<(u64, &str)> = None;
        for &(acq, end, fence, client) in hs.iter() {
            if let Some((from, until, who, f)) = open
                && until.is_none_or(|u| acq < u)
            {
                let until = until.map_or("never".into(), |u| u.to_string());
                r.overlaps.push(format!(
                    "{lock}: {client} (fence {fence}) acquired at {acq} while {who} (fence {f}) \
                     held it from {from} to {until}"
                ));
            }
            if let Some((pf, who)) = prev
                && fence <= pf
            {
                r.regressions.push(format!(
                    "{lock}: {client} got fence {fence} after {who}'s {pf}"
                ));
            }
            prev = Some((fence, client));
            let later = match open {
                None => true,
                Some((_, until, _, _)) => match (until, end) {
                    (None, _) => false,
                    (Some(_), None) => true,
                    (Some(u), Some(e)) => e > u,
                },
            };
            if later {
                open = Some((acq, end, client, fence));
            }
        }
    }
    let locks: std::collections::BTreeSet<&str> =
        accepted.keys().chain(finals.keys()).copied().collect();
    for lock in locks {
        let (a, f) = (accepted.get(lock).copied().unwrap_or(0), finals.get(lock));
        match f {
            Some(&n) if n == a => {}
            Some(&n) => r.lost.push(format!(
                "{lock}: {a} accepted increments, register holds {n}"
            )),
            None => r
                .lost
                .push(format!("{lock}: {a} accepted writes and no final value")),
        }
    }
    r
}

/// Parses a history, one JSON record per line (blank lines skipped).
pub fn parse(text: &str) -> Result<Vec<Record>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(client: &str, fence: u64, acq: u64, end: Option<u64>) -> Record {
        Record::Hold {
            lock: "x".into(),
            client: client.into(),
            fence,
            acquired_ns: acq,
            ended_ns: end,
            end: end.map(|_| "released".into()),
        }
    }

    fn write(client: &str, fence: u64, accepted: bool) -> Record {
        Record::Write {
            lock: "x".into(),
            client: client.into(),
            fence,
            accepted,
        }
    }

    fn fin(n: u64) -> Record {
        Record::Final {
            lock: "x".into(),
            register: n,
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let h = vec![
            hold("a", 1, 10, Some(20)),
            hold("b", 2, 25, Some(30)),
            hold("a", 3, 31, None),
            write("a", 1, true),
            write("b", 2, true),
            write("a", 1, false),
            write("a", 3, true),
            fin(3),
        ];
        let r = check(&h);
        assert!(r.ok(), "{r:?}");
        assert_eq!((r.holds, r.writes, r.accepted), (3, 4, 3));
    }

    #[test]
    fn each_anomaly_is_found() {
        // b acquired while a held; c's fence went down; a stale fence accepted; a lost
        // increment; a hold that never ended covers every later one.
        let h = vec![
            hold("a", 5, 10, Some(20)),
            hold("b", 6, 15, Some(25)),
            hold("c", 4, 30, Some(40)),
            hold("d", 7, 50, None),
            hold("e", 8, 60, Some(70)),
            write("a", 5, true),
            write("b", 6, true),
            write("c", 4, true),
            fin(2),
        ];
        let r = check(&h);
        assert_eq!(r.overlaps.len(), 2, "{:?}", r.overlaps);
        assert_eq!(r.regressions.len(), 1, "{:?}", r.regressions);
        assert_eq!(r.stale.len(), 1, "{:?}", r.stale);
        assert_eq!(r.lost.len(), 1, "{:?}", r.lost);
        assert!(!r.ok());
    }

    #[test]
    fn a_void_hold_is_counted_apart_and_the_history_round_trips() {
        let h = vec![hold("a", 1, 10, Some(30)), hold("b", 0, 40, Some(20))];
        let r = check(&h);
        assert!(r.ok(), "{r:?}");
        assert_eq!(r.void_holds, 1);
        let text: String = h
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        assert!(text.contains(r#""kind":"hold""#), "{text}");
        assert_eq!(parse(&text).unwrap(), h);
    }
}
