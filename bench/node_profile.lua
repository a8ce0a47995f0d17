-- One Eco² pipeline node's own work, for an instruction count: the pipeline
-- of bench/pipeline_profile.lua runs once (the upstreams answering at once)
-- to record what NODE receives, then NODE runs RUNS more times, each on its
-- own copy of that input. With a third argument "copies" the copies are made
-- and the node does not run, so under callgrind one run of the node costs
--
--   valgrind --tool=callgrind --callgrind-out-file=/dev/null ./moongraph run bench/node_profile.lua intent 200 copies
--   valgrind --tool=callgrind --callgrind-out-file=/dev/null ./moongraph run bench/node_profile.lua intent 200
--   -> (Collected(runs) - Collected(copies)) / 200
--
-- NODE floor_weather (floor_location, floor_collection_point) runs the
-- stand-in of bench/pipeline.lua's engine floor instead: the request the
-- node makes (recorded from a pipeline run, as bench/pipeline_floor.lua
-- does) and the decoding of its body, which the node's own cost is above.
--
-- With "lines", the Lua lines the node's runs execute are counted (a VM
-- instruction hook) and the top 40 printed. With "calls", the functions
-- the runs call, per run (a C function with the line that called it; each
-- such call costs some hundreds of instructions), the top 30 or $TOP.
--
--   ./moongraph run bench/node_profile.lua NODE [RUNS] [copies|lines|calls]
package.path = "bench/?.lua;spec/support/?.lua;" .. package.path
local scenario = require "eco_scenario"
local chat = require "scripts.eco.chat"
local intent_node = require "nodes.intent"
local routing = require "scripts.eco.routing"

local NODE = arg and arg[1] or error("usage: node_profile.lua NODE [RUNS] [lines]", 0)
local RUNS = tonumber(arg[2]) or 100
local LINES = arg[3] == "lines"
local COPIES_ONLY = arg[3] == "copies"
local MESSAGE, LOCATION = scenario.MESSAGE, scenario.LOCATION

local srv = scenario.server()

local function config() return scenario.config(srv) end

local function deep_copy(v)
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = deep_copy(x) end
  return setmetatable(out, getmetatable(v))
end

local node
if NODE == "intent" then
  node = intent_node.new { rules = routing.rules }
elseif NODE:match("^floor_") then
  -- bench/pipeline.lua's stand-in for a lookup node: the request the node
  -- made in a pipeline run (URL with its query, headers), its body decoded
  local name = NODE:sub(7)
  local floor = require "pipeline_floor"
  if not floor.PATHS[name] then error("no stand-in for " .. name, 0) end
  local request = floor.requests(function()
    local s, err = chat.build():invoke(chat.input(MESSAGE, { location = LOCATION }), config())
    if not s then error("run failed: " .. tostring(err), 0) end
  end)[name]
  local http, adapter = require "moongraph.http", require "nodes.lib.adapter"
  node = { name = name, policy = "fail_open", run = function()
    local body = adapter.decode(name, http.request(request))
    return { contexts = { [name] = { ok = type(body) == "table", text = name } } }
  end }
  NODE = name
else
  node = require("nodes." .. NODE)
end
local seen_state, seen_ctx
local nodes = { [NODE] = { name = NODE, policy = node.policy, timeout = node.timeout,
  run = function(state, ctx)
    seen_state, seen_ctx = deep_copy(state), setmetatable({ config = ctx.config }, { __index = ctx })
    return node.run(state, ctx)
  end } }
local app = chat.build { nodes = nodes }
local s, err = app:invoke(chat.input(MESSAGE, { location = LOCATION }), config())
if not s then error("run failed: " .. tostring(err), 0) end
if not seen_state then error(NODE .. " did not run in the pipeline", 0) end

local function one(state)
  local out = node.run(state, seen_ctx)
  if type(out) ~= "table" then error(NODE .. " returned " .. tostring(out), 0) end
end

one(deep_copy(seen_state))   -- lazily built indexes, connections
local states = {}
for i = 1, RUNS do states[i] = deep_copy(seen_state) end
if LINES then
  local counts = {}
  debug.sethook(function()
    local info = debug.getinfo(2, "Sl")
    if info then
      local k = info.short_src .. ":" .. (info.currentline or 0)
      counts[k] = (counts[k] or 0) + 1
    end
  end, "", 7)
  for i = 1, RUNS do one(states[i]) end
  debug.sethook()
  local keys, total = {}, 0
  for k, n in pairs(counts) do keys[#keys + 1] = k; total = total + n end
  table.sort(keys, function(a, b) return counts[a] > counts[b] end)
  print(string.format("%d Lua VM instructions a run", total * 7 // RUNS))
  for i = 1, math.min(40, #keys) do
    print(string.format("%5.1f%%  %s", 100 * counts[keys[i]] / total, keys[i]))
  end
elseif arg[3] == "calls" then
  local counts = {}
  debug.sethook(function()
    local info = debug.getinfo(2, "Sn")
    local k = (info.name or "?") .. " " .. info.short_src .. ":" .. info.linedefined
    if info.what == "C" then
      local at = debug.getinfo(3, "Sl")
      if at then k = k .. " from " .. at.short_src .. ":" .. at.currentline end
    end
    counts[k] = (counts[k] or 0) + 1
  end, "c")
  for i = 1, RUNS do one(states[i]) end
  debug.sethook()
  local keys = {}
  for k in pairs(counts) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return counts[a] > counts[b] end)
  for i = 1, math.min(tonumber(os.getenv("TOP") or 30), #keys) do print(string.format("%7.1f  %s", counts[keys[i]] / RUNS, keys[i])) end
elseif not COPIES_ONLY then
  for i = 1, RUNS do one(states[i]) end
end
srv:stop()
print(string.format("%s: %d runs", NODE, RUNS))
