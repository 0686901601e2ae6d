-- Listing 4.5 in one process: the partition and mapping lines are left out, so the
-- whole graph is one cluster run by this process.
-- Usage: leda run grep.lua PATTERN FILE...
require 'leda'
-- import the application graph
local graph = require 'app'            -- Listing 4.4
-- import the stage definitions
local printer = require 'stage.print'  -- Listing 4.1
local matcher = require 'stage.match'  -- Listing 4.3
local lines   = require 'stage.lines'  -- Listing 4.2
-- Set the 'pattern' attribute of the matcher stage
matcher.pattern = arg[1]
for i = 2, #arg do
  -- Send an initial event to the lines stage
  lines:push(arg[i])
end
-- Run the graph
graph:run()
