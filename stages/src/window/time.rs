//! `window.time`: the elements of each `time`-second interval.

use leda_core::prelude::*;

use crate::StageError;
use crate::args::{element, seconds_attr};

struct TimeWindow {
    period: f64,
    start: Option<f64>,
    items: Vec<Value>,
}

/// `window.time` (serial).
///
/// * **Attribute `time`** (required, seconds > 0).
/// * **Event**: one element, or a tick.
/// * **Port 1**: `(array)` of the elements that arrived in one interval.
///
/// An interval starts with its first element. When an element arrives `time` seconds
/// or more after the start, the finished window is emitted first and the element
/// opens the next one. A tick emits the partial window at once (if not empty): feed
/// the stage from `util.timer` with period `time` (`timer:push(t, -1)`) and windows
/// leave every `time` seconds even when no element arrives. Time is the runtime's
/// clock (virtual under simulation).
pub fn time() -> Stage {
    Stage::stateful(
        "time",
        |attrs: &Attrs| -> Result<TimeWindow, BoxError> {
            let period = seconds_attr("time", attrs, "time")?
                .ok_or_else(|| StageError::attr("time", "time", "must be set (seconds > 0)"))?;
            Ok(TimeWindow {
                period,
                start: None,
                items: Vec::new(),
            })
        },
        |w: &mut TimeWindow, ev: Event, ctx: &mut Ctx| {
            let now = ctx.gettime();
            match element(ev) {
                None => {
                    if !w.items.is_empty() {
                        ctx.send_or_wait(1, Value::Array(std::mem::take(&mut w.items)))?;
                    }
                    w.start = None;
                }
                Some(v) => {
                    if let Some(start) = w.start
                        && now - start >= w.period
                    {
                        ctx.send_or_wait(1, Value::Array(std::mem::take(&mut w.items)))?;
                        w.start = None;
                    }
                    w.start.get_or_insert(now);
                    w.items.push(v);
                }
            }
            Ok(())
        },
    )
    .serial()
    .bind(|b| {
        seconds_attr(b.name, b.attrs, "time")
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("window.time '{}': attribute 'time' must be set", b.name))?;
        super::port1_bound("time", b)
    })
}
