//! Large binaries between processes of one host, read from the sender's memory.
//!
//! Over loopback TCP a binary of a few megabytes costs two kernel copies, the TCP work
//! around them and a wake-up per arriving segment: for an image of 3 MB about 1.2 ms
//! of CPU per transfer on the 2-vCPU machine, against 0.45 ms for one
//! `process_vm_readv` of it (`docs/performance.md`, § Transport). So when both ends of a
//! link run on one host, each may let the other read the binaries it sends straight
//! from its memory, as OpenMPI's shared-memory transport does with Linux's
//! cross-memory attach:
//!
//! 1. Right after the link comes up, each side sends [`MemoryOffer`]: its pid, host
//!    identity (boot id and pid namespace) and the address of a random token in its
//!    memory, with the token itself (over the authenticated connection).
//! 2. The other side reads the token at that address of that pid. If it matches, the
//!    pid is the peer (nobody else holds the token at that address) and this side may
//!    read its memory: it answers [`MemoryOk`] with its own pid, and from then on
//!    accepts references in `events` frames. Otherwise (another host, another pid
//!    namespace, no permission: Yama's `ptrace_scope`, a different user, a seccomp
//!    filter) it says nothing and everything stays on the socket.
//! 3. On [`MemoryOk`] the sender encodes each binary of at least [`REF_MIN`] bytes as
//!    a reference (msgpack extension [`REF_EXT`]: address and length) instead of its
//!    bytes. The event is in its route's unacknowledged queue anyway until the peer
//!    acknowledges it, which it does only after the frame was decoded, so the bytes
//!    stay put until they were read; the reader copies them into a buffer of its own
//!    (a stage may take it over and work in place).
//!
//! If the link goes down with referenced binaries unacknowledged, the peer may still
//! read them (a paused peer resumed, a frame still in its socket): their memory is
//! kept ([`bury`]) until the peer process exits (a pidfd tells), however the events
//! themselves end (reported failed to their senders, discarded at the end of the run).
//!
//! References are read with at most [`MAX_FRAME`](crate::frame::MAX_FRAME) bytes per frame (the limit of a
//! frame's own bytes), so a peer cannot make the reader allocate more per frame than
//! an inline frame would cost. Only plain TCP links use it: under TLS (chosen for links
//! between hosts) everything goes through TLS. `LEDA_PEER_MEMORY=0` in a process's
//! environment turns it off there (no offer made, none accepted).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use leda_core::event::Event;
use leda_core::value::Value;
use serde::{Deserialize, Serialize};

/// Binaries at least this long are sent as references on a link whose peer reads
/// this process's memory.
pub(crate) const REF_MIN: usize = 64 * 1024;

/// The msgpack extension type of a reference (`fixext 16`: address, length; u64 BE).
pub(crate) const REF_EXT: i8 = 0x4c;

/// Bytes read from peers' memory by this process (all links).
static READ: AtomicU64 = AtomicU64::new(0);

/// Bytes this process read from other processes' memory so far (all links, all runs):
/// how much crossed without the socket.
pub fn peer_memory_read() -> u64 {
    READ.load(Relaxed)
}

/// Offer to let the receiver read this process's memory (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryOffer {
    /// The sender's pid (in its pid namespace).
    pub pid: u32,
    /// The sender's host identity: boot id and pid namespace.
    pub host: Vec<u8>,
    /// Where the token lies in the sender's memory.
    pub addr: u64,
    /// The token.
    pub token: Vec<u8>,
}

/// Answer to a [`MemoryOffer`]: the receiver read the token and will read referenced
/// binaries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryOk {
    /// The receiver's pid (so that the sender knows when it has exited).
    pub pid: u32,
    /// The receiver's host identity.
    pub host: Vec<u8>,
}

/// Whether this process offers and accepts memory reads (`LEDA_PEER_MEMORY` not `0`).
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        cfg!(target_os = "linux") && std::env::var("LEDA_PEER_MEMORY").map_or(true, |v| v != "0")
    })
}

/// This host's identity as seen from this process: the kernel's boot id and the pid
/// namespace (pids mean the same thing only within one).
fn host() -> &'static [u8] {
    static HOST: OnceLock<Vec<u8>> = OnceLock::new();
    HOST.get_or_init(|| {
        let mut h = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        if let Ok(ns) = std::fs::read_link("/proc/self/ns/pid") {
            h.extend_from_slice(ns.to_string_lossy().as_bytes());
        }
        h
    })
}

/// The token peers read to prove they can read this process's memory.
fn token() -> &'static [u8; 32] {
    static TOKEN: OnceLock<Box<[u8; 32]>> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let mut t = Box::new([0u8; 32]);
        if let Ok(n) = crate::auth::nonce() {
            t.copy_from_slice(&n[..32]);
        }
        t
    })
}

/// This process's offer, if it makes one.
pub(crate) fn offer() -> Option<MemoryOffer> {
    if !enabled() || host().is_empty() {
        return None;
    }
    let t = token();
    Some(MemoryOffer {
        pid: std::process::id(),
        host: host().to_vec(),
        addr: t.as_ptr() as u64,
        token: t.to_vec(),
    })
}

