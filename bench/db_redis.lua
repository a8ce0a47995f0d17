-- Redis SET/GET requests per second from 64 tasks, next to redis-benchmark
-- against the same throwaway server in the same run:
--   redis-benchmark -c 64: 64 connections, one request in flight on each
--   redis-benchmark -c 1 -P 64: one connection, 64 requests pipelined
--   moongraph, one connection: the 64 tasks' commands are pipelined on it
--   moongraph, pool of 8
-- Usage: moongraph run bench/db_redis.lua [requests]
-- Prints lines "db_redis <case> <SET|GET> <value> req/s".
package.path = "spec/support/?.lua;" .. package.path
local mg = require "moongraph"
local redis = require "moongraph.redis"
local servers = require "servers"

local N = tonumber(arg and arg[1]) or 200000
local TASKS = 64

local srv = servers.redis()
local guard <close> = setmetatable({}, { __close = function() srv:destroy() end })

local function rate(client, cmd)
  local per = N // TASKS
  local tasks = {}
  local t0 = mg.now()
  for t = 1, TASKS do
    tasks[t] = mg.spawn(function()
      for i = 1, per do
        local key = "key:" .. ((t * per + i) % 10000)
        local v, err
        if cmd == "SET" then v, err = client:call("SET", key, "xxx")
        else v, err = client:call("GET", key) end
        if v == nil then error(err) end
      end
    end)
  end
  for t = 1, TASKS do assert(tasks[t]:join()) end
  return per * TASKS / (mg.now() - t0)
end

local function best(client, cmd)
  local b = 0
  for _ = 1, 3 do b = math.max(b, rate(client, cmd)) end
  return b
end

local conn = assert(redis.connect(srv.url))
local pool = redis.pool(srv.url, { size = 8 })
rate(conn, "SET")                                     -- warm up
for _, cmd in ipairs { "SET", "GET" } do
  print(string.format("db_redis moongraph-1-conn %s %.0f req/s", cmd, best(conn, cmd)))
  print(string.format("db_redis moongraph-pool-8 %s %.0f req/s", cmd, best(pool, cmd)))
end

-- redis-benchmark prints progress with \r; the last line per test has the figure
local function redis_benchmark(label, flags)
  local p = assert(io.popen(string.format(
    "env -u LD_PRELOAD redis-benchmark -h 127.0.0.1 -p %d -q -t set,get -n %d %s 2>&1",
    srv.port, N, flags)))
  local out = p:read("a")
  p:close()
  for line in (out:gsub("\r", "\n")):gmatch("[^\n]+") do
    local cmd, rps = line:match("^(%u+): ([%d.]+) requests per second")
    if cmd then print(string.format("db_redis %s %s %.0f req/s", label, cmd, tonumber(rps))) end
  end
end
redis_benchmark("redis-benchmark-c64", "-c " .. TASKS)
-- the same 64 requests in flight, pipelined on one connection as moongraph does
redis_benchmark("redis-benchmark-c1-P64", "-c 1 -P " .. TASKS)
