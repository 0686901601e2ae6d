//! One stage instance: a private Lua state running the stage's handler.
//!
//! * The state opens only the base library, `coroutine` and `require`; `string`,
//!   `table`, `math`, `os` (a safe part unless allowed) and `utf8` (and `io`, if
//!   allowed) are pre-registered and loaded by `require` (which also sets the global,
//!   as Lua 5.1 did); chunks compile as text only. What is allowed:
//!   [`crate::capabilities`]. `unpack` is provided as in Lua 5.1's base library.
//! * `self` is a table holding the stage's attributes (as they stood when the run
//!   started) and its `name`.
//! * `init` runs once, when the instance is created.
//! * Each event runs the handler in a coroutine. `leda.sleep`/`leda.nice` yield it;
//!   the instance is then parked with [`Ctx::wait`] on a timer future, which resumes
//!   the coroutine: the worker thread is free meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use leda_core::prelude::*;
use leda_core::stage::{Attrs, StageId};
use mlua::{Function, Lua, LuaOptions, MultiValue, StdLib, Table, Thread, ThreadStatus};

use crate::api::{CtxCell, install_instance_api, lua_port};
use crate::error::{LuaStageError, lua_message};
use crate::interrupt::Slot;
use crate::source::FnSource;
use crate::value::{args_to_values, to_lua};

/// The code of a Lua stage, shared by all its instances. Serializable: this is what
/// travels to another process (source text and copied upvalues, never bytecode).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StageCode {
    /// The stage's name (for messages).
    pub name: String,
    /// The handler.
    pub handler: FnSource,
    /// The optional `init`.
    pub init: Option<FnSource>,
    /// `package.path` of instances (the script's directory first).
    pub package_path: String,
}

impl StageCode {
    /// `Some(reason)` if the handler or `init` is bytecode rather than source text.
    pub fn binary_chunk(&self) -> Option<String> {
        self.handler
            .binary_chunk()
            .or_else(|| self.init.as_ref().and_then(FnSource::binary_chunk))
            .map(|r| format!("stage '{}': {r}", self.name))
    }
}

/// The code of every live Lua stage, by stage id. Weak: the stage's factory holds the
/// code, so a deployment's code goes with its stages (a daemon kept every deployment's
/// code, captured upvalues included, for good); dead entries are pruned as the map
/// grows.
struct Codes {
    by_stage: HashMap<StageId, Weak<StageCode>>,
    /// The map's length after the last pruning.
    pruned_at: usize,
}

fn codes() -> &'static Mutex<Codes> {
    static C: OnceLock<Mutex<Codes>> = OnceLock::new();
    C.get_or_init(|| {
        Mutex::new(Codes {
            by_stage: HashMap::new(),
            pruned_at: 0,
        })
    })
}

/// A stage whose instances run `code` (kind `"lua"`). Serial policy, attributes and
/// initial events are set on the returned stage by the caller (a daemon rebuilding a
/// deployed cluster, for instance).
pub fn stage_from_code(name: impl Into<String>, code: Arc<StageCode>) -> Stage {
    let c = code.clone();
    let stage = Stage::from_factory(name, move |attrs: &Attrs| {
        LuaInstance::new(&c, attrs)
            .map(|i| Box::new(i) as Box<dyn Handler>)
            .map_err(|e: LuaStageError| Box::new(e) as BoxError)
    })
    .kind("lua");
    remember(&stage, &code);
    stage
}

/// Records that `stage` runs `code` (see [`code_of`]), for as long as `code` lives
/// (the stage's factory should hold it).
pub fn remember(stage: &Stage, code: &Arc<StageCode>) {
    let mut c = codes().lock().unwrap_or_else(|e| e.into_inner());
    c.by_stage.insert(stage.id(), Arc::downgrade(code));
    if c.by_stage.len() >= 2 * c.pruned_at.max(64) {
        c.by_stage.retain(|_, w| w.strong_count() > 0);
        c.pruned_at = c.by_stage.len();
    }
}

/// The Lua code of `stage`, if it is a Lua stage: what a transport sends to the
/// process that runs it.
pub fn code_of(stage: &Stage) -> Option<Arc<StageCode>> {
    codes()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .by_stage
        .get(&stage.id())
        .and_then(Weak::upgrade)
}

/// Standard libraries `require` can load into an instance.
const LIBS: &[(&str, StdLib)] = &[
    ("io", StdLib::IO),
    ("os", StdLib::OS),
    ("string", StdLib::STRING),
    ("table", StdLib::TABLE),
    ("math", StdLib::MATH),
    #[cfg(not(feature = "luajit"))]
    ("utf8", StdLib::UTF8),
];

