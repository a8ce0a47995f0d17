--[[
moongraph.engine.runner — runs the tasks of one step, all at once.

Every task gets a coroutine of its own (a step with a single task runs in
the caller's: same semantics, no spawn). As each task finishes, its stream
events go out and, with a checkpointer, its writes are saved at once as
pending writes of the checkpoint the step started from, so a run killed in
the middle of a step re-runs only the tasks without writes. The first
fail_close failure stops the siblings still running (what finished is kept).
]]

local pairs, pcall, tostring, setmetatable = pairs, pcall, tostring, setmetatable

local tasks = require "moongraph.tasks"
local algo = require "moongraph.engine.algo"
local task = require "moongraph.engine.task"
local events = require "moongraph.engine.events"
local writer = require "moongraph.engine.writer"

local run_task = task.run

local _M = {}

local function finished(run, t, res)
  -- events go to a stream or a trace (a saver alone observes in silence)
  if run.sink or run.trace then events.task_finished(run, t, res) end
  -- a Command to the parent graph ends this (sub)graph run: nothing to save
  if run.saver and not res.parent then
    local scratch = nil
    if run.writer.reuse then
      scratch = run.writes_scratch
      if not scratch then scratch = {}; run.writes_scratch = scratch end
    end
    local w = algo.to_writes(res, t.resume, scratch)
    if not w[1] then w[1] = { "__done__", true } end
    writer.save_writes(run, t.id, w)
  end
end

local function worker(run, t, i, results, q)
  local ok, res = pcall(run_task, run, t)
  if not ok then
    res = { status = "error", error = "task " .. algo.task_label(t) ..
      " failed inside the engine: " .. tostring(res) }
  end
  results[i] = res
  q:put(i)
end

-- cancels the step's tasks still running when the runner stops early
-- (fail_close, or the run itself cancelled: a stream left early, a timeout)
local function cancel_rest(handles)
  for _, h in pairs(handles) do
    if not h:done() then h:cancel() end
  end
end

--[[ run_step(run, plan, results) -> the first fatal error message, or nil
results[i] is preset for tasks that finished earlier (from pending writes);
the others are filled in. ]]
function _M.run_step(run, plan, results)
  local n = #plan
  local todo, last = 0, nil
  for i = 1, n do
    if results[i] == nil then todo = todo + 1; last = i end
  end
  if todo == 0 then return nil end
  local told = run.sink or run.trace
  if todo == 1 then
    local t = plan[last]
    if told then events.task_started(run, t) end
    local res = run_task(run, t, true)
    results[last] = res
    if run.observed then finished(run, t, res) end
    if res.status == "error" then return res.error end
    return nil
  end
  local q = tasks.queue()
  local handles = {}
  local guard <close> = setmetatable({}, { __close = function() cancel_rest(handles) end })
  for i = 1, n do
    if results[i] == nil then
      if told then events.task_started(run, plan[i]) end
      handles[i] = tasks.spawn(worker, run, plan[i], i, results, q)
    end
  end
  local done = {}
  local fatal
  for _ = 1, todo do
    local i = q:get()
    done[i] = true
    local res = results[i]
    finished(run, plan[i], res)
    if res.status == "error" then fatal = res.error break end
  end
  if fatal then
    -- fail_close: stop the siblings still running; keep what finished
    cancel_rest(handles)
    for i in pairs(handles) do
      if results[i] ~= nil and not done[i] then finished(run, plan[i], results[i]) end
    end
  end
  return fatal
end

return _M
