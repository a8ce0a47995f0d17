-- moongraph.worker.queue — the jobs stream as a work queue (Redis Streams
-- consumer groups).
--
--   local q = queue.new{ redis = r, keys = cfg.keys, group = "moongraph", consumer = "w1" }
--   q:ensure_group()
--   q:read(count, block)            -> { {id=, fields=, deliveries=1}, ... } | nil, err
--   q:claim(count, min_idle)        -> entries idle for min_idle s, now ours (deliveries counted)
--   q:renew(ids)                    -> ids we no longer own
--   q:release(ids, idle)            -> let another worker claim them at once
--   q:ack(id)                       -> XACK and XDEL
--   q:dead(id, fields, reason, info) -> copy to the dead-letter stream, XACK, XDEL
--   q:leave()                       -> remove this consumer from the group if nothing is pending on it
--   q:reap(min_idle, heartbeat_prefix) -> remove other consumers with nothing pending, idle
--                                      that long and without a heartbeat key: names removed
--
-- A job stays in the group's pending list from delivery until ack: a worker
-- that dies leaves it there, and another one claims it (XAUTOCLAIM) once it
-- has been idle long enough. A worker renews its jobs' idle time while they
-- run, so only the jobs of a dead or stalled worker are claimed. Acked jobs
-- are deleted from the stream, which therefore holds only work not done yet.

local type, tostring, tonumber, ipairs, pairs, setmetatable, unpack =
  type, tostring, tonumber, ipairs, pairs, setmetatable, table.unpack
local errors = require "moongraph.errors"
local floor = math.floor

local _M = {}
local Q = {}
Q.__index = Q

_M.DEAD_MAXLEN = 100000

function _M.new(opts)
  return setmetatable({
    redis = opts.redis, stream = opts.keys.jobs, dead_stream = opts.keys.dead,
    group = opts.group, consumer = opts.consumer, cursor = "0-0",
  }, Q)
end

function Q:ensure_group()
  local r, err = self.redis:call("XGROUP", "CREATE", self.stream, self.group, "0", "MKSTREAM")
  if r then return true end
  if errors.has(err, "redis:BUSYGROUP") then return true end
  return nil, err
end

local function entries_of(list, deliveries)
  local out = {}
  for _, e in ipairs(list or {}) do
    if type(e) == "table" and type(e[1]) == "string" then
      out[#out + 1] = { id = e[1], fields = type(e[2]) == "table" and e[2] or {}, deliveries = deliveries }
    end
  end
  return out
end

-- read(count, block_seconds) -> new entries for this consumer
function Q:read(count, block)
  local res, err = self.redis:call("XREADGROUP", "GROUP", self.group, self.consumer,
    "COUNT", count, "BLOCK", floor(block * 1000), "STREAMS", self.stream, ">")
  if not res then
    if errors.has(err, "redis:NOGROUP") then
      local ok, gerr = self:ensure_group()
      if not ok then return nil, gerr end
      return {}
    end
    return nil, err
  end
  if type(res) ~= "table" or not res[1] then return {} end
  return entries_of(res[1][2], 1)
end

-- claim(count, min_idle_seconds) -> entries (each with its delivery count)
function Q:claim(count, min_idle)
  local res, err = self.redis:call("XAUTOCLAIM", self.stream, self.group, self.consumer,
    floor(min_idle * 1000), self.cursor, "COUNT", count)
  if not res then
    if errors.has(err, "redis:NOGROUP") then
      local ok, gerr = self:ensure_group()
      if not ok then return nil, gerr end
      return {}
    end
    return nil, err
  end
  self.cursor = type(res[1]) == "string" and res[1] or "0-0"
  local out = entries_of(res[2], nil)
  if #out == 0 then return out end
  local cmds = {}
  for i, e in ipairs(out) do cmds[i] = { "XPENDING", self.stream, self.group, e.id, e.id, 1 } end
  local p = self.redis:pipeline(cmds)
  for i, e in ipairs(out) do
    local row = p and p[i] and p[i][1]
    e.deliveries = type(row) == "table" and tonumber(row[4]) or 2
  end
  return out
end

local RENEW = [[
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
]]

-- renew(ids) -> list of ids that are no longer ours | nil, err
function Q:renew(ids)
  if #ids == 0 then return {} end
  local res, err = self.redis:call("EVAL", RENEW, 1, self.stream, self.group, self.consumer, unpack(ids))
  if not res then return nil, err end
  return type(res) == "table" and res or {}
end

local RELEASE = [[
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'JUSTID')
  end
end
return 1
]]

