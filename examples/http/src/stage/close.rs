//! `close`: ends a connection gracefully (shut down the write side, drain briefly), so
//! that unread request bytes do not turn the close into a reset that destroys the
//! response still in flight.

use leda_core::prelude::*;

use super::{ASYNC_MAXPAR, take_conn};

/// The `close` stage.
pub fn stage() -> Stage {
    Stage::new("close", |mut ev: Event, ctx: &mut Ctx| {
        let conn = take_conn(&mut ev, "close")?;
        ctx.wait(async move {
            conn.linger_close().await;
            Ok(())
        });
        Ok(())
    })
    .maxpar(ASYNC_MAXPAR)
}
