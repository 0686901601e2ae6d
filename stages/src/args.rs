//! Helpers shared by the stages: reading numbers, attributes and output ports.

use leda_core::port::Port;
use leda_core::prelude::*;

use crate::StageError;

/// A number from an int, a float or a numeric string (Lua's `tonumber`, also
/// accepting a decimal comma is *not* done here: see `util.map`).
pub fn to_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::Float(x) => Some(*x),
        Value::Str(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    }
}

/// An integer from an int, an integral float or an integral numeric string.
pub fn to_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::Float(x) if x.fract() == 0.0 && x.is_finite() => Some(*x as i64),
        Value::Str(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    }
}

/// A positive integer attribute (`size` of a window...). `None` when absent.
pub fn positive_attr(
    stage: &str,
    attrs: &Attrs,
    key: &'static str,
) -> Result<Option<usize>, StageError> {
    match attrs.get(key) {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => match to_i64(v) {
            Some(n) if n >= 1 => Ok(Some(n as usize)),
            _ => Err(StageError::attr(
                stage,
                key,
                format!("must be a positive integer, not {v}"),
            )),
        },
    }
}

/// A required positive integer attribute.
pub fn required_positive(
    stage: &str,
    attrs: &Attrs,
    key: &'static str,
) -> Result<usize, StageError> {
    positive_attr(stage, attrs, key)?
        .ok_or_else(|| StageError::attr(stage, key, "must be set (a positive integer)"))
}

/// A positive number of seconds (`time` of a window, `timeout` of http...), one that
/// a [`Duration`](std::time::Duration) can hold (about 1.8e19 s at most).
pub fn seconds_attr(
    stage: &str,
    attrs: &Attrs,
    key: &'static str,
) -> Result<Option<f64>, StageError> {
    match attrs.get(key) {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => match to_f64(v) {
            Some(x) if x > 0.0 && std::time::Duration::try_from_secs_f64(x).is_ok() => Ok(Some(x)),
            _ => Err(StageError::attr(
                stage,
                key,
                format!(
                    "must be a positive number of seconds (at most {:e}), not {v}",
                    u64::MAX as f64
                ),
            )),
        },
    }
}

/// The port a value names: a string names a port, an integer a numbered port.
pub fn port_of(v: &Value) -> Option<Port> {
    match v {
        Value::Str(s) => Some(Port::from(s.as_str())),
        Value::Int(i) => Some(Port::Index(*i)),
        Value::Float(x) if x.fract() == 0.0 => Some(Port::Index(*x as i64)),
        _ => None,
    }
}

/// `named` if connected, otherwise port 1 (stages accept either, so Listing 4.4's
/// `connect(matcher, "match", printer)` and Listing 5.1's `connect(match, window)`
/// both work).
pub fn named_or_first(ctx: &Ctx, named: &str) -> Port {
    if ctx.has_output(named) {
        Port::from(named)
    } else {
        Port::DEFAULT
    }
}

/// The numbered ports 1, 2, ... that are connected, stopping at the first gap.
pub fn numbered_ports(ctx: &Ctx) -> Vec<Port> {
    (1i64..)
        .take_while(|i| ctx.has_output(*i))
        .map(Port::Index)
        .collect()
}

/// The numbered ports 1, 2, ... among `outputs`, stopping at the first gap.
pub fn numbered_in(outputs: &[Port]) -> usize {
    (1i64..)
        .take_while(|i| outputs.contains(&Port::Index(*i)))
        .count()
}

/// One window element from an event: its only argument, or an array of its
/// arguments; `None` for an event with no arguments (a *tick*).
pub fn element(mut ev: Event) -> Option<Value> {
    match ev.len() {
        0 => None,
        1 => Some(ev.take(0)),
        _ => Some(Value::Array(ev.into_args().into_vec())),
    }
}

/// Instance limit of the library's asynchronous stages: their instances mostly wait
/// (timers, sockets) without a thread, so the thread-count default would serialize
/// them.
pub const ASYNC_MAXPAR: usize = 256;

/// An asynchronous stage ([`Stage::asynchronous`]) with [`ASYNC_MAXPAR`] instances.
pub fn waiting<F, Fut>(name: &str, handler: F) -> Stage
where
    F: Fn(Event, Ctx) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = HandlerResult> + Send + 'static,
{
    Stage::asynchronous(name, handler).maxpar(ASYNC_MAXPAR)
}
