//! Large binaries between processes of one host, read from the sender's memory.
//!
//! Over loopback TCP a binary of a few megabytes costs two kernel copies, the TCP work
//! around them and a wake-up per arriving segment: for 3 MB about 1.2 ms of CPU per
//! transfer on the 2-vCPU machine, against 0.45 ms for one `process_vm_readv` of it
//! (`docs/performance.md`, § Transport). So when both ends of a link run on one host,
//! each may let the other read the binaries it sends straight from its memory, as
//! OpenMPI's shared-memory transport does with Linux's cross-memory attach:
//!
//! 1. Right after a plain TCP link comes up, each side sends [`MemoryOffer`]: its pid,
//!    host identity (boot id and pid namespace) and the address of a random token in
//!    its memory, with the token.
//! 2. The other side checks that this pid is a process of this host that **holds the
//!    other end of this very connection** (the host's socket table gives the inode of
//!    the socket whose addresses mirror ours; the process's descriptors must include
//!    it) and, by default, **runs the same executable file** (a launcher and its
//!    daemons are one binary; a local proxy relaying the connection — which would hold
//!    its other end, with bytes the remote side chose in its buffers — is not read from:
//!    [`PeerMemory`]), then reads the token at that address. Only then (and once per link) does it
//!    answer [`MemoryOk`] with its own pid and accept references in `events` frames.
//!    Otherwise — another host or network or pid namespace, no permission (another
//!    user, Yama's `ptrace_scope`, a seccomp filter), a pid that is not the peer — it
//!    says nothing and everything stays on the socket. No permission is granted to
//!    anyone for this: the kernel's own ptrace access check decides.
//! 3. On [`MemoryOk`] (checked the same way) the sender
//!    encodes each binary of at least [`REF_MIN`] bytes as a reference (msgpack
//!    extension [`REF_EXT`]: address and length) instead of its bytes. The event is in
//!    its route's unacknowledged queue anyway until the peer acknowledges it, which it
//!    does only after the frame was decoded, so the bytes stay put until they were read;
//!    the reader copies them into a buffer of its own (a stage may take it over and work
//!    in place), and checks after each read (pidfd) that the peer did not exit meanwhile
//!    (its pid could then name another process).
//!
//! If a link ends with referenced binaries unacknowledged (the peer paused, a frame
//! still in its socket, the link's tasks cancelled), the peer may still read them: their
//! memory is kept ([`bury`]) until the peer can no longer read from the connection — it
//! exited, or it closed its end — however the events themselves end (reported failed,
//! discarded at the end of the run). A thread looks every [`REAP_EVERY`] while anything
//! is kept.
//!
//! A frame's references and its own bytes together are bounded by
//! [`MAX_FRAME`](crate::frame::MAX_FRAME), and a reference is at least [`REF_MIN`] bytes,
//! so a peer cannot make the reader allocate or copy more per frame than an inline frame
//! would cost, nor make it read anything but the peer's own memory. Under TLS (chosen for
//! links between hosts) no offer is made or accepted. `LEDA_PEER_MEMORY=0` in a
//! process's environment turns it off there, `LEDA_PEER_MEMORY=any` allows peers of
//! other executables ([`set_peer_memory`] from Rust).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use leda_core::event::Event;
use leda_core::value::Value;
use serde::{Deserialize, Serialize};

/// Binaries at least this long are sent as references on a link whose peer reads
/// this process's memory (shorter references are refused).
pub(crate) const REF_MIN: usize = 64 * 1024;

/// The msgpack extension type of a reference (`fixext 16`: address, length; u64 BE).
pub(crate) const REF_EXT: i8 = 0x4c;

/// How often kept binaries are looked at while some are kept.
pub(crate) const REAP_EVERY: Duration = Duration::from_millis(200);

const TOKEN_LEN: usize = 32;

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
    /// The receiver's pid (so that the sender knows when it can no longer read).
    pub pid: u32,
    /// The receiver's host identity.
    pub host: Vec<u8>,
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

