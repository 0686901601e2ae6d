//! The connection handshake.
//!
//! ```text
//! both sides, at once:  "LEDA" || u16 LE protocol version || u16 LE flags
//!                       || 32-byte nonce
//! client -> server:     Hello  frame {role, from, deployment, nonce, mac}
//! server -> client:     Welcome frame {mac}   or   Error frame {reason}, then close
//! ```
//!
//! Flags bit 0 says "this side requires a shared secret" (always set: every peer is
//! authenticated). `mac` is the HMAC-SHA256 proof of [`crate::auth`] over the whole
//! handshake (both preambles and the hello); both directions are checked. The preamble is
//! fixed-size and outside the frame format, so a version mismatch is detected whatever
//! the other version's framing. The whole handshake runs under a timeout, so a peer
//! that connects and says nothing is dropped.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::conn::{Conn, Session};
use crate::tls::Tls;

use crate::auth::{self, NONCE_LEN, Secret, nonce};
use crate::error::{FrameError, NetError};
use crate::frame::{Frame, HANDSHAKE_MAX_FRAME, Hello, Role, Welcome, read_frame, write_frame};

/// The four magic bytes that open every connection.
pub const MAGIC: [u8; 4] = *b"LEDA";

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 3;

/// Default time a peer has to complete the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

const PREAMBLE_LEN: usize = 8 + NONCE_LEN;

fn preamble(nonce: &[u8; NONCE_LEN]) -> [u8; PREAMBLE_LEN] {
    let mut p = [0u8; PREAMBLE_LEN];
    p[..4].copy_from_slice(&MAGIC);
    p[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    // Flags, bit 0: a shared secret is required (always, since version 2).
    p[6..8].copy_from_slice(&1u16.to_le_bytes());
    p[8..].copy_from_slice(nonce);
    p
}

/// Parsed preamble of the other side: (flags, nonce).
fn check_preamble(peer: &str, p: &[u8; PREAMBLE_LEN]) -> Result<(u16, Vec<u8>), NetError> {
    if p[..4] != MAGIC {
        return Err(NetError::BadMagic { peer: peer.into() });
    }
    let theirs = u16::from_le_bytes([p[4], p[5]]);
    if theirs != PROTOCOL_VERSION {
        return Err(NetError::VersionMismatch {
            peer: peer.into(),
            ours: PROTOCOL_VERSION,
            theirs,
        });
    }
    Ok((u16::from_le_bytes([p[6], p[7]]), p[8..].to_vec()))
}

fn frame_err(peer: &str) -> impl Fn(crate::error::FrameError) -> NetError + '_ {
    move |source| NetError::Frame {
        peer: peer.into(),
        source,
    }
}

async fn read_preamble(s: &mut Conn, peer: &str) -> Result<[u8; PREAMBLE_LEN], NetError> {
    let mut p = [0u8; PREAMBLE_LEN];
    s.read_exact(&mut p)
        .await
        .map_err(|e| frame_err(peer)(e.into()))?;
    Ok(p)
}

/// What the server learnt about an authenticated client.
#[derive(Debug)]
pub struct Accepted {
    /// The client's hello.
    pub hello: Hello,
}

/// Bounds the handshakes in progress on a listener to `max` without ever refusing a
/// connection: when all are taken, one is dropped to make room — the oldest of the
/// source that holds the most (an IPv4 address, or an IPv6 /64). Connections that say nothing then hold a slot
/// only until newer ones arrived, not for a handshake timeout each, and a flood from
/// one address drops its own handshakes, not those of a peer elsewhere that knows the
/// secret, however long its round trips (review finding, 2026-11-27: with the oldest
/// of all dropped, a flood of 64 connections per round trip kept out every peer whose
/// handshake spans one; from 50 ms away 45 % of its handshakes were dropped).
#[derive(Clone)]
pub struct Slots {
    all: std::sync::Arc<std::sync::Mutex<Pending>>,
    max: usize,
}

/// A handshake in progress: its id, source address and task.
type Entry = (u64, std::net::IpAddr, tokio::task::AbortHandle);

/// The handshakes in progress, oldest first.
#[derive(Default)]
struct Pending {
    next: u64,
    live: std::collections::VecDeque<Entry>,
}

impl Pending {
    /// Removes and returns the handshake to drop for a new one: the oldest of the
    /// address with the most in progress (of those, the one whose oldest is oldest).
    fn make_room(&mut self) -> Option<Entry> {
        let mut counts: std::collections::HashMap<std::net::IpAddr, usize> =
            std::collections::HashMap::new();
        for (_, ip, _) in &self.live {
            *counts.entry(source(*ip)).or_default() += 1;
        }
        let most = counts.values().copied().max()?;
        let at = self
            .live
            .iter()
            .position(|(_, ip, _)| counts[&source(*ip)] == most)?;
        self.live.remove(at)
    }
}

