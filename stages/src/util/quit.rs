//! `util.quit`: ends the run.

use leda_core::prelude::*;

use crate::args::positive_attr;

/// `util.quit` (serial).
///
/// * **Event**: any values; the `count`-th event ends the run (`leda.quit`) and the
///   run returns its values.
/// * **Attribute `count`** (default 1): how many events to wait for.
/// * **bind**: `count`, when set, must be a positive integer.
pub fn quit() -> Stage {
    Stage::stateful(
        "quit",
        |attrs: &Attrs| -> Result<(usize, usize), BoxError> {
            Ok((0, positive_attr("quit", attrs, "count")?.unwrap_or(1)))
        },
        |(seen, count): &mut (usize, usize), ev: Event, ctx: &mut Ctx| {
            *seen += 1;
            if *seen == *count {
                ctx.quit(ev);
            }
            Ok(())
        },
    )
    .serial()
    .bind(|b| {
        positive_attr(b.name, b.attrs, "count").map_err(|e| e.to_string())?;
        Ok(())
    })
}