/// What every instance state opens: the base library (with `coroutine`, which Lua
/// 5.1/LuaJIT keep in the base library) and `package` for `require`; on LuaJIT also
/// the `jit` library, whose loading switches the compiler on (its global is then
/// removed).
#[cfg(not(feature = "luajit"))]
fn base_libs() -> StdLib {
    StdLib::COROUTINE | StdLib::PACKAGE
}

#[cfg(feature = "luajit")]
fn base_libs() -> StdLib {
    StdLib::PACKAGE | StdLib::JIT
}

/// Creates a bare instance state: base library, `coroutine`, `require` with the
/// standard libraries pre-registered, and `unpack`.
pub fn new_state(package_path: &str) -> mlua::Result<Lua> {
    let caps = crate::capabilities::allowed();
    let lua = if caps.os {
        // SAFETY: C modules can do anything; the process allowed them (`--allow os`).
        // mlua's safe mode would refuse them whatever `package.cpath` says.
        unsafe { Lua::unsafe_new_with(base_libs(), LuaOptions::default()) }
    } else {
        Lua::new_with(base_libs(), LuaOptions::default())?
    };
    if let Some(limit) = state_memory_limit() {
        // LuaJIT keeps its own allocator: no limit there.
        let _ = lua.set_memory_limit(limit);
    }
    let globals = lua.globals();
    if cfg!(feature = "luajit") {
        globals.set("jit", mlua::Value::Nil)?;
    }
    let package: Table = globals.get("package")?;
    package.set("path", package_path)?;
    let preload: Table = package.get("preload")?;
    preload_libs(&lua, &globals, &preload, caps)?;
    globals.set("unpack", lua.create_function(unpack)?)?;
    // What the capabilities allow, then what the end of a run could not stop (code Lua
    // runs with hooks off): our own chunk, compiled once per set of capabilities and
    // loaded as bytecode (compiling it took a third of an instance's creation).
    let interrupting = lua.create_function(|_, ()| Ok(crate::interrupt::interrupting()))?;
    lua.load(sandbox_bytecode(caps)?)
        .set_name("=leda sandbox")
        .set_mode(mlua::ChunkMode::Binary)
        .call::<()>(interrupting)?;
    Ok(lua)
}

/// Default of the memory one handler state may hold (Lua 5.4): past it an allocation
/// fails with "not enough memory" in the handler, which fails, instead of the process
/// running out of memory. `LEDA_LUA_MEMORY_MB` sets another (0: no limit).
pub const STATE_MEMORY_MB: usize = 1024;

fn state_memory_limit() -> Option<usize> {
    static LIMIT: OnceLock<Option<usize>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let mb = match std::env::var("LEDA_LUA_MEMORY_MB") {
            Ok(v) => v.trim().parse::<usize>().unwrap_or_else(|_| {
                tracing::warn!(value = %v, "LEDA_LUA_MEMORY_MB is not a number of MiB: using {STATE_MEMORY_MB}");
                STATE_MEMORY_MB
            }),
            Err(_) => STATE_MEMORY_MB,
        };
        (mb > 0).then_some(mb << 20)
    })
}

/// The sandbox chunk for `caps`, as bytecode (compiled once per set of capabilities, in
/// a state of its own; only this crate's own text is ever loaded as bytecode).
fn sandbox_bytecode(caps: crate::capabilities::Capabilities) -> mlua::Result<Vec<u8>> {
    static CACHE: OnceLock<Mutex<HashMap<u8, Vec<u8>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(b) = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&caps.bits())
    {
        return Ok(b.clone());
    }
    let scratch = Lua::new_with(StdLib::NONE, LuaOptions::default())?;
    let f = scratch
        .load(crate::capabilities::sandbox_chunk(caps) + GUARDS)
        .set_name("=leda sandbox")
        .into_function()?;
    let bytes = f.dump(true);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(caps.bits(), bytes.clone());
    Ok(bytes)
}

