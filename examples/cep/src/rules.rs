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

use crate::log::{Entry, client_ids};

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

/// `correlate`'s rule: the clients (sorted) with a hot entry in `window` (each entry
/// with its client, [`Entry::client`]), with the number of their hot entries.
/// Pairwise: every entry is compared with every other.
pub fn correlate<'a>(window: &[(&'a [u8], Entry)]) -> Vec<(&'a [u8], usize)> {
    let (ids, names) = client_ids(window.iter().map(|(c, _)| *c));
    // The pairwise loop reads a compact copy (client number, status, time): over the
    // entries with their client slices it ran 14 % slower than over the IPv4 entries of
    // before (`leda-cep seq`, 1 M lines).
    let w: Vec<(u32, u16, i64)> = window
        .iter()
        .zip(&ids)
        .map(|((_, e), &id)| (id, e.status, e.time))
        .collect();
    let mut hot = vec![0usize; names.len()];
    for (i, a) in w.iter().enumerate() {
        let mut peers = 0usize;
        for (j, b) in w.iter().enumerate() {
            peers += usize::from(
                i != j
                    && a.0 == b.0
                    && a.1 >= 400
                    && b.1 >= 400
                    && (a.2 - b.2).abs() <= BURST_SECONDS,
            );
        }
        if peers >= BURST_PEERS {
            hot[a.0 as usize] += 1;
        }
    }
    let mut out: Vec<(&[u8], usize)> = names.into_iter().zip(hot).filter(|&(_, n)| n > 0).collect();
    out.sort_unstable();
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
    pub fn correlate(window: &[(&[u8], Entry)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (client, n) in super::correlate(window) {
            out.extend_from_slice(b"correlate\t");
            out.extend_from_slice(client);
            out.extend_from_slice(format!("\t{n}\n").as_bytes());
        }
        out
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

    fn e(client: &'static str, time: i64, status: u16) -> (&'static [u8], Entry) {
        let entry = Entry {
            client_len: client.len() as u32,
            time,
            status,
            micros: 1000,
        };
        (client.as_bytes(), entry)
    }

    #[test]
    fn relevance() {
        assert!(is_relevant(&e("a", 0, 500).1));
        assert!(!is_relevant(&e("a", 0, 404).1));
        assert!(is_relevant(&Entry {
            micros: SLOW_MICROS,
            ..e("a", 0, 200).1
        }));
    }

    #[test]
    fn bursts_need_enough_close_errors_from_one_client() {
        assert!(correlate(&[]).is_empty());
        // Four 404s within 30 s from an IPv6 client: all hot. A host name's errors
        // are spread.
        let mut w: Vec<_> = (0..4)
            .map(|i| e("2001:db8::1", 100 + i * 10, 404))
            .collect();
        w.extend((0..4).map(|i| e("host.example", i * 100, 404)));
        w.push(e("2001:db8::1", 105, 200)); // not an error: does not count
        assert_eq!(correlate(&w), vec![(&b"2001:db8::1"[..], 4)]);
        assert_eq!(alarm::correlate(&w), b"correlate\t2001:db8::1\t4\n");
        // Three errors are not enough (each has two peers).
        assert!(correlate(&w[..3]).is_empty());
    }
}
