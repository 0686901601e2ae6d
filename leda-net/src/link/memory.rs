//! Large binaries between processes of one host, read from the sender's memory.
//!
//! Over loopback TCP a binary of a few megabytes costs two kernel copies, the TCP work
//! around them and a wake-up per arriving segment: for 3 MB about 1.2 ms of CPU per
//! transfer on the 2-vCPU machine, against 0.45 ms for one `process_vm_readv` of it
//! (`docs/performance.md`, § Transport). So when both ends of a link run on one host,
//! each may let the other read the binaries it sends straight from its memory, as
//! OpenMPI's shared-memory transport does with Linux's cross-memory attach:
//!
//! 1. Right after a plain TCP link comes up, each side puts a **token bound to this
//!    connection** in its memory — an HMAC, under the key its handshake left both ends
//!    with ([`crate::conn::Session`]), of which end it is and its pid — and sends
//!    [`MemoryOffer`]: its pid, host identity (boot id and pid namespace) and the
//!    token's address, not the token.
//! 2. The other side checks that this pid is a process of this host that **holds the
//!    other end of this very connection** (the kernel, asked through `sock_diag`
//!    ([`diag`]), gives the inode of the socket whose addresses mirror ours; the
//!    process's descriptors must include it) and, by default, **runs the same
//!    executable file** ([`PeerMemory`]), computes the token itself and reads it at
//!    the offered address. Only a process that knows this connection's key can have
//!    put it there: not a third process, not this process (a reflected offer), not a
//!    local proxy relaying the connection (it holds the other end, but the token never
//!    crosses the wire). Only then, and once per link, does it answer [`MemoryOk`] with
//!    its own pid and accept references in `events` frames. Otherwise — another host,
//!    network or pid namespace, no permission (another user, Yama's `ptrace_scope`, a
//!    seccomp filter) — it says nothing and everything stays on the socket. No
//!    permission is granted to anyone for this: the kernel's own ptrace access check
//!    decides.
//! 3. On [`MemoryOk`] (from the process at the other end) the sender encodes each
//!    binary of at least [`REF_MIN`] bytes as a reference (msgpack extension
//!    [`REF_EXT`]: address and length) instead of its bytes. The event is in its route's
//!    unacknowledged queue anyway until the peer acknowledges it, which it does only
//!    after the frame was decoded, so the bytes stay put until they were read; the
//!    reader copies them into a buffer of its own (a stage may take it over and work in
//!    place), then reads the token again and checks the peer's pidfd: a peer that exited
//!    or replaced its program (`exec`) meanwhile fails the read instead of handing over
//!    another program's bytes.
//!
//! If a link ends with referenced binaries unacknowledged (the peer paused, a frame
//! still in its socket, the link's tasks cancelled), the peer may still read them: their
//! memory (and the token) is kept ([`bury`]) until the peer can no longer read from the
//! connection — it exited, or no longer holds its socket — however the events
//! themselves end (reported failed, discarded at the end of the run). A thread looks
//! every [`REAP_EVERY`] while anything is kept; past [`KEEP_MAX`] bytes kept, binaries
//! are sent inline again until some are freed.
//!
//! A frame's references and its own bytes together are bounded by
//! [`MAX_FRAME`](crate::frame::MAX_FRAME), and a reference is at least [`REF_MIN`] bytes,
//! so a peer cannot make the reader allocate or copy more per frame than an inline frame
//! would cost, nor make it read anything but the peer's own memory. Under TLS (chosen for
//! links between hosts) no offer is made or accepted. `LEDA_PEER_MEMORY=0` in a
//! process's environment turns it off there, `LEDA_PEER_MEMORY=any` allows peers of
//! other executables ([`set_peer_memory`] from Rust).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use leda_core::event::Event;
use leda_core::value::Value;
use serde::{Deserialize, Serialize};

use crate::conn::Session;

mod diag;

/// Binaries at least this long are sent as references on a link whose peer reads
/// this process's memory (shorter references are refused).
pub(crate) const REF_MIN: usize = 64 * 1024;

/// The msgpack extension type of a reference (`fixext 16`: address, length; u64 BE).
pub(crate) const REF_EXT: i8 = 0x4c;