/// The sandbox's guards against what a run's end cannot interrupt (after
/// [`crate::capabilities::sandbox_chunk`], in the same chunk; its argument is
/// `interrupt::interrupting`).
const GUARDS: &str = r#"
        local interrupting = ...
        local xpcall, setmetatable, rawget, error, type = xpcall, setmetatable, rawget, error, type
        -- A message handler runs with hooks off: skipped once the handler is interrupted.
        _G.xpcall = function(f, msgh, ...)
          if type(msgh) ~= 'function' then return xpcall(f, msgh, ...) end
          return xpcall(f, function(...)
            if interrupting() then return ... end
            return msgh(...)
          end, ...)
        end
        -- Finalizers (`__gc`) and closers (`__close`) run with hooks off, and after the
        -- instance is gone: refused.
        _G.setmetatable = function(t, mt)
          if type(mt) == 'table' and (rawget(mt, '__gc') ~= nil or rawget(mt, '__close') ~= nil) then
            error('setmetatable: __gc and __close are not allowed in handlers (they run where the end of a run cannot stop them)', 2)
          end
          return setmetatable(t, mt)
        end
        "#;

/// Sets `__metatable = false` on `v`'s metatable, if it has one: Lua then refuses to
/// hand it out or replace it.
fn lock_metatable(lua: &Lua, v: mlua::Value) -> mlua::Result<()> {
    let getmetatable: mlua::Function = lua.globals().get("getmetatable")?;
    if let mlua::Value::Table(mt) = getmetatable.call::<mlua::Value>(v)? {
        mt.raw_set("__metatable", false)?;
    }
    Ok(())
}

/// What `require NAME` gives a handler under `caps`: the library table `t` (as
/// opened), restricted; an error for a library that is not allowed.
fn restricted(
    lua: &Lua,
    name: &str,
    t: mlua::Value,
    caps: crate::capabilities::Capabilities,
) -> mlua::Result<mlua::Value> {
    match (name, &t) {
        ("io", _) if !caps.io => Err(mlua::Error::runtime(
            "require 'io': files are not allowed in handlers of this process (start it \
             with --allow io)",
        )),
        ("string", mlua::Value::Table(s)) => {
            // No bytecode out (and so none back in).
            s.set("dump", mlua::Value::Nil)?;
            // The strings' metatable is shared and its `__close` or `__gc` would run with
            // hooks off: `getmetatable('')` gives `false` instead of it.
            lock_metatable(lua, mlua::Value::String(lua.create_string("")?))?;
            Ok(t)
        }
        ("io", mlua::Value::Table(io)) => {
            // The same for files' (a `__gc` there would run for every file handle).
            lock_metatable(lua, io.get::<mlua::Value>("stdout")?)?;
            Ok(t)
        }
        ("os", mlua::Value::Table(os)) if !caps.os => {
            let safe = lua.create_table()?;
            for f in ["time", "clock", "date", "difftime"] {
                safe.set(f, os.get::<mlua::Value>(f)?)?;
            }
            Ok(mlua::Value::Table(safe))
        }
        _ => Ok(t),
    }
}

/// `require 'string'` (etc.) opens the library then, and sets its global (restricted
/// by `caps`).
#[cfg(not(feature = "luajit"))]
fn preload_libs(
    lua: &Lua,
    _: &Table,
    preload: &Table,
    caps: crate::capabilities::Capabilities,
) -> mlua::Result<()> {
    for &(name, lib) in LIBS {
        let f = lua.create_function(move |lua, _: MultiValue| {
            if name == "io" && !caps.io {
                return restricted(lua, name, mlua::Value::Nil, caps);
            }
            lua.load_std_libs(lib)?;
            let t = restricted(lua, name, lua.globals().get::<mlua::Value>(name)?, caps)?;
            lua.globals().set(name, t.clone())?;
            // Opening the library also left the whole of it in the table of loaded
            // modules (the registry's, which `require` reads, whatever the handler made
            // of `package.loaded`): a handler calling this loader itself, not through
            // `require` (which would store `t` there), must not find it.
            let loaded: Table = lua.named_registry_value("_LOADED")?;
            loaded.raw_set(name, t.clone())?;
            Ok(t)
        })?;
        preload.set(name, f)?;
    }
    Ok(())
}

/// LuaJIT: opening a library from inside a Rust callback corrupts the state through
/// mlua, so the libraries are opened with the state and hidden until `require`d.
#[cfg(feature = "luajit")]
fn preload_libs(
    lua: &Lua,
    globals: &Table,
    preload: &Table,
    caps: crate::capabilities::Capabilities,
) -> mlua::Result<()> {
    let mut all = StdLib::NONE;
    for &(_, lib) in LIBS {
        all |= lib;
    }
    lua.load_std_libs(all)?;
    let loaded: Table = globals.get::<Table>("package")?.get("loaded")?;
    for &(name, _) in LIBS {
        let opened: mlua::Value = globals.get(name)?;
        globals.set(name, mlua::Value::Nil)?;
        loaded.set(name, mlua::Value::Nil)?;
        let t = if name == "io" && !caps.io {
            None
        } else {
            Some(restricted(lua, name, opened, caps)?)
        };
        let f = lua.create_function(move |lua, _: MultiValue| {
            let Some(t) = &t else {
                return restricted(lua, name, mlua::Value::Nil, caps);
            };
            lua.globals().set(name, t.clone())?;
            Ok(t.clone())
        })?;
        preload.set(name, f)?;
    }
    Ok(())
}

