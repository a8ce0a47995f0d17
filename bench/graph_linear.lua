-- 10-node linear graph: microseconds per superstep.
-- Each node increments a `last` counter and appends one item to a list.
--   no checkpointer          (goal: under 5 µs per superstep)
--   file saver, durability async (writes fsync'd on the thread pool; the
--   figure includes the flush before invoke returns)
-- Usage: moongraph run bench/graph_linear.lua [iterations]
-- Prints lines "graph_linear <case> <value> us/step".
local mg = require "moongraph"

local N_NODES = 10

local function build()
  local g = mg.graph { items = mg.reducers.append }
  local prev = mg.START
  for i = 1, N_NODES do
    local name = "n" .. i
    g:add_node(name, function(s) return { count = s.count + 1, items = "x" } end)
    g:add_edge(prev, name)
    prev = name
  end
  g:add_edge(prev, mg.END)
  return g
end

local function best_of(rounds, fn)
  local best = math.huge
  for _ = 1, rounds do
    collectgarbage()
    best = math.min(best, fn())
  end
  return best
end

local function per_step(app, n, cfg_of)
  return function()
    local t0 = mg.now()
    for i = 1, n do
      local out = app:invoke({ count = 0, items = {} }, cfg_of and cfg_of(i) or nil)
      assert(out.count == N_NODES, "wrong result")
    end
    return (mg.now() - t0) / (n * N_NODES)
  end
end

local iters = tonumber(arg and arg[1]) or 20000
local app = build():compile()
per_step(app, 1000)()
local plain = best_of(5, per_step(app, iters))
print(string.format("graph_linear plain %.2f us/step", plain * 1e6))

local dir = "bench/out/graph_linear_ckpt"
os.execute("rm -rf " .. dir)
local saver = mg.checkpoint.file(dir)
local capp = build():compile { checkpointer = saver, durability = "async" }
local fiters = math.max(20, iters // 200)
local file_async = best_of(3, per_step(capp, fiters, function(i) return { thread_id = "t" .. i } end))
print(string.format("graph_linear file_async %.2f us/step", file_async * 1e6))
local mem = build():compile { checkpointer = mg.checkpoint.memory(), durability = "async" }
local memory_async = best_of(3, per_step(mem, fiters * 10, function(i) return { thread_id = "t" .. i } end))
print(string.format("graph_linear memory_async %.2f us/step", memory_async * 1e6))
os.execute("rm -rf " .. dir)
