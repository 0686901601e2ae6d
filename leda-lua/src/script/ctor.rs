//! The constructors of the thesis' API: `leda.stage{...}` in all its forms and
//! `leda.graph{...}`, with default stage names and the handler code each stage carries
//! (so that daemons can rebuild it). Owns definition tables; nothing runs here.

use std::path::Path;
use std::sync::{Arc, Mutex};

use leda_core::prelude::*;
use mlua::{Function, Lua, Table};

use crate::error::lua_message;
use crate::instance::{StageCode, code_of, remember, stage_from_code};
use crate::source::Extractor;
use crate::value::{args_to_values, to_lua, to_value};

use super::*;

/// The definition's field `key`, an error naming it when it has the wrong type
/// (`capacity = -1` said "error converting Lua integer to usize (out of range)").
fn field<T: mlua::FromLua>(def: &Table, key: &str) -> mlua::Result<T> {
    def.get::<T>(key).map_err(|e| {
        let why = match &e {
            mlua::Error::FromLuaConversionError { from, to, message } => {
                let want = match &**to {
                    "usize" => "a positive integer",
                    "bool" | "boolean" => "a boolean",
                    "String" | "string" => "a string",
                    "function" => "a function",
                    other => other,
                };
                let a = if from.starts_with(['a', 'e', 'i', 'o', 'u']) {
                    "an"
                } else {
                    "a"
                };
                match message {
                    Some(m) => format!("must be {want}, not this {from} ({m})"),
                    None => format!("must be {want}, not {a} {from}"),
                }
            }
            other => other.to_string(),
        };
        rt(format!("leda.stage: field '{key}': {why}"))
    })
}

/// Builds a stage from a definition table.
pub(super) fn make_stage(lua: &Lua, def: &Table, name: Option<String>) -> mlua::Result<LuaStage> {
    let shared = shared_of(lua)?;
    let handler: Function = match def.get::<mlua::Value>("handler")? {
        mlua::Value::Function(f) => f,
        mlua::Value::Nil => return Err(rt("leda.stage: the 'handler' field is required")),
        other => {
            return Err(rt(format!(
                "leda.stage: 'handler' must be a function, not a {}",
                other.type_name()
            )));
        }
    };
    let init: Option<Function> = field(def, "init")?;
    let bind: Option<Function> = field(def, "bind")?;
    let serial = field::<Option<bool>>(def, "serial")?.unwrap_or(false)
        || field::<Option<bool>>(def, "stateful")?.unwrap_or(false);
    let name = match name.or(field::<Option<String>>(def, "name")?) {
        Some(n) => n,
        None => default_name(&handler, &shared),
    };
    lock(&shared).names.insert(name.clone());

    let mut ex = extractor(lua)?;
    let handler_src = ex
        .extract(&handler, &format!("handler of stage '{name}'"))
        .map_err(|e| rt(e.to_string()))?;
    let init_src = match &init {
        Some(f) => Some(
            ex.extract(f, &format!("init of stage '{name}'"))
                .map_err(|e| rt(e.to_string()))?,
        ),
        None => None,
    };
    let code = Arc::new(StageCode {
        name: name.clone(),
        handler: handler_src,
        init: init_src,
        package_path: lock(&shared).package_path.clone(),
    });
    let stage = stage_from_code(name.clone(), code);
    let stage = if serial { stage.serial() } else { stage };
    let stage = if field::<Option<bool>>(def, "fail_stop")?.unwrap_or(false) {
        stage.fail_stop()
    } else {
        stage
    };
    let stage = if field::<Option<bool>>(def, "nonblocking")?.unwrap_or(false) {
        stage.nonblocking()
    } else {
        stage
    };
    let stage = match field::<Option<usize>>(def, "maxpar")? {
        Some(n) => stage.maxpar(n),
        None => stage,
    };
    let stage = match field::<Option<usize>>(def, "capacity")? {
        Some(n) => stage.capacity(n),
        None => stage,
    };
    for pair in def.pairs::<mlua::Value, mlua::Value>() {
        let (k, v) = pair?;
        let mlua::Value::String(k) = k else { continue };
        let k = k.to_str()?.to_string();
        if matches!(
            k.as_str(),
            "handler"
                | "init"
                | "bind"
                | "serial"
                | "fail_stop"
                | "nonblocking"
                | "stateful"
                | "autostart"
                | "name"
                | "maxpar"
                | "capacity"
        ) {
            continue;
        }
        let v = to_value(&v, &format!("attribute '{k}'"))
            .map_err(|e| rt(format!("stage '{name}': {e}")))?;
        stage.set_attr(k, v);
    }
    match def.get::<mlua::Value>("autostart")? {
        mlua::Value::Nil | mlua::Value::Boolean(false) => {}
        mlua::Value::Boolean(true) => stage.push(Event::new()),
        mlua::Value::Table(t) => {
            let args: Vec<mlua::Value> = t.sequence_values().collect::<mlua::Result<_>>()?;
            let values = args_to_values(&args, "autostart ")
                .map_err(|e| rt(format!("stage '{name}': {e}")))?;
            stage.push(Event::from_values(values));
        }
        other => {
            let v =
                to_value(&other, "autostart").map_err(|e| rt(format!("stage '{name}': {e}")))?;
            stage.push(Event::from_values([v]));
        }
    }
    let stage = match bind {
        Some(f) => {
            let lua = lua.clone();
            stage.bind(move |b: &leda_core::stage::BindCtx<'_>| {
                let go = || -> mlua::Result<()> {
                    let this = lua.create_table()?;
                    for (k, v) in b
                        .attrs
                        .iter()
                        .filter(|(k, _)| *k != crate::remote::CODE_ATTR)
                    {
                        this.set(k, to_lua(&lua, v).map_err(|e| rt(e.to_string()))?)?;
                    }
                    this.set("name", b.name)?;
                    let outputs = lua.create_table()?;
                    for p in b.outputs {
                        match p {
                            Port::Index(i) => outputs.set(*i, true)?,
                            Port::Name(n) => outputs.set(&**n, true)?,
                        }
                    }
                    f.call::<()>((this, outputs))
                };
                go().map_err(|e| lua_message(&e))
            })
        }
        None => stage,
    };
    Ok(LuaStage(stage))
}

