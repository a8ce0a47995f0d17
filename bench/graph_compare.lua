-- Graph engine benchmarks next to @langchain/langgraph running the same
-- graphs (bench/peer/graph.mjs), with ratios. `make bench-graph` runs it.
--   10-node linear graph, no checkpointer           (goal: under 5 µs per superstep)
--   the same with a checkpointer, durability async  (moongraph: file and memory savers;
--                                                    LangGraph: MemorySaver)
--   one step fanning out 1,000 Send tasks with no I/O
local bin = os.getenv("MOONGRAPH_BIN") or "./moongraph"

local function run(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

local figures = {}
local function collect(out)
  for name, case, value, unit in out:gmatch("(%S+) (%S+) ([%d%.]+) (%S+)") do
    figures[name .. " " .. case] = { value = tonumber(value), unit = unit }
  end
end

local out, ok = run(bin .. " run bench/graph_linear.lua")
io.write(out)
if not ok then error("bench/graph_linear.lua failed") end
collect(out)
out, ok = run(bin .. " run bench/graph_send.lua")
io.write(out)
if not ok then error("bench/graph_send.lua failed") end
collect(out)

local have_peer = io.open("bench/peer/node_modules/@langchain/langgraph/package.json")
if have_peer then
  have_peer:close()
  out, ok = run("node --no-warnings bench/peer/graph.mjs")
  io.write(out)
  if ok then collect(out) else print("LangGraph peer failed; no ratios") end
else
  print("LangGraph peer not installed (make bench-graph installs it with npm); no ratios")
end

local function row(label, ours, peer)
  local a, b = figures[ours], figures[peer]
  if not a then return end
  local line = string.format("%-44s %10.2f %-6s", label, a.value, a.unit)
  if b then
    line = line .. string.format("  LangGraph %10.2f %-6s  %7.0fx faster", b.value, b.unit, b.value / a.value)
  end
  print(line)
end

print("\nsummary (best of several rounds, wall time)")
row("10-node chain, no checkpointer", "graph_linear plain", "peer_linear plain")
row("10-node chain, file saver, async", "graph_linear file_async", "peer_linear memory_async")
row("10-node chain, memory saver, async", "graph_linear memory_async", "peer_linear memory_async")
row("1,000-way Send step", "graph_send fanout_1000", "peer_send fanout_1000")
