-- The CEP graph with Lua handlers (leda-cep, thesis §5.1.2): the same rules as the
-- Rust stages (src/rules.rs) and the same windows: each source's `stamp` gives its
-- lines their log time, and the window cuts every WINDOW lines of the sources'
-- event-time merge (lateness bound 60 s, src/stages.rs). Sources, window and copy
-- are the stage library's.
-- Usage: cep.lua OUT_DIR WINDOW PERSIST FILTER CORRELATE SCENARIO DAEMONS FILE...
--   SCENARIO: local (one process), 1 (each source in a daemon) or 2 (also correlate),
--     or seq: no graph, the same work in this Lua state on one thread (the Lua COST
--     baseline: same functions, same windows, a merge written in Lua);
--   DAEMONS: comma-separated daemon addresses (sources first, then correlate), or -.
local leda = require 'leda'
local out = assert(arg[1], 'output directory required')
local size = tonumber(arg[2]) or 1000
local np, nf, nc = tonumber(arg[3]) or 1, tonumber(arg[4]) or 1, tonumber(arg[5]) or 2
local scenario, daemons = arg[6] or 'local', arg[7] or '-'

local LATENESS = 60 -- seconds: as `stages::LATENESS`

local lines  = require 'leda.stage.io.lines'
local window = require 'leda.stage.window.merge'
local copy   = require 'leda.stage.util.broadcast'
window.size = size
window.sources = #arg - 7
window.lateness = LATENESS

-- Parsing helpers, defined in every instance by `init`.
local function helpers()
  require 'string'
  require 'math'
  months = { Jan = 1, Feb = 2, Mar = 3, Apr = 4, May = 5, Jun = 6,
             Jul = 7, Aug = 8, Sep = 9, Oct = 10, Nov = 11, Dec = 12 }
  function days_from_civil(y, m, d)
    if m <= 2 then y = y - 1 end
    local era = y // 400
    local yoe = y - era * 400
    local mp = (m + 9) % 12
    local doy = (153 * mp + 2) // 5 + d - 1
    local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468
  end
  -- ip, time (s), status, micros of a combined-format line ending with %D.
  function parse(line)
    local ip, t, status, micros =
      line:match('^(%S+) %S+ %S+ %[([^%]]+)%] "[^"]*" (%d+) %S+ "[^"]*" "[^"]*" (%d+)$')
    if not ip then return nil end
    local d, mon, y, h, mi, s, zs, zh, zm = t:match('^(%d+)/(%a+)/(%d+):(%d+):(%d+):(%d+) ([+-])(%d%d)(%d%d)$')
    if not d or not months[mon] then return nil end
    local off = (tonumber(zh) * 3600 + tonumber(zm) * 60) * (zs == '-' and -1 or 1)
    local secs = days_from_civil(tonumber(y), months[mon], tonumber(d)) * 86400
      + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(s) - off
    return ip, secs, tonumber(status), tonumber(micros)
  end
  -- filter's work on a window: emit('filter', line) for each relevant entry.
  function filter_window(w, emit)
    for i = 1, #w do
      local ip, t, status, micros = parse(w[i])
      if ip and (status >= 500 or micros >= 2000000) then
        emit('filter', w[i])
      end
    end
  end
  -- correlate's work on a window: emit('correlate', ip, hot entries) for each client
  -- with a burst (pairwise, O(w^2), as `rules::correlate`).
  function correlate_window(w, emit)
    local ips, ts, sts, n = {}, {}, {}, 0
    for i = 1, #w do
      local ip, t, status = parse(w[i])
      if ip then
        n = n + 1
        ips[n], ts[n], sts[n] = ip, t, status
      end
    end
    local hot = {}
    for i = 1, n do
      local peers = 0
      for j = 1, n do
        if i ~= j and ips[i] == ips[j] and sts[i] >= 400 and sts[j] >= 400
           and math.abs(ts[i] - ts[j]) <= 30 then
          peers = peers + 1
        end
      end
      if peers >= 3 then hot[ips[i]] = (hot[ips[i]] or 0) + 1 end
    end
    for ip, count in pairs(hot) do emit('correlate', ip, count) end
  end
  -- The time of a line (its %t) alone, as `log::time_of`.
  function time_of(line)
    local t = line:match('%[([^%]]+)%]')
    local d, mon, y, h, mi, s, zs, zh, zm = (t or ''):match('^(%d+)/(%a+)/(%d+):(%d+):(%d+):(%d+) ([+-])(%d%d)(%d%d)$')
    if not d or not months[mon] then return nil end
    local off = (tonumber(zh) * 3600 + tonumber(zm) * 60) * (zs == '-' and -1 or 1)
    return days_from_civil(tonumber(y), months[mon], tonumber(d)) * 86400
      + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(s) - off
  end
end