/// Checks a peer's offer: `Some(pid)` if this process can read the peer's memory (and
/// will), with the answer to send.
pub(crate) fn accept(o: &MemoryOffer) -> Option<(i32, MemoryOk)> {
    if !enabled() || o.host != host() || o.pid == std::process::id() || o.token.len() < 16 {
        return None;
    }
    let pid = i32::try_from(o.pid).ok()?;
    match read_raw(pid, o.addr, o.token.len()) {
        Ok(t) if t == o.token => Some((
            pid,
            MemoryOk {
                pid: std::process::id(),
                host: host().to_vec(),
            },
        )),
        Ok(_) => {
            tracing::debug!(pid, "peer memory: the token did not match");
            None
        }
        Err(e) => {
            tracing::debug!(pid, error = %e, "peer memory: cannot read the peer's memory");
            None
        }
    }
}

/// Reads a referenced binary: `len` bytes at `addr` of process `pid`, into a buffer of
/// their own (counted in [`peer_memory_read`]).
pub(crate) fn read(pid: i32, addr: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let v = read_raw(pid, addr, len)?;
    READ.fetch_add(len as u64, Relaxed);
    Ok(v)
}

/// [`read`], not counted.
fn read_raw(pid: i32, addr: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut v: Vec<u8> = Vec::with_capacity(len);
    let mut done = 0;
    while done < len {
        let local = libc::iovec {
            iov_base: v.spare_capacity_mut()[done..].as_mut_ptr().cast(),
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: addr.wrapping_add(done as u64) as usize as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `local` is the unused capacity of `v` from `done` on (`len - done`
        // bytes, allocated above), which the kernel writes and nothing else reads;
        // `remote` is only read, in the other process, by the kernel (a bad address is
        // an error, not a fault here).
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the peer's memory ended",
            ));
        }
        done += n as usize;
    }
    // SAFETY: the kernel wrote all `len` bytes (the loop ends only when `done == len`).
    unsafe { v.set_len(len) };
    Ok(v)
}

/// A peer process that reads this process's memory: its pidfd tells when it has exited.
#[derive(Debug)]
pub(crate) struct Reader {
    pidfd: OwnedFd,
}

impl Reader {
    /// The peer `ok` came from, if it is on this host and its pidfd can be opened
    /// (Linux 5.3 or later); without one, references are not sent (their memory could
    /// never be known free after a fault).
    pub(crate) fn open(ok: &MemoryOk) -> Option<Arc<Reader>> {
        if !enabled() || ok.host != host() {
            return None;
        }
        let pid = libc::pid_t::try_from(ok.pid).ok()?;
        // SAFETY: a plain system call; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            tracing::debug!(pid, error = %e, "peer memory: no pidfd for the reader");
            return None;
        }
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Some(Arc::new(Reader { pidfd }))
    }

    /// `true` once the process has exited.
    fn exited(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n != 0
    }
}

/// Binaries kept for readers that may still read them.
static BURIED: Mutex<Vec<(Arc<Reader>, Vec<Bytes>)>> = Mutex::new(Vec::new());

/// Keeps the referenced binaries of `events` (those of [`REF_MIN`] bytes or more) until
/// `reader` has exited; first frees what readers that have exited kept.
pub(crate) fn bury(reader: &Arc<Reader>, events: &[Event]) {
    let mut kept = Vec::new();
    for ev in events {
        for v in ev.args() {
            collect(v, &mut kept);
        }
    }
    let mut all = BURIED.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|(r, _)| !r.exited());
    if !kept.is_empty() {
        let bytes: usize = kept.iter().map(Bytes::len).sum();
        tracing::debug!(bytes, "peer memory: binaries kept until the reader exits");
        all.push((reader.clone(), kept));
    }
}

/// Bytes kept by [`bury`] now (tests).
#[cfg(test)]
pub(crate) fn buried() -> usize {
    let mut all = BURIED.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|(r, _)| !r.exited());
    all.iter().flat_map(|(_, b)| b.iter().map(Bytes::len)).sum()
}

fn collect(v: &Value, out: &mut Vec<Bytes>) {
    match v {
        Value::Bytes(b) if b.len() >= REF_MIN => out.push(b.clone()),
        Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
        Value::Map(m) => m.iter().for_each(|(k, x)| {
            collect(k, out);
            collect(x, out);
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_its_own_token_and_a_bad_address_is_an_error() {
        let o = offer().expect("an offer on Linux");
        let got = read(o.pid as i32, o.addr, o.token.len()).unwrap();
        assert_eq!(got, o.token);
        // (An offer from this very process is not accepted: a link is between two.)
        assert!(accept(&o).is_none());
        let e = read(o.pid as i32, 8, 16).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        let forged = MemoryOffer {
            token: vec![7; 32],
            ..o
        };
        assert!(accept(&forged).is_none());
    }

    #[test]
    fn buried_binaries_stay_until_their_reader_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let ok = MemoryOk {
            pid: child.id(),
            host: host().to_vec(),
        };
        let reader = Reader::open(&ok).expect("a pidfd");
        let big = Bytes::from(vec![3u8; REF_MIN]);
        let ev = Event::from_values([
            Value::Bytes(Bytes::from_static(b"small")),
            Value::Array(vec![Value::Bytes(big.clone())]),
        ]);
        let before = buried();
        bury(&reader, &[ev]);
        assert!(buried() >= before + REF_MIN);
        // Kept: the memory is not freed while the reader lives.
        assert!(!big.is_unique());
        child.kill().unwrap();
        child.wait().unwrap();
        bury(&reader, &[]);
        assert!(big.is_unique(), "freed once the reader exited");
    }
}
