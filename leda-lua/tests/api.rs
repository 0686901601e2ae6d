//! The thesis' graph API from Lua: stages, connectors, graphs, clusters, runs.

mod common;

use common::{run, run_in, script, st};
use leda_core::prelude::*;

#[test]
fn pipeline_returns_quit_values() {
    let out = run(r#"
        local double = leda.stage{ handler = function(x) assert(leda.send(1, 2 * x)) end }
        local sum = leda.stage{
          init = function() total = 0 end,
          handler = function(x) total = total + x; if total == 2 * (1 + 2 + 3) then leda.quit("done", total) end end,
          serial = true }
        for i = 1, 3 do double:push(i) end
        return leda.graph{ double:connect(sum) }:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![st("done"), Value::Int(12)]);
}

#[test]
fn attributes_are_self_and_read_at_run_time() {
    let out = run(r#"
        local m = leda.stage{ handler = function() leda.quit(self.pattern, self.size, self.name) end, pattern = "old", size = 5 }
        m.pattern = "new"
        assert(m.pattern == "new" and m.size == 5 and m.name == tostring(m))
        m:push()
        return m:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![st("new"), Value::Int(5), st("script")]);
}

#[test]
fn named_cloned_and_bare_stages() {
    let out = run(r#"
        local a = leda.stage "alpha" { handler = function() leda.send(1, self.name) end }
        local b = leda.stage "beta" (a)
        local sink = leda.stage(function(n) leda.quit(n) end)
        assert(tostring(a) == "alpha" and tostring(b) == "beta")
        b:push()
        return leda.graph{ "named", a:connect(sink), b:connect(sink) }:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![st("beta")]);
}

#[test]
fn connect_forms_and_types() {
    let s = script();
    run_in(
        &s,
        r#"
        local a = leda.stage "a" { handler = function() end }
        local b = leda.stage "b" { handler = function() end }
        local c = leda.stage "c" { handler = function() end }
        local d = leda.stage "d" { handler = function() end }
        local g = leda.graph "forms" {
          a:connect(b),                        -- port 1, decoupled
          a:connect("x", c, "local"),
          leda.connect(b, d, "cohort"),        -- port omitted
          leda.connect(c, 2, d),
          d .. a,
        }
        return g
    "#,
    )
    .unwrap();
    let g = &s.graphs()[0];
    assert_eq!(g.name(), "forms");
    let got: Vec<String> = g
        .connectors()
        .iter()
        .map(|c| format!("{}.{}->{}:{}", c.from.name(), c.port, c.to.name(), c.kind))
        .collect();
    assert_eq!(
        got,
        vec![
            "a.1->b:decoupled",
            "a.x->c:local",
            "b.1->d:cohort",
            "c.2->d:decoupled",
            "d.1->a:decoupled"
        ]
    );
}

