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
  -- The grammar of an entry and of a time is `src/log.rs`'s, check for check
  -- (docs/stage-library.md § CEP): Apache's combined format ending with %D, single
  -- spaces, ASCII digits only where digits are meant, fields in range.
  -- `s` as exactly `n` ASCII digits with a value in lo..hi, or nil.
  local function num(s, n, lo, hi)
    if #s ~= n or s:find('[^0-9]') then return nil end
    local v = tonumber(s)
    if v < lo or v > hi then return nil end
    return v
  end
  local function days_in_month(y, m)
    if m == 2 then return (y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0)) and 29 or 28 end
    if m == 4 or m == 6 or m == 9 or m == 11 then return 30 end
    return 31
  end
  -- Apache's %t (dd/Mon/yyyy:hh:mm:ss +zzzz) to seconds since the epoch, or nil:
  -- year 1970..9999, a day of the month, hour <= 23, minute and second <= 59, zone
  -- hours <= 23 and minutes <= 59 (as `log::parse_time`).
  function parse_time(t)
    local d, mon, y, h, mi, s, zs, zh, zm =
      t:match('^(%d%d)/(%a%a%a)/(%d%d%d%d):(%d%d):(%d%d):(%d%d) ([%+%-])(%d%d)(%d%d)$')
    if not d then return nil end
    y, mon = tonumber(y), months[mon]
    d, h, mi, s = tonumber(d), tonumber(h), tonumber(mi), tonumber(s)
    zh, zm = tonumber(zh), tonumber(zm)
    if not mon or y < 1970 or y > 9999 or d < 1 or d > days_in_month(y, mon) or h > 23
       or mi > 59 or s > 59 or zh > 23 or zm > 59 then
      return nil
    end
    local off = (zh * 3600 + zm * 60) * (zs == '-' and -1 or 1)
    return days_from_civil(y, mon, d) * 86400 + h * 3600 + mi * 60 + s - off
  end
  -- The index after the run of non-space bytes at i (at least one), or nil.
  local function token(line, i)
    local _, e = line:find('^[^ \t\n\v\f\r]+', i)
    return e and e + 1
  end
  -- The index after the quoted string at i (`\` escapes the byte after it), or nil.
  local function quoted(line, i)
    if line:byte(i) ~= 34 then return nil end
    i = i + 1
    while true do
      local j = line:find('["\\]', i)
      if not j then return nil end
      if line:byte(j) == 34 then return j + 1 end
      if j == #line then return nil end
      i = j + 2
    end
  end
  -- The common entry (no `\` in its quoted fields) in one match; the same checks after.
  local FAST = '^([^ \t\n\v\f\r]+) [^ \t\n\v\f\r]+ [^ \t\n\v\f\r]+ %[([^%]]*)%] "[^"\\]*" (%d%d%d) ([%d%-]+) "[^"\\]*" "[^"\\]*" (%d+)$'
  local parse_full
  -- client, time (s), status, micros of an entry (`log::parse`), or nil.
  function parse(line)
    local client, ts, st, size, m = line:match(FAST)
    if not client then return parse_full(line) end
    local t, status = parse_time(ts), tonumber(st)
    if not t or status < 100 or status > 599 or #m > 18
       or (size ~= '-' and size:find('[^0-9]')) then
      return nil
    end
    return client, t, status, tonumber(m)
  end
  -- The same, step by step: escapes in quoted fields.
  function parse_full(line)
    local i = token(line, 1)
    if not i or line:byte(i) ~= 32 then return nil end
    local client = line:sub(1, i - 1)
    i = token(line, i + 1)
    if not i or line:byte(i) ~= 32 then return nil end
    i = token(line, i + 1)
    if not i or line:byte(i) ~= 32 or line:byte(i + 1) ~= 91 then return nil end
    local close = line:find(']', i + 2, true)
    if not close then return nil end
    local t = parse_time(line:sub(i + 2, close - 1))
    if not t or line:byte(close + 1) ~= 32 then return nil end
    i = quoted(line, close + 2)
    if not i or line:byte(i) ~= 32 then return nil end
    local j = token(line, i + 1)
    if not j then return nil end
    local status = num(line:sub(i + 1, j - 1), 3, 100, 599)
    if not status or line:byte(j) ~= 32 then return nil end
    i = token(line, j + 1)
    if not i then return nil end
    local size = line:sub(j + 1, i - 1)
    if (size ~= '-' and size:find('[^0-9]')) or line:byte(i) ~= 32 then return nil end
    i = quoted(line, i + 1)
    if not i or line:byte(i) ~= 32 then return nil end
    i = quoted(line, i + 1)
    if not i or line:byte(i) ~= 32 then return nil end
    local m = line:sub(i + 1)
    if #m == 0 or #m > 18 or m:find('[^0-9]') then return nil end
    return client, t, status, tonumber(m)
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
  -- The time of a line that is not an entry: between its first `[` and the first
  -- `]` after it (`log::time_of`).
  function time_of(line)
    local open = line:find('[', 1, true)
    if not open then return nil end
    local close = line:find(']', open + 1, true)
    if not close then return nil end
    return parse_time(line:sub(open + 1, close - 1))
  end
  -- A line's event time: an entry's, else `time_of`'s (as `batch::stamp`). The two are
  -- the same bracket when the first `[` follows three tokens at the line's start (an
  -- entry's place for its time): then the whole entry need not be parsed (it made the
  -- Lua variant 45 % slower).
  function line_time(line)
    local _, e = line:find('^[^ \t\n\v\f\r]+ [^ \t\n\v\f\r]+ [^ \t\n\v\f\r]+ %[')
    if e and e == line:find('[', 1, true) then
      return time_of(line)
    end
    local _, t = parse(line)
    return t or time_of(line)
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
  -- I/O errors name the file (`PATH: reason`), as the Rust baseline's do.
  local function open(path, mode)
    local f, err = io.open(path, mode)
    if not f then error(err, 0) end
    return f
  end
  local persisted = open(out .. '/persist-lua-seq.log', 'a')
  local alarms = open(out .. '/alarms.log', 'a')
  local function alarm(...) alarms:write(table.concat({ ... }, '\t'), '\n') end
  local queue, head, tail, latest, last, live = {}, {}, {}, {}, {}, {}
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
    -- Progress: the largest time two consecutive lines both reached (window.merge).
    if last[i] then
      local agreed = math.min(last[i], t)
      latest[i] = math.max(latest[i] or agreed, agreed)
    end
    last[i] = t
    local q, j = queue[i], tail[i]
    while j >= head[i] and q[j][1] > t do q[j + 1] = q[j]; j = j - 1 end
    q[j + 1], tail[i] = { t, line }, tail[i] + 1
  end
  local readers = {}
  -- Lines as `io.lines` gives them: without `\n`, or `\r\n` (a last line ending in
  -- a bare `\r` loses it here and keeps it there: the one difference).
  for i = 1, n do
    local lines = open(files[i], 'r'):lines()
    readers[i] = function()
      local ok, line = pcall(lines)
      if not ok then error(files[i] .. ': ' .. tostring(line), 0) end
      return line
    end
  end
  local open = n
  while open > 0 do
    for i = 1, n do
      if live[i] then
        for _ = 1, 1024 do
          local line = readers[i]()
          if not line then live[i], open = false, open - 1; break end
          if line:byte(-1) == 13 then line = line:sub(1, -2) end
          local t = line_time(line)
          if t then
            push(i, t, line)
          else
            io.stderr:write(string.format('no access-log time: line skipped: source=%d line=%q\n',
              i - 1, line:sub(1, 200)))
          end
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
-- becomes (time, source, line), the end-of-file tick (source). A line without a
-- time is left out with a warning on stderr (as the Rust `stamp` does), not a
-- failed event: a run fails only for what it could not do.
local function stamp(source)
  return leda.stage('stamp' .. (source + 1)) {
    init = function()
      helpers()
      require 'io'
    end,
    handler = function(line)
      if line == nil then
        assert(leda.send_wait(1, source))
        return
      end
      local t = line_time(line)
      if not t then
        io.stderr:write(string.format('no access-log time: line skipped: source=%d line=%q\n',
          source, line:sub(1, 200)))
        return
      end
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
