local table = require "table"

local ret = {
[[<html>
<head>
  <title>CGILua loop test</title>
</head>
<body>
<p>Executes a long loop, used by concurrency tests</p>]]}

for i = 1, 30000 do
  table.insert(ret, (i .. '<br/>\n'))
end

table.insert(ret, [[
</body>
</html>]])

return table.concat(ret)
