//! The client protocol of a lock-service node (`lock-service serve`, port `--clients`).
//!
//! A client opens a TCP connection to a node's client address and runs leda-net's handshake
//! ([`leda_net::handshake`], role `Client`, `from` = the client's name): both sides prove the
//! shared client secret with HMAC-SHA256, on loopback too. Then both sides send frames: a
//! `u32` little-endian length (at most [`MAX_FRAME`]) and a msgpack body, a [`Request`] from
//! the client or a [`Response`] from the node (serde's externally tagged enums, fields by
//! name: `{"Acquire": {"req": 1, "lock": "x", "wait": true}}`).
//!
//! - The first request is [`Request::Open`]: the session's lease TTL. The node answers
//!   [`Response::Opened`] with the TTL it granted (clamped to [`MIN_TTL_MS`]..=[`MAX_TTL_MS`]).
//! - The lease stays alive while the node hears from the client: any request counts, and an
//!   idle client sends [`Request::KeepAlive`] (answered with [`Response::Alive`], in order)
//!   about three times per TTL. A client counts its lease from the *send* time of the
//!   keep-alive an `Alive` answers; a node answers the keep-alive of a session holding locks
//!   only once a majority of the group shows no later grant of them, so a node paused or cut
//!   off renews nothing. When a TTL passes in silence, or the connection closes, the node withdraws
//!   every request of the session and releases every lock it holds; a client still connected
//!   gets [`Response::Expired`] for each lock it held, with the moment (CLOCK_MONOTONIC ns of
//!   the node's host), and the connection is closed.
//! - `req` numbers are the client's; each names one acquisition until its lock is released,
//!   the request cancelled, or the lease lost. A node keeps at most [`MAX_REQUESTS`] per
//!   session; beyond that, and for a lock it does not serve, it answers [`Response::Error`].
//! - Fences are `u64`: `epoch << 40 | n`, where `n` is the algorithm's fence and `epoch` the
//!   group's incarnation, agreed by a majority of the nodes when the group starts
//!   ([`crate::epoch`]), so a lock's fences only grow, across restarts of the whole group too.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// Largest frame either side accepts (length prefix excluded).
pub const MAX_FRAME: u32 = 64 * 1024;
/// Longest lock name.
pub const MAX_LOCK_NAME: usize = 256;
/// Most requests (pending or held) one session may have.
pub const MAX_REQUESTS: usize = 1024;
/// Shortest lease a node grants.
pub const MIN_TTL_MS: u64 = 100;
/// Longest lease a node grants.
pub const MAX_TTL_MS: u64 = 600_000;

/// Client → node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Opens the session with this lease TTL (milliseconds). First, and only once.
    Open {
        /// The lease's time to live.
        ttl_ms: u64,
    },
    /// Asks for `lock`; `wait: false` is a try (granted at once or [`Response::WouldBlock`]).
    Acquire {
        /// The client's number for this acquisition.
        req: u64,
        /// The lock.
        lock: String,
        /// Wait in the queue (`true`) or only take a free lock (`false`).
        wait: bool,
    },
    /// Releases the lock granted to `req`.
    Release {
        /// The acquisition.
        req: u64,
    },
    /// Withdraws `req` (releases it if it was granted meanwhile).
    Cancel {
        /// The acquisition.
        req: u64,
    },
    /// Keeps the lease alive.
    KeepAlive,
}

/// Node → client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The session is open with this lease TTL.
    Opened {
        /// The TTL granted, milliseconds.
        ttl_ms: u64,
        /// The node's id in its group.
        node: u64,
    },
    /// `req` holds its lock with this fence.
    Granted {
        /// The acquisition.
        req: u64,
        /// The fencing token.
        fence: u64,
    },
    /// The try of `req` could not be granted at once.
    WouldBlock {
        /// The acquisition.
        req: u64,
    },
    /// `req` was withdrawn.
    Cancelled {
        /// The acquisition.
        req: u64,
    },
    /// The lock of `req` is released.
    Released {
        /// The acquisition.
        req: u64,
    },
    /// The lease ran out: the lock of `req` was released by the node at `at_ns`.
    Expired {
        /// The acquisition.
        req: u64,
        /// When, CLOCK_MONOTONIC nanoseconds on the node's host.
        at_ns: u64,
    },
    /// The lease is alive.
    Alive,
    /// A request was refused (`req` when it names one).
    Error {
        /// The acquisition, if the request named one.
        req: Option<u64>,
        /// Why.
        message: String,
    },
}

/// A protocol error.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The connection failed or closed mid-frame.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A frame's length is zero or above [`MAX_FRAME`].
    #[error("frame of {0} bytes (at most {MAX_FRAME})")]
    Length(u64),
    /// A frame's body is not a message of the protocol.
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// Writes one message as a frame.
pub async fn write<W: AsyncWrite + Unpin, T: Serialize>(
    w: &mut W,
    msg: &T,
) -> Result<(), ProtoError> {
    let body = rmp_serde::to_vec_named(msg).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one message; `Ok(None)` on a clean end of stream between frames.
pub async fn read<R: AsyncRead + Unpin, T: for<'de> Deserialize<'de>>(
    r: &mut R,
) -> Result<Option<T>, ProtoError> {
    match leda_net::frame::read_raw(r, MAX_FRAME).await {
        Ok(None) => Ok(None),
        Ok(Some(buf)) => rmp_serde::from_slice(&buf)
            .map(Some)
            .map_err(|e| ProtoError::Malformed(e.to_string())),
        Err(leda_net::FrameError::BadLength { len, .. }) => Err(ProtoError::Length(len)),
        Err(leda_net::FrameError::Io(e)) => Err(ProtoError::Io(e)),
        Err(e) => Err(ProtoError::Malformed(e.to_string())),
    }
}

/// CLOCK_MONOTONIC now, nanoseconds (the clock of every time in the protocol and in
/// `lock-check` histories).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_hostile_ones_are_refused() {
        let mut buf = Vec::new();
        let msg = Request::Acquire {
            req: 7,
            lock: "x".into(),
            wait: true,
        };
        write(&mut buf, &msg).await.unwrap();
        let back: Option<Request> = read(&mut buf.as_slice()).await.unwrap();
        assert_eq!(back, Some(msg));
        // A length above the limit is refused before any body is read.
        let big = (MAX_FRAME + 1).to_le_bytes();
        let err = read::<_, Request>(&mut &big[..]).await.unwrap_err();
        assert!(matches!(err, ProtoError::Length(_)), "{err}");
        // A body that is no request.
        let mut bad = Vec::new();
        write(&mut bad, &("grant", "x", 1)).await.unwrap();
        let err = read::<_, Request>(&mut bad.as_slice()).await.unwrap_err();
        assert!(matches!(err, ProtoError::Malformed(_)), "{err}");
        // A truncated frame.
        let err = read::<_, Request>(&mut &buf[..buf.len() - 1])
            .await
            .unwrap_err();
        assert!(!matches!(err, ProtoError::Length(_)), "{err}");
    }
}
