//! The file cache, owned by the serial `cache` stage (so it needs no lock), in two
//! least-recently-used parts under one map:
//!
//! * **in memory**: the contents of small files (at most `cache_max_file` bytes),
//!   bounded by their total bytes (`cache_bytes`); a hit is written with one `writev`
//!   of head and body;
//! * **open descriptors**: larger files kept open (nginx's `open_file_cache`), bounded
//!   by their number (`max_open_files`); a hit is sent with `sendfile(2)` from the page
//!   cache, at an explicit offset, so any number of connections share one descriptor.
//!   A descriptor unused for [`OPEN_INACTIVE`] is closed, so that a deleted file's
//!   space is not held for long.
//!
//! Every entry remembers the [`Version`] of the file it was made from (length,
//! modification time, inode, device); a lookup must present the file's current version
//! (from the `stat` that `handle_request` does on every request), and a stale entry is
//! dropped. A file replaced on disk has another inode (the old one cannot be reused
//! while a descriptor holds it), one changed in place another length or mtime.
//! Descriptors travel as `Arc<File>`: an evicted entry's descriptor is closed only
//! when the last response still sending from it is done.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

/// How long an open descriptor may go unused before it is closed.
pub const OPEN_INACTIVE: Duration = Duration::from_secs(60);

/// How long a file being read into memory keeps other misses on it from reading it too
/// (they are sent with `sendfile` meanwhile). A read that fails never inserts anything,
/// so the claim just expires.
pub const LOAD_CLAIM: Duration = Duration::from_secs(5);

/// Most files read into memory at once (each read takes a thread of the blocking pool).
pub const MAX_LOAD_READS: usize = 8;

/// The memory of file contents that misses read: the bytes of every buffer so read and
/// still alive (in the cache, or held by responses still being sent, also after the
/// cache let it go), and the reads in progress. Shared by the instances of
/// `send_file`; a load that would pass a bound is not made (the file is sent with
/// `sendfile` instead), so nothing ever waits for it.
#[derive(Debug, Default)]
pub struct Loads {
    bytes: AtomicUsize,
    reads: AtomicUsize,
}

impl Loads {
    /// Starts a read of `len` bytes if that keeps the loaded bytes within `max_bytes`
    /// and the reads in progress within [`MAX_LOAD_READS`]; `None` otherwise.
    pub fn try_start(self: &Arc<Self>, len: usize, max_bytes: usize) -> Option<Load> {
        let take = |a: &AtomicUsize, n: usize, max: usize| {
            a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                v.checked_add(n).filter(|&t| t <= max)
            })
            .is_ok()
        };
        if !take(&self.reads, 1, MAX_LOAD_READS) {
            return None;
        }
        if !take(&self.bytes, len, max_bytes) {
            self.reads.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Load {
            loads: self.clone(),
            len,
            reading: true,
        })
    }

    /// Bytes of loaded buffers alive (and of reads in progress).
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }
}

/// A load admitted by [`Loads::try_start`]: its bytes count until it is dropped, or,
/// made into a buffer with [`Load::into_bytes`], until the buffer's last clone is.
#[derive(Debug)]
pub struct Load {
    loads: Arc<Loads>,
    len: usize,
    reading: bool,
}

impl Load {
    /// Ends the read: `data` (at most the length admitted) as a buffer that keeps its
    /// bytes counted for as long as any clone of it lives.
    pub fn into_bytes(mut self, data: Vec<u8>) -> Bytes {
        debug_assert!(data.len() <= self.len);
        self.loads.reads.fetch_sub(1, Ordering::AcqRel);
        self.reading = false;
        Bytes::from_owner(Loaded { data, _load: self })
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        if self.reading {
            self.loads.reads.fetch_sub(1, Ordering::AcqRel);
        }
        self.loads.bytes.fetch_sub(self.len, Ordering::AcqRel);
    }
}

/// The owner of a loaded buffer.
struct Loaded {
    data: Vec<u8>,
    _load: Load,
}

impl AsRef<[u8]> for Loaded {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// What identifies one version of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    /// Length in bytes.
    pub len: u64,
    /// Modification time.
    pub mtime: SystemTime,
    /// Inode number.
    pub ino: u64,
    /// Device number.
    pub dev: u64,
}