/// How often kept binaries are looked at while some are kept.
pub(crate) const REAP_EVERY: Duration = Duration::from_millis(200);

/// Most bytes kept for peers that may still read them ([`bury`]); above it, binaries
/// are sent inline.
pub(crate) const KEEP_MAX: usize = 256 * 1024 * 1024;

/// Most descriptors of a peer looked through for its socket (a peer with more is not
/// read from, and its kept binaries stay kept).
const MAX_FDS: usize = 1 << 16;

/// A connection's token (see the module doc).
pub(crate) type Token = [u8; 32];

/// What an end puts in its memory for a connection: its token, then a random nonce the
/// peer proves it read (in [`MemoryOk`]), so that a peer that cannot read this process
/// is never sent the addresses of its binaries.
pub(crate) type Mine = [u8; 64];

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
    /// Where the sender's token for this connection lies in its memory.
    pub addr: u64,
}

/// Answer to a [`MemoryOffer`]: the receiver read the token and will read referenced
/// binaries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryOk {
    /// The receiver's pid (so that the sender knows when it can no longer read).
    pub pid: u32,
    /// The receiver's host identity.
    pub host: Vec<u8>,
    /// HMAC, under the connection's key, of the nonce next to the sender's token: the
    /// receiver did read the sender's memory.
    pub proof: Vec<u8>,
}

/// The addresses of this side's socket of a link: `(local, peer)`.
pub(crate) type Ends = (SocketAddr, SocketAddr);

/// Which peers a process reads large binaries from, and lets read its own (see the
/// module doc). Set with [`set_peer_memory`], else from `LEDA_PEER_MEMORY` (`0`: off,
/// `any`: [`PeerMemory::AnyExecutable`], otherwise the default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerMemory {
    /// Everything through the socket.
    Off,
    /// Only a peer that runs the same executable file as this process (the default: a
    /// launcher and its daemons are one binary, and a process relaying the connection —
    /// a proxy that holds its other end — is never read from).
    SameExecutable,
    /// Any process at the other end of the connection, whatever it runs (a launcher and
    /// daemons built as different binaries). This trusts every local process that holds
    /// the other end: do not use it where a local proxy may relay the connection.
    AnyExecutable,
}

static MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(u8::MAX);

/// Sets which peers this process reads from and lets read it, for links that start
/// from now on (the environment's `LEDA_PEER_MEMORY` otherwise).
pub fn set_peer_memory(mode: PeerMemory) {
    MODE.store(mode as u8, Relaxed);
}

/// This process's [`PeerMemory`] (always [`PeerMemory::Off`] off Linux).
pub fn peer_memory() -> PeerMemory {
    let m = match MODE.load(Relaxed) {
        u8::MAX => {
            let m = match std::env::var("LEDA_PEER_MEMORY").as_deref() {
                Ok("0") => PeerMemory::Off,
                Ok("any") => PeerMemory::AnyExecutable,
                _ => PeerMemory::SameExecutable,
            };
            // (A concurrent `set_peer_memory` wins.)
            let _ = MODE.compare_exchange(u8::MAX, m as u8, Relaxed, Relaxed);
            return peer_memory();
        }
        0 => PeerMemory::Off,
        1 => PeerMemory::SameExecutable,
        _ => PeerMemory::AnyExecutable,
    };
    if cfg!(target_os = "linux") {
        m
    } else {
        PeerMemory::Off
    }
}

fn enabled() -> bool {
    peer_memory() != PeerMemory::Off
}

