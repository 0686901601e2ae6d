//! `cgi` (the thesis' *CGI Lua*): runs a `.lua` page under the root in one of the
//! stage's Lua states (thesis Listing B.1) and sends what it returns to `send_buffer`.
//!
//! A page is a Lua chunk that returns its body as a string, and optionally a content
//! type (default `text/html; charset=utf-8`). It sees a global `request` table
//! (`method`, `path`, `query`, `headers` with lower-case names) and a sandbox: the base
//! library without file access, `string`, `table`, `math`, `coroutine`, the time
//! functions of `os`, `utf8` (Lua 5.4) or `bit` (LuaJIT), and a `require` for those.
//! Each request runs in a fresh environment, and so does what it compiles with `load`;
//! under LuaJIT `getfenv` / `setfenv` reach only the page's own functions (never the
//! globals). No `__gc` (nor `newproxy`): finalizers run where no hook stops them; on
//! Lua 5.4 no `__len` either (a made-up length kept the table functions in C, see
//! `bound_c_loops`); an `xpcall` handler runs after the unwinding, as ordinary page
//! code. The pattern
//! functions of `string` are the `pattern` submodule's, which `cgi_timeout` reaches inside
//! a match. A script that fails, runs past `cgi_timeout` or uses more than `cgi_memory`
//! gives `500`, logged with its file and line; the state then serves the next page (a
//! state holding more than half its `cgi_memory` when its last page ends is collected
//! at once).
//!
//! Pages share the worker threads with static files. On Lua 5.4 a page runs in slices
//! of [`SLICE`]: past one, the count hook pauses it (at the next point where it can
//! yield: not inside a `table.sort` comparator or another C function's callback, nor in
//! a coroutine of the page's own) and the instance goes on with it after a yield of its
//! worker, so slow pages do not hold static files up for long; `cgi_timeout` bounds the
//! slices together. LuaJIT pages cannot be paused and run to their end.
//!
//! Each request is an instance of the stage (one page in flight; the server's graph
//! gives it one per place on its states, [`instances`], and the other requests wait in
//! its queue), and the stage's `cgi_states` Lua states ([`States`]) are shared by
//! them: a page starts on the state running the fewest pages (at most `cgi_pages`) and
//! stays there, and a state runs one slice at a time, its pages taking turns (the
//! `turns` submodule): young pages in the order their requests came, pages that have
//! run long behind the others ([`FRESH`]). So a cheap page waits for a slice or so of
//! the long pages on its state, never for their ends: before, a state ran one page to
//! its end, and four clients looping on a one-second page held `hello.lua` at 0.8–5.6
//! requests/s (0 beside sixteen). The pages of one state share its `cgi_memory`; one
//! that runs out of it beside others, or on the garbage of pages that ended, runs
//! again alone.
//!
//! # Lua 5.4 or LuaJIT
//!
//! The crate's `lua54` (default) and `luajit` features pick the Lua that runs pages
//! (one per build: `cargo build -p leda-http --no-default-features --features luajit`;
//! with `CFLAGS=-DLUAJIT_ENABLE_CHECKHOOK` so that compiled pages can be stopped at
//! `cgi_timeout`, see the `timeout` submodule). The stage behaves the same in both;
//! pages see the libraries above and their Lua's own semantics (LuaJIT is Lua 5.1
//! with extensions: numbers are doubles, no `//` operator, no `utf8`).
//! A page is compiled once per state and file version (mtime and length) and then
//! only called, each time with a fresh environment (in 5.4 its argument, which the
//! chunk takes as its `_ENV`: see `ENV_PREFIX`; `setfenv` in LuaJIT, whose pages run
//! one at a time); the collector runs with a larger pause (`GC_PAUSE`).

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use leda_core::prelude::*;
use mlua::{Function, Lua, LuaOptions, MultiValue, StdLib, Table};

use super::{ASYNC_MAXPAR, reply_event, take_conn};
use crate::config::Config;
use crate::error::HttpError;
use crate::path::Root;
use crate::response::{self, Status};

mod pattern;
mod states;
mod timeout;
mod turns;
use states::OnState;
pub use states::States;
use timeout::Timeout;
use turns::{Take, Turn};

/// The collector's pause (percent of the live heap allocated before the next cycle):
/// 400 rather than Lua's 200, as pages allocate much short-lived data (the B.1 page:
/// 30,000 strings); measured with `benches/page.rs`.
const GC_PAUSE: i32 = 400;

/// The Lua libraries a page may use (`require` hands out exactly these).
#[cfg(not(feature = "luajit"))]
const PAGE_LIBS: [&str; 6] = ["string", "table", "math", "utf8", "coroutine", "os"];
/// The Lua libraries a page may use (`require` hands out exactly these).
#[cfg(feature = "luajit")]
const PAGE_LIBS: [&str; 6] = ["string", "table", "math", "bit", "coroutine", "os"];

/// The standard libraries opened in a page state (`os` is reduced afterwards).
#[cfg(not(feature = "luajit"))]
fn std_libs() -> StdLib {
    StdLib::STRING | StdLib::TABLE | StdLib::MATH | StdLib::UTF8 | StdLib::COROUTINE | StdLib::OS
}

/// The standard libraries opened in a page state (`os` is reduced afterwards; the
/// `coroutine` library is part of the base library in Lua 5.1). `jit` is opened
/// because opening it is what turns LuaJIT's compiler on; it is then removed from the
/// pages' view.
#[cfg(feature = "luajit")]
fn std_libs() -> StdLib {
    StdLib::STRING | StdLib::TABLE | StdLib::MATH | StdLib::BIT | StdLib::OS | StdLib::JIT
}

/// A page compiled in a state, valid while its file is unchanged.
struct Compiled {
    mtime: SystemTime,
    len: u64,
    func: Function,
}

