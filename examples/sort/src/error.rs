//! Errors of the sort application.

/// What can go wrong building or checking a distributed sort.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SortError {
    /// The vector cannot be split into `np` equal parts.
    #[error("a vector of {length} doubles cannot be split into {np} equal parts")]
    Split {
        /// Vector length.
        length: usize,
        /// Number of parts.
        np: usize,
    },
    /// No parts, or no elements.
    #[error("need at least one part and one element (np = {np}, length = {length})")]
    Empty {
        /// Number of parts.
        np: usize,
        /// Vector length.
        length: usize,
    },
    /// A part too long for the C kernel's `int` length.
    #[error("a part of {0} doubles is too long for the C kernel (at most 2^31 - 1)")]
    TooLong(usize),
    /// A byte payload that is not a whole number of doubles.
    #[error("a vector payload of {0} bytes is not a whole number of 8-byte doubles")]
    Payload(usize),
    /// An unknown kernel name.
    #[error("unknown kernel '{0}' (expected 'c' or 'rust')")]
    Kernel(String),
    /// The number of processes given does not match the number of parts.
    #[error("{np} sort stages need {np} processes, {given} given")]
    Processes {
        /// Number of parts.
        np: usize,
        /// Processes given.
        given: usize,
    },
    /// The graph could not be partitioned or mapped.
    #[error("graph: {0}")]
    Graph(String),
}
