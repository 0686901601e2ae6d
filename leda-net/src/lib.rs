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
//! # Wire protocol (version 3)
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
//! * Peer memory (version 3): `Memory {pid, host, addr}` offers the receiver to read
//!   this process's memory (at `addr`, a token only the two ends of this connection can
//!   compute, and a nonce), `MemoryOk {pid, host, proof}` says it did; then binaries of
//!   64 KiB or more travel as references, msgpack extension `0x4c` (`fixext 16`:
//!   address and length), read with `process_vm_readv` ([`link`], module `memory`).
//!
//! One TCP connection per process pair carries every connector between the two: the
//! launcher's deployment connection to each daemon stays open as their link, and of
//! two daemons the one with the smaller address dials the other.
//!
//! The same binary runs everywhere: stages that run in another process are rebuilt
//! there from a [`Registry`] by their kind (`Stage::kind`), with their attributes and
//! initial events taken from the deployment.
//!
//! # Example: a graph over two processes
//!
//! A daemon (here a thread of the same program; normally another process started with
//! the same binary) rebuilds the `sum` stage from its kind; the launcher deploys the
//! `sum` cluster to it and runs the source here. Both authenticate with the per-user
//! cookie file ([`auth`]).
//!
//! ```
//! use leda_core::prelude::*;
//! use leda_net::{Daemon, DaemonConfig, Launcher, Registry};
//!
//! /// Adds what it receives; quits the whole run with the total at 10 events.
//! fn sum() -> Stage {
//!     Stage::stateful(
//!         "sum",
//!         |_: &Attrs| -> Result<(i64, i64), BoxError> { Ok((0, 0)) },
//!         |(n, total): &mut (i64, i64), ev: Event, ctx: &mut Ctx| {
//!             *n += 1;
//!             *total += ev.get::<i64>(0)?;
//!             if *n == 10 {
//!                 ctx.quit(*total);
//!             }
//!             Ok(())
//!         },
//!     )
//!     .serial()
//!     .kind("example.sum")
//! }
//!
//! let daemon = Daemon::bind(
//!     DaemonConfig { listen: "127.0.0.1:0".into(), once: true, ..DaemonConfig::default() },
//!     Registry::new().with("example.sum", |_| Ok(sum())),
//! )?;
//! let at = daemon.local_addr().to_string();
//! let served = std::thread::spawn(move || daemon.serve(|_| {}));
//!
//! let source = Stage::new("source", |ev: Event, ctx: &mut Ctx| {
//!     for i in 1..=ev.get::<i64>(0)? {
//!         ctx.send_or_wait(1, i)?;
//!     }
//!     Ok(())
//! });
//! let sum = sum();
//! let mut g = Graph::new("example");
//! g.connect(&source, 1, &sum);
//! g.part([Cluster::of([&source]), Cluster::of([&sum])])?
//!     .map(["127.0.0.1:1", at.as_str()])?;
//! source.push(10);
//! let report = Launcher::new("127.0.0.1:1").run(&g, Run::default().threads(1))?;
//! assert_eq!(report.run.quit.and_then(|q| q.arg(0).and_then(|v| v.as_int())), Some(55));
//! served.join().expect("daemon thread")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

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

// The unit tests share the integration tests' certificates (`tests/common/pki.rs`),
// written against this crate's name.
#[cfg(test)]
extern crate self as leda_net;

pub use auth::Secret;
pub use daemon::{Daemon, DaemonConfig, DaemonReport};
pub use error::{FrameError, NetError};
pub use handshake::PROTOCOL_VERSION;
pub use launcher::{LaunchReport, Launched, Launcher};
pub use link::{Liveness, OnProcessLoss, ProcessLost, RouteCounts, Transport, TransportCounts};
pub use registry::{Registry, ResolveError};
pub use tls::{Tls, TlsConfig};
