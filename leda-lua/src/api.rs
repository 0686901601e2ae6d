//! The instance API inside handlers: `leda.send`, `leda.send_wait`, `leda.push`,
//! `leda.sleep`, `leda.nice`, `leda.quit`, `leda.gettime`.
//!
//! `leda.send(port, ...)` returns `true`, or `nil` and a reason string: the
//! destination queue is full, the port is not connected, or a value cannot cross a
//! connector (a function, a userdata without `__persist`, a cyclic table).
//! `leda.send_wait(port, ...)` is the same, except that on a full queue the instance
//! waits (no thread held, like `leda.sleep`) until the event is accepted: a producer
//! faster than its consumer loses nothing.

use std::cell::Cell;
use std::ptr;

use leda_core::error::SendError;
use leda_core::event::Event;
use leda_core::prelude::{Ctx, Port};
use mlua::{Lua, MultiValue, Table};

use crate::value::args_to_values;

/// Where the API functions of an instance find the handler's current [`Ctx`].
///
/// The pointer is set only while the instance's coroutine is being resumed (see
/// [`CtxCell::enter`]) and cleared before `enter`'s guard is dropped.
#[derive(Debug)]
pub struct CtxCell(Cell<*mut Ctx>, Cell<*const std::ffi::c_void>);

impl Default for CtxCell {
    fn default() -> Self {
        CtxCell(Cell::new(ptr::null_mut()), Cell::new(ptr::null()))
    }
}

// SAFETY: a `CtxCell` belongs to one instance, whose Lua state runs on one thread at a
// time (the runtime never runs an instance on two workers at once, and mlua's `send`
// feature serialises access to the state); the pointer is only dereferenced by the
// API functions, synchronously inside the resume that `enter` brackets.
unsafe impl Send for CtxCell {}
// SAFETY: as above: never accessed by two threads at once.
unsafe impl Sync for CtxCell {}

/// Clears the cell when the resume is over.
pub struct Entered<'a>(&'a CtxCell);

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.0.0.set(ptr::null_mut());
    }
}

impl CtxCell {
    /// Makes `ctx` the current context until the guard drops; `handler` is the
    /// coroutine being resumed (only it may wait in `leda.send_wait`).
    pub fn enter<'a>(&'a self, ctx: &'a mut Ctx, handler: &mlua::Thread) -> Entered<'a> {
        self.0.set(ctx as *mut Ctx);
        self.1.set(handler.to_pointer());
        Entered(self)
    }

    /// Whether `thread` is the handler's own coroutine.
    fn is_handler(&self, thread: &mlua::Thread) -> bool {
        self.1.get() == thread.to_pointer()
    }

    fn with<R>(&self, what: &str, f: impl FnOnce(&mut Ctx) -> R) -> mlua::Result<R> {
        let p = self.0.get();
        if p.is_null() {
            return Err(mlua::Error::runtime(format!(
                "{what} may only be called from a handler"
            )));
        }
        // SAFETY: `p` was set by `enter` from a live `&mut Ctx` whose guard is still
        // alive (the cell is cleared when it drops), and no other reference to that
        // `Ctx` is used while the handler runs.
        Ok(f(unsafe { &mut *p }))
    }
}

/// Why an event was not sent.
enum Refusal {
    /// The destination queue is full (the message `leda.send` returns).
    Full(String),
    /// Any other reason, as the message `leda.send` returns.
    Other(String),
}

/// The port a Lua value names: a string, an integer (or an integral float), or `nil`
/// for port 1.
pub(crate) fn lua_port(port: &mlua::Value) -> Result<Port, String> {
    match port {
        mlua::Value::String(s) => Ok(Port::from(s.to_string_lossy().as_str())),
        mlua::Value::Integer(i) => Ok(Port::from(*i)),
        mlua::Value::Number(n) if n.fract() == 0.0 && n.is_finite() => Ok(Port::from(*n as i64)),
        mlua::Value::Nil => Ok(Port::from(1i64)),
        other => Err(format!(
            "a port is a number or a string, not a {}",
            other.type_name()
        )),
    }
}

fn deliver(ctx: &mut Ctx, port: &mlua::Value, values: &[mlua::Value]) -> Result<(), Refusal> {
    let port = lua_port(port).map_err(Refusal::Other)?;
    let v = args_to_values(values, "")
        .map_err(|e| Refusal::Other(refused(ctx, &port.to_string(), &e)))?;
    match ctx.send(&port, Event::from_values(v)) {
        Ok(()) => Ok(()),
        Err(e @ SendError::QueueFull { .. }) => Err(Refusal::Full(e.to_string())),
        Err(e) => Err(Refusal::Other(e.to_string())),
    }
}

fn send(
    cell: &CtxCell,
    port: mlua::Value,
    args: MultiValue,
) -> mlua::Result<(Option<bool>, Option<String>)> {
    let values = args.into_vec();
    cell.with("leda.send", |ctx| match deliver(ctx, &port, &values) {
        Ok(()) => (Some(true), None),
        Err(Refusal::Full(reason) | Refusal::Other(reason)) => (None, Some(reason)),
    })
}

