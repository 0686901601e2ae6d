//! `accept` (the thesis' *wait client*): an endless accept loop on an async listener,
//! so no worker thread is held while it waits. Each client goes to `handle_request`
//! (port `client`); past the connection limit it gets a `503` through `send_buffer`
//! (port `reject`). When its server drains (the `drain` attribute names a
//! [`Drain`]), it closes the listener and ends.

use std::sync::Arc;
use std::time::Duration;

use leda_core::prelude::*;
use tokio::net::TcpListener;

use super::reply_event;
use crate::config::Config;
use crate::conn::{Conn, Drain, Gate, drained};
use crate::error::HttpError;
use crate::response;

/// Where the stage listens when its start event carries no listener.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

struct Accept {
    listen: String,
    gate: Gate,
    drain: Option<Arc<Drain>>,
}

/// The `accept` stage. Start it with one event, optionally carrying a bound
/// `std::net::TcpListener` as attachment; without one it binds the `listen` attribute
/// (default [`DEFAULT_LISTEN`]).
pub fn stage() -> Stage {
    Stage::stateful(
        "accept",
        |attrs: &Attrs| {
            let cfg = Config::from_attrs(attrs)?;
            let listen = attrs
                .get_as::<Option<String>>("listen")?
                .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
            let drain = super::drain_of(attrs)?;
            let gate = match &drain {
                Some(d) => Gate::counted_by(cfg.max_connections, d),
                None => Gate::new(cfg.max_connections),
            };
            Ok(Arc::new(Accept {
                listen,
                gate,
                drain,
            }))
        },
        |a: &mut Arc<Accept>, mut ev: Event, ctx: &mut Ctx| {
            let given = ev.take_attachment::<std::net::TcpListener>();
            let (a, mut out) = (a.clone(), ctx.clone());
            ctx.wait(async move {
                let listener = match given {
                    Some(l) => {
                        l.set_nonblocking(true)?;
                        // (Bound by the standard library: 128 connections queued.)
                        if let Err(e) = leda_core::cli::lengthen_accept_queue(&l) {
                            tracing::warn!(error = %e, "cannot lengthen the accept queue");
                        }
                        TcpListener::from_std(l)?
                    }
                    None => TcpListener::bind(&a.listen).await?,
                };
                tracing::info!(addr = %listener.local_addr()?, "accepting connections");
                loop {
                    // (Biased: once draining, no connection waiting in the backlog is
                    // taken.)
                    let accepted = tokio::select! {
                        biased;
                        () = drained(a.drain.as_deref()) => {
                            tracing::info!("draining: no more connections accepted");
                            return Ok(());
                        }
                        r = listener.accept() => r,
                    };
                    let stream = match accepted {
                        Ok((s, _)) => s,
                        Err(e) => {
                            // Out of descriptors, or a connection reset before accept:
                            // back off briefly rather than spin or die.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    match a.gate.admit() {
                        Some(slot) => {
                            let conn = Conn::new(stream, Some(slot)).drained_by(a.drain.clone());
                            out.send_wait("client", Event::new().attach(conn)).await?;
                        }
                        None => {
                            tracing::debug!(open = a.gate.open(), "connection limit: 503");
                            let (h, b) = response::error(&HttpError::Unavailable, false);
                            let ev = reply_event(Conn::new(stream, None), h, b, false, false);
                            out.send_wait("reject", ev).await?;
                        }
                    }
                }
            });
            Ok(())
        },
    )
    .serial()
}
