//! Placeholder: see the issue tracker. This crate is filled by a later issue.
