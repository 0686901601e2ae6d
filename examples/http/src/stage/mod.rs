//! The server's stages (thesis Fig. 5.6), one module each, and the event formats
//! between them. Every event that concerns a client carries its [`Conn`] as a local
//! attachment, so every connector between these stages must be local.
//!
//! | stage            | kind                | input                          | output ports                         |
//! |------------------|---------------------|--------------------------------|--------------------------------------|
//! | `accept`         | async, serial       | start (optional listener)      | `client`, `reject`                   |
//! | `handle_request` | async               | conn                           | `static`, `dynamic`, `reply`, `close`|
//! | `cache`          | sync, serial (LRU)  | `get` + conn, `put`, `open`    | `hit`, `file`, `miss`                |
//! | `send_file`      | async (sendfile)    | file hit or miss + conn        | `insert`, `next`, `close`            |
//! | `cgi`            | sync, shared states | script + conn                  | `reply`                              |
//! | `send_buffer`    | async               | head, body + conn              | `next`, `close`                      |
//! | `close`          | async               | conn                           | none                                 |

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use leda_core::prelude::*;

use crate::conn::{Conn, Drain};

pub mod accept;
pub mod cache;
pub mod cgi;
pub mod close;
pub mod handle;
pub mod send_buffer;
pub mod send_file;

/// Instance limit of the stages that park one instance per connection.
pub const ASYNC_MAXPAR: usize = 1 << 16;

/// The attribute naming the server's [`Drain`] (set by [`crate::graph::build`]).
pub(crate) const DRAIN_ATTR: &str = "drain";

/// The server's [`Drain`], if the stage's attributes name one.
pub(crate) fn drain_of(attrs: &Attrs) -> Result<Option<std::sync::Arc<Drain>>, BoxError> {
    Ok(attrs
        .get_as::<Option<i64>>(DRAIN_ATTR)?
        .and_then(|id| Drain::find(id as u64)))
}

/// Takes the connection attached to `ev`.
pub(crate) fn take_conn(ev: &mut Event, stage: &str) -> Result<Conn, BoxError> {
    ev.take_attachment::<Conn>()
        .ok_or_else(|| format!("{stage}: event without a client connection").into())
}

/// Takes argument `i` as bytes (a string is accepted too).
pub(crate) fn take_bytes(ev: &mut Event, i: usize) -> Result<Bytes, BoxError> {
    match ev.take(i) {
        Value::Bytes(b) => Ok(b),
        Value::Str(s) => Ok(Bytes::from(s)),
        other => Err(format!(
            "argument {}: expected bytes, got {}",
            i + 1,
            other.type_name()
        )
        .into()),
    }
}

/// The `send_buffer` input: a response head and body for a connection.
pub fn reply_event(
    conn: Conn,
    head: Bytes,
    body: Bytes,
    keep_alive: bool,
    head_only: bool,
) -> Event {
    Event::from((
        Value::Bytes(head),
        Value::Bytes(body),
        keep_alive,
        head_only,
    ))
    .attach(conn)
}

/// A modification time as nanoseconds since the epoch (how it travels in events).
pub(crate) fn to_nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The inverse of [`to_nanos`].
pub(crate) fn from_nanos(n: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(n).unwrap_or(0))
}

/// Sends `ev` on `port` if it is connected; otherwise the connection is just closed
/// (dropped). Waits while the destination queue is full.
pub(crate) async fn forward(ctx: &mut Ctx, port: &str, ev: Event) -> HandlerResult {
    if ctx.has_output(port) {
        ctx.send_wait(port, ev).await?;
    }
    Ok(())
}
