-- The image pipeline (thesis §5.1.1, §14.1) as a Lua graph over the Rust stages of
-- leda-image: decode -> denoise -> color -> scale -> encode -> write.
--
-- Usage:  leda run examples/image/pipeline.lua INPUT_DIR OUTPUT_DIR [LAYOUT] [DAEMON...]
--
--   LAYOUT 1 (default): one process.
--   LAYOUT 2 / 3: the same graph, partitioned as `leda-image --layout 2|3` does and
--   mapped onto this process plus the daemons given (default 127.0.0.1:9999 and
--   127.0.0.1:9998), started beforehand with `leda start --allow io --listen
--   127.0.0.1:PORT` (the `write` stage writes files: a daemon refuses it without io):
--
--     leda start --allow io --listen 127.0.0.1:9999 &
--     leda run examples/image/pipeline.lua samples out 2 127.0.0.1:9999
require 'leda'

local source  = require 'leda.stage.image.source'
local decode  = require 'leda.stage.image.decode'
local denoise = require 'leda.stage.image.denoise'
local color   = require 'leda.stage.image.color'
local scale   = require 'leda.stage.image.scale'
local encode  = require 'leda.stage.image.encode'
local write   = require 'leda.stage.image.write'
local report  = require 'leda.stage.image.report'

local input, output, layout = arg[1], arg[2], tonumber(arg[3] or "1")
if not input or not output then
  error("usage: leda run pipeline.lua INPUT_DIR OUTPUT_DIR [LAYOUT] [DAEMON...]")
end

-- Settings (the defaults of `leda-image`).
source.window = 8        -- images in flight at most (report hands back a credit per image)
denoise.threshold = 40   -- replace a channel value farther than this from its 3x3 median
color.clip = 0.005       -- clip 0.5% at both ends of each channel's histogram
encode.quality = 85
write.output = output    -- OUTPUT/NAME.jpg and OUTPUT/half/NAME.jpg

local graph = leda.graph "image" {
  leda.connect(source, "file", decode),
  leda.connect(source, "total", report),
  leda.connect(decode, "image", denoise),
  leda.connect(denoise, "image", color),
  leda.connect(color, "image", scale),
  leda.connect(scale, "image", encode),
  leda.connect(encode, "jpeg", write),
  leda.connect(write, "written", report),
  leda.connect(report, "credit", source),
  -- a per-image failure becomes an error line, and the run goes on
  leda.connect(source, "failed", report),
  leda.connect(decode, "failed", report),
  leda.connect(denoise, "failed", report),
  leda.connect(color, "failed", report),
  leda.connect(scale, "failed", report),
  leda.connect(encode, "failed", report),
  leda.connect(write, "failed", report),
}

-- Layouts by partition and map only (thesis Fig. 5.1). This process is named
-- LAUNCHER in the mapping: it dials the daemons and listens nowhere.
local LAUNCHER = "127.0.0.1:1"
local front = leda.cluster(source, decode, denoise, report)
if layout == 2 then
  graph:part(front, graph:all() - front)
  graph:map(LAUNCHER, arg[4] or "127.0.0.1:9999")
elseif layout == 3 then
  local middle = leda.cluster(color, scale)
  graph:part(front, middle, graph:all() - front - middle)
  graph:map(LAUNCHER, arg[4] or "127.0.0.1:9999", arg[5] or "127.0.0.1:9998")
elseif layout ~= 1 then
  error("layout must be 1, 2 or 3")
end

source:push(input)
local done, total, failed, errors
if layout == 1 then
  done, total, failed, errors = graph:run()
else
  done, total, failed, errors = graph:run{host = "127.0.0.1", port = 1}
end
-- Like `leda-image`: a run with an error (an image lost, an unreadable input
-- directory) fails.
if (errors or 0) > 0 then
  error(("%d error(s), %d of %d image(s) failed (listed above)"):format(errors, failed, total), 0)
end
