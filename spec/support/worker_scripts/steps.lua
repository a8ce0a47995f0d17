-- A small pipeline for the worker specs: prepare -> slow -> answer. It has
-- no worker hooks: its run input is the job's input ({message = ...}).
--
-- The message steers it with words:
--   sleep=S      `slow` waits S seconds (a job that is still running when a
--                worker is killed, drained or reloaded)
--   tokens=N     `answer` streams N tokens, `gap` seconds apart (default 0.01)
--   gap=S
--   fail         `slow` fails (fail_close: the job fails)
--   ask          `slow` pauses the run with ctx.interrupt (the job is stored
--                as interrupted)
-- Every node run is counted in Redis (INCR spec:runs:<job_id>:<node>, on
-- $MOONGRAPH_REDIS_URL) so a spec can tell which nodes ran again after a
-- crash. The answer names the script's VERSION (the reload spec edits it).
local mg = require "moongraph"
local redis = require "moongraph.redis"

local _M = { VERSION = "v1" }

-- (retried for a while: the Redis restart spec bounces Redis under it)
local conn
local function count(ctx, node)
  local key = "spec:runs:" .. tostring(ctx.config.job_id) .. ":" .. node
  for _ = 1, 100 do
    conn = conn or redis.connect(assert(os.getenv("MOONGRAPH_REDIS_URL")))
    if conn and conn:call("INCR", key) then return end
    mg.sleep(0.1)
  end
  error("cannot count the run of " .. node, 0)
end

local function opt(message, name)
  return tonumber(message:match(name .. "=([%d%.]+)"))
end

function _M.build(opts)
  local g = mg.graph { trail = "append" }
  g:add_node("prepare", function(state, ctx)
    count(ctx, "prepare")
    return { trail = "prepare", words = #state.message }
  end)
  g:add_node("slow", function(state, ctx)
    count(ctx, "slow")
    local s = opt(state.message, "sleep")
    if s then mg.sleep(s) end
    if state.message:find("%f[%w]fail%f[%W]") then error("slow: asked to fail", 0) end
    if state.message:find("%f[%w]ask%f[%W]") then ctx.interrupt({ question = "which bin?" }) end
    return { trail = "slow" }
  end)
  g:add_node("answer", function(state, ctx)
    count(ctx, "answer")
    local n = opt(state.message, "tokens") or 3
    local gap = opt(state.message, "gap") or 0.01
    local parts = {}
    for i = 1, n do
      local t = "t" .. i .. " "
      parts[#parts + 1] = t
      ctx.stream_token(t)
      if gap > 0 and i < n then mg.sleep(gap) end
    end
    return { trail = "answer", answer = _M.VERSION .. ": " .. table.concat(parts) }
  end)
  g:add_edge(mg.START, "prepare")
  g:add_edge("prepare", "slow")
  g:add_edge("slow", "answer")
  g:add_edge("answer", mg.END)
  return g:compile { checkpointer = opts.checkpointer }
end

return _M
