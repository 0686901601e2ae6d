//! `cache`: the only serial stage. Owns the [`FileCache`]: small files' contents in
//! memory (bounded by `cache_bytes`), larger files as open descriptors (bounded by
//! `max_open_files`). `get` events: a memory hit goes to `send_buffer` (port `hit`), a
//! descriptor hit to `send_file` (port `file`, sent there with `sendfile`), a miss to
//! `send_file` (port `miss`). `put` and `open` events from `send_file` insert what it
//! read or opened.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use leda_core::prelude::*;

use super::send_file::FileHit;
use super::{from_nanos, reply_event, take_bytes, take_conn};
use crate::cache::{FileCache, Hit, Placement, Version};
use crate::config::Config;
use crate::mime;
use crate::response::{self, Status};

/// Reads the [`Version`] carried by an event: `len`, `mtime_ns`, `ino`, `dev` at
/// `len_at`, `mtime_at`, `id_at` and `id_at + 1` (inode and device as i64 bits).
pub(crate) fn event_version(
    ev: &Event,
    len_at: usize,
    mtime_at: usize,
    id_at: usize,
) -> Result<Version, BoxError> {
    Ok(Version {
        len: ev.get(len_at)?,
        mtime: from_nanos(ev.get(mtime_at)?),
        ino: ev.get::<i64>(id_at)? as u64,
        dev: ev.get::<i64>(id_at + 1)? as u64,
    })
}

/// The `cache` stage. Inputs:
/// * `("get", path, len, mtime_ns, keep_alive, head_only, ino, dev)` + conn;
/// * `("put", path, len, mtime_ns, ino, dev, body)`: contents read by `send_file`;
/// * `("open", path, len, mtime_ns, ino, dev)` + `Arc<File>`: a descriptor it opened.
///
/// Outputs: `hit` (a `send_buffer` event); `file` (`(path, keep_alive, head_only,
/// len)` and a [`FileHit`] with the entry's response head), or `miss` when `file` is
/// not connected; `miss`
/// (`(path, keep_alive, head_only, load)` + conn, `load`: whether this miss may read
/// the file into memory and insert it).
pub fn stage() -> Stage {
    Stage::stateful(
        "cache",
        |attrs: &Attrs| Ok(FileCache::new(Config::from_attrs(attrs)?.cache_limits())),
        |cache: &mut FileCache, mut ev: Event, ctx: &mut Ctx| {
            let now = Instant::now();
            let op = match ev.arg(0) {
                Some(Value::Str(op)) => op.as_str(),
                _ => "",
            };
            match op {
                "get" => {
                    let conn = take_conn(&mut ev, "cache")?;
                    let version = event_version(&ev, 2, 3, 6)?;
                    let keep_alive: bool = ev.get(4)?;
                    let head_only: bool = ev.get(5)?;
                    let path = match ev.arg(1) {
                        Some(Value::Str(p)) => Path::new(p.as_str()),
                        _ => return Err("cache: 'get' without a path".into()),
                    };
                    // A hit's head is made once per entry, second and connection flag
                    // (the `Date` header has whole seconds).
                    let make_head = || {
                        response::head(
                            Status::OK,
                            Some(mime::content_type(path)),
                            version.len,
                            Some(version.mtime),
                            keep_alive,
                            &[],
                        )
                    };
                    let second = response::current_second();
                    match cache.get_with_head(path, &version, now, second, keep_alive, make_head) {
                        Some((Hit::Memory(body), head)) => {
                            let ev = reply_event(conn, head, body, keep_alive, head_only);
                            ctx.send_or_wait("hit", ev)?;
                        }
                        Some((Hit::Open(file), head)) if ctx.has_output("file") => {
                            let ev = Event::from((
                                path.to_string_lossy().into_owned(),
                                keep_alive,
                                head_only,
                                version.len,
                            ))
                            .attach(FileHit { conn, file, head });
                            ctx.send_or_wait("file", ev)?;
                        }
                        _ => {
                            // Only one miss at a time reads a file into memory.
                            let load = !head_only
                                && cache.limits().placement(version.len) == Placement::Memory
                                && cache.claim_load(path, now);
                            let path = path.to_string_lossy().into_owned();
                            let ev = Event::from((path, keep_alive, head_only, load)).attach(conn);
                            ctx.send_or_wait("miss", ev)?;
                        }
                    }
                }
                "put" => {
                    let path: String = ev.get(1)?;
                    let version = event_version(&ev, 2, 3, 4)?;
                    let body = take_bytes(&mut ev, 6)?;
                    cache.put_memory(PathBuf::from(path), version, body, now);
                }
                "open" => {
                    let file = ev
                        .take_attachment::<Arc<File>>()
                        .ok_or("cache: 'open' without a file descriptor")?;
                    let path: String = ev.get(1)?;
                    let version = event_version(&ev, 2, 3, 4)?;
                    cache.put_open(PathBuf::from(path), version, file, now);
                }
                _ => {
                    let other = ev.arg(0).map(ToString::to_string).unwrap_or_default();
                    return Err(format!("cache: unknown operation {other}").into());
                }
            }
            Ok(())
        },
    )
    .serial()
}
