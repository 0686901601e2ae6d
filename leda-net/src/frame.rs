//! The frame codec.
//!
//! After the handshake preamble (see [`crate::handshake`]), everything on a connection
//! is a frame:
//!
//! ```text
//! u32 LE length (of what follows: type byte + body) || u8 type || msgpack body
//! ```
//!
//! The length is checked against a limit *before* anything is allocated, and bodies are
//! read incrementally, so an announced length costs nothing until its bytes arrive.
//! [`decode`] is total: any byte string yields a frame or a [`FrameError`], never a
//! panic (the fuzz target `fuzz/fuzz_targets/frame_decode.rs` checks this). `events`
//! bodies, nearly all the traffic, go through the specialised decoder of
//! [`crate::wire`]; the other frames through `rmp-serde`.

use bytes::Bytes;
use leda_core::event::Event;
use leda_core::value::Value;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::deploy::Deployment;
use crate::error::FrameError;

/// Largest frame accepted after the handshake (type byte + body).
pub const MAX_FRAME: u32 = 64 * 1024 * 1024;

/// Largest frame accepted during the handshake, before the peer is authenticated.
pub const HANDSHAKE_MAX_FRAME: u32 = 64 * 1024;

/// Deepest nesting of arrays and maps accepted in a frame body.
pub const MAX_DEPTH: usize = 64;

/// Who opens a connection, and why (sent in [`Hello`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// A launcher about to send a deployment.
    Launcher,
    /// Another process of the same deployment, opening the data link between the two.
    Peer,
    /// A tool probing the daemon (closed after the handshake).
    Probe,
    /// A client of a service built on leda-net (e.g. the lock service's client port),
    /// which speaks that service's own protocol after the handshake.
    Client,
}

/// The client's half of the handshake.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Why the connection is opened.
    pub role: Role,
    /// The sender's address in the mapping (its identity).
    pub from: String,
    /// The deployment this connection belongs to (0 for a launcher before deploying).
    pub deployment: u64,
    /// The client's nonce (challenge for the server).
    pub nonce: Vec<u8>,
    /// HMAC over the server's nonce (empty without a secret).
    pub mac: Vec<u8>,
}

/// The server's answer to [`Hello`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// HMAC over the client's nonce (empty without a secret).
    pub mac: Vec<u8>,
}

/// The outcome of a run of events of one route, in processing order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// The route (index in the deployment's route table).
    pub route: u32,
    /// How many events, in order.
    pub count: u32,
    /// `None`: accepted (queued at the destination). `Some`: refused, and why.
    pub refused: Option<Refusal>,
}

/// Why a receiver refused events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// The destination queue is full and the sender exceeded its credit.
    QueueFull,
    /// The receiving process runs no such stage or route.
    UnknownStage(String),
    /// The receiving process' run has ended.
    Stopped,
}

/// A process' answer to a status request (distributed idle detection).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The request's round.
    pub round: u64,
    /// Nothing queued, running, waiting, pending or in flight.
    pub quiescent: bool,
    /// Events accepted from other processes so far.
    pub accepted: u64,
    /// Per-peer event counters of this process' links (Mattern's counters). Absent
    /// from the answers of peers older than this field (decoded as empty), in which
    /// case the launcher falls back to the `accepted` comparison for them.
    #[serde(default)]
    pub links: Vec<LinkCount>,
}

/// Events one process exchanged with one peer over their link, for idle detection.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LinkCount {
    /// The peer's address in the mapping.
    pub peer: String,
    /// Events handed to the link for the peer (counted before they can arrive).
    pub sent: u64,
    /// Events received from the peer and handled (queued here, waiting for room, or
    /// refused), counted once their effect is visible to quiescence.
    pub received: u64,
}

