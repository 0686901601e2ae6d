//! `send_buffer`: writes an in-memory response (from the cache, the CGI stage or an
//! error) to the client, then sends the connection back to `handle_request`
//! (keep-alive, port `next`) or to `close`.

use std::sync::Arc;

use leda_core::prelude::*;

use super::{ASYNC_MAXPAR, forward, take_bytes, take_conn};
use crate::config::Config;

/// The `send_buffer` stage. Input: `(head, body, keep_alive, head_only)` + conn.
pub fn stage() -> Stage {
    Stage::stateful(
        "send_buffer",
        |attrs: &Attrs| Ok(Arc::new(Config::from_attrs(attrs)?)),
        |cfg: &mut Arc<Config>, mut ev: Event, ctx: &mut Ctx| {
            let mut conn = take_conn(&mut ev, "send_buffer")?;
            let head = take_bytes(&mut ev, 0)?;
            let body = take_bytes(&mut ev, 1)?;
            let keep_alive: bool = ev.get(2)?;
            let head_only: bool = ev.get(3)?;
            let (cfg, mut out) = (cfg.clone(), ctx.clone());
            ctx.wait(async move {
                let body: &[u8] = if head_only { &[] } else { &body };
                if let Err(e) = conn
                    .write_all_fair(&head, body, cfg.send_timeout, cfg.notsent_lowat, &mut out)
                    .await
                {
                    tracing::debug!(error = %e, "send_buffer: client write failed");
                    return Ok(());
                }
                let port = if keep_alive { "next" } else { "close" };
                forward(&mut out, port, Event::new().attach(conn)).await
            });
            Ok(())
        },
    )
    .maxpar(ASYNC_MAXPAR)
}
