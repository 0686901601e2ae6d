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

-- Not in the thesis: run as the program itself (`leda run app.lua PATTERN FILE...`),
-- app.lua does in one process what Listing 4.5 does. Required as a module
-- (`require 'app'`, as Listing 4.5 does), it only returns the graph.
if arg and arg[0] and arg[0]:match("app%.lua$") then
  matcher.pattern = arg[1]
  for i = 2, #arg do lines:push(arg[i]) end
  app:run()
end

-- Return the application graph
return app
