-- Checkpoints per second of each saver on the 10-node linear graph
-- (11 checkpoints and 10 pending writes per invoke), durability sync and
-- async, against throwaway servers started durable: PostgreSQL with fsync
-- on, Redis with appendfsync everysec. Memory and file savers for scale.
-- Usage: moongraph run bench/db_checkpoints.lua [invokes]
-- Prints lines "db_checkpoints <saver> <durability> <value> checkpoints/s (<ms> ms/invoke)".
package.path = "spec/support/?.lua;" .. package.path
local mg = require "moongraph"
local servers = require "servers"
local rsaver = require "moongraph.checkpoint.redis"
local postgres = require "moongraph.checkpoint.postgres"
local cached = require "moongraph.checkpoint.cached"

local INVOKES = tonumber(arg and arg[1]) or 60
local N_NODES = 10

local rsrv = servers.redis { appendfsync = "everysec" }
local psrv = servers.postgres { durable = true }
local guard <close> = setmetatable({}, { __close = function()
  rsrv:destroy()
  psrv:destroy()
end })

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

local graph = build()
local run_id = 0

local function measure(saver, durability, n)
  local app = graph:compile { checkpointer = saver, durability = durability }
  run_id = run_id + 1
  local t0 = mg.now()
  for i = 1, n do
    local out = assert(app:invoke({ count = 0, items = {} }, { thread_id = "b" .. run_id .. "-" .. i }))
    assert(out.count == N_NODES)
  end
  local dt = mg.now() - t0
  return n * (N_NODES + 1) / dt, dt / n * 1000
end

local dir = "bench/out/db_checkpoints_file"
os.execute("rm -rf " .. dir)
local db_n = 0
local function pg_url()
  db_n = db_n + 1
  return psrv:create_database("bench_" .. db_n)
end

local savers = {
  { "memory", function() return mg.checkpoint.memory() end },
  { "file", function() return mg.checkpoint.file(dir) end },
  { "redis", function() return rsaver.new(rsrv.url) end },
  { "postgres", function() return postgres.new(pg_url()) end },
  { "cached", function()
      return cached.new(rsaver.new(rsrv.url, { ttl = 3600, prefix = "bench-cache" .. db_n }),
        postgres.new(pg_url()))
    end },
}

for _, s in ipairs(savers) do
  for _, durability in ipairs { "sync", "async" } do
    local saver = s[2]()
    measure(saver, durability, 3)                      -- connect, migrate, warm up
    local best, ms = 0, 0
    for _ = 1, 3 do
      local r, m = measure(saver, durability, INVOKES)
      if r > best then best, ms = r, m end
    end
    print(string.format("db_checkpoints %-8s %-5s %8.0f checkpoints/s (%.2f ms/invoke)",
      s[1], durability, best, ms))
  end
end
os.execute("rm -rf " .. dir)
