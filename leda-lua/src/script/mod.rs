//! The configuring side: a script runs in a "configuring" Lua state (all standard
//! libraries) where `require 'leda'` gives the thesis' graph API:
//!
//! * `leda.stage{handler=, init=, bind=, serial=, fail_stop=, nonblocking=, autostart=, name=,
//!   <attributes>}`,
//!   `leda.stage "name" {...}`, `leda.stage "name" (stage)` (clone), `leda.stage(f)`;
//! * `stage:connect([port,] dest [, type])`, `leda.connect(src, [port,] dest [, type])`,
//!   `s1 .. s2`; `stage:push(...)` (`stage:send`), `stage:run{...}`;
//! * `leda.graph{...}` / `leda.graph "name" {...}`, `graph:add`, `graph:all`,
//!   `graph:part`, `graph:map`, `graph:run{controller=, maxpar=, host=, port=,
//!   until_idle=, timeout=, on_process_loss=, notify=}`, `graph:verify`, `graph:dot`;
//! * `leda.cluster(...)` with `+`, `-`, `*`;
//! * controllers: `require 'leda.controller.thread_pool'.get(n)`,
//!   `require 'leda.controller.auto'.get(min, max)`;
//! * `leda.start{controller=, host=, port=}`: this process becomes a daemon that runs
//!   the cluster a launching script deploys to it (see [`crate::remote`]).
//!
//! Stage attributes set after the stage is built (`matcher.pattern = arg[1]`) are
//! seen by instances: attributes are read when the run starts.
//!
//! This module owns the configuring state ([`Script`], its options, `require 'leda'`);
//! `ctor` the stage and graph constructors, `objects` the userdata a script holds,
//! `run` running graphs and daemons.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use leda_core::prelude::*;
use mlua::{Lua, LuaOptions, MultiValue, StdLib, Table, Variadic};

use crate::error::ScriptError;
use crate::instance::unpack;

mod ctor;
mod objects;
mod run;

use ctor::{graph_ctor, stage_ctor};
pub use objects::{LuaCluster, LuaConnector, LuaController, LuaGraph, LuaStage};
use objects::{add_to_graph, as_stage, connector, graph_of, to_cluster};
use run::{controller_module, run_graph, start};

/// What `graph:run` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Run the graph.
    Run,
    /// Verify the graph (`bind`, partition, mapping) and record it, without running.
    Check,
}

/// Options of a configuring script.
#[derive(Debug, Clone)]
pub struct ScriptOptions {
    /// What `graph:run` does.
    pub mode: Mode,
    /// Default of `graph:run{until_idle=...}`: end the run when nothing is left to do
    /// (across every process of a mapped graph).
    pub until_idle: bool,
    /// Default worker threads when the script names no controller.
    pub threads: Option<usize>,
    /// This process's address in a graph's mapping (`leda run --process`); default:
    /// `graph:run{host=, port=}`, else the one mapped address where no daemon answers.
    pub process: Option<String>,
    /// Address rewrites applied to `graph:map`, `leda.start` and `process`
    /// (`leda run --map FROM=TO`): run a listing's `"host1:port1"` on a real address.
    pub aliases: Vec<(String, String)>,
    /// Shared secret for deployments and daemons (default: `LEDA_SECRET`).
    pub secret: Option<leda_net::Secret>,
    /// Serve the dashboard of every run (`leda run --dashboard ADDR`; for a mapped
    /// graph, this process' dashboard shows every process).
    pub dashboard: Option<leda_core::dashboard::DashboardConfig>,
    /// Mutual TLS for deployments and daemons (`leda run --tls-cert ...`): every link
    /// of a mapped graph, and the daemons `leda.start` serves.
    pub tls: Option<leda_net::TlsConfig>,
}

impl Default for ScriptOptions {
    fn default() -> Self {
        ScriptOptions {
            mode: Mode::Run,
            until_idle: false,
            threads: None,
            process: None,
            aliases: Vec::new(),
            secret: None,
            dashboard: None,
            tls: None,
        }
    }
}

impl ScriptOptions {
    /// `addr` after the alias rewrites.
    pub fn resolve(&self, addr: &str) -> String {
        self.aliases
            .iter()
            .find(|(from, _)| from == addr)
            .map_or_else(|| addr.to_owned(), |(_, to)| to.clone())
    }
}

fn options_of(lua: &Lua) -> ScriptOptions {
    lua.app_data_ref::<ScriptOptions>()
        .map(|o| o.clone())
        .unwrap_or_default()
}

