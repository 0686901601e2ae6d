//! `util.map`: applies a function to each element of an array event.
//!
//! The function is Rust code, so it is chosen by name or by data, never shipped as a
//! closure through attributes (attributes are plain values, they cross processes):
//!
//! * [`map_with`] builds a map stage from any Rust function (the Rust API);
//! * [`map`] (`require 'leda.stage.util.map'`) reads attribute **`fn`**, the name of
//!   a built-in function (see [`builtin_map`]), or attributes **`pattern`** and
//!   **`replace`**, a Lua `string.gsub` applied to each element;
//! * from Lua, `require 'leda.stage.util.map'(function(v) ... end)` (Listing 5.1)
//!   is the same stage configured by a Lua function: see the crate docs.

use std::sync::Arc;

use leda_core::prelude::*;

use crate::StageError;
use crate::args::to_f64;
use crate::string::gsub;

/// A function applied to each element.
pub type MapFn = Arc<dyn Fn(Value) -> Result<Value, String> + Send + Sync>;

/// The built-in element functions of `util.map`'s `fn` attribute:
/// `tonumber`, `tostring`, `upper`, `lower`, `trim`, and `decimal_point` (a decimal
/// comma becomes a point: `"21,5"` → `"21.5"`, the conversion of Listing 5.1).
pub fn builtin_map(name: &str) -> Option<MapFn> {
    fn text(v: &Value) -> Result<String, String> {
        match v {
            Value::Str(s) => Ok(s.clone()),
            Value::Int(_) | Value::Float(_) => Ok(v.to_string()),
            other => Err(format!("{} is not a string", other.type_name())),
        }
    }
    let f: MapFn = match name {
        "tonumber" => Arc::new(|v: Value| {
            Ok(match (&v, to_f64(&v)) {
                (Value::Int(_), _) => v,
                (_, Some(x))
                    if x.fract() == 0.0 && x.abs() < 9.0e15 && !matches!(v, Value::Float(_)) =>
                {
                    Value::Int(x as i64)
                }
                (_, Some(x)) => Value::Float(x),
                (_, None) => Value::Nil,
            })
        }),
        "tostring" => Arc::new(|v: Value| Ok(Value::Str(v.to_string()))),
        "upper" => Arc::new(|v: Value| Ok(Value::Str(text(&v)?.to_uppercase()))),
        "lower" => Arc::new(|v: Value| Ok(Value::Str(text(&v)?.to_lowercase()))),
        "trim" => Arc::new(|v: Value| Ok(Value::Str(text(&v)?.trim().to_owned()))),
        "decimal_point" => Arc::new(|v: Value| Ok(Value::Str(text(&v)?.replace(',', ".")))),
        _ => return None,
    };
    Some(f)
}

const BUILTINS: &str = "tonumber, tostring, upper, lower, trim, decimal_point";

fn from_attrs(stage: &str, attrs: &Attrs) -> Result<MapFn, StageError> {
    match (attrs.get("fn"), attrs.get("pattern"), attrs.get("replace")) {
        (Some(Value::Str(name)), None, None) => builtin_map(name).ok_or_else(|| {
            StageError::attr(
                stage,
                "fn",
                format!("'{name}' is not a built-in function ({BUILTINS})"),
            )
        }),
        (Some(v), None, None) => Err(StageError::attr(
            stage,
            "fn",
            format!("must be a function name, not {v}"),
        )),
        (None, Some(Value::Str(p)), Some(Value::Str(r))) => {
            let (p, r) = (p.clone(), r.clone());
            // Validate now: a bad pattern is a configuration error, not an event error.
            gsub(&p, "", &r).map_err(|reason| StageError::Pattern {
                stage: stage.to_owned(),
                pattern: p.clone(),
                reason,
            })?;
            Ok(Arc::new(move |v: Value| match v {
                Value::Str(s) => gsub(&p, &s, &r).map(Value::Str),
                Value::Int(_) | Value::Float(_) => gsub(&p, &v.to_string(), &r).map(Value::Str),
                other => Err(format!("{} is not a string", other.type_name())),
            }))
        }
        (None, None, None) => Err(StageError::attr(
            stage,
            "fn",
            format!("must be set ({BUILTINS}), or 'pattern' and 'replace'"),
        )),
        _ => Err(StageError::attr(
            stage,
            "fn",
            "conflicts with 'pattern'/'replace': set either 'fn', or both 'pattern' and 'replace' (strings)",
        )),
    }
}

fn apply(stage: &str, f: &MapFn, ev: Event, ctx: &mut Ctx) -> HandlerResult {
    let mut ev = ev;
    let out = match ev.take(0) {
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    f(v).map_err(|e| StageError::event(stage, format!("element {}: {e}", i + 1)))
                })
                .collect::<Result<_, _>>()?,
        ),
        Value::Nil if ev.is_empty() => {
            return Err(StageError::event(stage, "expected an array, got an empty event").into());
        }
        scalar => f(scalar).map_err(|e| StageError::event(stage, e))?,
    };
    // Further arguments travel unchanged after the mapped value.
    let rest = ev.into_args().into_iter().skip(1);
    ctx.send_or_wait(1, Event::from_values(std::iter::once(out).chain(rest)))?;
    Ok(())
}

/// `util.map` configured by attributes (parallel).
///
/// * **Event**: `(array, extra...)`; a non-array value is mapped as a one-off.
/// * **Attributes**: `fn` (a [`builtin_map`] name), or `pattern` + `replace` (Lua gsub).
/// * **Port 1**: `(mapped array, extra...)`.
/// * **bind**: the function must be configured and port 1 connected.
pub fn map() -> Stage {
    Stage::stateful(
        "map",
        |attrs: &Attrs| -> Result<MapFn, BoxError> { Ok(from_attrs("map", attrs)?) },
        |f: &mut MapFn, ev: Event, ctx: &mut Ctx| {
            let name = ctx.stage_name().to_owned();
            apply(&name, f, ev, ctx)
        },
    )
    .bind(|b| {
        from_attrs(b.name, b.attrs).map_err(|e| e.to_string())?;
        if !b.outputs.contains(&Port::DEFAULT) {
            return Err(format!("map '{}': port 1 must be connected", b.name));
        }
        Ok(())
    })
}

/// `util.map` with a Rust function (parallel): `map_with("comma", |v| ...)`.
pub fn map_with(
    name: impl Into<String>,
    f: impl Fn(Value) -> Result<Value, String> + Send + Sync + 'static,
) -> Stage {
    let f: MapFn = Arc::new(f);
    Stage::new(name, move |ev: Event, ctx: &mut Ctx| {
        let stage = ctx.stage_name().to_owned();
        apply(&stage, &f, ev, ctx)
    })
    .bind(|b| {
        if !b.outputs.contains(&Port::DEFAULT) {
            return Err(format!("map '{}': port 1 must be connected", b.name));
        }
        Ok(())
    })
}
