-- moongraph.worker.checkpointer — the checkpoint saver jobs run with.
--
-- A job's run is checkpointed under the thread "job:<job_id>" while it
-- runs, so a worker that claims the job after a crash resumes it and
-- re-runs only the unfinished tasks; the thread is deleted once the result
-- is stored. The kinds:
--
--   cached     Postgres, read through a Redis cache (default); a job's
--              checkpoints are written to Postgres only (write_through =
--              false): Redis holds what a resumed job read
--   postgres   Postgres only
--   redis      Redis only (durable as far as Redis persistence goes)
--   file:DIR   JSON files under DIR (workers sharing one disk)
--   memory     this process only: nothing survives a crash (tests, benchmarks)
--
--   local saver, err = checkpointer.open(kind, { redis_url =, pg_url = })
--
-- The Redis and Postgres savers are mg.checkpoint.redis(url, {ttl}),
-- mg.checkpoint.postgres(url) and mg.checkpoint.cached(redis_saver,
-- postgres_saver); each keeps its own connections.
--
--   checkpointer.in_results_db(kind)   -- true: the saver keeps its rows in
--                                      -- the worker's own database, so a job's
--                                      -- checkpoints are deleted in the
--                                      -- transaction that stores its result

local checkpoint = require "moongraph.checkpoint"

local type, tostring, pcall = type, tostring, pcall

local _M = {}

function _M.thread(job_id)
  return "job:" .. job_id
end

function _M.in_results_db(kind)
  return kind == "cached" or kind == "postgres"
end

-- The constructor mg.checkpoint.<name>, or moongraph.checkpoint.<name>.new.
local function need(name)
  local ok, f = pcall(function() return checkpoint[name] end)
  if ok and type(f) == "function" then return f end
  local mok, mod = pcall(require, "moongraph.checkpoint." .. name)
  if mok and type(mod) == "table" and type(mod.new) == "function" then return mod.new end
  return nil, "this build has no " .. name .. " checkpoint saver (moongraph.checkpoint." .. name .. ")"
end

-- Build a saver, turning a raised error or a nil result into nil, err.
local function make(f, ...)
  local ok, saver, err = pcall(f, ...)
  if not ok then return nil, tostring(saver) end
  if not saver then return nil, tostring(err) end
  return saver
end

-- open(kind, ctx) -> saver | nil, err
-- ctx: redis_url, pg_url, cache_ttl (seconds a checkpoint stays in the
-- Redis cache of `cached`, default 3600, as in the seeds), concurrency (the
-- jobs run at once: sizes the Postgres saver's pool and its cache of
-- unchanged state values, which should hold every running job's thread).
function _M.open(kind, ctx)
  if type(kind) ~= "string" then return nil, "checkpoint kind expected" end
  if kind == "memory" then return checkpoint.memory() end
  local dir = kind:match("^file:(.+)$")
  if dir then return checkpoint.file(dir) end
  local n = ctx.concurrency or 16
  local pg_opts = { pool_size = math.min(16, math.max(4, math.ceil(n / 4))),
                    cache_threads = math.max(64, 2 * n) }
  if kind == "postgres" then
    local f, err = need("postgres")
    if not f then return nil, err end
    return make(f, ctx.pg_url, pg_opts)
  elseif kind == "redis" then
    local f, err = need("redis")
    if not f then return nil, err end
    return make(f, ctx.redis_url, { ttl = ctx.redis_ttl })
  elseif kind == "cached" then
    local fr, err1 = need("redis")
    if not fr then return nil, err1 end
    local fp, err2 = need("postgres")
    if not fp then return nil, err2 end
    local fc, err3 = need("cached")
    if not fc then return nil, err3 end
    local l1, e1 = make(fr, ctx.redis_url, { ttl = ctx.cache_ttl or 3600 })
    if not l1 then return nil, e1 end
    local l2, e2 = make(fp, ctx.pg_url, pg_opts)
    if not l2 then return nil, e2 end
    return make(fc, l1, l2, { write_through = false })
  end
  return nil, "unknown checkpoint kind '" .. kind .. "' (cached, postgres, redis, file:DIR or memory)"
end

return _M
