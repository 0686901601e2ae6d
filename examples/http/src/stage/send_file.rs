//! `send_file`: file responses that do not come from memory.
//!
//! * A **descriptor hit** (from the cache's port `file`): the file is already open;
//!   the head goes out with `MSG_MORE`, then the body with `sendfile(2)` from the page
//!   cache at an explicit offset (the descriptor is shared with every other connection
//!   sending the same file).
//! * A **miss**: the file is opened here, beneath the root and through no symlink
//!   ([`Root::open`]: the canonical path has none, so a directory or file swapped for
//!   one since `handle_request` resolved it is refused, never followed) and `fstat`ed.
//!   A file the cache keeps in memory is read from that descriptor (on the blocking
//!   pool), sent to the cache (port `insert`, `put`) as soon as it is read, and then
//!   written with `writev`s — by one miss per file at a time, and only while the
//!   buffers misses read and that are still alive stay within
//!   [`Limits::load_bytes`](crate::cache::Limits::load_bytes) (twice `cache_bytes`),
//!   at most [`MAX_LOAD_READS`](crate::cache::MAX_LOAD_READS) reads at once; any other
//!   miss is sent with `sendfile`, which holds no buffer. A larger file is sent with
//!   `sendfile` and its descriptor given to the cache (`insert`, `open`).
//!
//! Either way the connection then goes back to `handle_request` (`next`) or to `close`.
//! Waiting for a slow client holds no worker thread: each wait for writability is an
//! await, bounded by `send_timeout`.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use leda_core::prelude::*;

use super::{ASYNC_MAXPAR, forward, take_conn, to_nanos};
use crate::cache::{Loads, Placement, Version};
use crate::config::Config;
use crate::conn::Conn;
use crate::error::HttpError;
use crate::mime;
use crate::path::Root;
use crate::response::{self, Status};

/// A connection and the cached descriptor of the file to send it (a cache hit).
#[derive(Debug)]
pub struct FileHit {
    /// The client.
    pub conn: Conn,
    /// The open file, shared with the cache and other connections.
    pub file: Arc<File>,
    /// The response head, made by the cache once per entry and second.
    pub head: Bytes,
}

/// The `send_file` stage. Inputs: a miss, `(path, keep_alive, head_only[, load])` +
/// conn (`load`, default true: this miss may read the file into memory for the cache);
/// a descriptor hit, `(path, keep_alive, head_only, len)` + [`FileHit`].
pub fn stage() -> Stage {
    // One per stage, so one per server: what every instance's misses read.
    let loads = Arc::new(Loads::default());
    Stage::stateful(
        "send_file",
        move |attrs: &Attrs| -> Result<Instance, BoxError> {
            let cfg = Config::from_attrs(attrs)?;
            let root = Root::of(&cfg.root)?;
            Ok((Arc::new(cfg), root, loads.clone()))
        },
        |(cfg, root, loads): &mut Instance, mut ev: Event, ctx: &mut Ctx| {
            let hit = ev.take_attachment::<FileHit>();
            let path: String = ev.get(0)?;
            let keep_alive: bool = ev.get(1)?;
            let head_only: bool = ev.get(2)?;
            let (cfg, root, mut out) = (cfg.clone(), root.clone(), ctx.clone());
            let loads = loads.clone();
            match hit {
                Some(FileHit { conn, file, head }) => {
                    let len: u64 = ev.get(3)?;
                    ctx.wait(async move {
                        let body = (!head_only).then_some((file, len));
                        send_open(&cfg, conn, &head, body, keep_alive, &path, &mut out).await
                    });
                }
                None => {
                    let conn = take_conn(&mut ev, "send_file")?;
                    let load = ev.get::<Option<bool>>(3)?.unwrap_or(true);
                    ctx.wait(async move {
                        let m = Miss {
                            path,
                            keep_alive,
                            head_only,
                            load,
                        };
                        miss(&cfg, &root, &loads, conn, m, &mut out).await
                    });
                }
            }
            Ok(())
        },
    )
    .maxpar(ASYNC_MAXPAR)
}

/// An instance's state: the settings, the root, and the loads of the whole stage.
type Instance = (Arc<Config>, Arc<Root>, Arc<Loads>);

