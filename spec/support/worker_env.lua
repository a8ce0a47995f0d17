-- worker_env.lua — throwaway Redis + Postgres and `moongraph worker`
-- processes for the worker specs.
--
--   local wenv = require "worker_env"
--   local env = wenv.new{ persist = true }         -- servers (one pair per spec file)
--     (appendfsync = "everysec": Redis AOF with that policy; durable = true:
--     Postgres with fsync on, for benchmarks; sentinel = {...}: Redis as a
--     master, a replica and three sentinels, servers.redis_sentinel(those
--     options), in env.sentinel; env.redis_url is then its redis-sentinel:// URL)
--   env.redis_url, env.pg_url, env.checkpoint       -- checkpoint: the saver kind workers use
--   local w = env:worker{ "--concurrency", "8" }    -- a worker process (consumer w<N>)
--   w:wait_started()   w:signal("TERM")   w:kill()   w:wait(timeout) -> exit status
--   w:log_lines() -> decoded JSON log lines   w:output() -> stdout text
--   env:spawn(args) -> process running `moongraph ARGS` (same methods)
--   env:destroy()
--
-- The helpers that talk to Redis or Postgres, or wait, run inside a
-- moongraph task (mg.run). Every process is tied to the spec process: a
-- watchdog kills it when the spec process is gone.

local mg = require "moongraph"
local servers = require "servers"
local tmp = require "tmp"
local cjson = require "cjson.safe"

local _M = {}

local ROOT = (function()
  local p = io.popen("pwd")
  local d = p:read("l")
  p:close()
  return d
end)()
_M.ROOT = ROOT
_M.BIN = os.getenv("MOONGRAPH_BIN") or (ROOT .. "/moongraph")

local OWNER = io.open("/proc/self/stat"):read("l"):match("^%d+")

local function q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
_M.quote = q

local function read_file(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end
_M.read_file = read_file

-- a new empty directory (spec/support/tmp.lua: tmp.dir(tag, scope))
function _M.tmpdir(tag, scope)
  return tmp.dir(tag or "spec", scope)
end

-- Wait (in a task) until fn() returns a truthy value, at most `limit`
-- seconds; returns that value or raises with `what`.
function _M.eventually(what, limit, fn)
  local deadline = mg.now() + limit
  while true do
    local v = fn()
    if v then return v end
    if mg.now() > deadline then error("timed out after " .. limit .. " s waiting for " .. what, 2) end
    mg.sleep(0.05)
  end
end

---------------------------------------------------------------- processes

local Proc = {}
Proc.__index = Proc

-- spawn{args, env = {NAME = value}, dir = tmp} -> process running the binary
function _M.spawn(args, env, dir)
  -- kept until the spec file ends (or Env:destroy): the process may
  -- outlive the test that started it until teardown stops it
  dir = dir or _M.tmpdir("proc", "file")
  local parts = { "cd", q(ROOT), "&&", "exec", "env" }
  for k, v in pairs(env or {}) do parts[#parts + 1] = q(k .. "=" .. v) end
  parts[#parts + 1] = q(_M.BIN)
  for _, a in ipairs(args) do parts[#parts + 1] = q(a) end
  local run = table.concat(parts, " ")
  local inner = string.format([[
( %s ) >%s 2>%s </dev/null &
p=$!
echo $p >%s.tmp && mv %s.tmp %s
( while kill -0 %s 2>/dev/null && kill -0 $p 2>/dev/null; do sleep 1; done; kill -9 $p 2>/dev/null ) >/dev/null 2>&1 &
wait $p
echo $? >%s.tmp && mv %s.tmp %s
]], run, q(dir .. "/out"), q(dir .. "/log"), q(dir .. "/pid"), q(dir .. "/pid"), q(dir .. "/pid"),
    OWNER, q(dir .. "/code"), q(dir .. "/code"), q(dir .. "/code"))
  assert(os.execute("setsid sh -c " .. q(inner) .. " </dev/null >/dev/null 2>&1 &"))
  local self = setmetatable({ dir = dir, args = args }, Proc)
  local deadline = os.time() + 10
  while not self.pid do
    local s = read_file(dir .. "/pid")
    if s and s:match("%d+") then self.pid = tonumber(s:match("%d+")) end
    if not self.pid then
      if os.time() > deadline then error("process did not start: " .. run) end
      os.execute("sleep 0.02")
    end
  end
  return self
end

function Proc:signal(name)
  os.execute("kill -" .. name .. " " .. self.pid .. " 2>/dev/null")
end

function Proc:kill()
  self:signal("KILL")
  return self:wait(10)
end

function Proc:exit_code()
  local s = read_file(self.dir .. "/code")
  return s and tonumber(s:match("%d+")) or nil
end

function Proc:running()
  return self:exit_code() == nil
end

-- wait(limit) -> exit status (in a task)
function Proc:wait(limit)
  return _M.eventually("process " .. self.pid .. " to exit", limit or 30, function()
    return self:exit_code()
  end)
end

function Proc:output() return read_file(self.dir .. "/out") or "" end
function Proc:log() return read_file(self.dir .. "/log") or "" end

function Proc:log_lines()
  local out = {}
  for line in self:log():gmatch("[^\n]+") do
    local v = cjson.decode(line)
    if type(v) == "table" then out[#out + 1] = v end
  end
  return out
end

-- Log lines with msg (a plain substring).
function Proc:logged(msg)
  local out = {}
  for _, l in ipairs(self:log_lines()) do
    if type(l.msg) == "string" and l.msg:find(msg, 1, true) then out[#out + 1] = l end
  end
  return out
end

function Proc:wait_started(limit)
  return _M.eventually("the worker to start (log: " .. self.dir .. "/log)", limit or 20, function()
    if not self:running() then error("worker exited with " .. tostring(self:exit_code()) .. ":\n" .. self:log()) end
    return self:logged("worker started")[1]
  end)
end

---------------------------------------------------------------- environment

local Env = {}
Env.__index = Env

function _M.new(opts)
  opts = opts or {}
  local self = setmetatable({ procs = {}, n = 0 }, Env)
  if opts.sentinel then
    self.sentinel = servers.redis_sentinel(opts.sentinel)
    self.redis_url = self.sentinel.url
  else
    self.redis = servers.redis { persist = opts.persist, appendfsync = opts.appendfsync }
    self.redis_url = self.redis.url
  end
  self.pg = servers.postgres { durable = opts.durable }
  self.pg_url = self.pg.url
  self.dir = _M.tmpdir("worker", "file")
  -- the workers' default saver: Postgres behind a Redis cache
  self.checkpoint = opts.checkpoint or "cached"
  return self
end

-- worker(args [, env]) -> process of `moongraph worker` on this
-- environment's servers (consumer w1, w2, ... unless args name one).
function Env:worker(args, env)
  self.n = self.n + 1
  local full = { "worker", "--redis", self.redis_url, "--pg", self.pg_url,
                 "--checkpoint", self.checkpoint, "--heartbeat", "0.5" }
  local has_consumer = false
  for _, a in ipairs(args or {}) do
    full[#full + 1] = a
    if a == "--consumer" then has_consumer = true end
  end
  if not has_consumer then
    full[#full + 1] = "--consumer"
    full[#full + 1] = "w" .. self.n
  end
  local e = { MOONGRAPH_REDIS_URL = self.redis_url, MOONGRAPH_PG_URL = self.pg_url }
  for k, v in pairs(env or {}) do e[k] = v end
  local p = _M.spawn(full, e)
  self.procs[#self.procs + 1] = p
  return p
end

function Env:spawn(args, env)
  local p = _M.spawn(args, env)
  self.procs[#self.procs + 1] = p
  return p
end

-- Connections for the spec itself (inside a task).
function Env:conns()
  local redis = require "moongraph.redis"
  local pg = require "moongraph.pg"
  local r = assert(redis.connect(self.redis_url))
  local db = assert(pg.connect(self.pg_url))
  return r, db
end

function Env:stop_all()
  for _, p in ipairs(self.procs) do
    if p:running() then p:signal("KILL") end
  end
end

function Env:destroy()
  self:stop_all()
  -- (outside any task: wait for the killed processes with plain sleeps)
  for _ = 1, 100 do
    local alive = false
    for _, p in ipairs(self.procs) do alive = alive or p:running() end
    if not alive then break end
    os.execute("sleep 0.05")
  end
  if self.redis then self.redis:destroy() end
  if self.sentinel then self.sentinel:destroy() end
  if self.pg then self.pg:destroy() end
  tmp.remove(self.dir)
  for _, p in ipairs(self.procs) do tmp.remove(p.dir) end
end

-- Every job id of job_results -> row count, and the total.
function _M.result_counts(db)
  local rows = assert(db:query("SELECT job_id, count(*) AS n FROM job_results GROUP BY job_id"))
  local by = {}
  for _, r in ipairs(rows) do by[r.job_id] = r.n end
  return by, #rows
end

return _M
