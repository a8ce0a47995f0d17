-- The Eco² chat pipeline end to end (scripts/eco/chat.lua): offline intent
-- classifier, no checkpointer, and three upstream nodes — location (Kakao),
-- collection_point and weather (KMA) — each answered by the local test
-- server after 30 ms, for "근처 재활용센터랑 폐건전지 수거함 알려줘" with a
-- location (location + collection_point by multi-intent, weather by the
-- location enrichment). The rest of the pipeline (aggregator, extractive
-- answer, heuristic feedback, summarize) runs as in `moongraph chat`.
--
--   latency     one run at a time: p50 / p90 / p99 / max over RUNS runs
--               (goal: p50 under 32 ms — the three branches overlap, the
--               engine and nodes add under 2 ms)
--   throughput  CONCURRENCY runs in flight in one process for TOTAL runs
--               (goal: >= 1,400 runs/s; the ideal is 50 / 30 ms = 1,667)
--
-- The same two measurements are then repeated on the same graph with every
-- node replaced by a stand-in that makes the same upstream request (one GET
-- for each routed branch) and returns a fixed result: the engine's own cost
-- (supersteps, Send fan-out, reducers, HTTP) without the nodes' parsing,
-- classification, answer, scoring and compression, to show where the time of
-- a turn goes.
--
--   ./moongraph run bench/pipeline.lua [RUNS] [CONCURRENCY] [TOTAL] [DELAY_MS]
package.path = "bench/?.lua;spec/support/?.lua;" .. package.path
local mg = require "moongraph"
local testserver = require "testserver"
local fx = require "node_fixtures"
local chat = require "scripts.eco.chat"
local rss = require "rss"

local RUNS = tonumber(arg and arg[1]) or 200
local CONCURRENCY = tonumber(arg and arg[2]) or 50
local TOTAL = tonumber(arg and arg[3]) or 3000
local DELAY_MS = tonumber(arg and arg[4]) or 30
local MESSAGE = "근처 재활용센터랑 폐건전지 수거함 알려줘"
local LOCATION = "서울특별시 강남구"
-- 2024-06-15 14:30 KST, the time of the recorded KMA forecast
local FORECAST_TIME = 1718429400

local srv = testserver.start()
srv:record {
  { path = "/v2/local/search/keyword.json", status = 200, body = fx.raw("kakao_keyword.json"), delay_ms = DELAY_MS },
  { path = "/v1/collection-points", status = 200, body = fx.raw("collection_points.json"), delay_ms = DELAY_MS },
  { path = "/getVilageFcst", status = 200, body = fx.raw("kma_vilage_fcst.json"), delay_ms = DELAY_MS },
}

local function percentile(sorted, p)
  local i = math.max(1, math.ceil(p / 100 * #sorted))
  return sorted[i]
end

local input = chat.input(MESSAGE, { location = LOCATION })

local function config()
  local cfg = fx.offline_ctx().config
  for _, s in ipairs({ "kakao", "collection_point", "kma" }) do
    cfg[s] = { base_url = srv.url, api_key = "bench", timeout = 5 }
  end
  cfg.clock = function() return FORECAST_TIME end
  return cfg
end

-- latency (one at a time) and throughput (CONCURRENCY in flight) of one() runs
local function measure(label, one)
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
  print(string.format("%s\n  latency over %d runs (upstreams answer in %d ms): p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms  (goal: p50 < %d ms)",
    label, RUNS, DELAY_MS, percentile(times, 50), percentile(times, 90), percentile(times, 99), times[#times],
    DELAY_MS + 2))
  print(string.format("    over the %d ms upstream wait: p50 +%.2f ms; CPU per run %.2f ms",
    DELAY_MS, percentile(times, 50) - DELAY_MS, cpu_seq))

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
  print(string.format("  throughput, %d runs in flight, %d runs: %.0f runs/s (goal >= 1,400; ideal %.0f); %d failed; CPU %.0f%% of one core, %.2f ms per run",
    CONCURRENCY, TOTAL, done / wall, CONCURRENCY / (DELAY_MS / 1000), failures, cpu / wall * 100, cpu / TOTAL * 1000))
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
measure("the pipeline", one)

-- the engine floor: the same graph and routing, stand-in nodes
local http = require "moongraph.http"
local adapter = require "nodes.lib.adapter"
local paths = { location = "/v2/local/search/keyword.json", collection_point = "/v1/collection-points",
                weather = "/getVilageFcst" }
local stand_in = {}
local canned_intent = require("nodes.intent").new { rules = require("scripts.eco.routing").rules }.run({ message = MESSAGE, user_location = LOCATION }, {})
stand_in.intent = { name = "intent", policy = "fail_close", run = function() return canned_intent end }
for _, n in ipairs(chat.branch_nodes) do
  stand_in[n] = { name = n, policy = "fail_open", run = function()
    if not paths[n] then return { contexts = { [n] = { ok = false, text = n } } } end
    -- the body decoded as a node must (status checked, JSON parsed)
    local body = adapter.decode(n, http.request { url = srv.url .. paths[n], timeout = 5 })
    return { contexts = { [n] = { ok = type(body) == "table", text = n } } }
  end }
end
for _, n in ipairs({ "answer", "feedback", "summarize" }) do
  stand_in[n] = { name = n, policy = "fail_close", run = function() return { [n .. "_done"] = true } end }
end
local floor_app = chat.build { nodes = stand_in }
measure("engine floor (same graph, stand-in nodes making the same three requests)", function()
  local s, err = floor_app:invoke(input, {})
  if not s then error(tostring(err), 0) end
  if not (s.contexts.location.ok and s.contexts.weather.ok and s.contexts.collection_point.ok) then
    error("stand-in run missed an upstream", 0)
  end
end)
print(string.format("peak RSS %.1f MiB", rss.peak() / 1024))
srv:stop()