/// A Lua state and the pages compiled in it, by path.
pub struct Cgi {
    /// Declared first: dropped (its thread joined) before the Lua.
    timeout: Timeout,
    /// The same deadline for the pattern functions, which no hook reaches.
    patterns: pattern::Deadline,
    lua: Lua,
    cfg: Config,
    /// The root, which pages are opened beneath ([`Root::open`]).
    root: Arc<Root>,
    pages: HashMap<PathBuf, Compiled>,
    /// `{ __index = _G }`, the metatable of every page environment.
    env_meta: Table,
    /// Per library a page sees: the metatable of its read-only view.
    readonly: Vec<(&'static str, Table)>,
    /// `make_load(env)`: the `load` of a page whose environment is `env`.
    make_load: Function,
    /// `make_require(views)`: the `require` of a page, handing out `views` (its
    /// read-only views of the libraries, by name).
    make_require: Function,
    /// Bytes of this state's page bodies not yet sent ([`Cgi::admit`]).
    unsent: Arc<AtomicUsize>,
}

/// A page body counted in its state's `unsent` bytes until dropped (sent, or
/// its connection gone).
struct Unsent {
    body: Bytes,
    unsent: Arc<AtomicUsize>,
}

impl AsRef<[u8]> for Unsent {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        self.unsent.fetch_sub(self.body.len(), Ordering::Relaxed);
    }
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
        let root = Root::of(&cfg.root)?;
        let lua = Lua::new_with(std_libs(), LuaOptions::default())?;
        // Before the sandbox hides `jit`, which it may use.
        let timeout = Timeout::install(&lua)?;
        let g = lua.globals();
        for name in ["dofile", "loadfile", "jit"] {
            g.set(name, mlua::Value::Nil)?;
        }
        let os: Table = g.get("os")?;
        let safe_os = lua.create_table()?;
        for name in ["time", "clock", "date", "difftime"] {
            safe_os.set(name, os.get::<mlua::Value>(name)?)?;
        }
        g.set("os", safe_os)?;
        // `require` is set per request, to that request's read-only views (`Cgi::call`):
        // the state's own library tables are reachable by no page.
        g.set("require", mlua::Value::Nil)?;
        g.set(
            "print",
            lua.create_function(|_, args: MultiValue| {
                tracing::info!(target: "leda_http::cgi", "{}", print_line(&args));
                Ok(())
            })?,
        )?;
        // `load` given a reader function: the reader is called here, as page code under
        // `pcall`, and the text it gave is compiled. Called by `load` in C, a reader
        // that ran past `cgi_timeout` had its error caught there, where LuaJIT leaves
        // its hooks off for good: every later page of the state ran past any deadline.
        let text_of: Function = lua
            .load(
                r#"
                local pcall, type, error, concat = pcall, type, error, table.concat
                local tostring = tostring
                local function read_all(reader)
                  local parts = {}
                  while true do
                    local piece = reader()
                    if piece == nil or piece == "" then return concat(parts) end
                    -- (A number is taken as its text, as `load` does.)
                    if type(piece) == "number" then piece = tostring(piece) end
                    if type(piece) ~= "string" then
                      error("reader function must return a string", 0)
                    end
                    parts[#parts + 1] = piece
                  end
                end
                return function(reader, name)
                  local ok, text = pcall(read_all, reader)
                  if not ok then return nil, text end
                  return text, name == nil and "=(load)" or name
                end
                "#,
            )
            .set_name("=leda-http sandbox")
            .eval()?;
        // A page's `load` gives a chunk the page's environment, not the globals (see
        // `Cgi::call`); made from the original `load` and `setfenv`, before the sandbox
        // below wraps them.
        let make_load = lua
            .load(
                r#"
                local text_of = ...
                local load, setfenv, type = load, setfenv, type
                return function(env)
                  if setfenv then
                    return function(chunk, name, _, e)
                      if type(chunk) == "function" then
                        chunk, name = text_of(chunk, name)
                        if chunk == nil then return nil, name end
                      end
                      local f, why = load(chunk, name, "t")
                      if f then setfenv(f, e == nil and env or e) end
                      return f, why
                    end
                  end
                  return function(chunk, name, _, e)
                    if type(chunk) == "function" then
                      chunk, name = text_of(chunk, name)
                      if chunk == nil then return nil, name end
                    end
                    return load(chunk, name, "t", e == nil and env or e)
                  end
                end
                "#,
            )
            .set_name("=leda-http sandbox")
            .call::<Function>(&text_of)?;
        // Text only: no bytecode in (`load`) or out (`string.dump`); no way to the
        // shared string metatable.
        lua.load(
            r#"
            local text_of = ...
            local load, type = load, type
            _G.load = function(chunk, name, _, env)
              if type(chunk) == "function" then
                chunk, name = text_of(chunk, name)
                if chunk == nil then return nil, name end
              end
              if env == nil then return load(chunk, name, "t") end
              return load(chunk, name, "t", env)
            end
            if loadstring then
              _G.loadstring = function(s, name) return load(s, name, "t") end
            end
            string.dump = nil
            getmetatable("").__metatable = false
            -- The state serves the pages it runs at once, and later ones: a page may
            -- look at the collector and run it, not change how it runs ("stop" lasted
            -- for every later page; review finding).
            local collectgarbage, tostring = collectgarbage, tostring
            local gc_allowed = { collect = true, count = true, step = true, isrunning = true }
            _G.collectgarbage = function(opt, ...)
              if opt == nil then opt = "collect" end
              if not gc_allowed[opt] then
                error("collectgarbage('" .. tostring(opt) .. "') is not allowed in pages", 2)
              end
              return collectgarbage(opt, ...)
            end
            -- No finalizers: no hook runs inside one, so a looping one would escape
            -- cgi_timeout.
            newproxy = nil
            local setmetatable, rawget, type, error = setmetatable, rawget, type, error
            _G.setmetatable = function(t, mt)
              if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
                error("__gc metamethods are not allowed in pages", 2)
              end
              return setmetatable(t, mt)
            end
            -- A message handler runs where no hook stops it (LuaJIT: inside the hook
            -- that raised the error; Lua 5.4: where the page cannot be yielded): run
            -- it after the unwinding instead, as ordinary page code.
            local pcall = pcall
            _G.xpcall = function(f, h, ...)
              local function finish(ok, ...)
                if ok then return true, ... end
                return false, h((...))
              end
              return finish(pcall(f, ...))
            end
            if setfenv then
              -- The thread's environment and every function's that is not a page's
              -- are the real globals: not reachable, not replaceable.
              local getfenv, setfenv, G = getfenv, setfenv, _G
              -- (No tail calls below: they would shift the stack levels.)
              local function env_at(f)
                if type(f) == "number" then
                  if f == 0 then return G end
                  local e = getfenv(f + 2)
                  return e
                end
                local e = getfenv(f)
                return e
              end
              _G.getfenv = function(f)
                local e = env_at(f == nil and 1 or f)
                if e == G then
                  e = getfenv(2)
                  if e == G then error("getfenv cannot reach the globals from here", 2) end
                end
                return e
              end
              _G.setfenv = function(f, t)
                if env_at(f) == G then
                  error("setfenv may change only a page's own functions", 2)
                end
                if type(f) == "number" then f = f + 1 end
                local r = setfenv(f, t)
                return r
              end
            end
            "#,
        )
        .set_name("=leda-http sandbox")
        .call::<()>(&text_of)?;
        #[cfg(not(feature = "luajit"))]
        bound_c_loops(&lua)?;
        let make_require = lua
            .load(
                r#"
                local error, tostring = error, tostring
                return function(views)
                  return function(name)
                    local v = views[name]
                    if v == nil then
                      error("module '" .. tostring(name) ..
                        "' not found (pages may require only standard libraries)", 2)
                    end
                    return v
                  end
                end
                "#,
            )
            .set_name("=leda-http sandbox")
            .eval::<Function>()?;
        let patterns = pattern::Deadline::default();
        pattern::install(&lua, &g.get::<Table>("string")?, &patterns, cfg.cgi_memory)?;
        lua.set_memory_limit(cfg.cgi_memory)?;
        lua.gc_set_pause(GC_PAUSE);
        // Read-only views of the libraries, made afresh for each request: nothing a
        // page writes (`string.x = 1`, even with `rawset`) is seen by the next.
        let mut readonly = Vec::new();
        for name in PAGE_LIBS {
            let meta = lua.create_table()?;
            meta.set("__index", g.get::<mlua::Value>(name)?)?;
            meta.set(
                "__newindex",
                lua.create_function(|_, _: MultiValue| -> mlua::Result<()> {
                    Err(mlua::Error::runtime(
                        "library tables are read-only in pages",
                    ))
                })?,
            )?;
            meta.set("__metatable", false)?;
            readonly.push((name, meta));
        }
        // Lua 5.4 keeps a hook per thread: a page's own coroutines get it too.
        #[cfg(not(feature = "luajit"))]
        timeout.hook_coroutines(&lua, &g.get::<Table>("coroutine")?)?;
        let env_meta = lua.create_table()?;
        env_meta.set("__index", g)?;
        env_meta.set("__metatable", false)?;
        Ok(Cgi {
            timeout,
            patterns,
            lua,
            cfg,
            root,
            pages: HashMap::new(),
            env_meta,
            readonly,
            make_load,
            make_require,
            unsent: Arc::default(),
        })
    }

