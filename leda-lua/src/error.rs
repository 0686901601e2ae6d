//! Errors of Lua stages and Lua scripts.

use crate::source::SourceError;
use crate::value::ConvertError;

/// A Lua stage instance failed (creation or handler).
#[derive(Debug, Clone, thiserror::Error)]
pub enum LuaStageError {
    /// Creating the instance (state, `self`, `init`) failed.
    // (The runtime says "init failed: " before it.)
    #[error("stage '{stage}': {message}")]
    Init {
        /// The stage.
        stage: String,
        /// The Lua error, with file:line.
        message: String,
    },
    /// The handler raised an error.
    #[error("stage '{stage}': {message}")]
    Handler {
        /// The stage.
        stage: String,
        /// The Lua error, with file:line.
        message: String,
    },
}

/// A configuring script failed.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The script file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A syntax or runtime error in the script (file:line in the message).
    #[error("{0}")]
    Lua(String),
    /// A function could not be made portable.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A value could not be converted.
    #[error(transparent)]
    Convert(#[from] ConvertError),
}

impl From<mlua::Error> for ScriptError {
    fn from(e: mlua::Error) -> Self {
        ScriptError::Lua(lua_message(&e))
    }
}

/// The message of a Lua error, without mlua's wrapping (tracebacks are kept for
/// runtime errors raised in Lua code).
pub fn lua_message(e: &mlua::Error) -> String {
    match e {
        mlua::Error::RuntimeError(m) | mlua::Error::SyntaxError { message: m, .. } => m.clone(),
        mlua::Error::CallbackError { cause, traceback } => {
            let inner = lua_message(cause);
            match caller_location(traceback) {
                Some(at) if !inner.starts_with(&at) => format!("{at}: {inner}"),
                _ => inner,
            }
        }
        mlua::Error::WithContext { context, cause } => format!("{context}: {}", lua_message(cause)),
        mlua::Error::ExternalError(x) => x.to_string(),
        other => other.to_string(),
    }
}

/// `file:line` of the first Lua frame in an mlua traceback.
fn caller_location(traceback: &str) -> Option<String> {
    traceback
        .lines()
        .skip_while(|l| !l.starts_with("stack traceback:"))
        .skip(1)
        .map(str::trim)
        .find(|l| !l.starts_with("[C]") && !l.starts_with("[string \"=leda\"]"))
        .and_then(|l| l.split(": in ").next())
        .map(str::to_owned)
}
