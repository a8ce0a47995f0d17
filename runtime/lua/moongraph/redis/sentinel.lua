-- moongraph.redis.sentinel — where the master of a Redis Sentinel setup is.
--
--   local sentinel = require "moongraph.redis.sentinel"
--   local hosts = assert(sentinel.parse_hosts("10.0.0.1:26379,10.0.0.2"))
--   local host, port = sentinel.master_addr{ sentinels = hosts, master = "mymaster",
--                                           connect_timeout = 5 }
--   sentinel.demoted("READONLY You can't write against a read only replica.")  --> true
--
-- master_addr follows the Sentinel client guidelines: the sentinels are
-- asked in turn (SENTINEL get-master-addr-by-name) with a short timeout,
-- the first one that knows the master answers, and it moves to the front
-- of the list so the next lookup asks it first. The caller checks with ROLE
-- that the address really is a master before using it.

local errors = require "moongraph.errors"
local craw = require("moongraph.core").redis

local type, tonumber, tostring = type, tonumber, tostring
local concat, insert, remove = table.concat, table.insert, table.remove
local format, min = string.format, math.min

local _M = {}

_M.DEFAULT_PORT = 26379

-- Seconds a sentinel gets to connect and answer before the next one is asked.
_M.QUERY_TIMEOUT = 1

-- "host[:port],[v6addr]:port,..." -> { {host=, port=, addr=}, ... } | nil, err
function _M.parse_hosts(list)
  if list == "" then return nil, "no sentinel address" end
  local hosts = {}
  for item in (list .. ","):gmatch("([^,]*),") do
    if item == "" then return nil, "empty sentinel address in the list" end
    local host, port
    if item:sub(1, 1) == "[" then
      host, port = item:match("^%[([^%]]+)%]:?(.*)$")
    else
      host, port = item:match("^([^:]*):?(.*)$")
    end
    if not host or host == "" then return nil, format("no host in sentinel address '%s'", item) end
    local n = _M.DEFAULT_PORT
    if port ~= "" then
      n = port:find("^%d+$") and tonumber(port)
      if not n or n < 1 or n > 65535 then
        return nil, format("bad port in sentinel address '%s'", item)
      end
    end
    hosts[#hosts + 1] = { host = host, port = n, addr = host .. ":" .. n }
  end
  return hosts
end

-- Ask one sentinel; -> host, port | nil, err, permanent (permanent: it
-- answered, refusing the password or not knowing the master)
local function ask(s, cfg)
  local timeout = min(cfg.connect_timeout, _M.QUERY_TIMEOUT)
  local raw, err = craw.connect(s.host, s.port, timeout)
  if not raw then return nil, err end
  raw:set_timeout(timeout)
  local cmds = {}
  if cfg.sentinel_password then cmds[#cmds + 1] = { "AUTH", cfg.sentinel_password } end
  cmds[#cmds + 1] = { "SENTINEL", "get-master-addr-by-name", cfg.master }
  local res
  res, err = raw:pipeline(cmds)
  raw:close()
  if not res then return nil, err end
  for i = 1, #res - 1 do
    if type(res[i]) == "table" and res[i][1] == false then
      return nil, format("AUTH on sentinel %s failed: %s", s.addr, tostring(res[i][2])), true
    end
  end
  local reply = res[#res]
  if reply == craw.null then return nil, format("sentinel %s does not know master '%s'", s.addr, cfg.master), true end
  if type(reply) ~= "table" or reply[1] == false then
    return nil, format("sentinel %s: %s", s.addr, tostring(type(reply) == "table" and reply[2] or reply))
  end
  local port = tonumber(reply[2])
  if type(reply[1]) ~= "string" or not port then
    return nil, format("sentinel %s gave no usable address for '%s'", s.addr, cfg.master)
  end
  return reply[1], port
end

-- master_addr(cfg) -> host, port | nil, err, permanent. cfg: sentinels
-- (reordered in place), master, connect_timeout, sentinel_password.
-- permanent: every sentinel answered, and none with the address (asking
-- again will not help).
function _M.master_addr(cfg)
  local list = cfg.sentinels
  local errs, permanent = {}, true
  for i = 1, #list do
    local s = list[i]
    local host, port, perm = ask(s, cfg)
    if host then
      if i > 1 then insert(list, 1, remove(list, i)) end
      return host, port
    end
    errs[#errs + 1] = tostring(port)
    permanent = permanent and perm == true
  end
  return nil, format("redis-sentinel: no sentinel gave the address of master '%s' (%s)",
    cfg.master, concat(errs, "; ")), permanent
end

-- An error reply from a node that is no master (any more), or not ready
-- yet: the command did not run, and the master is to be looked up again.
function _M.demoted(err)
  return errors.has(err, "redis:READONLY", "redis:LOADING")
end

return _M