    /// Runs the page at `script` (a canonical path under the root) to its end, through
    /// every slice (see [`Cgi::start`]).
    pub fn run(&mut self, script: &Path, req: &PageRequest) -> Result<Page, String> {
        let mut step = self.start(script, req);
        loop {
            match step {
                Step::Done(page) => {
                    self.reclaim();
                    return page;
                }
                Step::Paused(p) => step = self.go_on(p),
            }
        }
    }

    /// Starts the page at `script` (a canonical path under the root): it runs to its
    /// end, or (Lua 5.4) for a slice of [`SLICE`] of its `cgi_timeout`, after which
    /// [`Cgi::go_on`] runs it further. Other pages may start and go on meanwhile.
    pub fn start(&mut self, script: &Path, req: &PageRequest) -> Step {
        let shown = script
            .strip_prefix(self.root.path())
            .unwrap_or(script)
            .display()
            .to_string();
        let func = match self.compiled(script, &shown) {
            Ok(func) => func,
            Err(e) => return Step::Done(Err(first_line(&e, &shown))),
        };
        let env = match self.prepare(req) {
            Ok(env) => env,
            Err(e) => return Step::Done(Err(first_line(&e.to_string(), &shown))),
        };
        self.first_slice(func, env, shown)
    }

    /// Runs a paused page for its next slice.
    pub fn go_on(&mut self, mut p: Paused) -> Step {
        let start = Instant::now();
        let cpu = crate::sys::thread_cpu_time();
        let at = start + p.left;
        self.timeout.arm(at, Some(start + SLICE));
        self.patterns.arm(at);
        let env = p.env.take();
        let out = self
            .timeout
            .resume(&self.lua, &p.th, env, SLICE.min(p.left));
        let timeout::Ended { sliced, expired } = self.timeout.disarm();
        self.patterns.disarm();
        let resumable = p.th.status() == mlua::ThreadStatus::Resumable;
        if out.is_ok() && resumable && sliced && !expired {
            return Step::Paused(Paused {
                left: p.left.saturating_sub(start.elapsed()),
                ran: p.ran + crate::sys::thread_cpu_time().saturating_sub(cpu),
                ..p
            });
        }
        let page = out.and_then(|out| {
            if resumable || expired {
                // Past the deadline also when it ended anyway: the hook may have
                // yielded a coroutine of the page's own, which the page then got
                // back from.
                return Err(mlua::Error::runtime(if expired {
                    format!("{}: script ran past cgi_timeout", p.shown)
                } else {
                    format!("{}: a page may not yield", p.shown)
                }));
            }
            page_of(out, &p.shown)
        });
        Step::Done(self.end(page, &p.shown))
    }

    /// After a page: an error is cut to its first line.
    fn end(&self, page: mlua::Result<Page>, shown: &str) -> Result<Page, String> {
        page.map_err(|e| first_line(&e.to_string(), shown))
    }

