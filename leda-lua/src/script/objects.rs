//! The graph objects a script holds: stages, connectors, clusters, graphs and
//! controllers as Lua userdata, with their methods and operators (`s1 .. s2`,
//! `cluster + cluster`, `graph:part`, `graph:map`...). Owns the conversion of Lua
//! arguments to leda-core's graph types; running a graph is `run`'s.

use std::sync::{Arc, Mutex};

use leda_core::connector::ConnectorKind;
use leda_core::graph::Processes;
use leda_core::prelude::*;
use mlua::{AnyUserData, Lua, MetaMethod, MultiValue, Table, UserData, UserDataMethods};

use crate::value::{args_to_values, to_lua, to_value};

use super::*;

/// A stage object in a script.
#[derive(Clone, Debug)]
pub struct LuaStage(pub Stage);

/// A connector object (`leda.connect` result).
#[derive(Clone, Debug)]
pub struct LuaConnector {
    from: Stage,
    port: Port,
    to: Stage,
    kind: ConnectorKind,
}

/// A cluster object.
#[derive(Clone, Debug)]
pub struct LuaCluster(pub Cluster);

/// A graph object.
#[derive(Clone, Debug)]
pub struct LuaGraph(pub Arc<Mutex<Graph>>);

/// A controller object.
#[derive(Clone, Debug)]
pub enum LuaController {
    /// `thread_pool.get(n)`.
    Fixed(usize),
    /// `auto.get(min, max)`.
    Auto(usize, usize),
}

impl UserData for LuaController {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| Ok(format!("{this:?}")));
    }
}

pub(super) fn graph_of(g: &LuaGraph) -> std::sync::MutexGuard<'_, Graph> {
    g.0.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn to_port(v: &mlua::Value) -> mlua::Result<Port> {
    match v {
        mlua::Value::Integer(i) => Ok(Port::Index(*i)),
        mlua::Value::Number(n) if n.fract() == 0.0 && n.is_finite() => Ok(Port::Index(*n as i64)),
        mlua::Value::String(s) => Ok(Port::from(s.to_str()?.to_string())),
        other => Err(rt(format!(
            "a port is a number or a string, not a {}",
            other.type_name()
        ))),
    }
}

pub(super) fn to_kind(v: Option<&mlua::Value>) -> mlua::Result<ConnectorKind> {
    match v {
        None | Some(mlua::Value::Nil) => Ok(ConnectorKind::Decoupled),
        Some(mlua::Value::String(s)) => match &*s.to_str()? {
            "local" | "coupled" => Ok(ConnectorKind::Local),
            "decoupled" => Ok(ConnectorKind::Decoupled),
            "cohort" => Ok(ConnectorKind::Cohort),
            other => Err(rt(format!(
                "unknown connector type '{other}' (local, decoupled or cohort)"
            ))),
        },
        Some(other) => Err(rt(format!(
            "a connector type is a string, not a {}",
            other.type_name()
        ))),
    }
}

pub(super) fn as_stage(v: &mlua::Value) -> Option<Stage> {
    match v {
        mlua::Value::UserData(ud) => ud.borrow::<LuaStage>().ok().map(|s| s.0.clone()),
        _ => None,
    }
}

/// `(port, dest, type)`, `(dest)`, `(dest, type)`: the connect argument forms.
pub(super) fn connector(from: Stage, args: &[mlua::Value]) -> mlua::Result<LuaConnector> {
    let (port, dest, kind) = match args.first().and_then(as_stage) {
        Some(dest) => (Port::DEFAULT, dest, to_kind(args.get(1))?),
        None => {
            let port = match args.first() {
                None | Some(mlua::Value::Nil) => Port::DEFAULT,
                Some(p) => to_port(p)?,
            };
            let dest = args
                .get(1)
                .and_then(as_stage)
                .ok_or_else(|| rt("connect: the destination must be a stage"))?;
            (port, dest, to_kind(args.get(2))?)
        }
    };
    Ok(LuaConnector {
        from,
        port,
        to: dest,
        kind,
    })
}

