--[[
moongraph.langgraph_run — a LangGraph Agent Server run on the graph engine:
what both backends of the LangGraph API (the embedded one, and `moongraph
worker` running a run as a job for `serve --redis --pg`) make of it.

  local lgrun = require "moongraph.langgraph_run"
  lgrun.STREAM_MODES["messages-tuple"]   --> "messages" (the API's name -> the engine's)
  local cmd, err = lgrun.command(body.command)  -- mg.Command from {resume, update, goto}
  local name, data = lgrun.translate({run_id =, thread_id =, subgraphs =}, ev)
                                         -- an engine event -> SSE event name, data
  lgrun.interrupts_json(snap.interrupts) -- [{id, value, when?, nodes?}]
  local fields = lgrun.thread_fields(snap)     -- {values, interrupts (by task id), status}
  local out, list = lgrun.output(snap)   -- the run's output: values (+ __interrupt__)
  lgrun.iso(t)  lgrun.wall()             -- ISO-8601 text of a wall-clock time; now
]]

local mg = require "moongraph"
local json = require "moongraph.json"

local type, pairs, ipairs, tostring = type, pairs, ipairs, tostring
local string_format, math_floor = string.format, math.floor
local null, array = json.null, json.array

local _M = {}

_M.STREAM_MODES = { values = "values", updates = "updates", ["messages-tuple"] = "messages",
  custom = "custom", debug = "debug", tasks = "tasks", checkpoints = "checkpoints" }

local function isnull(v) return v == nil or v == null end

local function copy(t)
  local o = {}
  if type(t) == "table" then for k, v in pairs(t) do o[k] = v end end
  return o
end

-- wall clock with sub-second steps: os.time() anchored to the monotonic clock
local wall_base, mono_base
function _M.wall()
  if not wall_base then wall_base, mono_base = os.time(), mg.now() end
  return wall_base + (mg.now() - mono_base)
end

function _M.iso(t)
  local s = math_floor(t)
  return os.date("!%Y-%m-%dT%H:%M:%S", s) .. string_format(".%03d+00:00", math_floor((t - s) * 1000))
end

function _M.interrupts_json(list)
  local out = array()
  for i, it in ipairs(list or {}) do
    local o = { id = it.id, value = it.value == nil and null or it.value }
    if it.when then o.when = it.when end
    if it.nodes then o.nodes = it.nodes end
    out[i] = o
  end
  return out
end

-- command(c) -> mg.Command from the API's command {resume, update, goto} | nil, err
function _M.command(c)
  if type(c) ~= "table" then return nil, "command must be an object" end
  local t = {}
  if not isnull(c.resume) then t.resume = c.resume end
  if not isnull(c.update) then
    if type(c.update) ~= "table" then return nil, "command.update must be an object" end
    t.update = c.update
  end
  local go = c["goto"]
  if not isnull(go) then
    local function one(g)
      if type(g) == "string" then return g end
      if type(g) == "table" and type(g.node) == "string" then return mg.Send(g.node, g.input) end
      return nil
    end
    if type(go) == "table" and (json.is_array(go) or go[1] ~= nil) then
      t.to = {}
      for i, g in ipairs(go) do
        t.to[i] = one(g)
        if not t.to[i] then return nil, "command.goto must name nodes or {node, input} sends" end
      end
    else
      t.to = one(go)
      if not t.to then return nil, "command.goto must name nodes or {node, input} sends" end
    end
  end
  return mg.Command(t)
end

-- translate(run, ev) -> name, data: an engine event as the stream's SSE
-- event (run: run_id, thread_id, subgraphs)
function _M.translate(run, ev)
  local mode = ev.mode
  local name = mode
  if run.subgraphs and ev.ns and ev.ns ~= "" then name = name .. "|" .. ev.ns end
  local data = ev.data
  if mode == "updates" then
    data = { [ev.node or "__unknown__"] = ev.data == nil and {} or ev.data }
  elseif mode == "messages" then
    local chunk
    if type(data) == "table" then
      chunk = copy(data)
      chunk.type = chunk.type or "AIMessageChunk"
      chunk.id = chunk.id or ("run-" .. run.run_id .. "-" .. tostring(ev.task_id))
    else
      chunk = { type = "AIMessageChunk", content = tostring(data),
        id = "run-" .. run.run_id .. "-" .. tostring(ev.task_id) }
    end
    data = array { chunk, { langgraph_node = ev.node, langgraph_step = ev.step,
      langgraph_checkpoint_ns = ev.ns or "", langgraph_task_id = ev.task_id,
      run_id = run.run_id, thread_id = run.thread_id } }
  elseif mode == "debug" then
    local d = ev.data or {}
    local payload = d.task or d
    if d.type == "checkpoint" then
      payload = { values = d.values, next = d.next, metadata = d.metadata,
        checkpoint = { thread_id = run.thread_id, checkpoint_ns = ev.ns or "", checkpoint_id = d.id } }
    end
    data = { type = d.type, step = d.step, timestamp = _M.iso(_M.wall()), payload = payload }
  end
  return name, data
end

-- thread_fields(snap) -> {values, interrupts = {task_id = [...]}, status}:
-- what a thread record shows of its latest state
function _M.thread_fields(snap)
  local by = {}
  for _, t in ipairs(snap.tasks or {}) do
    if t.interrupts and t.interrupts[1] then by[t.id] = _M.interrupts_json(t.interrupts) end
  end
  local paused = (snap.interrupts and snap.interrupts[1]) or (snap.next and snap.next[1])
  return { values = snap.values, interrupts = by, status = paused and "interrupted" or "idle" }
end

-- output(snap) -> the run's output (its thread's values, with __interrupt__
-- when it paused), the interrupts list or nil
function _M.output(snap)
  local out = copy(snap.values)
  if snap.interrupts and snap.interrupts[1] then
    local list = _M.interrupts_json(snap.interrupts)
    out.__interrupt__ = list
    return out, list
  end
  return out, nil
end

return _M