/// The source a handshake is counted under: an IPv4 address (also one mapped into
/// IPv6), or an IPv6 address' /64 (one host or site has a whole /64 to connect from).
fn source(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.into(),
            None => std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1)).into(),
        },
        v4 => v4,
    }
}

/// A handshake's place in [`Slots`]. Once authenticated, the task gives it up with
/// [`Slot::release`], and goes on only if that says it was still held: a handshake
/// chosen to make room may finish before its abort lands, and must not go on then.
/// Dropped otherwise (refused, failed), it frees the place.
pub struct Slot {
    all: std::sync::Arc<std::sync::Mutex<Pending>>,
    id: u64,
}

impl Slot {
    /// Gives the place up; `false` if the handshake was already dropped to make room
    /// (its task is being aborted: it must end without serving the connection).
    pub fn release(mut self) -> bool {
        let held = self.take();
        // (Ids start at 1: the drop below finds nothing.)
        self.id = 0;
        held
    }

    /// Removes this slot's entry; `true` if it was there.
    fn take(&self) -> bool {
        let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
        let before = all.live.len();
        all.live.retain(|(id, _, _)| *id != self.id);
        all.live.len() != before
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.take();
    }
}

impl Slots {
    /// At most `max` (at least 1) handshakes in progress.
    pub fn new(max: usize) -> Slots {
        Slots {
            all: std::sync::Arc::default(),
            max: max.max(1),
        }
    }

    /// Spawns the task `f(slot)` on the current tokio runtime for the connection from
    /// `peer`, first dropping a handshake in progress if `max` are (see [`Slots`]). `f`
    /// runs under the lock of the slots: it must move `slot` into its future, not drop it.
    pub fn spawn<F, Fut>(&self, peer: std::net::SocketAddr, f: F)
    where
        F: FnOnce(Slot) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
        let dropped = if all.live.len() >= self.max {
            all.make_room()
        } else {
            None
        };
        all.next += 1;
        let id = all.next;
        let slot = Slot {
            all: self.all.clone(),
            id,
        };
        // The task's slot, dropped as it ends, waits for this lock: it is listed first.
        let task = tokio::spawn(f(slot));
        all.live.push_back((id, peer.ip(), task.abort_handle()));
        drop(all);
        // (Outside the lock: the dropped task's slot takes it.)
        if let Some((_, from, task)) = dropped {
            task.abort();
            let max = self.max;
            tracing::warn!(%peer, %from, "{max} handshakes in progress: one from {from} dropped");
        }
    }
}

/// Runs the server side of the handshake on an accepted connection.
pub async fn server(
    s: &mut Conn,
    peer: &str,
    secret: &Secret,
    timeout: Duration,
) -> Result<Accepted, NetError> {
    tokio::time::timeout(timeout, server_inner(s, peer, secret))
        .await
        .map_err(|_| NetError::Timeout {
            peer: peer.into(),
            during: "handshake",
            secs: timeout.as_secs_f64(),
        })?
}

async fn server_inner(s: &mut Conn, peer: &str, secret: &Secret) -> Result<Accepted, NetError> {
    let my_nonce = nonce().map_err(|e| NetError::io("drawing a nonce", e))?;
    let mine = preamble(&my_nonce);
    s.write_all(&mine)
        .await
        .map_err(|e| frame_err(peer)(e.into()))?;
    s.flush().await.map_err(|e| frame_err(peer)(e.into()))?;
    let theirs = read_preamble(s, peer).await?;
    let (_, client_nonce) = check_preamble(peer, &theirs)?;
    let mut hello = match read_frame(s, HANDSHAKE_MAX_FRAME)
        .await
        .map_err(frame_err(peer))?
    {
        Some(Frame::Hello(h)) => h,
        Some(other) => {
            return Err(NetError::Protocol {
                peer: peer.into(),
                reason: format!("expected hello, got {}", other.name()),
            });
        }
        None => {
            return Err(NetError::Protocol {
                peer: peer.into(),
                reason: "closed before hello".into(),
            });
        }
    };
    let client_mac = std::mem::take(&mut hello.mac);
    let t = transcript(&mine, &theirs, &hello, peer)?;
    if hello.nonce != client_nonce || !secret.verify_client(&t, &client_mac) {
        // (Said to the client too: "authentication failed" alone left a launcher's
        // user guessing.)
        let why = "wrong or missing shared secret (this daemon holds another one: check \
                   --secret-file, LEDA_SECRET, LEDA_SECRET_FILE or the cookie on both sides)";
        let _ = write_frame(s, &Frame::Error(why.into())).await;
        return Err(NetError::Auth {
            peer: peer.into(),
            reason: "wrong or missing shared secret".into(),
        });
    }
    let mac = secret.server_proof(&t, &client_mac);
    write_frame(s, &Frame::Welcome(Welcome { mac }))
        .await
        .map_err(frame_err(peer))?;
    s.set_session(Session {
        key: secret.session_key(&t, &client_mac),
        client: false,
    });
    hello.mac = client_mac;
    Ok(Accepted { hello })
}

