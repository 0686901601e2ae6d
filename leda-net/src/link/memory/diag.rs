//! One TCP socket of this network namespace looked up by its addresses, through the
//! kernel's `sock_diag` netlink interface (what `ss` uses), for [`super::other_end`].
//!
//! The alternative, reading `/proc/net/tcp{,6}`, walks the host's whole table of
//! connections and formats every one of them: 2 ms on an idle 2-vCPU machine, 32–39 ms
//! with 20,000 sockets open, on the thread of the link that asked. This asks for one
//! socket and gets one answer, whatever the number of sockets.

use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::canonical;

/// `SOCK_DIAG_BY_FAMILY` (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLMSG_ERROR` (linux/netlink.h).
const NLMSG_ERROR: u16 = 2;
/// `NLM_F_REQUEST`.
const NLM_F_REQUEST: u16 = 1;
/// `TCP_LISTEN` (net/tcp_states.h).
const TCP_LISTEN: u8 = 10;
/// `struct nlmsghdr`.
const NLMSG_HDR: usize = 16;
/// `struct inet_diag_req_v2`.
const REQ_LEN: usize = 56;
/// `struct inet_diag_sockid`, at offset 4 of both the request and the answer.
const SOCKID: usize = 4;
/// `idiag_inode` in `struct inet_diag_msg`.
const INODE_AT: usize = 68;
/// `struct inet_diag_msg`.
const MSG_LEN: usize = 72;

/// The inode of the TCP socket whose local address is `ends.0` and whose peer is
/// `ends.1` (canonical addresses), `Ok(None)` if that connection's socket is held by no
/// descriptor (an orphan, `TIME_WAIT`), `Err` if the kernel could not be asked, found
/// nothing, or named another socket (the caller then reads the table).
///
/// The kernel's lookup falls back to a listening socket on the local address when no
/// connection matches (also when the connection's socket is bound to a device, which a
/// lookup without an interface does not match): the answer counts only if its addresses
/// are exactly those asked for and it is not a listener; otherwise `Err` (the table
/// decides).
pub(super) fn inode(ends: (SocketAddr, SocketAddr)) -> io::Result<Option<u64>> {
    let (local, peer) = (canonical(ends.0), canonical(ends.1));
    let family = match (local.ip(), peer.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => libc::AF_INET,
        (IpAddr::V6(_), IpAddr::V6(_)) => libc::AF_INET6,
        _ => return Ok(None),
    };
    let sock = socket2::Socket::new(
        socket2::Domain::from(libc::AF_NETLINK),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::from(libc::NETLINK_SOCK_DIAG)),
    )?;
    sock.set_read_timeout(Some(Duration::from_secs(1)))?;
    let seq = std::process::id() ^ 0x5eed_d1a6;
    // (No address: a netlink message without one goes to the kernel.)
    sock.send(&request(family, seq, local, peer))?;
    let mut buf = [0u8; 4096];
    let n = (&sock).read(&mut buf)?;
    answer(&buf[..n], seq, local, peer)
}

