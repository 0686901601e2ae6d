//! Leda-RS complex event processing application.

use leda_core::stage::Stage;

/// The stages this crate registers with the `leda` command, by `require` name.
pub fn catalogue() -> Vec<(&'static str, fn() -> Stage)> {
    Vec::new()
}
