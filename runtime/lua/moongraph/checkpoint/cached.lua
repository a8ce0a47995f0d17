--[[
moongraph.checkpoint.cached — Redis in front of Postgres.

  local cp = mg.checkpoint.cached(
    mg.checkpoint.redis(redis_url, { ttl = 3600 }),   -- L1: fast reads, expires
    mg.checkpoint.postgres(pg_url),                    -- durable store
    { retry_after = 1, write_through = true })

Every write goes to Postgres first and counts only when Postgres took it;
then it is copied to Redis. With `write_through = false` writes go to
Postgres only and Redis holds what reads fetched from Postgres: for threads
that are written far more often than read back (a worker's job threads,
read only when a crashed job resumes). A Redis failure never fails a write or a read:
Redis is only a cache, and after a failure it is left alone for
`retry_after` seconds.

A read asks Postgres which checkpoint is current and its pending writes
(no state values), then takes the checkpoint itself from Redis when Redis
holds exactly that one; otherwise it reads Postgres and refills Redis. A
checkpoint never changes once saved, but its pending writes may (a resumed
task's replace its earlier ones): those always come from Postgres. So a
cache entry left stale by a failed Redis write, a Redis restart or
`write_through = false` is never served, and the large state values travel
from Redis rather than from Postgres.

History (list) and delete_thread go to Postgres; delete_thread also clears
Redis. delete_thread_in(tx, thread_id) deletes in the caller's Postgres
transaction (see the Postgres saver); uncache(thread_id) then clears Redis.
]]

local type, error, ipairs, pcall, setmetatable, tostring =
  type, error, ipairs, pcall, setmetatable, tostring

local common = require "moongraph.checkpoint.common"
local loop = require("moongraph.core").loop

local _M = {}
local saver = {}
local mt = { __index = saver, __name = "moongraph.checkpoint.cached" }

local function is_saver(s)
  return type(s) == "table" and type(s.put) == "function" and type(s.get) == "function"
    and type(s.put_writes) == "function" and type(s.list) == "function"
    and type(s.delete_thread) == "function"
end

function _M.new(l1, durable, opts)
  if not is_saver(l1) then
    error("bad argument #1 to 'cached': a checkpoint saver (the Redis cache) expected", 2)
  end
  if not is_saver(durable) or type(durable.head) ~= "function" then
    error("bad argument #2 to 'cached': the Postgres saver expected (it must offer head())", 2)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error("bad argument #3 to 'cached': options table expected, got " .. type(opts), 2)
  end
  local retry_after = opts and opts.retry_after or 1
  if type(retry_after) ~= "number" or retry_after < 0 then
    error("bad argument #3 to 'cached': retry_after must be a non-negative number of seconds", 2)
  end
  local write_through = true
  if opts and opts.write_through ~= nil then
    if type(opts.write_through) ~= "boolean" then
      error("bad argument #3 to 'cached': write_through must be a boolean", 2)
    end
    write_through = opts.write_through
  end
  -- Postgres decides conflicts; Redis copies what it took
  l1.cache_only = true
  return setmetatable({ l1 = l1, durable = durable, retry_after = retry_after,
    write_through = write_through, concurrent_writes = durable.concurrent_writes }, mt)
end

-- Call the cache, swallowing its failures (raised or returned). After a
-- failure the cache is left alone for `retry_after` seconds, so a Redis that
-- is down costs one refused connection, not one per call.
local function cache_call(self, method, ...)
  local now = loop.now()
  if self.down_until and now < self.down_until then return nil end
  local ok, r, err = pcall(self.l1[method], self.l1, ...)
  if not ok then err = tostring(r) r = nil end
  if r == nil and err then
    self.cache_error = err
    self.down_until = now + self.retry_after
  end
  return r
end

function saver:put(cfg, checkpoint, metadata)
  common.check_cfg(cfg, "put")
  local r, err = self.durable:put(cfg, checkpoint, metadata)
  if not r then return nil, err end
  if self.write_through then cache_call(self, "put", cfg, checkpoint, metadata) end
  return r
end

function saver:put_writes(cfg, task_id, writes)
  common.check_cfg(cfg, "put_writes")
  local ok, err = self.durable:put_writes(cfg, task_id, writes)
  if not ok then return nil, err end
  if self.write_through then cache_call(self, "put_writes", cfg, task_id, writes) end
  return true
end

--[[ put_batch(list): the list into Postgres in one transaction, then into
Redis in one MULTI/EXEC (each saver's put_batch, else one call per write). ]]
function saver:put_batch(list)
  local d = self.durable
  if type(d.put_batch) == "function" then
    local ok, err = d:put_batch(list)
    if not ok then return nil, err end
  else
    for _, o in ipairs(list) do
      local ok, err = d[o.op](d, o.a, o.b, o.c)
      if not ok then return nil, err end
    end
  end
  if not self.write_through then return true end
  if type(self.l1.put_batch) == "function" then
    cache_call(self, "put_batch", list)
  else
    for _, o in ipairs(list) do
      if not cache_call(self, o.op, o.a, o.b, o.c) then break end
    end
  end
  return true
end

-- Copy a tuple read from Postgres into the cache.
local function refill(self, tuple)
  local cfg = tuple.config
  local parent = tuple.parent_config
  local put_cfg = { thread_id = cfg.thread_id, checkpoint_ns = cfg.checkpoint_ns,
    checkpoint_id = parent and parent.checkpoint_id or nil }
  if not cache_call(self, "put", put_cfg, tuple.checkpoint, tuple.metadata) then return end
  local by_task, order = {}, {}
  for _, w in ipairs(tuple.pending_writes or {}) do
    local l = by_task[w[1]]
    if not l then
      l = {}
      by_task[w[1]] = l
      order[#order + 1] = w[1]
    end
    l[#l + 1] = { w[2], w[3] }
  end
  for _, task_id in ipairs(order) do
    if not cache_call(self, "put_writes", cfg, task_id, by_task[task_id]) then return end
  end
end

function saver:get(cfg)
  common.check_cfg(cfg, "get")
  local head, err = self.durable:head(cfg)
  if not head then return nil, err end
  local exact = { thread_id = cfg.thread_id, checkpoint_ns = cfg.checkpoint_ns or "",
    checkpoint_id = head.checkpoint_id }
  local t = cache_call(self, "get", exact)
  if t then
    self.hits = (self.hits or 0) + 1
    t.pending_writes = head.pending_writes
    return t
  end
  self.misses = (self.misses or 0) + 1
  t, err = self.durable:get(exact)
  if not t then return nil, err end
  refill(self, t)
  return t
end

function saver:list(cfg, opts)
  return self.durable:list(cfg, opts)
end

function saver:delete_thread(thread_id)
  if thread_id == nil then
    error("bad argument #1 to 'delete_thread': thread id expected", 2)
  end
  local ok, err = self.durable:delete_thread(thread_id)
  if not ok then return nil, err end
  cache_call(self, "delete_thread", thread_id)
  return true
end

-- The thread deleted inside the caller's Postgres transaction; Redis is
-- cleared by uncache(thread_id) once it committed.
function saver:delete_thread_in(tx, thread_id)
  if type(self.durable.delete_thread_in) ~= "function" then
    error("'delete_thread_in': the durable saver cannot delete inside a transaction", 2)
  end
  return self.durable:delete_thread_in(tx, thread_id)
end

-- Drop the thread's copy in Redis (a failure is left to the copy's ttl).
function saver:uncache(thread_id)
  if thread_id == nil then
    error("bad argument #1 to 'uncache': thread id expected", 2)
  end
  cache_call(self, "delete_thread", thread_id)
  return true
end

function saver:head(cfg)
  return self.durable:head(cfg)
end

return _M