/// A `SOCK_DIAG_BY_FAMILY` request for the one TCP socket with these addresses.
fn request(family: i32, seq: u32, local: SocketAddr, peer: SocketAddr) -> Vec<u8> {
    let mut m = Vec::with_capacity(NLMSG_HDR + REQ_LEN);
    m.extend_from_slice(&((NLMSG_HDR + REQ_LEN) as u32).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // inet_diag_req_v2: family, protocol, extensions, padding, states (all).
    m.extend_from_slice(&[family as u8, libc::IPPROTO_TCP as u8, 0, 0]);
    m.extend_from_slice(&u32::MAX.to_ne_bytes());
    m.extend_from_slice(&sockid(local, peer));
    m
}

/// `struct inet_diag_sockid`: ports and addresses in network order, no interface, no
/// cookie (`INET_DIAG_NOCOOKIE`).
fn sockid(local: SocketAddr, peer: SocketAddr) -> [u8; 48] {
    let mut id = [0u8; 48];
    id[0..2].copy_from_slice(&local.port().to_be_bytes());
    id[2..4].copy_from_slice(&peer.port().to_be_bytes());
    for (at, a) in [(4, local.ip()), (20, peer.ip())] {
        match a {
            IpAddr::V4(v4) => id[at..at + 4].copy_from_slice(&v4.octets()),
            IpAddr::V6(v6) => id[at..at + 16].copy_from_slice(&v6.octets()),
        }
    }
    id[40..48].copy_from_slice(&[0xff; 8]);
    id
}

/// The addresses in an answer's `inet_diag_sockid` (`family` its `idiag_family`),
/// canonical.
fn ends_of(family: u8, id: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let port = |at: usize| u16::from_be_bytes([id[at], id[at + 1]]);
    let ip = |at: usize| -> Option<IpAddr> {
        Some(match i32::from(family) {
            libc::AF_INET => IpAddr::from(<[u8; 4]>::try_from(&id[at..at + 4]).ok()?),
            libc::AF_INET6 => IpAddr::from(<[u8; 16]>::try_from(&id[at..at + 16]).ok()?),
            _ => return None,
        })
    };
    Some((
        canonical(SocketAddr::new(ip(4)?, port(0))),
        canonical(SocketAddr::new(ip(20)?, port(2))),
    ))
}

/// Reads the kernel's answer to request `seq` (see [`inode`]).
fn answer(got: &[u8], seq: u32, local: SocketAddr, peer: SocketAddr) -> io::Result<Option<u64>> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("sock_diag: {what}"));
    let u32_at = |at: usize| -> io::Result<u32> {
        Ok(u32::from_ne_bytes(
            got.get(at..at + 4)
                .ok_or_else(|| bad("short answer"))?
                .try_into()
                .expect("4 bytes"),
        ))
    };
    let len = u32_at(0)? as usize;
    if len < NLMSG_HDR || len > got.len() || u32_at(8)? != seq {
        return Err(bad("not the answer to this request"));
    }
    let kind = u16::from_ne_bytes([got[4], got[5]]);
    let body = &got[NLMSG_HDR..len];
    match kind {
        NLMSG_ERROR => {
            let code = i32::from_ne_bytes(
                body.get(..4)
                    .ok_or_else(|| bad("short error"))?
                    .try_into()
                    .expect("4 bytes"),
            );
            // ENOENT: no such socket — or no `tcp_diag` in this kernel, which the
            // caller cannot tell apart: it reads the table then.
            Err(io::Error::from_raw_os_error(-code))
        }
        SOCK_DIAG_BY_FAMILY if body.len() >= MSG_LEN => {
            let (family, state) = (body[0], body[1]);
            let found = ends_of(family, &body[SOCKID..SOCKID + 48]);
            if state == TCP_LISTEN || found != Some((local, peer)) {
                // The kernel's lookup fell back to a listener (or named another socket):
                // the connection may still exist where an exact lookup without an
                // interface cannot see it (its socket bound to a device: an IPv6
                // link-local address's scope, SO_BINDTODEVICE, a VRF). The table
                // decides then.
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "sock_diag: another socket answered (a listener)",
                ));
            }
            let inode = u32::from_ne_bytes(body[INODE_AT..INODE_AT + 4].try_into().expect("4"));
            Ok((inode != 0).then_some(u64::from(inode)))
        }
        _ => Err(bad("unexpected message")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// The table's answer, for comparison.
    fn listed(ends: (SocketAddr, SocketAddr)) -> Option<u64> {
        super::super::listed((canonical(ends.0), canonical(ends.1)))
    }

    /// `true` (and says so) if this kernel cannot be asked: no netlink, no `tcp_diag`.
    fn unavailable(e: &io::Error) -> bool {
        let no = [
            libc::EPROTONOSUPPORT,
            libc::EAFNOSUPPORT,
            libc::EACCES,
            libc::EPERM,
        ];
        let skip = e
            .raw_os_error()
            .is_some_and(|c| no.contains(&c) || c == libc::ENOENT);
        if skip {
            eprintln!("skipped: sock_diag cannot be asked here ({e})");
        }
        skip
    }

    #[test]
    fn a_connection_is_found_by_its_addresses_as_the_table_lists_it() {
        for (listen, connect_to) in [
            ("127.0.0.1:0", None),
            ("[::]:0", Some("127.0.0.1")),
            ("[::1]:0", None),
        ] {
            let Ok(l) = TcpListener::bind(listen) else {
                eprintln!("skipped {listen}: cannot bind it here");
                continue;
            };
            let mut to = l.local_addr().unwrap();
            if let Some(ip) = connect_to {
                to.set_ip(ip.parse().unwrap());
            }
            let a = TcpStream::connect(to).unwrap();
            let (b, _) = l.accept().unwrap();
            for s in [&a, &b] {
                let ends = (s.local_addr().unwrap(), s.peer_addr().unwrap());
                let got = match inode(ends) {
                    Err(e) if unavailable(&e) => return,
                    got => got.expect("sock_diag answers"),
                };
                assert!(got.is_some(), "{ends:?} not found");
                assert_eq!(got, listed(ends), "{ends:?}: not the table's inode");
            }
            // The two ends are two sockets.
            let ia = inode((a.local_addr().unwrap(), a.peer_addr().unwrap())).unwrap();
            let ib = inode((b.local_addr().unwrap(), b.peer_addr().unwrap())).unwrap();
            assert_ne!(ia, ib);
        }
    }

    /// The kernel's lookup returns the listener on the local address when no
    /// connection matches: that must not pass for the connection.
    #[test]
    fn a_listener_is_not_a_connection() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let local = l.local_addr().unwrap();
        let nobody: SocketAddr = "127.0.0.1:9".parse().unwrap();
        match inode((local, nobody)) {
            Ok(got) => assert_eq!(got, None, "the listener was taken for a connection"),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if unavailable(&e) => return,
            Err(e) => panic!("{e}"),
        }
        // Nor is a connection with other addresses.
        let a = TcpStream::connect(local).unwrap();
        let (_b, _) = l.accept().unwrap();
        let mut other = a.peer_addr().unwrap();
        other.set_port(other.port().wrapping_add(1));
        match inode((a.local_addr().unwrap(), other)) {
            Ok(got) => assert_eq!(got, None),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}"),
        }
    }

    /// A socket bound to a device (`SO_BINDTODEVICE`, an IPv6 link-local address's scope)
    /// is not seen by a lookup without an interface, which answers with the listener:
    /// the table decides then, and finds it (a review's finding: the first version
    /// answered "none", and peer memory was off for such links).
    #[test]
    fn a_socket_bound_to_a_device_is_found_in_the_table() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        if let Err(e) = socket2::SockRef::from(&s).bind_device(Some(b"lo")) {
            eprintln!("skipped: cannot bind a socket to lo here ({e})");
            return;
        }
        let ends = (c.local_addr().unwrap(), c.peer_addr().unwrap());
        let mirrored = (ends.1, ends.0);
        assert!(inode(mirrored).is_err(), "not seen: the table must decide");
        let want = listed(mirrored);
        assert!(want.is_some());
        assert_eq!(super::super::other_end(ends), want);
    }

    /// A connection whose socket no descriptor holds (closed: an orphan, then
    /// `TIME_WAIT`) has no inode.
    #[test]
    fn a_closed_end_has_no_inode() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let ends = (c.local_addr().unwrap(), c.peer_addr().unwrap());
        drop(c);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!matches!(inode(ends), Ok(Some(_))), "an orphan");
        drop(s);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!matches!(inode(ends), Ok(Some(_))), "in TIME_WAIT");
    }

    #[test]
    fn answers_that_are_not_this_one_are_refused() {
        let local: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let peer: SocketAddr = "127.0.0.1:2000".parse().unwrap();
        let mut msg = request(libc::AF_INET, 7, local, peer);
        // Shaped as an answer: header, then family, state (established), timer,
        // retransmits, the sockid, then expires, queues, uid and the inode.
        msg.truncate(NLMSG_HDR);
        msg.extend_from_slice(&[libc::AF_INET as u8, 1, 0, 0]);
        msg.extend_from_slice(&sockid(local, peer));
        msg.extend_from_slice(&[0; 16]);
        msg.extend_from_slice(&42u32.to_ne_bytes());
        let len = msg.len() as u32;
        msg[0..4].copy_from_slice(&len.to_ne_bytes());
        assert_eq!(answer(&msg, 7, local, peer).unwrap(), Some(42));
        assert!(
            answer(&msg, 8, local, peer).is_err(),
            "another request's answer"
        );
        assert!(answer(&msg[..20], 7, local, peer).is_err(), "cut short");
        assert!(answer(&msg, 7, peer, local).is_err(), "other addresses");
        let mut listening = msg.clone();
        listening[NLMSG_HDR + 1] = TCP_LISTEN;
        assert!(answer(&listening, 7, local, peer).is_err(), "a listener");
        let mut orphan = msg.clone();
        let at = NLMSG_HDR + INODE_AT;
        orphan[at..at + 4].copy_from_slice(&0u32.to_ne_bytes());
        assert_eq!(answer(&orphan, 7, local, peer).unwrap(), None);
    }
}
