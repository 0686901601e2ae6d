//! `string.match`: Listing 4.3 in Rust.

use leda_core::prelude::*;

use super::{check_pattern, lua_match};
use crate::StageError;
use crate::args::named_or_first;

fn pattern_of(stage: &str, attrs: &Attrs) -> Result<String, StageError> {
    match attrs.get("pattern") {
        Some(Value::Str(p)) => {
            check_pattern(p).map_err(|reason| StageError::Pattern {
                stage: stage.to_owned(),
                pattern: p.clone(),
                reason,
            })?;
            Ok(p.clone())
        }
        None | Some(Value::Nil) => Err(StageError::attr(stage, "pattern", "must be defined")),
        Some(v) => Err(StageError::attr(
            stage,
            "pattern",
            format!("must be a string, not {v}"),
        )),
    }
}

/// `string.match` (parallel): Listing 4.3.
///
/// * **Event**: `(text, ...)`; bytes are matched as bytes, numbers as their text.
/// * **Attribute `pattern`** (required): a Lua pattern.
/// * **Port `match`** (or port 1 when `match` is not connected): the captures as
///   separate arguments (the whole match when the pattern has no captures). Events
///   that do not match are dropped, as in the listing.
/// * **bind**: `pattern` must be a valid Lua pattern, and `match` (or 1) connected.
pub fn string_match() -> Stage {
    Stage::stateful(
        "match",
        |attrs: &Attrs| -> Result<String, BoxError> { Ok(pattern_of("match", attrs)?) },
        |pattern: &mut String, ev: Event, ctx: &mut Ctx| {
            let text = match ev.arg(0) {
                Some(Value::Str(s)) => std::borrow::Cow::Borrowed(s.as_str()),
                Some(Value::Bytes(b)) => String::from_utf8_lossy(b),
                Some(v @ (Value::Int(_) | Value::Float(_))) => {
                    std::borrow::Cow::Owned(v.to_string())
                }
                other => {
                    let t = other.map_or("nothing", |v| v.type_name());
                    return Err(StageError::event(
                        ctx.stage_name(),
                        format!("argument 1 must be a string, not {t}"),
                    )
                    .into());
                }
            };
            let found = lua_match(pattern, &text).map_err(|reason| StageError::Pattern {
                stage: ctx.stage_name().to_owned(),
                pattern: pattern.clone(),
                reason,
            })?;
            if let Some(caps) = found {
                let port = named_or_first(ctx, "match");
                ctx.send_or_wait(&port, Event::from_values(caps.into_iter().map(Value::Str)))?;
            }
            Ok(())
        },
    )
    .bind(|b| {
        pattern_of(b.name, b.attrs).map_err(|e| e.to_string())?;
        if !b.has_output("match") && !b.has_output(1) {
            return Err(format!(
                "match '{}': 'match' port must be connected",
                b.name
            ));
        }
        Ok(())
    })
}
