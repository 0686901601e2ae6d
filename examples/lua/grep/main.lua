-- Listing 4.5: clustering, mapping and running (two processes).
-- Start the helper first (Listing 4.6): leda run daemon.lua
-- The thesis' "host1:port1"/"host2:port2" are given here as real addresses.
require 'leda'
-- import the application graph
local graph = require 'app'            -- Listing 4.4
-- import the stage definitions
local printer = require 'stage.print'  -- Listing 4.1
local matcher = require 'stage.match'  -- Listing 4.3
local lines   = require 'stage.lines'  -- Listing 4.2
-- First cluster: only the printer stage
local cluster1 = leda.cluster(printer)
-- Second cluster: the rest of the application
local cluster2 = graph:all() - cluster1
-- Define the graph partition
graph:part(cluster1, cluster2)
-- Map clusters to processes
graph:map("127.0.0.1:9999", "127.0.0.1:9998")
-- Set the 'pattern' attribute of the matcher stage
matcher.pattern = arg[1]
for i = 2, #arg do
  -- Send an initial event to the lines stage
  lines:push(arg[i])
end
-- Run the graph
graph:run()