    /// `body`, counted among this state's unsent bodies until dropped; `None` when
    /// those already hold `cgi_memory` bytes with it (a page alone always goes; no
    /// bound when `cgi_memory` is 0). A client that does not read holds its page's body
    /// for up to `send_timeout`: without this bound, 16 such clients held 1.9 GB of
    /// 100 MB pages, and it grew with the connections (review finding, 2026-11-27).
    /// Each state holds up to `cgi_memory` too, so pages cost at most twice that per
    /// state.
    pub fn admit(&self, body: Bytes) -> Option<Bytes> {
        let len = body.len();
        let before = self.unsent.fetch_add(len, Ordering::Relaxed);
        let limit = self.cfg.cgi_memory;
        if limit > 0 && before > 0 && before + len > limit {
            self.unsent.fetch_sub(len, Ordering::Relaxed);
            return None;
        }
        Some(Bytes::from_owner(Unsent {
            body,
            unsent: self.unsent.clone(),
        }))
    }

    /// Collects at once when the state holds more than half its `cgi_memory`: LuaJIT
    /// does not collect when an allocation fails, and a page that ran into the limit
    /// left the collector's next cycle beyond it, failing every later page. The limit
    /// is lifted meanwhile (a collection allocates). Called when a state's last page
    /// ends: after every page, with pages holding memory beside it, it took 63 % of the
    /// server's CPU (review finding). Also called before a page that starts alone on
    /// the state (in `OnState::play`). `true` if it collected.
    pub fn reclaim(&self) -> bool {
        let limit = self.cfg.cgi_memory;
        if limit == 0 || self.lua.used_memory() <= limit / 2 {
            return false;
        }
        let _ = self.lua.set_memory_limit(0);
        let _ = self.lua.gc_collect();
        let _ = self.lua.set_memory_limit(limit);
        true
    }

    /// The compiled page at `script`, compiled again when the file changed.
    /// The file is opened beneath the root through no symlink (see [`Root::open`]).
    fn compiled(&mut self, script: &Path, shown: &str) -> Result<Function, String> {
        let mut file = self.root.open(script).map_err(|e| e.to_string())?;
        let meta = file.metadata().map_err(|e| e.to_string())?;
        let mtime = meta.modified().map_err(|e| e.to_string())?;
        if let Some(c) = self.pages.get(script)
            && c.mtime == mtime
            && c.len == meta.len()
        {
            return Ok(c.func.clone());
        }
        let mut src = Vec::with_capacity(ENV_PREFIX.len() + meta.len() as usize);
        src.extend_from_slice(ENV_PREFIX);
        file.read_to_end(&mut src).map_err(|e| e.to_string())?;
        let len = (src.len() - ENV_PREFIX.len()) as u64;
        let func = self
            .lua
            .load(&src[..])
            .set_name(format!("@{shown}"))
            .set_mode(mlua::ChunkMode::Text)
            .into_function()
            .map_err(|e| e.to_string())?;
        self.pages.insert(
            script.to_path_buf(),
            Compiled {
                mtime,
                len,
                func: func.clone(),
            },
        );
        Ok(func)
    }

    /// A fresh environment for a page serving the request `req`.
    fn prepare(&self, req: &PageRequest) -> mlua::Result<Table> {
        let lua = &self.lua;
        let env = lua.create_table()?;
        env.set_metatable(Some(self.env_meta.clone()))?;
        env.set("_G", &env)?;
        let views = lua.create_table()?;
        for (name, meta) in &self.readonly {
            let view = lua.create_table()?;
            view.set_metatable(Some(meta.clone()))?;
            env.set(*name, &view)?;
            views.set(*name, view)?;
        }
        env.set("require", self.make_require.call::<Function>(views)?)?;
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
        let load: Function = self.make_load.call(&env)?;
        #[cfg(feature = "luajit")]
        env.set("loadstring", load.clone())?;
        env.set("load", load)?;
        Ok(env)
    }
}

/// What a page's text is compiled after, on the same line (Lua 5.4): the chunk takes
/// its environment as its argument, so that pages paused on one state, running the
/// same compiled chunk, each have their own. (Setting the chunk's `_ENV` upvalue, as
/// before, gave every page running it the last one set.) No text after it can end the
/// local's scope, which is the whole chunk; a page's `...` holds its environment.
#[cfg(not(feature = "luajit"))]
const ENV_PREFIX: &[u8] = b"local _ENV = ...; ";
/// LuaJIT pages run one at a time, each with `setfenv` on the compiled chunk.
#[cfg(feature = "luajit")]
const ENV_PREFIX: &[u8] = b"";

/// The page a page's return values make: its body, and its content type or the default.
fn page_of(out: MultiValue, shown: &str) -> mlua::Result<Page> {
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
    // It becomes a header line: a CR or LF in it (from request data a page echoes)
    // would let a client write headers, or a whole second response, of its own.
    if content_type
        .bytes()
        .any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)
    {
        return Err(mlua::Error::runtime(format!(
            "{shown}: the content type holds a control character"
        )));
    }
    Ok(Page { body, content_type })
}

impl Cgi {
    /// Runs the page in a coroutine of its own for its first slice, with `env`: past
    /// `cgi_timeout` the count hook yields it, which no `pcall` in the page can catch,
    /// and it is dropped; past the slice the hook yields it too, and it is paused.
    #[cfg(not(feature = "luajit"))]
    fn first_slice(&mut self, func: Function, env: Table, shown: String) -> Step {
        let th = match self.lua.create_thread(func) {
            Ok(th) => th,
            Err(e) => return Step::Done(self.end(Err(e), &shown)),
        };
        if let Err(e) = self.timeout.on_thread(&th) {
            return Step::Done(self.end(Err(e), &shown));
        }
        self.go_on(Paused {
            th,
            env: Some(env),
            shown,
            ran: Duration::ZERO,
            left: self.cfg.cgi_timeout,
        })
    }

