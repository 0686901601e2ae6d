//! `cache`: the only serial stage. Keeps file contents in an LRU bounded by total
//! bytes (`cache_bytes`). `get` events: a hit goes to `send_buffer` (port `hit`), a miss
//! to `send_file` (port `miss`). `put` events from `send_file` insert what it read.

use std::path::PathBuf;

use bytes::Bytes;
use leda_core::prelude::*;

use super::{from_nanos, reply_event, take_bytes, take_conn};
use crate::cache::Lru;
use crate::config::Config;
use crate::mime;
use crate::response::{self, Status};

/// The `cache` stage. Inputs:
/// * `("get", path, len, mtime_ns, keep_alive, head_only)` + conn;
/// * `("put", path, mtime_ns, body)`.
///
/// Outputs: `hit` (a `send_buffer` event), `miss` (`(path, keep_alive, head_only)` + conn).
pub fn stage() -> Stage {
    Stage::stateful(
        "cache",
        |attrs: &Attrs| {
            let cfg = Config::from_attrs(attrs)?;
            Ok(Lru::new(cfg.cache_bytes, cfg.cache_max_file))
        },
        |lru: &mut Lru, mut ev: Event, ctx: &mut Ctx| {
            let op: String = ev.get(0)?;
            match op.as_str() {
                "get" => {
                    let conn = take_conn(&mut ev, "cache")?;
                    let path: String = ev.get(1)?;
                    let len: u64 = ev.get(2)?;
                    let mtime = from_nanos(ev.get(3)?);
                    let keep_alive: bool = ev.get(4)?;
                    let head_only: bool = ev.get(5)?;
                    let path = PathBuf::from(path);
                    match lru.get(&path, len, mtime) {
                        Some(body) => {
                            let head = response::head(
                                Status::OK,
                                Some(mime::content_type(&path)),
                                len,
                                Some(mtime),
                                keep_alive,
                                &[],
                            );
                            let ev = reply_event(conn, head, body, keep_alive, head_only);
                            ctx.send_or_wait("hit", ev)?;
                        }
                        None => {
                            let path = path.to_string_lossy().into_owned();
                            let ev = Event::from((path, keep_alive, head_only)).attach(conn);
                            ctx.send_or_wait("miss", ev)?;
                        }
                    }
                }
                "put" => {
                    let path: String = ev.get(1)?;
                    let mtime = from_nanos(ev.get(2)?);
                    let body: Bytes = take_bytes(&mut ev, 3)?;
                    lru.put(PathBuf::from(path), mtime, body);
                }
                other => return Err(format!("cache: unknown operation '{other}'").into()),
            }
            Ok(())
        },
    )
    .serial()
}
