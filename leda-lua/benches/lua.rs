//! `cargo bench -p leda-lua --bench lua`
//!
//! * `lua-pipeline`: events/s through a 3-stage Lua pipeline (generator → transient
//!   doubler → serial counter), with `rust=` the same pipeline with Rust handlers;
//! * `lua-spawn`: µs to create an instance (a fresh Lua state with the base library
//!   and the leda API) and run `init`, with `all_libs=` the same with every standard
//!   library opened (what the thesis' lazy `require` saves);
//! * `lua-b1-page`: pages/s of the thesis' Listing B.1 dynamic page (a 30,000-step loop
//!   building ~319 KB of HTML) executed per event by a Lua stage, with `rust=` the same
//!   page built by a Rust stage.
//!
//! Each comparison alternates ours and the peer after a warm-up and reports medians.

use std::time::Instant;

use leda_core::prelude::*;
use leda_core::stage::Attrs;
use leda_lua::instance::{LuaInstance, StageCode};
use leda_lua::script::{Script, ScriptOptions};
use leda_lua::source::FnSource;

const N: usize = 100_000;
const PAGES: usize = 200;
const ROUNDS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn lua_pipeline() -> f64 {
    let script = Script::new(ScriptOptions {
        threads: Some(2),
        ..ScriptOptions::default()
    })
    .expect("state");
    let code = format!(
        r#"
        local N = {N}
        local gen = leda.stage{{ handler = function() for i = 1, N do leda.send(1, i) end end, autostart = true }}
        local double = leda.stage{{ handler = function(x) leda.send(1, 2 * x) end, capacity = N }}
        local count = leda.stage{{
          init = function() n = 0 end,
          handler = function(x) n = n + 1; if n == N then leda.quit(n) end end,
          serial = true, capacity = N }}
        local t0 = leda.gettime()
        leda.graph{{ gen:connect(double), double:connect(count) }}:run()
        return N / (leda.gettime() - t0)
    "#
    );
    let out = script.run_str(&code, "=bench").expect("pipeline");
    out.into_vec()[0].as_f64().unwrap_or(0.0)
}

fn rust_pipeline() -> f64 {
    let gen_ = Stage::new("gen", |_: Event, ctx: &mut Ctx| {
        for i in 1..=N as i64 {
            ctx.send(1, i)?;
        }
        Ok(())
    })
    .autostart(Event::new());
    let double = Stage::new("double", |ev: Event, ctx: &mut Ctx| {
        let x: i64 = ev.get(0)?;
        ctx.send(1, 2 * x)?;
        Ok(())
    })
    .capacity(N);
    let count = Stage::stateful(
        "count",
        |_| Ok(0usize),
        |n: &mut usize, _: Event, ctx: &mut Ctx| {
            *n += 1;
            if *n == N {
                ctx.quit(*n as i64);
            }
            Ok(())
        },
    )
    .serial()
    .capacity(N);
    let mut g = Graph::new("rust");
    g.connect(&gen_, 1, &double);
    g.connect(&double, 1, &count);
    let t0 = Instant::now();
    g.run(Run::default().threads(2)).expect("run");
    N as f64 / t0.elapsed().as_secs_f64()
}

fn spawn(all_libs: bool) -> f64 {
    let code = StageCode {
        name: "spawn".into(),
        handler: FnSource::from_text("=handler", "function(x) leda.send(1, x) end"),
        init: Some(FnSource::from_text(
            "=init",
            "function() require 'string'; count = 0 end",
        )),
        package_path: "./?.lua".into(),
    };
    let attrs = Attrs::default();
    let n = 2000;
    let t0 = Instant::now();
    for _ in 0..n {
        let i = LuaInstance::new(&code, &attrs).expect("instance");
        if all_libs {
            i.lua().load_std_libs(mlua::StdLib::ALL_SAFE).expect("libs");
        }
        std::hint::black_box(i);
    }
    t0.elapsed().as_secs_f64() * 1e6 / n as f64
}

const B1: &str = r#"
local table = require "table"
local function page()
  local ret = {
  [[<html>
  <head>
    <title>CGILua loop test</title>
  </head>
  <body>
  <p>Executes a long loop, used by concurrency tests</p>]]}

  for i = 1, 30000 do
    table.insert(ret, (i .. '<br/>\n'))
  end

  table.insert(ret, [[
  </body>
  </html>]])

  return table.concat(ret)
end
"#;

fn lua_b1() -> f64 {
    let script = Script::new(ScriptOptions {
        threads: Some(2),
        ..ScriptOptions::default()
    })
    .expect("state");
    let code = format!(
        r#"{B1}
        local P = {PAGES}
        local cgi = leda.stage{{ handler = function() leda.send(1, #page()) end }}
        local done = leda.stage{{
          init = function() n = 0 end,
          handler = function(len) n = n + 1; if n == P then leda.quit(len) end end,
          serial = true }}
        for i = 1, P do cgi:push(i) end
        local t0 = leda.gettime()
        local len = leda.graph{{ cgi:connect(done) }}:run()
        assert(len > 300000, len)
        return P / (leda.gettime() - t0)
    "#
    );
    let out = script.run_str(&code, "=b1").expect("b1");
    out.into_vec()[0].as_f64().unwrap_or(0.0)
}

fn rust_b1() -> f64 {
    let cgi = Stage::new("cgi", |_: Event, ctx: &mut Ctx| {
        let mut ret = vec![String::from(
            "<html>\n  <head>\n    <title>CGILua loop test</title>\n  </head>\n  <body>\n  <p>Executes a long loop, used by concurrency tests</p>",
        )];
        for i in 1..=30000 {
            ret.push(format!("{i}<br/>\n"));
        }
        ret.push("\n  </body>\n  </html>".into());
        ctx.send(1, ret.concat().len())?;
        Ok(())
    });
    let done = Stage::stateful(
        "done",
        |_| Ok(0usize),
        |n: &mut usize, ev: Event, ctx: &mut Ctx| {
            *n += 1;
            if *n == PAGES {
                ctx.quit(ev.get::<i64>(0)?);
            }
            Ok(())
        },
    )
    .serial();
    for i in 0..PAGES {
        cgi.push(i);
    }
    let mut g = Graph::new("b1");
    g.connect(&cgi, 1, &done);
    let t0 = Instant::now();
    g.run(Run::default().threads(2)).expect("run");
    PAGES as f64 / t0.elapsed().as_secs_f64()
}

fn compare(ours: impl Fn() -> f64, peer: impl Fn() -> f64) -> (f64, f64) {
    ours();
    peer();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        a.push(ours());
        b.push(peer());
    }
    (median(a), median(b))
}

fn main() {
    let (ours, rust) = compare(lua_pipeline, rust_pipeline);
    println!("BENCH lua-pipeline unit=events/s better=higher ours={ours:.0} rust={rust:.0}");
    let (ours, all) = compare(|| spawn(false), || spawn(true));
    println!("BENCH lua-spawn unit=us better=lower ours={ours:.1} all_libs={all:.1}");
    let (ours, rust) = compare(lua_b1, rust_b1);
    println!("BENCH lua-b1-page unit=pages/s better=higher ours={ours:.1} rust={rust:.1}");
}
