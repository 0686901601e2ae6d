//! `util.broadcast`: a copy of each event to every output.

use leda_core::prelude::*;

use crate::StageError;
use crate::args::{numbered_in, numbered_ports, port_of};

fn named_ports(stage: &str, attrs: &Attrs) -> Result<Vec<Port>, StageError> {
    match attrs.get("ports") {
        None | Some(Value::Nil) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                port_of(v).ok_or_else(|| {
                    StageError::attr(stage, "ports", format!("{v} does not name a port"))
                })
            })
            .collect(),
        Some(other) => Err(StageError::attr(
            stage,
            "ports",
            format!("must be an array of port names, not {other}"),
        )),
    }
}

/// `util.broadcast` (parallel): the thesis' CEP `copy` stage.
///
/// * **Event**: any values (no local attachment: it cannot be copied).
/// * **Ports**: `1, 2, ...` (every consecutively numbered connected port) and the
///   ports listed in the optional attribute **`ports`**; each gets a copy.
/// * **bind**: at least one output must be connected.
pub fn broadcast() -> Stage {
    Stage::new("broadcast", |ev: Event, ctx: &mut Ctx| {
        let name = ctx.stage_name().to_owned();
        if ev.has_attachment() {
            return Err(StageError::event(
                &name,
                "an event with a local attachment cannot be copied",
            )
            .into());
        }
        let mut ports = numbered_ports(ctx);
        for p in named_ports(&name, ctx.attrs())? {
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        let Some((last, rest)) = ports.split_last() else {
            return Err(StageError::event(&name, "no output port is connected").into());
        };
        for p in rest {
            ctx.send_or_wait(p, ev.clone_args())?;
        }
        ctx.send_or_wait(last, ev)?;
        Ok(())
    })
    .bind(|b| {
        let named = named_ports(b.name, b.attrs).map_err(|e| e.to_string())?;
        if numbered_in(b.outputs) == 0 && named.is_empty() {
            return Err(format!("broadcast '{}': port 1 must be connected", b.name));
        }
        if let Some(p) = named.iter().find(|p| !b.outputs.contains(p)) {
            return Err(format!(
                "broadcast '{}': port '{p}' is listed but not connected",
                b.name
            ));
        }
        Ok(())
    })
}
