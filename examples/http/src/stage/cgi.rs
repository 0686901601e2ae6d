//! `cgi` (the thesis' *CGI Lua*): runs a `.lua` page under the root in the instance's
//! own Lua state (thesis Listing B.1) and sends what it returns to `send_buffer`.
//!
//! A page is a Lua chunk that returns its body as a string, and optionally a content
//! type (default `text/html; charset=utf-8`). It sees a global `request` table
//! (`method`, `path`, `query`, `headers` with lower-case names) and a sandbox: the base
//! library without file access, `string`, `table`, `math`, `utf8`, `coroutine`, the
//! time functions of `os`, and a `require` for those. Each request runs in a fresh
//! environment. A script that fails, runs past `cgi_timeout` or uses more than
//! `cgi_memory` gives `500`, logged with its file and line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use leda_core::prelude::*;
use mlua::{HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, VmState};

use super::{reply_event, take_conn};
use crate::config::Config;
use crate::error::HttpError;
use crate::response::{self, Status};

/// The instance state: a Lua state and the scripts' sources, by path and mtime.
pub struct Cgi {
    lua: Lua,
    cfg: Config,
    root: PathBuf,
    sources: HashMap<PathBuf, (SystemTime, Arc<str>)>,
    deadline: Arc<std::sync::Mutex<Option<Instant>>>,
    timed_out: Arc<AtomicBool>,
}

/// What a page returned.
#[derive(Debug)]
pub struct Page {
    /// The body.
    pub body: Bytes,
    /// Its content type.
    pub content_type: String,
}

/// The request a page sees.
#[derive(Debug, Default)]
pub struct PageRequest {
    /// GET or HEAD.
    pub method: String,
    /// The path (percent-encoded, as sent).
    pub path: String,
    /// The query string ("" when none).
    pub query: String,
    /// The header fields, lower-case names.
    pub headers: Vec<(String, String)>,
}

impl Cgi {
    /// A fresh sandboxed Lua state with the settings of `cfg`.
    pub fn new(cfg: Config) -> Result<Cgi, BoxError> {
        let root = std::fs::canonicalize(&cfg.root)
            .map_err(|e| format!("document root {}: {e}", cfg.root.display()))?;
        let libs = StdLib::STRING
            | StdLib::TABLE
            | StdLib::MATH
            | StdLib::UTF8
            | StdLib::COROUTINE
            | StdLib::OS;
        let lua = Lua::new_with(libs, LuaOptions::default())?;
        let g = lua.globals();
        for name in ["dofile", "loadfile"] {
            g.set(name, mlua::Value::Nil)?;
        }
        let os: Table = g.get("os")?;
        let safe_os = lua.create_table()?;
        for name in ["time", "clock", "date", "difftime"] {
            safe_os.set(name, os.get::<mlua::Value>(name)?)?;
        }
        g.set("os", safe_os)?;
        let libs = lua.create_table()?;
        for name in ["string", "table", "math", "utf8", "coroutine", "os"] {
            libs.set(name, g.get::<mlua::Value>(name)?)?;
        }
        g.set(
            "require",
            lua.create_function(move |_, name: String| {
                match libs.get::<mlua::Value>(name.as_str())? {
                    mlua::Value::Nil => Err(mlua::Error::runtime(format!(
                        "module '{name}' not found (pages may require only standard libraries)"
                    ))),
                    v => Ok(v),
                }
            })?,
        )?;
        g.set(
            "print",
            lua.create_function(|_, args: MultiValue| {
                let line: Vec<String> = args
                    .iter()
                    .map(|v| v.to_string().unwrap_or_default())
                    .collect();
                tracing::info!(target: "leda_http::cgi", "{}", line.join("\t"));
                Ok(())
            })?,
        )?;
        lua.set_memory_limit(cfg.cgi_memory)?;
        let deadline: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
        let timed_out = Arc::new(AtomicBool::new(false));
        let (d, t) = (deadline.clone(), timed_out.clone());
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(10_000),
            move |_, _| {
                let past = d
                    .lock()
                    .map(|g| g.is_some_and(|at| Instant::now() > at))
                    .unwrap_or(false);
                if past {
                    t.store(true, Ordering::Relaxed);
                    return Err(mlua::Error::runtime("script ran past cgi_timeout"));
                }
                Ok(VmState::Continue)
            },
        )?;
        Ok(Cgi {
            lua,
            cfg,
            root,
            sources: HashMap::new(),
            deadline,
            timed_out,
        })
    }

    /// Runs the page at `script` (a canonical path under the root).
    pub fn run(&mut self, script: &Path, req: &PageRequest) -> Result<Page, String> {
        let shown = script
            .strip_prefix(&self.root)
            .unwrap_or(script)
            .display()
            .to_string();
        let src = self.source(script).map_err(|e| format!("{shown}: {e}"))?;
        if let Ok(mut d) = self.deadline.lock() {
            *d = Some(Instant::now() + self.cfg.cgi_timeout);
        }
        self.timed_out.store(false, Ordering::Relaxed);
        let result = self.call(&src, &shown, req);
        if let Ok(mut d) = self.deadline.lock() {
            *d = None;
        }
        result.map_err(|e| {
            // The first line carries "file:line: message"; the traceback follows.
            let text = e.to_string();
            let mut lines = text.lines();
            let first = lines.next().unwrap_or_default().to_owned();
            if first.contains(&shown) {
                first
            } else {
                format!("{shown}: {first}")
            }
        })
    }

    fn source(&mut self, script: &Path) -> std::io::Result<Arc<str>> {
        let mtime = std::fs::metadata(script)?.modified()?;
        if let Some((t, s)) = self.sources.get(script)
            && *t == mtime
        {
            return Ok(s.clone());
        }
        let text: Arc<str> = Arc::from(std::fs::read_to_string(script)?);
        self.sources
            .insert(script.to_path_buf(), (mtime, text.clone()));
        Ok(text)
    }

    fn call(&self, src: &str, shown: &str, req: &PageRequest) -> mlua::Result<Page> {
        let lua = &self.lua;
        let env = lua.create_table()?;
        let meta = lua.create_table()?;
        meta.set("__index", lua.globals())?;
        env.set_metatable(Some(meta))?;
        let r = lua.create_table()?;
        r.set("method", req.method.as_str())?;
        r.set("path", req.path.as_str())?;
        r.set("query", req.query.as_str())?;
        let h = lua.create_table()?;
        for (k, v) in &req.headers {
            h.set(k.as_str(), v.as_str())?;
        }
        r.set("headers", h)?;
        env.set("request", r)?;
        let f = lua
            .load(src)
            .set_name(format!("@{shown}"))
            .set_environment(env)
            .into_function()?;
        let out = f.call::<MultiValue>(())?;
        let mut it = out.into_iter();
        let body = match it.next() {
            Some(mlua::Value::String(s)) => Bytes::copy_from_slice(&s.as_bytes()),
            _ => {
                return Err(mlua::Error::runtime(format!(
                    "{shown}: the page must return its body as a string"
                )));
            }
        };
        let content_type = match it.next() {
            Some(mlua::Value::String(s)) => s.to_str()?.to_owned(),
            _ => "text/html; charset=utf-8".to_owned(),
        };
        Ok(Page { body, content_type })
    }
}