/// The token peers read to show they can read this process's memory (`None` if no
/// random bytes could be had).
fn token() -> Option<&'static [u8; TOKEN_LEN]> {
    static TOKEN: OnceLock<Option<Box<[u8; TOKEN_LEN]>>> = OnceLock::new();
    TOKEN
        .get_or_init(|| {
            let n = crate::auth::nonce().ok()?;
            let mut t = Box::new([0u8; TOKEN_LEN]);
            t.copy_from_slice(&n[..TOKEN_LEN]);
            Some(t)
        })
        .as_deref()
}

/// This process's offer, if it makes one.
pub(crate) fn offer() -> Option<MemoryOffer> {
    if !enabled() || host().is_empty() {
        return None;
    }
    let t = token()?;
    Some(MemoryOffer {
        pid: std::process::id(),
        host: host().to_vec(),
        addr: t.as_ptr() as u64,
        token: t.to_vec(),
    })
}

/// Checks a peer's offer over the connection whose socket here has addresses `ends`:
/// the peer if this process can read its memory (and will), with the answer to send.
pub(crate) fn accept(o: &MemoryOffer, ends: Ends) -> Option<(Arc<Peer>, MemoryOk)> {
    if !enabled() || o.host != host() || o.token.len() != TOKEN_LEN {
        return None;
    }
    let peer = Peer::open(o.pid, ends, peer_memory())?;
    match read_raw(peer.pid, o.addr, TOKEN_LEN) {
        Ok(t) if t == o.token && !peer.exited() => Some((
            peer,
            MemoryOk {
                pid: std::process::id(),
                host: host().to_vec(),
            },
        )),
        Ok(_) => {
            tracing::debug!(pid = o.pid, "peer memory: the token did not match");
            None
        }
        Err(e) => {
            tracing::debug!(pid = o.pid, error = %e, "peer memory: cannot read the peer's memory");
            None
        }
    }
}

/// Checks a peer's [`MemoryOk`] over the connection whose socket here has addresses
/// `ends`: the peer, to send references to.
pub(crate) fn accepted(ok: &MemoryOk, ends: Ends) -> Option<Arc<Peer>> {
    if !enabled() || ok.host != host() {
        return None;
    }
    Peer::open(ok.pid, ends, peer_memory())
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
    /// This side's socket's addresses: the peer's end mirrors them.
    ends: Ends,
}

impl Peer {
    /// `pid`, if it is a process (not a thread) that holds the other end of the
    /// connection whose socket here has addresses `ends` (and, under
    /// [`PeerMemory::SameExecutable`], runs this process's executable). Needs a pidfd
    /// (Linux 5.3 or later): without one the memory kept after a fault could never be
    /// known free.
    fn open(pid: u32, ends: Ends, mode: PeerMemory) -> Option<Arc<Peer>> {
        if mode == PeerMemory::Off {
            return None;
        }
        let pid = libc::pid_t::try_from(pid).ok()?;
        if pid <= 0 || pid == std::process::id() as i32 {
            return None;
        }
        // SAFETY: a plain system call; a non-negative result is a new descriptor we own.
        // (Without `PIDFD_THREAD`, a thread id that is not a process's is refused.)
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            tracing::debug!(pid, error = %e, "peer memory: no pidfd for the peer");
            return None;
        }
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let peer = Peer { pid, pidfd, ends };
        // (Checked after the pidfd was opened: the pid cannot be another process's
        // by the time it has passed.)
        let inode = other_end(ends)?;
        if !holds(pid, inode) {
            tracing::debug!(pid, "peer memory: that process does not hold the other end");
            return None;
        }
        let theirs = executable(&pid.to_string());
        if mode == PeerMemory::SameExecutable && (theirs.is_none() || theirs != executable("self"))
        {
            tracing::debug!(pid, "peer memory: the peer runs another executable");
            return None;
        }
        Some(Arc::new(peer))
    }

    /// Reads a referenced binary: `len` bytes at `addr` of the peer, into a buffer of
    /// their own (counted in [`peer_memory_read`]). An error if the peer exited
    /// meanwhile (the bytes may come from another process that took its pid).
    pub(crate) fn read(&self, addr: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let v = read_raw(self.pid, addr, len)?;
        if self.exited() {
            return Err(std::io::Error::other("the peer process exited"));
        }
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

    /// `true` once the peer can no longer read from the connection: it exited, or its
    /// end is no longer held by any descriptor (`held`: the sockets so held, as
    /// `(local, remote)`, from [`held_sockets`]).
    fn gone(&self, held: &HashSet<Ends>) -> bool {
        let (local, peer) = self.ends;
        self.exited() || !held.contains(&(canonical(peer), canonical(local)))
    }
}

