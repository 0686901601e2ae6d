local leda    = require 'leda'
local timer   = require 'leda.stage.util.timer'
local http    = require 'leda.stage.net.http'
local match   = require 'leda.stage.string.match'
local window  = require 'leda.stage.window.sliding'
local map     = require 'leda.stage.util.map'(function(v)
  return string.gsub(v, ',', '.')
end)
local media   = require 'leda.stage.util.average'
local printer = require 'leda.stage.util.print'
local g = leda.graph{
  leda.connect(timer, http),
  leda.connect(http, match),
  leda.connect(match, window),
  leda.connect(window, map),
  leda.connect(map, media),
  leda.connect(media, printer)
}
match.pattern = '<td>PETR4</td>%s<td>(%d+,%d+)</td>'
window.size = 5
local url = assert(arg[1], "URL required")
timer:push(tonumber(arg[3]) or 1, tonumber(arg[2]) or -1, url)
g:run()
