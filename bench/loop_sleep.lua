-- 100,000 concurrent mg.sleep(0.05) tasks: wall time and peak RSS
-- (goal: under 0.3 s and under 2 KiB of RSS per sleeping task, all in).
package.path = "bench/?.lua;" .. package.path
local mg = require "moongraph"
local rss = require "rss"

local N = 100000
collectgarbage()
local before = rss.current()
local t0 = mg.now()
local ts = {}
for i = 1, N do ts[i] = mg.spawn(function() mg.sleep(0.05) end) end
for i = 1, N do ts[i]:join() end
local wall = mg.now() - t0
local peak = rss.peak()
print(string.format("%d tasks sleeping 50 ms: wall %.3f s (goal < 0.3), peak RSS %.1f MiB, "
  .. "%.2f KiB per task above the %.1f MiB baseline (goal < 2)",
  N, wall, peak / 1024, (peak - before) / N, before / 1024))
