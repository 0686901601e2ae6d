//! Graphs mapped to two processes: a daemon (serving in a thread of this test, on an
//! ephemeral 127.0.0.1 port) runs the cluster a script deploys to it; Lua stages
//! travel as source text, Rust stages by their registered name.

mod common;

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::st;
use leda_core::prelude::*;
use leda_lua::remote::{self, DaemonOptions, RemoteError};
use leda_lua::script::{Script, ScriptOptions};
use leda_net::Secret;

/// This process's identity in the tests' mappings (the launcher does not listen).
const ME: &str = "127.0.0.1:7001";

type Served = JoinHandle<Result<Option<Event>, RemoteError>>;

fn daemon(secret: Option<&str>) -> (String, Served) {
    let (tx, rx) = mpsc::channel();
    let opts = DaemonOptions {
        listen: "127.0.0.1:0".into(),
        threads: Some(2),
        secret: secret.map(|s| Secret::new(s).expect("a long enough test secret")),
        ..DaemonOptions::default()
    };
    let h = std::thread::spawn(move || {
        remote::serve(&opts, false, |a| {
            let _ = tx.send(a);
        })
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the daemon binds");
    (addr.to_string(), h)
}

fn launcher(secret: Option<&str>) -> Script {
    Script::new(ScriptOptions {
        until_idle: true,
        threads: Some(2),
        process: Some(ME.into()),
        secret: secret.map(|s| Secret::new(s).expect("a long enough test secret")),
        ..ScriptOptions::default()
    })
    .expect("configuring state")
}

fn values(out: mlua::MultiValue) -> Vec<Value> {
    out.iter()
        .map(|v| leda_lua::value::to_value(v, "result").expect("plain result"))
        .collect()
}

/// Every stage but the sink runs in the daemon.
fn pipeline(daemon: &str) -> String {
    format!(
        r#"
        local offset = 100
        local function shift(x) return x + offset end
        local src = leda.stage "src" {{ handler = function(x) assert(leda.send(1, shift(x))) end }}
        local triple = require 'leda.stage.test.triple'
        local tag = leda.stage "tag" {{
          init = function() require 'string' end,
          handler = function(x) assert(leda.send(1, string.format("%s:%d", self.tag, x))) end,
          tag = "old" }}
        local sink = leda.stage "sink" {{ handler = function(s) leda.quit(s) end, serial = true }}
        local g = leda.graph{{ src:connect(triple), triple:connect(tag), tag:connect(sink) }}
        g:part(leda.cluster(src, triple, tag), leda.cluster(sink)):map("{daemon}", "{ME}")
        tag.tag = "new"   -- read when the run starts, in the daemon too
        src:push(2)
        return g:run()
    "#
    )
}

fn register_triple() {
    leda_lua::registry::register_stage("leda.stage.test.triple", Default::default(), || {
        Stage::new("triple", |ev: Event, ctx: &mut Ctx| {
            let x: i64 = ev.get(0)?;
            ctx.send(1, x * 3)?;
            Ok(())
        })
    });
}

#[test]
fn lua_and_rust_stages_run_in_the_daemon() {
    register_triple();
    let (addr, served) = daemon(None);
    let s = launcher(None);
    let out = common::run_in(&s, &pipeline(&addr)).expect("run across two processes");
    assert_eq!(values(out), vec![st("new:306")]);
    // The sink's quit ends the daemon's run too.
    let ended = served.join().expect("daemon thread");
    assert!(ended.is_ok(), "{ended:?}");
}

/// (Lua 5.4: `math.type` and `math.mininteger` tell what LuaJIT's numbers cannot.)
#[test]
#[cfg(not(feature = "luajit"))]
fn values_round_trip_through_another_process() {
    let (addr, served) = daemon(None);
    let s = launcher(None);
    let out = common::run_in(
        &s,
        &format!(
            r#"
        local function same(a, b)
          if type(a) ~= type(b) then return false end
          if type(a) == "number" then
            if a ~= a then return b ~= b end
            return math.type(a) == math.type(b) and a == b
          end
          if type(a) ~= "table" then return a == b end
          for k, v in pairs(a) do if not same(v, b[k]) then return false end end
          for k in pairs(b) do if a[k] == nil then return false end end
          return true
        end
        local function sample()
          return 42, 42.0, 0/0, -1/0, "\0\255 bytes", "héllo", true, {{}},
                 {{1, 2.5, "x", {{a = {{b = {{}}}}}}}}, {{[1] = "a", [3] = "c"}}, {{[1.5] = false, k = {{n = math.mininteger}}}}
        end
        local src = leda.stage "src" {{ init = function() require 'math' end, handler = function() assert(leda.send(1, sample())) end }}
        local echo = leda.stage "echo" {{ handler = function(...) assert(leda.send(1, select('#', ...), ...)) end }}
        local check = leda.stage "check" {{
          init = function() require 'math' end,
          handler = function(n, ...)
            local got, want = {{...}}, {{sample()}}
            local bad = {{}}
            for i = 1, 11 do if not same(got[i], want[i]) then bad[#bad + 1] = i end end
            leda.quit(n, #bad, unpack(bad))
          end,
          serial = true }}
        local g = leda.graph{{ src:connect(echo), echo:connect(check) }}
        g:part(leda.cluster(src, check), leda.cluster(echo)):map("{ME}", "{addr}")
        src:push()
        return g:run()
    "#
        ),
    )
    .expect("run");
    // 11 values went out and came back, none of them changed.
    assert_eq!(values(out), vec![Value::Int(11), Value::Int(0)]);
    assert!(served.join().expect("daemon thread").is_ok());
}

#[test]
fn secrets_and_unknown_stages_are_refused_before_running() {
    register_triple();
    // A stage that touches files (as `leda.stage.io.lines` does).
    let io = leda_lua::capabilities::Capabilities {
        io: true,
        ..Default::default()
    };
    leda_lua::registry::register_stage("leda.stage.test.files", io, || {
        Stage::new("files", |_: Event, _: &mut Ctx| Ok(()))
    });
    let (addr, served) = daemon(Some("the right secret, 16+"));
    // A wrong secret fails the handshake.
    let e = common::run_in(&launcher(Some("the wrong secret, 16+")), &pipeline(&addr))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("authentication") && e.contains("holds another one"),
        "{e}"
    );
    // A Rust stage the daemon does not know (registered after it started).
    leda_lua::registry::register_stage("leda.stage.test.late", Default::default(), || {
        Stage::new("late", |_: Event, _: &mut Ctx| Ok(()))
    });
    // A deployment of a source here and the stage `module` on the daemon: its error.
    let refused = |module: &str| {
        common::run_in(
            &launcher(Some("the right secret, 16+")),
            &format!(
                r#"
        local remote = require '{module}'
        local src = leda.stage "src" {{ handler = function() leda.send(1) end }}
        local g = leda.graph{{ src:connect(remote) }}
        g:part(leda.cluster(src), leda.cluster(remote)):map("{ME}", "{addr}")
        src:push()
        return g:run()
    "#
            ),
        )
        .unwrap_err()
        .to_string()
    };
    let e = refused("leda.stage.test.late");
    assert!(
        e.contains("refused the deployment") && e.contains("leda.stage.test.late"),
        "{e}"
    );
    // A stage that needs what the daemon does not allow (a deployment could read and
    // append to any file of the daemon's host through the stage library).
    let e = refused("leda.stage.test.files");
    assert!(
        e.contains("refused the deployment") && e.contains("needs io") && e.contains("--allow io"),
        "{e}"
    );
    // The daemon still serves a good deployment.
    let s = launcher(Some("the right secret, 16+"));
    let out = common::run_in(&s, &pipeline(&addr)).expect("run");
    assert_eq!(values(out), vec![st("new:306")]);
    assert!(served.join().expect("daemon thread").is_ok());
}

#[test]
fn bytecode_never_runs_in_a_daemon() {
    // The code of a real stage, with its handler replaced by Lua bytecode.
    let s = common::script();
    let out = common::run_in(
        &s,
        "return leda.stage \"dumped\" { handler = function(x) leda.send(1, x) end }",
    )
    .expect("stage");
    let stage = match &out.into_vec()[0] {
        mlua::Value::UserData(ud) => ud
            .borrow::<leda_lua::script::LuaStage>()
            .expect("a stage")
            .0
            .clone(),
        other => panic!("not a stage: {other:?}"),
    };
    let mut code = (*leda_lua::instance::code_of(&stage).expect("Lua code")).clone();
    let lua = mlua::Lua::new();
    let dumped: mlua::String = lua
        .load("return string.dump(function(x) return x end)")
        .eval()
        .expect("dump");
    code.handler.chunk = String::from_utf8_lossy(&dumped.as_bytes()).into_owned();
    assert!(code.binary_chunk().is_some());
    let mut attrs = Attrs::default();
    attrs.set(
        remote::CODE_ATTR,
        remote::encode_code(&code).expect("encode"),
    );
    let e = remote::stage_from_attrs(&attrs).unwrap_err().to_string();
    assert!(e.contains("bytecode"), "{e}");
    // Even past that check, instances compile text only.
    let leda = lua.create_table().expect("table");
    let e = code
        .handler
        .instantiate(&lua, &leda)
        .unwrap_err()
        .to_string();
    assert!(e.contains("binary"), "{e}");
    // And a stage without code is refused with a reason.
    let e = remote::stage_from_attrs(&Attrs::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no Lua source"), "{e}");
}