impl Version {
    /// The version `meta` describes.
    pub fn of(meta: &Metadata) -> Version {
        Version {
            len: meta.len(),
            mtime: meta.modified().unwrap_or(UNIX_EPOCH),
            ino: meta.ino(),
            dev: meta.dev(),
        }
    }
}

/// Where a file of some length is cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Its contents, in memory.
    Memory,
    /// An open descriptor, sent from with `sendfile`.
    Open,
    /// Not at all (it is opened and sent per request).
    None,
}

/// The sizes that decide placement and bound the cache.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Total bytes of file contents held in memory.
    pub memory_bytes: usize,
    /// Largest file held in memory; larger ones are kept open instead.
    pub memory_max_file: usize,
    /// Most descriptors kept open (0: none).
    pub max_open: usize,
}

impl Limits {
    /// Most bytes of file contents that misses may have read and that are still alive
    /// ([`Loads`]): twice `memory_bytes`, the cache's own and as much again for
    /// responses still being sent from buffers the cache let go (or not yet took).
    pub fn load_bytes(&self) -> usize {
        self.memory_bytes.saturating_mul(2)
    }

    /// Where a file of `len` bytes goes.
    pub fn placement(&self, len: u64) -> Placement {
        if usize::try_from(len).is_ok_and(|n| n <= self.memory_max_file.min(self.memory_bytes)) {
            Placement::Memory
        } else if self.max_open > 0 {
            Placement::Open
        } else {
            Placement::None
        }
    }
}

/// A cache hit.
#[derive(Clone, Debug)]
pub enum Hit {
    /// The file's contents.
    Memory(Bytes),
    /// An open descriptor of the file (send it with an explicit offset).
    Open(Arc<File>),
}

#[derive(Debug)]
struct Slot {
    hit: Hit,
    version: Version,
    tick: u64,
    used: Instant,
    heads: Heads,
}

/// Response heads made for one entry (one per value of the connection flag), reused
/// while their key (the second of their `Date` header) is current: a hit then needs
/// no formatting and no allocation. They go with the entry, so a changed file (a new
/// entry) gets new ones.
#[derive(Debug, Default)]
struct Heads {
    key: u64,
    heads: [Option<Bytes>; 2],
}

/// The cache: one map from canonical paths to entries, one LRU order per kind.
#[derive(Debug)]
pub struct FileCache {
    /// Keyed by the path's bytes (hashing a `Path` walks its components).
    map: HashMap<OsString, Slot>,
    memory_order: BTreeMap<u64, OsString>,
    open_order: BTreeMap<u64, OsString>,
    tick: u64,
    bytes: usize,
    limits: Limits,
    /// Files being read into memory by a miss, and since when.
    loading: HashMap<OsString, Instant>,
}

impl FileCache {
    /// An empty cache under `limits`.
    pub fn new(limits: Limits) -> FileCache {
        FileCache {
            map: HashMap::new(),
            memory_order: BTreeMap::new(),
            open_order: BTreeMap::new(),
            tick: 0,
            bytes: 0,
            limits,
            loading: HashMap::new(),
        }
    }

    /// Whether a miss on `path` should read it into memory: only one at a time per
    /// file (for [`LOAD_CLAIM`] at most), so that a thousand simultaneous misses on a
    /// large file do not read a thousand copies of it.
    pub fn claim_load(&mut self, path: &Path, now: Instant) -> bool {
        if let Some(since) = self.loading.get(path.as_os_str())
            && now.saturating_duration_since(*since) < LOAD_CLAIM
        {
            return false;
        }
        if self.loading.len() >= 1024 {
            self.loading
                .retain(|_, since| now.saturating_duration_since(*since) < LOAD_CLAIM);
        }
        self.loading.insert(path.as_os_str().to_owned(), now);
        true
    }

    /// The limits it was made with.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The entry for `path` if it was made from `version` (the file's current one); a
    /// stale entry is dropped. A hit becomes the most recently used of its kind.
    pub fn get(&mut self, path: &Path, version: &Version, now: Instant) -> Option<Hit> {
        self.lookup(path, version, now, |slot| slot.hit.clone())
    }

