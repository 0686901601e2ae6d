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
            let root = std::fs::canonicalize(&cfg.root)
                .map_err(|e| format!("document root {}: {e}", cfg.root.display()))?;
            Ok(Arc::new(Handle {
                cfg,
                root: Root::shared(root),
            }))
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
        let req = match conn.next_request(&self.cfg).await {
            Next::Gone => return forward(out, "close", Event::new().attach(conn)).await,
            Next::Refuse(e) => return refuse(out, conn, &e, false, false).await,
            Next::Request(r) => r,
        };
        conn.served += 1;
        let keep_alive = req.keep_alive && conn.served < self.cfg.max_requests_per_connection;
        let head_only = req.method == Method::Head;
        let decoded = match percent_decode(req.path.as_bytes()) {
            Ok(d) => d,
            Err(e) => return refuse(out, conn, &e, false, head_only).await,
        };
        let (path, meta) = match self.root.resolve(&decoded) {
            Ok(Resolved::File { path, meta }) => (path, meta),
            Ok(Resolved::Redirect { mut location }) => {
                if let Some(q) = &req.query {
                    location.push('?');
                    location.push_str(q);
                }
                let (head, body) = response::redirect(&location, keep_alive);
                let ev = reply_event(conn, head, body, keep_alive, head_only);
                return forward(out, "reply", ev).await;
            }
            Err(e) => return refuse(out, conn, &e, keep_alive, head_only).await,
        };
        if path.extension().is_some_and(|e| e == "lua") {
            let ev = dynamic_event(&path, &req, keep_alive, head_only).attach(conn);
            return forward(out, "dynamic", ev).await;
        }
        let mtime = meta.modified().unwrap_or(UNIX_EPOCH);
        if let Some(since) = req.if_modified_since
            && whole_seconds(mtime) <= since
        {
            let head = response::head(Status::NOT_MODIFIED, None, 0, Some(mtime), keep_alive, &[]);
            let ev = reply_event(conn, head, bytes::Bytes::new(), keep_alive, true);
            return forward(out, "reply", ev).await;
        }
        // The inode and device travel bit for bit in i64s (events carry signed integers).
        let ev = Event::from((
            "get",
            path.to_string_lossy().into_owned(),
            meta.len(),
            to_nanos(mtime),
            keep_alive,
            head_only,
        ))
        .with(meta.ino() as i64)
        .with(meta.dev() as i64)
        .attach(conn);
        forward(out, "static", ev).await
    }
}

/// HTTP dates have whole seconds: compare a file's time at that precision.
fn whole_seconds(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    UNIX_EPOCH + std::time::Duration::from_secs(secs)
}

fn dynamic_event(script: &Path, req: &Request, keep_alive: bool, head_only: bool) -> Event {
    let headers: Vec<(Value, Value)> = req
        .headers
        .iter()
        .map(|(k, v)| (Value::from(k.to_ascii_lowercase()), Value::from(v.as_str())))
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
async fn refuse(
    out: &mut Ctx,
    conn: Conn,
    e: &HttpError,
    keep_alive: bool,
    head_only: bool,
) -> HandlerResult {
    let keep_alive = keep_alive && !e.closes();
    let (head, body) = response::error(e, keep_alive);
    forward(
        out,
        "reply",
        reply_event(conn, head, body, keep_alive, head_only),
    )
    .await
}
