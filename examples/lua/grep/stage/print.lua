-- File: stage/print.lua
require "leda"
local stage = leda.stage{
  -- Event handler
  handler = function(...) print(...) end,
  -- Declares the stage serial (one persistent instance)
  serial = true
}
return stage
