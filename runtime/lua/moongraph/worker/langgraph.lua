--[[
moongraph.worker.langgraph — runs of the LangGraph Agent API as worker jobs.

`moongraph serve --redis --pg` (moongraph.service.jobs) turns
a run into a job with a `run` field (moongraph.worker.job):

  { job_id = <run id>, thread_id = <LangGraph thread id>, user_id, script = <graph id>,
    input = <state values> | absent, multitask_strategy,
    run = { stream_mode = {"values", ...} (engine modes), subgraphs = bool,
            command = {resume, update, goto} | nil, checkpoint_id, recursion_limit,
            configurable, context, metadata, durability, temporary = bool } }

Unlike a Chat API job, its checkpoints live under the thread's own id and
stay when the run is over (a temporary thread's, a stateless run's, are
deleted), so later runs continue the thread and serve reads its state
through the same saver. The script's hooks do not run: the graph gets the
input as LangGraph clients send it. The run's events go to the job's event
stream under the LangGraph API's names (values, updates, messages, custom,
debug, tasks, checkpoints; "mode|ns" for subgraphs; error), after the
`metadata` event serve wrote when it queued the run, and then `done`.

The run's and its thread's records are rows of the tables of
moongraph.service.postgres (langgraph_runs, langgraph_threads), which
serve creates; the worker updates them.

Cancelling: serve sets the key cancel_key(prefix, run_id) to "interrupt"
(keep what the run did) or "rollback" (take the thread back to where the
run started); the runner polls it while the run goes (watch_cancel).
]]

local mg = require "moongraph"
local json = require "moongraph.json"
local pg = require "moongraph.pg"
local lgrun = require "moongraph.langgraph_run"
local public_error = require "moongraph.public_error"

local type, tostring, tonumber, ipairs, pcall, error = type, tostring, tonumber, ipairs, pcall, error

local _M = {}

-- the tables' schema steps (their owner is the service's PostgreSQL storage)
_M.migrations = require("moongraph.service.postgres").migrations

-- Seconds between looks at a running run's cancel key.
_M.CANCEL_POLL = 0.1

function _M.cancel_key(prefix, run_id)
  return prefix .. ":run:" .. run_id .. ":cancel"
end

