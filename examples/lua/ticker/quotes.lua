-- A local quote page for the stock ticker (no internet needed): an HTTP server whose
-- price changes on every request. Usage: leda run quotes.lua [port]  (0 = any free
-- port); it prints its URL first, then serves until stopped.
local leda    = require 'leda'
local serve   = require 'leda.stage.net.http.serve'
local printer = require 'leda.stage.util.print'

local pages, price = {}, 21.40
for i = 1, 200 do
  -- A deterministic walk of the price, in cents, formatted with a decimal comma.
  price = price + ((i * 37) % 11 - 5) / 100
  local quote = string.format('%.2f', price):gsub('%.', ',')
  pages[i] = '<html><body><table><tr><td>PETR4</td>\n<td>' .. quote .. '</td></tr></table></body></html>'
end
serve.pages = pages
serve:push('127.0.0.1', tonumber(arg[1]) or 8642)
leda.graph{ leda.connect(serve, 'listening', printer) }:run{ until_idle = false }
