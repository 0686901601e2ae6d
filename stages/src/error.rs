//! Errors the library's stages report (they become handler errors: the instance dies,
//! the error is counted, logged and sent to the stage's `error` port when connected).

use leda_core::error::SendError;
use leda_core::value::ValueError;

/// Why a stage of this library refused an event or a configuration.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// An attribute is missing or has the wrong type or value.
    #[error("stage '{stage}': attribute '{attr}' {problem}")]
    Attr {
        /// The stage.
        stage: String,
        /// The attribute.
        attr: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// An event argument is missing or has the wrong type.
    #[error("stage '{stage}': {problem}")]
    Event {
        /// The stage.
        stage: String,
        /// What is wrong.
        problem: String,
    },
    /// A Lua pattern does not compile.
    #[error("stage '{stage}': bad Lua pattern '{pattern}': {reason}")]
    Pattern {
        /// The stage.
        stage: String,
        /// The pattern.
        pattern: String,
        /// The compiler's message.
        reason: String,
    },
    /// An I/O operation failed.
    #[error("stage '{stage}': {what}: {source}")]
    Io {
        /// The stage.
        stage: String,
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A network protocol error (malformed HTTP response, bad URL...).
    #[error("stage '{stage}': {problem}")]
    Protocol {
        /// The stage.
        stage: String,
        /// What is wrong.
        problem: String,
    },
    /// A send failed.
    #[error(transparent)]
    Send(#[from] SendError),
    /// A value had the wrong type.
    #[error(transparent)]
    Value(#[from] ValueError),
}

impl StageError {
    /// An attribute error.
    pub fn attr(stage: &str, attr: &'static str, problem: impl Into<String>) -> Self {
        StageError::Attr {
            stage: stage.to_owned(),
            attr,
            problem: problem.into(),
        }
    }

    /// An event error.
    pub fn event(stage: &str, problem: impl Into<String>) -> Self {
        StageError::Event {
            stage: stage.to_owned(),
            problem: problem.into(),
        }
    }

    /// An I/O error.
    pub fn io(stage: &str, what: impl Into<String>, source: std::io::Error) -> Self {
        StageError::Io {
            stage: stage.to_owned(),
            what: what.into(),
            source,
        }
    }

    /// A protocol error.
    pub fn protocol(stage: &str, problem: impl Into<String>) -> Self {
        StageError::Protocol {
            stage: stage.to_owned(),
            problem: problem.into(),
        }
    }
}
