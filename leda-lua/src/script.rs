//! The configuring side: a script runs in a "configuring" Lua state (all standard
//! libraries) where `require 'leda'` gives the thesis' graph API:
//!
//! * `leda.stage{handler=, init=, bind=, serial=, autostart=, name=, <attributes>}`,
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

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leda_core::connector::ConnectorKind;
use leda_core::controller::{Auto, Fixed};
use leda_core::graph::Processes;
use leda_core::prelude::*;
use mlua::{
    AnyUserData, Function, Lua, LuaOptions, MetaMethod, MultiValue, StdLib, Table, UserData,
    UserDataMethods, Variadic,
};

use crate::error::{ScriptError, lua_message};
use crate::instance::{StageCode, code_of, remember, stage_from_code, unpack};
use crate::source::Extractor;
use crate::value::{args_to_values, to_lua, to_value};

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

#[derive(Default)]
struct Shared {
    graphs: Vec<Graph>,
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

fn graph_of(g: &LuaGraph) -> std::sync::MutexGuard<'_, Graph> {
    g.0.lock().unwrap_or_else(|e| e.into_inner())
}

fn to_port(v: &mlua::Value) -> mlua::Result<Port> {
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

fn to_kind(v: Option<&mlua::Value>) -> mlua::Result<ConnectorKind> {
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

fn as_stage(v: &mlua::Value) -> Option<Stage> {
    match v {
        mlua::Value::UserData(ud) => ud.borrow::<LuaStage>().ok().map(|s| s.0.clone()),
        _ => None,
    }
}

/// `(port, dest, type)`, `(dest)`, `(dest, type)`: the connect argument forms.
fn connector(from: Stage, args: &[mlua::Value]) -> mlua::Result<LuaConnector> {
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

fn to_cluster(v: &mlua::Value) -> mlua::Result<Cluster> {
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

fn cluster_ops<T, M: UserDataMethods<T>>(m: &mut M) {
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

fn add_to_graph(g: &mut Graph, v: &mlua::Value) -> mlua::Result<()> {
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

fn processes(v: &mlua::Value, o: &ScriptOptions) -> mlua::Result<Processes> {
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

fn shared_of(lua: &Lua) -> mlua::Result<Arc<Mutex<Shared>>> {
    lua.app_data_ref::<Arc<Mutex<Shared>>>()
        .map(|s| s.clone())
        .ok_or_else(|| rt("not a configuring state"))
}

fn run_graph(lua: &Lua, g: &LuaGraph, opts: Option<Table>) -> mlua::Result<MultiValue> {
    let options = options_of(lua);
    let graph = graph_of(g).clone();
    let shared = shared_of(lua)?;
    if options.mode == Mode::Check {
        graph.verify().map_err(|e| rt(e.to_string()))?;
        lock(&shared).graphs.push(graph);
        return Ok(MultiValue::new());
    }
    let mut run = Run::default();
    if let Some(n) = options.threads {
        run = run.threads(n);
    }
    if let Some(d) = &options.dashboard {
        run = run.dashboard(d.addr.clone());
        if let Some(t) = &d.token {
            run = run.dashboard_token(t.clone());
        }
    }
    let mut until_idle = options.until_idle;
    let mut host: Option<String> = None;
    let mut port: Option<i64> = None;
    if let Some(o) = &opts {
        match o.get::<mlua::Value>("controller")? {
            mlua::Value::Nil => {}
            mlua::Value::UserData(ud) => match &*ud.borrow::<LuaController>()? {
                LuaController::Fixed(n) => run = run.controller(Fixed::new(*n)),
                LuaController::Auto(a, b) => run = run.controller(Auto::new(*a, *b)),
            },
            other => {
                return Err(rt(format!(
                    "controller: not a controller ({})",
                    other.type_name()
                )));
            }
        }
        if let Some(n) = o.get::<Option<usize>>("maxpar")? {
            run = run.maxpar(n);
        }
        if let Some(b) = o.get::<Option<bool>>("until_idle")? {
            until_idle = b;
        }
        if let Some(t) = o.get::<Option<f64>>("timeout")?
            && t.is_finite()
            && t > 0.0
        {
            run = run.timeout(Duration::from_secs_f64(t));
        }
        host = o.get("host")?;
        port = o.get("port")?;
        run = run.on_process_loss(process_loss(o)?);
    }
    let mapped: Vec<String> = graph
        .mapping()
        .map(|m| m.iter().flat_map(|p| p.0.iter().cloned()).collect())
        .unwrap_or_default();
    let me = match (host, port) {
        (Some(h), p) => Some(options.resolve(&format!(
            "{h}:{}",
            p.unwrap_or(i64::from(leda_net::daemon::DEFAULT_PORT))
        ))),
        (None, Some(p)) => Some(options.resolve(&format!("127.0.0.1:{p}"))),
        (None, None) => options.process.as_deref().map(|p| options.resolve(p)),
    };
    lock(&shared).graphs.push(graph.clone());
    let report = if mapped.len() > 1 {
        // Other processes run the other clusters: deploy them (leda-net).
        let me = match me {
            Some(me) => me,
            None => crate::remote::this_process(&mapped, options.secret.as_ref())
                .map_err(|e| rt(e.to_string()))?,
        };
        let launch = crate::remote::LaunchOptions {
            me,
            secret: options.secret.clone(),
            until_idle,
        };
        crate::remote::launch(&graph, run, &launch).map_err(|e| rt(e.to_string()))?
    } else {
        if until_idle {
            run = run.until_idle();
        }
        if let Some(me) = me.filter(|_| !mapped.is_empty()) {
            run = run.process(me);
        }
        graph.run(run).map_err(|e| rt(e.to_string()))?
    };
    let mut out = Vec::new();
    if let Some(ev) = report.quit {
        for v in ev.args() {
            out.push(to_lua(lua, v).map_err(|e| rt(e.to_string()))?);
        }
    }
    Ok(MultiValue::from_vec(out))
}

/// `graph:run{on_process_loss = 'end' | 'continue', notify = 'stage'}`: what the run
/// does when one of its processes is lost ([`leda_core::runtime::OnProcessLoss`];
/// `notify` names the stage told of each loss under `'continue'`).
fn process_loss(o: &Table) -> mlua::Result<leda_core::runtime::OnProcessLoss> {
    use leda_core::runtime::OnProcessLoss;
    let notify = o.get::<Option<String>>("notify")?;
    match o.get::<Option<String>>("on_process_loss")?.as_deref() {
        None | Some("end") if notify.is_none() => Ok(OnProcessLoss::End),
        None | Some("end") => Err(rt(
            "notify= needs on_process_loss = 'continue' (the run ends on a loss by default)",
        )),
        Some("continue") => Ok(OnProcessLoss::Continue { notify }),
        Some(other) => Err(rt(format!(
            "on_process_loss: '{other}' is neither 'end' nor 'continue'"
        ))),
    }
}

/// Builds a stage from a definition table.
fn make_stage(lua: &Lua, def: &Table, name: Option<String>) -> mlua::Result<LuaStage> {
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
    let init: Option<Function> = def.get("init")?;
    let bind: Option<Function> = def.get("bind")?;
    let serial = def.get::<Option<bool>>("serial")?.unwrap_or(false)
        || def.get::<Option<bool>>("stateful")?.unwrap_or(false);
    let name = match name.or(def.get::<Option<String>>("name")?) {
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
    let stage = match def.get::<Option<usize>>("maxpar")? {
        Some(n) => stage.maxpar(n),
        None => stage,
    };
    let stage = match def.get::<Option<usize>>("capacity")? {
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

fn default_name(handler: &Function, shared: &Mutex<Shared>) -> String {
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

fn extractor(lua: &Lua) -> mlua::Result<Extractor<'_>> {
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

fn stage_ctor(lua: &Lua, arg: mlua::Value, name: Option<String>) -> mlua::Result<mlua::Value> {
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
                remember(&clone, code);
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

fn graph_ctor(lua: &Lua, arg: mlua::Value, name: Option<String>) -> mlua::Result<mlua::Value> {
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

/// `leda.start{controller=, maxpar=, host=, port=}` (Listing 4.6): serves one
/// deployment and returns the `quit` values of its run.
fn start(lua: &Lua, opts: Option<Table>) -> mlua::Result<MultiValue> {
    let options = options_of(lua);
    let mut host = "127.0.0.1".to_owned();
    let mut port = i64::from(leda_net::daemon::DEFAULT_PORT);
    let mut threads = options.threads;
    let mut maxpar = None;
    if let Some(o) = &opts {
        if let Some(h) = o.get::<Option<String>>("host")? {
            host = h;
        }
        if let Some(p) = o.get::<Option<i64>>("port")? {
            port = p;
        }
        match o.get::<mlua::Value>("controller")? {
            mlua::Value::Nil => {}
            mlua::Value::UserData(ud) => match &*ud.borrow::<LuaController>()? {
                LuaController::Fixed(n) => threads = Some(*n),
                LuaController::Auto(..) => {
                    return Err(rt(
                        "leda.start: a daemon runs a fixed pool; use require 'leda.controller.thread_pool'.get(n)",
                    ));
                }
            },
            other => {
                return Err(rt(format!(
                    "leda.start: controller: not a controller ({})",
                    other.type_name()
                )));
            }
        }
        maxpar = o.get::<Option<usize>>("maxpar")?;
    }
    if options.mode == Mode::Check {
        return Ok(MultiValue::new());
    }
    let daemon = crate::remote::DaemonOptions {
        listen: options.resolve(&format!("{host}:{port}")),
        threads,
        secret: options.secret.clone(),
        dashboard: options.dashboard.clone(),
        maxpar,
    };
    let quit = crate::remote::serve(&daemon, false, |addr| {
        eprintln!("leda: listening on {addr}, waiting for a graph");
    })
    .map_err(|e| rt(e.to_string()))?;
    let mut out = Vec::new();
    if let Some(ev) = quit {
        for v in ev.args() {
            out.push(to_lua(lua, v).map_err(|e| rt(e.to_string()))?);
        }
    }
    Ok(MultiValue::from_vec(out))
}

fn controller_module(lua: &Lua, auto: bool) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    if auto {
        t.set(
            "get",
            lua.create_function(|_, (a, b): (Option<usize>, Option<usize>)| {
                let min = a.unwrap_or_else(num_cpus::get).max(1);
                let max = b.unwrap_or(64.max(4 * num_cpus::get())).max(min);
                Ok(LuaController::Auto(min, max))
            })?,
        )?;
    } else {
        t.set(
            "get",
            lua.create_function(|_, n: Option<usize>| {
                Ok(LuaController::Fixed(n.unwrap_or_else(num_cpus::get).max(1)))
            })?,
        )?;
    }
    Ok(t)
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
}
