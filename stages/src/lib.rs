//! Placeholder: the reusable stage library is filled by a later issue.