pub(super) fn to_cluster(v: &mlua::Value) -> mlua::Result<Cluster> {
    if let Some(s) = as_stage(v) {
        return Ok(Cluster::of([&s]));
    }
    if let mlua::Value::UserData(ud) = v
        && let Ok(c) = ud.borrow::<LuaCluster>()
    {
        return Ok(c.0.clone());
    }
    Err(rt(format!(
        "expected a stage or a cluster, got a {}",
        v.type_name()
    )))
}

pub(super) fn cluster_ops<T, M: UserDataMethods<T>>(m: &mut M) {
    m.add_meta_function(MetaMethod::Add, |_, (a, b): (mlua::Value, mlua::Value)| {
        Ok(LuaCluster(&to_cluster(&a)? + &to_cluster(&b)?))
    });
    m.add_meta_function(MetaMethod::Sub, |_, (a, b): (mlua::Value, mlua::Value)| {
        Ok(LuaCluster(&to_cluster(&a)? - &to_cluster(&b)?))
    });
    m.add_meta_function(MetaMethod::Mul, |_, (a, b): (mlua::Value, mlua::Value)| {
        Ok(LuaCluster(&to_cluster(&a)? * &to_cluster(&b)?))
    });
}

impl UserData for LuaStage {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_method("connect", |_, this, args: MultiValue| {
            connector(this.0.clone(), &args.into_vec())
        });
        let push = |_: &Lua, this: &LuaStage, args: MultiValue| {
            let values = args_to_values(&args.into_vec(), "push ")
                .map_err(|e| rt(format!("stage '{}': {e}", this.0.name())))?;
            this.0.push(Event::from_values(values));
            Ok(())
        };
        m.add_method("push", push);
        m.add_method("send", push);
        m.add_function("run", |lua, (this, opts): (AnyUserData, Option<Table>)| {
            let s = this.borrow::<LuaStage>()?.0.clone();
            let mut g = Graph::new(s.name());
            g.add(&s);
            let g = LuaGraph(Arc::new(Mutex::new(g)));
            run_graph(lua, &g, opts)
        });
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(this.0.name().to_owned())
        });
        m.add_meta_method(MetaMethod::Index, |lua, this, key: String| {
            Ok(match key.as_str() {
                "name" => mlua::Value::String(lua.create_string(this.0.name())?),
                "serial" => mlua::Value::Boolean(this.0.is_serial()),
                "nonblocking" => mlua::Value::Boolean(this.0.is_nonblocking()),
                _ => match this.0.attrs().get(&key) {
                    Some(v) => to_lua(lua, v).map_err(|e| rt(e.to_string()))?,
                    None => mlua::Value::Nil,
                },
            })
        });
        m.add_meta_method(
            MetaMethod::NewIndex,
            |_, this, (key, value): (String, mlua::Value)| {
                match key.as_str() {
                    "name" | "handler" | "init" | "bind" => {
                        return Err(rt(format!(
                            "stage '{}': '{key}' cannot be changed after the stage is built",
                            this.0.name()
                        )));
                    }
                    "serial" if value.as_boolean() == Some(true) => {
                        let _ = this.0.clone().serial();
                    }
                    _ => {
                        let v = to_value(&value, &format!("attribute '{key}'"))
                            .map_err(|e| rt(format!("stage '{}': {e}", this.0.name())))?;
                        this.0.set_attr(key, v);
                    }
                }
                Ok(())
            },
        );
        m.add_meta_function(
            MetaMethod::Concat,
            |_, (a, b): (mlua::Value, mlua::Value)| {
                let from = as_stage(&a).ok_or_else(|| rt("'..' connects two stages"))?;
                connector(from, &[b])
            },
        );
        cluster_ops(m);
    }
}

impl UserData for LuaConnector {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_meta_method(MetaMethod::ToString, |_, c, ()| {
            Ok(format!(
                "{}.{} -> {} ({})",
                c.from.name(),
                c.port,
                c.to.name(),
                c.kind
            ))
        });
    }
}

