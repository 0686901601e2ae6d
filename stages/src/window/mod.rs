//! `leda.stage.window.*`: count- and time-based windows (all serial: a window is
//! state kept between events).
//!
//! Each event adds one **element**: its only argument, or an array of its arguments
//! when it has several. An event with **no arguments is a tick**: `spatial` and
//! `time` emit their partial window on a tick (nothing if it is empty); `sliding`
//! ignores ticks. Windows are emitted on port 1 as one array argument. `merge` takes
//! `(time, source, element)` and cuts count windows over the event-time merge of its
//! sources, the same however they interleave.

mod merge;
mod sliding;
mod spatial;
mod time;

pub use merge::{Merge, Refused, merge};
pub use sliding::sliding;
pub use spatial::spatial;
pub use time::time;

/// The most elements a window reserves room for up front: a window grows with its
/// elements beyond that, so a huge `size` (1e15) costs nothing until elements arrive
/// instead of aborting the process on an allocation of `size` elements.
const PREALLOC: usize = 1024;

fn port1_bound(kind: &str, b: &leda_core::stage::BindCtx<'_>) -> Result<(), String> {
    if !b.has_output(1) {
        return Err(format!(
            "window.{kind} '{}': port 1 must be connected",
            b.name
        ));
    }
    Ok(())
}