/// The executable file of a process (`/proc/PID/exe`): device and inode.
fn executable(pid: &str) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(format!("/proc/{pid}/exe")).ok()?;
    Some((m.dev(), m.ino()))
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

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// An HMAC under the connection's key.
fn mac(session: &Session, label: &[u8], data: &[&[u8]]) -> HmacSha256 {
    use hmac::Mac;
    let mut m = <HmacSha256 as Mac>::new_from_slice(&session.key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    m.update(label);
    for d in data {
        m.update(d);
    }
    m
}

/// The token of the end of a connection with key `session.key` that is the client or
/// not (`client`), run by process `pid`.
fn token_for(session: &Session, client: bool, pid: u32) -> Token {
    use hmac::Mac;
    let m = mac(
        session,
        b"leda-net/3 peer memory",
        &[&[u8::from(client)], &pid.to_le_bytes()],
    );
    m.finalize().into_bytes().into()
}

/// The proof of having read `nonce` (see [`Mine`]).
fn proof_of(session: &Session, nonce: &[u8]) -> HmacSha256 {
    mac(session, b"leda-net/3 peer memory read", &[nonce])
}

/// This process's offer over a connection with `session`, and what it puts in its
/// memory for it (to keep while the peer may read this process's memory).
pub(crate) fn offer(session: &Session) -> Option<(MemoryOffer, Arc<Mine>)> {
    if !enabled() || host().is_empty() {
        return None;
    }
    let pid = std::process::id();
    let mut mine = [0u8; 64];
    mine[..32].copy_from_slice(&token_for(session, session.client, pid));
    mine[32..].copy_from_slice(&crate::auth::nonce().ok()?[..32]);
    let mine = Arc::new(mine);
    let offer = MemoryOffer {
        pid,
        host: host().to_vec(),
        addr: mine.as_ptr() as u64,
    };
    Some((offer, mine))
}

/// Checks a peer's offer over the connection with `session` whose socket here has
/// addresses `ends`: the peer if this process can read its memory (and will), with the
/// answer to send. Reads `/proc`: not for an async thread.
pub(crate) fn accept(
    o: &MemoryOffer,
    ends: Ends,
    session: &Session,
) -> Option<(Arc<Peer>, MemoryOk)> {
    if !enabled() || o.host != host() {
        return None;
    }
    use hmac::Mac;
    let token = token_for(session, !session.client, o.pid);
    let peer = Peer::open(o.pid, ends, peer_memory(), Some((o.addr, token)), None)?;
    let nonce = peer
        .check()
        .and_then(|()| read_raw(peer.pid, o.addr.wrapping_add(32), 32));
    let nonce = match nonce {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!(pid = o.pid, error = %e, "peer memory: the peer's token cannot be read");
            return None;
        }
    };
    Some((
        peer,
        MemoryOk {
            pid: std::process::id(),
            host: host().to_vec(),
            proof: proof_of(session, &nonce).finalize().into_bytes().to_vec(),
        },
    ))
}

/// Checks a peer's [`MemoryOk`] over the connection with `session` whose socket here
/// has addresses `ends` (what this process put in its memory for it: `mine`): the peer,
/// to send references to, if it proves it read `mine`. Reads `/proc`: not for an async
/// thread.
pub(crate) fn accepted(
    ok: &MemoryOk,
    ends: Ends,
    session: &Session,
    mine: Arc<Mine>,
) -> Option<Arc<Peer>> {
    if !enabled() || ok.host != host() {
        return None;
    }
    if !proves_read(session, &mine, ok) {
        tracing::debug!(
            pid = ok.pid,
            "peer memory: the peer did not read this process"
        );
        return None;
    }
    Peer::open(ok.pid, ends, peer_memory(), None, Some(mine))
}

/// Whether `ok` carries the proof of having read the nonce of `mine`.
fn proves_read(session: &Session, mine: &Mine, ok: &MemoryOk) -> bool {
    use hmac::Mac;
    proof_of(session, &mine[32..])
        .verify_slice(&ok.proof)
        .is_ok()
}

/// [`Peer::read`] without the checks and the count.
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

/// A peer process on this host that holds the other end of a link's connection: the
/// one whose memory the link's reader reads, or the one that reads this process's.
#[derive(Debug)]
pub(crate) struct Peer {
    pid: i32,
    /// Tells when the process has exited (so that its pid, reused, is never read).
    pidfd: OwnedFd,
    /// The peer's socket of the connection.
    inode: u64,
    /// Where its token lies and what it is (when this process reads the peer).
    token: Option<(u64, Token)>,
    /// What this process put in its memory for the connection (when the peer reads
    /// this process), held (never read) as long as the peer may read.
    _mine: Option<Arc<Mine>>,
}