#[test]
fn clusters_partition_and_map() {
    let out = run(r#"
        local a = leda.stage "a" { handler = function() end }
        local b = leda.stage "b" { handler = function() end }
        local c = leda.stage "c" { handler = function() end }
        local g = leda.graph{ a:connect(b, "local"), b:connect(c) }
        local all = g:all()
        assert(#all == 3)
        assert(#(all - c) == 2 and #(leda.cluster(a) + c) == 2 and #(all * leda.cluster(b, c)) == 2)
        assert((all - a):contains(b) and not (all - a):contains(a))
        -- a local connector may not cross clusters
        local ok, err = pcall(g.part, g, leda.cluster(a), all - a)
        assert(not ok and tostring(err):find("local connector"), tostring(err))
        -- every stage in exactly one cluster
        ok, err = pcall(g.part, g, leda.cluster(a, b))
        assert(not ok and tostring(err):find("no cluster"), tostring(err))
        -- a stage may stand for its own cluster; part and map chain
        g:part(all - c, c):map("127.0.0.1:9001", {"127.0.0.1:9002", "127.0.0.1:9003"})
        ok, err = pcall(g.map, g, "127.0.0.1:9001")
        assert(not ok and tostring(err):find("1 process"), tostring(err))
        ok, err = pcall(g.run, g)
        assert(not ok and tostring(err):find("cannot tell which mapped process"), tostring(err))
        return "ok"
    "#)
    .unwrap();
    assert_eq!(out, vec![st("ok")]);
}

#[test]
fn autostart_true_and_table() {
    let out = run(r#"
        local a = leda.stage{ handler = function(...) leda.send(1, select('#', ...)) end, autostart = true }
        local b = leda.stage{ handler = function(x, y) leda.send(1, x + y) end, autostart = {20, 22} }
        local sink = leda.stage{
          init = function() got = {} end,
          handler = function(v) got[#got + 1] = v; if #got == 2 then leda.quit(math.min(got[1], got[2]), math.max(got[1], got[2])) end end,
          serial = true }
        sink = sink   -- math is required below
        return leda.graph{ a:connect(sink), b:connect(sink) }:run()
    "#);
    // `math` is not loaded in instances without require: the sink fails.
    assert!(out.is_ok());
    let out = run(r#"
        local a = leda.stage{ handler = function(...) leda.send(1, select('#', ...)) end, autostart = true }
        local b = leda.stage{ handler = function(x, y) leda.send(1, x + y) end, autostart = {20, 22} }
        local sink = leda.stage{
          init = function() require 'math'; got = {} end,
          handler = function(v) got[#got + 1] = v; if #got == 2 then leda.quit(math.min(got[1], got[2]), math.max(got[1], got[2])) end end,
          serial = true }
        return leda.graph{ a:connect(sink), b:connect(sink) }:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![Value::Int(0), Value::Int(42)]);
}

#[test]
fn bind_checks_ports_and_attributes_once_before_running() {
    let err = run(r#"
        local m = leda.stage{
          handler = function() end,
          bind = function(self, output) assert(output.match, "'match' port must be connected") end }
        m:push()
        return m:run()
    "#)
    .unwrap_err()
    .to_string();
    assert!(err.contains("'match' port must be connected"), "{err}");
    assert!(err.contains("script.lua:"), "{err}");

    let out = run(r#"
        binds = 0
        local m = leda.stage{
          handler = function() leda.send("match", 1) end,
          bind = function(self, output)
            binds = binds + 1
            assert(self.pattern == "p" and output.match and not output.other)
          end,
          pattern = "p" }
        local sink = leda.stage{ handler = function() end }
        m:push() m:push() m:push()
        leda.graph{ m:connect("match", sink) }:run()
        return binds
    "#)
    .unwrap();
    assert_eq!(out, vec![Value::Int(1)]);
}

#[test]
fn controllers_from_lua() {
    let out = run(r#"
        local tp = require 'leda.controller.thread_pool'
        local auto = require 'leda.controller.auto'
        local single = require 'leda.controller.single_thread'
        local results = {}
        for _, c in ipairs{ tp.get(3), auto.get(1, 4), single, require 'leda.controller.default'.get() } do
          local s = leda.stage{ handler = function(x) leda.quit(x) end }
          s:push(#results + 1)
          results[#results + 1] = s:run{ controller = c, maxpar = 2 }
        end
        return unpack(results)
    "#)
    .unwrap();
    let v: Vec<Value> = (1..=4).map(Value::Int).collect();
    assert_eq!(out, v);
}

#[test]
fn sleep_frees_the_only_worker_and_nice_resumes() {
    // One worker: the sleeping instance must not hold it, or "fast" would come second.
    let out = run(r#"
        local slow = leda.stage "slow" { handler = function() leda.sleep(0.3); leda.nice(); leda.send(1, "slow") end }
        local fast = leda.stage "fast" { handler = function() leda.nice(); leda.send(1, "fast") end }
        local sink = leda.stage{
          init = function() got = {} end,
          handler = function(v) got[#got + 1] = v; if #got == 2 then leda.quit(got[1], got[2]) end end,
          serial = true }
        slow:push()
        local g = leda.graph{ slow:connect(sink), fast:connect(sink) }
        fast:push()
        return g:run{ controller = require 'leda.controller.thread_pool'.get(1) }
    "#)
    .unwrap();
    assert_eq!(out, vec![st("fast"), st("slow")]);
}

#[test]
fn gettime_and_send_failures_are_values() {
    let out = run(r#"
        local s = leda.stage{ handler = function()
          local t = leda.gettime()
          local ok1, why1 = leda.send("nowhere", 1)
          local ok2, why2 = leda.send(1, function() end)
          local ok3, why3 = leda.send(1, setmetatable({}, {}))
          leda.quit(type(t) == "number" and t > 1e9, ok1, why1, ok2, why2, ok3)
        end }
        local sink = leda.stage{ handler = function() end }
        s:push()
        return leda.graph{ s:connect(sink) }:run()
    "#)
    .unwrap();
    let v = out;
    assert_eq!(v[0], Value::Bool(true));
    assert!(v[1].is_nil());
    let why1 = v[2].as_str().unwrap();
    assert!(why1.contains("not connected"), "{why1}");
    assert!(v[3].is_nil());
    let why2 = v[4].as_str().unwrap();
    assert!(
        why2.contains("stage 'script' cannot send on port '1'")
            && why2.contains("argument 1 is a function, which cannot cross a connector"),
        "{why2}"
    );
    assert_eq!(v[5], Value::Bool(true));
}

#[test]
fn upvalues_travel_by_value() {
    let out = run(r#"
        local factor = 3
        local names = { "a", "b" }
        local table = require "table"
        local function helper(x) return x * factor end
        local function fact(n) if n <= 1 then return 1 end return n * fact(n - 1) end
        local s = leda.stage{ handler = function(x)
          local parts = {}
          table.insert(parts, names[2])
          leda.quit(helper(x), fact(5), table.concat(parts))
        end }
        s:push(14)
        return s:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![Value::Int(42), Value::Int(120), st("b")]);
}

#[test]
fn function_forms_on_one_line_and_named() {
    let out = run(r#"
        function do_work(a, b) leda.quit(a .. b, init_ran) end
        function init_work() init_ran = true end
        local s = leda.stage{ init = function() init_ran = "inline" end, handler = function(a, b) leda.quit(a .. b, init_ran) end }
        local t = leda.stage{ handler = do_work, init = init_work }
        s:push("x", "y")
        local r1 = { s:run() }
        t:push("p", "q")
        local r2 = { t:run() }
        return r1[1], r1[2], r2[1], r2[2]
    "#)
    .unwrap();
    assert_eq!(
        out,
        vec![st("xy"), st("inline"), st("pq"), Value::Bool(true)]
    );
}

#[test]
fn same_shaped_functions_on_one_line_are_told_apart() {
    // `init` and `handler` on one line, same parameters: each instance must get
    // the right text (the compiled code tells them apart).
    let out = run(r#"
        local s = leda.stage "s" { init = function() mark = "init" end, handler = function() leda.quit(mark, "handler") end }
        s:push()
        return s:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![st("init"), st("handler")]);
}

#[test]
fn every_bundled_stage_is_reachable_with_require() {
    leda_lua::library::register_bundled();
    let mut names = leda_lua::registry::registered();
    assert!(
        names.iter().any(|n| n == "leda.stage.util.timer"),
        "{names:?}"
    );
    names.extend(
        leda_stages::lua_modules()
            .into_iter()
            .map(|(n, _)| n.to_owned()),
    );
    let s = script();
    for n in &names {
        let out = run_in(
            &s,
            &format!("local s = require '{n}'\nreturn type(s), tostring(s)"),
        )
        .unwrap_or_else(|e| panic!("require '{n}': {e}"))
        .into_vec();
        assert!(
            matches!(&out[0], mlua::Value::String(t) if t.to_str().unwrap() != "nil"),
            "require '{n}' gave {out:?}"
        );
    }
}

#[test]
fn rust_and_lua_stages_mix_through_require() {
    leda_lua::registry::register_stage("leda.stage.test.double", Default::default(), || {
        Stage::new("double", |ev: Event, ctx: &mut Ctx| {
            let x: i64 = ev.get(0)?;
            ctx.send(1, x * 2)?;
            Ok(())
        })
    });
    let out = run(r#"
        local double = require 'leda.stage.test.double'
        assert(require 'leda.stage.test.double' == double)
        local src = leda.stage{ handler = function(x) leda.send(1, x + 1) end }
        local sink = leda.stage{ handler = function(x) leda.quit(x) end }
        src:push(20)
        return leda.graph{ src:connect(double), double:connect(sink) }:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![Value::Int(42)]);
    let err = run("return require 'leda.stage.no.such'")
        .unwrap_err()
        .to_string();
    assert!(err.contains("no registered Rust stage"), "{err}");
}

#[test]
fn start_options_are_checked() {
    let e = run("leda.start{ controller = 3 }").unwrap_err().to_string();
    assert!(e.contains("not a controller"), "{e}");
    // Off loopback without a secret: refused before listening.
    let e = run("leda.start{ host = '0.0.0.0', port = 0 }")
        .unwrap_err()
        .to_string();
    assert!(e.contains("requires a configured shared secret"), "{e}");
}

#[test]
fn cohort_and_local_connectors_between_lua_stages() {
    let out = run(r#"
        local a = leda.stage{ handler = function(x) assert(leda.send(1, x + 1)) end }
        local b = leda.stage{ handler = function(x) assert(leda.send(1, x * 2)) end }
        local c = leda.stage{ handler = function(x) leda.quit(x) end, serial = true }
        a:push(20)
        return leda.graph{ a:connect(b, "cohort"), b:connect(1, c, "local") }:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![Value::Int(42)]);
}

#[test]
fn process_loss_options_are_checked() {
    let graph = "local s = leda.stage{ handler = function() leda.quit() end, autostart = true }
                 return leda.graph{ s }";
    let e = run(&format!("{graph}:run{{ on_process_loss = 'maybe' }}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("neither 'end' nor 'continue'"), "{e}");
    let e = run(&format!("{graph}:run{{ notify = 'x' }}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs on_process_loss = 'continue'"), "{e}");
    // Accepted (one process: nothing can be lost).
    run(&format!(
        "{graph}:run{{ on_process_loss = 'continue', notify = 'x' }}"
    ))
    .unwrap();
}

/// `nonblocking = true` declares the stage nonblocking (`Stage::nonblocking`), readable
/// back; the stage runs as any other (across processes, the deployment carries the
/// declaration: `leda-net`'s `deploy` tests).
#[test]
fn a_stage_may_be_declared_nonblocking() {
    let out = run(r#"
        local quiet = leda.stage "quiet" { handler = function(x) leda.quit(x * 2) end,
                                           nonblocking = true }
        local plain = leda.stage "plain" { handler = function() end }
        assert(quiet.nonblocking == true and plain.nonblocking == false)
        quiet:push(21)
        return leda.graph{ quiet }:run()
    "#)
    .unwrap();
    assert_eq!(out[0], Value::Int(42));
}

/// `fail_stop = true`: after its handler's first error the stage is stopped, not rebuilt
/// (`init` runs once; later events reach the `error` port, naming the first failure).
#[test]
fn a_fail_stop_stage_is_not_rebuilt() {
    let out = run(r#"
        local node = leda.stage "node" {
          init = function() calls = 0 end,
          handler = function(x)
            calls = calls + 1
            if x == 2 then error("lost the token") end
            assert(leda.send(1, calls))
          end,
          fail_stop = true }
        local seen, errors = {}, {}
        local ok = leda.stage "ok" { handler = function(n) seen[#seen + 1] = n end, serial = true }
        local err = leda.stage "err" {
          handler = function(stage, why, x)
            errors[#errors + 1] = why
            if #errors == 2 then leda.quit(#errors, why) end
          end,
          serial = true }
        for i = 1, 3 do node:push(i) end
        return leda.graph{ node:connect(ok), node:connect("error", err) }:run()
    "#)
    .unwrap();
    assert_eq!(out[0], Value::Int(2));
    let why = out[1].as_str().unwrap_or_default().to_owned();
    assert!(
        why.contains("stage 'node' stopped after a failure") && why.contains("lost the token"),
        "{why}"
    );
}

#[test]
fn send_wait_holds_a_fast_producer_and_loses_nothing() {
    // A consumer with a queue of 2 that works on each event: `leda.send` is refused
    // (queue full) while `leda.send_wait` waits for room, so all 3,000 arrive, in order.
    let out = run(r#"
        local producer = leda.stage{ handler = function(n)
          local refused
          for i = 1, n do
            local ok, why = leda.send(1, -1)
            if not ok then refused = why end
            assert(leda.send_wait(1, i))
          end
          assert(leda.send_wait(1, 0, refused))
        end }
        local consumer = leda.stage{
          init = function() expect = 1; extra = 0 end,
          handler = function(i, why)
            if i == -1 then extra = extra + 1; return end
            if i == 0 then leda.quit(expect - 1, why, extra) return end
            assert(i == expect, "out of order: " .. i .. " for " .. expect)
            expect = expect + 1
            local x = 0
            for k = 1, 2000 do x = x + k end
          end,
          serial = true, capacity = 2 }
        producer:push(3000)
        return leda.graph{ producer:connect(consumer) }:run()
    "#)
    .unwrap();
    assert_eq!(out[0], Value::Int(3000), "{out:?}");
    let why = out[1].as_str().expect("a plain send found the queue full");
    assert!(why.contains("full"), "{why}");
    assert!(
        out[2].as_int().unwrap() < 3000,
        "some plain sends were refused"
    );
}

#[test]
fn send_wait_refuses_to_wait_where_it_cannot() {
    // In a coroutine the handler made (a yield would go to it) and inside a C
    // function, a full queue is an error with its reason: never a lost event.
    let out = run(r#"
        local producer = leda.stage{ handler = function()
          require 'string'
          local nested, sent = nil, 0
          coroutine.wrap(function()
            for i = 1, 50 do
              local ok, why = leda.send_wait(1, i)
              if ok then sent = sent + 1 else nested = why; break end
            end
          end)()
          local in_c
          string.gsub(string.rep("x", 50), "x", function()
            local ok, why = leda.send_wait(1, -1)
            if not ok then in_c = why end
          end)
          leda.quit(sent, nested, in_c)
        end }
        local consumer = leda.stage{ handler = function() leda.sleep(10) end, serial = true, capacity = 2 }
        producer:push()
        return leda.graph{ producer:connect(consumer) }:run()
    "#)
    .unwrap();
    assert!(out[0].as_int().unwrap() < 50, "{out:?}");
    let nested = out[1].as_str().expect("refused in a nested coroutine");
    assert!(nested.contains("handler's own coroutine"), "{nested}");
    let in_c = out[2].as_str().expect("refused inside a C function");
    assert!(in_c.contains("C function"), "{in_c}");
}

/// `leda.flush()` sends what a long handler sent so far: the receiving stage handles
/// the first event while the sender still runs (without it the event waits for the
/// sender's call to end, and is handled after the time the sender sends last).
#[test]
fn flush_lets_a_long_handler_s_events_leave() {
    let out = run(r#"
        local tp = require 'leda.controller.thread_pool'
        local source = leda.stage{ handler = function()
          leda.send(1, "first")
          leda.flush()
          local t0 = leda.gettime()
          while leda.gettime() - t0 < 0.5 do end
          leda.send(1, "done", leda.gettime())
        end }
        local sink = leda.stage{
          handler = function(what, ended)
            if what == "first" then got = leda.gettime()
            else leda.quit(got ~= nil and got < ended) end
          end,
          serial = true }
        source:push()
        return leda.graph{ source:connect(sink) }:run{ controller = tp.get(2) }
    "#)
    .unwrap();
    assert_eq!(out, vec![Value::Bool(true)]);
}

/// A handler still running a second after its run ended (here: in an endless loop, while
/// another stage quit) is interrupted, so the run ends; before, the worker never came
/// back and the run never ended (on a daemon: every later deployment was refused).
#[test]
fn a_handler_looping_past_the_end_of_its_run_is_interrupted() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let out = run(r#"
            local spin = leda.stage{ handler = function() while true do end end }
            local stop = leda.stage{ handler = function()
                leda.send('spin', 1)
                leda.sleep(0.2)
                leda.quit('stopped')
            end, autostart = true }
            return leda.graph{ stop:connect('spin', spin), spin }:run()
        "#);
        let _ = tx.send(format!("{out:?}"));
    });
    let out = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the run did not end: its looping handler held a worker");
    assert_eq!(out, r#"Ok([Str("stopped")])"#);
}

/// `leda.sleep` and `leda.nice` in a coroutine the handler made, or in a C function's
/// callback, are errors that say so: the yield went to that coroutine, which got the API's
/// private token back as a value, and the handler did not sleep at all.
#[test]
fn sleep_refuses_to_wait_where_it_cannot() {
    let out = run(r#"
        local s = leda.stage{ handler = function()
          require 'string'
          local ok_co, why_co = pcall(coroutine.wrap(function() return leda.sleep(0.01) end))
          local ok_nice = pcall(coroutine.wrap(function() return leda.nice() end))
          local why_c
          string.gsub("x", "x", function() why_c = select(2, pcall(leda.sleep, 0.01)) end)
          leda.sleep(0.01) -- in the handler itself: fine
          leda.quit(tostring(ok_co), why_co, tostring(ok_nice), why_c)
        end, autostart = true }
        return leda.graph{ s }:run()
    "#)
    .unwrap();
    assert_eq!(out[0], st("false"), "{out:?}");
    assert!(
        out[1]
            .as_str()
            .is_some_and(|w| w.contains("handler itself")),
        "{out:?}"
    );
    assert_eq!(out[2], st("false"), "{out:?}");
    assert!(
        out[3]
            .as_str()
            .is_some_and(|w| w.contains("handler itself")),
        "{out:?}"
    );
}

/// A stage option of the wrong type is refused naming the option (`capacity = -1` said
/// "error converting Lua integer to usize (out of range)").
#[test]
fn a_bad_stage_option_is_named() {
    let e = run("leda.stage{ handler = function() end, capacity = -1 }")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("field 'capacity'") && e.contains("positive integer"),
        "{e}"
    );
    let e = run("leda.stage{ handler = function() end, init = 5 }")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("field 'init': must be a function, not an integer"),
        "{e}"
    );
}

/// What Lua runs with hooks off, where the end of a run could not stop a handler: an
/// `xpcall` message handler is skipped once the handler is interrupted, and `__gc` and
/// `__close` metamethods are refused. And a handler interrupted at the end of its run
/// is not counted as a failed event (a run that quit while a handler computed exited 1).
#[test]
fn loops_lua_runs_without_hooks_do_not_hold_the_end_of_a_run() {
    let s = script();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let out = run_in(
            &s,
            r#"
            local spin = leda.stage{ handler = function()
                xpcall(function() while true do end end, function() while true do end end)
            end }
            local stop = leda.stage{ handler = function()
                leda.send('spin', 1)
                leda.sleep(0.2)
                leda.quit('stopped')
            end, autostart = true }
            return leda.graph{ stop:connect('spin', spin), spin }:run()
        "#,
        )
        .map(|_| ());
        let failures = s.failures().len();
        let _ = tx.send(format!("{out:?} {failures}"));
    });
    let out = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the run did not end: a message handler held its worker");
    assert_eq!(out, "Ok(()) 0");
    let refused = run(r#"
        local s = leda.stage{ handler = function()
            local ok_gc, why_gc = pcall(setmetatable, {}, {__gc = function() end})
            local ok_close = pcall(setmetatable, {}, {__close = function() end})
            leda.quit(tostring(ok_gc), why_gc, tostring(ok_close))
        end, autostart = true }
        return leda.graph{ s }:run()
    "#)
    .unwrap();
    assert_eq!(refused[0], st("false"), "{refused:?}");
    assert!(
        refused[1].as_str().is_some_and(|w| w.contains("__gc")),
        "{refused:?}"
    );
    assert_eq!(refused[2], st("false"), "{refused:?}");
}

/// A script's controller is bounded as the commands' `--threads` is (a script asking for
/// 3,000 threads got them: 1,733 were running 9 s later).
#[test]
fn controllers_are_bounded() {
    for code in [
        "return require 'leda.controller.thread_pool'.get(3000)",
        "return require 'leda.controller.auto'.get(1, 100000)",
    ] {
        let e = run(code).unwrap_err().to_string();
        assert!(e.contains("at most"), "{e}");
    }
}
