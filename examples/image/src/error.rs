//! Errors of the image pipeline.

use std::path::PathBuf;

/// What can go wrong with one image or with the run.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A file could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("reading", "writing"...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a decodable JPEG.
    #[error("not a valid JPEG: {0}")]
    Decode(String),
    /// JPEG compression failed.
    #[error("JPEG encoding failed: {0}")]
    Encode(String),
    /// A pixel buffer does not match its stated size.
    #[error("pixel buffer of {len} bytes does not hold {width}x{height} RGB pixels")]
    BadBuffer {
        /// Stated width.
        width: u32,
        /// Stated height.
        height: u32,
        /// Actual length in bytes.
        len: usize,
    },
    /// An event did not have the image layout.
    #[error("malformed image event: {0}")]
    BadEvent(String),
    /// A bad setting (attribute or flag).
    #[error("invalid setting: {0}")]
    Setting(String),
}

impl ImageError {
    /// An I/O error on `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ImageError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
