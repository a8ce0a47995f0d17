-- Store operations per second from 64 tasks, moongraph beside LangGraph.js
-- (bench/peer/store/store.mjs: InMemoryStore and PostgresStore) in one run:
-- put, get, get in batches of 10, and a filtered search (limit 10 in a
-- namespace of 8 x per_task items). Rounds are interleaved (moongraph
-- memory, LangGraph.js memory, moongraph postgres, LangGraph.js postgres)
-- and the table gives medians, the ratio moongraph / LangGraph.js (higher
-- is better for moongraph) and the load average before and after.
-- PostgreSQL is a throwaway server with fsync on; both sides use a pool of
-- 8 connections. `make bench-store` runs it.
-- Usage: moongraph run bench/store.lua [rounds] [per_task] [searches_per_task]
package.path = "bench/?.lua;spec/support/?.lua;" .. package.path
local mg = require "moongraph"
local servers = require "servers"

local ROUNDS = tonumber(arg and arg[1]) or 5
local PER_TASK = tonumber(arg and arg[2]) or 50
local SEARCHES = tonumber(arg and arg[3]) or 10
local TASKS = 64
assert(PER_TASK % 10 == 0, "per_task must be a multiple of 10")

local function loadavg()
  local f = io.open("/proc/loadavg")
  if not f then return "?" end
  local s = f:read("l")
  f:close()
  return s:match("^(%S+ %S+ %S+)")
end

local load_before = loadavg()
local psrv = servers.postgres { durable = true }
local guard <close> = setmetatable({}, { __close = function() psrv:destroy() end })
local mg_url = psrv:create_database("bench_store_mg")
local js_url = psrv:create_database("bench_store_js")

local function ns(t) return { "bench", "u" .. (t % 8) } end
local function key(t, i) return "k" .. i .. "-" .. t end

local function phase(per_task, fn)
  local t0 = mg.now()
  local work = {}
  for t = 0, TASKS - 1 do
    work[#work + 1] = function()
      for i = 0, per_task - 1 do fn(t, i) end
    end
  end
  mg.gather(work)
  return TASKS * per_task / (mg.now() - t0)
end

local function run_ours(s)
  local r = {}
  r.put = phase(PER_TASK, function(t, i)
    assert(s:put(ns(t), key(t, i), { text = "memory number " .. i .. " of task " .. t,
      kind = i % 2 == 1 and "odd" or "even", n = i }))
  end)
  r.get = phase(PER_TASK, function(t, i)
    local k = (i * 7) % PER_TASK
    local item = assert(s:get(ns(t), key(t, k)))
    assert(item.value.n == k)
  end)
  r.get_batch10 = 10 * phase(PER_TASK // 10, function(t, i)
    local ops = {}
    for j = 0, 9 do
      ops[#ops + 1] = { op = "get", namespace = ns(t), key = key(t, (i * 10 + j) % PER_TASK) }
    end
    local res = assert(s:batch(ops))
    assert(res.n == 10 and res[10])
  end)
  r.search = phase(SEARCHES, function(t)
    local items = assert(s:search(ns(t), { filter = { kind = "even" }, limit = 10 }))
    assert(#items == 10)
  end)
  return r
end

local have_peer = io.open("bench/peer/store/node_modules/@langchain/langgraph-checkpoint-postgres/package.json")
if have_peer then have_peer:close() end
if not have_peer then
  print("LangGraph.js peer not installed (make bench-store installs it with npm); moongraph figures only")
end

local function run_peer(backend, url)
  local p = io.popen(string.format("node --no-warnings bench/peer/store/store.mjs %s '%s' %d %d 2>&1",
    backend, url, PER_TASK, SEARCHES))
  local out = p:read("a")
  local ok = p:close()
  if not ok then error("LangGraph.js peer failed:\n" .. out) end
  local r = {}
  for op, v in out:gmatch("peer %S+ (%S+) (%d+)") do r[op] = tonumber(v) end
  return r
end

local samples = {}   -- samples[system .. " " .. backend][op] = { values }
local function keep(name, r)
  samples[name] = samples[name] or {}
  for op, v in pairs(r) do
    local list = samples[name][op] or {}
    list[#list + 1] = v
    samples[name][op] = list
  end
end

local mem_store = mg.store.memory()
local pg_store = mg.store.postgres(mg_url, { pool_size = 8 })

-- `moongraph run` runs this file as a task: the loop is already going
assert(pg_store:put({ "warm" }, "up", { x = 1 }))           -- migrations
for round = 1, ROUNDS do
  keep("moongraph memory", run_ours(mem_store))
  if have_peer then keep("langgraphjs memory", run_peer("memory", "")) end
  keep("moongraph postgres", run_ours(pg_store))
  if have_peer then keep("langgraphjs postgres", run_peer("postgres", js_url)) end
  io.stderr:write(string.format("round %d/%d done\n", round, ROUNDS))
end

local median = require("stats").median

print(string.format("\nStore ops/s from %d tasks, median of %d interleaved rounds (%d puts, %d gets, %d batched gets, %d searches per task per round)",
  TASKS, ROUNDS, PER_TASK, PER_TASK, PER_TASK, SEARCHES))
print(string.format("%-10s %-12s %14s %16s %8s", "backend", "op", "moongraph", "LangGraph.js", "ratio"))
for _, backend in ipairs { "memory", "postgres" } do
  for _, op in ipairs { "put", "get", "get_batch10", "search" } do
    local a = median((samples["moongraph " .. backend] or {})[op])
    local b = median((samples["langgraphjs " .. backend] or {})[op])
    print(string.format("%-10s %-12s %14.0f %16s %8s", backend, op, a,
      b and string.format("%.0f", b) or "-", b and string.format("%.2fx", a / b) or "-"))
  end
end
print(string.format("load average before: %s, after: %s (2 shared cores)", load_before, loadavg()))