impl Peer {
    /// `pid`, if it is a process (not a thread) that holds the other end of the
    /// connection whose socket here has addresses `ends` (and, under
    /// [`PeerMemory::SameExecutable`], runs this process's executable). Needs a pidfd
    /// (Linux 5.3 or later): without one the memory kept after a fault could never be
    /// known free.
    fn open(
        pid: u32,
        ends: Ends,
        mode: PeerMemory,
        token: Option<(u64, Token)>,
        mine: Option<Arc<Mine>>,
    ) -> Option<Arc<Peer>> {
        let pid = libc::pid_t::try_from(pid).ok()?;
        if mode == PeerMemory::Off || pid <= 0 || pid == std::process::id() as i32 {
            return None;
        }
        // (Without `PIDFD_THREAD`, a thread id that is not a process's is refused.)
        let pidfd = pidfd_open(pid)
            .map_err(|e| tracing::debug!(pid, error = %e, "peer memory: no pidfd for the peer"))
            .ok()?;
        // (Checked after the pidfd was opened: the pid cannot be another process's
        // by the time it has passed.)
        let inode = other_end(ends)?;
        if holds(pid, inode) != Some(true) {
            tracing::debug!(pid, "peer memory: that process does not hold the other end");
            return None;
        }
        let theirs = executable(&pid.to_string());
        if mode == PeerMemory::SameExecutable && (theirs.is_none() || theirs != executable("self"))
        {
            tracing::debug!(pid, "peer memory: the peer runs another executable");
            return None;
        }
        Some(Arc::new(Peer {
            pid,
            pidfd,
            inode,
            token,
            _mine: mine,
        }))
    }

    /// Checks that the peer is the process that put the token where it said, now.
    fn check(&self) -> std::io::Result<()> {
        if let Some((addr, want)) = &self.token
            && read_raw(self.pid, *addr, want.len())? != want[..]
        {
            return Err(std::io::Error::other(
                "the peer's token is not where it was",
            ));
        }
        if self.exited() {
            return Err(std::io::Error::other("the peer process exited"));
        }
        Ok(())
    }

    /// Reads a referenced binary: `len` bytes at `addr` of the peer, into a buffer of
    /// their own (counted in [`peer_memory_read`]). An error if the peer exited or
    /// replaced its program meanwhile (the bytes may be another program's).
    pub(crate) fn read(&self, addr: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let v = read_raw(self.pid, addr, len)?;
        self.check()?;
        READ.fetch_add(len as u64, Relaxed);
        Ok(v)
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
        n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP) != 0
    }

    /// `true` once the peer can no longer read from the connection: it exited, or it
    /// holds its socket no more (a reset connection leaves the socket table, but its
    /// holder still reads what was queued: only the holder's descriptors tell). In
    /// doubt (its descriptors cannot be listed), not gone.
    fn gone(&self) -> bool {
        self.exited() || holds(self.pid, self.inode) == Some(false)
    }
}

/// A pidfd for process `pid` (Linux 5.3 or later).
fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: a plain system call; a non-negative result is a new descriptor we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
impl Peer {
    /// This very process as a peer, for tests of the codec (which read their own
    /// memory); not connected to anything.
    pub(crate) fn itself() -> Arc<Peer> {
        Peer::itself_with(None)
    }

    /// [`Peer::itself`], its token at the given address and of the given value.
    fn itself_with(token: Option<(u64, Token)>) -> Arc<Peer> {
        let pid = std::process::id() as i32;
        Arc::new(Peer {
            pid,
            pidfd: pidfd_open(pid).expect("pidfd_open"),
            inode: 0,
            token,
            _mine: None,
        })
    }
}

/// This network namespace's TCP sockets held by a descriptor (an orphaned socket is
/// listed with inode 0): `((local, remote), inode)`, addresses canonical.
fn sockets() -> impl Iterator<Item = (Ends, u64)> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .into_iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let inode: u64 = f.get(9)?.parse().ok().filter(|&i| i != 0)?;
                    Some(((parse_addr(f[1])?, parse_addr(f[2])?), inode))
                })
                .collect::<Vec<_>>()
        })
}

