//! Errors of the network layer.

use leda_core::error::RunError;

/// Why a frame could not be read, decoded or encoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection in the middle of a frame.
    #[error("connection closed inside a frame ({got} of {want} bytes)")]
    Truncated {
        /// Bytes received.
        got: usize,
        /// Bytes announced.
        want: usize,
    },
    /// The announced length is zero or above the limit.
    #[error("frame of {len} bytes is outside 1..={max}")]
    BadLength {
        /// Announced length.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// The type byte names no frame type.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// The body is not valid msgpack for its type.
    #[error("malformed {kind} frame: {reason}")]
    Malformed {
        /// The frame type.
        kind: &'static str,
        /// What the decoder said.
        reason: String,
    },
    /// A value could not be encoded.
    #[error("cannot encode a {kind} frame: {reason}")]
    Encode {
        /// The frame type.
        kind: &'static str,
        /// What the encoder said.
        reason: String,
    },
    /// An I/O error on the connection.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Errors of the daemon, the launcher and the transport.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A process of the mapping was lost during the run, which then ended (the
    /// default [`OnProcessLoss::End`](leda_core::runtime::OnProcessLoss::End)).
    #[error("{lost}")]
    ProcessLost {
        /// The first process lost (the others, if any, went with the same run).
        lost: Box<crate::link::ProcessLost>,
        /// The outcome of each route's events sent from this process.
        routes: Vec<crate::link::RouteCounts>,
    },
    /// A frame error on the connection to `peer`.
    #[error("connection with {peer}: {source}")]
    Frame {
        /// The peer address.
        peer: String,
        /// The error.
        source: FrameError,
    },
    /// The peer does not speak Leda (bad magic bytes).
    #[error("{peer} is not a Leda peer (bad magic)")]
    BadMagic {
        /// The peer address.
        peer: String,
    },
    /// The peer speaks another protocol version.
    #[error("{peer} speaks protocol version {theirs}, this process speaks {ours}")]
    VersionMismatch {
        /// The peer address.
        peer: String,
        /// Our version.
        ours: u16,
        /// Theirs.
        theirs: u16,
    },
    /// Authentication failed (wrong or missing shared secret).
    #[error("authentication with {peer} failed: {reason}")]
    Auth {
        /// The peer address.
        peer: String,
        /// Why.
        reason: String,
    },
    /// The peer did something the protocol does not allow at this point.
    #[error("protocol error with {peer}: {reason}")]
    Protocol {
        /// The peer address.
        peer: String,
        /// What happened.
        reason: String,
    },
    /// The peer did not answer in time.
    #[error("{peer} did not answer within {secs:.1} s ({during})")]
    Timeout {
        /// The peer address.
        peer: String,
        /// What was expected.
        during: &'static str,
        /// The limit.
        secs: f64,
    },
    /// A daemon refused the deployment (for instance, a stage it cannot resolve).
    #[error("daemon {daemon} refused the deployment: {reason}")]
    Refused {
        /// The daemon address.
        daemon: String,
        /// Its reason.
        reason: String,
    },
    /// The graph cannot be deployed as written.
    #[error("cannot deploy: {0}")]
    Deploy(String),
    /// TLS material could not be loaded or used ([`crate::tls`]).
    #[error("TLS: {0}")]
    Tls(String),
    /// No usable shared secret ([`crate::auth`]).
    #[error(transparent)]
    Secret(#[from] crate::auth::SecretError),
    /// Binding a non-loopback address needs a configured shared secret.
    #[error(
        "listening on {addr} (not loopback) requires a configured shared secret \
         (--secret-file PATH, LEDA_SECRET_FILE or LEDA_SECRET; the same on every host)"
    )]
    SecretRequired {
        /// The address.
        addr: String,
    },
    /// The local run could not start or failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// An I/O error (bind, connect, runtime).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl NetError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> NetError {
        NetError::Io {
            context: context.into(),
            source,
        }
    }
}
