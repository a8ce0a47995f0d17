-- The work of bench/pipeline.lua's runs without the waiting, for an
-- instruction count: RUNS pipeline runs one after the other, the upstreams
-- answering at once, nothing printed but one line at the end. Under
-- callgrind the instructions of one run are the difference between two
-- counts divided by the difference in runs (start-up, training the intent
-- classifier and the test server's replies cancel out):
--
--   valgrind --tool=callgrind --callgrind-out-file=/dev/null ./moongraph run bench/pipeline_profile.lua 0
--   valgrind --tool=callgrind --callgrind-out-file=/dev/null ./moongraph run bench/pipeline_profile.lua 50
--   -> (Collected(50) - Collected(0)) / 50
--
-- Callgrind counts are repeatable on a busy machine where wall and CPU times
-- are not. MODE "floor" runs bench/pipeline.lua's stand-in nodes instead
-- (the engine and the three requests alone).
--
--   ./moongraph run bench/pipeline_profile.lua [RUNS] [pipeline|floor]
package.path = "bench/?.lua;spec/support/?.lua;" .. package.path
local scenario = require "eco_scenario"
local chat = require "scripts.eco.chat"

local RUNS = tonumber(arg and arg[1]) or 50
local MODE = arg and arg[2] or "pipeline"
local MESSAGE, LOCATION = scenario.MESSAGE, scenario.LOCATION

local srv = scenario.server()

local input = chat.input(MESSAGE, { location = LOCATION })

local function config() return scenario.config(srv) end

local pipeline = chat.build()
local function run(app)
  local s, err = app:invoke(input, config())
  if not s then error("run failed: " .. tostring(err), 0) end
  for _, n in ipairs({ "location", "collection_point", "weather" }) do
    if not (s.contexts[n] and s.contexts[n].ok) then error("run missed the upstream for " .. n, 0) end
  end
end

local app
if MODE == "floor" then
  app = require("pipeline_floor").build(chat, function() run(pipeline) end, MESSAGE, LOCATION)
elseif MODE == "pipeline" then
  app = pipeline
else
  error("mode must be pipeline or floor, got " .. tostring(MODE), 0)
end

local function one() return run(app) end

one()   -- connections, lazily built indexes
for _ = 1, RUNS do one() end
srv:stop()
print(string.format("%s: %d runs", MODE, RUNS))