pub(super) fn default_name(handler: &Function, shared: &Mutex<Shared>) -> String {
    let info = handler.info();
    let stem = info
        .source
        .as_deref()
        .and_then(|s| s.strip_prefix('@'))
        .and_then(|p| Path::new(p).file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "stage".to_owned());
    let line = info.line_defined.unwrap_or(0);
    let names = &lock(shared).names;
    if !names.contains(&stem) {
        return stem;
    }
    let mut candidate = format!("{stem}:{line}");
    let mut i = 2;
    while names.contains(&candidate) {
        candidate = format!("{stem}:{line}#{i}");
        i += 1;
    }
    candidate
}

pub(super) fn extractor(lua: &Lua) -> mlua::Result<Extractor<'_>> {
    let shared = shared_of(lua)?;
    let libs_t: Table = lua.named_registry_value("leda.libs")?;
    let mut libs = Vec::new();
    for pair in libs_t.pairs::<String, Table>() {
        libs.push(pair?);
    }
    Ok(Extractor {
        lua,
        debug: lua.named_registry_value("leda.debug")?,
        leda: lua.named_registry_value("leda.module")?,
        libs,
        texts: lock(&shared).texts.clone(),
    })
}

pub(super) fn stage_ctor(
    lua: &Lua,
    arg: mlua::Value,
    name: Option<String>,
) -> mlua::Result<mlua::Value> {
    match arg {
        mlua::Value::Table(def) => make_stage(lua, &def, name).and_then(|s| lua.pack(s)),
        mlua::Value::Function(f) => {
            let def = lua.create_table()?;
            def.set("handler", f)?;
            make_stage(lua, &def, name).and_then(|s| lua.pack(s))
        }
        mlua::Value::UserData(ud) if name.is_some() => {
            let s = ud.borrow::<LuaStage>()?.0.clone();
            let n = name.unwrap_or_default();
            let sh = shared_of(lua)?;
            lock(&sh).names.insert(n.clone());
            let clone = s.clone_as(n);
            if let Some(code) = code_of(&s) {
                remember(&clone, &code);
            }
            lua.pack(LuaStage(clone))
        }
        mlua::Value::String(s) if name.is_none() => {
            let n = s.to_str()?.to_string();
            let f = lua.create_function(move |lua, arg: mlua::Value| {
                stage_ctor(lua, arg, Some(n.clone()))
            })?;
            Ok(mlua::Value::Function(f))
        }
        other => Err(rt(format!(
            "leda.stage takes a table, a function or a name, not a {}",
            other.type_name()
        ))),
    }
}

pub(super) fn graph_ctor(
    lua: &Lua,
    arg: mlua::Value,
    name: Option<String>,
) -> mlua::Result<mlua::Value> {
    match arg {
        mlua::Value::String(s) if name.is_none() => {
            let n = s.to_str()?.to_string();
            let f = lua.create_function(move |lua, arg: mlua::Value| {
                graph_ctor(lua, arg, Some(n.clone()))
            })?;
            Ok(mlua::Value::Function(f))
        }
        mlua::Value::Table(t) => {
            let mut name = name.or(t.get::<Option<String>>("name")?);
            let mut g = Graph::new("graph");
            for (i, v) in t.sequence_values::<mlua::Value>().enumerate() {
                let v = v?;
                if let (0, mlua::Value::String(s)) = (i, &v) {
                    name = Some(s.to_str()?.to_string());
                    continue;
                }
                add_to_graph(&mut g, &v)?;
            }
            if let Some(s) = t.get::<Option<mlua::Value>>("start")? {
                add_to_graph(&mut g, &s)?;
            }
            if let Some(n) = name {
                let mut named = Graph::new(n);
                for s in g.stages() {
                    named.add(s);
                }
                for c in g.connectors() {
                    named.connect(&c.from, c.port.clone(), &c.to).kind(c.kind);
                }
                g = named;
            }
            lua.pack(LuaGraph(Arc::new(Mutex::new(g))))
        }
        other => Err(rt(format!(
            "leda.graph takes a table or a name, not a {}",
            other.type_name()
        ))),
    }
}
