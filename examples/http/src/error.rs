//! Typed errors: what a request can be refused with, and what building the server can
//! fail with.

use thiserror::Error;

use crate::response::Status;

/// A request the server refuses; each maps to one response status.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// Malformed request (syntax, bad escapes, missing Host on HTTP/1.1, ...).
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// The path resolves outside the root, to a directory without an index, or to
    /// something that is not a regular file.
    #[error("forbidden")]
    Forbidden,
    /// Nothing at that path.
    #[error("not found")]
    NotFound,
    /// A method other than GET or HEAD.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The request body is larger than the server accepts.
    #[error("payload too large")]
    PayloadTooLarge,
    /// The request line is longer than the limit.
    #[error("request line too long")]
    UriTooLong,
    /// The request head is larger than the limit or has too many fields.
    #[error("request header fields too large")]
    HeadersTooLarge,
    /// A transfer coding (chunked request bodies) the server does not implement.
    #[error("not implemented: {0}")]
    NotImplemented(&'static str),
    /// The client did not send a whole request head in time.
    #[error("request timeout")]
    Timeout,
    /// A CGI script failed.
    #[error("internal server error")]
    Internal,
    /// The server is at its connection limit.
    #[error("service unavailable")]
    Unavailable,
}

impl HttpError {
    /// The response status for this error.
    pub fn status(&self) -> Status {
        match self {
            HttpError::BadRequest(_) => Status::BAD_REQUEST,
            HttpError::Forbidden => Status::FORBIDDEN,
            HttpError::NotFound => Status::NOT_FOUND,
            HttpError::MethodNotAllowed => Status::METHOD_NOT_ALLOWED,
            HttpError::PayloadTooLarge => Status::PAYLOAD_TOO_LARGE,
            HttpError::UriTooLong => Status::URI_TOO_LONG,
            HttpError::HeadersTooLarge => Status::HEADERS_TOO_LARGE,
            HttpError::NotImplemented(_) => Status::NOT_IMPLEMENTED,
            HttpError::Timeout => Status::REQUEST_TIMEOUT,
            HttpError::Internal => Status::INTERNAL_ERROR,
            HttpError::Unavailable => Status::UNAVAILABLE,
        }
    }

    /// `true` if the connection must be closed after the error response (the rest of
    /// the stream cannot be trusted to start at a request boundary).
    pub fn closes(&self) -> bool {
        !matches!(
            self,
            HttpError::Forbidden | HttpError::NotFound | HttpError::Internal
        )
    }
}

/// Errors building or starting the server.
#[derive(Debug, Error)]
pub enum ServerError {
    /// The document root cannot be used.
    #[error("document root {path}: {source}")]
    Root {
        /// The root as given.
        path: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The embedded site could not be written out.
    #[error("embedded site: {0}")]
    Site(std::io::Error),
    /// A socket operation failed.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// The stage graph refused to run.
    #[error(transparent)]
    Run(#[from] leda_core::error::RunError),
}
