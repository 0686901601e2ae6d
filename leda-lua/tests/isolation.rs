//! Every instance has its own Lua state with only the base library and the leda API.

mod common;

use common::{run, st};
use leda_core::value::Value;

#[test]
fn only_base_and_leda_until_required() {
    let out = run(r#"
        local s = leda.stage{ handler = function()
          local before = { type(io), type(string), type(table), type(math), type(os), type(debug) }
          local str = require 'string'
          require 'table'
          leda.quit(table.concat(before, ","), type(string), str == string, type(leda.send), type(unpack))
        end }
        s:push()
        return s:run()
    "#)
    .unwrap();
    assert_eq!(
        out,
        vec![
            st("nil,nil,nil,nil,nil,nil"),
            st("table"),
            Value::Bool(true),
            st("function"),
            st("function")
        ]
    );
}

#[test]
fn instances_do_not_share_globals() {
    // A serial stage sets a global; another stage (own state) does not see it; the
    // configuring script's globals are not visible either.
    let out = run(r#"
        secret = "config"
        local a = leda.stage{ handler = function() shared_global = 1; leda.send(1, type(secret)) end, serial = true }
        local b = leda.stage{ handler = function(t) leda.quit(t, type(shared_global)) end, serial = true }
        a:push()
        return leda.graph{ a:connect(b) }:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![st("nil"), st("nil")]);
}

#[test]
fn init_runs_once_per_instance() {
    let out = run(r#"
        local s = leda.stage{
          init = function() inits = (inits or 0) + 1; count = 0 end,
          handler = function() count = count + 1; if count == 50 then leda.quit(inits, count) end end,
          serial = true }
        for i = 1, 50 do s:push(i) end
        return s:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![Value::Int(1), Value::Int(50)]);
}

#[test]
fn parallel_instances_each_have_their_state() {
    // maxpar 4: at most 4 instances, each counting its own events; the totals add up.
    let out = run(r#"
        local w = leda.stage{
          init = function() mine = 0 end,
          handler = function(i) mine = mine + 1; leda.send(1, i) end,
          maxpar = 4 }
        local sink = leda.stage{
          init = function() n, sum = 0, 0 end,
          handler = function(i) n = n + 1; sum = sum + i; if n == 200 then leda.quit(sum) end end,
          serial = true }
        for i = 1, 200 do w:push(i) end
        return leda.graph{ w:connect(sink) }:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![Value::Int(200 * 201 / 2)]);
}
