//! `util.average`: the arithmetic mean of a numeric vector.

use leda_core::prelude::*;

use crate::StageError;
use crate::args::to_f64;

/// The mean of `values` (numbers or numeric strings); an error names the first
/// value that is not a number, or says the vector is empty.
pub fn mean(values: &[Value]) -> Result<f64, String> {
    if values.is_empty() {
        return Err("the average of an empty vector is undefined".into());
    }
    let mut sum = 0.0;
    for (i, v) in values.iter().enumerate() {
        sum += to_f64(v).ok_or_else(|| format!("element {} ({v}) is not a number", i + 1))?;
    }
    Ok(sum / values.len() as f64)
}

/// `util.average` (parallel).
///
/// * **Event**: one array of numbers (or numeric strings), or the numbers as arguments.
/// * **Port 1**: `(mean)` as a float.
///
/// An empty vector or a non-numeric element is an error (the instance's `error` port).
pub fn average() -> Stage {
    Stage::new("average", |ev: Event, ctx: &mut Ctx| {
        let m = match ev.args() {
            [Value::Array(a)] => mean(a),
            args => mean(args),
        }
        .map_err(|p| StageError::event(ctx.stage_name(), p))?;
        ctx.send_or_wait(1, m)?;
        Ok(())
    })
}
