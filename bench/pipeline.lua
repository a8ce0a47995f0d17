-- The Eco² chat pipeline end to end (scripts/eco/chat.lua): offline intent
-- classifier, no checkpointer, and three upstream nodes — location (Kakao),
-- collection_point and weather (KMA) — each answered by the local test
-- server after 30 ms, for "근처 재활용센터랑 폐건전지 수거함 알려줘" with a
-- location (location + collection_point by multi-intent, weather by the
-- location enrichment). The rest of the pipeline (aggregator, extractive
-- answer, heuristic feedback, summarize) runs as in `moongraph chat`.
--
--   latency     one run at a time: p50 / p90 / p99 / max over RUNS runs
--               (goal: p50 within 1 ms of the floor's)
--   throughput  CONCURRENCY runs in flight in one process for TOTAL runs
--               (the ideal is 50 / 30 ms = 1,667 runs/s)
--
-- The same measurements are made on the same graph with every node replaced
-- by a stand-in that makes the same upstream request (one GET for each
-- routed branch, the URL with its query and the headers the node sent in
-- a pipeline run), decodes the body as a node must, and returns a fixed
-- result: the engine floor (supersteps, Send fan-out, reducers, HTTP, JSON)
-- without the nodes' own classification, answer, scoring and compression.
-- Throughput is measured in ROUNDS interleaved rounds (pipeline, floor,
-- pipeline, ...) and reported as medians with the median of the per-round
-- ratios, so a busy machine slows both sides alike (goal: ratio >= 0.75).
--
--   ./moongraph run bench/pipeline.lua [RUNS] [CONCURRENCY] [TOTAL] [DELAY_MS] [ROUNDS]
package.path = "bench/?.lua;spec/support/?.lua;" .. package.path
local mg = require "moongraph"
local scenario = require "eco_scenario"
local chat = require "scripts.eco.chat"
local rss = require "rss"
local stats = require "stats"

local RUNS = tonumber(arg and arg[1]) or 200
local CONCURRENCY = tonumber(arg and arg[2]) or 50
local TOTAL = tonumber(arg and arg[3]) or 3000
local DELAY_MS = tonumber(arg and arg[4]) or 30
local ROUNDS = tonumber(arg and arg[5]) or 5
local MESSAGE, LOCATION = scenario.MESSAGE, scenario.LOCATION

local srv = scenario.server(DELAY_MS)

local percentile, median = stats.percentile, stats.median

local input = chat.input(MESSAGE, { location = LOCATION })

local function config() return scenario.config(srv) end

-- latency of one() runs, one at a time; returns the p50 in ms
local function latency(label, one)
  for _ = 1, 20 do one() end
  local times = {}
  local cpu0 = os.clock()
  for i = 1, RUNS do
    local t = mg.now()
    one()
    times[i] = (mg.now() - t) * 1000
  end
  local cpu_seq = (os.clock() - cpu0) / RUNS * 1000
  table.sort(times)
  print(string.format("%s\n  latency over %d runs (upstreams answer in %d ms): p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms",
    label, RUNS, DELAY_MS, percentile(times, 50), percentile(times, 90), percentile(times, 99), times[#times]))
  print(string.format("    over the %d ms upstream wait: p50 +%.2f ms; CPU per run %.2f ms",
    DELAY_MS, percentile(times, 50) - DELAY_MS, cpu_seq))
  return percentile(times, 50)
end

-- one round of TOTAL runs with CONCURRENCY in flight: runs/s, CPU ms per run
local function throughput(one)
  local done, failures, next_run = 0, 0, 0
  local function worker(total)
    while next_run < total do
      next_run = next_run + 1
      local ok = pcall(one)
      if ok then done = done + 1 else failures = failures + 1 end
    end
  end
  local function round(total)
    local ws = {}
    for i = 1, CONCURRENCY do ws[i] = mg.spawn(worker, total) end
    for i = 1, CONCURRENCY do ws[i]:join() end
  end
  round(CONCURRENCY * 3)      -- warm-up at full concurrency (connections)
  done, failures, next_run = 0, 0, 0
  local t0, c0 = mg.now(), os.clock()
  round(TOTAL)
  local wall = mg.now() - t0
  local cpu = os.clock() - c0
  if failures > 0 then error(failures .. " runs failed", 0) end
  return done / wall, cpu / TOTAL * 1000
end

-- the pipeline as `moongraph chat` runs it
local app = chat.build()
local function one()
  local s, err = app:invoke(input, config())
  if not s then error("run failed: " .. tostring(err), 0) end
  for _, n in ipairs({ "location", "collection_point", "weather" }) do
    local c = s.contexts[n]
    if not (c and c.ok and not c.sample) then
      error("run did not reach the upstream for " .. n .. ": " .. tostring(c and (c.error or c.text)), 0)
    end
  end
  return s
end
local first = one()
print(string.format("pipeline: %s -> nodes %s; answer %s, %d chars",
  MESSAGE, table.concat(first.nodes_run, ", "), first.answer_source, utf8.len(first.answer)))
local p50_pipeline = latency("the pipeline", one)

-- the engine floor: the same graph and routing, stand-in nodes making the
-- requests the nodes made
local floor_app = require("pipeline_floor").build(chat, one, MESSAGE, LOCATION)
local function floor_one()
  local s, err = floor_app:invoke(input, {})
  if not s then error(tostring(err), 0) end
  if not (s.contexts.location.ok and s.contexts.weather.ok and s.contexts.collection_point.ok) then
    error("stand-in run missed an upstream", 0)
  end
end
local p50_floor = latency("engine floor (same graph, stand-in nodes making the same three requests)", floor_one)
print(string.format("p50 over the floor's: +%.2f ms (goal: within 1 ms)", p50_pipeline - p50_floor))

print(string.format("throughput, %d runs in flight, %d runs per round, %d interleaved rounds (ideal %.0f runs/s):",
  CONCURRENCY, TOTAL, ROUNDS, CONCURRENCY / (DELAY_MS / 1000)))
local rate = { pipeline = {}, floor = {} }
local cpu = { pipeline = {}, floor = {} }
local ratios = {}
for r = 1, ROUNDS do
  rate.pipeline[r], cpu.pipeline[r] = throughput(one)
  rate.floor[r], cpu.floor[r] = throughput(floor_one)
  ratios[r] = rate.pipeline[r] / rate.floor[r]
  print(string.format("  round %d: pipeline %.0f runs/s (CPU %.2f ms/run), floor %.0f runs/s (CPU %.2f ms/run), ratio %.2f",
    r, rate.pipeline[r], cpu.pipeline[r], rate.floor[r], cpu.floor[r], ratios[r]))
end
print(string.format("  median: pipeline %.0f runs/s, floor %.0f runs/s; CPU per run %.2f vs %.2f ms; ratio %.2fx (goal >= 0.75x)",
  median(rate.pipeline), median(rate.floor), median(cpu.pipeline), median(cpu.floor), median(ratios)))
local load = io.open("/proc/loadavg")
if load then print("  load average: " .. load:read("l")); load:close() end
print(string.format("peak RSS %.1f MiB", rss.peak() / 1024))
srv:stop()
