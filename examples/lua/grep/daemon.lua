-- Listing 4.6: starting a helper (daemon) process
require 'leda'
local c = require 'leda.controller.thread_pool'.get(10)
leda.start{controller = c, host = '127.0.0.1', port = 9999}