    /// Like [`get`](Self::get), with the response head for the hit: the one made for
    /// this entry under the same `key` and `keep_alive` (no work), or else `make()`'s,
    /// kept for the next hits. `key` must change whenever `make` would give another
    /// head for the same entry (the caller's `Date` second).
    pub fn get_with_head(
        &mut self,
        path: &Path,
        version: &Version,
        now: Instant,
        key: u64,
        keep_alive: bool,
        make: impl FnOnce() -> Bytes,
    ) -> Option<(Hit, Bytes)> {
        self.lookup(path, version, now, |slot| {
            let heads = &mut slot.heads;
            if heads.key != key {
                *heads = Heads {
                    key,
                    heads: [None, None],
                };
            }
            let head = heads.heads[usize::from(keep_alive)]
                .get_or_insert_with(make)
                .clone();
            (slot.hit.clone(), head)
        })
    }

    /// `f` of the fresh entry for `path`, made the most recently used of its kind
    /// (one map lookup, no allocation: its key moves to the new place in the order).
    fn lookup<R>(
        &mut self,
        path: &Path,
        version: &Version,
        now: Instant,
        f: impl FnOnce(&mut Slot) -> R,
    ) -> Option<R> {
        self.close_inactive(now);
        let path = path.as_os_str();
        let slot = self.map.get_mut(path)?;
        if slot.version != *version {
            self.remove(path);
            return None;
        }
        let order = match slot.hit {
            Hit::Memory(_) => &mut self.memory_order,
            Hit::Open(_) => &mut self.open_order,
        };
        let key = order.remove(&slot.tick).unwrap_or_else(|| path.to_owned());
        self.tick += 1;
        slot.tick = self.tick;
        slot.used = now;
        order.insert(self.tick, key);
        Some(f(slot))
    }

    /// Keeps the contents of `path` (if its size belongs in memory), evicting the least
    /// recently used contents to fit.
    pub fn put_memory(&mut self, path: PathBuf, version: Version, body: Bytes, now: Instant) {
        let path = path.into_os_string();
        self.loading.remove(&path);
        if body.len() as u64 != version.len
            || self.limits.placement(version.len) != Placement::Memory
        {
            return;
        }
        self.remove(&path);
        while self.bytes + body.len() > self.limits.memory_bytes {
            let Some((_, oldest)) = self.memory_order.pop_first() else {
                break;
            };
            self.forget(&oldest);
        }
        self.bytes += body.len();
        self.insert(path, version, Hit::Memory(body), now);
    }

    /// Keeps `file` open for `path` (if its size belongs there), closing the least
    /// recently used descriptor past `max_open`.
    pub fn put_open(&mut self, path: PathBuf, version: Version, file: Arc<File>, now: Instant) {
        let path = path.into_os_string();
        if self.limits.placement(version.len) != Placement::Open {
            return;
        }
        self.remove(&path);
        while self.open_order.len() >= self.limits.max_open {
            let Some((_, oldest)) = self.open_order.pop_first() else {
                break;
            };
            self.forget(&oldest);
        }
        self.insert(path, version, Hit::Open(file), now);
    }

    fn insert(&mut self, path: OsString, version: Version, hit: Hit, now: Instant) {
        self.tick += 1;
        match hit {
            Hit::Memory(_) => &mut self.memory_order,
            Hit::Open(_) => &mut self.open_order,
        }
        .insert(self.tick, path.clone());
        let tick = self.tick;
        self.map.insert(
            path,
            Slot {
                hit,
                version,
                tick,
                used: now,
                heads: Heads::default(),
            },
        );
    }

    /// Closes the least recently used descriptors that went unused for [`OPEN_INACTIVE`].
    fn close_inactive(&mut self, now: Instant) {
        while let Some(first) = self.open_order.first_entry() {
            let idle = self
                .map
                .get(first.get())
                .is_none_or(|s| now.saturating_duration_since(s.used) >= OPEN_INACTIVE);
            if !idle {
                break;
            }
            let oldest = first.remove();
            self.forget(&oldest);
        }
    }