/// Lua 5.1's `unpack(t [, i [, j]])`.
pub fn unpack(_: &Lua, (t, i, j): (Table, Option<i64>, Option<i64>)) -> mlua::Result<MultiValue> {
    let i = i.unwrap_or(1);
    let j = match j {
        Some(j) => j,
        None => t.raw_len() as i64,
    };
    if j < i {
        return Ok(MultiValue::new());
    }
    // In i128: `j - i` overflows i64 for `unpack({}, math.mininteger, math.maxinteger)`.
    if i128::from(j) - i128::from(i) >= 1_000_000 {
        return Err(mlua::Error::runtime("too many results to unpack"));
    }
    let mut out = Vec::with_capacity((j - i + 1) as usize);
    for k in i..=j {
        out.push(t.raw_get::<mlua::Value>(k)?);
    }
    Ok(MultiValue::from_vec(out))
}

/// What a resumed handler coroutine asks for next.
enum Step {
    Done,
    /// `leda.sleep(t)`; `None` is `leda.nice()`.
    Wait(Option<Duration>),
    /// `leda.send_wait` found the queue full: send this when there is room.
    Send(Port, Event),
}

/// A running instance of a Lua stage.
pub struct LuaInstance {
    lua: Lua,
    handler: Function,
    thread: Option<Thread>,
    cell: Arc<CtxCell>,
    /// What the interrupt watcher sees of this instance ([`crate::interrupt`]).
    slot: Arc<Slot>,
    token: Table,
    stage: Arc<str>,
    named: bool,
}

impl std::fmt::Debug for LuaInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LuaInstance")
            .field("stage", &self.stage)
            .finish()
    }
}

impl LuaInstance {
    /// Creates an instance: a fresh state, `self` from `attrs`, then `init`.
    pub fn new(code: &StageCode, attrs: &Attrs) -> Result<LuaInstance, LuaStageError> {
        let stage: Arc<str> = Arc::from(code.name.as_str());
        let fail = |message: String| LuaStageError::Init {
            stage: code.name.clone(),
            message,
        };
        let lua = new_state(&code.package_path).map_err(|e| fail(lua_message(&e)))?;
        let cell = Arc::new(CtxCell::default());
        let (leda, token) =
            install_instance_api(&lua, cell.clone()).map_err(|e| fail(lua_message(&e)))?;
        let this = lua.create_table().map_err(|e| fail(lua_message(&e)))?;
        for (k, v) in attrs.iter().filter(|(k, _)| *k != crate::remote::CODE_ATTR) {
            let v = to_lua(&lua, v).map_err(|e| fail(format!("attribute '{k}': {e}")))?;
            this.set(k, v).map_err(|e| fail(lua_message(&e)))?;
        }
        this.set("name", &*code.name)
            .map_err(|e| fail(lua_message(&e)))?;
        lua.globals()
            .set("self", this)
            .map_err(|e| fail(lua_message(&e)))?;
        if let Some(init) = &code.init {
            let f = init
                .instantiate(&lua, &leda)
                .map_err(|e| fail(e.to_string()))?;
            f.call::<()>(()).map_err(|e| fail(lua_message(&e)))?;
        }
        let handler = code
            .handler
            .instantiate(&lua, &leda)
            .map_err(|e| fail(e.to_string()))?;
        Ok(LuaInstance {
            lua,
            handler,
            thread: None,
            cell,
            slot: Slot::new(),
            token,
            stage,
            named: false,
        })
    }

    /// The instance's Lua state (tests and benchmarks).
    pub fn lua(&self) -> &Lua {
        &self.lua
    }
}