    /// Calls the page to its end: the watchdog's hook raises an error that stays set
    /// until disarmed, so no coroutine is needed, and one costs: the B.1 page took
    /// 17–20 % more CPU in a fresh coroutine per request (`benches/page.rs`). A page
    /// that yields gets LuaJIT's "attempt to yield across C-call boundary" (which it
    /// may catch with `pcall`, and go on). No hook may yield a LuaJIT page, so it is
    /// never paused.
    #[cfg(feature = "luajit")]
    fn first_slice(&mut self, func: Function, env: Table, shown: String) -> Step {
        if let Err(e) = func.set_environment(env) {
            return Step::Done(self.end(Err(e), &shown));
        }
        let at = Instant::now() + self.cfg.cgi_timeout;
        self.timeout.arm(at, None);
        self.patterns.arm(at);
        let out = func.call::<MultiValue>(());
        self.timeout.disarm();
        self.patterns.disarm();
        Step::Done(self.end(out.and_then(|out| page_of(out, &shown)), &shown))
    }
}

/// How long a page runs (Lua 5.4) before it lets the other work on its worker go
/// first: static files are served by the same workers, and while as many slow pages
/// ran as there are workers they waited, up to `cgi_timeout` (review finding,
/// 2026-11-27). A page's time slices together are what `cgi_timeout` bounds.
pub const SLICE: Duration = Duration::from_millis(10);

/// What running a page for a slice gave.
pub enum Step {
    /// The page ended: its output, or its error (first line).
    Done(Result<Page, String>),
    /// The page ran its slice and is paused: [`Cgi::go_on`] runs it further.
    Paused(Paused),
}

/// A page paused at the end of a slice (Lua 5.4; LuaJIT pages run to their end), to
/// go on in the state that started it.
pub struct Paused {
    th: mlua::Thread,
    /// The page's environment, until its first resume passes it.
    env: Option<Table>,
    shown: String,
    /// The CPU time of its slices so far (not their time on the clock, which a busy
    /// host stretches: B.1 pages taken for long ones went behind the others).
    ran: Duration,
    /// What is left of its `cgi_timeout`.
    left: Duration,
}

impl Paused {
    /// The CPU time of its slices so far.
    pub fn ran(&self) -> Duration {
        self.ran
    }
}

/// How long (CPU time) a page keeps its place among its state's pages (when its
/// request came): a page that has run less goes on before the pages that came after
/// it. So pages of about the same cost end in the order they came, as when a state ran
/// one page to its end (with every page taking turns in the order they asked, the B.1
/// page at 50 connections had its p99 latency up from 0.21–0.25 to 0.72–0.76 s). A
/// page that has run more goes, at each turn, behind the pages waiting and those that
/// come within as long as it has run (at most [`BEHIND_MAX`]): cheap pages go before
/// long ones (with long pages only behind those waiting, `hello.lua` beside sixteen
/// clients looping on a one-second page waited 88 ms, eight slices of them), and a
/// long page still gets a turn at least every `BEHIND_MAX` and what came before.
pub const FRESH: Duration = Duration::from_millis(50);

/// The most a long page lets later pages go first ([`FRESH`]).
pub const BEHIND_MAX: Duration = Duration::from_secs(1);

/// Where a page that has run `ran` of slices, whose request came at `came`, asks for
/// its next turn ([`FRESH`]).
fn turn_key(ran: Duration, came: Instant) -> Instant {
    if ran < FRESH {
        came
    } else {
        Instant::now() + ran.min(BEHIND_MAX)
    }
}

/// The most of a page's `print` line that reaches the log, in bytes.
const PRINT_MAX: usize = 4096;

/// A page's `print(...)` as one log line: the values' texts joined by tabs, cut at
/// [`PRINT_MAX`] bytes (a page printing a 100 MB string wrote all of it, and held two
/// copies, per request), control characters escaped (no forged log lines).
fn print_line(args: &MultiValue) -> String {
    let mut line = String::new();
    for (i, v) in args.iter().enumerate() {
        if line.len() >= PRINT_MAX {
            break;
        }
        if i > 0 {
            line.push('\t');
        }
        let text = match v {
            mlua::Value::String(s) => {
                let b = s.as_bytes();
                String::from_utf8_lossy(&b[..b.len().min(PRINT_MAX)]).into_owned()
            }
            v => v.to_string().unwrap_or_default(),
        };
        for c in text.chars() {
            if line.len() >= PRINT_MAX {
                break;
            }
            if c.is_control() {
                line.extend(c.escape_default());
            } else {
                line.push(c);
            }
        }
    }
    if line.len() >= PRINT_MAX {
        line.push_str(" [cut]");
    }
    line
}

/// The first line of a Lua error ("file:line: message"; a traceback may follow),
/// prefixed with the page's name when it does not carry it.
fn first_line(text: &str, shown: &str) -> String {
    let first = text.lines().next().unwrap_or_default();
    if first.contains(shown) {
        first.to_owned()
    } else {
        format!("{shown}: {first}")
    }
}

