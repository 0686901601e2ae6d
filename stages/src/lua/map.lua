-- leda.stage.util.map as seen from Lua scripts (leda-stages, src/lua/map.lua).
--
--   require 'leda.stage.util.map'(function(v) return ... end)
--     a Lua stage applying the function to each element of the array it receives
--     and sending the mapped array (plus any further arguments) on port 1 (waiting
--     while the destination's queue is full, as the Rust map does); the
--     instances load string, table, math and utf8 for the function's use;
--   require 'leda.stage.util.map'('decimal_point')
--     the Rust stage with a built-in function (tonumber, tostring, upper, lower,
--     trim, decimal_point).
local leda = require 'leda'

return function(f)
  if type(f) == 'string' then
    local s = require 'leda.stage.util.map.rust'
    s.fn = f
    return s
  end
  assert(type(f) == 'function', "leda.stage.util.map: expected a function or a built-in function name")
  return leda.stage{
    -- The mapped function may use the pure standard libraries, as in Listing 5.1.
    init = function()
      require 'string'
      require 'table'
      require 'math'
      require 'utf8'
    end,
    handler = function(t, ...)
      assert(type(t) == 'table', "map: expected an array")
      local out = {}
      for i = 1, #t do
        out[i] = (f(t[i]))
      end
      -- send_wait: a full downstream queue parks the instance until there is room
      -- (as the Rust map does), instead of failing the event.
      assert(leda.send_wait(1, out, ...))
    end,
  }
end
