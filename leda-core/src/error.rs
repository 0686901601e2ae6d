//! Errors of the runtime: why a send failed, why a run could not start.

use crate::event::Event;
use crate::graph::GraphError;

/// Why `send` failed. The event was not delivered; the sender decides what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The output port has no connector.
    #[error("port '{port}' of stage '{stage}' is not connected")]
    NotConnected {
        /// The sending stage.
        stage: String,
        /// The port.
        port: String,
    },
    /// The destination's event queue is at capacity (Leda's wording).
    #[error("Event queue for the stage '{stage}' is full.")]
    QueueFull {
        /// The destination stage (shared with the runtime: a refusal under
        /// back-pressure, a hot path, allocates nothing).
        stage: std::sync::Arc<str>,
    },
    /// A local attachment cannot travel on a decoupled connector.
    #[error(
        "event on port '{port}' of stage '{stage}' carries a local attachment, which cannot cross a decoupled connector"
    )]
    AttachmentOnDecoupled {
        /// The sending stage.
        stage: String,
        /// The port.
        port: String,
    },
    /// The destination (another process) could not be reached or refused the event.
    #[error("stage '{stage}' is unreachable: {reason}")]
    Unreachable {
        /// The destination stage.
        stage: String,
        /// Why.
        reason: String,
    },
    /// The event cannot travel to the destination's process, whichever is tried: too
    /// large for a frame, or too deeply nested. Unlike [`SendError::Unreachable`], the
    /// destination is not at fault: sending it elsewhere fails alike.
    #[error("the event cannot be sent to stage '{stage}': {reason}")]
    Unsendable {
        /// The destination stage.
        stage: String,
        /// Why.
        reason: String,
    },
    /// A cohort hand-off found no free instance of the destination.
    #[error("Cannot get a parallel instance of stage '{stage}'")]
    CohortUnavailable {
        /// The destination stage.
        stage: String,
    },
    /// The run is over; nothing more is delivered.
    #[error("the run has ended")]
    Stopped,
}

/// A failed send that hands the event back to the sender (see `Ctx::try_send`).
#[derive(Debug)]
pub struct Rejected {
    /// Why it failed.
    pub error: SendError,
    /// The event, untouched.
    pub event: Event,
}

/// A handler's error that says the **event** was bad, not the instance: the event fails
/// like any other (counted, logged, sent to the `error` port), but the instance is kept,
/// and a fail-stop stage goes on. For a stage whose state is worth more than one event
/// (a merge holding what every source sent so far) and that checks an event before it
/// changes anything: returning a plain error there threw the state away with the event.
///
/// ```
/// use leda_core::prelude::*;
/// use leda_core::error::BadEvent;
/// let total = Stage::stateful("total", |_| Ok(0i64), |sum: &mut i64, ev: Event, _: &mut Ctx| {
///     let x: i64 = ev.get(0).map_err(BadEvent::new)?; // before anything changes
///     *sum += x;
///     Ok(())
/// });
/// # let _ = total;
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadEvent(pub Box<dyn std::error::Error + Send + Sync>);

impl BadEvent {
    /// Marks `why` as the event's fault.
    pub fn new(why: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> BadEvent {
        BadEvent(why.into())
    }
}

/// A handler's error that says it was stopped because its run had ended (a Lua handler
/// interrupted a second after the end, still computing): not the event's failure. The
/// instance is dropped and a line logged, but nothing is counted as failed or sent to
/// the `error` port (a run that quit while a handler computed exited 1 for it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Cancelled(pub String);

/// Why a run could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The graph, partition or mapping is invalid.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A cluster is mapped to another process but no transport was configured.
    #[error("cluster {cluster} is mapped to {addr}, another process; running it needs leda-net")]
    NoTransport {
        /// The cluster (1-based).
        cluster: usize,
        /// Its first process.
        addr: String,
    },
    /// `Run::process` names an address that the mapping does not use.
    #[error("this process ({addr}) runs no cluster of the mapping")]
    NotMapped {
        /// The address.
        addr: String,
    },
    /// A simulation's fault ([`Simulation::crash`](crate::sim::Simulation::crash),
    /// [`Simulation::link`](crate::sim::Simulation::link)) names a process that the
    /// mapping does not have: a typo would otherwise inject nothing, silently.
    #[error(
        "simulation: {fault} names process {addr}, which the mapping does not have (its processes: {})",
        .known.join(", ")
    )]
    UnknownProcess {
        /// The address named.
        addr: String,
        /// The fault that names it (`crash`, `link from`, `link to`).
        fault: &'static str,
        /// The processes of the mapping (`sim:0` for an unmapped graph).
        known: Vec<String>,
    },
    /// The transport refused to set up a remote route.
    #[error("cannot reach stage '{stage}': {reason}")]
    Remote {
        /// The stage.
        stage: String,
        /// Why.
        reason: String,
    },
    /// An I/O error (the stats file, starting threads).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}