/// Sends `head`, then `body` (a file and its length) with `sendfile`, then passes the
/// connection on. The file is let go as soon as it is sent (an evicted descriptor
/// closes then). A failed write closes the connection (drops it).
async fn send_open(
    cfg: &Config,
    mut conn: Conn,
    head: &[u8],
    body: Option<(Arc<File>, u64)>,
    keep_alive: bool,
    path: &str,
    out: &mut Ctx,
) -> HandlerResult {
    let written = match body {
        Some((file, len)) if len > 0 => match conn.write_head_more(head, cfg.send_timeout).await {
            Ok(()) => conn.send_file(&file, len, cfg.send_timeout).await,
            Err(e) => Err(e),
        },
        _ => conn.write_all(head, &[], cfg.send_timeout).await,
    };
    match written {
        Ok(()) => next(out, conn, keep_alive).await,
        Err(e) => {
            tracing::debug!(%path, error = %e, "send_file: client write failed");
            Ok(())
        }
    }
}

async fn next(out: &mut Ctx, conn: Conn, keep_alive: bool) -> HandlerResult {
    let port = if keep_alive { "next" } else { "close" };
    forward(out, port, Event::new().attach(conn)).await
}

/// Opens `path` under `root` ([`Root::open`]) and reads its version from the
/// descriptor.
fn open(root: &Root, path: &str) -> std::io::Result<(File, Version)> {
    let file = root.open(Path::new(path))?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok((file, Version::of(&meta)))
}

/// The event that inserts a version of `path` into the cache.
fn insert_event(op: &str, path: &str, v: &Version) -> Event {
    Event::from((op, path, v.len, to_nanos(v.mtime)))
        .with(v.ino as i64)
        .with(v.dev as i64)
}

/// A cache miss to serve.
struct Miss {
    path: String,
    keep_alive: bool,
    head_only: bool,
    /// Whether to read the file into memory and insert it (when its size belongs
    /// there): one miss per file at a time does (see [`crate::cache::FileCache::claim_load`]).
    load: bool,
}

async fn miss(
    cfg: &Config,
    root: &Root,
    loads: &Arc<Loads>,
    mut conn: Conn,
    m: Miss,
    out: &mut Ctx,
) -> HandlerResult {
    let Miss {
        path,
        keep_alive,
        head_only,
        load,
    } = m;
    let (file, version) = match open(root, &path) {
        Ok(x) => x,
        Err(e) => {
            // Removed, replaced by a symlink or made unreadable since handle_request
            // looked at it.
            tracing::debug!(%path, error = %e, "send_file: open failed");
            let (head, body) = response::error(&HttpError::NotFound, keep_alive);
            let body: &[u8] = if head_only { &[] } else { &body };
            if conn.write_all(&head, body, cfg.send_timeout).await.is_err() {
                return Ok(());
            }
            return next(out, conn, keep_alive).await;
        }
    };
    let head = response::head(
        Status::OK,
        Some(mime::content_type(Path::new(&path))),
        version.len,
        Some(version.mtime),
        keep_alive,
        &[],
    );
    let insert = out.has_output("insert");
    let limits = cfg.cache_limits();
    let placement = limits.placement(version.len);
    // Memory placement means the length fits a usize.
    let cap = usize::try_from(version.len).unwrap_or(usize::MAX);
    let admitted = (placement == Placement::Memory && insert && load && !head_only)
        .then(|| loads.try_start(cap, limits.load_bytes()))
        .flatten();
    match admitted {
        Some(admitted) => {
            // One trip to the blocking pool, reading the descriptor that was stat'ed.
            let read = tokio::task::spawn_blocking(move || {
                let mut data = Vec::with_capacity(cap);
                // One byte more tells a file that grew since the `fstat`.
                (&file)
                    .take(version.len + 1)
                    .read_to_end(&mut data)
                    .map(|_| data)
            })
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| r);
            let body = match read {
                Ok(data) if data.len() == cap => admitted.into_bytes(data),
                // Changed under us: close rather than send a wrong length.
                Ok(_) => return Ok(()),
                Err(e) => {
                    tracing::debug!(%path, error = %e, "send_file: read failed");
                    return Ok(());
                }
            };
            // To the cache before the client, who may take long.
            let ev = insert_event("put", &path, &version).with(Value::Bytes(body.clone()));
            forward(out, "insert", ev).await?;
            match conn
                .write_all_fair(&head, &body, cfg.send_timeout, cfg.notsent_lowat, out)
                .await
            {
                Ok(()) => next(out, conn, keep_alive).await,
                Err(e) => {
                    tracing::debug!(%path, error = %e, "send_file: client write failed");
                    Ok(())
                }
            }
        }
        None => {
            let file = Arc::new(file);
            if insert && placement == Placement::Open {
                let ev = insert_event("open", &path, &version).attach(file.clone());
                forward(out, "insert", ev).await?;
            }
            let body = (!head_only).then_some((file, version.len));
            send_open(cfg, conn, &head, body, keep_alive, &path, out).await
        }
    }
}
