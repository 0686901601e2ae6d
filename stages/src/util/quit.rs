//! `util.quit`: ends the run.

use leda_core::prelude::*;

use crate::args::positive_attr;

/// `util.quit` (serial).
///
/// * **Event**: any values; the `count`-th event ends the run (`leda.quit`) and the
///   run returns its values.
/// * **Attribute `count`** (default 1): how many events to wait for.
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
}