/// The transcript both sides prove: the server's preamble, the client's, and the
/// client's hello without its MAC.
fn transcript(
    server: &[u8],
    client: &[u8],
    hello: &Hello,
    peer: &str,
) -> Result<[u8; 32], NetError> {
    debug_assert!(hello.mac.is_empty());
    let bytes = rmp_serde::to_vec(hello).map_err(|e| NetError::Protocol {
        peer: peer.into(),
        reason: format!("cannot encode the hello: {e}"),
    })?;
    Ok(auth::transcript(server, client, &bytes))
}

/// Connects to `addr` (under TLS with `tls`) and runs the client side of the
/// handshake.
pub async fn connect(
    addr: &str,
    role: Role,
    from: &str,
    deployment: u64,
    secret: &Secret,
    tls: Option<&Tls>,
    timeout: Duration,
) -> Result<Conn, NetError> {
    let during = NetError::Timeout {
        peer: addr.into(),
        during: "connect and handshake",
        secs: timeout.as_secs_f64(),
    };
    tokio::time::timeout(timeout, async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| NetError::io(format!("connecting to {addr}"), e))?;
        let _ = tcp.set_nodelay(true);
        let mut s = match tls {
            Some(t) => t.connect(tcp, addr).await?,
            None => Conn::plain(tcp),
        };
        match client(&mut s, addr, role, from, deployment, secret).await {
            Ok(()) => Ok(s),
            // A process configured for TLS closes a plain connection at its first bytes
            // (said as "early eof", which did not tell a user what was wrong). So does
            // one that turns connections away unanswered (not serving yet, say): from
            // here the two look the same, and both are named (review finding: a lock
            // service node still starting, without TLS, was said to be one with TLS).
            Err(NetError::Frame { source, .. }) if tls.is_none() && closed_early(&source) => {
                Err(NetError::Protocol {
                    peer: addr.into(),
                    reason: "closed the connection at the start of the handshake: either it \
                             turns connections away unanswered (not serving yet, say), or it \
                             was started with --tls-cert/--tls-key/--tls-ca, and then closes \
                             a plain connection so (give this one the same TLS flags)"
                        .into(),
                })
            }
            Err(e) => Err(e),
        }
    })
    .await
    .map_err(|_| during)?
}

/// The peer closed the connection before a whole frame or preamble arrived.
fn closed_early(e: &FrameError) -> bool {
    match e {
        FrameError::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
        ),
        FrameError::Truncated { .. } => true,
        _ => false,
    }
}

async fn client(
    s: &mut Conn,
    peer: &str,
    role: Role,
    from: &str,
    deployment: u64,
    secret: &Secret,
) -> Result<(), NetError> {
    let my_nonce = nonce().map_err(|e| NetError::io("drawing a nonce", e))?;
    let mine = preamble(&my_nonce);
    s.write_all(&mine)
        .await
        .map_err(|e| frame_err(peer)(e.into()))?;
    s.flush().await.map_err(|e| frame_err(peer)(e.into()))?;
    let theirs = read_preamble(s, peer).await?;
    check_preamble(peer, &theirs)?;
    let mut hello = Hello {
        role,
        from: from.into(),
        deployment,
        nonce: my_nonce.to_vec(),
        mac: Vec::new(),
    };
    let t = transcript(&theirs, &mine, &hello, peer)?;
    hello.mac = secret.client_proof(&t);
    let client_mac = hello.mac.clone();
    write_frame(s, &Frame::Hello(hello))
        .await
        .map_err(frame_err(peer))?;
    match read_frame(s, HANDSHAKE_MAX_FRAME)
        .await
        .map_err(frame_err(peer))?
    {
        Some(Frame::Welcome(w)) => {
            if !secret.verify_server(&t, &client_mac, &w.mac) {
                return Err(NetError::Auth {
                    peer: peer.into(),
                    reason: "the peer could not prove it knows the shared secret".into(),
                });
            }
            s.set_session(Session {
                key: secret.session_key(&t, &client_mac),
                client: true,
            });
            Ok(())
        }
        Some(Frame::Error(reason)) => Err(NetError::Auth {
            peer: peer.into(),
            reason,
        }),
        Some(other) => Err(NetError::Protocol {
            peer: peer.into(),
            reason: format!("expected welcome, got {}", other.name()),
        }),
        None => Err(NetError::Protocol {
            peer: peer.into(),
            reason: "closed during the handshake".into(),
        }),
    }
}
