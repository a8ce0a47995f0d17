-- moongraph.worker.client — the client side of the worker: enqueue a job,
-- follow its events. What `moongraph submit` does, and what a gateway does.
--
--   local client = require "moongraph.worker.client"
--   local c = assert(client.connect("redis://127.0.0.1:6379/0"))   -- or { redis = conn }
--   local job_id, entry_id = c:submit{ thread_id = "t1", user_id = "u1", script = "app",
--                                      input = { question = "..." } }
--   local last_id, done = c:follow(job_id, { last_id = "0-0", on_event = function(ev) ... end })
--
-- follow resumes after a lost connection from the last event it delivered
-- (XRANGE to catch up, then XREAD BLOCK), so a caller that keeps the last
-- id can also reconnect itself, from another process, and get the rest of
-- the events once and in order.

local redis = require "moongraph.redis"
local job = require "moongraph.worker.job"
local events = require "moongraph.worker.events"
local config = require "moongraph.worker.config"

local type, tostring, setmetatable, error, ipairs = type, tostring, setmetatable, error, ipairs

local _M = {}
local C = {}

local DEFAULT_REPLICAS_TIMEOUT = 1
C.__index = C

-- connect(url | {redis = conn}, [{prefix = "moongraph", replicas = n,
-- replicas_timeout = s}]) -> client | nil, err. replicas: how many replicas
-- must have each submitted job before submit returns (WAIT); the default is
-- 1 for a redis-sentinel:// URL, where a failover loses what no replica got
-- yet, and 0 otherwise. replicas_timeout: how long submit waits for them
-- (default 1 s).
function _M.connect(url, opts)
  opts = opts or {}
  local conn, err
  local replicas = opts.replicas
  if type(url) == "table" and url.redis then
    conn = url.redis
  else
    conn, err = redis.connect(url)
    if not conn then return nil, err end
    if replicas == nil and url:lower():find("^redis%-sentinel://") then replicas = 1 end
  end
  replicas = replicas or 0
  local wait = opts.replicas_timeout or DEFAULT_REPLICAS_TIMEOUT
  if math.type(replicas) ~= "integer" or replicas < 0 then
    error("bad option 'replicas' to 'connect' (non-negative integer expected)", 2)
  end
  if type(wait) ~= "number" or wait <= 0 then
    error("bad option 'replicas_timeout' to 'connect' (positive number of seconds expected)", 2)
  end
  return setmetatable({ redis = conn, keys = config.keys(opts.prefix or "moongraph"),
                        replicas = replicas, replicas_timeout = wait }, C)
end

-- XADD the job; with replicas, WAIT on the same connection for them to
-- have it. -> entry id | nil, err
local function enqueue(self, job_id, text)
  if self.replicas == 0 then return self.redis:call("XADD", self.keys.jobs, "*", "job", text) end
  local res, err = self.redis:pipeline {
    { "XADD", self.keys.jobs, "*", "job", text },
    { "WAIT", self.replicas, math.max(1, math.floor(self.replicas_timeout * 1000)) },
  }
  if not res then return nil, err end
  local id, acked = res[1], res[2]
  if type(id) == "table" then return nil, tostring(id[2]) end
  if type(acked) == "table" then return nil, tostring(acked[2]) end
  if acked < self.replicas then
    return nil, string.format("job %s reached %d of %d replicas within %g s, so a failover could lose it; "
      .. "submitting it again with the same job_id is safe (it is answered once)",
      job_id, acked, self.replicas, self.replicas_timeout)
  end
  return id
end

-- submit{input, thread_id?, user_id?, job_id?, script?, multitask_strategy?, run?}
-- -> job_id, entry_id, job
-- | nil, err. A missing job_id or thread_id is made up; user_id is sent
-- only when given. The fields of the earlier job format (message,
-- user_location at the top level) are accepted and go into the input, as
-- the worker does with such jobs. A job the worker would refuse (a bad id,
-- an input that is not a table, more than moongraph.worker.job.MAX_BYTES of
-- JSON) raises. With replicas, a job that fewer replicas confirmed within
-- replicas_timeout gives nil, err: it is in the stream, but a failover
-- could lose it; submitting it again with the same job_id is safe.
function C:submit(j)
  if type(j) ~= "table" then error("bad argument #1 to 'submit' (job table expected)", 2) end
  local full = {
    job_id = j.job_id or job.new_id("j"),
    thread_id = j.thread_id or job.new_id("t"),
    user_id = j.user_id, script = j.script, input = j.input,
    multitask_strategy = j.multitask_strategy, run = j.run,
  }
  for _, name in ipairs(job.LEGACY_INPUT) do full[name] = j[name] end
  local norm, reason = job.normalize(full)
  if not norm then error("bad argument #1 to 'submit' (" .. reason .. ")", 2) end
  local text, eerr = job.encode(norm)
  if not text then error("bad argument #1 to 'submit' (" .. eerr .. ")", 2) end
  local ok
  ok, reason = job.decode { "job", text }
  if not ok then error("bad argument #1 to 'submit' (" .. reason .. ")", 2) end
  full = norm
  local id, err = enqueue(self, full.job_id, text)
  if not id then return nil, err end
  return full.job_id, id, full
end

function C:events_key(job_id)
  return self.keys.events .. job_id
end

-- follow(job_id, opts) -> last_id, done_event | nil, err, last_id
-- (opts as moongraph.worker.events.follow)
function C:follow(job_id, opts)
  return events.follow(self.redis, self:events_key(job_id), opts)
end

function C:close()
  self.redis:close()
end

return _M
