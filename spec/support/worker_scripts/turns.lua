-- A conversation with a memory, for the worker specs: each job is a turn of
-- its thread, numbered after the turns the thread stored before it (read
-- by the input hook from turnspec_turns, the script's own table, where the
-- record hook writes the turn with the job's result).
--
-- The job's input steers it:
--   hold   `work` waits while the Redis key spec:hold:<job_id> exists (at
--          most a minute): a job still running when its worker dies
local mg = require "moongraph"
local redis = require "moongraph.redis"

local _M = {}

local function held(job_id)
  local conn = assert(redis.connect(assert(os.getenv("MOONGRAPH_REDIS_URL"))))
  local key = "spec:hold:" .. job_id
  for _ = 1, 600 do
    if conn:call("EXISTS", key) ~= 1 then break end
    mg.sleep(0.1)
  end
  conn:close()
end

function _M.build(opts)
  local g = mg.graph()
  g:add_node("work", function(state)
    if state.hold then held(state.job) end
    return { answer = "turn " .. state.turn }
  end)
  g:add_edge(mg.START, "work")
  g:add_edge("work", mg.END)
  return g:compile { checkpointer = opts.checkpointer }
end

_M.worker = {
  scope = "turnspec",
  migrations = {
    { version = 1, name = "turns", sql = "CREATE TABLE turnspec_turns (thread_id text, turn integer, job_id text)" },
  },

  input = function(job, env)
    local rows, err = env.db:query(
      "SELECT coalesce(max(turn), 0)::int + 1 AS turn FROM turnspec_turns WHERE thread_id = $1", { job.thread_id })
    if not rows then return nil, err end
    return { turn = rows[1].turn, hold = job.input.hold, job = job.job_id }
  end,

  record = function(tx, job, state, result)
    if result.status ~= "done" then return true end
    return tx:query("INSERT INTO turnspec_turns (thread_id, turn, job_id) VALUES ($1, $2, $3)",
      { job.thread_id, state.turn, job.job_id })
  end,
}

return _M
