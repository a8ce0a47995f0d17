-- One superstep fanning out 1,000 Send tasks with no I/O: milliseconds per
-- invoke (a trivial planning step plus the 1,000-task step and its barrier,
-- which appends 1,000 results to a list).
-- Usage: moongraph run bench/graph_send.lua [fanout]
-- Prints "graph_send fanout_<n> <value> ms/step".
local mg = require "moongraph"

local fanout = tonumber(arg and arg[1]) or 1000

local g = mg.graph { results = mg.reducers.append }
g:add_node("plan", function() end)
g:add_node("work", function(arg) return { results = arg.i } end)
g:add_edge(mg.START, "plan")
g:add_conditional_edges("plan", function(s)
  local sends = {}
  for i = 1, s.n do sends[i] = mg.Send("work", { i = i }) end
  return sends
end, { "work" })
local app = g:compile()

local function once()
  local t0 = mg.now()
  local out = app:invoke { n = fanout, results = {} }
  local dt = mg.now() - t0
  assert(#out.results == fanout and out.results[fanout] == fanout, "wrong result")
  return dt
end

for _ = 1, 5 do once() end
local best = math.huge
for _ = 1, 30 do
  collectgarbage()
  best = math.min(best, once())
end
print(string.format("graph_send fanout_%d %.3f ms/step", fanout, best * 1e3))
