-- File: stage/lines.lua
require "leda"
local stage = leda.stage{
  handler = function(filename)
    -- Open the file named in the event
    local file, err = io.open(filename, 'r')
    if not file then
      -- Send the error to the 'io_error' port
      assert(leda.send("io_error", filename, "Open error: " .. err))
      return
    end
    -- Iterate over every line of the file
    for line in file:lines() do
      -- Send the line to output port 'line'
      assert(leda.send_wait("line", line)) -- thesis: leda.send (see README)
    end
  end,
  -- Instance-state initialisation function
  init = function()
    -- Load the 'io' library into the instance state
    require 'io'
  end
}
return stage
