//! The server's stages (thesis Fig. 5.6), one module each, and the event formats
//! between them. Every event that concerns a client carries its [`Conn`] as a local
//! attachment, so every connector between these stages must be local.
//!
//! | stage            | kind                | input                          | output ports                         |
//! |------------------|---------------------|--------------------------------|--------------------------------------|
//! | `accept`         | async, serial       | start (optional listener)      | `client`, `reject`                   |
//! | `handle_request` | async               | conn                           | `static`, `dynamic`, `reply`, `close`|
//! | `cache`          | sync, serial (LRU)  | `get` + conn, or `put`         | `hit`, `miss`                        |
//! | `send_file`      | async (sendfile)    | miss + conn                    | `insert`, `next`, `close`            |
//! | `cgi`            | sync, Lua state     | script + conn                  | `reply`                              |
//! | `send_buffer`    | async               | head, body + conn              | `next`, `close`                      |
//! | `close`          | async               | conn                           | none                                 |

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use leda_core::prelude::*;

use crate::conn::Conn;

pub mod accept;
pub mod cache;
pub mod cgi;
pub mod close;
pub mod handle;
pub mod send_buffer;
pub mod send_file;

/// Instance limit of the stages that park one instance per connection.
pub const ASYNC_MAXPAR: usize = 1 << 16;

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

/// Gives the worker up until other ready tasks had their turn: the wake-up comes from
/// the reactor thread, so the task is re-queued behind the tasks this worker already
/// holds (a plain yield would go to the front of the worker's LIFO deque and run again
/// at once). A CPU-bound stage uses it so that the responses it produced are written
/// while it works on the next request.
pub(crate) fn yield_behind_others() -> impl Future<Output = ()> + Send + 'static {
    struct YieldBehind(bool);
    impl Future for YieldBehind {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                return Poll::Ready(());
            }
            self.0 = true;
            let waker = cx.waker().clone();
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(async move { waker.wake() });
                }
                Err(_) => waker.wake(),
            }
            Poll::Pending
        }
    }
    YieldBehind(false)
}

/// Sends `ev` on `port` if it is connected; otherwise the connection is just closed
/// (dropped). Waits while the destination queue is full.
pub(crate) async fn forward(ctx: &mut Ctx, port: &str, ev: Event) -> HandlerResult {
    if ctx.has_output(port) {
        ctx.send_wait(port, ev).await?;
    }
    Ok(())
}
