-- File: app.lua
require "leda"
local lines   = require "stage.lines"  -- Listing 4.2
local matcher = require "stage.match"  -- Listing 4.3
local printer = require "stage.print"  -- Listing 4.1

-- Create the application's stage graph and its connectors
local app = leda.graph{
  leda.connect(lines, "line", matcher, "local"),
  leda.connect(matcher, "match", printer)
}
-- Return the application graph
return app