pub use leda_core::stats::StageFailures;

#[derive(Default)]
struct Shared {
    graphs: Vec<Graph>,
    /// Handler failures of the runs so far.
    failures: Vec<StageFailures>,
    names: HashSet<String>,
    package_path: String,
    /// Texts of chunks loaded from strings, by chunk name.
    texts: std::collections::HashMap<String, Arc<str>>,
}

/// A configuring Lua state.
pub struct Script {
    lua: Lua,
    shared: Arc<Mutex<Shared>>,
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

fn rt(msg: impl Into<String>) -> mlua::Error {
    mlua::Error::runtime(msg.into())
}

fn shared_of(lua: &Lua) -> mlua::Result<Arc<Mutex<Shared>>> {
    lua.app_data_ref::<Arc<Mutex<Shared>>>()
        .map(|s| s.clone())
        .ok_or_else(|| rt("not a configuring state"))
}

fn install_leda(lua: &Lua) -> mlua::Result<Table> {
    let leda = lua.create_table()?;
    leda.set(
        "stage",
        lua.create_function(|lua, arg: mlua::Value| stage_ctor(lua, arg, None))?,
    )?;
    leda.set(
        "graph",
        lua.create_function(|lua, arg: mlua::Value| graph_ctor(lua, arg, None))?,
    )?;
    leda.set(
        "connect",
        lua.create_function(|_, args: MultiValue| {
            let args = args.into_vec();
            let from = args
                .first()
                .and_then(as_stage)
                .ok_or_else(|| rt("leda.connect: the origin must be a stage"))?;
            connector(from, &args[1..])
        })?,
    )?;
    leda.set(
        "cluster",
        lua.create_function(|_, items: Variadic<mlua::Value>| {
            let mut c = Cluster::default();
            for v in items.iter() {
                c = &c + &to_cluster(v)?;
            }
            Ok(LuaCluster(c))
        })?,
    )?;
    leda.set("start", lua.create_function(start)?)?;
    leda.set(
        "gettime",
        lua.create_function(|_, ()| Ok(crate::api::wall_time()))?,
    )?;
    leda.set("version", env!("CARGO_PKG_VERSION"))?;
    Ok(leda)
}

impl Script {
    /// A configuring state. Scripts' `require` searches `script_dir` first.
    pub fn new(options: ScriptOptions) -> Result<Script, ScriptError> {
        // SAFETY: the configuring state loads the `debug` library, which Lua code could
        // use to corrupt the state; configuring scripts are trusted programs (as with
        // the `lua` interpreter), and the library is needed to read handlers'
        // upvalues. Instance states never load it.
        let lua = unsafe { Lua::unsafe_new_with(StdLib::ALL, LuaOptions::default()) };
        let shared = Arc::new(Mutex::new(Shared::default()));
        lua.set_app_data(shared.clone());
        lua.set_app_data(options);
        let g = lua.globals();
        g.set("unpack", lua.create_function(unpack)?)?;
        lua.set_named_registry_value("leda.debug", g.get::<Table>("debug")?)?;
        let libs = lua.create_table()?;
        for name in [
            "string",
            "table",
            "math",
            "io",
            "os",
            "utf8",
            "coroutine",
            "debug",
        ] {
            // (LuaJIT has no `utf8`.)
            if let Some(t) = g.get::<Option<Table>>(name)? {
                libs.set(name, t)?;
            }
        }
        lua.set_named_registry_value("leda.libs", libs)?;
        let leda = install_leda(&lua)?;
        lua.set_named_registry_value("leda.module", leda.clone())?;
        g.set("leda", leda.clone())?;
        let package: Table = g.get("package")?;
        let loaded: Table = package.get("loaded")?;
        loaded.set("leda", leda)?;
        let preload: Table = package.get("preload")?;
        for (name, auto) in [
            ("leda.controller.thread_pool", false),
            ("leda.controller.default", false),
            ("leda.controller.auto", true),
        ] {
            let m = controller_module(&lua, auto)?;
            preload.set(
                name,
                lua.create_function(move |_, _: MultiValue| Ok(m.clone()))?,
            )?;
        }
        preload.set(
            "leda.controller.single_thread",
            lua.create_function(|_, _: MultiValue| Ok(LuaController::Fixed(1)))?,
        )?;
        // Rust stages of the stage library, looked up when required.
        crate::library::register_bundled();
        // (`package.loaders` in Lua 5.1 and LuaJIT.)
        let searchers: Table = match package.get::<Option<Table>>("searchers")? {
            Some(t) => t,
            None => package.get("loaders")?,
        };
        let searcher = lua.create_function(|lua, name: String| {
            if let Some(src) = crate::library::lua_module(&name) {
                // A Lua module of the stage library: its text is recorded so that
                // the stages it builds can travel to instances like a script's.
                let chunk = format!("@{}.lua", name.replace('.', "/"));
                let sh = shared_of(lua)?;
                lock(&sh).texts.insert(chunk.clone(), Arc::from(src));
                let f = lua.load(src).set_name(chunk).into_function()?;
                return Ok(mlua::Value::Function(f));
            }
            if !crate::registry::is_registered(&name) {
                return Ok(mlua::Value::String(lua.create_string(format!(
                    "\n\tno registered Rust stage '{name}'"
                ))?));
            }
            let f = lua.create_function(move |lua, _: MultiValue| {
                let s = crate::registry::make_stage(&name)
                    .ok_or_else(|| rt(format!("stage '{name}' is not registered")))?;
                let sh = shared_of(lua)?;
                lock(&sh).names.insert(s.name().to_owned());
                Ok(LuaStage(s))
            })?;
            Ok(mlua::Value::Function(f))
        })?;
        searchers.raw_insert(2, searcher)?;
        Ok(Script { lua, shared })
    }

