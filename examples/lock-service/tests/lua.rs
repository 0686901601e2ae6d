//! The lock service from Lua: node and front stages required from the catalogue, clients
//! written in Lua, three nodes in one process.

use leda_lua::{Script, ScriptOptions};

const SCRIPT: &str = r#"
local node = require 'leda.stage.mutex.node'
local front = require 'leda.stage.lock.front'
local N, K = 3, 5
local check = leda.stage{
    name = 'check', serial = true,
    init = function() last = -1; count = 0 end,
    handler = function(fence)
        assert(fence > last, 'fencing token went back')
        last = fence; count = count + 1
        if count == N * K then leda.quit(count, last) end
    end,
}
local nodes, conns = {}, {}
for i = 0, N - 1 do
    local m = leda.stage('mutex' .. i)(node)
    m.algorithm = ALGORITHM; m.id = i; m.n = N; m.resources = {'x'}
    local f = leda.stage('front' .. i)(front)
    f.resources = {'x'}
    local c = leda.stage{
        name = 'client' .. i, serial = true, autostart = true,
        init = function() left = 5 end,
        handler = function(tag, id, r, fence)
            if tag == nil then
                leda.send('front', 'acquire', 1, 'x', false)
            elseif tag == 'granted' then
                leda.send('check', fence)
                leda.send('front', 'release', id, 'x')
            elseif tag == 'released' then
                left = left - 1
                if left > 0 then leda.send('front', 'acquire', id, 'x', false) end
            else
                error('unexpected reply ' .. tostring(tag))
            end
        end,
    }
    nodes[i] = m
    table.insert(conns, f:connect('mutex', m))
    table.insert(conns, m:connect('grant', f))
    table.insert(conns, f:connect('reply', c))
    table.insert(conns, c:connect('front', f))
    table.insert(conns, c:connect('check', check))
end
for i = 0, N - 1 do
    for j = 0, N - 1 do
        if i ~= j then table.insert(conns, nodes[i]:connect('peer' .. j, nodes[j])) end
    end
end
return leda.graph(conns):run()
"#;

#[test]
fn lua_clients_share_a_lock() {
    for (module, make) in leda_lock_service::catalogue() {
        leda_lua::registry::register_stage(module, make);
    }
    for algorithm in [
        "ricart-agrawala",
        "suzuki-kasami",
        "naimi-trehel",
        "maekawa",
    ] {
        let script = Script::new(ScriptOptions::default()).expect("a Lua state");
        let code = format!("ALGORITHM = '{algorithm}'\n{SCRIPT}");
        let out = script
            .run_str(&code, "=lock")
            .unwrap_or_else(|e| panic!("{algorithm}: {e}"))
            .into_vec();
        assert_eq!(
            out.first().and_then(|v| v.as_i64()),
            Some(15),
            "{algorithm}: {out:?}"
        );
    }
}
