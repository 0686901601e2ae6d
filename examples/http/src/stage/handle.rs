//! `handle_request`: reads and parses the next request on a connection, resolves its
//! path under the root, and routes it: `static` (to the cache), `dynamic` (`.lua`, to
//! the CGI stage), `reply` (errors, redirects, `304`, straight to `send_buffer`), or
//! `close` (client gone, idle too long).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use leda_core::prelude::*;

use super::{ASYNC_MAXPAR, forward, reply_event, take_conn, to_nanos};
use crate::config::Config;
use crate::conn::{Conn, Next};
use crate::error::HttpError;
use crate::path::{Resolved, Root, percent_decode};
use crate::request::{Method, Request};
use crate::response::{self, Status};

/// The instance state: settings and the root.
struct Handle {
    cfg: Config,
    root: Arc<Root>,
}

/// The `handle_request` stage. Input: a conn. Outputs:
/// * `static`: `("get", path, len, mtime_ns, keep_alive, head_only, ino, dev)` + conn;
/// * `dynamic`: `(script, keep_alive, head_only, method, path, query, headers)` + conn;
/// * `reply`: a `send_buffer` event; `close`: a conn.
pub fn stage() -> Stage {
    Stage::stateful(
        "handle_request",
        |attrs: &Attrs| {
            let cfg = Config::from_attrs(attrs)?;
            let root = Root::of(&cfg.root)?;
            Ok(Arc::new(Handle { cfg, root }))
        },
        |h: &mut Arc<Handle>, mut ev: Event, ctx: &mut Ctx| {
            let conn = take_conn(&mut ev, "handle_request")?;
            let (h, mut out) = (h.clone(), ctx.clone());
            ctx.wait(async move { h.serve(conn, &mut out).await });
            Ok(())
        },
    )
    .maxpar(ASYNC_MAXPAR)
}

impl Handle {
    async fn serve(&self, mut conn: Conn, out: &mut Ctx) -> HandlerResult {
        let next = conn.next_request(&self.cfg).await;
        // Routing is synchronous and the only await after it is this one forward: the
        // future stays small (it is boxed per request).
        let (port, ev) = self.route(conn, next);
        forward(out, port, ev).await
    }

    /// Where a connection goes with what reading its next request gave, and the event.
    fn route(&self, mut conn: Conn, next: Next) -> (&'static str, Event) {
        let req = match next {
            Next::Gone => return ("close", Event::new().attach(conn)),
            Next::Refuse(e) => return refuse(conn, &e, false, false),
            Next::Request(r) => r,
        };
        conn.served += 1;
        // Draining: the connection ends after this response, unless the client already
        // sent its next request (seen when the page before it was routed late, behind
        // pages that hold the workers).
        let keep_alive = req.keep_alive
            && conn.served < self.cfg.max_requests_per_connection
            && (!conn.draining() || conn.more_sent());
        let head_only = req.method == Method::Head;
        let decoded = match percent_decode(req.path.as_bytes()) {
            Ok(d) => d,
            Err(e) => return refuse(conn, &e, false, head_only),
        };
        let (path, meta) = match self.root.resolve(&decoded) {
            Ok(Resolved::File { path, meta }) => (path, meta),
            Ok(Resolved::Redirect { mut location }) => {
                if let Some(q) = &req.query {
                    location.push('?');
                    location.push_str(q);
                }
                let (head, body) = response::redirect(&location, keep_alive);
                return (
                    "reply",
                    reply_event(conn, head, body, keep_alive, head_only),
                );
            }
            Err(e) => return refuse(conn, &e, keep_alive, head_only),
        };
        if path.extension().is_some_and(|e| e == "lua") {
            let ev = dynamic_event(&path, &req, keep_alive, head_only).attach(conn);
            return ("dynamic", ev);
        }
        let mtime = meta.modified().unwrap_or(UNIX_EPOCH);
        if let Some(since) = req.if_modified_since
            && whole_seconds(mtime) <= since
        {
            let head = response::head(Status::NOT_MODIFIED, None, 0, Some(mtime), keep_alive, &[]);
            let ev = reply_event(conn, head, bytes::Bytes::new(), keep_alive, true);
            return ("reply", ev);
        }
        // The inode and device travel bit for bit in i64s (events carry signed integers).
        // Built whole: one allocation for the arguments, the path moved in when UTF-8.
        let path = path
            .into_os_string()
            .into_string()
            .unwrap_or_else(|p| p.to_string_lossy().into_owned());
        let ev = Event::from_values([
            Value::from("get"),
            Value::from(path),
            Value::from(meta.len()),
            Value::from(to_nanos(mtime)),
            Value::from(keep_alive),
            Value::from(head_only),
            Value::from(meta.ino() as i64),
            Value::from(meta.dev() as i64),
        ])
        .attach(conn);
        ("static", ev)
    }
}

/// HTTP dates have whole seconds: compare a file's time at that precision.
fn whole_seconds(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    UNIX_EPOCH + std::time::Duration::from_secs(secs)
}

fn dynamic_event(script: &Path, req: &Request, keep_alive: bool, head_only: bool) -> Event {
    let headers: Vec<(Value, Value)> = req
        .headers()
        .into_iter()
        .map(|(k, v)| (Value::from(k.to_ascii_lowercase()), Value::from(v)))
        .collect();
    let mut ev = Event::new()
        .with(script.to_string_lossy().into_owned())
        .with(keep_alive)
        .with(head_only)
        .with(if head_only { "HEAD" } else { "GET" })
        .with(req.path.as_str())
        .with(req.query.clone().unwrap_or_default());
    ev.push(Value::Map(headers));
    ev
}

/// Answers with the error's status; the connection stays open only if both the
/// client and the error allow it.
fn refuse(conn: Conn, e: &HttpError, keep_alive: bool, head_only: bool) -> (&'static str, Event) {
    let keep_alive = keep_alive && !e.closes();
    let (head, body) = response::error(e, keep_alive);
    (
        "reply",
        reply_event(conn, head, body, keep_alive, head_only),
    )
}
