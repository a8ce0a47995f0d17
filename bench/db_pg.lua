-- PostgreSQL round trips per second: `SELECT 1` from 64 tasks through a pool
-- of 8 connections, next to pgbench with 8 clients running the same
-- statement (extended protocol, as moongraph.pg uses) against the same
-- throwaway server in the same run.
-- Usage: moongraph run bench/db_pg.lua [queries]
-- Prints lines "db_pg <case> <value> queries/s".
package.path = "spec/support/?.lua;" .. package.path
local mg = require "moongraph"
local pg = require "moongraph.pg"
local servers = require "servers"

local N = tonumber(arg and arg[1]) or 40000
local TASKS, SIZE = 64, 8

local srv = servers.postgres()
local guard <close> = setmetatable({}, { __close = function() srv:destroy() end })

local function rate(db, n)
  local per = n // TASKS
  local tasks = {}
  local t0 = mg.now()
  for t = 1, TASKS do
    tasks[t] = mg.spawn(function()
      for _ = 1, per do
        local rows, err = db:query("SELECT 1")
        if not rows then error(err) end
      end
    end)
  end
  for t = 1, TASKS do assert(tasks[t]:join()) end
  return per * TASKS / (mg.now() - t0)
end

local pool = pg.pool(srv.url, { size = SIZE })
rate(pool, 2000)                                       -- open the connections
local best = 0
for _ = 1, 3 do best = math.max(best, rate(pool, N)) end
print(string.format("db_pg moongraph-pool-8-64-tasks %.0f queries/s", best))

local one = assert(pg.connect(srv.url))
print(string.format("db_pg moongraph-1-conn-64-tasks %.0f queries/s", rate(one, N // 4)))

local script = os.tmpname()
local f = assert(io.open(script, "w"))
f:write("SELECT 1;\n")
f:close()
local p = assert(io.popen(string.format(
  "env -u LD_PRELOAD %s/pgbench -n -M extended -c %d -j 2 -t %d -f %s %q 2>&1",
  srv.bindir, SIZE, N // SIZE, script, srv.url)))
local out = p:read("a")
p:close()
os.remove(script)
local tps = out:match("tps = ([%d.]+)")
if tps then
  print(string.format("db_pg pgbench-c8-extended %.0f queries/s", tonumber(tps)))
else
  print("db_pg pgbench failed: " .. out)
end
