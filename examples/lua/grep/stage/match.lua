-- File: stage/match.lua
require "leda"
local stage = leda.stage{
  handler = function(str)
    -- 'pattern' is defined in the instance's internal state
    local matches = {string.match(str, self.pattern)}
    -- If there were captures
    if #matches > 0 then
      -- Send the captures of the pattern match
      assert(leda.send_wait("match", unpack(matches))) -- thesis: leda.send
    end
  end,
  init = function()
    -- Load the 'string' library into the instance state
    require "string"
  end,
  bind = function(self, output)
    -- Require the 'pattern' attribute
    assert(self.pattern, "Pattern field must be defined")
    -- Require that port 'match' is connected
    assert(output.match, "'match' port must be connected")
  end,
  pattern = 'test'
}
return stage
