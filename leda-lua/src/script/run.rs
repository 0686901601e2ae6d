//! Running from a script: `graph:run{...}` (in this process, or deployed to daemons),
//! `leda.start{...}` (this process becomes a daemon) and the controller modules. Owns
//! the translation of run options into leda-core's `Run` and leda-net's launcher; it
//! does not build graphs.

use std::time::Duration;

use leda_core::controller::{Auto, Fixed};
use leda_core::prelude::*;
use mlua::{Lua, MultiValue, Table};

use crate::value::to_lua;

use super::*;

pub(super) fn run_graph(lua: &Lua, g: &LuaGraph, opts: Option<Table>) -> mlua::Result<MultiValue> {
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
            None => {
                crate::remote::this_process(&mapped, options.secret.as_ref(), options.tls.as_ref())
                    .map_err(|e| rt(e.to_string()))?
            }
        };
        let launch = crate::remote::LaunchOptions {
            me,
            secret: options.secret.clone(),
            until_idle,
            tls: options.tls.clone(),
        };
        let launched =
            crate::remote::launch(&graph, run, &launch).map_err(|e| rt(e.to_string()))?;
        for peer in &launched.peers {
            record_failures(&shared, &peer.name, &peer.snapshot);
        }
        launched.run
    } else {
        if until_idle {
            run = run.until_idle();
        }
        if let Some(me) = me.filter(|_| !mapped.is_empty()) {
            run = run.process(me);
        }
        graph.run(run).map_err(|e| rt(e.to_string()))?
    };
    record_failures(&shared, "this process", &report.stats);
    let mut out = Vec::new();
    if let Some(ev) = report.quit {
        for v in ev.args() {
            out.push(to_lua(lua, v).map_err(|e| rt(e.to_string()))?);
        }
    }
    Ok(MultiValue::from_vec(out))
}

/// Notes the stages of `process` whose handlers failed in a run.
fn record_failures(shared: &Mutex<Shared>, process: &str, stats: &leda_core::stats::Snapshot) {
    lock(shared).failures.extend(stats.failures(process));
}

/// `graph:run{on_process_loss = 'end' | 'continue', notify = 'stage'}`: what the run
/// does when one of its processes is lost ([`leda_core::runtime::OnProcessLoss`];
/// `notify` names the stage told of each loss under `'continue'`).
pub(super) fn process_loss(o: &Table) -> mlua::Result<leda_core::runtime::OnProcessLoss> {
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

/// `leda.start{controller=, maxpar=, host=, port=}` (Listing 4.6): serves one
/// deployment and returns the `quit` values of its run.
pub(super) fn start(lua: &Lua, opts: Option<Table>) -> mlua::Result<MultiValue> {
    let options = options_of(lua);
    let mut host = "127.0.0.1".to_owned();
    let mut port = i64::from(leda_net::daemon::DEFAULT_PORT);
    let mut threads = options.threads;
    let mut auto_threads = None;
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
                LuaController::Auto(min, max) => auto_threads = Some((*min, *max)),
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
        auto_threads,
        secret: options.secret.clone(),
        dashboard: options.dashboard.clone(),
        maxpar,
        tls: options.tls.clone(),
    };
    let quit = crate::remote::serve(&daemon, false, |addr| {
        // A closed stdout is not this daemon's failure.
        let _ = leda_core::cli::announce_listening(addr);
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

pub(super) fn controller_module(lua: &Lua, auto: bool) -> mlua::Result<Table> {
    // The commands' bound (`--threads`): a script asking for thousands got them.
    let bounded = |n: usize, what: &str| {
        let max = leda_core::cli::max_threads();
        if n > max {
            Err(mlua::Error::runtime(format!(
                "{what}: at most {max} threads (64, or 4 per CPU), not {n}"
            )))
        } else {
            Ok(n.max(1))
        }
    };
    let t = lua.create_table()?;
    if auto {
        t.set(
            "get",
            lua.create_function(move |_, (a, b): (Option<usize>, Option<usize>)| {
                let what = "leda.controller.auto.get";
                let min = bounded(a.unwrap_or_else(num_cpus::get), what)?;
                let max = bounded(b.unwrap_or_else(leda_core::cli::max_threads), what)?.max(min);
                Ok(LuaController::Auto(min, max))
            })?,
        )?;
    } else {
        t.set(
            "get",
            lua.create_function(move |_, n: Option<usize>| {
                let n = bounded(
                    n.unwrap_or_else(num_cpus::get),
                    "leda.controller.thread_pool.get",
                )?;
                Ok(LuaController::Fixed(n))
            })?,
        )?;
    }
    Ok(t)
}
