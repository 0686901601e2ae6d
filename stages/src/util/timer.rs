//! `util.timer`: re-emits its extra arguments every period.

use std::time::Duration;

use leda_core::error::SendError;
use leda_core::prelude::*;

use crate::StageError;
use crate::args::{to_f64, to_i64};

/// `util.timer` (parallel; asynchronous).
///
/// * **Event**: `(period_s, count, extra...)`; `count = -1` repeats for ever.
/// * **Port 1**: `(extra...)` after each period (the first one period after the event).
///
/// Waiting is a runtime sleep: the instance is *Waiting* and holds no worker thread.
/// Each timer event runs in its own instance, so several timers run at once. A timer
/// that repeats for ever keeps the run alive until `leda.quit` (or the run's end).
pub fn timer() -> Stage {
    crate::args::waiting("timer", |ev: Event, mut ctx: Ctx| async move {
        let name = ctx.stage_name().to_owned();
        let period = ev.arg(0).and_then(to_f64).ok_or_else(|| {
            StageError::event(&name, "argument 1 (period in seconds) must be a number")
        })?;
        let count = match ev.arg(1) {
            None | Some(Value::Nil) => 1,
            Some(v) => to_i64(v).ok_or_else(|| {
                StageError::event(&name, "argument 2 (count) must be an integer, -1 for ever")
            })?,
        };
        let sleep = match Duration::try_from_secs_f64(period) {
            Ok(d) if !(d.is_zero() && count < 0) => d,
            _ => {
                return Err(StageError::event(
                    &name,
                    format!(
                        "argument 1 (period) {period} must be a number of seconds from 0 to \
                         {:e}, > 0 to repeat for ever",
                        u64::MAX as f64
                    ),
                )
                .into());
            }
        };
        let extra: Vec<Value> = ev.args().iter().skip(2).cloned().collect();
        let mut fired: i64 = 0;
        while count < 0 || fired < count {
            ctx.sleep(sleep).await;
            match ctx
                .send_wait(1, Event::from_values(extra.iter().cloned()))
                .await
            {
                Ok(()) => {}
                Err(SendError::Stopped) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            fired += 1;
        }
        Ok(())
    })
}