/// The inode of the socket at the other end of the connection whose socket here has
/// addresses `(local, peer)`: the one with the mirrored addresses, if a descriptor
/// holds it. Asked of the kernel for that one socket ([`diag`]); where it cannot be
/// asked, finds no such connection or another socket answers, from the whole table.
fn other_end((local, peer): Ends) -> Option<u64> {
    let want = (canonical(peer), canonical(local));
    match diag::inode(want) {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!(error = %e, "peer memory: sock_diag did not answer; reading the socket table");
            listed(want)
        }
    }
}

/// The inode of the socket with addresses `ends` (canonical), from the whole table.
fn listed(ends: Ends) -> Option<u64> {
    sockets().find(|(e, _)| *e == ends).map(|(_, i)| i)
}

/// Whether process `pid` has a descriptor on socket `inode` (`None`: its descriptors
/// cannot be listed, or there are more than [`MAX_FDS`]).
fn holds(pid: i32, inode: u64) -> Option<bool> {
    let want = format!("socket:[{inode}]");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    for (n, fd) in fds.enumerate() {
        if n >= MAX_FDS {
            return None;
        }
        match std::fs::read_link(fd.ok()?.path()) {
            Ok(l) if l.as_os_str() == want.as_str() => return Some(true),
            Ok(_) => {}
            // (Closed meanwhile: not this one.)
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return None,
        }
    }
    Some(false)
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// An address of `/proc/net/tcp{,6}`: the IP as 32-bit words in hex, each in host
/// order, then `:` and the port in hex.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for w in 0..ip.len() / 8 {
        let word = u32::from_str_radix(ip.get(8 * w..8 * w + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip: std::net::IpAddr = match bytes.len() {
        4 => <[u8; 4]>::try_from(&bytes[..]).ok()?.into(),
        16 => <[u8; 16]>::try_from(&bytes[..]).ok()?.into(),
        _ => return None,
    };
    Some(SocketAddr::new(ip.to_canonical(), port))
}

/// Binaries kept for peers that may still read them, and whether the reaper runs.
struct Buried {
    kept: Vec<(Arc<Peer>, Vec<Bytes>)>,
    reaping: bool,
}

static BURIED: Mutex<Buried> = Mutex::new(Buried {
    kept: Vec::new(),
    reaping: false,
});

/// Bytes in [`BURIED`].
static KEPT: AtomicUsize = AtomicUsize::new(0);

/// `false` while [`KEEP_MAX`] bytes or more are kept: binaries go inline then.
pub(crate) fn may_reference() -> bool {
    KEPT.load(Relaxed) < KEEP_MAX
}

/// Keeps the referenced binaries of `events` (those of [`REF_MIN`] bytes or more) until
/// `peer` can no longer read them (see [`Peer::gone`]).
pub(crate) fn bury<'a>(peer: &Arc<Peer>, events: impl IntoIterator<Item = &'a Event>) {
    let mut kept = Vec::new();
    for ev in events {
        for v in ev.args() {
            collect(v, &mut kept);
        }
    }
    // (Whether the peer can still read is the reaper's to find out: it reads `/proc`,
    // which this caller, on an async thread, should not.)
    if kept.is_empty() {
        return;
    }
    let bytes: usize = kept.iter().map(Bytes::len).sum();
    tracing::debug!(
        bytes,
        "peer memory: binaries kept while the peer may read them"
    );
    KEPT.fetch_add(bytes, Relaxed);
    let mut b = BURIED.lock().unwrap_or_else(|e| e.into_inner());
    b.kept.push((peer.clone(), kept));
    if !b.reaping {
        b.reaping = std::thread::Builder::new()
            .name("leda-peer-memory".into())
            .spawn(reap)
            .is_ok();
    }
}

/// Frees what peers that can no longer read kept, every [`REAP_EVERY`], until nothing
/// is kept.
fn reap() {
    loop {
        std::thread::sleep(REAP_EVERY);
        // (Each peer is looked at outside the lock: listing its descriptors takes time.)
        let peers: Vec<Arc<Peer>> = {
            let b = BURIED.lock().unwrap_or_else(|e| e.into_inner());
            b.kept.iter().map(|(p, _)| p.clone()).collect()
        };
        let gone: Vec<*const Peer> = peers.iter().filter(|p| p.gone()).map(Arc::as_ptr).collect();
        let mut b = BURIED.lock().unwrap_or_else(|e| e.into_inner());
        let (freed, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut b.kept)
            .into_iter()
            .partition(|(p, _)| gone.contains(&Arc::as_ptr(p)));
        b.kept = kept;
        let done = b.kept.is_empty();
        if done {
            b.reaping = false;
        }
        drop(b);
        let bytes: usize = freed
            .iter()
            .flat_map(|(_, b)| b.iter().map(Bytes::len))
            .sum();
        KEPT.fetch_sub(bytes, Relaxed);
        drop(freed);
        if done {
            return;
        }
    }
}

/// Bytes kept by [`bury`] now (tests).
#[cfg(test)]
pub(crate) fn buried() -> usize {
    let b = BURIED.lock().unwrap_or_else(|e| e.into_inner());
    b.kept
        .iter()
        .flat_map(|(_, b)| b.iter().map(Bytes::len))
        .sum()
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
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::process::{Child, Command, Stdio};

    /// A child process (bash) connected to a listener of this process, holding its end
    /// as descriptor 3 (`then` runs after it connected): the child, this side's socket
    /// and its addresses, once the child said it is connected.
    fn connected_child(then: &str) -> (Child, std::net::TcpStream, Ends) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut child = Command::new("bash")
            .args([
                "-c",
                &format!(
                    "exec 3<>/dev/tcp/127.0.0.1/{port}; {then}; echo connected; exec sleep 30"
                ),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (sock, _) = l.accept().unwrap();
        let ends = (sock.local_addr().unwrap(), sock.peer_addr().unwrap());
        let mut line = [0u8; 10];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut line)
            .unwrap();
        (child, sock, ends)
    }

    fn session(client: bool) -> Session {
        Session {
            key: [7; 32],
            client,
        }
    }

    #[test]
    fn the_socket_table_is_read_back_right() {
        let ip4 = "0100007F:1F90";
        assert_eq!(parse_addr(ip4), Some("127.0.0.1:8080".parse().unwrap()));
        let w2 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);
        let mapped = format!("0000000000000000{w2:08X}0100007F:1F90");
        assert_eq!(parse_addr(&mapped), Some("127.0.0.1:8080".parse().unwrap()));
        // This process holds both ends of a loopback connection of its own.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _b = l.accept().unwrap();
        let ends = (a.local_addr().unwrap(), a.peer_addr().unwrap());
        let inode = other_end(ends).expect("the other end is listed");
        assert_eq!(holds(std::process::id() as i32, inode), Some(true));
        // (But a link to this very process is never one to read from.)
        let any = PeerMemory::AnyExecutable;
        assert!(Peer::open(std::process::id(), ends, any, None, None).is_none());
    }

    /// A sender that died after sending: reading its memory fails with ESRCH, which the
    /// decoder reports as the sender gone (`wire::SENDER_GONE`), not as a bad frame
    /// (review finding: a killed launcher was reported as a protocol violation).
    #[test]
    fn a_dead_sender_s_memory_reads_as_no_such_process() {
        let (mut child, _sock, ends) = connected_child("true");
        let pid = child.id();
        let peer = Peer::open(pid, ends, PeerMemory::AnyExecutable, None, None).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let err = peer.read(0x1000, 16).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH), "{err}");
    }

    /// A process that holds the other end but did not put this connection's token in
    /// its memory (here a child that only connected: as a proxy relaying the connection
    /// would, or a process the socket was passed to) is refused, even with public bytes
    /// of its own as the address (its executable's first page); so is this process's own
    /// offer reflected with one of its thread ids. (The first version accepted both: it
    /// read back a token that the offer itself carried; two reviews' findings.)
    #[test]
    fn only_the_process_that_holds_the_connection_s_token_is_read_from() {
        let (mut child, _sock, ends) = connected_child("true");
        let pid = child.id();
        // The child runs bash, not this executable: refused by default; any executable
        // may be allowed, and then its memory can be read.
        assert!(Peer::open(pid, ends, PeerMemory::SameExecutable, None, None).is_none());
        let peer = Peer::open(pid, ends, PeerMemory::AnyExecutable, None, None).unwrap();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let first = maps.lines().next().unwrap();
        let base = u64::from_str_radix(first.split('-').next().unwrap(), 16).unwrap();
        assert_eq!(peer.read(base, 4).unwrap(), b"\x7fELF");
        assert!(peer.read(8, 16).is_err(), "unmapped memory is an error");
        // Its offer, with the address of bytes anyone can predict: no token there.
        let forged = MemoryOffer {
            pid,
            host: host().to_vec(),
            addr: base,
        };
        assert!(accept(&forged, ends, &session(true)).is_none());

        // This process's own offer, reflected with the id of one of its threads.
        let (mine, _token) = offer(&session(false)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, wait) = std::sync::mpsc::channel::<()>();
        let th = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = wait.recv();
        });
        let tid = rx.recv().unwrap() as u32;
        let reflected = MemoryOffer { pid: tid, ..mine };
        assert!(accept(&reflected, ends, &session(true)).is_none());
        stop.send(()).unwrap();
        th.join().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// A `MemoryOk` must prove that its sender read the nonce next to this process's
    /// token: one that cannot read this process is never sent the addresses of its
    /// binaries (the first version trusted the answer: a review's finding).
    #[test]
    fn a_memory_ok_proves_the_read() {
        use hmac::Mac;
        let s = session(true);
        let (_, mine) = offer(&s).unwrap();
        let mut ok = MemoryOk {
            pid: 1,
            host: host().to_vec(),
            proof: vec![0; 32],
        };
        assert!(!proves_read(&s, &mine, &ok));
        ok.proof = proof_of(&s, &mine[32..]).finalize().into_bytes().to_vec();
        assert!(proves_read(&s, &mine, &ok));
        // Another connection's key does not do.
        let other = Session { key: [8; 32], ..s };
        assert!(!proves_read(&other, &mine, &ok));
    }

    /// Each read checks the token again: a peer that replaced its program (`exec`) or
    /// whose pid now names another process fails the read instead of handing over its
    /// bytes (the first version checked the token once: a review's finding).
    #[test]
    fn a_read_fails_once_the_token_is_gone() {
        let mut token = Box::new([9u8; 32]);
        let data = vec![4u8; REF_MIN];
        let peer = Peer::itself_with(Some((token.as_ptr() as u64, *token)));
        assert_eq!(peer.read(data.as_ptr() as u64, data.len()).unwrap(), data);
        token[0] = 1;
        std::hint::black_box(&token);
        assert!(peer.read(data.as_ptr() as u64, data.len()).is_err());
    }

    /// Kept binaries stay while the peer holds its socket — also after the connection
    /// was reset, which takes the socket out of the host's table while its holder can
    /// still read what was queued (the first version freed them then: a review's
    /// finding) — and are freed by the reaper once the peer has exited.
    #[test]
    fn buried_binaries_stay_until_the_peer_cannot_read_them() {
        let (mut child, mut sock, ends) = connected_child("echo unread >&3");
        let peer = Peer::open(child.id(), ends, PeerMemory::AnyExecutable, None, None).unwrap();
        let big = Bytes::from(vec![3u8; REF_MIN]);
        let ev = Event::from_values([
            Value::Bytes(Bytes::from_static(b"small")),
            Value::Array(vec![Value::Bytes(big.clone())]),
        ]);
        // A frame for the peer, then a reset (this side closes with bytes unread).
        sock.write_all(b"a frame referencing big").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        drop(sock);
        std::thread::sleep(Duration::from_millis(100));
        assert!(other_end(ends).is_none(), "reset: out of the socket table");
        bury(&peer, [&ev]);
        drop(ev);
        std::thread::sleep(REAP_EVERY * 3);
        assert!(!big.is_unique(), "freed while the peer may read it");
        assert!(buried() >= REF_MIN);
        child.kill().unwrap();
        child.wait().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !big.is_unique() && std::time::Instant::now() < deadline {
            std::thread::sleep(REAP_EVERY);
        }
        assert!(big.is_unique(), "still kept after the peer exited");
    }
}
