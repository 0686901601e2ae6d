//! Shared helpers of the example applications.
