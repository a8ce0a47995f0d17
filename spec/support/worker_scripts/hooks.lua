-- A script with every worker hook, for the worker specs. Each hook call is
-- counted in Redis (INCR PREFIX:hookspec:<job_id>:<hook>, through the
-- worker's key helper); `record` writes a row of its own table, created by
-- its own migration (scope "hookspec").
--
-- The job's input steers it:
--   text         what `work` answers (upper-cased by the result hook)
--   sleep        seconds `work` waits (a job still running when its worker dies)
--   refuse       the input hook raises (the job is refused)
--   busy         the input hook returns nil, err this many times first
--   bad_record   the record hook fails every time
--   bad_sent     the record hook sends a statement that fails every time
--                (the failure shows at the commit, not in the hook)
--   bad_prefetch "sql": the prefetch hook's reads send a statement that
--                fails; "raise": the hook raises; "transient": its reads
--                raise an error that reads like a database away
-- The prefetch hook reads the thread's fence token in the claim's
-- transaction; the input hook keeps what it found in Redis
-- (PREFIX:hookspec:<job_id>:prefetched).
local mg = require "moongraph"

local _M = {}

local function count(env, job, hook)
  return env.redis:call("INCR", env.key("hookspec", job.job_id, hook))
end

function _M.build(opts)
  local g = mg.graph()
  g:add_node("work", function(state)
    if state.sleep then mg.sleep(state.sleep) end
    return { answer = "said " .. tostring(state.text), internal = "not stored" }
  end)
  g:add_edge(mg.START, "work")
  g:add_edge("work", mg.END)
  return g:compile { checkpointer = opts.checkpointer }
end

_M.worker = {
  scope = "hookspec",
  migrations = {
    { version = 1, name = "records", sql = [[
CREATE TABLE hookspec_records (job_id text PRIMARY KEY, answer text, status text)]] },
  },

  prefetch = function(job, env)
    count(env, job, "prefetch")
    if job.input.bad_prefetch == "raise" then error("prefetch refuses", 0) end
    return function(tx)
      if job.input.bad_prefetch == "transient" then error("redis: timeout after 0.2s", 0) end
      if job.input.bad_prefetch == "sql" then
        local ok, err = tx:send("SELECT 1 / 0")
        if not ok then error(err, 0) end
      end
      local fence, err = tx:defer("SELECT token::text AS token FROM thread_fences WHERE thread_id = $1",
        { job.thread_id })
      if not fence then error(err, 0) end
      return function()
        local rows, ferr = fence()
        if not rows then error(ferr, 0) end
        env.scratch.prefetched = rows[1] and rows[1].token or "no fence"
      end
    end
  end,

  input = function(job, env)
    local n = count(env, job, "input")
    env.redis:call("SET", env.key("hookspec", job.job_id, "prefetched"), tostring(env.scratch.prefetched))
    if job.input.refuse then error("this job asks to be refused", 0) end
    if job.input.busy and n <= job.input.busy then return nil, "busy, attempt " .. n end
    env.scratch.from_input = "scratch ok"
    return { text = job.input.text, sleep = job.input.sleep, user = job.user_id }
  end,

  result = function(state, job)
    return { answer = state.answer:upper(), state = { text = state.text, user = state.user, job = job.job_id },
             event = { extra = "from the result hook" } }
  end,

  record = function(tx, job, state, result, env)
    count(env, job, "record")
    if job.input.bad_record then return nil, "record refuses" end
    if job.input.bad_sent then return tx:send("SELECT 1 / 0") end
    return tx:query("INSERT INTO hookspec_records (job_id, answer, status) VALUES ($1, $2, $3)",
      { job.job_id, result.answer or "", result.status })
  end,

  committed = function(job, state, result, env)
    count(env, job, "committed")
    return env.redis:call("SET", env.key("hookspec", job.job_id, "committed_status"),
      result.status .. "/" .. tostring(env.scratch.from_input))
  end,

  forget = function(job, env)
    count(env, job, "forget")
    return true
  end,
}

return _M