--[[ begin(db, run_id, from) -> "running" (start it) | "resumed" (an earlier
attempt started it: continue from the thread's last checkpoint) | "stopped"
(cancelled, or deleted with its thread, before it started), started_from
| nil, err. from: the thread's checkpoint now ("" for none), kept from the
first attempt. ]]
function _M.begin(db, run_id, from)
  local rows, err = db:query([[
WITH old AS (SELECT run_id, status FROM langgraph_runs WHERE run_id = $1 FOR UPDATE)
UPDATE langgraph_runs r SET status = 'running', started_from = coalesce(r.started_from, $2),
       updated_at = clock_timestamp()
  FROM old WHERE r.run_id = old.run_id AND old.status IN ('pending', 'running')
RETURNING old.status AS was, r.started_from]], { run_id, from })
  if not rows then return nil, err end
  local r = rows[1]
  if not r then return "stopped" end
  return r.was == "running" and "resumed" or "running", r.started_from
end

-- watch_cancel(redis, key, on_cancel) -> task: calls on_cancel(action)
-- once the key is set; cancel the task when the run is over.
function _M.watch_cancel(redis, key, on_cancel)
  return mg.spawn(function()
    while true do
      local v = redis:call("GET", key)
      if type(v) == "string" then
        on_cancel(v == "rollback" and "rollback" or "interrupt")
        return
      end
      mg.sleep(_M.CANCEL_POLL)
    end
  end)
end

-- The input of the run: a Command, its state values, or nil (continue).
function _M.input(j)
  local cmd = j.run.command
  if type(cmd) == "table" then
    local c, err = lgrun.command(cmd)
    if not c then error(err, 0) end
    return c
  end
  return j.input
end

-- The engine's cfg for the run.
function _M.config(j, llm, resumed)
  local r = j.run
  local modes = r.stream_mode
  if type(modes) ~= "table" or not modes[1] then modes = { "values" } end
  return { thread_id = j.thread_id, run_id = j.job_id, stream_mode = modes,
    subgraphs = r.subgraphs == true, recursion_limit = tonumber(r.recursion_limit),
    checkpoint_id = (not resumed and type(r.checkpoint_id) == "string") and r.checkpoint_id or nil,
    context = type(r.context) == "table" and r.context or nil,
    configurable = type(r.configurable) == "table" and r.configurable or nil,
    metadata = type(r.metadata) == "table" and r.metadata or nil,
    durability = type(r.durability) == "string" and r.durability or nil, llm = llm }
end

-- body(app, j, input, cfg, em) -> a function that streams the run into em
function _M.body(app, j, input, cfg, em)
  local ctx = { run_id = j.job_id, thread_id = j.thread_id, subgraphs = cfg.subgraphs }
  return function()
    for ev in app:stream(input, cfg) do
      local name, data = lgrun.translate(ctx, ev)
      em:push(name, data)
    end
    return true
  end
end

-- Take the thread back to the checkpoint a rolled-back run started from.
function _M.rollback(saver, app, thread_id, from)
  mg.checkpoint.settle(saver, thread_id)
  if from == nil then return true end
  if from == "" then return saver:delete_thread(thread_id) end
  local ok, cfg, err = pcall(app.update_state, app, { thread_id = thread_id, checkpoint_id = from }, nil)
  if not ok then return nil, tostring(cfg) end
  if not cfg then return nil, err end
  return true
end

--[[ outcome(app, j, status, message [, em, kind]) -> { status, output,
error, thread }: what the run ends with. status: success | error |
interrupted. thread: the thread's fields (nil for a temporary thread). A
successful run that paused pushes values/updates {__interrupt__} on em
first (what LangGraph streams). An interrupted run (cancelled, or stopped
by a later run's multitask_strategy) ends with an error too — kind
"UserInterrupt" or "UserRollback", message saying who stopped it — so its
stream and its wait do not look like a success; a pause at an interrupt()
is a success. ]]
function _M.outcome(app, j, status, message, em, kind)
  local o = { status = status }
  local ok, snap = pcall(app.get_state, app, { thread_id = j.thread_id })
  if ok and snap then
    local out, list = lgrun.output(snap)
    o.output = out
    if list and status == "success" and em then
      local modes = {}
      for _, m in ipairs(j.run.stream_mode or {}) do modes[m] = true end
      if modes.values then em:push("values", { __interrupt__ = list }) end
      if modes.updates then em:push("updates", { __interrupt__ = list }) end
    end
    if not j.run.temporary then
      o.thread = lgrun.thread_fields(snap)
      if status == "error" then o.thread.status = "error" end
    end
  end
  if status == "error" then
    -- the client learns which node failed; o.detail is for the worker's log
    o.error = { error = "GraphError", message = public_error.message(message, "run " .. j.job_id) }
    o.detail = message
  elseif status == "interrupted" then
    o.error = { error = kind or "UserInterrupt", message = message or "the run was interrupted" }
  end
  return o
end

local function enc(v)
  if v == nil then return nil end
  return (json.encode(v))
end

-- record(tx, j, o) -> true, gone | nil, err: the run's row and its
-- thread's, in the transaction that stores the job's result. The thread
-- stays busy while another run of it is pending or running. gone: the
-- thread was deleted while the run went (what the run saved since must go).
function _M.record(tx, j, o)
  local ok, err = tx:query([[
UPDATE langgraph_runs SET status = $2, output = $3::jsonb, error = $4::jsonb, updated_at = clock_timestamp()
 WHERE run_id = $1]], { j.job_id, o.status, enc(o.output) or pg.null, enc(o.error) or pg.null })
  if not ok then return nil, err end
  local t = o.thread
  local rows
  if t then
    rows, err = tx:query([[
UPDATE langgraph_threads SET "values" = coalesce($2::jsonb, "values"), interrupts = $3::jsonb,
       error = $5, updated_at = clock_timestamp(),
       status = CASE WHEN EXISTS (SELECT 1 FROM langgraph_runs WHERE thread_id = $1 AND run_id <> $6
                                  AND status IN ('pending', 'running')) THEN 'busy' ELSE $4 END
 WHERE thread_id = $1 RETURNING thread_id]], { j.thread_id, enc(t.values) or pg.null, enc(t.interrupts) or "{}",
      t.status, o.status == "error" and o.error and o.error.message or pg.null, j.job_id })
  elseif not j.run.temporary then
    -- (a run stopped before it started leaves the thread's state as it was)
    rows, err = tx:query([[
UPDATE langgraph_threads SET updated_at = clock_timestamp(),
       status = CASE WHEN EXISTS (SELECT 1 FROM langgraph_runs WHERE thread_id = $1 AND run_id <> $2
                                  AND status IN ('pending', 'running')) THEN 'busy'
                     WHEN status = 'busy' THEN 'idle' ELSE status END
 WHERE thread_id = $1 RETURNING thread_id]], { j.thread_id, j.job_id })
  else
    return true, false
  end
  if not rows then return nil, err end
  return true, rows[1] == nil
end

-- The events that end the run's stream: error (when it failed), done.
function _M.final_events(o, job_id, job_status)
  local list = {}
  if o and o.error then list[#list + 1] = { "error", o.error } end
  list[#list + 1] = { "done", { status = job_status, job_id = job_id, run_status = o and o.status or nil } }
  return list
end

return _M