    /// The configuring Lua state.
    pub fn lua(&self) -> &Lua {
        &self.lua
    }

    fn set_dir(&self, dir: &Path) -> Result<(), ScriptError> {
        let dir = if dir.as_os_str().is_empty() {
            ".".into()
        } else {
            dir.to_string_lossy().into_owned()
        };
        let path = format!("{dir}/?.lua;{dir}/?/init.lua;./?.lua;./?/init.lua");
        let package: Table = self.lua.globals().get("package")?;
        package.set("path", path.as_str())?;
        lock(&self.shared).package_path = path;
        Ok(())
    }

    /// Runs a script file with `args` (`arg[1..]`, and `...`); `arg[0]` is the path.
    pub fn run_file(&self, path: &Path, args: &[String]) -> Result<MultiValue, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.display().to_string(),
            source,
        })?;
        self.set_dir(path.parent().unwrap_or(Path::new(".")))?;
        let text = match text.strip_prefix("#!") {
            Some(rest) => format!("--{rest}"),
            None => text,
        };
        let arg = self.lua.create_table()?;
        arg.set(0, path.display().to_string())?;
        arg.set(-1, "leda")?;
        for (i, a) in args.iter().enumerate() {
            arg.set(i as i64 + 1, a.as_str())?;
        }
        self.lua.globals().set("arg", arg)?;
        let f = self
            .lua
            .load(&text)
            .set_name(format!("@{}", path.display()))
            .into_function()?;
        let out = f.call::<MultiValue>(MultiValue::from_iter(
            args.iter()
                .map(|a| self.lua.create_string(a).map(mlua::Value::String))
                .collect::<mlua::Result<Vec<_>>>()?,
        ))?;
        self.record_returned(&out);
        Ok(out)
    }

    /// Runs script text under the chunk name `name` (e.g. `=test`); functions defined
    /// in it can be stage handlers (their source is this text).
    pub fn run_str(&self, code: &str, name: &str) -> Result<MultiValue, ScriptError> {
        self.set_dir(Path::new("."))?;
        lock(&self.shared)
            .texts
            .insert(name.to_owned(), Arc::from(code));
        let out = self.lua.load(code).set_name(name).call::<MultiValue>(())?;
        self.record_returned(&out);
        Ok(out)
    }

    fn record_returned(&self, out: &MultiValue) {
        let mut sh = lock(&self.shared);
        if !sh.graphs.is_empty() {
            return;
        }
        for v in out.iter() {
            if let mlua::Value::UserData(ud) = v
                && let Ok(g) = ud.borrow::<LuaGraph>()
            {
                sh.graphs.push(graph_of(&g).clone());
            }
        }
    }

    /// The graphs the script ran (or checked), or returned when it ran none.
    pub fn graphs(&self) -> Vec<Graph> {
        lock(&self.shared).graphs.clone()
    }

    /// The stages whose handlers failed in the script's runs, on any process of
    /// them (remote counts as each process reported them when the run ended).
    pub fn failures(&self) -> Vec<StageFailures> {
        lock(&self.shared).failures.clone()
    }
}
