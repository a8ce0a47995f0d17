-- spawn+join of an empty task: ns per task (goal: under 1 µs).
package.path = "bench/?.lua;" .. package.path
local mg = require "moongraph"

local function round(n)
  local t0 = mg.now()
  for _ = 1, n do
    mg.spawn(function() end):join()
  end
  return (mg.now() - t0) / n
end

local function batch(n)
  local ts = {}
  local t0 = mg.now()
  for i = 1, n do ts[i] = mg.spawn(function() end) end
  for i = 1, n do ts[i]:join() end
  return (mg.now() - t0) / n
end

round(10000)
local best_seq, best_batch = math.huge, math.huge
for _ = 1, 5 do
  best_seq = math.min(best_seq, round(200000))
  collectgarbage()
  best_batch = math.min(best_batch, batch(200000))
  collectgarbage()
end
print(string.format("spawn+join, one at a time : %6.0f ns per task (goal < 1000)", best_seq * 1e9))
print(string.format("spawn+join, 200k in batch : %6.0f ns per task", best_batch * 1e9))