/// Lua 5.4's C functions whose loops an integer bounds, not the memory they use, so
/// that no hook (and no `cgi_memory`) stops them: `string.rep("", n)` copies nothing n
/// times, `table.move` moves n nils, `table.concat` reads a range through an `__index`
/// that may be a C function, and `table.insert(t, pos, v)`, `table.remove` and
/// `table.sort` walk a length that a `__len` metamethod may make up. Each took minutes
/// to centuries for one call, on a worker thread. Pages get a `rep` that returns at
/// once, a `move` in pieces between which the count hook runs, a `concat` that reads a
/// range beyond the table's own values in Lua, and no `__len` (see the chunk). (LuaJIT's
/// own are safe: its `rep` of an empty string does not loop, its table functions take
/// the raw length, its `concat` reads raw, and it has no `table.move`.)
#[cfg(not(feature = "luajit"))]
fn bound_c_loops(lua: &Lua) -> mlua::Result<()> {
    lua.load(
        r##"
        local rep, move, concat = string.rep, table.move, table.concat
        local type, rawlen, error, tointeger = type, rawlen, error, math.tointeger
        local maxinteger = math.maxinteger
        local CHUNK = 4096

        string.rep = function(s, n, sep)
          if s == "" and (sep == nil or sep == "") and tointeger(n) then
            return ""
          end
          return rep(s, n, sep)
        end

        -- A range too long for one call (the arguments are valid, as `move`'s own
        -- checks say) is moved in pieces, in the order `move` would have used.
        table.move = function(a1, f, e, t, a2)
          local fi, ei, ti = tointeger(f), tointeger(e), tointeger(t)
          if not (fi and ei and ti) or ei < fi or not (fi > 0 or ei < maxinteger + fi)
              or ei - fi < CHUNK then
            return move(a1, f, e, t, a2)
          end
          local n = ei - fi + 1
          if ti > maxinteger - n + 1 then return move(a1, f, e, t, a2) end
          local dst = a2 == nil and a1 or a2
          if ti > ei or ti <= fi or dst ~= a1 then
            local lo = fi
            while lo <= ei do
              local hi = lo + CHUNK - 1
              if hi > ei then hi = ei end
              move(a1, lo, hi, ti + (lo - fi), dst)
              lo = hi + 1
            end
          else
            local hi = ei
            while hi >= fi do
              local lo = hi - CHUNK + 1
              if lo < fi then lo = fi end
              move(a1, lo, hi, ti + (lo - fi), dst)
              hi = lo - 1
            end
          end
          return dst
        end

        -- No `__len` in pages' metatables, and a metatable is copied when it is set
        -- (the page's own table stays what `getmetatable` gives), so that none can be
        -- added later: Lua's table functions walk `#t`, and a made-up length, read
        -- through an `__index` or `__newindex` that is a C function (which runs no
        -- Lua, so no hook), kept them in C for ever (review findings: wrappers that
        -- walked in Lua instead made every `table.insert` of the B.1 page cost a Lua
        -- call, +55 % per page). Without `__len` they walk a table's own length, which
        -- its memory bounds. `table.concat` takes an explicit range too: a range
        -- beyond the table's own values is read here, in Lua.
        local setmetatable, rawget, next = setmetatable, rawget, next
        _G.setmetatable = function(t, mt)
          -- (`setmetatable` here is the sandbox's, which refuses `__gc`: called in a
          -- tail call, its error names the page's line.)
          if type(mt) == "table" then
            if rawget(mt, "__len") ~= nil then
              error("__len metamethods are not allowed in pages", 2)
            end
            local copy = {}
            for k, v in next, mt do copy[k] = v end
            if copy.__metatable == nil then copy.__metatable = mt end
            mt = copy
          end
          return setmetatable(t, mt)
        end

        local format = string.format
        table.concat = function(t, sep, i, j)
          if type(t) ~= "table" then return concat(t, sep, i, j) end
          local ii = tointeger(i == nil and 1 or i)
          local jj = tointeger(j == nil and #t or j)
          if ii == nil or jj == nil or ii > jj or (ii >= 1 and jj <= rawlen(t)) then
            return concat(t, sep, i, j)
          end
          local parts, k = {}, ii
          while true do
            local v = t[k]
            local tv = type(v)
            if tv ~= "string" and tv ~= "number" then
              error(format("invalid value (at index %d) in table for 'concat'", k), 2)
            end
            parts[#parts + 1] = v
            if k == jj then return concat(parts, sep) end
            k = k + 1
          end
        end
        "##,
    )
    .set_name("=leda-http sandbox")
    .exec()
}

/// The response to a page's outcome: its head and body.
fn respond(
    cgi: &Cgi,
    page: Result<Page, String>,
    script: &str,
    keep_alive: bool,
) -> (Bytes, Bytes) {
    match page {
        Ok(page) => match cgi.admit(page.body) {
            Some(body) => {
                let head = response::head(
                    Status::OK,
                    Some(&page.content_type),
                    body.len() as u64,
                    None,
                    keep_alive,
                    &[("Cache-Control", "no-store")],
                );
                (head, body)
            }
            None => {
                tracing::warn!(
                    target: "leda_http::cgi",
                    "{script}: 503, earlier pages not yet sent hold cgi_memory"
                );
                response::error(&HttpError::Unavailable, keep_alive)
            }
        },
        Err(msg) => {
            tracing::error!(target: "leda_http::cgi", "script error: {msg}");
            response::error(&HttpError::Internal, keep_alive)
        }
    }
}

impl OnState {
    /// Runs `slice` of the page for `req` on the state in `turn` (the state is made
    /// here if it is not yet): the response, or the page to go on with at its next turn
    /// ([`FRESH`]: `came` is when its request came). A page that ran out of memory
    /// beside other pages of its state is run again alone, once (`retried`): pages
    /// have no effects but their output, and the memory may have been the others'.
    #[allow(clippy::too_many_arguments)]
    fn play(
        &self,
        turn: Turn,
        slice: Slice,
        req: &PageRequest,
        came: Instant,
        retried: bool,
        script: &str,
        keep_alive: bool,
    ) -> Next {
        let mut state = self.slot().cgi();
        let cgi = match &mut *state {
            Some(cgi) => cgi,
            none => match Cgi::new(self.states.cfg.clone()) {
                Ok(made) => none.insert(made),
                Err(e) => {
                    tracing::error!(target: "leda_http::cgi", "{script}: no Lua state: {e}");
                    return Next::Reply(response::error(&HttpError::Internal, keep_alive));
                }
            },
        };
        let step = match slice {
            Slice::Start => {
                // Alone on its state, a page starts on a collected state when the
                // garbage of ended pages holds more than half of it: Lua 5.4 does not
                // collect when its string buffers fail to grow (`lauxlib.c`'s
                // `resizebox`), and the last page before it may have ended with this
                // one counted beside it, leaving the state uncollected.
                if self.states.pages_on(self.i) == 1 {
                    cgi.reclaim();
                }
                cgi.start(Path::new(script), req)
            }
            Slice::GoOn(p) => cgi.go_on(p),
        };
        match step {
            Step::Done(page) => {
                let beside = self.states.pages_on(self.i) - 1;
                // (LuaJIT pages run one at a time, to their end: the pages beside have
                // not started, and hold no memory.)
                let luajit = cfg!(feature = "luajit");
                let collected = (beside == 0 || luajit) && cgi.reclaim();
                // Out of memory beside other pages, or alone on a state that held the
                // garbage of ended pages (collected just now): the memory may have been
                // theirs. (A page that ended after this one started could still be
                // counted when it started, and leave the state uncollected: review
                // finding.)
                match page {
                    Err(e)
                        if (beside > 0 || collected)
                            && !luajit
                            && !retried
                            && e.contains("not enough memory") =>
                    {
                        let why = if beside > 0 {
                            format!("beside {beside} other pages of its Lua state")
                        } else {
                            "on a Lua state that held ended pages' garbage".to_owned()
                        };
                        tracing::info!(target: "leda_http::cgi", "{e}: {why}; it runs again alone");
                        Next::Alone
                    }
                    page => Next::Reply(respond(cgi, page, script, keep_alive)),
                }
            }
            Step::Paused(p) => {
                drop(state);
                let key = turn_key(p.ran(), came);
                Next::Paused(p, turn.again(key))
            }
        }
    }
}

/// A page's next slice.
enum Slice {
    Start,
    GoOn(Paused),
}

/// What a slice left to do.
enum Next {
    /// Send this head and body.
    Reply((Bytes, Bytes)),
    /// Go on with the page, after a yield of the worker, at this turn.
    Paused(Paused, Take),
    /// Start the page at this turn.
    Start(Take),
    /// Start the page again on a state with no other page.
    Alone,
}

/// The `cgi` stage. Input: `(script, keep_alive, head_only, method, path, query,
/// headers)` + conn. Output: `reply` (a `send_buffer` event).
///
/// Each event gets an instance of its own (up to [`ASYNC_MAXPAR`]; the server's graph,
/// [`crate::graph::build`], bounds it to [`instances`] of its configuration: the
/// stage's attributes, which can come from a Lua script, are read only once it
/// runs) and its page a
/// state of the stage's [`States`]. When that state is free the first slice runs in
/// the handler call; otherwise, and for a page that is paused ([`Step::Paused`]), the
/// instance's wait takes a turn on the state for each slice, after a yield of its
/// worker (`nice`) between two.
pub fn stage() -> Stage {
    let states: Arc<OnceLock<Arc<States>>> = Arc::default();
    Stage::stateful(
        "cgi",
        move |attrs: &Attrs| {
            let cfg = Config::from_attrs(attrs)?;
            Ok(states.get_or_init(|| Arc::new(States::new(cfg))).clone())
        },
        |states: &mut Arc<States>, mut ev: Event, ctx: &mut Ctx| {
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
            let came = Instant::now();
            // Its first slice in this call when a state has room and its turn is free.
            let first = |on: OnState, req: &PageRequest| {
                let turns = &on.slot().turns;
                let next = match turns.try_take(came) {
                    Some(turn) => {
                        on.play(turn, Slice::Start, req, came, false, &script, keep_alive)
                    }
                    None => Next::Start(turns.take(came)),
                };
                (on, next)
            };
            let started = states.admit_or_queue().map(|on| first(on, &req));
            let states = states.clone();
            let mut out = ctx.clone();
            // Let send_buffer write this page before the next one is computed: with
            // every worker busy on pages, responses would otherwise wait for the whole
            // backlog (`nice` re-queues this instance behind the other ready work).
            ctx.wait(async move {
                let (mut on, mut next) = match started {
                    Ok(started) => started,
                    Err(admit) => {
                        let on = admit.await;
                        let take = on.slot().turns.take(came);
                        (on, Next::Start(take))
                    }
                };
                let mut retried = false;
                let (head, body) = loop {
                    let (slice, mut take) = match next {
                        Next::Reply(reply) => break reply,
                        Next::Start(take) => (Slice::Start, take),
                        Next::Paused(p, take) => (Slice::GoOn(p), take),
                        Next::Alone => {
                            let alone = states.admit_alone();
                            drop(on);
                            on = alone.await;
                            retried = true;
                            (Slice::Start, on.slot().turns.take(came))
                        }
                    };
                    // Behind the sockets before each slice, and again after a wait for
                    // the turn: woken by its handing over, the instance would run
                    // ahead of them (its worker's own queue), and pages passing the
                    // turn to one another kept static files waiting a second.
                    let turn = loop {
                        out.nice().await;
                        if let Some(turn) = take.try_now() {
                            break turn;
                        }
                        take.ready().await;
                    };
                    // A client that left gets no page: its slices stop here (review
                    // finding: four clients that left after 0.3 s cost 6.8 s of CPU).
                    // The connection closes with `conn`.
                    if crate::sys::peer_gone(conn.stream.as_fd()) {
                        tracing::info!(
                            target: "leda_http::cgi",
                            "{script}: the client left; the page is dropped"
                        );
                        // Its Lua values go while the state is still this page's (mlua
                        // takes the state's lock to drop them: after the turn, that
                        // waited for another page's slice; review finding).
                        drop(slice);
                        drop(turn);
                        return Ok(());
                    }
                    next = on.play(turn, slice, &req, came, retried, &script, keep_alive);
                };
                drop(on);
                let ev = reply_event(conn, head, body, keep_alive, head_only);
                out.send_wait("reply", ev).await?;
                out.nice().await;
                Ok(())
            });
            Ok(())
        },
    )
    .maxpar(ASYNC_MAXPAR)
}

/// The `cgi` stage's instances for `cfg`: one per page its states run at once. Each
/// request is an instance (a task) of its own only while there is room for its page:
/// the rest wait in the stage's queue, in the order they came. With an instance per
/// request (as many as connections), each waited as a task of its own, and the pool's
/// last-in first-out queues let the oldest wait longest (the B.1 page at 50
/// connections: p99 274–503 ms against 241–302 before pages shared states; 172–209
/// ms against 263–288 with this bound; Intel Xeon VM, 2026-11-27).
pub fn instances(cfg: &Config) -> usize {
    states::count(cfg).saturating_mul(cfg.cgi_pages.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A young page keeps the place its request came at; a page past `FRESH` asks
    /// behind what comes within as long as it ran, at most `BEHIND_MAX`.
    #[test]
    fn young_pages_keep_their_place_and_long_ones_go_behind() {
        let came = Instant::now() - Duration::from_secs(5);
        assert_eq!(turn_key(Duration::ZERO, came), came);
        assert_eq!(turn_key(FRESH - Duration::from_millis(1), came), came);
        let t = Instant::now();
        let k = turn_key(Duration::from_millis(300), came);
        assert!(k >= t + Duration::from_millis(300), "{:?}", k - t);
        assert!(k <= Instant::now() + Duration::from_millis(300));
        let k = turn_key(Duration::from_secs(9), came);
        assert!(k <= Instant::now() + BEHIND_MAX && k >= t + BEHIND_MAX);
    }

    /// A root with `garbage.lua` (18 MB in 1 MB strings, all garbage once it ends) and
    /// `big.lua` (`before`, then a 15 MB `string.rep`, whose buffer fits beside that
    /// garbage only once it is collected), and one state of 32 MB for them.
    #[cfg(not(feature = "luajit"))]
    fn garbage_and_big(before: &str) -> (tempfile::TempDir, PathBuf, Arc<States>) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let mb = 1024 * 1024;
        std::fs::write(
            root.join("garbage.lua"),
            format!(
                "local t = {{}} for i = 1, 18 do t[i] = string.rep('g', {mb}) end return 'left ' .. #t"
            ),
        )
        .unwrap();
        std::fs::write(
            root.join("big.lua"),
            format!("{before} return 'big ' .. #string.rep('b', {})", 15 * mb),
        )
        .unwrap();
        let cfg = Config {
            root: root.clone(),
            cgi_states: 1,
            cgi_memory: 32 * mb,
            ..Config::default()
        };
        (dir, root, Arc::new(States::new(cfg)))
    }

    /// Runs the page at `script` on `on` from its start to its first outcome other
    /// than a pause, calling `paused` after each slice.
    #[cfg(not(feature = "luajit"))]
    fn run_page(on: &OnState, script: &Path, mut paused: impl FnMut()) -> Next {
        let script = script.to_str().unwrap();
        let (req, now) = (PageRequest::default(), Instant::now());
        let mut turn = on.slot().turns.try_take(now).unwrap();
        let mut slice = Slice::Start;
        loop {
            match on.play(turn, slice, &req, now, false, script, false) {
                Next::Paused(p, mut take) => {
                    paused();
                    turn = take.try_now().expect("no other page takes turns");
                    slice = Slice::GoOn(p);
                }
                next => return next,
            }
        }
    }

    /// The head and body of a page's response.
    #[cfg(not(feature = "luajit"))]
    fn reply(next: Next) -> (String, Bytes) {
        match next {
            Next::Reply((head, body)) => (String::from_utf8_lossy(&head).into_owned(), body),
            Next::Alone => panic!("ran out of memory beside another page"),
            Next::Paused(..) | Next::Start(_) => unreachable!("run_page runs to an outcome"),
        }
    }

    /// A page that starts alone on a state full of another page's garbage starts on a
    /// collected state: Lua 5.4 collects when an allocation fails, but not for the
    /// buffers of its string functions (`lauxlib.c`'s `resizebox`), so `string.rep`
    /// failed with "not enough memory" on a state that had room. The state was not
    /// collected when the other page ended, because this one was counted beside it
    /// then. (With the stage's instances bounded, one page in 24 of
    /// `pages_in_flight_together_do_not_run_out_of_memory` got a 500 this way in about
    /// one run of four.)
    #[cfg(not(feature = "luajit"))]
    #[test]
    fn a_page_alone_on_a_state_full_of_garbage_starts_on_a_collected_state() {
        let (_dir, root, states) = garbage_and_big("");
        let (big, garbage) = (states.try_admit().unwrap(), states.try_admit().unwrap());
        let (head, body) = reply(run_page(&garbage, &root.join("garbage.lua"), || {}));
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(&body[..], b"left 18");
        drop(garbage);
        let (head, body) = reply(run_page(&big, &root.join("big.lua"), || {}));
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(&body[..], b"big 15728640");
    }

    /// A page that was not alone when it started, and runs out of memory once the page
    /// beside it has ended, on a state full of that page's garbage, runs again alone
    /// (review finding: it got a 500, the state being collected only after it).
    #[cfg(not(feature = "luajit"))]
    #[test]
    fn a_page_failing_on_the_garbage_of_a_page_that_ended_beside_it_runs_again() {
        // First a slice of computing, then the allocation.
        let (_dir, root, states) =
            garbage_and_big("local t0 = os.clock() while os.clock() - t0 < 0.05 do end");
        let (big, garbage) = (states.try_admit().unwrap(), states.try_admit().unwrap());
        let (head, body) = reply(run_page(&garbage, &root.join("garbage.lua"), || {}));
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(&body[..], b"left 18");
        // `big` starts beside `garbage` (still counted), which ends during its run.
        let mut garbage = Some(garbage);
        let next = run_page(&big, &root.join("big.lua"), || drop(garbage.take()));
        assert!(garbage.is_none(), "big.lua ended in its first slice");
        match next {
            Next::Alone => {}
            Next::Reply((head, _)) => panic!("{}", String::from_utf8_lossy(&head)),
            _ => unreachable!(),
        }
    }

    /// A page's `print` is one log line, cut at `PRINT_MAX`, control characters escaped
    /// (review finding: a page printed 200 MB lines, and could forge lines).
    #[test]
    fn print_lines_are_cut_and_escaped() {
        let lua = Lua::new();
        let big = lua.create_string("x".repeat(1 << 20)).unwrap();
        let forged = lua
            .create_string("ok\nINFO leda_http: forged line\r")
            .unwrap();
        let args = MultiValue::from_iter([
            mlua::Value::String(forged),
            mlua::Value::Integer(7),
            mlua::Value::String(big),
        ]);
        let line = print_line(&args);
        assert!(
            line.starts_with("ok\\nINFO leda_http: forged line\\r\t7\txxx"),
            "{line}"
        );
        assert!(!line.contains('\n') && !line.contains('\r'));
        assert!(
            line.len() <= PRINT_MAX + 8 && line.ends_with(" [cut]"),
            "{}",
            line.len()
        );
        let short = MultiValue::from_iter([mlua::Value::Boolean(true), mlua::Value::Nil]);
        assert_eq!(print_line(&short), "true\tnil");
    }
}