-- The Lua COST baseline (SCENARIO seq): read the files a chunk of lines at a time in
-- turn, stamp each line, merge them by event time (as `window.merge`: per source a
-- queue in (time, arrival) order, released below the watermark in (time, source,
-- arrival) order), and persist, filter and correlate each window, all in this state.
if scenario == 'seq' then
  helpers()
  local files = { table.unpack(arg, 8) }
  local n = #files
  local persisted = assert(io.open(out .. '/persist-lua-seq.log', 'a'))
  local alarms = assert(io.open(out .. '/alarms.log', 'a'))
  local function alarm(...) alarms:write(table.concat({ ... }, '\t'), '\n') end
  local queue, head, tail, latest, live = {}, {}, {}, {}, {}
  for i = 1, n do queue[i], head[i], tail[i], live[i] = {}, 1, 0, true end
  local win = {}
  local function process(w)
    persisted:write(table.concat(w, '\n'), '\n\n')
    filter_window(w, alarm)
    correlate_window(w, alarm)
  end
  local function release()
    local mark = math.huge
    for i = 1, n do
      if live[i] then mark = math.min(mark, (latest[i] or -math.huge) - LATENESS) end
    end
    while true do
      local best, bt
      for i = 1, n do
        local e = queue[i][head[i]]
        if e and (e[1] < mark or mark == math.huge) and (not bt or e[1] < bt) then
          best, bt = i, e[1]
        end
      end
      if not best then break end
      local h = head[best]
      win[#win + 1] = queue[best][h][2]
      queue[best][h], head[best] = nil, h + 1
      if #win == size then process(win); win = {} end
    end
  end
  local function push(i, t, line)
    if latest[i] and t < latest[i] - LATENESS then return alarm('late', t, i - 1, line) end
    latest[i] = math.max(latest[i] or t, t)
    local q, j = queue[i], tail[i]
    while j >= head[i] and q[j][1] > t do q[j + 1] = q[j]; j = j - 1 end
    q[j + 1], tail[i] = { t, line }, tail[i] + 1
  end
  local readers = {}
  -- Lines as `io.lines` gives them: without `\n`, or `\r\n` (a last line ending in
  -- a bare `\r` loses it here and keeps it there: the one difference).
  for i = 1, n do readers[i] = assert(io.open(files[i])):lines() end
  local open = n
  while open > 0 do
    for i = 1, n do
      if live[i] then
        for _ = 1, 1024 do
          local line = readers[i]()
          if not line then live[i], open = false, open - 1; break end
          if line:byte(-1) == 13 then line = line:sub(1, -2) end
          local t = time_of(line)
          if t then push(i, t, line) else io.stderr:write('no access-log time: ', line, '\n') end
        end
        release()
      end
    end
  end
  if #win > 0 then process(win) end
  persisted:close()
  alarms:close()
  return
end

-- `stamp`, one per source next to it (serial: its lines keep their order): a line
-- becomes (time, source, line), the end-of-file tick (source).
local function stamp(source)
  return leda.stage('stamp' .. (source + 1)) {
    init = helpers,
    handler = function(line)
      if line == nil then
        assert(leda.send_wait(1, source))
        return
      end
      local t = time_of(line)
      if not t then error('stamp: no access-log time in ' .. line) end
      assert(leda.send_wait(1, t, source, line))
    end,
    serial = true,
  }
end

local persist = leda.stage "persist" {
  init = function()
    require 'io'
    require 'table'
    require 'string'
    file = assert(io.open(string.format('%s/persist-lua-%s.log', out, tostring({}):match('0x%x+') or tostring(math)), 'a'))
  end,
  handler = function(w)
    file:write(table.concat(w, '\n'), '\n\n')
    file:flush()
  end,
  maxpar = np,
}

local filter = leda.stage "filter" {
  init = helpers,
  handler = function(w)
    filter_window(w, function(...) assert(leda.send_wait(1, ...)) end)
  end,
  maxpar = nf,
}

local correlate = leda.stage "correlate" {
  init = helpers,
  handler = function(w)
    correlate_window(w, function(...) assert(leda.send_wait(1, ...)) end)
  end,
  maxpar = nc,
}

local alarm = leda.stage "alarm" {
  init = function()
    require 'io'
    require 'table'
    file = assert(io.open(out .. '/alarms.log', 'a'))
  end,
  handler = function(...)
    file:write(table.concat({...}, '\t'), '\n')
    file:flush()
  end,
  serial = true,
}

local g = leda.graph "cep-lua" {
  window:connect(copy),
  window:connect('late', alarm),
  copy:connect(1, persist),
  copy:connect(2, filter),
  copy:connect(3, correlate),
  filter:connect(alarm),
  correlate:connect(alarm),
}
local sources = {}
for i = 8, #arg do
  local src = leda.stage('source' .. (i - 7))(lines)
  local st = stamp(i - 8)
  src:push(arg[i])
  g:add(src:connect('line', st, 'local'))
  g:add(src:connect('eof', st, 'local'))
  g:add(st:connect(window))
  sources[#sources + 1] = { src, st }
end
if scenario ~= 'local' then
  local addrs = {}
  for a in daemons:gmatch('[^,]+') do addrs[#addrs + 1] = a end
  local clusters, procs, rest = {}, {}, g:all()
  local function alone(stages, addr)
    local c = leda.cluster(table.unpack(stages))
    clusters[#clusters + 1], procs[#procs + 1] = c, assert(addr, 'not enough daemons')
    rest = rest - c
  end
  for i, pair in ipairs(sources) do alone(pair, addrs[i]) end
  if scenario == '2' then alone({ correlate }, addrs[#sources + 1]) end
  clusters[#clusters + 1], procs[#procs + 1] = rest, '127.0.0.1:1' -- this process
  g:part(table.unpack(clusters)):map(table.unpack(procs))
end
g:run()