/// Frame type bytes.
pub mod kind {
    /// Fatal error, then close.
    pub const ERROR: u8 = 1;
    /// Client handshake.
    pub const HELLO: u8 = 2;
    /// Server handshake.
    pub const WELCOME: u8 = 3;
    /// A deployment.
    pub const DEPLOY: u8 = 4;
    /// Deployment resolved and peers connected.
    pub const READY: u8 = 5;
    /// Deployment refused.
    pub const REFUSED: u8 = 6;
    /// Start running.
    pub const START: u8 = 7;
    /// A batch of events.
    pub const EVENTS: u8 = 10;
    /// Acknowledgements and refusals (credits return with them).
    pub const REPLIES: u8 = 11;
    /// End the run.
    pub const QUIT: u8 = 12;
    /// Status request.
    pub const STATUS_REQ: u8 = 13;
    /// Status answer.
    pub const STATUS: u8 = 14;
    /// Dashboard request: snapshot, optionally after a control action.
    pub const OBSERVE: u8 = 15;
    /// Dashboard answer.
    pub const OBSERVED: u8 = 16;
    /// Liveness: sent by a link's writer when it has written nothing for a while.
    pub const HEARTBEAT: u8 = 17;
    /// A process of the deployment was lost (the run ends).
    pub const LOST: u8 = 18;
    /// The sender lets the receiver read its memory ([`crate::link`], peer memory).
    pub const MEMORY: u8 = 19;
    /// The receiver reads the sender's memory from now on.
    pub const MEMORY_OK: u8 = 20;
}

/// A decoded frame.
#[derive(Debug)]
pub enum Frame {
    /// The peer reports a fatal error and closes.
    Error(String),
    /// Client handshake.
    Hello(Hello),
    /// Server handshake.
    Welcome(Welcome),
    /// A deployment (launcher to daemon).
    Deploy(Box<Deployment>),
    /// The daemon resolved its cluster and connected its peers.
    Ready,
    /// The daemon refuses the deployment.
    Refused(String),
    /// Start the run.
    Start,
    /// Events, grouped by route.
    Events(Vec<(u32, Vec<Event>)>),
    /// Outcomes of received events.
    Replies(Vec<Reply>),
    /// End the run with these values.
    Quit(Vec<Value>),
    /// Status request for a round.
    StatusReq(u64),
    /// Status answer.
    Status(Status),
    /// Dashboard request ([`crate::observe`]).
    Observe(crate::observe::ObserveReq),
    /// Dashboard answer ([`crate::observe`]).
    Observed(Box<crate::observe::ObserveReply>),
    /// Nothing else to say for a while: the sender is alive ([`crate::link`]).
    Heartbeat,
    /// The sender noticed the loss of a process and ends the run.
    Lost(Box<crate::link::ProcessLost>),
    /// The sender lets the receiver read the binaries it sends from its memory.
    Memory(Box<crate::link::MemoryOffer>),
    /// The receiver read the offered token: references may be sent.
    MemoryOk(Box<crate::link::MemoryOk>),
}

impl Frame {
    /// The type byte.
    pub fn kind(&self) -> u8 {
        match self {
            Frame::Error(_) => kind::ERROR,
            Frame::Hello(_) => kind::HELLO,
            Frame::Welcome(_) => kind::WELCOME,
            Frame::Deploy(_) => kind::DEPLOY,
            Frame::Ready => kind::READY,
            Frame::Refused(_) => kind::REFUSED,
            Frame::Start => kind::START,
            Frame::Events(_) => kind::EVENTS,
            Frame::Replies(_) => kind::REPLIES,
            Frame::Quit(_) => kind::QUIT,
            Frame::StatusReq(_) => kind::STATUS_REQ,
            Frame::Status(_) => kind::STATUS,
            Frame::Observe(_) => kind::OBSERVE,
            Frame::Observed(_) => kind::OBSERVED,
            Frame::Heartbeat => kind::HEARTBEAT,
            Frame::Lost(_) => kind::LOST,
            Frame::Memory(_) => kind::MEMORY,
            Frame::MemoryOk(_) => kind::MEMORY_OK,
        }
    }

    /// A name for logs and errors.
    pub fn name(&self) -> &'static str {
        kind_name(self.kind())
    }
}