    /// Drops the entry for `path` and its place in its order.
    fn remove(&mut self, path: &OsStr) {
        if let Some(slot) = self.map.get(path) {
            match slot.hit {
                Hit::Memory(_) => self.memory_order.remove(&slot.tick),
                Hit::Open(_) => self.open_order.remove(&slot.tick),
            };
            self.forget(path);
        }
    }

    /// Drops the entry for `path` (its order entry is already gone).
    fn forget(&mut self, path: &OsStr) {
        if let Some(Slot {
            hit: Hit::Memory(body),
            ..
        }) = self.map.remove(path)
        {
            self.bytes -= body.len();
        }
    }

    /// Bytes of file contents held in memory.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Descriptors held open by the cache.
    pub fn open_files(&self) -> usize {
        self.open_order.len()
    }

    /// Entries held (both kinds).
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
    use std::io::Write;

    use super::*;

    fn version(len: u64, secs: u64) -> Version {
        Version {
            len,
            mtime: UNIX_EPOCH + Duration::from_secs(secs),
            ino: 1,
            dev: 1,
        }
    }

    fn limits(memory_bytes: usize, memory_max_file: usize, max_open: usize) -> Limits {
        Limits {
            memory_bytes,
            memory_max_file,
            max_open,
        }
    }

    #[test]
    fn memory_evicts_least_recent_by_bytes() {
        let now = Instant::now();
        let v = version(4, 0);
        let mut c = FileCache::new(limits(10, 8, 0));
        c.put_memory("a".into(), v, Bytes::from_static(b"aaaa"), now);
        c.put_memory("b".into(), v, Bytes::from_static(b"bbbb"), now);
        assert!(c.get(Path::new("a"), &v, now).is_some()); // a is now the most recent
        c.put_memory("c".into(), v, Bytes::from_static(b"cccc"), now); // evicts b
        assert!(c.get(Path::new("b"), &v, now).is_none());
        assert!(c.get(Path::new("a"), &v, now).is_some());
        assert_eq!((c.len(), c.bytes()), (2, 8));
        // Above memory_max_file, and a body that is not the version's length.
        c.put_memory(
            "big".into(),
            version(9, 0),
            Bytes::from_static(b"123456789"),
            now,
        );
        c.put_memory(
            "odd".into(),
            version(3, 0),
            Bytes::from_static(b"1234"),
            now,
        );
        assert_eq!(c.len(), 2);
        // A changed file (mtime, length or inode) is a miss and drops the stale entry.
        assert!(c.get(Path::new("a"), &version(4, 1), now).is_none());
        assert_eq!((c.len(), c.bytes()), (1, 4));
        let moved = Version { ino: 2, ..v };
        assert!(c.get(Path::new("c"), &moved, now).is_none());
        assert!(c.is_empty() && c.bytes() == 0);
    }

    #[test]
    fn heads_made_once_per_entry_second_and_connection_flag() {
        let now = Instant::now();
        let v = version(4, 0);
        let mut c = FileCache::new(limits(100, 10, 0));
        c.put_memory("a".into(), v, Bytes::from_static(b"aaaa"), now);
        let made = std::cell::Cell::new(0);
        let get = |c: &mut FileCache, v: &Version, second: u64, keep_alive: bool| {
            c.get_with_head(Path::new("a"), v, now, second, keep_alive, || {
                made.set(made.get() + 1);
                Bytes::from(format!("{second} {keep_alive}"))
            })
        };
        let (hit, head) = get(&mut c, &v, 7, true).unwrap();
        assert!(matches!(hit, Hit::Memory(b) if b == "aaaa"));
        assert_eq!(head, "7 true");
        // Same second and flag: the same head, not made again.
        assert_eq!(get(&mut c, &v, 7, true).unwrap().1, "7 true");
        assert_eq!(made.get(), 1);
        assert_eq!(get(&mut c, &v, 7, false).unwrap().1, "7 false");
        assert_eq!(made.get(), 2);
        // The next second: made again.
        assert_eq!(get(&mut c, &v, 8, true).unwrap().1, "8 true");
        assert_eq!(made.get(), 3);
        // A changed file is a miss (no head), and its new entry gets a new head.
        let changed = version(4, 1);
        assert!(get(&mut c, &changed, 8, true).is_none());
        c.put_memory("a".into(), changed, Bytes::from_static(b"bbbb"), now);
        assert_eq!(get(&mut c, &changed, 8, true).unwrap().1, "8 true");
        assert_eq!(made.get(), 4);
    }