fn step(
    thread: &Thread,
    res: mlua::Result<MultiValue>,
    interrupted: bool,
    token: &Table,
    stage: &str,
) -> Result<Step, BoxError> {
    let values = match res {
        Ok(v) => v,
        Err(e) => {
            let message = lua_message(&e);
            let text = crate::interrupt::MESSAGE.to_str().unwrap_or_default();
            if interrupted && message.contains(text) {
                // Stopped at the end of its run: not the event's failure.
                let why = format!("stage '{stage}': {message}");
                return Err(Box::new(leda_core::error::Cancelled(why)));
            }
            return Err(LuaStageError::Handler {
                stage: stage.to_owned(),
                message,
            }
            .into());
        }
    };
    match thread.status() {
        ThreadStatus::Resumable => {
            let mut it = values.into_iter();
            let ours = matches!(it.next(), Some(mlua::Value::Table(t)) if t.to_pointer() == token.to_pointer());
            if !ours {
                return Err(LuaStageError::Handler {
                    stage: stage.to_owned(),
                    message: "the handler yielded outside leda.sleep/leda.nice/leda.send_wait"
                        .into(),
                }
                .into());
            }
            let secs = match it.next() {
                Some(mlua::Value::String(s)) if s.as_bytes() == b"send" => {
                    let port = it.next().unwrap_or(mlua::Value::Nil);
                    let port = lua_port(&port).map_err(|m| LuaStageError::Handler {
                        stage: stage.to_owned(),
                        message: m,
                    })?;
                    let rest: Vec<mlua::Value> = it.collect();
                    let values = args_to_values(&rest, "").map_err(|e| LuaStageError::Handler {
                        stage: stage.to_owned(),
                        message: e.to_string(),
                    })?;
                    return Ok(Step::Send(port, Event::from_values(values)));
                }
                Some(mlua::Value::Integer(i)) => i as f64,
                Some(mlua::Value::Number(n)) => n,
                _ => 0.0,
            };
            if secs > 0.0 && secs.is_finite() {
                Ok(Step::Wait(Some(Duration::from_secs_f64(secs.min(1e9)))))
            } else {
                Ok(Step::Wait(None))
            }
        }
        _ => Ok(Step::Done),
    }
}

impl Handler for LuaInstance {
    fn handle(&mut self, event: Event, ctx: &mut Ctx) -> HandlerResult {
        if !self.named {
            // A cloned stage (`leda.stage "b" (a)`) shares a's code under its own name.
            self.named = true;
            if ctx.stage_name() != &*self.stage {
                self.stage = Arc::from(ctx.stage_name());
                let this: Option<Table> = self.lua.globals().get("self").ok();
                if let Some(this) = this {
                    this.set("name", ctx.stage_name())?;
                }
            }
        }
        let mut args = Vec::with_capacity(event.len());
        for v in event.args() {
            args.push(to_lua(&self.lua, v).map_err(|e| LuaStageError::Handler {
                stage: self.stage.to_string(),
                message: format!("cannot convert the event: {e}"),
            })?);
        }
        let thread = match self.thread.take() {
            Some(t) => t,
            None => self.lua.create_thread(self.handler.clone())?,
        };
        let res = {
            let _running = self.slot.resuming(&thread, ctx);
            let _in = self.cell.enter(ctx, &thread);
            thread.resume::<MultiValue>(MultiValue::from_vec(args))
        };
        match step(&thread, res, self.slot.wanted(), &self.token, &self.stage)? {
            Step::Done => {
                if thread.reset(self.handler.clone()).is_ok() {
                    self.thread = Some(thread);
                }
                Ok(())
            }
            first => {
                let mut owned = ctx.clone();
                let lua = self.lua.clone();
                let cell = self.cell.clone();
                let slot = self.slot.clone();
                let token = self.token.clone();
                let stage = self.stage.clone();
                ctx.wait(async move {
                    let mut next = first;
                    loop {
                        // What the yield returns: nothing after a sleep, the outcome
                        // after a waiting send.
                        let back = match next {
                            Step::Done => return Ok(()),
                            Step::Wait(Some(d)) => {
                                owned.sleep(d).await;
                                MultiValue::new()
                            }
                            Step::Wait(None) => {
                                owned.nice().await;
                                MultiValue::new()
                            }
                            Step::Send(port, ev) => match owned.send_wait(port, ev).await {
                                Ok(()) => MultiValue::from_vec(vec![mlua::Value::Boolean(true)]),
                                Err(e) => MultiValue::from_vec(vec![
                                    mlua::Value::Nil,
                                    mlua::Value::String(lua.create_string(e.to_string())?),
                                ]),
                            },
                        };
                        let res = {
                            let _running = slot.resuming(&thread, &owned);
                            let _in = cell.enter(&mut owned, &thread);
                            thread.resume::<MultiValue>(back)
                        };
                        next = step(&thread, res, slot.wanted(), &token, &stage)?;
                    }
                });
                Ok(())
            }
        }
    }
}
