//! `util.roundrobin`: events dealt in turn to the numbered outputs.

use leda_core::prelude::*;

use crate::StageError;
use crate::args::{numbered_in, numbered_ports};

/// `util.roundrobin` (serial, so the rotation is exact).
///
/// * **Event**: anything (attachments travel with it).
/// * **Ports** `1..n`: the consecutively numbered connected ports; event *k* goes to
///   port `(k mod n) + 1`.
/// * **bind**: port 1 must be connected.
pub fn roundrobin() -> Stage {
    Stage::stateful(
        "roundrobin",
        |_: &Attrs| Ok(0usize),
        |next: &mut usize, ev: Event, ctx: &mut Ctx| {
            let ports = numbered_ports(ctx);
            if ports.is_empty() {
                return Err(StageError::event(ctx.stage_name(), "port 1 is not connected").into());
            }
            let p = &ports[*next % ports.len()];
            *next = (*next + 1) % ports.len();
            ctx.send_or_wait(p, ev)?;
            Ok(())
        },
    )
    .serial()
    .bind(|b| {
        if numbered_in(b.outputs) == 0 {
            return Err(format!("roundrobin '{}': port 1 must be connected", b.name));
        }
        Ok(())
    })
}