    #[test]
    fn one_load_per_file_at_a_time() {
        let now = Instant::now();
        let mut c = FileCache::new(limits(100, 10, 0));
        assert!(c.claim_load(Path::new("a"), now));
        assert!(!c.claim_load(Path::new("a"), now));
        assert!(c.claim_load(Path::new("b"), now));
        // The load lands: the next miss (a changed file) may load again.
        c.put_memory("a".into(), version(1, 0), Bytes::from_static(b"a"), now);
        assert!(c.claim_load(Path::new("a"), now));
        // A load that never lands expires.
        assert!(!c.claim_load(Path::new("b"), now));
        assert!(c.claim_load(Path::new("b"), now + LOAD_CLAIM));
    }

    #[test]
    fn loads_bounded_by_bytes_alive_and_reads_at_once() {
        let loads = Arc::new(Loads::default());
        let a = loads.try_start(60, 100).unwrap();
        assert!(loads.try_start(50, 100).is_none(), "110 bytes of 100");
        let body = a.into_bytes(vec![7; 60]);
        let slice = body.slice(1..2);
        drop(body);
        assert!(
            loads.try_start(50, 100).is_none(),
            "a slice still holds the buffer"
        );
        drop(slice);
        assert_eq!(loads.bytes(), 0);
        // Reads at once, whatever their size; a load dropped unread gives both back.
        let reads: Vec<_> = (0..MAX_LOAD_READS)
            .map(|_| loads.try_start(1, 100).unwrap())
            .collect();
        assert!(loads.try_start(1, 100).is_none());
        drop(reads);
        assert_eq!(loads.bytes(), 0);
        assert!(loads.try_start(100, 100).is_some());
    }

    #[test]
    fn open_descriptors_bounded_by_count_and_idle_time() {
        let now = Instant::now();
        let l = limits(100, 10, 2);
        assert_eq!(l.placement(10), Placement::Memory);
        assert_eq!(l.placement(11), Placement::Open);
        assert_eq!(limits(100, 10, 0).placement(11), Placement::None);
        let mut c = FileCache::new(l);
        let file = || Arc::new(tempfile::tempfile().unwrap());
        let v = version(50, 0);
        let (fa, fb) = (file(), file());
        c.put_open("a".into(), v, fa.clone(), now);
        c.put_open("b".into(), v, fb.clone(), now);
        c.put_open("small".into(), version(5, 0), file(), now); // belongs in memory
        assert_eq!(c.open_files(), 2);
        assert!(
            matches!(c.get(Path::new("a"), &v, now), Some(Hit::Open(f)) if Arc::ptr_eq(&f, &fa))
        );
        // A third descriptor closes the least recently used one (b), which stays valid
        // for whoever still holds it.
        c.put_open("c".into(), v, file(), now);
        assert_eq!(c.open_files(), 2);
        assert!(c.get(Path::new("b"), &v, now).is_none());
        assert_eq!(Arc::strong_count(&fb), 1);
        (&*fb).write_all(b"still open").unwrap();
        // Memory and descriptors are bounded separately.
        c.put_memory("m".into(), version(4, 0), Bytes::from_static(b"mmmm"), now);
        assert_eq!((c.len(), c.open_files(), c.bytes()), (3, 2, 4));
        // A path whose file grew past the memory limit: the memory entry is replaced.
        c.put_open("m".into(), version(40, 1), file(), now);
        assert_eq!((c.open_files(), c.bytes()), (2, 0));
        // Unused for OPEN_INACTIVE: closed on the next lookup.
        let later = now + OPEN_INACTIVE + Duration::from_secs(1);
        assert!(c.get(Path::new("zzz"), &v, later).is_none());
        assert_eq!(c.open_files(), 0);
        assert!(c.is_empty());
    }
}
