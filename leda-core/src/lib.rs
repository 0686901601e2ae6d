//! # leda-core
//!
//! The staged event-driven model of Leda (Salmito, PUC-Rio) in Rust: applications are
//! graphs of **stages** (a handler, an event queue, instances, named output ports)
//! joined by **connectors**; the graph is **partitioned into clusters** and each
//! cluster is **mapped to a process**, where all its stages share one worker pool
//! steered by a **controller**.
//!
//! Module map, from the data model up to the runtime:
//!
//! * [`value`], [`event`]: the dynamic values events carry (Lua- and
//!   MessagePack-compatible) and local attachments;
//! * [`port`], [`stage`], [`connector`], [`graph`], [`cluster`]: the model and its
//!   validation (`part`, `map`, `verify`);
//! * [`runtime`]: the process runtime (queues, instances, worker pool, `Ctx`);
//! * [`stats`], [`controller`]: the statistics collector and pool controllers;
//! * [`sim`]: deterministic simulation of a mapped graph in virtual time;
//! * [`dashboard`]: the per-process HTTP endpoint (page, JSON, Prometheus, controls);
//! * `chart` (feature `plot`): PNG charts of a run's statistics file;
//! * [`error`]: send and run errors.
//!
//! ```
//! use leda_core::prelude::*;
//!
//! let square = Stage::new("square", |ev: Event, ctx: &mut Ctx| {
//!     let x: i64 = ev.get(0)?;
//!     ctx.send("out", x * x)?;
//!     Ok(())
//! });
//! let sum = Stage::stateful("sum", |_| Ok(0i64), |acc: &mut i64, ev: Event, ctx: &mut Ctx| {
//!     *acc += ev.get::<i64>(0)?;
//!     if *acc == 1 + 4 + 9 {
//!         ctx.quit(*acc);
//!     }
//!     Ok(())
//! })
//! .serial();
//! let mut g = Graph::new("squares");
//! g.connect(&square, "out", &sum);
//! for x in 1..=3 {
//!     square.push(x);
//! }
//! let report = g.run(Run::default().threads(2)).unwrap();
//! assert_eq!(report.quit.unwrap().get::<i64>(0).unwrap(), 14);
//! ```

#[cfg(feature = "plot")]
pub mod chart;
#[cfg(feature = "cli")]
pub mod cli;
pub mod cluster;
pub mod connector;
pub mod controller;
pub mod dashboard;
pub mod error;
pub mod event;
pub mod graph;
pub mod port;
pub mod runtime;
pub mod sim;
pub mod stage;
pub mod stats;
pub mod text;
pub mod value;

/// The names most programs need.
pub mod prelude {
    pub use crate::cluster::Cluster;
    pub use crate::connector::ConnectorKind;
    pub use crate::controller::{Auto, Controller, Fixed, fixed};
    pub use crate::error::{RunError, SendError};
    pub use crate::event::Event;
    pub use crate::graph::Graph;
    pub use crate::port::Port;
    pub use crate::runtime::{Ctx, EndReason, OnProcessLoss, Run, RunReport};
    pub use crate::stage::{Attrs, BoxError, Handler, HandlerResult, Stage};
    pub use crate::value::Value;
}
