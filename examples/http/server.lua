-- The staged HTTP server (thesis Fig. 5.6) as a Lua graph over the Rust stages of
-- leda-http. Every connector is local: client sockets travel on the events.
--
-- Usage: leda run examples/http/server.lua [ROOT] [HOST:PORT]
--   ROOT defaults to the demo site next to this script, HOST:PORT to 127.0.0.1:8080.
require 'leda'

local here = (arg and arg[0] or ''):match('^(.*)/[^/]*$') or '.'
local root = arg[1] or (here .. '/site')
local listen = arg[2] or '127.0.0.1:8080'

local accept      = require 'leda.stage.http.accept'          -- wait client (async)
local handle      = require 'leda.stage.http.handle_request'  -- read + parse (httparse)
local cache       = require 'leda.stage.http.cache'           -- serial LRU (memory + open fds)
local send_file   = require 'leda.stage.http.send_file'       -- sendfile hits; misses
local cgi         = require 'leda.stage.http.cgi'             -- dynamic .lua pages
local send_buffer = require 'leda.stage.http.send_buffer'     -- in-memory responses
local close       = require 'leda.stage.http.close'           -- graceful close

-- Settings are stage attributes (see leda_http::Config for all of them).
for _, s in ipairs{accept, handle, cache, send_file, cgi, send_buffer, close} do
  s.root = root
  s.cache_bytes = 64 * 1024 * 1024
end
accept.listen = listen

local server = leda.graph{
  leda.connect(accept, 'client', handle, 'local'),
  leda.connect(accept, 'reject', send_buffer, 'local'),
  leda.connect(handle, 'static', cache, 'local'),
  leda.connect(handle, 'dynamic', cgi, 'local'),
  leda.connect(handle, 'reply', send_buffer, 'local'),
  leda.connect(handle, 'close', close, 'local'),
  leda.connect(cache, 'hit', send_buffer, 'local'),
  leda.connect(cache, 'file', send_file, 'local'),    -- hit on an open descriptor: sendfile
  leda.connect(cache, 'miss', send_file, 'local'),
  leda.connect(send_file, 'insert', cache, 'local'),
  leda.connect(send_file, 'next', handle, 'local'),   -- keep-alive loop
  leda.connect(send_file, 'close', close, 'local'),
  leda.connect(cgi, 'reply', send_buffer, 'local'),
  leda.connect(send_buffer, 'next', handle, 'local'), -- keep-alive loop
  leda.connect(send_buffer, 'close', close, 'local'),
}

accept:push()  -- start the accept loop
print(('server.lua: serving %s on http://%s/'):format(root, listen))
server:run()
