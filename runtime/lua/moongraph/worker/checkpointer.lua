-- moongraph.worker.checkpointer — the checkpoint saver jobs run with.
--
-- A job's run is checkpointed under the thread "job:<job_id>" while it
-- runs, so a worker that claims the job after a crash resumes it and
-- re-runs only the unfinished tasks; the thread is deleted once the result
-- is stored. The kinds:
--
--   cached     Postgres, read through a Redis cache (default)
--   postgres   Postgres only
--   redis      Redis only (durable as far as Redis persistence goes)
--   file:DIR   JSON files under DIR (workers sharing one disk)
--   memory     this process only: nothing survives a crash (tests, benchmarks)
--
--   local saver, err = checkpointer.open(kind, { redis_url =, pg_url =, redis =, db = })

local checkpoint = require "moongraph.checkpoint"

local type, tostring, pcall = type, tostring, pcall

local _M = {}

function _M.thread(job_id)
  return "job:" .. job_id
end

local function need(name)
  local ok, f = pcall(function() return checkpoint[name] end)
  if ok and type(f) == "function" then return f end
  return nil, "this build has no " .. name .. " checkpoint saver (moongraph.checkpoint." .. name .. ")"
end

-- open(kind, ctx) -> saver | nil, err
function _M.open(kind, ctx)
  if type(kind) ~= "string" then return nil, "checkpoint kind expected" end
  if kind == "memory" then return checkpoint.memory() end
  local dir = kind:match("^file:(.+)$")
  if dir then return checkpoint.file(dir) end
  if kind == "postgres" or kind == "redis" or kind == "cached" then
    local f, err = need(kind)
    if not f then return nil, err end
    local ok, saver, serr
    if kind == "postgres" then
      ok, saver, serr = pcall(f, ctx.db or ctx.pg_url)
    elseif kind == "redis" then
      ok, saver, serr = pcall(f, ctx.redis or ctx.redis_url)
    else
      ok, saver, serr = pcall(f, ctx.redis or ctx.redis_url, ctx.db or ctx.pg_url)
    end
    if not ok then return nil, tostring(saver) end
    if not saver then return nil, tostring(serr) end
    return saver
  end
  return nil, "unknown checkpoint kind '" .. kind .. "' (cached, postgres, redis, file:DIR or memory)"
end

return _M
