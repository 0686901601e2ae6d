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
    table.insert(conns, m:connect('grant', f, 'local'))
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
    leda_lua::registry::register_catalogue(leda_lock_service::catalogue());
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

/// Multi-resource locks from Lua: the multi node stage and the front from the catalogue,
/// `acquire_all` with overlapping sets in the three request forms (names, `{name, count}`
/// pairs, `name = count` map), exclusion and fencing checked per instance, bad input answered
/// with typed `invalid` replies.
const MULTI_SCRIPT: &str = r#"
local multi = require 'leda.stage.mutex.multi'
local front = require 'leda.stage.lock.front'
local N, K = 3, 4
local RES = {{'x', 1}, {'y', 1}, {'gpu', 2}}
local check = leda.stage{
    name = 'check', serial = true,
    init = function() holder = {}; last = {}; count = 0 end,
    handler = function(tag, who, holds)
        for _, h in ipairs(holds) do
            local key = h[1] .. '#' .. h[2]
            if tag == 'enter' then
                assert(holder[key] == nil, key .. ' held by ' .. tostring(holder[key]) .. ' and ' .. who)
                assert(last[key] == nil or h[3] > last[key], 'fencing token of ' .. key .. ' went back')
                holder[key] = who; last[key] = h[3]
            else
                holder[key] = nil
            end
        end
        if tag == 'enter' then
            count = count + 1
            if count == N * K then leda.quit(count) end
        end
    end,
}
local SETS = {
    [0] = {'x', 'y'},
    [1] = {{'y', 1}, {'gpu', 2}},
    [2] = {x = 1, gpu = 1},
}
local nodes, conns = {}, {}
for i = 0, N - 1 do
    local m = leda.stage('multi' .. i)(multi)
    m.algorithm = ALGORITHM; m.id = i; m.n = N; m.resources = RES
    local f = leda.stage('front' .. i)(front)
    f.multi = RES
    local c = leda.stage{
        name = 'client' .. i, serial = true, autostart = true, me = i, set = SETS[i],
        init = function() left = 4 end,
        handler = function(tag, id, a, b, c, d)
            if tag == nil then
                if self.me == 0 then
                    leda.send('front', 'acquire_all', 100, {})
                else
                    leda.send('front', 'acquire_all', 1, self.set)
                end
            elseif tag == 'invalid' then
                if id == 100 then
                    assert(a == 'empty', a)
                    leda.send('front', 'acquire_all', 101, {'x', 'x'})
                elseif id == 101 then
                    assert(a == 'duplicate' and b == 'x', a)
                    leda.send('front', 'acquire_all', 102, {{'gpu', 3}})
                elseif id == 102 then
                    assert(a == 'count' and b == 'gpu' and c == 3 and d == 2, a)
                    leda.send('front', 'acquire_all', 103, {'nope'})
                elseif id == 103 then
                    assert(a == 'unknown' and b == 'nope', a)
                    leda.send('front', 'acquire_all', 1, self.set)
                else
                    error('unexpected invalid reply for ' .. tostring(id))
                end
            elseif tag == 'granted-all' then
                leda.send('check', 'enter', self.me, a)
                leda.send('check', 'leave', self.me, a)
                leda.send('front', 'release_all', id)
            elseif tag == 'released-all' then
                left = left - 1
                if left > 0 then leda.send('front', 'acquire_all', id, self.set) end
            else
                error('unexpected reply ' .. tostring(tag))
            end
        end,
    }
    nodes[i] = m
    table.insert(conns, f:connect('multi', m))
    table.insert(conns, m:connect('grant', f, 'local'))
    table.insert(conns, f:connect('reply', c))
    table.insert(conns, c:connect('front', f))
    table.insert(conns, c:connect('check', check))
end
for i = 0, N - 1 do
    for j = 0, N - 1 do
        if i ~= j then table.insert(conns, nodes[i]:connect('peer' .. j, nodes[j])) end
    end
end
-- Ends when idle: a client that died on a failed check leaves the count short.
return leda.graph(conns):run{until_idle = true, timeout = 60}
"#;

#[test]
fn lua_clients_share_multi_resource_locks() {
    leda_lua::registry::register_catalogue(leda_lock_service::catalogue());
    // The script's `gpu` has 2 instances: the single-instance-only algorithms (Lejeune et al.)
    // are covered by the Rust API test.
    for algorithm in leda_mutex::multi::MultiAlgorithm::ALL
        .iter()
        .filter(|a| a.multi_instance())
    {
        let script = Script::new(ScriptOptions::default()).expect("a Lua state");
        let code = format!("ALGORITHM = '{algorithm}'\n{MULTI_SCRIPT}");
        let out = script
            .run_str(&code, "=multi")
            .unwrap_or_else(|e| panic!("{algorithm}: {e}"))
            .into_vec();
        assert_eq!(
            out.first().and_then(|v| v.as_i64()),
            Some(12),
            "{algorithm}: {out:?}"
        );
    }
}