-- release(ids, idle_seconds): mark our pending ids as idle for that long,
-- so the next claim pass of any worker takes them.
function Q:release(ids, idle)
  if #ids == 0 then return true end
  return self.redis:call("EVAL", RELEASE, 1, self.stream, self.group, self.consumer,
    floor(idle * 1000), unpack(ids))
end

function Q:ack(id)
  local res, err = self.redis:pipeline {
    { "XACK", self.stream, self.group, id },
    { "XDEL", self.stream, id },
  }
  if not res then return nil, err end
  if type(res[1]) == "table" and res[1][1] == false then return nil, res[1][2] end
  return true
end

-- dead(id, fields, reason, info): the entry's fields, the reason and info
-- (a table of strings) go to the dead-letter stream, in one transaction
-- with the ack.
function Q:dead(id, fields, reason, info)
  local add = { "XADD", self.dead_stream, "MAXLEN", "~", _M.DEAD_MAXLEN, "*",
                "reason", reason, "entry_id", id, "consumer", self.consumer }
  for k, v in pairs(info or {}) do
    add[#add + 1] = k
    add[#add + 1] = tostring(v)
  end
  for i = 1, #(fields or {}) - 1, 2 do
    if fields[i] ~= "reason" and fields[i] ~= "entry_id" and fields[i] ~= "consumer" then
      add[#add + 1] = tostring(fields[i])
      add[#add + 1] = tostring(fields[i + 1])
    end
  end
  local res, err = self.redis:pipeline {
    { "MULTI" }, add,
    { "XACK", self.stream, self.group, id },
    { "XDEL", self.stream, id },
    { "EXEC" },
  }
  if not res then return nil, err end
  local exec = res[#res]
  if type(exec) ~= "table" or exec[1] == false then return nil, tostring(exec and exec[2]) end
  return true
end

-- Removing a consumer drops its pending entries with it (they could never
-- be claimed again), so both scripts check that nothing is pending on it
-- in the same atomic step as the removal.
local LEAVE = [[
local cs = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
for _, c in ipairs(cs) do
  local name, pending
  for i = 1, #c - 1, 2 do
    if c[i] == 'name' then name = c[i + 1] elseif c[i] == 'pending' then pending = c[i + 1] end
  end
  if name == ARGV[2] then
    if pending ~= 0 then return pending end
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
    return 0
  end
end
return 0
]]

-- leave() -> 0 (removed, or was not there) | n (entries still pending on
-- it: kept, a later reap removes it once others claimed them) | nil, err
function Q:leave()
  return self.redis:call("EVAL", LEAVE, 1, self.stream, self.group, self.consumer)
end

local REAP = [[
local removed = {}
if redis.call('EXISTS', KEYS[1]) == 0 then return removed end
local cs = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
for _, c in ipairs(cs) do
  local name, pending, idle
  for i = 1, #c - 1, 2 do
    if c[i] == 'name' then name = c[i + 1]
    elseif c[i] == 'pending' then pending = c[i + 1]
    elseif c[i] == 'idle' then idle = c[i + 1] end
  end
  if name ~= ARGV[2] and pending == 0 and idle >= tonumber(ARGV[3])
     and redis.call('EXISTS', ARGV[4] .. name) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    removed[#removed + 1] = name
  end
end
return removed
]]

-- reap(min_idle_seconds, heartbeat_prefix) -> names removed | nil, err.
-- A consumer of a worker that died: nothing pending on it any more (its
-- jobs were claimed), idle at least min_idle, and its heartbeat key
-- (heartbeat_prefix .. name) expired.
function Q:reap(min_idle, heartbeat_prefix)
  local res, err = self.redis:call("EVAL", REAP, 1, self.stream, self.group, self.consumer,
    floor(min_idle * 1000), heartbeat_prefix)
  if not res then
    if errors.has(err, "redis:NOGROUP") then return {} end
    return nil, err
  end
  return type(res) == "table" and res or {}
end

return _M
