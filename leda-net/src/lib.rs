//! # leda-net
//!
//! Decoupled connectors across OS processes: the wire protocol, the per-peer links
//! with credit-based flow control, the daemon that runs a deployed cluster, and the
//! launcher that deploys a mapped graph.
//!
//! Module map, bottom up:
//!
//! * [`frame`]: length-prefixed little-endian frames with msgpack bodies (total decoder);
//! * [`wire`]: the specialised decoder of `events` frames (zero-copy large binaries);
//! * [`auth`], [`handshake`]: magic, protocol version, HMAC-SHA256 challenge–response;
//! * [`deploy`], [`registry`]: the deployment message and how stages are rebuilt by kind;
//! * [`link`]: one connection per process pair, batching, credits, failure accounting;
//! * [`observe`]: peers' statistics and control actions for the launcher's dashboard;
//! * [`daemon`], [`launcher`]: the two ends of a deployment.
//!
//! # Wire protocol (version 1)
//!
//! * Handshake, both sides at once: `"LEDA"`, `u16` LE version, `u16` LE flags (bit 0:
//!   secret required), 32-byte nonce; then client `Hello {role, from, deployment,
//!   nonce, mac}`, server `Welcome {mac}` or `Error`. With a shared secret each side
//!   proves it with HMAC-SHA256 over the other's nonce ([`auth`]).
//! * Frames: `u32` LE length (type byte + body, at most 64 MiB; 64 KiB before the peer
//!   is authenticated), `u8` type, msgpack body ([`frame`]).
//! * Deployment: `Deploy` → `Ready` | `Refused(reason)`; then `Start` ([`daemon`]).
//! * Data: `Events [[route, [[args...], ...]], ...]` batches; `Replies [{route, count,
//!   refused}]` acknowledge in order and return credits; `Quit values`; `StatusReq
//!   round` / `Status {round, quiescent, accepted, links: [{peer, sent, received}]}`
//!   for global idle detection (Mattern's four counters, [`launcher`]). `links` was
//!   added without a version bump: it is the last field and decodes as empty when
//!   absent, so a launcher accepts an older daemon's answer (and checks that daemon
//!   by its `accepted` counter alone); an older launcher rejects the longer answer as
//!   malformed, so launcher and daemons should be upgraded together.
//!
//! One TCP connection per process pair carries every connector between the two: the
//! launcher's deployment connection to each daemon stays open as their link, and of
//! two daemons the one with the smaller address dials the other.
//!
//! The same binary runs everywhere: stages that run in another process are rebuilt
//! there from a [`Registry`] by their kind (`Stage::kind`), with their attributes and
//! initial events taken from the deployment.

#![warn(missing_docs)]

pub mod auth;
pub mod cli;
pub mod conn;
pub mod daemon;
pub mod deploy;
pub mod error;
pub mod frame;
pub mod handshake;
pub mod launcher;
pub mod link;
pub mod observe;
pub mod registry;
pub mod tls;
pub mod wire;

pub use auth::Secret;
pub use daemon::{Daemon, DaemonConfig, DaemonReport};
pub use error::{FrameError, NetError};
pub use handshake::PROTOCOL_VERSION;
pub use launcher::{LaunchReport, Launched, Launcher};
pub use link::{Liveness, OnProcessLoss, ProcessLost, RouteCounts, Transport, TransportCounts};
pub use registry::{Registry, ResolveError};
pub use tls::{Tls, TlsConfig};
