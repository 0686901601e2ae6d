//! The stages from Lua scripts: `require 'leda.stage.<group>.<name>'`, attributes set
//! from Lua, `bind` errors, and Listing 5.1's `util.map` called with a Lua function.

use leda_core::value::Value;
use leda_lua::script::{Mode, Script, ScriptOptions};

fn run(code: &str) -> Result<Vec<Value>, String> {
    let s = Script::new(ScriptOptions {
        mode: Mode::Run,
        until_idle: true,
        threads: Some(2),
        ..ScriptOptions::default()
    })
    .map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!(
        "leda-stages-lua-{}-{}",
        std::process::id(),
        code.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("script.lua");
    std::fs::write(&path, code).unwrap();
    let out = s.run_file(&path, &[]).map_err(|e| e.to_string())?;
    Ok(out
        .iter()
        .enumerate()
        .map(|(i, v)| leda_lua::value::to_value(v, &format!("result {i}")).unwrap())
        .collect())
}

#[test]
fn window_map_average_from_lua_with_a_lua_map_function() {
    let out = run(r#"
        local leda = require 'leda'
        local window = require 'leda.stage.window.sliding'
        local map = require 'leda.stage.util.map'(function(v) return string.gsub(v, ',', '.') end)
        local media = require 'leda.stage.util.average'
        local quit = require 'leda.stage.util.quit'
        window.size = 3
        quit.count = 2
        local g = leda.graph{
          leda.connect(window, map),
          leda.connect(map, media),
          leda.connect(media, quit),
        }
        for _, v in ipairs{"1,5", "2,5", "3,5", "4,5"} do window:push(v) end
        return g:run()
    "#)
    .unwrap();
    // Windows {1.5, 2.5, 3.5} and {2.5, 3.5, 4.5}; the second quits (order is serial).
    assert_eq!(out.len(), 1);
    let m = out[0].as_float().unwrap();
    assert!(m == 2.5 || m == 3.5, "{m}");
}

#[test]
fn map_by_builtin_name_and_match_from_lua() {
    let out = run(r#"
        local leda = require 'leda'
        local match = require 'leda.stage.string.match'
        local map = require 'leda.stage.util.map'('tonumber')
        local win = require 'leda.stage.window.spatial'
        local quit = require 'leda.stage.util.quit'
        match.pattern = 'price=(%d+)'
        -- Serial: the window is asserted in push order, which a parallel match need not keep.
        match.serial = true
        win.size = 2
        local g = leda.graph{ match:connect(win), win:connect(map), map:connect(quit) }
        match:push('price=12;')
        match:push('nothing')
        match:push('price=30')
        return g:run()
    "#)
    .unwrap();
    assert_eq!(
        out,
        vec![Value::Array(vec![Value::Int(12), Value::Int(30)])]
    );
}

#[test]
fn bind_errors_reach_the_lua_script() {
    let err = run(r#"
        local leda = require 'leda'
        local match = require 'leda.stage.string.match'
        local p = require 'leda.stage.util.print'
        match.pattern = '(%d'
        return leda.graph{ match:connect(p) }:run()
    "#)
    .unwrap_err();
    assert!(err.contains("bad Lua pattern"), "{err}");
    let err = run(r#"
        local leda = require 'leda'
        local w = require 'leda.stage.window.sliding'
        local p = require 'leda.stage.util.print'
        return leda.graph{ w:connect(p) }:run()
    "#)
    .unwrap_err();
    assert!(err.contains("'size' must be set"), "{err}");
    let err = run(r#"
        local map = require 'leda.stage.util.map'(42)
    "#)
    .unwrap_err();
    assert!(err.contains("expected a function"), "{err}");
}

#[test]
fn every_catalogue_entry_is_requirable() {
    let names: Vec<String> = leda_stages::catalogue()
        .iter()
        .map(|(n, _, _)| format!("'{n}'"))
        .collect();
    let out = run(&format!(
        r#"
        local n = 0
        for _, name in ipairs{{ {} , 'leda.stage.util.map' }} do
          assert(require(name), name)
          n = n + 1
        end
        return n
    "#,
        names.join(", ")
    ))
    .unwrap();
    assert_eq!(out, vec![Value::Int(names.len() as i64 + 1)]);
}

/// A review (2026-11-27): the Lua `util.map(function)` used `leda.send`, so a full downstream queue
/// failed the event (98 % of a fast stream); it waits now, as the Rust map does.
#[test]
fn lua_map_waits_for_a_full_queue_and_loses_nothing() {
    let out = run(r#"
        local leda = require 'leda'
        local map = require 'leda.stage.util.map'(function(v) return v * 2 end)
        local gen = leda.stage{
          handler = function(n)
            for i = 1, n do assert(leda.send_wait(1, {i})) end
          end,
        }
        local sink = leda.stage{
          serial = true,
          capacity = 4,
          init = function() seen, total = 0, 0 end,
          handler = function(t)
            seen = seen + 1
            total = total + t[1]
            local x = 0
            for i = 1, 300 do x = x + i end
            if seen == 5000 then leda.quit(seen, total) end
          end,
        }
        local g = leda.graph{ gen:connect(map), map:connect(sink) }
        gen:push(5000)
        return g:run()
    "#)
    .unwrap();
    assert_eq!(out, vec![Value::Int(5000), Value::Int(5000 * 5001)]);
}