/// `leda.send_wait`'s first attempt: `true` when sent, `false` when the queue is full
/// and the caller may wait (it then yields the event to [`crate::instance`], which
/// waits for room), `nil` and the reason otherwise. Only the handler's own coroutine
/// can wait: from a coroutine the handler made, a yield would go to that coroutine
/// and the event would be lost, so a full queue is then an error.
fn try_send(
    lua: &Lua,
    cell: &CtxCell,
    port: mlua::Value,
    args: MultiValue,
) -> mlua::Result<(Option<bool>, Option<String>)> {
    let values = args.into_vec();
    let own = cell.is_handler(&lua.current_thread());
    cell.with("leda.send_wait", |ctx| match deliver(ctx, &port, &values) {
        Ok(()) => (Some(true), None),
        Err(Refusal::Full(_)) if own => (Some(false), None),
        Err(Refusal::Full(reason)) => (
            None,
            Some(format!(
                "{reason} (leda.send_wait can wait only in the handler's own coroutine)"
            )),
        ),
        Err(Refusal::Other(reason)) => (None, Some(reason)),
    })
}

/// The reason given for an event that cannot leave its Lua state.
fn refused(ctx: &Ctx, port: &str, e: &crate::value::ConvertError) -> String {
    format!(
        "stage '{}' cannot send on port '{port}': {e}",
        ctx.stage_name()
    )
}

/// Seconds since the epoch with microsecond resolution (outside a run).
pub fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as f64 / 1e6)
        .unwrap_or(0.0)
}

/// Installs the `leda` table of an instance (global, and `require 'leda'`). Returns
/// it and the private token that marks the coroutine yields of `sleep`/`nice`.
pub fn install_instance_api(
    lua: &Lua,
    cell: std::sync::Arc<CtxCell>,
) -> mlua::Result<(Table, Table)> {
    let leda = lua.create_table()?;
    let c = cell.clone();
    leda.set(
        "send",
        lua.create_function(move |_, (port, args): (mlua::Value, MultiValue)| {
            send(&c, port, args)
        })?,
    )?;
    let c = cell.clone();
    leda.set(
        "push",
        lua.create_function(move |_, args: MultiValue| send(&c, mlua::Value::Integer(1), args))?,
    )?;
    let c = cell.clone();
    leda.set(
        "quit",
        lua.create_function(move |_, args: MultiValue| {
            let values = args_to_values(&args.into_vec(), "leda.quit ")
                .map_err(|e| mlua::Error::runtime(e.to_string()))?;
            c.with("leda.quit", |ctx| ctx.quit(Event::from_values(values)))
        })?,
    )?;
    let c = cell.clone();
    leda.set(
        "gettime",
        lua.create_function(move |_, ()| {
            Ok(c.with("leda.gettime", |ctx| ctx.gettime())
                .unwrap_or_else(|_| wall_time()))
        })?,
    )?;
    let c = cell.clone();
    leda.set(
        "flush",
        lua.create_function(move |_, ()| c.with("leda.flush", |ctx| ctx.flush()))?,
    )?;
    let token = lua.create_table()?;
    let coroutine: Table = lua.globals().get("coroutine")?;
    let yield_fn: mlua::Function = coroutine.get("yield")?;
    let c = cell.clone();
    let try_fn = lua.create_function(move |lua, (port, args): (mlua::Value, MultiValue)| {
        try_send(lua, &c, port, args)
    })?;
    // Whether the running coroutine is the handler's own (a yield elsewhere would go to
    // a coroutine the handler made, which got the private token back as a value).
    let c = cell.clone();
    let own_fn = lua.create_function(move |lua, ()| Ok(c.is_handler(&lua.current_thread())))?;
    // A full queue: the event goes to the instance's driver with the yield
    // (`instance::step`), which waits for room and resumes with the outcome.
    let waits: Table = lua
        .load(
            "local yield, token, try, own = ...
             local isyieldable = coroutine.isyieldable
             local function can_wait(what)
               if not (own() and isyieldable()) then
                 error(what .. ' can only wait in the handler itself, not in a coroutine it made or a C function callback', 3)
               end
             end
             local function sleep(t)
               t = tonumber(t) or error('leda.sleep: a number of seconds is required', 2)
               can_wait('leda.sleep')
               yield(token, t)
             end
             local function nice() can_wait('leda.nice') yield(token, 0) end
             local function send_wait(port, ...)
               local ok, why = try(port, ...)
               if ok ~= false then return ok, why end
               if not isyieldable() then
                 return nil, 'the queue is full and leda.send_wait cannot wait inside a C function (a string.gsub or table.sort callback)'
               end
               return yield(token, 'send', port, ...)
             end
             return { sleep = sleep, nice = nice, send_wait = send_wait }",
        )
        .set_name("=leda")
        .call((yield_fn, token.clone(), try_fn, own_fn))?;
    leda.set("sleep", waits.get::<mlua::Function>("sleep")?)?;
    leda.set("nice", waits.get::<mlua::Function>("nice")?)?;
    leda.set("send_wait", waits.get::<mlua::Function>("send_wait")?)?;
    lua.globals().set("leda", leda.clone())?;
    let package: Table = lua.globals().get("package")?;
    let loaded: Table = package.get("loaded")?;
    loaded.set("leda", leda.clone())?;
    Ok((leda, token))
}
