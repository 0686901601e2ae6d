//! Connectors: a channel from one stage's output port to another stage's input queue.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::port::Port;
use crate::stage::Stage;

/// How a connector moves events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectorKind {
    /// No placement constraint; events carry values only (they may be serialized to
    /// cross processes). The default.
    #[default]
    Decoupled,
    /// Both stages in the same cluster; events may carry local attachments, moved by
    /// unique ownership.
    Local,
    /// Like `Local`, and the sending worker runs a receiving instance at once (direct
    /// hand-off); fails if no instance of the destination is free.
    Cohort,
}

impl ConnectorKind {
    /// `true` for kinds that pin both ends to one cluster (`local`, `cohort`).
    pub fn is_local(self) -> bool {
        !matches!(self, ConnectorKind::Decoupled)
    }

    /// The Lua name of the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectorKind::Decoupled => "decoupled",
            ConnectorKind::Local => "local",
            ConnectorKind::Cohort => "cohort",
        }
    }
}

impl fmt::Display for ConnectorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown connector type name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown connector type '{0}' (expected \"local\", \"decoupled\" or \"cohort\")")]
pub struct UnknownKind(pub String);

impl FromStr for ConnectorKind {
    type Err = UnknownKind;
    fn from_str(s: &str) -> Result<Self, UnknownKind> {
        match s {
            "decoupled" => Ok(ConnectorKind::Decoupled),
            "local" | "coupled" => Ok(ConnectorKind::Local),
            "cohort" => Ok(ConnectorKind::Cohort),
            other => Err(UnknownKind(other.to_owned())),
        }
    }
}

/// One connector of a graph.
#[derive(Clone, Debug)]
pub struct Connector {
    /// The emitting stage.
    pub from: Stage,
    /// Its output port.
    pub port: Port,
    /// The receiving stage.
    pub to: Stage,
    /// How events travel.
    pub kind: ConnectorKind,
}

impl fmt::Display for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{} -> {} ({})",
            self.from.name(),
            self.port,
            self.to.name(),
            self.kind
        )
    }
}
