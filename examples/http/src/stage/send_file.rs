//! `send_file`: a cache miss. Small files (ones the cache admits) are read with async
//! file I/O, written, and sent back to the cache (port `insert`); larger ones go from
//! the page cache to the socket with `sendfile(2)`, without a user-space copy. The
//! connection then goes back to `handle_request` (`next`) or to `close`.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use bytes::Bytes;
use leda_core::prelude::*;

use super::{ASYNC_MAXPAR, forward, take_conn, to_nanos};
use crate::cache::Lru;
use crate::config::Config;
use crate::conn::Conn;
use crate::error::HttpError;
use crate::mime;
use crate::response::{self, Status};

/// The `send_file` stage. Input: `(path, keep_alive, head_only)` + conn.
pub fn stage() -> Stage {
    Stage::stateful(
        "send_file",
        |attrs: &Attrs| Ok(Arc::new(Config::from_attrs(attrs)?)),
        |cfg: &mut Arc<Config>, mut ev: Event, ctx: &mut Ctx| {
            let conn = take_conn(&mut ev, "send_file")?;
            let path: String = ev.get(0)?;
            let keep_alive: bool = ev.get(1)?;
            let head_only: bool = ev.get(2)?;
            let (cfg, mut out) = (cfg.clone(), ctx.clone());
            ctx.wait(async move { send(&cfg, conn, path, keep_alive, head_only, &mut out).await });
            Ok(())
        },
    )
    .maxpar(ASYNC_MAXPAR)
}

async fn send(
    cfg: &Config,
    mut conn: Conn,
    path: String,
    keep_alive: bool,
    head_only: bool,
    out: &mut Ctx,
) -> HandlerResult {
    let opened = std::fs::File::open(&path).and_then(|f| f.metadata().map(|m| (f, m)));
    let (file, meta) = match opened {
        Ok(x) => x,
        Err(e) => {
            // Removed or made unreadable since handle_request looked at it.
            tracing::debug!(%path, error = %e, "send_file: open failed");
            let (head, body) = response::error(&HttpError::NotFound, keep_alive);
            let body: &[u8] = if head_only { &[] } else { &body };
            if conn.write_all(&head, body, cfg.send_timeout).await.is_err() {
                return Ok(());
            }
            let port = if keep_alive { "next" } else { "close" };
            return forward(out, port, Event::new().attach(conn)).await;
        }
    };
    let len = meta.len();
    let mtime = meta.modified().unwrap_or(UNIX_EPOCH);
    let head = response::head(
        Status::OK,
        Some(mime::content_type(std::path::Path::new(&path))),
        len,
        Some(mtime),
        keep_alive,
        &[],
    );
    let cacheable = Lru::new(cfg.cache_bytes, cfg.cache_max_file).admits(len);
    let mut insert = None;
    let written = if head_only || len == 0 {
        conn.write_all(&head, &[], cfg.send_timeout).await
    } else if cacheable && out.has_output("insert") {
        drop(file);
        match tokio::fs::read(&path).await {
            Ok(data) if data.len() as u64 == len => {
                let body = Bytes::from(data);
                let r = conn.write_all(&head, &body, cfg.send_timeout).await;
                insert = Some(body);
                r
            }
            // Changed under us: close rather than send a wrong length.
            Ok(_) => return Ok(()),
            Err(e) => {
                tracing::debug!(%path, error = %e, "send_file: read failed");
                return Ok(());
            }
        }
    } else {
        match conn.write_head_more(&head, cfg.send_timeout).await {
            Ok(()) => conn.send_file(&file, len, cfg.send_timeout).await,
            Err(e) => Err(e),
        }
    };
    let delivered = match written {
        Ok(()) => {
            let port = if keep_alive { "next" } else { "close" };
            forward(out, port, Event::new().attach(conn)).await
        }
        Err(e) => {
            tracing::debug!(%path, error = %e, "send_file: client write failed");
            Ok(())
        }
    };
    if let Some(body) = insert {
        forward(
            out,
            "insert",
            Event::from(("put", path, to_nanos(mtime), Value::Bytes(body))),
        )
        .await?;
    }
    delivered
}
