//! The application's rules: what `filter` keeps and what `correlate` detects.
//!
//! The thesis leaves both unspecified (the application is synthetic); these are:
//!
//! * **relevant** (filter): a server error (status ≥ 500) or a slow response
//!   (≥ [`SLOW_MICROS`]);
//! * **correlated burst** (correlate): within one window, an entry is *hot* when at
//!   least [`BURST_PEERS`] other entries from the same client are client or server
//!   errors (status ≥ 400) within [`BURST_SECONDS`] of it (and it is one too). Each
//!   client with a hot entry in a window raises one alarm. The comparison is
//!   pairwise over the whole window, O(w²), as in the thesis.

use crate::log::{Entry, ip_text};

/// A response at least this slow (µs) is relevant.
pub const SLOW_MICROS: u64 = 2_000_000;
/// Correlated errors must be this close in time (seconds).
pub const BURST_SECONDS: i64 = 30;
/// Other erroneous entries of the same client needed to make an entry hot.
pub const BURST_PEERS: usize = 3;

/// `filter`'s rule.
pub fn is_relevant(e: &Entry) -> bool {
    e.status >= 500 || e.micros >= SLOW_MICROS
}

/// `correlate`'s rule: the clients (sorted) with a hot entry in `window`, with the
/// number of their hot entries. Pairwise: every entry is compared with every other.
pub fn correlate(window: &[Entry]) -> Vec<(u32, usize)> {
    let mut hot: Vec<(u32, usize)> = Vec::new();
    for (i, a) in window.iter().enumerate() {
        let mut peers = 0usize;
        for (j, b) in window.iter().enumerate() {
            peers += usize::from(
                i != j
                    && a.ip == b.ip
                    && a.status >= 400
                    && b.status >= 400
                    && (a.time - b.time).abs() <= BURST_SECONDS,
            );
        }
        if peers >= BURST_PEERS {
            hot.push((a.ip, 1));
        }
    }
    hot.sort_unstable();
    let mut out: Vec<(u32, usize)> = Vec::new();
    for (ip, n) in hot {
        match out.last_mut() {
            Some((last, count)) if *last == ip => *count += n,
            _ => out.push((ip, n)),
        }
    }
    out
}

/// The lines of `alarms.log`, as the graph's stages and the sequential program write
/// them, tab-separated: `filter<TAB>line`, `correlate<TAB>client<TAB>hot entries`,
/// `late<TAB>time<TAB>source<TAB>line`.
pub mod alarm {
    use super::*;

    /// Appends `filter`'s alarm for a relevant entry's log line to `out`.
    pub fn filter(out: &mut Vec<u8>, line: &[u8]) {
        out.extend_from_slice(b"filter\t");
        out.extend_from_slice(line);
        out.push(b'\n');
    }

    /// `correlate`'s alarms for a window's entries (one per client with a burst).
    pub fn correlate(window: &[Entry]) -> Vec<u8> {
        let mut out = String::new();
        for (ip, n) in super::correlate(window) {
            out.push_str(&format!("correlate\t{}\t{n}\n", ip_text(ip)));
        }
        out.into_bytes()
    }

    /// The alarm for a line of `source` later than the lateness bound.
    pub fn late(time: i64, source: usize, line: &[u8]) -> Vec<u8> {
        let mut out = format!("late\t{time}\t{source}\t").into_bytes();
        out.extend_from_slice(line);
        out.push(b'\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(ip: u32, time: i64, status: u16) -> Entry {
        Entry {
            ip,
            time,
            status,
            micros: 1000,
        }
    }

    #[test]
    fn relevance() {
        assert!(is_relevant(&e(1, 0, 500)));
        assert!(!is_relevant(&e(1, 0, 404)));
        assert!(is_relevant(&Entry {
            micros: SLOW_MICROS,
            ..e(1, 0, 200)
        }));
    }

    #[test]
    fn bursts_need_enough_close_errors_from_one_client() {
        assert!(correlate(&[]).is_empty());
        // Four 404s within 30 s from client 1: all hot. Client 2's errors are spread.
        let mut w: Vec<Entry> = (0..4).map(|i| e(1, 100 + i * 10, 404)).collect();
        w.extend((0..4).map(|i| e(2, i * 100, 404)));
        w.push(e(1, 105, 200)); // not an error: does not count
        assert_eq!(correlate(&w), vec![(1, 4)]);
        // Three errors are not enough (each has two peers).
        assert!(correlate(&w[..3]).is_empty());
    }
}