/// The name of a frame type byte.
pub fn kind_name(k: u8) -> &'static str {
    match k {
        kind::ERROR => "error",
        kind::HELLO => "hello",
        kind::WELCOME => "welcome",
        kind::DEPLOY => "deploy",
        kind::READY => "ready",
        kind::REFUSED => "refused",
        kind::START => "start",
        kind::EVENTS => "events",
        kind::REPLIES => "replies",
        kind::QUIT => "quit",
        kind::STATUS_REQ => "status-request",
        kind::STATUS => "status",
        kind::OBSERVE => "observe",
        kind::OBSERVED => "observed",
        kind::HEARTBEAT => "heartbeat",
        kind::LOST => "lost",
        kind::MEMORY => "memory",
        kind::MEMORY_OK => "memory-ok",
        _ => "unknown",
    }
}

fn start(buf: &mut Vec<u8>, k: u8) -> usize {
    let at = buf.len();
    buf.extend_from_slice(&[0, 0, 0, 0, k]);
    at
}

fn finish(buf: &mut [u8], at: usize, k: u8) -> Result<(), FrameError> {
    let len = buf.len() - at - 4;
    if len > MAX_FRAME as usize {
        return Err(FrameError::Encode {
            kind: kind_name(k),
            reason: format!("{len} bytes exceed the {MAX_FRAME}-byte frame limit"),
        });
    }
    buf[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(())
}

fn body<T: Serialize + ?Sized>(buf: &mut Vec<u8>, k: u8, v: &T) -> Result<(), FrameError> {
    let at = start(buf, k);
    rmp_serde::encode::write(buf, v).map_err(|e| FrameError::Encode {
        kind: kind_name(k),
        reason: e.to_string(),
    })?;
    finish(buf, at, k)
}

/// Appends the encoding of an events frame (length prefix included) to `buf`
/// (consecutive groups of one route are merged, empty groups left out).
pub fn encode_events(buf: &mut Vec<u8>, groups: &[(u32, Vec<Event>)]) -> Result<(), FrameError> {
    let mut out = crate::wire::Outgoing::new(usize::MAX, 0);
    out.bytes = std::mem::take(buf);
    let at = out.bytes.len();
    let mut f = crate::wire::EventsFrame::open(&mut out);
    for (route, events) in groups {
        for ev in events {
            if let Err(reason) = f.push(&mut out, *route, ev) {
                out.bytes.truncate(at);
                *buf = out.bytes;
                return Err(FrameError::Encode {
                    kind: kind_name(kind::EVENTS),
                    reason: *reason,
                });
            }
        }
    }
    f.close(&mut out);
    *buf = out.bytes;
    Ok(())
}

/// Appends the encoding of `frame` (length prefix included) to `buf`.
pub fn encode_into(buf: &mut Vec<u8>, frame: &Frame) -> Result<(), FrameError> {
    let k = frame.kind();
    match frame {
        Frame::Error(m) | Frame::Refused(m) => body(buf, k, m),
        Frame::Hello(h) => body(buf, k, h),
        Frame::Welcome(w) => body(buf, k, w),
        Frame::Deploy(d) => body(buf, k, d),
        Frame::Ready | Frame::Start | Frame::Heartbeat => body(buf, k, &()),
        Frame::Events(groups) => encode_events(buf, groups),
        Frame::Replies(r) => body(buf, k, r),
        Frame::Quit(v) => body(buf, k, v),
        Frame::StatusReq(r) => body(buf, k, r),
        Frame::Status(s) => body(buf, k, s),
        Frame::Observe(o) => body(buf, k, o),
        Frame::Observed(o) => body(buf, k, o),
        Frame::Lost(l) => body(buf, k, l),
        Frame::Memory(m) => body(buf, k, m),
        Frame::MemoryOk(m) => body(buf, k, m),
    }
}

/// The encoding of `frame`, length prefix included.
pub fn encode(frame: &Frame) -> Result<Vec<u8>, FrameError> {
    let mut buf = Vec::new();
    encode_into(&mut buf, frame)?;
    Ok(buf)
}

fn de<T: serde::de::DeserializeOwned>(k: u8, body: &[u8]) -> Result<T, FrameError> {
    // Nesting is bounded (so hostile input cannot exhaust the stack), declared lengths
    // only reserve what bytes are actually present, and the values are counted first.
    if items(body) > crate::wire::MAX_FRAME_VALUES {
        return Err(FrameError::Malformed {
            kind: kind_name(k),
            reason: format!(
                "more than {} values in one frame",
                crate::wire::MAX_FRAME_VALUES
            ),
        });
    }
    let mut d = rmp_serde::Deserializer::new(std::io::Cursor::new(body));
    d.set_max_depth(MAX_DEPTH);
    // (The decoder's message may quote the peer's bytes, before it is authenticated
    // too: bounded and escaped, it cannot flood or forge the log.)
    let v = T::deserialize(&mut d).map_err(|e| FrameError::Malformed {
        kind: kind_name(k),
        reason: leda_core::text::printable(&e.to_string(), 200).into_owned(),
    })?;
    let left = body.len() as u64 - d.position();
    if left != 0 {
        return Err(FrameError::Malformed {
            kind: kind_name(k),
            reason: format!("{left} trailing byte(s)"),
        });
    }
    Ok(v)
}

/// How many msgpack items the value at the start of `body` holds, nested ones included,
/// counting no further than [`crate::wire::MAX_FRAME_VALUES`] + 1 (a truncated or
/// malformed body is counted as far as it goes: the decoder says what is wrong with it).
/// One pass, each item at least one byte: linear in the body.
fn items(body: &[u8]) -> usize {
    let be = |at: usize, n: usize| -> Option<usize> {
        let b = body.get(at..at.checked_add(n)?)?;
        Some(b.iter().fold(0usize, |v, &x| (v << 8) | usize::from(x)))
    };
    let (mut pos, mut pending, mut seen) = (0usize, 1usize, 0usize);
    while pending > 0 && seen <= crate::wire::MAX_FRAME_VALUES {
        let Some(&m) = body.get(pos) else {
            break;
        };
        pos += 1;
        pending -= 1;
        seen += 1;
        // (bytes to skip after the marker, items it holds)
        let (skip, holds) = match m {
            0x80..=0x8f => (0, 2 * usize::from(m & 0x0f)),
            0x90..=0x9f => (0, usize::from(m & 0x0f)),
            0xa0..=0xbf => (usize::from(m & 0x1f), 0),
            0xc4 | 0xd9 => (1 + be(pos, 1).unwrap_or(0), 0),
            0xc5 | 0xda => (2 + be(pos, 2).unwrap_or(0), 0),
            0xc6 | 0xdb => (4 + be(pos, 4).unwrap_or(0), 0),
            0xc7 => (2 + be(pos, 1).unwrap_or(0), 0),
            0xc8 => (3 + be(pos, 2).unwrap_or(0), 0),
            0xc9 => (5 + be(pos, 4).unwrap_or(0), 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 | 0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xca | 0xce | 0xd2 => (4, 0),
            0xd6 => (5, 0),
            0xcb | 0xcf | 0xd3 => (8, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xdc => (2, be(pos, 2).unwrap_or(0)),
            0xdd => (4, be(pos, 4).unwrap_or(0)),
            0xde => (2, 2 * be(pos, 2).unwrap_or(0)),
            0xdf => (4, be(pos, 4).unwrap_or(0).saturating_mul(2)),
            _ => (0, 0),
        };
        pos = pos.saturating_add(skip);
        pending = pending.saturating_add(holds);
    }
    seen
}

/// Decodes one frame from `buf` = type byte + body (the length prefix already removed).
/// Total: never panics, whatever the bytes.
pub fn decode(buf: &[u8]) -> Result<Frame, FrameError> {
    let Some((&k, body)) = buf.split_first() else {
        return Err(FrameError::BadLength {
            len: 0,
            max: MAX_FRAME,
        });
    };
    Ok(match k {
        kind::ERROR => Frame::Error(de(k, body)?),
        kind::HELLO => Frame::Hello(de(k, body)?),
        kind::WELCOME => Frame::Welcome(de(k, body)?),
        kind::DEPLOY => Frame::Deploy(Box::new(de(k, body)?)),
        kind::READY => {
            de::<()>(k, body)?;
            Frame::Ready
        }
        kind::REFUSED => Frame::Refused(de(k, body)?),
        kind::START => {
            de::<()>(k, body)?;
            Frame::Start
        }
        kind::EVENTS => Frame::Events(events(body, None)?),
        kind::REPLIES => Frame::Replies(de(k, body)?),
        kind::QUIT => Frame::Quit(de(k, body)?),
        kind::STATUS_REQ => Frame::StatusReq(de(k, body)?),
        kind::STATUS => Frame::Status(de(k, body)?),
        kind::OBSERVE => Frame::Observe(de(k, body)?),
        kind::OBSERVED => Frame::Observed(Box::new(de(k, body)?)),
        kind::HEARTBEAT => {
            de::<()>(k, body)?;
            Frame::Heartbeat
        }
        kind::LOST => Frame::Lost(Box::new(de(k, body)?)),
        kind::MEMORY => Frame::Memory(Box::new(de(k, body)?)),
        kind::MEMORY_OK => Frame::MemoryOk(Box::new(de(k, body)?)),
        other => return Err(FrameError::UnknownType(other)),
    })
}

fn events(body: &[u8], owner: Option<&Bytes>) -> Result<Vec<(u32, Vec<Event>)>, FrameError> {
    crate::wire::decode_events(body, owner).map_err(|reason| FrameError::Malformed {
        kind: kind_name(kind::EVENTS),
        reason: *reason,
    })
}

/// Like [`decode`], for a frame received into a shared buffer: large binaries of an
/// `events` frame are slices of `buf` rather than copies (see [`crate::wire`]).
pub fn decode_shared(buf: Bytes) -> Result<Frame, FrameError> {
    match buf.first() {
        Some(&kind::EVENTS) => {
            let body = buf.slice(1..);
            Ok(Frame::Events(events(&body, Some(&body))?))
        }
        _ => decode(&buf),
    }
}

/// Splits `buf` into frames: returns the decoded frames and the bytes that were used
/// (a trailing partial frame is left for later). For tests and fuzzing of the framing.
pub fn decode_stream(buf: &[u8], max: u32) -> (Vec<Result<Frame, FrameError>>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while buf.len() - at >= 4 {
        let mut len = [0u8; 4];
        len.copy_from_slice(&buf[at..at + 4]);
        let len = u32::from_le_bytes(len);
        if len == 0 || len > max {
            out.push(Err(FrameError::BadLength {
                len: len.into(),
                max,
            }));
            return (out, buf.len());
        }
        let end = at + 4 + len as usize;
        if end > buf.len() {
            break;
        }
        out.push(decode(&buf[at + 4..end]));
        at = end;
    }
    (out, at)
}

/// Reads one raw frame (type byte + body). `Ok(None)` on a clean end of stream at a
/// frame boundary. The length is checked against `max` before reading the body, and the
/// body buffer grows only as bytes arrive.
pub async fn read_raw<R: AsyncRead + Unpin>(
    r: &mut R,
    max: u32,
) -> Result<Option<Vec<u8>>, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = r.read(&mut len[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(FrameError::Truncated { got, want: 4 });
        }
        got += n;
    }
    let len = u32::from_le_bytes(len);
    if len == 0 || len > max {
        return Err(FrameError::BadLength {
            len: len.into(),
            max,
        });
    }
    let mut buf = Vec::with_capacity((len as usize).min(64 * 1024));
    let n = (&mut *r).take(len.into()).read_to_end(&mut buf).await?;
    if n < len as usize {
        return Err(FrameError::Truncated {
            got: n,
            want: len as usize,
        });
    }
    Ok(Some(buf))
}

/// Reads and decodes one frame; `Ok(None)` on a clean end of stream.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: u32,
) -> Result<Option<Frame>, FrameError> {
    match read_raw(r, max).await? {
        None => Ok(None),
        Some(buf) => decode(&buf).map(Some),
    }
}

/// Encodes one frame at once, then writes and flushes it (the returned future does
/// not borrow the frame).
pub fn write_frame<'w, W: AsyncWrite + Unpin + Send>(
    w: &'w mut W,
    frame: &Frame,
) -> impl std::future::Future<Output = Result<(), FrameError>> + Send + 'w {
    let buf = encode(frame);
    async move {
        let buf = buf?;
        w.write_all(&buf).await?;
        w.flush().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame whose decoding fails on a string of the peer's (a hello with a role of 60
    /// KiB of terminal escapes and forged lines, before authentication) gets an error
    /// that is short and escaped: it was logged whole.
    #[test]
    fn decode_errors_quote_the_peer_bounded_and_escaped() {
        let role = "\n2026-01-01T00:00:00Z  INFO forged line \u{1b}[2J".repeat(1500);
        let mut b = vec![kind::HELLO];
        b.extend(rmp_serde::to_vec(&(role.as_str(), "from", 0u64, [0u8; 0], [0u8; 0])).unwrap());
        let e = decode(&b).unwrap_err().to_string();
        assert!(e.len() < 400, "{} bytes", e.len());
        assert!(!e.chars().any(char::is_control), "{e}");
    }

    /// Control frames (decoded through rmp-serde) hold a bounded number of values too:
    /// a quit frame of nils past the bound is refused before anything is decoded (a
    /// 16 MiB one cost 640 MiB before), and the count is exact at the bound.
    #[test]
    fn control_frames_hold_a_bounded_number_of_values() {
        let max = crate::wire::MAX_FRAME_VALUES;
        let quit = |n: usize| {
            let mut b = vec![kind::QUIT, 0xdd];
            b.extend_from_slice(&(n as u32).to_be_bytes());
            b.resize(b.len() + n, 0xc0);
            decode(&b)
        };
        // (The array itself is one value.)
        assert!(matches!(quit(max - 1), Ok(Frame::Quit(v)) if v.len() == max - 1));
        let e = quit(max).unwrap_err().to_string();
        assert!(e.contains("values in one frame"), "{e}");
        // Every kind of marker is stepped over by its length.
        let v = vec![
            Value::Str("x".repeat(300)),
            Value::Bytes(bytes::Bytes::from(vec![1u8; 70_000])),
            Value::Float(1.5),
            Value::Int(-70_000),
            Value::Int(1 << 40),
            Value::Map(vec![(Value::Int(1), Value::Array(vec![Value::Nil; 20]))]),
        ];
        let buf = encode(&Frame::Quit(v.clone())).unwrap();
        assert_eq!(items(&buf[5..]), 1 + 6 + 2 + 20);
        assert!(matches!(decode(&buf[4..]), Ok(Frame::Quit(got)) if got == v));
    }

    #[test]
    fn events_round_trip() {
        let groups = vec![
            (3u32, vec![Event::from(("a", 1)), Event::new()]),
            (
                7u32,
                vec![Event::from(bytes::Bytes::from_static(b"\x00\xff"))],
            ),
        ];
        let mut buf = Vec::new();
        encode_events(&mut buf, &groups).unwrap();
        assert_eq!(
            u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize,
            buf.len() - 4
        );
        let Frame::Events(back) = decode(&buf[4..]).unwrap() else {
            panic!("not events")
        };
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].0, 3);
        assert_eq!(back[0].1[0].get::<String>(0).unwrap(), "a");
        assert_eq!(back[0].1[0].get::<i64>(1).unwrap(), 1);
        assert!(back[0].1[1].is_empty());
        assert_eq!(
            back[1].1[0].arg(0).unwrap().as_bytes(),
            Some(&b"\x00\xff"[..])
        );
    }

    #[test]
    fn control_frames_round_trip() {
        let frames = [
            Frame::Ready,
            Frame::Start,
            Frame::Heartbeat,
            Frame::Refused("no".into()),
            Frame::Replies(vec![Reply {
                route: 1,
                count: 5,
                refused: Some(Refusal::UnknownStage("x".into())),
            }]),
            Frame::Quit(vec![Value::Int(4)]),
            Frame::StatusReq(9),
            Frame::Status(Status {
                round: 3,
                quiescent: true,
                accepted: 12,
                links: vec![LinkCount {
                    peer: "a:1".into(),
                    sent: 7,
                    received: 12,
                }],
            }),
        ];
        for f in frames {
            let buf = encode(&f).unwrap();
            let back = decode(&buf[4..]).unwrap();
            assert_eq!(back.kind(), f.kind());
            assert_eq!(format!("{back:?}"), format!("{f:?}"));
        }
    }

    /// A status answer of a peer older than the link counters still decodes.
    #[test]
    fn status_without_link_counters_decodes() {
        let mut buf = vec![kind::STATUS];
        rmp_serde::encode::write(&mut buf, &(4u64, false, 9u64)).unwrap();
        let Frame::Status(s) = decode(&buf).unwrap() else {
            panic!("not a status");
        };
        assert_eq!((s.round, s.quiescent, s.accepted), (4, false, 9));
        assert!(s.links.is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let samples: [&[u8]; 6] = [
            b"",
            b"\x00",
            b"\x0a\xff\xff\xff",
            b"\x0a\x91\x92\xce",
            b"\x63hello",
            b"\x05\x00",
        ];
        for s in samples {
            assert!(decode(s).is_err(), "{s:?}");
        }
        // Deep nesting is bounded by the decoder's depth limit.
        let mut deep = vec![kind::QUIT];
        deep.extend(std::iter::repeat_n(0x91u8, 100_000));
        assert!(decode(&deep).is_err());
        // ... while reasonable nesting is fine.
        let mut nested = Value::Int(1);
        for _ in 0..(MAX_DEPTH - 4) {
            nested = Value::Array(vec![nested]);
        }
        let buf = encode(&Frame::Quit(vec![nested])).unwrap();
        assert!(decode(&buf[4..]).is_ok());
    }

    #[test]
    fn stream_splitting_checks_lengths_first() {
        let mut buf = encode(&Frame::Start).unwrap();
        buf.extend_from_slice(&encode(&Frame::Ready).unwrap());
        let half = buf.len() - 2;
        let (frames, used) = decode_stream(&buf[..half], MAX_FRAME);
        assert_eq!(frames.len(), 1);
        assert!(used < half);
        let (frames, _) = decode_stream(&[0xff, 0xff, 0xff, 0x7f, 1], MAX_FRAME);
        assert!(matches!(frames[0], Err(FrameError::BadLength { .. })));
    }

    /// A small deterministic mutation fuzzer over valid frames (the real fuzz target is
    /// `fuzz/fuzz_targets/frame_decode.rs`): no input may panic.
    #[test]
    fn mutated_frames_never_panic() {
        let mut seeds: Vec<Vec<u8>> = vec![
            encode(&Frame::Quit(vec![
                Value::from("x"),
                Value::Array(vec![Value::Int(1)]),
            ]))
            .unwrap(),
            encode(&Frame::Replies(vec![Reply {
                route: 2,
                count: 3,
                refused: Some(Refusal::Stopped),
            }]))
            .unwrap(),
            encode(&Frame::StatusReq(7)).unwrap(),
        ];
        let mut ev = Vec::new();
        encode_events(&mut ev, &[(1, vec![Event::from(("a", 2.5, true))])]).unwrap();
        seeds.push(ev);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..20_000 {
            let mut b = seeds[i % seeds.len()].clone();
            for _ in 0..(next() % 4 + 1) {
                let at = (next() as usize) % b.len();
                match next() % 3 {
                    0 => b[at] = next() as u8,
                    1 => b.truncate(at.max(1)),
                    _ => b.insert(at, next() as u8),
                }
            }
            let _ = decode(&b[4.min(b.len())..]);
            let _ = decode_stream(&b, MAX_FRAME);
        }
    }

    #[tokio::test]
    async fn reads_reject_oversized_and_truncated() {
        let mut big: &[u8] = &[0xff, 0xff, 0xff, 0xff, 1, 2];
        assert!(matches!(
            read_raw(&mut big, MAX_FRAME).await,
            Err(FrameError::BadLength { .. })
        ));
        let mut short: &[u8] = &[10, 0, 0, 0, 7];
        assert!(matches!(
            read_raw(&mut short, MAX_FRAME).await,
            Err(FrameError::Truncated { .. })
        ));
        let mut empty: &[u8] = &[];
        assert!(read_raw(&mut empty, MAX_FRAME).await.unwrap().is_none());
    }
}