#[cfg(test)]
impl Peer {
    /// This very process as a peer, for tests of the codec (which read their own
    /// memory); not connected to anything.
    pub(crate) fn itself() -> Arc<Peer> {
        // SAFETY: as in `Peer::open`.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id() as i32, 0) };
        assert!(fd >= 0, "pidfd_open");
        let any: SocketAddr = ([0, 0, 0, 0], 0).into();
        Arc::new(Peer {
            pid: std::process::id() as i32,
            // SAFETY: as in `Peer::open`.
            pidfd: unsafe { OwnedFd::from_raw_fd(fd as i32) },
            ends: (any, any),
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

/// The addresses of every socket [`sockets`] lists.
fn held_sockets() -> HashSet<Ends> {
    sockets().map(|(e, _)| e).collect()
}

/// The inode of the socket at the other end of the connection whose socket here has
/// addresses `(local, peer)`: the one with the mirrored addresses, if a descriptor
/// holds it.
fn other_end((local, peer): Ends) -> Option<u64> {
    let want = (canonical(peer), canonical(local));
    sockets().find(|(e, _)| *e == want).map(|(_, i)| i)
}

/// `true` if process `pid` has a descriptor on socket `inode`.
fn holds(pid: i32, inode: u64) -> bool {
    let want = format!("socket:[{inode}]");
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
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

/// Keeps the referenced binaries of `events` (those of [`REF_MIN`] bytes or more) until
/// `peer` can no longer read them (see [`Peer::gone`]).
pub(crate) fn bury<'a>(peer: &Arc<Peer>, events: impl IntoIterator<Item = &'a Event>) {
    let mut kept = Vec::new();
    for ev in events {
        for v in ev.args() {
            collect(v, &mut kept);
        }
    }
    if kept.is_empty() || peer.gone(&held_sockets()) {
        return;
    }
    let bytes: usize = kept.iter().map(Bytes::len).sum();
    tracing::debug!(
        bytes,
        "peer memory: binaries kept while the peer may read them"
    );
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
        // (The socket table is read once per look, outside the lock.)
        let held = held_sockets();
        let mut b = BURIED.lock().unwrap_or_else(|e| e.into_inner());
        // (Freed outside the lock.)
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut b.kept)
            .into_iter()
            .partition(|(p, _)| p.gone(&held));
        b.kept = kept;
        let done = b.kept.is_empty();
        if done {
            b.reaping = false;
        }
        drop(b);
        drop(gone);
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
    use std::io::Read;
    use std::net::TcpListener;
    use std::process::{Child, Command, Stdio};

    /// A child process (bash) connected to a listener of this process: the child and
    /// this side's socket's addresses.
    fn connected_child() -> (Child, std::net::TcpStream, Ends) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let child = Command::new("bash")
            .args([
                "-c",
                &format!("exec 3<>/dev/tcp/127.0.0.1/{port}; echo connected; exec sleep 30"),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (sock, _) = l.accept().unwrap();
        let ends = (sock.local_addr().unwrap(), sock.peer_addr().unwrap());
        (child, sock, ends)
    }

    #[test]
    fn the_socket_table_is_read_back_right() {
        let ip4 = "0100007F:1F90";
        assert_eq!(parse_addr(ip4), Some("127.0.0.1:8080".parse().unwrap()));
        let mapped = format!(
            "0000000000000000{:08X}0100007F:1F90",
            u32::from_ne_bytes([0, 0, 0xff, 0xff])
        );
        assert_eq!(parse_addr(&mapped), Some("127.0.0.1:8080".parse().unwrap()));
        // This process holds both ends of a loopback connection of its own.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _b = l.accept().unwrap();
        let ends = (a.local_addr().unwrap(), a.peer_addr().unwrap());
        let inode = other_end(ends).expect("the other end is listed");
        assert!(holds(std::process::id() as i32, inode));
        // (But a link to this very process is never one to read from.)
        assert!(Peer::open(std::process::id(), ends, PeerMemory::AnyExecutable).is_none());
    }

    /// The process at the other end of the connection is accepted and read from; this
    /// process's own offer sent back with one of its thread ids, and an offer naming a
    /// third process, are refused (both were accepted by the first version, which
    /// checked only that the offered bytes were at the offered address: a review's
    /// finding).
    #[test]
    fn only_the_process_holding_the_other_end_is_read_from() {
        let (mut child, _sock, ends) = connected_child();
        let mut line = [0u8; 10];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut line)
            .unwrap();
        let pid = child.id();
        // The child runs bash, not this executable: refused by default.
        assert!(Peer::open(pid, ends, PeerMemory::SameExecutable).is_none());
        let peer = Peer::open(pid, ends, PeerMemory::AnyExecutable)
            .expect("the child holds the other end");
        // Its memory can be read (the start of its stack, say: any mapped address).
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let stack = maps.lines().find(|l| l.ends_with("[stack]")).unwrap();
        let addr = u64::from_str_radix(stack.split('-').next().unwrap(), 16).unwrap();
        assert_eq!(peer.read(addr, 64).unwrap().len(), 64);
        assert!(peer.read(8, 16).is_err(), "unmapped memory is an error");

        // A third process's ELF header, at an address anyone can look up.
        let mut third = Command::new("sleep").arg("30").spawn().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", third.id())).unwrap();
        let first = maps.lines().find(|l| l.contains("sleep")).unwrap();
        let addr = u64::from_str_radix(first.split('-').next().unwrap(), 16).unwrap();
        let forged = MemoryOffer {
            pid: third.id(),
            host: host().to_vec(),
            addr,
            token: b"\x7fELF\x02\x01\x01\x00".repeat(4),
        };
        assert_eq!(read_raw(third.id() as i32, addr, 4).unwrap(), b"\x7fELF");
        assert!(
            accept(&forged, ends).is_none(),
            "a third process was accepted"
        );
        third.kill().unwrap();
        third.wait().unwrap();

        // This process's own offer, reflected with the id of one of its threads.
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, wait) = std::sync::mpsc::channel::<()>();
        let th = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = wait.recv();
        });
        let tid = rx.recv().unwrap() as u32;
        let reflected = MemoryOffer {
            pid: tid,
            ..offer().unwrap()
        };
        assert!(
            accept(&reflected, ends).is_none(),
            "a reflected offer was accepted"
        );
        stop.send(()).unwrap();
        th.join().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Kept binaries stay while the peer holds its end of the connection and are
    /// freed (by the reaper, within a few of its periods) once it has exited.
    #[test]
    fn buried_binaries_stay_until_the_peer_cannot_read_them() {
        let (mut child, _sock, ends) = connected_child();
        let mut line = [0u8; 10];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut line)
            .unwrap();
        let peer = Peer::open(child.id(), ends, PeerMemory::AnyExecutable)
            .expect("the child holds the other end");
        let big = Bytes::from(vec![3u8; REF_MIN]);
        let ev = Event::from_values([
            Value::Bytes(Bytes::from_static(b"small")),
            Value::Array(vec![Value::Bytes(big.clone())]),
        ]);
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
