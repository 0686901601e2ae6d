-- A dynamic page: the cgi stage runs this chunk for each request, in a fresh
-- environment, and sends the string it returns.
local names = {}
for k in pairs(request.headers) do names[#names + 1] = k end
table.sort(names)
local rows = {}
for _, k in ipairs(names) do
  rows[#rows + 1] = ("<tr><td>%s</td><td>%s</td></tr>"):format(k, request.headers[k]:gsub("[<>&]", ""))
end
return ([[<!doctype html>
<html><head><meta charset="utf-8"><title>hello.lua</title>
<link rel="stylesheet" href="style.css"></head>
<body><h1>Hello from Lua</h1>
<p>Generated at %s by <code>hello.lua</code> for <code>%s %s</code>%s.</p>
<table>%s</table>
<p><a href="./">back</a></p></body></html>
]]):format(os.date("!%Y-%m-%d %H:%M:%S UTC"), request.method, request.path,
  request.query ~= "" and (" with query <code>" .. request.query:gsub("[<>&]", "") .. "</code>") or "",
  table.concat(rows, "\n"))