/// The `cgi` stage. Input: `(script, keep_alive, head_only, method, path, query,
/// headers)` + conn. Output: `reply` (a `send_buffer` event).
pub fn stage() -> Stage {
    Stage::stateful(
        "cgi",
        |attrs: &Attrs| Cgi::new(Config::from_attrs(attrs)?),
        |cgi: &mut Cgi, mut ev: Event, ctx: &mut Ctx| {
            let conn = take_conn(&mut ev, "cgi")?;
            let script: String = ev.get(0)?;
            let keep_alive: bool = ev.get(1)?;
            let head_only: bool = ev.get(2)?;
            let req = PageRequest {
                method: ev.get(3)?,
                path: ev.get(4)?,
                query: ev.get(5)?,
                headers: ev
                    .get::<Option<std::collections::BTreeMap<String, String>>>(6)?
                    .unwrap_or_default()
                    .into_iter()
                    .collect(),
            };
            let (head, body, keep_alive) = match cgi.run(Path::new(&script), &req) {
                Ok(page) => {
                    let head = response::head(
                        Status::OK,
                        Some(&page.content_type),
                        page.body.len() as u64,
                        None,
                        keep_alive,
                        &[("Cache-Control", "no-store")],
                    );
                    (head, page.body, keep_alive)
                }
                Err(msg) => {
                    tracing::error!(target: "leda_http::cgi", "script error: {msg}");
                    let (head, body) = response::error(&HttpError::Internal, keep_alive);
                    (head, body, keep_alive)
                }
            };
            let ev = reply_event(conn, head, body, keep_alive, head_only);
            let mut out = ctx.clone();
            // Let send_buffer write this page before the next one is computed: with
            // every worker busy on pages, responses would otherwise wait for the whole
            // backlog (`nice` re-queues this instance behind the other ready work).
            ctx.wait(async move {
                out.send_wait("reply", ev).await?;
                out.nice().await;
                Ok(())
            });
            Ok(())
        },
    )
}
