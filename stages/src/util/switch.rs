//! `util.switch`: routes each event by a key.

use leda_core::prelude::*;

use crate::StageError;
use crate::args::{port_of, positive_attr};

struct Switch {
    key: usize,
    field: Option<String>,
    default: Option<Port>,
}

fn config(stage: &str, attrs: &Attrs) -> Result<Switch, StageError> {
    let key = positive_attr(stage, attrs, "key")?.unwrap_or(1);
    let field = match attrs.get("field") {
        None | Some(Value::Nil) => None,
        Some(Value::Str(s)) => Some(s.clone()),
        Some(v) => {
            return Err(StageError::attr(
                stage,
                "field",
                format!("must be a string, not {v}"),
            ));
        }
    };
    let default = match attrs.get("default") {
        None | Some(Value::Nil) => None,
        Some(v) => Some(port_of(v).ok_or_else(|| {
            StageError::attr(stage, "default", format!("{v} does not name a port"))
        })?),
    };
    Ok(Switch {
        key,
        field,
        default,
    })
}

/// `util.switch` (parallel): route by key.
///
/// * **Attribute `key`** (default 1): which argument (1-based) holds the key.
/// * **Attribute `field`** (optional): when that argument is a map, the key is this
///   field of it.
/// * **Attribute `default`** (optional): the port for keys with no connected port.
/// * **Ports**: the key names the port (a string a named port, an integer a numbered
///   one); the whole event is forwarded there.
///
/// A key with no connected port and no `default` is an error; so is a missing key.
pub fn switch() -> Stage {
    Stage::stateful(
        "switch",
        |attrs: &Attrs| -> Result<Switch, BoxError> { Ok(config("switch", attrs)?) },
        |sw: &mut Switch, ev: Event, ctx: &mut Ctx| {
            let name = ctx.stage_name().to_owned();
            let arg = ev.arg(sw.key - 1).ok_or_else(|| {
                StageError::event(&name, format!("the event has no argument {}", sw.key))
            })?;
            let key = match (&sw.field, arg) {
                (Some(f), Value::Map(_)) => arg.get(f).unwrap_or(&Value::Nil),
                _ => arg,
            };
            let port = match port_of(key).filter(|p| ctx.has_output(p)) {
                Some(p) => p,
                None => sw.default.clone().ok_or_else(|| {
                    StageError::event(&name, format!("no connected port for key {key}"))
                })?,
            };
            ctx.send_or_wait(&port, ev)?;
            Ok(())
        },
    )
    .bind(|b| {
        let sw = config(b.name, b.attrs).map_err(|e| e.to_string())?;
        if let Some(d) = &sw.default
            && !b.outputs.contains(d)
        {
            return Err(format!(
                "switch '{}': default port '{d}' is not connected",
                b.name
            ));
        }
        if b.outputs.iter().all(|p| p.is_error()) {
            return Err(format!("switch '{}': no output port is connected", b.name));
        }
        Ok(())
    })
}
