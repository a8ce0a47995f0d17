--[[
moongraph.engine.events — what a run tells its stream and its trace.

A stream event is {mode, node, task_id, ns, step, data}; the stream's sink
({modes = {mode = true}, put = fn}) receives only the modes it asked for.

  values    the state after each step (and the input when a run starts)
  updates   one task's update
  tasks     a task starting ({event = "start", name, id, send, input, time
            on the mg.now() clock}) and
            finishing ({event = "result", name, id, send, status, result,
            error, interrupts, ran, cached, failed, attempts, duration,
            chain}: a failed = true task failed under fail_open, its
            error says why; chain lists the fallback chain's failures)
  debug     tasks and checkpoints, wrapped as {type = "task"|"task_result"|"checkpoint", ...}
  checkpoints  each checkpoint as it is saved, in the form of get_state:
            {config, parent_config, values, next, metadata, created_at}
  custom    ctx.emit(value)
  messages  ctx.stream_token(text) (LLM tokens)
]]

local now = require("moongraph.tasks").now

local _M = {}

_M.MODES = { "values", "updates", "messages", "custom", "tasks", "debug", "checkpoints" }

function _M.emit(run, mode, node, task_id, data)
  local sink = run.sink
  if sink and sink.modes[mode] then
    sink.put { mode = mode, node = node, task_id = task_id, ns = run.ns, step = run.step, data = data }
  end
end
local emit = _M.emit

-- A task is starting: its `tasks`/`debug` event and its trace span.
function _M.task_started(run, t)
  local sink = run.sink
  if sink then
    local m = sink.modes
    if m.tasks or m.debug then
      local data = { event = "start", name = t.node, id = t.id, send = t.send,
        input = t.send and t.arg or run.values, time = now() }
      emit(run, "tasks", t.node, t.id, data)
      emit(run, "debug", t.node, t.id, { type = "task", step = run.step + 1, task = data })
    end
  end
  if run.trace then
    t.span = run.trace:begin(t.node, { task_id = t.id, ns = run.ns, step = run.step + 1 })
  end
end

-- A task finished with result record res.
function _M.task_finished(run, t, res)
  if t.span then run.trace:finish(t.span, res.status) end
  local sink = run.sink
  if not sink then return end
  local m = sink.modes
  if m.updates and res.status == "done" then
    emit(run, "updates", t.node, t.id, res.update or {})
  end
  if m.tasks or m.debug then
    local data = { event = "result", name = t.node, id = t.id, send = t.send, status = res.status,
      result = res.update, error = res.error and tostring(res.error), interrupts = res.interrupts, ran = res.ran,
      cached = res.cached, failed = res.failed, attempts = res.attempts,
      duration = res.duration, chain = res.chain }
    emit(run, "tasks", t.node, t.id, data)
    emit(run, "debug", t.node, t.id, { type = "task_result", step = run.step + 1, task = data })
  end
end

return _M
