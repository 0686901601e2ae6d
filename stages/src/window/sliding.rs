//! `window.sliding`: the last `size` elements.

use std::collections::VecDeque;

use leda_core::prelude::*;

use crate::args::{element, required_positive};

/// `window.sliding` (serial).
///
/// * **Attribute `size`** (required, ≥ 1).
/// * **Event**: one element (ticks ignored).
/// * **Port 1**: `(array)` of the last `size` elements, oldest first, after every
///   event once `size` elements have arrived (nothing before).
pub fn sliding() -> Stage {
    Stage::stateful(
        "sliding",
        |attrs: &Attrs| -> Result<(usize, VecDeque<Value>), BoxError> {
            let n = required_positive("sliding", attrs, "size")?;
            Ok((n, VecDeque::with_capacity(n.min(super::PREALLOC))))
        },
        |(size, win): &mut (usize, VecDeque<Value>), ev: Event, ctx: &mut Ctx| {
            let Some(v) = element(ev) else { return Ok(()) };
            if win.len() == *size {
                win.pop_front();
            }
            win.push_back(v);
            if win.len() == *size {
                ctx.send_or_wait(1, Value::Array(win.iter().cloned().collect()))?;
            }
            Ok(())
        },
    )
    .serial()
    .bind(|b| {
        required_positive(b.name, b.attrs, "size").map_err(|e| e.to_string())?;
        super::port1_bound("sliding", b)
    })
}
