-- servers.lua — throwaway redis-server and PostgreSQL instances for specs.
--
--   local servers = require "servers"
--   local r = servers.redis{ persist = true, password = "pw" }  -- raises with the reason on failure
--     persist = true: AOF, appendfsync always; appendfsync = "everysec": AOF with that policy
--   r.url, r.unix_url, r.port, r.dir           r:cli("GET", "k") -> reply text
--   r:stop("term"|"kill")   r:start()   r:restart(mode)   r:running()   r:destroy()
--     servers.redis{ replicaof = port }: a replica of 127.0.0.1:port
--     servers.redis{ sentinel_of = port, master_name =, quorum =, down_after = ms,
--                    failover_timeout = ms, master_password = }: a Redis Sentinel
--   local g = servers.redis_sentinel{ password = "pw", sentinel_password = "spw" }
--     a master, one replica and three sentinels (master name mymaster,
--     down-after 1000 ms); g.url (redis-sentinel://...), g.master, g.replica,
--     g.sentinels, g:wait_ready(limit) (replica in sync, every sentinel sees
--     the replica and the two others), g:master_port() (the sentinels' answer),
--     g:destroy()
--   local p = servers.postgres()               -- one per spec file: start in setup, destroy in teardown
--     servers.postgres{ durable = true }: keep fsync on (benchmarks); the default turns it off
--   p.url, p.unix_url, p.port, p.dir           p:psql(sql) -> output   p:create_database(name) -> url
--   p:stop("fast"|"immediate")   p:start()   p:restart(mode)   p:running()   p:destroy()
--
-- The work is done by servers.sh next to this file; every instance is tied to
-- the calling process and removed by a watchdog if the process dies without
-- calling destroy(). These calls block the process: when one runs inside a
-- moongraph task, the whole loop waits for it, which is what a spec wants when
-- it bounces a server under running work.

local tmp = require "tmp"

local io_popen, os_execute = io.popen, os.execute
local format = string.format

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local script = here .. "/servers.sh"

local _M = {}

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Run servers.sh with args (plus raw shell text `extra`); return its stdout,
-- or raise with what it printed on stderr.
local function run(args, extra, what)
  -- the servers and tools must not inherit a sanitizer preload (make asan)
  local parts = { "env -u LD_PRELOAD", shell_quote(script) }
  for i = 1, #args do parts[#parts + 1] = shell_quote(args[i]) end
  local errfile = tmp.path("stderr", "servers")
  local cmd = table.concat(parts, " ") .. (extra or "") .. " 2>" .. shell_quote(errfile)
  local f = assert(io_popen(cmd, "r"))
  local out = f:read("a")
  local ok, _, code = f:close()
  local ef = io.open(errfile, "r")
  local err = ef and ef:read("a") or ""
  if ef then ef:close() end
  tmp.remove(errfile)
  if not ok then
    error(format("%s (servers.sh exit %s): %s", what or ("servers.sh " .. table.concat(args, " ")),
      tostring(code), err ~= "" and err or "(no output)"), 3)
  end
  return out
end

local function parse(out)
  local t = {}
  for k, v in out:gmatch("([%w_]+)=([^\n]*)") do t[k] = v end
  return t
end

local Server = {}
Server.__index = Server

local function new(kind, args)
  -- $PPID inside popen's shell is this Lua process: the watchdog's owner.
  local out = run(args, ' --owner "$PPID"', "cannot start a throwaway " .. kind)
  local s = parse(out)
  s.port = tonumber(s.port)
  s.pid = tonumber(s.pid)
  if not (s.dir and s.port and s.pid and s.url) then
    error("servers.sh started a " .. kind .. " but did not describe it: " .. out, 3)
  end
  s.alive = true
  return setmetatable(s, Server)
end

function _M.redis(opts)
  opts = opts or {}
  local args = { "redis", "start" }
  if opts.persist then args[#args + 1] = "--persist" end
  if opts.appendfsync then
    args[#args + 1] = "--appendfsync"
    args[#args + 1] = opts.appendfsync
  end
  if opts.password then
    args[#args + 1] = "--password"
    args[#args + 1] = opts.password
  end
  for _, o in ipairs { { "replicaof", "--replicaof" }, { "sentinel_of", "--sentinel-of" },
                       { "master_name", "--master-name" }, { "quorum", "--quorum" },
                       { "down_after", "--down-after" }, { "failover_timeout", "--failover-timeout" },
                       { "master_password", "--master-password" } } do
    if opts[o[1]] then
      args[#args + 1] = o[2]
      args[#args + 1] = tostring(opts[o[1]])
    end
  end
  return new(opts.sentinel_of and "Redis Sentinel" or "redis-server", args)
end

local Group = {}
Group.__index = Group

function _M.redis_sentinel(opts)
  opts = opts or {}
  local g = setmetatable({ name = opts.master_name or "mymaster", sentinels = {} }, Group)
  local ok, err = pcall(function()
    g.master = _M.redis { password = opts.password }
    g.replica = _M.redis { password = opts.password, replicaof = g.master.port }
    local addrs = {}
    for i = 1, opts.count or 3 do
      g.sentinels[i] = _M.redis {
        sentinel_of = g.master.port, master_name = g.name, password = opts.sentinel_password,
        master_password = opts.password, down_after = opts.down_after or 1000,
        failover_timeout = opts.failover_timeout or 3000, quorum = opts.quorum or 2,
      }
      addrs[i] = "127.0.0.1:" .. g.sentinels[i].port
    end
    local auth = opts.password and (":" .. opts.password .. "@") or ""
    g.url = "redis-sentinel://" .. auth .. table.concat(addrs, ",") .. "/" .. g.name
      .. (opts.sentinel_password and ("?sentinel_password=" .. opts.sentinel_password) or "")
  end)
  if not ok then
    g:destroy()
    error(err, 2)
  end
  return g
end

-- `SENTINEL master NAME` of sentinel s as a table.
local function sentinel_view(g, s)
  local out = s:cli("SENTINEL", "master", g.name)
  local t, key = {}, nil
  for line in out:gmatch("[^\n]+") do
    if key then t[key] = line; key = nil else key = line end
  end
  return t
end

function Group:wait_ready(limit)
  local deadline = os.time() + (limit or 30)
  while true do
    local ready = self.replica:cli("INFO", "replication"):find("master_link_status:up", 1, true) ~= nil
    for _, s in ipairs(self.sentinels) do
      local v = sentinel_view(self, s)
      ready = ready and v["num-slaves"] == "1" and v["num-other-sentinels"] == tostring(#self.sentinels - 1)
    end
    if ready then return true end
    if os.time() > deadline then error("the sentinel group did not get ready", 2) end
    os.execute("sleep 0.1")
  end
end

-- The master's port as the first sentinel that answers gives it.
function Group:master_port()
  for _, s in ipairs(self.sentinels) do
    if s:running() then
      local out = s:cli("SENTINEL", "get-master-addr-by-name", self.name)
      local port = out:match("\n(%d+)$")
      if port then return tonumber(port) end
    end
  end
  return nil
end

function Group:destroy()
  for _, s in ipairs(self.sentinels) do s:destroy() end
  if self.replica then self.replica:destroy() end
  if self.master then self.master:destroy() end
end

function _M.postgres(opts)
  local args = { "pg", "start" }
  if opts and opts.durable then args[#args + 1] = "--durable" end
  return new("PostgreSQL", args)
end

function Server:stop(mode)
  assert(self.alive, "server destroyed")
  run({ "stop", self.dir, mode })
end

function Server:start()
  assert(self.alive, "server destroyed")
  local t = parse(run({ "start", self.dir }))
  if t.pid then self.pid = tonumber(t.pid) end
end

function Server:restart(mode)
  self:stop(mode)
  self:start()
end

function Server:running()
  if not self.alive then return false end
  local ok = os_execute("env -u LD_PRELOAD " .. shell_quote(script) .. " status " .. shell_quote(self.dir))
  return ok == true
end

function Server:destroy()
  if not self.alive then return end
  self.alive = false
  run({ "destroy", self.dir })
end

-- redis-cli against this server; returns trimmed output (raw, --no-raw off).
function Server:cli(...)
  assert(self.kind == "redis", "cli() is for redis servers")
  local parts = { "env -u LD_PRELOAD redis-cli", "-s", shell_quote(self.socket) }
  if self.url:match("^redis://:") then
    parts[#parts + 1] = "-a " .. shell_quote(self.url:match("^redis://:([^@]*)@")) .. " --no-auth-warning"
  end
  for i = 1, select("#", ...) do parts[#parts + 1] = shell_quote((select(i, ...))) end
  local f = assert(io_popen(table.concat(parts, " ") .. " 2>&1", "r"))
  local out = f:read("a")
  f:close()
  return (out:gsub("\n$", ""))
end

-- psql against this server (database `db`, default postgres); raises on
-- error with psql's message, returns unaligned tuples-only output.
function Server:psql(sql, db)
  assert(self.kind == "pg", "psql() is for PostgreSQL servers")
  local errfile = tmp.path("stderr", "psql")
  local cmd = format("env -u LD_PRELOAD psql -X -q -v ON_ERROR_STOP=1 -h %s -p %d -U postgres -d %s -At -c %s 2>%s",
    shell_quote(self.socket_dir), self.port, shell_quote(db or "postgres"), shell_quote(sql),
    shell_quote(errfile))
  local f = assert(io_popen(cmd, "r"))
  local out = f:read("a")
  local ok = f:close()
  local ef = io.open(errfile, "r")
  local err = ef and ef:read("a") or ""
  if ef then ef:close() end
  tmp.remove(errfile)
  if not ok then error("psql: " .. err, 2) end
  return (out:gsub("\n$", ""))
end

-- A fresh database on this server; returns its URL. Specs sharing one
-- server use one database each so they cannot see each other's tables.
function Server:create_database(name)
  assert(name:match("^[%a_][%w_]*$"), "database name must be an identifier")
  self:psql("CREATE DATABASE " .. name)
  return format("postgresql://postgres@127.0.0.1:%d/%s", self.port, name)
end

_M.script = script

return _M
