//! The file cache: least-recently-used entries, bounded by the total bytes they hold.
//! Owned by the serial `cache` stage, so it needs no lock.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use bytes::Bytes;

/// A cached file.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The file's contents.
    pub body: Bytes,
    /// Its modification time when read (an entry is valid only while it matches).
    pub mtime: SystemTime,
    tick: u64,
}

/// An LRU map from canonical paths to file contents, bounded by total bytes.
#[derive(Debug)]
pub struct Lru {
    map: HashMap<PathBuf, Entry>,
    order: BTreeMap<u64, PathBuf>,
    tick: u64,
    bytes: usize,
    max_bytes: usize,
    max_entry: usize,
}

impl Lru {
    /// A cache holding at most `max_bytes`, with no entry above `max_entry` bytes.
    pub fn new(max_bytes: usize, max_entry: usize) -> Lru {
        Lru {
            map: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            bytes: 0,
            max_bytes,
            max_entry: max_entry.min(max_bytes),
        }
    }

    /// Whether a file of `len` bytes may be cached at all.
    pub fn admits(&self, len: u64) -> bool {
        usize::try_from(len).is_ok_and(|n| n <= self.max_entry)
    }

    /// The entry for `path` if it is still current (same length and mtime); a stale
    /// entry is dropped. A hit becomes the most recently used.
    pub fn get(&mut self, path: &Path, len: u64, mtime: SystemTime) -> Option<Bytes> {
        let e = self.map.get_mut(path)?;
        if e.mtime != mtime || e.body.len() as u64 != len {
            self.remove(path);
            return None;
        }
        self.order.remove(&e.tick);
        self.tick += 1;
        e.tick = self.tick;
        self.order.insert(self.tick, path.to_path_buf());
        Some(e.body.clone())
    }

    /// Inserts (or replaces) an entry, evicting the least recently used ones to fit.
    pub fn put(&mut self, path: PathBuf, mtime: SystemTime, body: Bytes) {
        if !self.admits(body.len() as u64) {
            return;
        }
        self.remove(&path);
        while self.bytes + body.len() > self.max_bytes {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(e) = self.map.remove(&oldest) {
                self.bytes -= e.body.len();
            }
        }
        self.tick += 1;
        self.bytes += body.len();
        self.order.insert(self.tick, path.clone());
        self.map.insert(
            path,
            Entry {
                body,
                mtime,
                tick: self.tick,
            },
        );
    }

    fn remove(&mut self, path: &Path) {
        if let Some(e) = self.map.remove(path) {
            self.order.remove(&e.tick);
            self.bytes -= e.body.len();
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recent_by_bytes() {
        let t = SystemTime::UNIX_EPOCH;
        let mut c = Lru::new(10, 8);
        c.put("a".into(), t, Bytes::from_static(b"aaaa"));
        c.put("b".into(), t, Bytes::from_static(b"bbbb"));
        assert!(c.get(Path::new("a"), 4, t).is_some()); // a is now the most recent
        c.put("c".into(), t, Bytes::from_static(b"cccc")); // evicts b
        assert!(c.get(Path::new("b"), 4, t).is_none());
        assert!(c.get(Path::new("a"), 4, t).is_some());
        assert_eq!((c.len(), c.bytes()), (2, 8));
        c.put("big".into(), t, Bytes::from_static(b"123456789")); // above max_entry
        assert_eq!(c.len(), 2);
        // A changed file is a miss and drops the stale entry.
        let later = t + std::time::Duration::from_secs(1);
        assert!(c.get(Path::new("a"), 4, later).is_none());
        assert_eq!((c.len(), c.bytes()), (1, 4));
    }
}
