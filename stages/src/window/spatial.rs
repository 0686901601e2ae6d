//! `window.spatial`: every `size` elements as one array.

use leda_core::prelude::*;

use crate::args::{element, required_positive};

/// `window.spatial` (serial): the CEP application's count-based window.
///
/// * **Attribute `size`** (required, ≥ 1).
/// * **Event**: one element; a tick flushes a partial window.
/// * **Port 1**: `(array)` of `size` elements in arrival order (fewer on a flush);
///   windows do not overlap. An empty window is never emitted.
pub fn spatial() -> Stage {
    Stage::stateful(
        "spatial",
        |attrs: &Attrs| -> Result<(usize, Vec<Value>), BoxError> {
            let n = required_positive("spatial", attrs, "size")?;
            Ok((n, Vec::with_capacity(n.min(super::PREALLOC))))
        },
        |(size, win): &mut (usize, Vec<Value>), ev: Event, ctx: &mut Ctx| {
            match element(ev) {
                Some(v) => {
                    win.push(v);
                    if win.len() >= *size {
                        let full = std::mem::replace(
                            win,
                            Vec::with_capacity((*size).min(super::PREALLOC)),
                        );
                        ctx.send_or_wait(1, Value::Array(full))?;
                    }
                }
                None if !win.is_empty() => {
                    ctx.send_or_wait(1, Value::Array(std::mem::take(win)))?;
                }
                None => {}
            }
            Ok(())
        },
    )
    .serial()
    .bind(|b| {
        required_positive(b.name, b.attrs, "size").map_err(|e| e.to_string())?;
        super::port1_bound("spatial", b)
    })
}