impl UserData for LuaCluster {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_meta_method(MetaMethod::ToString, |_, c, ()| Ok(c.0.to_string()));
        m.add_meta_method(MetaMethod::Len, |_, c, ()| Ok(c.0.len()));
        m.add_method("contains", |_, c, s: mlua::Value| {
            Ok(as_stage(&s).is_some_and(|s| c.0.contains(&s)))
        });
        cluster_ops(m);
    }
}

pub(super) fn add_to_graph(g: &mut Graph, v: &mlua::Value) -> mlua::Result<()> {
    match v {
        mlua::Value::UserData(ud) => {
            if let Ok(c) = ud.borrow::<LuaConnector>() {
                g.connect(&c.from, c.port.clone(), &c.to).kind(c.kind);
                return Ok(());
            }
            if let Ok(s) = ud.borrow::<LuaStage>() {
                g.add(&s.0);
                return Ok(());
            }
            if let Ok(c) = ud.borrow::<LuaCluster>() {
                for s in c.0.stages() {
                    g.add(s);
                }
                return Ok(());
            }
            Err(rt("a graph holds stages and connectors"))
        }
        mlua::Value::Table(t) => {
            for v in t.sequence_values::<mlua::Value>() {
                add_to_graph(g, &v?)?;
            }
            Ok(())
        }
        other => Err(rt(format!(
            "a graph holds stages and connectors, not a {}",
            other.type_name()
        ))),
    }
}

pub(super) fn processes(v: &mlua::Value, o: &ScriptOptions) -> mlua::Result<Processes> {
    match v {
        mlua::Value::String(s) => Ok(Processes::from(o.resolve(&s.to_str()?))),
        mlua::Value::Table(t) => {
            let mut out = Vec::new();
            for a in t.sequence_values::<String>() {
                out.push(o.resolve(&a?));
            }
            Ok(Processes(out))
        }
        other => Err(rt(format!(
            "map takes \"host:port\" strings (or lists of them), not a {}",
            other.type_name()
        ))),
    }
}

impl UserData for LuaGraph {
    fn add_methods<M: UserDataMethods<Self>>(m: &mut M) {
        m.add_function("add", |_, (this, items): (AnyUserData, MultiValue)| {
            {
                let g = this.borrow::<LuaGraph>()?;
                let mut g = graph_of(&g);
                for v in items.iter() {
                    add_to_graph(&mut g, v)?;
                }
            }
            Ok(this)
        });
        m.add_method("all", |_, this, ()| Ok(LuaCluster(graph_of(this).all())));
        m.add_function("part", |_, (this, items): (AnyUserData, MultiValue)| {
            {
                let g = this.borrow::<LuaGraph>()?;
                let clusters = items
                    .iter()
                    .map(to_cluster)
                    .collect::<mlua::Result<Vec<_>>>()?;
                graph_of(&g).part(clusters).map_err(|e| rt(e.to_string()))?;
            }
            Ok(this)
        });
        m.add_function("map", |lua, (this, items): (AnyUserData, MultiValue)| {
            {
                let g = this.borrow::<LuaGraph>()?;
                let o = options_of(lua);
                let procs = items
                    .iter()
                    .map(|v| processes(v, &o))
                    .collect::<mlua::Result<Vec<_>>>()?;
                graph_of(&g).map(procs).map_err(|e| rt(e.to_string()))?;
            }
            Ok(this)
        });
        m.add_method("verify", |_, this, ()| {
            let g = graph_of(this).clone();
            g.verify().map(|_| true).map_err(|e| rt(e.to_string()))
        });
        m.add_method("dot", |_, this, ()| Ok(graph_of(this).to_dot()));
        m.add_method("count_stages", |_, this, ()| {
            Ok(graph_of(this).stages().len())
        });
        m.add_method("count_connectors", |_, this, ()| {
            Ok(graph_of(this).connectors().len())
        });
        m.add_method("stages", |_, this, ()| {
            Ok(graph_of(this)
                .stages()
                .iter()
                .map(|s| LuaStage(s.clone()))
                .collect::<Vec<_>>())
        });
        m.add_method("run", |lua, this, opts: Option<Table>| {
            run_graph(lua, this, opts)
        });
        m.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(graph_of(this).name().to_owned())
        });
    }
}
